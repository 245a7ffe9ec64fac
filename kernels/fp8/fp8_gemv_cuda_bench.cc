// The decode FP8 linear layer (fp8_gemv_cuda.h) at Llama-3-8B decode shapes, m = 1 / 8 / 16,
// next to the bf16 SmallMLinear and the previous FP8 GEMV (QuantizeActivations + Fp8Gemv) in
// the same run. Each variant is timed as a CUDA graph of --reps calls (no launch gaps), the
// weights rotating over enough copies (>= 512 MB) that L2 (50 MB) serves none of them; random
// codes and values. Columns: microseconds per call and weight bytes / time (GB/s). "-pdl"
// rows launch every kernel of the graph with programmatic dependent launch, as the decode step
// does (the GEMV's first weight loads then overlap the preceding kernel). Then the activation
// producers at m = 1 / 8 / 16 (hidden 4096, inter 14336): FusedAddRmsNorm or SiluAndMul +
// QuantizeActivations against the fused RmsNormQuantFp8 / SiluAndMulQuantFp8, with PDL.
//
//   fp8_gemv_cuda_bench [--reps=40] [--iters=20]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using Scheme = Fp8ActivationScheme;
constexpr int64_t kRotateBytes = int64_t{512} << 20;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// `copies` device copies of `bytes` random bytes (from `make`, one host draw).
std::vector<void*> RandomCopies(int64_t bytes, int copies, const std::function<uint8_t()>& make) {
  std::vector<uint8_t> host(bytes);
  for (uint8_t& b : host) b = make();
  std::vector<void*> out(copies);
  for (void*& p : out) {
    Check(cudaMalloc(&p, bytes), "cudaMalloc");
    Check(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
  }
  return out;
}

// Microseconds per call: `reps` calls of fn(i) captured in one graph, replayed `iters` times.
double TimeGraphUs(cudaStream_t s, int reps, int iters, const std::function<bool(int)>& fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  Check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  bool ok = true;
  for (int i = 0; i < reps; ++i) ok = fn(i) && ok;
  Check(cudaStreamEndCapture(s, &graph), "end capture");
  if (!ok) {
    cudaGraphDestroy(graph);
    return -1.0;
  }
  Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  Check(cudaGraphLaunch(exec, s), "warm-up");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, s);
  for (int i = 0; i < iters; ++i) cudaGraphLaunch(exec, s);
  cudaEventRecord(stop, s);
  Check(cudaEventSynchronize(stop), "run");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / (static_cast<double>(reps) * iters);
}

struct Shape {
  const char* name;
  int64_t n, k;
};

// The activation producers before the FP8 projections of a decode step, two kernels against
// the fused one (fp8_fused_quant_cuda.h), every launch with PDL, inputs in L2 as in a step.
int BenchFusedQuant(cudaStream_t s, int reps, int iters) {
  constexpr int64_t kHidden = 4096, kInter = 14336, kMaxM = 16;
  std::mt19937 rng(99);
  const auto bf16_byte = [&rng, byte = int64_t{0}]() mutable {
    return static_cast<uint8_t>(byte++ % 2 == 0 ? rng() : (rng() & 0x80) | 0x3f);
  };
  const std::vector<void*> buf = RandomCopies(2 * kMaxM * 2 * kInter, 4, bf16_byte);
  auto* x = static_cast<__nv_bfloat16*>(buf[0]);
  auto* res = static_cast<__nv_bfloat16*>(buf[1]);
  auto* gate_up = static_cast<__nv_bfloat16*>(buf[2]);
  auto* act = static_cast<__nv_bfloat16*>(buf[3]);
  const std::vector<void*> weight = RandomCopies(2 * kHidden, 1, bf16_byte);
  const auto* w = static_cast<const __nv_bfloat16*>(weight[0]);
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&codes), kMaxM * kInter), "codes");
  Check(cudaMalloc(reinterpret_cast<void**>(&scales), kMaxM * 4), "scales");
  const Fp8TokenCodes q{codes, scales};
  constexpr auto kToken = Scheme::kDynamicToken;
  std::printf("producer m variant us\n");
  for (int64_t m : {1, 8, 16}) {
    const auto report = [&](const char* name, double us) {
      std::printf("%s %ld %s %.2f\n", us < 0 ? "failed" : "producer", static_cast<long>(m), name,
                  us);
    };
    report("add-rmsnorm+quant", TimeGraphUs(s, reps, iters, [&](int) {
             return FusedAddRmsNorm<__nv_bfloat16>(x, res, w, m, kHidden, 1e-5f, s, true).ok() &&
                    QuantizeActivations(x, m, kHidden, kToken, 0.0f, codes, scales, s, true).ok();
           }));
    report("fused-add-rmsnorm-quant", TimeGraphUs(s, reps, iters, [&](int) {
             return RmsNormQuantFp8(x, res, w, m, kHidden, 1e-5f, x, q, s, true).ok();
           }));
    report("silu-and-mul+quant", TimeGraphUs(s, reps, iters, [&](int) {
             return SiluAndMul<__nv_bfloat16>(gate_up, m, kInter, act, s).ok() &&
                    QuantizeActivations(act, m, kInter, kToken, 0.0f, codes, scales, s, true).ok();
           }));
    report("fused-silu-and-mul-quant", TimeGraphUs(s, reps, iters, [&](int) {
             return SiluAndMulQuantFp8(gate_up, m, kInter, nullptr, q, s, true).ok();
           }));
  }
  Check(cudaDeviceSynchronize(), "producers");
  for (void* p : buf) cudaFree(p);
  cudaFree(weight[0]);
  cudaFree(codes);
  cudaFree(scales);
  return 0;
}

