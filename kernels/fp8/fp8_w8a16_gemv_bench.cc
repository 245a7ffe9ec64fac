// fp8_gemv_cuda_bench's weight-only (W8A16) benches: --only=w8a16 / w8a16-grouped /
// w8a16-tokens (the comments below; entry points in fp8_gemv_bench_util.h).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemv_bench_util.h"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"

namespace tandem::kernels::cuda::fp8_bench {
namespace {

// --only=w8a16: batch 1 (m = 1) at the Llama-3-8B / 70B TP = 1 projections, every launch with
// PDL: the W8A8 kernel kAuto picks (codes ready) against the weight-only FP8 GEMV
// (fp8_w8a16_gemv_cuda.h; "w8a16" its fp32 inner loop, "w8a16-mma" the tensor-core one,
// "w8a16-ring" / "-ring2" / "-ringhalf" the tensor-core arithmetic fed by the shared-memory ring,
// "w8a16-deep" 16 loads in flight a lane, "w8a16-splitk" S CTAs a tile splitting k (S picked;
// "-splitk2" / "-splitk4" forced; the bench owns the workspace), "w8a16-persistent" the deep
// tiles on a persistent grid, the activations staged once a CTA)
// plain, with its first loads before the PDL wait ("-early"), and in the folded form the decode
// step runs (qkv: NormIn, o / down: AddTo, gate_up: NormInSiluMul), next to the bf16 SmallMLinear
// and its folded form. One line per (shape, variant): us and TB/s.
struct W8a16Proj {
  const char* model;
  const char* name;
  int64_t n, k;
  int fold;  // the decode step's folded form: 0 NormIn, 1 AddTo, 2 NormInSiluMul
};

// The Llama-3-8B / 70B TP = 1 projections, each with the form the decode step folds it in.
constexpr W8a16Proj kW8a16Projs[] = {
    {"8B", "qkv", 6144, 4096, 0},       {"8B", "o", 4096, 4096, 1},
    {"8B", "gate_up", 28672, 4096, 2},  {"8B", "down", 4096, 14336, 1},
    {"70B", "qkv", 10240, 8192, 0},     {"70B", "o", 8192, 8192, 1},
    {"70B", "gate_up", 57344, 8192, 2}, {"70B", "down", 8192, 28672, 1}};

// Which rows BenchW8a16 prints: the inner loops (name, math) and the bf16 / W8A8 references.
struct W8a16Math {
  std::string name;
  Fp8W16Math math;
  int splits;  // kTensorCoreSplitK: Fp8W16SplitKWorkspace::splits
};
struct W8a16Rows {
  std::vector<W8a16Math> maths;
  bool references = true;
};

W8a16Rows ParseW8a16Rows(const std::string& maths, bool references) {
  const W8a16Math known[] = {{"fp32", Fp8W16Math::kFp32Fma, 0},
                             {"mma", Fp8W16Math::kTensorCore, 0},
                             {"ring", Fp8W16Math::kRing, 0},
                             {"ring2", Fp8W16Math::kRing2, 0},
                             {"ringhalf", Fp8W16Math::kRingHalf, 0},
                             {"deep", Fp8W16Math::kTensorCoreDeep, 0},
                             {"splitk", Fp8W16Math::kTensorCoreSplitK, 0},
                             {"splitk2", Fp8W16Math::kTensorCoreSplitK, 2},
                             {"splitk4", Fp8W16Math::kTensorCoreSplitK, 4},
                             {"waves", Fp8W16Math::kAutoWaves, 0},
                             {"persistent", Fp8W16Math::kTensorCorePersistent, 0},
                             {"wide", Fp8W16Math::kTensorCoreWide, 0}};
  W8a16Rows rows;
  rows.references = references;
  for (const W8a16Math& m : known) {
    if (maths == "all" || ("," + maths + ",").find("," + m.name + ",") != std::string::npos) {
      rows.maths.push_back({m.name == "fp32" ? "w8a16" : "w8a16-" + m.name, m.math, m.splits});
    }
  }
  return rows;
}

void BenchW8a16Shape(cudaStream_t s, int reps, int iters, const W8a16Proj& pr,
                     const W8a16Rows& rows) {
  using bf16 = __nv_bfloat16;
  const int64_t n = pr.n, k = pr.k, copies8 = CopiesFor(n * k), copies16 = CopiesFor(2 * n * k);
  const std::vector<void*> w8 = PatternCopies(n * k, copies8, 0xF7);
  const std::vector<void*> w16 = PatternCopies(2 * n * k, copies16, 0x3F);
  const std::vector<void*> x = PatternCopies(2 * k, 1, 0x3F), norm = PatternCopies(2 * k, 1, 0x3F);
  const ShapeBuffers buf(n, k);
  const auto* xv = static_cast<const bf16*>(x[0]);
  const auto* nw = static_cast<const bf16*>(norm[0]);
  Fp8SmallMActivations codes;
  codes.scheme = Scheme::kDynamicToken;
  codes.codes = buf.a_codes;
  codes.scales = buf.a_scales;
  Check(QuantizeActivations(xv, 1, k, codes.scheme, 0.0f, buf.a_codes, buf.a_scales, s).ok()
            ? cudaSuccess
            : cudaErrorUnknown,
        "QuantizeActivations");
  const auto fp8w = [&](int i) {
    return Fp8DeviceWeight{
        static_cast<const uint8_t*>(w8[i % copies8]), buf.w_scales, {n, k, 1, k}};
  };
  const auto bf16w = [&](int i) { return static_cast<const bf16*>(w16[i % copies16]); };
  const auto row = [&](const char* variant, int64_t bytes,
                       const std::function<absl::Status(int)>& fn) {
    const double us = TimeGraphUs(s, reps, iters, [&](int i) { return fn(i).ok(); });
    std::printf("w8a16 %s %s %ld %ld %s ", pr.model, pr.name, static_cast<long>(n),
                static_cast<long>(k), variant);
    if (us < 0) {
      std::printf("failed\n");
    } else {
      std::printf("%.2f %.2f\n", us, bytes / us / 1e6);
    }
  };
  const float eps = 1e-5f;
  if (rows.references) {
    row("bf16", 2 * n * k, [&](int i) {
      return SmallMLinear<bf16, bf16>(xv, bf16w(i), nullptr, 1, n, k, buf.out, s, true);
    });
    row("bf16-folded", 2 * n * k, [&](int i) {
      if (pr.fold == 0) {
        return SmallMLinearNormIn<bf16>(xv, nw, eps, bf16w(i), nullptr, 1, n, k, buf.out, s, true);
      }
      if (pr.fold == 2) {
        return SmallMLinearNormInSiluMul<bf16>(xv, nw, eps, bf16w(i), nullptr, 1, n / 2, k, buf.out,
                                               s, true);
      }
      return SmallMLinearAddTo<bf16>(xv, bf16w(i), nullptr, 1, n, k, buf.out, s, true);
    });
    row("w8a8-auto", n * k,
        [&](int i) { return Fp8SmallMLinear<bf16>(codes, fp8w(i), nullptr, 1, buf.out, s, true); });
  }
  void* split_mem = nullptr;  // kTensorCoreSplitK's workspace, counters zero
  Check(cudaMalloc(&split_mem, Fp8W16SplitKWorkspaceBytes(n)), "split-k workspace");
  Check(cudaMemset(split_mem, 0, Fp8W16SplitKWorkspaceBytes(n)), "split-k workspace");
  for (const auto& [m, math, splits] : rows.maths) {
    const Fp8W16SplitKWorkspace ws = Fp8W16SplitKWorkspaceAt(split_mem, n, splits);
    const Fp8W16SplitKWorkspace* sk = &ws;
    for (const bool early : {false, true}) {
      const std::string e = early ? "-early" : "";
      row((m + e).c_str(), n * k, [&](int i) {
        return Fp8W16Gemv<bf16>(xv, fp8w(i), nullptr, 1, buf.out, s, true, early, math, sk);
      });
      row((m + "-folded" + e).c_str(), n * k, [&](int i) {
        if (pr.fold == 0) {
          return Fp8W16GemvNormIn(xv, nw, eps, fp8w(i), nullptr, 1, buf.out, s, true, early, math,
                                  sk);
        }
        if (pr.fold == 2) {
          return Fp8W16GemvNormInSiluMul(xv, nw, eps, fp8w(i), nullptr, 1, buf.out, s, true, early,
                                         math, sk);
        }
        return Fp8W16GemvAddTo(xv, fp8w(i), nullptr, 1, buf.out, s, true, early, math, sk);
      });
    }
  }
  Check(cudaDeviceSynchronize(), "shape");
  cudaFree(split_mem);
  for (const std::vector<void*>* v : {&w8, &w16, &x, &norm}) {
    for (void* p : *v) cudaFree(p);
  }
}

int BenchW8a16Rows(cudaStream_t s, int reps, int iters, const W8a16Rows& rows) {
  std::printf("w8a16 model shape n k variant us TB/s\n");
  for (const W8a16Proj& pr : kW8a16Projs) BenchW8a16Shape(s, reps, iters, pr, rows);
  return 0;
}

}  // namespace

int BenchW8a16(cudaStream_t s, int reps, int iters, const std::string& maths, bool references) {
  return BenchW8a16Rows(s, reps, iters, ParseW8a16Rows(maths, references));
}

// --only=w8a16-tokens: m = 2 / 4 / 8 tokens at the Llama-3-8B / 70B TP = 1 projections, every
// launch with PDL and early loads: "bf16" (SmallMLinear), "w8a8-quant" (QuantizeActivations per
// token + Fp8SmallMLinear, kAuto: the W8A8 path's two kernels), "w8a8-kernel" (the GEMV alone,
// codes ready), "w8a16-tokens" (Fp8W16Gemv's multi-token form) and "-folded" (its form in the
// step: qkv NormIn, o / down AddTo, gate_up NormInSiluMul). Shapes whose staging does not fit
// (70B down_proj past 4 tokens) print "unsupported". One line per (m, shape, variant): us, TB/s.
int BenchW8a16Tokens(cudaStream_t s, int reps, int iters) {
  using bf16 = __nv_bfloat16;
  std::printf("w8a16-tokens m model shape n k variant us TB/s\n");
  const float eps = 1e-5f;
  for (const int64_t m : {2, 4, 8}) {
    for (const W8a16Proj& pr : kW8a16Projs) {
      const int64_t n = pr.n, k = pr.k, copies8 = CopiesFor(n * k), copies16 = CopiesFor(2 * n * k);
      const std::vector<void*> w8 = PatternCopies(n * k, copies8, 0xF7);
      const std::vector<void*> w16 = PatternCopies(2 * n * k, copies16, 0x3F);
      const std::vector<void*> x = PatternCopies(2 * m * k, 1, 0x3F);
      const std::vector<void*> norm = PatternCopies(2 * k, 1, 0x3F);
      const ShapeBuffers buf(n, k);
      const auto* xv = static_cast<const bf16*>(x[0]);
      const auto* nw = static_cast<const bf16*>(norm[0]);
      Fp8SmallMActivations codes;
      codes.scheme = Scheme::kDynamicToken;
      codes.codes = buf.a_codes;
      codes.scales = buf.a_scales;
      const auto fp8w = [&](int i) {
        return Fp8DeviceWeight{
            static_cast<const uint8_t*>(w8[i % copies8]), buf.w_scales, {n, k, 1, k}};
      };
      const auto row = [&](const char* variant, int64_t bytes,
                           const std::function<absl::Status(int)>& fn) {
        std::printf("w8a16-tokens %ld %s %s %ld %ld %s ", static_cast<long>(m), pr.model, pr.name,
                    static_cast<long>(n), static_cast<long>(k), variant);
        if (std::string(variant).find("w8a16") == 0 && !Fp8W16GemvSupported(xv, fp8w(0), m)) {
          std::printf("unsupported\n");
          return;
        }
        const double us = TimeGraphUs(s, reps, iters, [&](int i) { return fn(i).ok(); });
        if (us < 0) {
          std::printf("failed\n");
        } else {
          std::printf("%.2f %.2f\n", us, bytes / us / 1e6);
        }
      };
      row("bf16", 2 * n * k, [&](int i) {
        return SmallMLinear<bf16, bf16>(xv, static_cast<const bf16*>(w16[i % copies16]), nullptr, m,
                                        n, k, buf.out, s, true);
      });
      row("w8a8-quant", n * k, [&](int i) {
        const absl::Status q =
            QuantizeActivations(xv, m, k, codes.scheme, 0.0f, buf.a_codes, buf.a_scales, s);
        if (!q.ok()) return q;
        return Fp8SmallMLinear<bf16>(codes, fp8w(i), nullptr, m, buf.out, s, true);
      });
      row("w8a8-kernel", n * k, [&](int i) {
        return Fp8SmallMLinear<bf16>(codes, fp8w(i), nullptr, m, buf.out, s, true);
      });
      row("w8a16-tokens", n * k,
          [&](int i) { return Fp8W16Gemv<bf16>(xv, fp8w(i), nullptr, m, buf.out, s, true, true); });
      row("w8a16-tokens-folded", n * k, [&](int i) {
        if (pr.fold == 0)
          return Fp8W16GemvNormIn(xv, nw, eps, fp8w(i), nullptr, m, buf.out, s, true, true);
        if (pr.fold == 2) {
          return Fp8W16GemvNormInSiluMul(xv, nw, eps, fp8w(i), nullptr, m, buf.out, s, true, true);
        }
        return Fp8W16GemvAddTo(xv, fp8w(i), nullptr, m, buf.out, s, true, true);
      });
      Check(cudaDeviceSynchronize(), "shape");
      for (const std::vector<void*>* v : {&w8, &w16, &x, &norm}) {
        for (void* p : *v) cudaFree(p);
      }
    }
  }
  return 0;
}

// --only=w8a16-grouped: one line per (shape, variant): "w8a8-block128" (QuantizeActivations
// 1 x 128 + Fp8SmallMLinear on the codes, kAuto: CudaFp8Linear's batch 1 before the W8A16 GEMV),
// "w8a8-kernel" (the GEMV alone, codes ready), "w8a16-grouped" (Fp8W16Gemv kAuto, what
// CudaFp8Linear runs now), "-mma" / "-fp32" (its inner loops), "bf16" (SmallMLinear); all with
// PDL and early weight loads, weights rotated past L2 (a graph of at least min(copies, 512)
// calls).
int BenchW8a16Grouped(cudaStream_t s, int reps, int iters) {
  using bf16 = __nv_bfloat16;
  const Shape shapes[] = {{"qwen3-30b-a3b.qkv", 5120, 2048},
                          {"qwen3-30b-a3b.o", 2048, 4096},
                          {"v2-lite.q", 3072, 2048},
                          {"v2-lite.kv_a_c", 512, 2048},
                          {"v2-lite.kv_a_pe", 64, 2048},
                          {"v2-lite.o", 2048, 2048},
                          {"v2-lite.gate_up", 21888, 2048},
                          {"v2-lite.down", 2048, 10944},
                          {"v2-lite.shared_gate_up", 5632, 2048},
                          {"v2-lite.shared_down", 2048, 2816},
                          {"v3.q_a", 1536, 7168},
                          {"v3.q_b", 24576, 1536},
                          {"v3.kv_a_c", 512, 7168},
                          {"v3.kv_a_pe", 64, 7168},
                          {"v3.o", 7168, 16384},
                          {"v3.gate_up", 36864, 7168},
                          {"v3.down", 7168, 18432},
                          {"v3.shared_gate_up", 4096, 7168},
                          {"v3.shared_down", 7168, 2048}};
  std::printf("w8a16-grouped shape n k variant us TB/s\n");
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k, copies8 = CopiesFor(n * k), copies16 = CopiesFor(2 * n * k);
    const std::vector<void*> w8 = PatternCopies(n * k, copies8, 0xF7);
    const std::vector<void*> w16 = PatternCopies(2 * n * k, copies16, 0x3F);
    const std::vector<void*> x = PatternCopies(2 * k, 1, 0x3F);
    const ShapeBuffers buf(n, k);
    const auto* xv = static_cast<const bf16*>(x[0]);
    const auto fp8w = [&](int i) {
      return Fp8DeviceWeight{
          static_cast<const uint8_t*>(w8[i % copies8]), buf.w_scales, {n, k, 1, 128}};
    };
    Fp8SmallMActivations codes;
    codes.scheme = Scheme::kDynamicGroup128;
    codes.codes = buf.a_codes;
    codes.scales = buf.a_scales;
    // Enough calls a graph that the rotated weights pass L2 (small shapes: up to 512 copies).
    const int calls = static_cast<int>(std::max<int64_t>(reps, std::min<int64_t>(copies8, 512)));
    const auto row = [&](const char* variant, int64_t bytes, const std::function<bool(int)>& fn) {
      const double us = TimeGraphUs(s, calls, iters, fn);
      std::printf("w8a16-grouped %s %ld %ld %s ", sh.name, static_cast<long>(n),
                  static_cast<long>(k), variant);
      us < 0 ? std::printf("failed\n") : std::printf("%.2f %.2f\n", us, bytes / us / 1e6);
    };
    row("w8a8-block128", n * k, [&](int i) {
      return QuantizeActivations(xv, 1, k, codes.scheme, 0.0f, buf.a_codes, buf.a_scales, s, true)
                 .ok() &&
             Fp8SmallMLinear<bf16>(codes, fp8w(i), nullptr, 1, buf.out, s, true).ok();
    });
    row("w8a8-kernel", n * k, [&](int i) {
      return Fp8SmallMLinear<bf16>(codes, fp8w(i), nullptr, 1, buf.out, s, true).ok();
    });
    for (const auto& [name, math] : {std::pair{"w8a16-grouped", Fp8W16Math::kAuto},
                                     std::pair{"w8a16-grouped-mma", Fp8W16Math::kTensorCore},
                                     std::pair{"w8a16-grouped-fp32", Fp8W16Math::kFp32Fma}}) {
      row(name, n * k, [&](int i) {
        return Fp8W16Gemv<bf16>(xv, fp8w(i), nullptr, 1, buf.out, s, true, true, math).ok();
      });
    }
    row("bf16", 2 * n * k, [&](int i) {
      return SmallMLinear<bf16, bf16>(xv, static_cast<const bf16*>(w16[i % copies16]), nullptr, 1,
                                      n, k, buf.out, s, true)
          .ok();
    });
    Check(cudaDeviceSynchronize(), "shape");
    for (const std::vector<void*>* v : {&w8, &w16, &x}) {
      for (void* p : *v) cudaFree(p);
    }
  }
  return 0;
}

}  // namespace tandem::kernels::cuda::fp8_bench
