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
// --only=sweep: the register-load ("old"), streaming ("new") and pipelined ("pipe", m <= 8)
// kernels at every Llama-3-8B / 70B projection and TP = 1 / 2 / 4 slice (BenchSweep);
// --only=detail: the 8B table above and the producers; --only=producers: the producers alone;
// --only=w8a16: batch 1, the weight-only FP8 GEMV and its folded forms against W8A8 and bf16
// (BenchW8a16; --w8a16_math=fp32,mma,ring,ring2,ringhalf,deep,splitk,splitk2,splitk4,waves,
// persistent,wide picks its inner loops, the default all; splitk: S picked per shape, splitk2 / 4:
// S forced;
// --w8a16_ref=0 leaves out the bf16 and W8A8 rows); --only=w8a16-grouped: batch 1 at the
// Qwen3-30B-A3B / DeepSeek-V2-Lite / V3 dense FP8 projections (128 x 128 weight blocks, scales
// per row and 128 columns), QuantizeActivations (1 x 128) + the W8A8 GEMV as CudaFp8Linear ran
// them before, against the grouped W8A16 GEMV (BenchW8a16Grouped); default: sweep, detail and
// producers.
//
//   fp8_gemv_cuda_bench [--reps=40] [--iters=20]
//                       [--only=sweep|detail|producers|w8a16|w8a16-grouped|w8a16-tokens|all]
//                       [--w8a16_math=...] [--w8a16_ref=0|1]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_fused_quant_cuda.h"
#include "kernels/fp8/fp8_gemv_bench_util.h"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using namespace fp8_bench;  // NOLINT(build/namespaces): the bench's shared pieces

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

// BenchSweep's variants: the kernel, 128-column weight blocks with 1 x 128 activation groups
// (else per-channel with per-token activations), PDL.
struct SweepVariant {
  const char* name;
  Fp8GemvKernel kernel;
  bool blocks, pdl;
};
constexpr SweepVariant kSweepVariants[] = {
    {"old-channel", Fp8GemvKernel::kRegisterLoads, false, false},
    {"new-channel", Fp8GemvKernel::kStreaming, false, false},
    {"old-channel-pdl", Fp8GemvKernel::kRegisterLoads, false, true},
    {"new-channel-pdl", Fp8GemvKernel::kStreaming, false, true},
    {"old-block128-pdl", Fp8GemvKernel::kRegisterLoads, true, true},
    {"new-block128-pdl", Fp8GemvKernel::kStreaming, true, true},
    {"pipe-channel", Fp8GemvKernel::kPipelined, false, false},
    {"pipe-channel-pdl", Fp8GemvKernel::kPipelined, false, true}};

// One projection of BenchSweep: every m and variant (and bf16 when `bf16`).
void SweepShape(cudaStream_t s, int reps, int iters, const char* prefix, int64_t n, int64_t k,
                bool bf16) {
  const int copies8 = CopiesFor(n * k);
  const std::vector<void*> w8 = PatternCopies(n * k, copies8, 0xF7);
  std::vector<void*> w16;
  if (bf16) w16 = PatternCopies(2 * n * k, CopiesFor(2 * n * k), 0x3F);
  const std::vector<void*> x = PatternCopies(2 * 16 * k, 1, 0x3F);
  const ShapeBuffers buf(n, k);
  const auto* xv = static_cast<const __nv_bfloat16*>(x[0]);
  for (int64_t m : {1, 8, 16}) {
    const auto report = [&](const char* variant, double us, int64_t bytes) {
      std::printf("%s %ld %ld %ld %s ", prefix, static_cast<long>(n), static_cast<long>(k),
                  static_cast<long>(m), variant);
      if (us < 0) {
        std::printf("failed\n");
      } else {
        std::printf("%.2f %.2f\n", us, bytes / us / 1e6);
      }
    };
    if (bf16) {
      report(m <= kGemvMaxM ? "bf16-pdl" : "bf16-pdl(2x8)",
             TimeGraphUs(s, reps, iters,
                         [&](int i) {
                           const auto* w = static_cast<const __nv_bfloat16*>(w16[i % w16.size()]);
                           bool ok = true;
                           for (int64_t r0 = 0; r0 < m; r0 += kGemvMaxM) {
                             const int64_t rows = std::min<int64_t>(m - r0, kGemvMaxM);
                             ok = ok && SmallMLinear<__nv_bfloat16, __nv_bfloat16>(
                                            xv + r0 * k, w, nullptr, rows, n, k, buf.out + r0 * n,
                                            s, true)
                                            .ok();
                           }
                           return ok;
                         }),
             2 * n * k);
    }
    for (const SweepVariant& v : kSweepVariants) {
      // The pipelined kernel runs m <= 8 (above it, the register kernel's rows again).
      if (v.kernel == Fp8GemvKernel::kPipelined && m > 8) continue;
      const Scheme scheme = v.blocks ? Scheme::kDynamicGroup128 : Scheme::kDynamicToken;
      Check(QuantizeActivations(xv, m, k, scheme, 0.0f, buf.a_codes, buf.a_scales, s).ok()
                ? cudaSuccess
                : cudaErrorUnknown,
            "QuantizeActivations");
      Fp8SmallMActivations a;
      a.scheme = scheme;
      a.codes = buf.a_codes;
      a.scales = buf.a_scales;
      report(v.name,
             TimeGraphUs(s, reps, iters,
                         [&](int i) {
                           const Fp8DeviceWeight w{static_cast<const uint8_t*>(w8[i % copies8]),
                                                   buf.w_scales,
                                                   {n, k, 1, v.blocks ? 128 : k}};
                           return Fp8SmallMLinear<__nv_bfloat16>(a, w, nullptr, m, buf.out, s,
                                                                 v.pdl, true, v.kernel)
                               .ok();
                         }),
             n * k);
    }
  }
  Check(cudaDeviceSynchronize(), "shape");
  for (void* p : w8) cudaFree(p);
  for (void* p : w16) cudaFree(p);
  cudaFree(x[0]);
}

