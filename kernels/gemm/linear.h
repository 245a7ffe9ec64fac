// Dense fp32 linear layer (torch.nn.functional.linear) for the CPU backend.
#ifndef TANDEM_KERNELS_GEMM_LINEAR_H_
#define TANDEM_KERNELS_GEMM_LINEAR_H_

#include <cstdint>

#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cpu {

// out[m, n] = sum_k a[m, k] * w[n, k] (+ bias[n] when bias != nullptr).
// a: [m, k]; w: [n, k] (nn.Linear weight layout [out_features, in_features]); bias: [n] or null;
// out: [m, n], must not overlap the inputs. fp32 accumulation (FMA where the CPU has it).
// Work is spread over `pool` (null: the calling thread only). Any m, n, k >= 0; k == 0 gives bias
// (or zeros).
//
// Strategy: small m (decode, m <= 16) runs dot products straight off w, parallel over n, so w is
// streamed once and never copied; larger m packs cache-sized blocks of a and w for a register-tiled
// microkernel (BLIS-style), parallel over n (or m when n is narrow). AVX2+FMA kernels are chosen
// at run time where the CPU supports them, portable vector code otherwise. The result is
// deterministic for given shapes, pool size and CPU, but not bitwise equal across those.
void Linear(const float* a, const float* w, const float* bias, int64_t m, int64_t n, int64_t k,
            float* out, ThreadPool* pool);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_GEMM_LINEAR_H_
