// Bandwidth of the CUDA layer kernels and the KV write at large sizes (bf16), Llama-3-8B-like
// widths. GB/s = bytes read + written / time; "%peak" against 4.3 TB/s. Prints a table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "kernels/attention/cuda/reshape_and_cache_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/rope.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr double kPeak = 4.3e12;

absl::Status Time(const std::string& name, double bytes, const std::function<absl::Status()>& fn) {
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(fn());
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  const int iters = 50;
  CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(fn());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  const double sec = ms * 1e-3 / iters;
  std::printf("%-40s %10.1f %9.1f %8.1f %7.1f%%\n", name.c_str(), sec * 1e6, bytes / 1e6,
              bytes / sec / 1e9, 100.0 * bytes / sec / kPeak);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T*> Alloc(int64_t n) {
  T* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, n * sizeof(T)));
  CUDA_RETURN_IF_ERROR(cudaMemset(p, 0x3c, n * sizeof(T)));  // finite, nonzero bf16 values
  return p;
}

absl::Status Run() {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; bf16 layer kernels\n", prop.name, prop.multiProcessorCount);
  std::printf("%-40s %10s %9s %8s %8s\n", "kernel", "time_us", "MB", "GB/s", "%4.3TB/s");
  const int64_t tokens = 16384, hidden = 4096, inter = 14336, hq = 32, hkv = 8, d = 128;
  ASSIGN_OR_RETURN(bf16 * x, Alloc<bf16>(tokens * hidden));
  ASSIGN_OR_RETURN(bf16 * res, Alloc<bf16>(tokens * hidden));
  ASSIGN_OR_RETURN(bf16 * out, Alloc<bf16>(tokens * hidden));
  ASSIGN_OR_RETURN(bf16 * w, Alloc<bf16>(hidden));
  const double row = static_cast<double>(tokens) * hidden * 2;
  RETURN_IF_ERROR(Time("RmsNorm 16384 x 4096", 2 * row,
                       [&] { return RmsNorm<bf16>(x, w, tokens, hidden, 1e-5f, out, nullptr); }));
  RETURN_IF_ERROR(Time("FusedAddRmsNorm 16384 x 4096", 4 * row, [&] {
    return FusedAddRmsNorm<bf16>(x, res, w, tokens, hidden, 1e-5f, nullptr);
  }));
  RETURN_IF_ERROR(Time("RmsNorm 64 x 4096 (decode)", 2.0 * 64 * hidden * 2,
                       [&] { return RmsNorm<bf16>(x, w, 64, hidden, 1e-5f, out, nullptr); }));

  ASSIGN_OR_RETURN(bf16 * gu, Alloc<bf16>(tokens * 2 * inter));
  ASSIGN_OR_RETURN(bf16 * act, Alloc<bf16>(tokens * inter));
  RETURN_IF_ERROR(Time("SiluAndMul 16384 x 14336", 3.0 * tokens * inter * 2,
                       [&] { return SiluAndMul<bf16>(gu, tokens, inter, act, nullptr); }));

  ASSIGN_OR_RETURN(bf16 * q, Alloc<bf16>(tokens * hq * d));
  ASSIGN_OR_RETURN(bf16 * k, Alloc<bf16>(tokens * hkv * d));
  ASSIGN_OR_RETURN(int64_t * pos, Alloc<int64_t>(tokens));
  ASSIGN_OR_RETURN(float* inv_freq, Alloc<float>(d / 2));
  {
    ASSIGN_OR_RETURN(std::vector<float> f, ComputeRopeInvFreq(500000.0, d, {}));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int64_t> p(tokens);
    std::iota(p.begin(), p.end(), 0);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(pos, p.data(), tokens * 8, cudaMemcpyHostToDevice));
  }
  RETURN_IF_ERROR(Time("ApplyRope 16384 x (32+8) x 128", 2.0 * tokens * (hq + hkv) * d * 2, [&] {
    return ApplyRope<bf16>(pos, tokens, inv_freq, d, q, hq, k, hkv, nullptr);
  }));

  const int64_t vocab = 128256;
  ASSIGN_OR_RETURN(bf16 * table, Alloc<bf16>(vocab * hidden));
  ASSIGN_OR_RETURN(int32_t * ids, Alloc<int32_t>(tokens));
  {
    std::vector<int32_t> h(tokens);
    std::mt19937 rng(1);
    for (int32_t& id : h) id = static_cast<int32_t>(rng() % vocab);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(ids, h.data(), tokens * 4, cudaMemcpyHostToDevice));
  }
  RETURN_IF_ERROR(Time("Embedding 16384 x 4096 (vocab 128256)", 2 * row, [&] {
    return Embedding<bf16>(ids, tokens, table, vocab, hidden, out, nullptr);
  }));

  // KV write: 16384 tokens into a 32-layer pool at shuffled slots.
  KvCacheLayout layout{.num_blocks = tokens / 16 * 2,
                       .num_layers = 32,
                       .block_size = 16,
                       .num_kv_heads = hkv,
                       .head_dim = d};
  ASSIGN_OR_RETURN(bf16 * pool, Alloc<bf16>(layout.TotalElems()));
  ASSIGN_OR_RETURN(bf16 * v, Alloc<bf16>(tokens * hkv * d));
  ASSIGN_OR_RETURN(int64_t * slots, Alloc<int64_t>(tokens));
  {
    std::vector<int64_t> s(layout.NumSlots());
    std::iota(s.begin(), s.end(), 0);
    std::shuffle(s.begin(), s.end(), std::mt19937(3));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(slots, s.data(), tokens * 8, cudaMemcpyHostToDevice));
  }
  DeviceKvCache cache{.data = pool, .layout = layout, .dtype = KvDtype::kBf16};
  RETURN_IF_ERROR(Time("ReshapeAndCache 16384 tok, 8 x 128, bf16", 4.0 * tokens * hkv * d * 2, [&] {
    return ReshapeAndCache<bf16>(k, v, slots, tokens, 5, cache, nullptr);
  }));
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main() {
  const absl::Status status = tandem::kernels::cuda::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "layers_cuda_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
