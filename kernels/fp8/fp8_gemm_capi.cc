// A C entry point to CublasLtFp8Gemm::Linear for one measurement: kernels/fp8/scaled_mm_bench.py
// loads libtandem_fp8_gemm.so with ctypes and times our FP8 GEMM and torch._scaled_mm in turn, in
// one process on the same tensors, so both run under the same GPU clocks (the H200's clocks drift
// by up to ~19% within a bench on random FP8 operands: BENCHMARKS.md, "Twenty-eighth session").
// Not a serving API: nothing but the bench links it.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>

#include "kernels/fp8/fp8_gemm_cuda.h"

namespace {

using tandem::kernels::cuda::CublasLtFp8Gemm;
using tandem::kernels::cuda::Fp8GemmScaling;

}  // namespace

extern "C" {

// A CublasLtFp8Gemm on the current device (its defaults: 32 MiB workspace, outer-vector scales
// where cuBLASLt has them), or null with the error on stderr.
void* tandem_fp8_gemm_create() {
  auto gemm = CublasLtFp8Gemm::Create();
  if (!gemm.ok()) {
    std::fprintf(stderr, "tandem_fp8_gemm_create: %s\n", gemm.status().ToString().c_str());
    return nullptr;
  }
  return gemm->release();
}

void tandem_fp8_gemm_destroy(void* gemm) { delete static_cast<CublasLtFp8Gemm*>(gemm); }

// CublasLtFp8Gemm::Linear: out [m, n] bf16 = (a [m, k] e4m3 x scales) (w [n, k] e4m3 x scales)^T;
// scaling 0 = per-tensor (one device fp32 scale each), 1 = per-token x per-channel (a_scales [m],
// w_scales [n]). Device pointers; `stream` a cudaStream_t (null: the legacy default stream).
// 0 on success, else 1 with the error on stderr.
int tandem_fp8_gemm_linear(void* gemm, const void* a_codes, const float* a_scales,
                           const void* w_codes, const float* w_scales, int scaling, int64_t m,
                           int64_t n, int64_t k, void* out, void* stream) {
  if (gemm == nullptr || (scaling != 0 && scaling != 1)) {
    std::fprintf(stderr, "tandem_fp8_gemm_linear: null gemm or scaling %d\n", scaling);
    return 1;
  }
  const absl::Status s = static_cast<CublasLtFp8Gemm*>(gemm)->Linear(
      static_cast<const uint8_t*>(a_codes), a_scales, static_cast<const uint8_t*>(w_codes),
      w_scales, scaling == 0 ? Fp8GemmScaling::kTensor : Fp8GemmScaling::kTokenChannel, m, n, k,
      static_cast<__nv_bfloat16*>(out), static_cast<cudaStream_t>(stream));
  if (!s.ok()) {
    std::fprintf(stderr, "tandem_fp8_gemm_linear: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // extern "C"