// --only=sweep: the register-load kernel ("old") against the streaming ("new") and pipelined
// ("pipe", m <= 8) kernels at every Llama-3-8B / 70B decode projection, TP = 1 / 2 / 4 slices (qkv
// and gate_up split n, o and down split k), m = 1 / 8 / 16, codes ready; the bf16 SmallMLinear
// beside them at TP = 1. One line per (shape, m, variant): us and weight TB/s.
int BenchSweep(cudaStream_t s, int reps, int iters) {
  struct Model {
    const char* name;
    int64_t hidden, qkv, inter;  // qkv: q + k + v output width at TP = 1
  };
  const Model models[] = {{"8B", 4096, 6144, 14336}, {"70B", 8192, 10240, 28672}};
  std::printf("sweep model tp shape n k m variant us TB/s\n");
  for (const Model& md : models) {
    for (int64_t tp : {1, 2, 4}) {
      const Shape shapes[] = {{"qkv", md.qkv / tp, md.hidden},
                              {"o", md.hidden, md.hidden / tp},
                              {"gate_up", 2 * md.inter / tp, md.hidden},
                              {"down", md.hidden, md.inter / tp}};
      for (const Shape& sh : shapes) {
        char prefix[64];
        std::snprintf(prefix, sizeof(prefix), "sweep %s %ld %s", md.name, static_cast<long>(tp),
                      sh.name);
        SweepShape(s, reps, iters, prefix, sh.n, sh.k, tp == 1);
      }
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  int reps = 40, iters = 20;
  std::string only = "all", w8a16_math = "all";
  bool w8a16_ref = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--w8a16_math=", 13) == 0) w8a16_math = argv[i] + 13;
    if (std::strncmp(argv[i], "--w8a16_ref=", 12) == 0) w8a16_ref = std::atoi(argv[i] + 12) != 0;
    if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
  }
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  if (only == "sweep" || only == "all") {
    if (const int rc = BenchSweep(s, reps, iters); rc != 0 || only == "sweep") return rc;
  }
  if (only == "producers") return BenchFusedQuant(s, reps, iters);
  if (only == "w8a16") return BenchW8a16(s, reps, iters, w8a16_math, w8a16_ref);
  if (only == "w8a16-grouped") return BenchW8a16Grouped(s, reps, iters);
  if (only == "w8a16-tokens") return BenchW8a16Tokens(s, reps, iters);
  std::mt19937 rng(1234);
  // e4m3 codes with bit 3 clear (never NaN); bf16 values of modest size.
  const auto fp8_byte = [&] { return static_cast<uint8_t>(rng() & 0xF7); };
  const Shape shapes[] = {{"qkv_proj", 6144, 4096},
                          {"o_proj", 4096, 4096},
                          {"gate_up_proj", 28672, 4096},
                          {"down_proj", 4096, 14336}};
  std::printf("shape m variant us GB/s(weight bytes)\n");
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k;
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
    const ShapeBuffers buf(n, k);
    float* w_scales = buf.w_scales;
    float* a_scales = buf.a_scales;
    uint8_t* a_codes = buf.a_codes;
    __nv_bfloat16* out = buf.out;
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
  }
  return BenchFusedQuant(s, reps, iters);
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
