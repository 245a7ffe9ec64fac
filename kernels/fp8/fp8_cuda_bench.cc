// FP8 GEMV bandwidth at Llama-3-8B decode shapes (issue 38 item 5): Fp8Gemv (activation
// quantization included) against the bf16 SmallMLinear of kernels/cuda in the same run. Prints
// one line per (shape, m, scheme): microseconds, weight GB/s, and the speedup over bf16.
//
//   fp8_cuda_bench [--iters=200]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cuda/gemv_cuda.h"
#include "kernels/fp8/fp8_cuda.h"

namespace tandem::kernels::cuda {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

// Mean microseconds of `fn` over `iters` launches (after 10 warm-up ones).
double TimeUs(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 10; ++i) fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / iters;
}

template <typename T>
T* DeviceFill(size_t count, uint8_t byte) {
  T* p = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) != cudaSuccess) std::abort();
  cudaMemset(p, byte, count * sizeof(T));
  return p;
}

int Main(int argc, char** argv) {
  int iters = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  const Shape shapes[] = {{"qkv_proj", 6144, 4096},
                          {"o_proj", 4096, 4096},
                          {"gate_up_proj", 28672, 4096},
                          {"down_proj", 4096, 14336}};
  std::printf("shape m scheme us GB/s(weights) speedup_vs_bf16\n");
  for (const Shape& s : shapes) {
    // Codes 0x38 (1.0) and small bf16 activations: finite results, realistic traffic.
    uint8_t* w8 = DeviceFill<uint8_t>(s.n * s.k, 0x38);
    __nv_bfloat16* w16 = DeviceFill<__nv_bfloat16>(s.n * s.k, 0x3c);
    float* ws = DeviceFill<float>(s.n * ((s.k + 127) / 128), 0x3c);
    __nv_bfloat16* x = DeviceFill<__nv_bfloat16>(16 * s.k, 0x3c);
    uint8_t* xq = DeviceFill<uint8_t>(16 * s.k, 0);
    float* xs = DeviceFill<float>(16 * ((s.k + 127) / 128), 0);
    __nv_bfloat16* out = DeviceFill<__nv_bfloat16>(16 * s.n, 0);
    for (int64_t m : {1, 8, 16}) {
      const int64_t bf16_m = m <= kGemvMaxM ? m : kGemvMaxM;
      const double bf16_us = TimeUs(iters, [&] {
        (void)SmallMLinear<__nv_bfloat16, __nv_bfloat16>(x, w16, nullptr, bf16_m, s.n, s.k, out,
                                                         nullptr);
      });
      std::printf("%s %ld bf16(m=%ld) %.2f %.0f 1.00\n", s.name, static_cast<long>(m),
                  static_cast<long>(bf16_m), bf16_us, 2.0 * s.n * s.k / bf16_us / 1e3);
      struct Variant {
        const char* name;
        Fp8ActivationScheme scheme;
        int64_t block_cols;
      };
      const Variant variants[] = {{"w8a16-channel", Fp8ActivationScheme::kNone, s.k},
                                  {"token-channel", Fp8ActivationScheme::kDynamicToken, s.k},
                                  {"group128-block", Fp8ActivationScheme::kDynamicGroup128, 128}};
      for (const Variant& v : variants) {
        const Fp8DeviceWeight w{w8, ws, {s.n, s.k, 1, v.block_cols}};
        Fp8DeviceActivations a;
        a.scheme = v.scheme;
        a.values = x;
        a.codes = xq;
        a.scales = xs;
        const double us = TimeUs(iters, [&] {
          if (v.scheme != Fp8ActivationScheme::kNone) {
            (void)QuantizeActivations(x, m, s.k, v.scheme, 1.0f, xq, xs, nullptr);
          }
          (void)Fp8Gemv<__nv_bfloat16>(a, w, nullptr, m, out, nullptr);
        });
        std::printf("%s %ld %s %.2f %.0f %.2f%s\n", s.name, static_cast<long>(m), v.name, us,
                    1.0 * s.n * s.k / us / 1e3, bf16_us / us,
                    m > kGemvMaxM ? " (bf16 at m=8)" : "");
      }
    }
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("CUDA error: %s\n", cudaGetErrorString(err));
      return 1;
    }
    for (void* p : {static_cast<void*>(w8), static_cast<void*>(w16), static_cast<void*>(ws),
                    static_cast<void*>(x), static_cast<void*>(xq), static_cast<void*>(xs),
                    static_cast<void*>(out)}) {
      cudaFree(p);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
