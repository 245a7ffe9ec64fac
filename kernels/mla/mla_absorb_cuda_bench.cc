// The W_UK / W_UV absorption steps (MlaAbsorbQuery, MlaUnabsorbOutput) on the first CUDA device,
// DeepSeek shapes (latent 512, nope 128, v 128, bf16) by heads x tokens: cuBLAS's strided-batched
// GEMM (MlaAbsorbOptions::gemv_max_tokens = 0), the weight-streaming GEMVs, and the GEMVs
// launched with PDL (their first weight loads before griddepcontrol.wait).
//   mla_absorb_cuda_bench [--heads=16,128] [--tokens=1,2,3,4,6,8,12,16]
// Each cell: 20 calls captured in one CUDA graph, mean per call over 5 replays after one. The calls
// cycle through copies of kv_b_proj spanning >= 512 MiB, so no call finds its weights in the L2
// (the decode step reads them once from HBM too). GB/s: the step's weight bytes (Hq x 128 x 512 x
// 2) over its time. Prints a table; no pass/fail.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/graph_timing.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using Bf16 = __nv_bfloat16;
constexpr int kCallsPerGraph = 20;  // CapturedCallsUs's default

absl::Status Main(int argc, char** argv) {
  const char* heads_arg = nullptr;
  const char* tokens_arg = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--heads=", 0) == 0) heads_arg = argv[i] + 8;
    if (a.rfind("--tokens=", 0) == 0) tokens_arg = argv[i] + 9;
  }
  const std::vector<int64_t> heads = mla_test::ParseInt64List(heads_arg, {16, 128});
  const std::vector<int64_t> tokens =
      mla_test::ParseInt64List(tokens_arg, {1, 2, 3, 4, 6, 8, 12, 16});
  int64_t max_h = 0, max_t = 0;
  for (int64_t h : heads) max_h = std::max(max_h, h);
  for (int64_t t : tokens) max_t = std::max(max_t, t);
  MlaDims dims = mla_test::kV3Dims;
  const int64_t copy_elems = max_h * (dims.qk_nope_head_dim + dims.v_head_dim) * dims.kv_lora_rank;
  const int64_t copies = std::max<int64_t>(kCallsPerGraph, (int64_t{512} << 20) / (copy_elems * 2));
  Bf16 *kv_b = nullptr, *q = nullptr, *q_cat = nullptr, *o_lat = nullptr, *out = nullptr;
  void* cublas_ws = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&kv_b, copies * copy_elems * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&q, max_t * max_h * 192 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&q_cat, max_t * max_h * 576 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&o_lat, max_t * max_h * 512 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&out, max_t * max_h * 128 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&cublas_ws, 32 << 20));
  RETURN_IF_ERROR(FillRandomBf16(kv_b, copies * copy_elems * 2));
  RETURN_IF_ERROR(FillRandomBf16(q, max_t * max_h * 192 * 2));
  RETURN_IF_ERROR(FillRandomBf16(o_lat, max_t * max_h * 512 * 2));
  cublasHandle_t cublas = nullptr;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate");
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  if (cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(cublas, cublas_ws, 32 << 20) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("cublasSetWorkspace");
  }
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("MLA absorption steps, %s: latent 512, nope 128, v 128, bf16; graph us a call\n",
              prop.name);
  std::printf(
      "| heads | tokens | W_UK cuBLAS | W_UK GEMV | W_UK GEMV+PDL | GB/s | W_UV cuBLAS | W_UV GEMV "
      "| W_UV GEMV+PDL | GB/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const MlaAbsorbOptions cublas_only{.gemv_max_tokens = 0};
  const MlaAbsorbOptions gemv{.gemv_max_tokens = 1 << 20};
  const MlaAbsorbOptions gemv_pdl{.gemv_max_tokens = 1 << 20, .pdl = true};
  for (int64_t h : heads) {
    dims.num_heads = h;
    const int64_t elems = h * (dims.qk_nope_head_dim + dims.v_head_dim) * dims.kv_lora_rank;
    const int64_t n_copies = copies * copy_elems / elems;
    const double step_bytes = double(h) * 128 * 512 * 2;
    for (int64_t t : tokens) {
      double us[6];
      const MlaAbsorbOptions* opts[3] = {&cublas_only, &gemv, &gemv_pdl};
      for (int k = 0; k < 3; ++k) {
        const MlaAbsorbOptions& o = *opts[k];
        ASSIGN_OR_RETURN(us[k], CapturedCallsUs(
                                    [&](int i) {
                                      return MlaAbsorbQuery<Bf16>(cublas, q,
                                                                  kv_b + (i % n_copies) * elems,
                                                                  dims, t, q_cat, stream, o);
                                    },
                                    stream));
        ASSIGN_OR_RETURN(us[3 + k], CapturedCallsUs(
                                        [&](int i) {
                                          return MlaUnabsorbOutput<Bf16>(
                                              cublas, o_lat, kv_b + (i % n_copies) * elems, dims, t,
                                              out, stream, o);
                                        },
                                        stream));
      }
      std::printf("| %ld | %ld | %.2f | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f | %.0f |\n",
                  static_cast<long>(h), static_cast<long>(t), us[0], us[1], us[2],
                  step_bytes / std::min(us[1], us[2]) / 1e3, us[3], us[4], us[5],
                  step_bytes / std::min(us[4], us[5]) / 1e3);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) {
  const absl::Status s = tandem::kernels::cuda::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "mla_absorb_cuda_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
