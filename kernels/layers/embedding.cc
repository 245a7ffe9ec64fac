#include "kernels/layers/embedding.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kernels::cpu {

namespace {

// Validate first: a half-written `out` would be worse than no output.
absl::Status CheckIds(const int32_t* ids, int64_t num_tokens, int64_t vocab) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding: token id ", ids[t], " at position ", t, " is out of range [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VocabShardEmbedding(const int32_t* ids, int64_t num_tokens, const float* table,
                                 int64_t vocab_begin, int64_t rows, int64_t vocab, int64_t hidden,
                                 float* out) {
  if (absl::Status s = CheckIds(ids, num_tokens, vocab); !s.ok()) return s;
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t local = static_cast<int64_t>(ids[t]) - vocab_begin;
    if (local >= 0 && local < rows) {
      std::memcpy(out + t * hidden, table + local * hidden, row_bytes);
    } else {
      std::memset(out + t * hidden, 0, row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status Embedding(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                       int64_t hidden, float* out) {
  if (absl::Status s = CheckIds(ids, num_tokens, vocab); !s.ok()) return s;
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::memcpy(out + t * hidden, table + static_cast<int64_t>(ids[t]) * hidden, row_bytes);
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
