// CUDA twin of kernels/sampling/sampling.h: one token per row of fp32 logits, greedy or
// temperature + top-k + top-p with the Philox draw SamplingUniform(seed, step) computed on the
// device, so the CUDA and CPU backends pick the same token for the same logits.
//
// Asynchronous on `stream`, graph-capturable (two kernel launches, a caller-owned workspace of
// fixed size, no allocation, no host synchronization; the parameters live on the device, so a
// captured graph replays with new ones). Deterministic: the result is a pure function of the
// row's logits and parameters (integer fixed-point sums, no float atomics).
#ifndef TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_CUDA_H_
#define TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// Device copy of one row's SamplingParams plus the output index `step` that keys the draw.
struct DeviceSamplingRow {
  float temperature;  // 0 = greedy
  int32_t top_k;      // 0 = off
  float top_p;        // 1 = off
  uint64_t seed;
  uint64_t step;
  // > 0: only ids < vocab_limit are picked (the row's logits past it are masked); 0 or >= vocab:
  // the whole row. Last, so {temperature, top_k, top_p, seed, step} still reads as before.
  int64_t vocab_limit;
};

// Bytes of device workspace SampleTokens needs for this shape (0 when num_rows == 0). A pure
// function of its arguments, so a graph captured for (num_rows, vocab) keeps its workspace.
int64_t SampleTokensWorkspaceBytes(int64_t num_rows, int64_t vocab);

// out[r] = cpu::SampleToken(logits + r * vocab, vocab, params of rows[r], rows[r].step) for
// every row, with exactly its semantics: only the first SampledVocab(vocab, params) logits of a
// row take part (vocab_limit); among them greedy (argmax, lowest index on ties, NaN never wins,
// 0 when all NaN) for temperature 0 or vocab 1 or no logit above -inf; otherwise temperature,
// top-k (exactly k, ties to the lower index), top-p (smallest most-probable prefix reaching
// top_p, ties to the lower index), then inverse CDF in index order with
// u = SamplingUniform(seed, step); NaN and -inf have probability 0, +inf logits share it all.
//
// Probabilities are exp((logit - max) / temperature) in fp64, as on the CPU, summed in 128-bit
// fixed point (2^-62 units of the max token's weight), so sums are exact and order-free. The
// CPU sums fp64 in its own order; the two agree except where u or the top-p target lies within
// ~1e-12 (relative) of a cumulative boundary, or for tokens of weight below 2^-62 (which
// practically never win).
//
// logits: [num_rows, vocab] fp32 (device); rows: [num_rows] (device); out: [num_rows] int32
// (device); workspace: >= SampleTokensWorkspaceBytes(num_rows, vocab) bytes of device memory,
// 16-byte aligned, overwritten. Parameters are read on the device and not validated: callers
// validate with ValidateSamplingParams (invalid values give some token in [0, vocab); a
// temperature that is not > 0 means greedy).
// INVALID_ARGUMENT (nothing launched) for num_rows < 0, vocab < 1 or > INT32_MAX, null
// pointers, or a workspace that is too small or misaligned. num_rows == 0: OK, nothing launched.
//
// Cost: one pass over the logits for the max/argmax (split over several CTAs per row when rows
// are few), then one CTA per sampled row: top-k and top-p are each a 3-pass radix select over
// the row (11/11/10-bit digits of the order-preserving float key; top-p weighs each bin by
// probability), plus one pass for the inverse CDF. No sort.
absl::Status SampleTokens(const float* logits, int64_t num_rows, int64_t vocab,
                          const DeviceSamplingRow* rows, int32_t* out, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream);

// probs[r * vocab + i] = cpu::TokenProbabilities of row r (the distribution SampleTokens draws
// from: the kept tokens' exp((l - max) / T) over their sum, one-hot at the greedy choice for
// greedy rows, 0 past vocab_limit), fp64. The weights are the CPU's; their sum is the exact
// fixed-point sum, so each probability is within ~1e-15 (relative) of the CPU's. Same kernels,
// workspace and argument checks as SampleTokens (probs: [num_rows, vocab] fp64, device).
absl::Status TokenProbabilities(const float* logits, int64_t num_rows, int64_t vocab,
                                const DeviceSamplingRow* rows, double* probs, void* workspace,
                                int64_t workspace_bytes, cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_CUDA_H_
