// cuda::SampleTokens at vocab 128256 (Llama 3) for 1, 64 and 256 rows: greedy, temperature only,
// top-p, and top-k + top-p, on N(0, sigma^2) logits (sigma 2: a flat distribution with a large
// nucleus, the expensive case; sigma 6: peaked). Prints time per call and the logits' read
// rate (one pass) for reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/sampling/cuda/sampling_cuda.h"

namespace tandem::kernels::cuda {
namespace {

struct Mode {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p;
};
constexpr Mode kModes[] = {
    {"greedy", 0.0f, 0, 1.0f},
    {"T=0.8", 0.8f, 0, 1.0f},
    {"T=0.8 top_p=0.9", 0.8f, 0, 0.9f},
    {"T=0.8 k=50 p=0.9", 0.8f, 50, 0.9f},
};

absl::Status Run() {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; SampleTokens, vocab 128256\n", prop.name,
              prop.multiProcessorCount);
  const int64_t vocab = 128256, max_rows = 256;
  float* logits = nullptr;
  DeviceSamplingRow* rows = nullptr;
  int32_t* out = nullptr;
  void* ws = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&logits, max_rows * vocab * sizeof(float)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&rows, max_rows * sizeof(DeviceSamplingRow)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&out, max_rows * sizeof(int32_t)));
  int64_t ws_bytes = 0;
  for (int64_t r : {1, 64, 256}) {
    ws_bytes = std::max(ws_bytes, SampleTokensWorkspaceBytes(r, vocab));
  }
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, ws_bytes));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::mt19937 rng(7);
  std::vector<float> host(max_rows * vocab);

  std::printf("%5s %5s %-18s %10s %12s %9s\n", "sigma", "rows", "mode", "time_us", "us_per_row",
              "GB/s");
  for (float sigma : {2.0f, 6.0f}) {
    std::normal_distribution<float> dist(0.0f, sigma);
    for (float& e : host) e = dist(rng);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(logits, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    for (const Mode& mode : kModes) {
      std::vector<DeviceSamplingRow> params(max_rows);
      for (int64_t r = 0; r < max_rows; ++r) {
        params[r] = {mode.temperature, mode.top_k, mode.top_p, static_cast<uint64_t>(r), 17, 0};
      }
      CUDA_RETURN_IF_ERROR(cudaMemcpy(rows, params.data(), max_rows * sizeof(DeviceSamplingRow),
                                      cudaMemcpyHostToDevice));
      for (int64_t num_rows : {int64_t{1}, int64_t{64}, int64_t{256}}) {
        auto call = [&] {
          return SampleTokens(logits, num_rows, vocab, rows, out, ws, ws_bytes, stream);
        };
        for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(call());
        const int iters = 20;
        CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
        for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(call());
        CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
        CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
        const double us = ms * 1e3 / iters;
        const double bytes = 4.0 * num_rows * vocab;
        std::printf("%5.0f %5ld %-18s %10.1f %12.2f %9.0f\n", sigma, static_cast<long>(num_rows),
                    mode.name, us, us / num_rows, bytes / (us * 1e-6) / 1e9);
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(logits);
  cudaFree(rows);
  cudaFree(out);
  cudaFree(ws);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main() {
  const absl::Status status = tandem::kernels::cuda::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "sampling_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
