// CUDA twin of kernels/sampling/rejection.h: Leviathan et al.'s rejection sampling of
// speculative drafts for a batch of verify passes, one CTA per pass, with the CPU reference's
// uniforms (Philox streams kAcceptStream / kResidualStream on the device) and scan order, so both
// accept the same drafts and emit the same token for the same probabilities.
//
// Asynchronous on `stream`, graph-capturable (one launch, no workspace, no allocation, no host
// synchronization). Deterministic: sums are fixed trees (each thread a contiguous run of ids in
// index order, then a block scan), never atomics.
#ifndef TANDEM_KERNELS_SAMPLING_CUDA_REJECTION_CUDA_H_
#define TANDEM_KERNELS_SAMPLING_CUDA_REJECTION_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// One verify pass: its k drafts, its k + 1 target rows, its k draft rows and its seed.
struct DeviceRejectionPass {
  int64_t target_row;   // first of its k + 1 rows of target_probs (p_1 .. p_{k+1})
  int64_t draft_row;    // first of its k rows of draft_probs (q_1 .. q_k)
  int64_t first_draft;  // first of its k ids in drafts
  int32_t num_drafts;   // k >= 0
  uint64_t seed;
  uint64_t first_step;  // the output index of the token after the pass's last fed token
};

struct DeviceRejectionResult {
  int32_t accepted;    // leading drafts accepted
  int32_t next_token;  // the residual sample at the first rejection, or the bonus token
};

// out[i] = cpu::RejectionSampleDrafts(p rows, q rows, drafts, vocab, seed, first_step) of pass i:
// accept draft d iff u * q(d) < p(d); the residual max(0, p - q) with d zeroed (p with d zeroed
// if it has no mass); the pick by inverse CDF in index order (the first id whose running sum
// exceeds u * total; the last positive one if rounding runs past the end; 0 if none is positive).
// The CPU sums in index order, this kernel in a fixed tree: the picks differ only where u * total
// lies within ~1e-15 (relative) of a running sum.
//
// target_probs: [rows][vocab] fp64 (device); draft_probs: [rows][vocab] fp64 (device); drafts:
// int32 (device); passes: [num_passes] (device); out: [num_passes] (device). Drafts must have
// q(d) > 0 (they were drawn from q). INVALID_ARGUMENT (nothing launched) for num_passes < 0,
// vocab < 1 or > INT32_MAX, or null pointers (draft_probs / drafts may be null when every pass
// has k = 0). num_passes == 0: OK, nothing launched.
absl::Status RejectionSampleDrafts(const double* target_probs, const double* draft_probs,
                                   const int32_t* drafts, const DeviceRejectionPass* passes,
                                   int64_t num_passes, int64_t vocab, DeviceRejectionResult* out,
                                   cudaStream_t stream);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_SAMPLING_CUDA_REJECTION_CUDA_H_
