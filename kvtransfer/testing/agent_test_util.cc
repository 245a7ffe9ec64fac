#include "kvtransfer/testing/agent_test_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::testing {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t PatternWord(uint64_t seed, uint64_t word) {
  return SplitMix64(seed * 0xd1b54a32d192ed03ULL + word);
}

}  // namespace

uint8_t PatternByte(uint64_t seed, uint64_t index) {
  return static_cast<uint8_t>(PatternWord(seed, index / 8) >> (8 * (index % 8)));
}

void FillPattern(uint64_t seed, uint64_t first_index, absl::Span<uint8_t> out) {
  size_t i = 0;
  // Head up to a word boundary, whole words, then the tail.
  while (i < out.size() && (first_index + i) % 8 != 0) {
    out[i] = PatternByte(seed, first_index + i);
    ++i;
  }
  while (i + 8 <= out.size()) {
    uint64_t w = PatternWord(seed, (first_index + i) / 8);
    for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(w >> (8 * b));
    i += 8;
  }
  for (; i < out.size(); ++i) out[i] = PatternByte(seed, first_index + i);
}

int64_t FirstPatternMismatch(uint64_t seed, uint64_t first_index, absl::Span<const uint8_t> data) {
  uint8_t expected[4096];
  for (size_t done = 0; done < data.size();) {
    const size_t n = std::min(sizeof(expected), data.size() - done);
    FillPattern(seed, first_index + done, absl::MakeSpan(expected, n));
    for (size_t i = 0; i < n; ++i) {
      if (data[done + i] != expected[i]) return static_cast<int64_t>(done + i);
    }
    done += n;
  }
  return -1;
}

absl::Status WaitForEnd(TransferAgent& agent, TransferId id, absl::Duration hang_guard,
                        absl::Duration poll, absl::Duration* elapsed) {
  const absl::Time start = absl::Now();
  while (true) {
    absl::StatusOr<bool> done = agent.CheckTransfer(id);
    if (!done.ok() || *done) {
      if (elapsed != nullptr) *elapsed = absl::Now() - start;
      return done.status();
    }
    if (absl::Now() - start > hang_guard) {
      return absl::DeadlineExceededError(
          absl::StrCat("transfer ", id, " did not end within ", absl::FormatDuration(hang_guard)));
    }
    absl::SleepFor(poll);
  }
}

}  // namespace tandem::kvtransfer::testing