int Main(int argc, char** argv) {
  int reps = 40, iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::mt19937 rng(1234);
  // e4m3 codes with bit 3 clear (never NaN); bf16 values of modest size.
  const auto fp8_byte = [&] { return static_cast<uint8_t>(rng() & 0xF7); };
  const Shape shapes[] = {{"qkv_proj", 6144, 4096},
                          {"o_proj", 4096, 4096},
                          {"gate_up_proj", 28672, 4096},
                          {"down_proj", 4096, 14336}};
  std::printf("shape m variant us GB/s(weight bytes)\n");
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k, groups = (k + 127) / 128;
    const int copies8 = static_cast<int>((kRotateBytes + n * k - 1) / (n * k));
    const int copies16 = static_cast<int>((kRotateBytes + 2 * n * k - 1) / (2 * n * k));
    std::vector<void*> w8 = RandomCopies(n * k, copies8, fp8_byte);
    // bf16 bytes, low first: the low byte anything, the high one sign | `high`.
    int64_t byte = 0;
    const auto bf16_bytes = [&](uint8_t high) {
      return [&rng, &byte, high] {
        return static_cast<uint8_t>(byte++ % 2 == 0 ? rng() : (rng() & 0x80) | high);
      };
    };
    std::vector<void*> w16 = RandomCopies(2 * n * k, copies16, bf16_bytes(0x3c));  // ~2^-7
    const std::vector<void*> x = RandomCopies(2 * 16 * k, 1, bf16_bytes(0x3f));    // ~1
    float *w_scales = nullptr, *a_scales = nullptr;
    uint8_t* a_codes = nullptr;
    __nv_bfloat16* out = nullptr;
    Check(cudaMalloc(reinterpret_cast<void**>(&w_scales), n * groups * 4), "scales");
    Check(cudaMalloc(reinterpret_cast<void**>(&a_scales), 16 * groups * 4), "scales");
    Check(cudaMalloc(reinterpret_cast<void**>(&a_codes), 16 * k), "codes");
    Check(cudaMalloc(reinterpret_cast<void**>(&out), 2 * 16 * n), "out");
    std::vector<float> ones(n * groups, 1e-3f);
    Check(cudaMemcpy(w_scales, ones.data(), n * groups * 4, cudaMemcpyHostToDevice), "scales");
    const auto* xv = static_cast<const __nv_bfloat16*>(x[0]);
    for (int64_t m : {1, 8, 16}) {
      const auto report = [&](const char* variant, double us, int64_t bytes) {
        if (us < 0) {
          std::printf("%s %ld %s failed\n", sh.name, static_cast<long>(m), variant);
        } else {
          std::printf("%s %ld %s %.2f %.0f\n", sh.name, static_cast<long>(m), variant, us,
                      bytes / us / 1e3);
        }
      };
      // bf16: m <= 8 per call (kGemvMaxM); m = 16 as two calls.
      report(m <= kGemvMaxM ? "bf16-SmallMLinear" : "bf16-SmallMLinear(2x8)",
             TimeGraphUs(s, reps, iters,
                         [&](int i) {
                           const auto* w = static_cast<const __nv_bfloat16*>(w16[i % copies16]);
                           bool ok = true;
                           for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxM) {
                             const int64_t rows = m - r0 < kGemvMaxM ? m - r0 : kGemvMaxM;
                             ok = ok && SmallMLinear<__nv_bfloat16, __nv_bfloat16>(
                                            xv + r0 * k, w, nullptr, rows, n, k, out + r0 * n, s)
                                            .ok();
                           }
                           return ok;
                         }),
             2 * n * k);
      struct Variant {
        const char* name;
        Scheme scheme;
        int64_t block_cols;
        int form;  // 0: previous QuantizeActivations + Fp8Gemv; 1: codes ready (kernel
                   // alone); 2: QuantizeActivations + new kernel; 3: fused quantization;
                   // 4: as 1 and 5: as 2, launched with PDL; 6, 7: 4 and 5 with the
                   // weight loads issued after the PDL wait (early_weight_loads false)
      };
      const Variant variants[] = {
          {"old-quant+Fp8Gemv token-channel", Scheme::kDynamicToken, k, 0},
          {"new-kernel-only token-channel", Scheme::kDynamicToken, k, 1},
          {"new-quant+kernel token-channel", Scheme::kDynamicToken, k, 2},
          {"new-fused token-channel", Scheme::kDynamicToken, k, 3},
          {"new-fused static-tensor", Scheme::kStaticTensor, k, 3},
          {"new-kernel-only group128-block128", Scheme::kDynamicGroup128, 128, 1},
          {"new-fused group128-block128", Scheme::kDynamicGroup128, 128, 3},
          {"new w8a16-channel", Scheme::kNone, k, 3},
          {"new-kernel-only-pdl token-channel", Scheme::kDynamicToken, k, 4},
          {"new-quant+kernel-pdl token-channel", Scheme::kDynamicToken, k, 5},
          {"new-kernel-only-pdl-late-loads token-channel", Scheme::kDynamicToken, k, 6},
          {"new-quant+kernel-pdl-late-loads token-channel", Scheme::kDynamicToken, k, 7},
      };
      for (const Variant& v : variants) {
        const Scheme codes_scheme = v.scheme == Scheme::kNone ? Scheme::kDynamicToken : v.scheme;
        if (!QuantizeActivations(xv, m, k, codes_scheme, 0.05f, a_codes, a_scales, s).ok()) {
          std::printf("QuantizeActivations failed\n");
          return 1;
        }
        const double us = TimeGraphUs(s, reps, iters, [&](int i) {
          const Fp8DeviceWeight w{
              static_cast<const uint8_t*>(w8[i % copies8]), w_scales, {n, k, 1, v.block_cols}};
          if (v.form == 0) {
            Fp8DeviceActivations a{v.scheme, xv, a_codes, a_scales};
            return QuantizeActivations(xv, m, k, v.scheme, 0.05f, a_codes, a_scales, s).ok() &&
                   Fp8Gemv<__nv_bfloat16>(a, w, nullptr, m, out, s).ok();
          }
          Fp8SmallMActivations a;
          a.scheme = v.scheme;
          if (v.form == 3) {
            a.values = xv;
            a.static_scale = 0.05f;
          } else {
            a.codes = a_codes;
            a.scales = a_scales;
          }
          const bool pdl = v.form >= 4;
          if ((v.form == 2 || v.form == 5 || v.form == 7) &&
              !QuantizeActivations(xv, m, k, v.scheme, 0.05f, a_codes, a_scales, s, pdl).ok()) {
            return false;
          }
          return Fp8SmallMLinear<__nv_bfloat16>(a, w, nullptr, m, out, s, pdl, v.form < 6).ok();
        });
        report(v.name, us, n * k);
      }
    }
    Check(cudaDeviceSynchronize(), "shape");
    for (void* p : w8) cudaFree(p);
    for (void* p : w16) cudaFree(p);
    cudaFree(x[0]);
    for (void* p : {static_cast<void*>(w_scales), static_cast<void*>(a_scales),
                    static_cast<void*>(a_codes), static_cast<void*>(out)}) {
      cudaFree(p);
    }
  }
  return BenchFusedQuant(s, reps, iters);
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
