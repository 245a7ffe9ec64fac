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

std::vector<StridedCopyOp> RandomStridedOps(std::mt19937& rng, uint64_t local_bytes,
                                            uint64_t remote_bytes, int count, uint64_t max_row) {
  std::vector<StridedCopyOp> ops;
  const uint64_t slice = local_bytes / static_cast<uint64_t>(count);
  for (int i = 0; i < count; ++i) {
    StridedCopyOp op;
    op.row_bytes = 1 + rng() % std::min(max_row, slice / 2);
    op.local_stride = op.row_bytes + rng() % (op.row_bytes + 1);
    op.remote_stride = op.row_bytes + rng() % (2 * op.row_bytes + 1);
    const uint64_t local_rows = (slice - op.row_bytes) / op.local_stride + 1;
    const uint64_t remote_rows = (remote_bytes - op.row_bytes) / op.remote_stride + 1;
    op.rows = 1 + rng() % std::min(local_rows, remote_rows);
    const uint64_t local_span = (op.rows - 1) * op.local_stride + op.row_bytes;
    const uint64_t remote_span = (op.rows - 1) * op.remote_stride + op.row_bytes;
    op.local_offset = i * slice + rng() % (slice - local_span + 1);
    op.remote_offset = rng() % (remote_bytes - remote_span + 1);
    ops.push_back(op);
  }
  return ops;
}

absl::Status CheckStridedCopies(uint64_t seed, absl::Span<const StridedCopyOp> ops,
                                absl::Span<const uint8_t> local, uint8_t fill) {
  std::vector<bool> written(local.size(), false);
  for (size_t o = 0; o < ops.size(); ++o) {
    const StridedCopyOp& op = ops[o];
    for (uint64_t r = 0; r < op.rows; ++r) {
      const uint64_t at = op.local_offset + r * op.local_stride;
      const int64_t bad = FirstPatternMismatch(seed, op.remote_offset + r * op.remote_stride,
                                               local.subspan(at, op.row_bytes));
      if (bad != -1) {
        return absl::DataLossError(
            absl::StrCat("op ", o, " row ", r, ": local byte ", at + bad, " differs"));
      }
      std::fill_n(written.begin() + at, op.row_bytes, true);
    }
  }
  for (size_t i = 0; i < local.size(); ++i) {
    if (!written[i] && local[i] != fill) {
      return absl::DataLossError(absl::StrCat("local byte ", i, " outside the rows changed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::testing
