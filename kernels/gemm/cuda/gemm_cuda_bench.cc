// CublasLtGemm on Llama-3-8B's projections (bf16 in, fp32 accumulation, bf16 out; lm_head also
// with fp32 logits), m = 1, 64, 2048, 8192 tokens. Prints time, TFLOP/s and, for the
// weight-bound small m, GB/s of weight read against 4.3 TB/s (measured device-to-device copy on
// this H200). Weights rotate over copies spanning far more than the 60 MB L2, so every call
// reads its weight from HBM. Random bf16 data (tensor cores draw less power on zeros).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/gemm/cuda/gemm_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr double kHbmBytesPerSec = 4.3e12;

struct Proj {
  const char* name;
  int64_t n, k;
  bool fp32_out;
};
constexpr Proj kProjs[] = {
    {"qkv", 6144, 4096, false},       {"o", 4096, 4096, false},
    {"gate_up", 28672, 4096, false},  {"down", 4096, 14336, false},
    {"lm_head", 128256, 4096, false}, {"lm_head fp32", 128256, 4096, true},
};

// Fills n elements with random bf16 N(0, 1) values, a 16 MiB random tile repeated.
absl::Status FillRandom(bf16* p, int64_t n, std::mt19937& rng) {
  const int64_t tile = int64_t{8} << 20;
  std::vector<bf16> host(tile);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (bf16& e : host) e = __float2bfloat16_rn(dist(rng));
  for (int64_t off = 0; off < n; off += tile) {
    const int64_t len = std::min(tile, n - off);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(p + off, host.data(), len * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; CublasLtGemm bf16 x bf16 -> bf16 (fp32 accumulate)\n", prop.name,
              prop.multiProcessorCount);
  ASSIGN_OR_RETURN(std::unique_ptr<CublasLtGemm> gemm, CublasLtGemm::Create());

  const int64_t max_m = 8192, max_k = 14336;
  const int64_t pool_elems = 128256 * 4096;  // the largest weight; smaller ones rotate in it
  const int64_t max_out = max_m * 128256;
  bf16 *a = nullptr, *w = nullptr, *out = nullptr;
  float* logits = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&a, max_m * max_k * sizeof(bf16)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&w, pool_elems * sizeof(bf16)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&out, max_out * sizeof(bf16)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&logits, max_out * sizeof(float)));
  std::mt19937 rng(1234);
  RETURN_IF_ERROR(FillRandom(a, max_m * max_k, rng));
  RETURN_IF_ERROR(FillRandom(w, pool_elems, rng));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));

  std::printf("%6s %-13s %7s %6s %10s %9s %9s %7s\n", "m", "proj", "n", "k", "time_us", "TFLOP/s",
              "w_GB/s", "%HBM");
  for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{2048}, int64_t{8192}}) {
    for (const Proj& p : kProjs) {
      const int64_t w_elems = p.n * p.k;
      const int64_t copies = std::min<int64_t>(16, std::max<int64_t>(1, pool_elems / w_elems));
      auto call = [&](int i) -> absl::Status {
        const bf16* wi = w + (i % copies) * w_elems;
        if (p.fp32_out) {
          return gemm->Linear<bf16, float>(a, wi, nullptr, m, p.n, p.k, logits, stream);
        }
        return gemm->Linear<bf16, bf16>(a, wi, nullptr, m, p.n, p.k, out, stream);
      };
      for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(call(i));  // plan + warm-up
      const double flop = 2.0 * m * p.n * p.k;
      const int iters = static_cast<int>(std::clamp(2e11 / flop, 10.0, 200.0));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
      for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(call(i));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
      const double sec = ms * 1e-3 / iters;
      const double w_bytes = 2.0 * w_elems;
      if (m <= 64) {
        std::printf("%6ld %-13s %7ld %6ld %10.1f %9.1f %9.0f %6.1f%%\n", static_cast<long>(m),
                    p.name, static_cast<long>(p.n), static_cast<long>(p.k), sec * 1e6,
                    flop / sec / 1e12, w_bytes / sec / 1e9,
                    100.0 * w_bytes / sec / kHbmBytesPerSec);
      } else {
        std::printf("%6ld %-13s %7ld %6ld %10.1f %9.1f %9s %7s\n", static_cast<long>(m), p.name,
                    static_cast<long>(p.n), static_cast<long>(p.k), sec * 1e6, flop / sec / 1e12,
                    "-", "-");
      }
    }
  }
  std::printf("plans cached: %zu\n", gemm->num_cached_plans());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(w);
  cudaFree(out);
  cudaFree(logits);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main() {
  const absl::Status status = tandem::kernels::cuda::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "gemm_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
