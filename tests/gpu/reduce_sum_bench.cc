// Read bandwidth of the smoke reduction (bytes read / time), on the first CUDA device.
//   reduce_sum_bench [--iters=N]
// Prints a table; no pass/fail. Reference point on an H200: device copy ~4.27 TB/s (r+w).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/cuda_status.h"
#include "tests/gpu/reduce_sum.h"

namespace tandem::gpu_smoke {
namespace {

absl::Status Run(int iters) {
  int dev = 0;
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("%14s %12s %12s %10s\n", "elements", "MiB", "time_us", "GB/s");
  const int64_t max_n = int64_t{1} << 29;  // 2 GiB of floats
  float* d_in = nullptr;
  double* d_out = nullptr;
  void* ws = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_in, max_n * sizeof(float)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, ReduceSumWorkspaceBytes()));
  {  // random contents so nothing is trivially compressible or zero
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<float> chunk(int64_t{1} << 24);
    for (float& x : chunk) x = dist(rng);
    for (int64_t off = 0; off < max_n; off += chunk.size()) {
      CUDA_RETURN_IF_ERROR(cudaMemcpy(d_in + off, chunk.data(), chunk.size() * sizeof(float),
                                      cudaMemcpyHostToDevice));
    }
  }
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  for (int64_t n = int64_t{1} << 20; n <= max_n; n *= 4) {
    RETURN_IF_ERROR(ReduceSumF32(d_in, n, d_out, ws, nullptr));  // warm-up
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(ReduceSumF32(d_in, n, d_out, ws, nullptr));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    const double us = 1e3 * ms / iters;
    const double bytes = static_cast<double>(n) * sizeof(float);
    std::printf("%14lld %12.1f %12.2f %10.1f\n", static_cast<long long>(n), bytes / (1 << 20), us,
                bytes / (us * 1e3));
  }
  CUDA_RETURN_IF_ERROR(cudaFree(d_in));
  CUDA_RETURN_IF_ERROR(cudaFree(d_out));
  CUDA_RETURN_IF_ERROR(cudaFree(ws));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::gpu_smoke

int main(int argc, char** argv) {
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  if (iters <= 0) {
    std::fprintf(stderr, "--iters must be positive\n");
    return 2;
  }
  absl::Status s = tandem::gpu_smoke::Run(iters);
  if (!s.ok()) {
    std::fprintf(stderr, "reduce_sum_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
