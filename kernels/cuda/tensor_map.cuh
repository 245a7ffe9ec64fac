// TMA tensor maps for the CUDA kernels, the 2-d TMA load and 1-d bulk copy, and the mbarrier
// device helpers (init, arrive, expect-tx, wait) (internal; include from .cu only).
#ifndef TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
#define TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal {

// cuTensorMapEncodeTiled from the driver through the runtime (no libcuda link), looked up once;
// nullptr where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// mbarriers (shared::cta). MbarInit: `count` arrivals complete a phase (fence the inits with
// fence.mbarrier_init before the async proxy uses them). MbarWait blocks until the phase of
// parity `parity` has completed (a fresh barrier is in phase 0, so waiting on parity 1 returns at
// once). Unbounded on purpose: a poll counter that traps after ~30 s (a poll takes ~30 ns on the
// H200) cost the MoE wgmma kernel 3% on every benchmark shape (measured, alternating builds), and
// a clock64 or printf variant made ptxas spill in its 40-register producer.
__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count));
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
// One poll of MbarWait: whether the phase of parity `parity` of the mbarrier at shared address
// `addr` has completed.
__device__ __forceinline__ bool MbarTryWait(uint32_t addr, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(addr), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = SmemAddr(bar);
  while (!MbarTryWait(addr, parity)) {
  }
}

// MbarWait with a bound: traps (the launch fails with cudaErrorLaunchFailure, the context is
// lost) after `max_polls` unsuccessful polls (2^25: ~1 s at the ~30 ns a poll measured on an
// H200, longer where try_wait suspends the thread between polls) instead of spinning forever on
// an arrival or a transfer that never comes. For kernels whose waits are short data waits, where
// a hang (a protocol bug, a copy that faulted) must surface as an error: the counter costs an add
// and a compare a poll.
__device__ __forceinline__ void MbarWaitOrTrap(uint64_t* bar, uint32_t parity,
                                               uint32_t max_polls = 1u << 25) {
  const uint32_t addr = SmemAddr(bar);
  for (uint32_t polls = 0; !MbarTryWait(addr, parity); ++polls) {
    if (polls == max_polls) __trap();
  }
}

// One arrival on the mbarrier `bar` that also expects `bytes` more transaction bytes (a TMA's).
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

// TMA: the box at (inner coordinate col, outer coordinate row) of the 2-d tensor map into shared
// memory at dst, completing its bytes on the mbarrier `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int col, int row,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(SmemAddr(bar))
      : "memory");
}

// 1-d bulk copy (sm_90): `bytes` (a multiple of 16) from 16-byte aligned global `src` into
// shared memory at dst (16-byte aligned), completing its bytes on the mbarrier `bar`; the L2
// evict-first policy (data read once: weights streamed by the batch-1 GEMVs).
__device__ __forceinline__ void BulkLoad1dEvictFirst(uint32_t dst, const void* src, uint32_t bytes,
                                                     uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], pol;\n}\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
#endif
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_CUDA_TENSOR_MAP_CUH_
