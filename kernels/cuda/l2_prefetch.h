// L2Prefetch: a few CTAs that pull byte ranges of global memory into the L2 cache, so that HBM
// works while a kernel that barely reads it runs (the batch-1 decode attention: 4 MB of KV in
// 13 us) and the kernels after it find their weights in L2 (runtime/cuda's FoldedLayer:
// o_proj's, then the head of gate_up's).
//
// Hopper (sm_90): one `cp.async.bulk.prefetch.L2.global` per chunk of up to kL2PrefetchChunkBytes
// (16-byte aligned addresses, sizes a multiple of 16: the PTX ISA's rule); the unaligned edges of
// a range, and every range on older architectures, per 128-byte line with `prefetch.global.L2`.
// A prefetch is a hint: nothing is written, no result of any kernel changes, and the ranges must
// not be written while it may still run (weights: immutable).
//
// Programmatic dependent launch (programmatic_launch): the kernel lets its dependents launch at
// its first instruction (griddepcontrol.launch_dependents), issues its prefetches (it reads
// nothing a predecessor writes), then waits for its own predecessor (griddepcontrol.wait) before
// it exits. Its completion thus implies its predecessor's completion and memory flush: a PDL
// kernel after it that waits (WaitForPrecedingGrid) sees everything the kernel before the
// prefetch wrote, exactly as without the prefetch between them.
#ifndef TANDEM_KERNELS_CUDA_L2_PREFETCH_H_
#define TANDEM_KERNELS_CUDA_L2_PREFETCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// One range of device memory to prefetch: `bytes` bytes from `ptr` (any alignment).
struct L2PrefetchRange {
  const void* ptr = nullptr;
  int64_t bytes = 0;
};

// The most ranges one call takes (they travel by value in the kernel's parameters).
inline constexpr int kL2PrefetchMaxRanges = 4;
// The largest single bulk prefetch the kernel issues.
inline constexpr int64_t kL2PrefetchChunkBytes = int64_t{32} << 10;

// Enqueues the prefetch of `ranges[0, num_ranges)` on `stream` (with the PDL attribute when
// `programmatic_launch`). Ranges of 0 bytes are skipped; when no byte is left nothing is
// launched. INVALID_ARGUMENT before any launch: num_ranges < 0 or > kL2PrefetchMaxRanges,
// ranges null with num_ranges > 0, a range with bytes < 0, or a null ptr with bytes > 0.
// issue_after_wait: the prefetches are issued after griddepcontrol.wait instead of before it
// (they then overlap the kernel after this one only, not the tail of the one before; A/B runs).
absl::Status L2Prefetch(const L2PrefetchRange* ranges, int num_ranges, cudaStream_t stream,
                        bool programmatic_launch, bool issue_after_wait = false);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_L2_PREFETCH_H_
