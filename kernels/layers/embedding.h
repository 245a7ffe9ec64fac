// Token embedding lookup (nn.Embedding / vLLM VocabParallelEmbedding without TP).
#ifndef TANDEM_KERNELS_LAYERS_EMBEDDING_H_
#define TANDEM_KERNELS_LAYERS_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cpu {

// out[t, :] = table[ids[t], :].
// ids: [num_tokens]; table: [vocab, hidden]; out: [num_tokens, hidden].
// Every id is checked before anything is written: INVALID_ARGUMENT naming the first offending
// position and id when an id is < 0 or >= vocab, and out is left untouched.
absl::Status Embedding(const int32_t* ids, int64_t num_tokens, const float* table, int64_t vocab,
                       int64_t hidden, float* out);

// The vocab-parallel lookup of one tensor-parallel rank (vLLM's VocabParallelEmbedding): `table`
// holds vocabulary rows [vocab_begin, vocab_begin + rows); out[t, :] is the row of ids[t] when it
// falls there, else zeros (the group's all-reduce sums the ranks' outputs into the full lookup).
// INVALID_ARGUMENT, as Embedding, when an id is < 0 or >= vocab (the full vocabulary).
absl::Status VocabShardEmbedding(const int32_t* ids, int64_t num_tokens, const float* table,
                                 int64_t vocab_begin, int64_t rows, int64_t vocab, int64_t hidden,
                                 float* out);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_LAYERS_EMBEDDING_H_
