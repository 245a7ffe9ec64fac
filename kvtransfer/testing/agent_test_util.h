// Test helpers shared by the transfer agent tests, the two-process harness and the benchmark.
//
// Pattern bytes: byte k of a pattern stream with seed s is a fixed function of (s, k), so two
// processes that know the seed fill and check buffers without exchanging data, and a test can
// regenerate the expectation of any sub-range independently of the code under test.
//
// Thread safety: all functions are thread-safe (no shared state).
#ifndef TANDEM_KVTRANSFER_AGENT_TEST_UTIL_H_
#define TANDEM_KVTRANSFER_AGENT_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer::testing {

// Byte `index` of the pattern stream `seed` (splitmix64 of the 8-byte word, little-endian).
uint8_t PatternByte(uint64_t seed, uint64_t index);

// out[i] = PatternByte(seed, first_index + i).
void FillPattern(uint64_t seed, uint64_t first_index, absl::Span<uint8_t> out);

// Index of the first i with data[i] != PatternByte(seed, first_index + i), or -1 when all match.
int64_t FirstPatternMismatch(uint64_t seed, uint64_t first_index, absl::Span<const uint8_t> data);

// Polls CheckTransfer every `poll` until the transfer ends; returns its end status (OK for
// success). DEADLINE_EXCEEDED when it has not ended after `hang_guard` (a test bug guard, not a
// timing assertion). `elapsed`, when non-null, receives the time until the end was observed.
absl::Status WaitForEnd(TransferAgent& agent, TransferId id,
                        absl::Duration hang_guard = absl::Seconds(20),
                        absl::Duration poll = absl::Microseconds(200),
                        absl::Duration* elapsed = nullptr);

// `count` random strided ops of region 0 -> region 0 (rows of up to `max_row` bytes, strides
// at least the row, gaps between rows), each inside its own slice of the local region, so no two
// ops write the same byte. For tests of PostStridedRead.
std::vector<StridedCopyOp> RandomStridedOps(std::mt19937& rng, uint64_t local_bytes,
                                            uint64_t remote_bytes, int count, uint64_t max_row);

// OK when every row of `ops` in `local` (the whole local region 0) holds the pattern of `seed`
// at its remote offsets and every other byte is `fill`; otherwise what differs first.
absl::Status CheckStridedCopies(uint64_t seed, absl::Span<const StridedCopyOp> ops,
                                absl::Span<const uint8_t> local, uint8_t fill);

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_KVTRANSFER_AGENT_TEST_UTIL_H_
