// FP8 kernels at Llama-3 shapes (issue 38 item 5), each next to its bf16 counterpart in the
// same run:
//   * decode GEMV (Llama-3-8B, m = 1 / 8 / 16): Fp8Gemv (activation quantization included) vs
//     the bf16 SmallMLinear: microseconds, weight GB/s, speedup;
//   * prefill GEMM (Llama-3-8B and -70B, M = 1k / 4k / 16k; --only=gemm): CublasLtFp8Gemm
//     per-tensor, token x channel and block-scaled (cuBLASLt) vs the bf16 CublasLtGemm, each
//     with cuBLASLt's first heuristic algorithm and tuned (set_autotune_max_m): TFLOP/s, ratios
//     (kernels/fp8/fp8_gemm_tune_call.sh puts torch._scaled_mm beside them);
//   * block-scaled prefill GEMM (Llama-3-8B and DeepSeek-V3 shapes, M = 2k / 8k): CublasLtFp8Gemm
//     kBlock128 (1x128 activation groups, 128x128 weight blocks) on cuBLASLt and on our wgmma
//     kernel (staged and direct scales), and on CUTLASS's sm90 kernel (kernels/fp8/cutlass/,
//     where built) vs per-tensor FP8 and bf16;
//   * --probe_accumulation: one FP8 GEMM whose exact sum needs more than 13 fraction bits below
//     its largest product (448 + 31 x 2^-6): what Hopper's FP8 MMA accumulation keeps.
//
//   fp8_cuda_bench [--iters=200] [--gemm_iters=20] [--only=all|gemm|block|probe]
//                  [--cutlass_configs=all] (block rows: one column per CUTLASS configuration)
//                  [--block_ms=2048,8192] (block rows' m: multiples of 4, e.g. expert sizes)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/graph_timing.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_block_gemm_cuda.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
#include "kernels/fp8/fp8_gemm_kernels.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#ifdef TANDEM_CUTLASS_ENABLED  // kernels/fp8/cutlass/ is built only where CUTLASS's headers are
#include "kernels/fp8/cutlass/cutlass_block_gemm.h"
#endif

namespace tandem::kernels::cuda {
namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

// Mean microseconds of `fn` over `iters` launches (after 10 warm-up ones).
double TimeUs(int iters, const std::function<void()>& fn) { return EventTimeUs(iters, fn); }

template <typename T>
T* DeviceFill(size_t count, uint8_t byte) {
  T* p = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T)) != cudaSuccess) std::abort();
  cudaMemset(p, byte, count * sizeof(T));
  return p;
}

// Random GEMM operands, made once at the largest shape and reused (a shape uses their first
// elements): e4m3 codes of N(0, 1) values and bf16 N(0, 1) (fixed seeds), as
// scaled_mm_bench.py's torch operands; constant data can run faster than real data.
struct GemmOperands {
  uint8_t *w8 = nullptr, *a8 = nullptr;
  __nv_bfloat16 *w16 = nullptr, *a16 = nullptr, *out = nullptr;
  float* scales = nullptr;

  bool Make(int64_t w_elems, int64_t a_elems, int64_t out_elems, int64_t scale_elems) {
    w8 = DeviceFill<uint8_t>(w_elems, 0);
    a8 = DeviceFill<uint8_t>(a_elems, 0);
    w16 = DeviceFill<__nv_bfloat16>(w_elems, 0);
    a16 = DeviceFill<__nv_bfloat16>(a_elems, 0);
    out = DeviceFill<__nv_bfloat16>(out_elems, 0);
    scales = DeviceFill<float>(scale_elems, 0x3c);
    std::vector<uint8_t> codes(int64_t{16} << 20);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (uint8_t& c : codes) c = FloatToFp8E4m3(dist(rng));
    const int64_t chunk = static_cast<int64_t>(codes.size());
    return FillReplicated(w8, w_elems, codes.data(), chunk).ok() &&
           FillReplicated(a8, a_elems, codes.data() + 4096, chunk - 4096).ok() &&
           FillRandomBf16(w16, 2 * w_elems).ok() && FillRandomBf16(a16, 2 * a_elems).ok();
  }
  ~GemmOperands() {
    for (void* p : {static_cast<void*>(w8), static_cast<void*>(a8), static_cast<void*>(w16),
                    static_cast<void*>(a16), static_cast<void*>(out), static_cast<void*>(scales)}) {
      cudaFree(p);
    }
  }
};

// One prefill row's products, each with cuBLASLt's first heuristic algorithm and with the
// fastest of its top candidates (timed on the first call of the tuned objects): microseconds, 0
// where the product does not run (the reason printed).
struct GemmPair {
  CublasLtFp8Gemm *fp8_first, *fp8_tuned;
  CublasLtGemm *bf16_first, *bf16_tuned;
  const GemmOperands* ops;
  const float* block_a_scales;  // [groups, m]: cuBLASLt's VEC128 layout
  int iters;

  double Bf16(CublasLtGemm& gemm, int64_t m, const Shape& s) const {
    const auto run = [&] {
      return gemm.Linear<__nv_bfloat16, __nv_bfloat16>(ops->a16, ops->w16, nullptr, m, s.n, s.k,
                                                       ops->out, nullptr);
    };
    const absl::Status st = run();  // the plan (and, tuned, the timing of its candidates)
    if (!st.ok()) {
      std::printf("%s M=%ld bf16: %s\n", s.name, static_cast<long>(m), st.ToString().c_str());
      return 0.0;
    }
    return TimeUs(iters, [&] { (void)run(); });
  }
  double Fp8(CublasLtFp8Gemm& gemm, Fp8GemmScaling scaling, int64_t m, const Shape& s) const {
    const float* a_scales = scaling == Fp8GemmScaling::kBlock128 ? block_a_scales : ops->scales;
    const auto run = [&] {
      return gemm.Linear(ops->a8, a_scales, ops->w8, ops->scales, scaling, m, s.n, s.k, ops->out,
                         nullptr);
    };
    const absl::Status st = run();
    if (!st.ok()) {
      std::printf("%s M=%ld: %s\n", s.name, static_cast<long>(m), st.ToString().c_str());
      return 0.0;
    }
    return TimeUs(iters, [&] { (void)run(); });
  }
};

// Per-tensor, token x channel and block-scaled FP8 (cuBLASLt; the block columns time the GEMM
// alone, its scales already in cuBLASLt's layout) next to bf16, each as "first" (cuBLASLt's
// first heuristic algorithm, what the runtime runs by default) and "tuned" (the fastest of its
// top 8, timed once per shape: set_autotune_max_m(kAutotuneAllM)), on random operands.
int BenchGemm(int iters) {
  auto fp8_first = CublasLtFp8Gemm::Create();
  auto fp8_tuned = CublasLtFp8Gemm::Create();
  auto bf16_first = CublasLtGemm::Create();
  auto bf16_tuned = CublasLtGemm::Create();
  if (!fp8_first.ok() || !fp8_tuned.ok() || !bf16_first.ok() || !bf16_tuned.ok() ||
      !(*fp8_first)->set_block_kernel(Fp8BlockGemmKernel::kCublasLt).ok() ||
      !(*fp8_tuned)->set_block_kernel(Fp8BlockGemmKernel::kCublasLt).ok()) {
    std::printf("cannot create cuBLASLt handles\n");
    return 1;
  }
  (*fp8_tuned)->set_autotune_max_m(kAutotuneAllM);
  (*bf16_tuned)->set_autotune_max_m(kAutotuneAllM);
  const Shape shapes[] = {{"8b.qkv_proj", 6144, 4096},       {"8b.o_proj", 4096, 4096},
                          {"8b.gate_up_proj", 28672, 4096},  {"8b.down_proj", 4096, 14336},
                          {"70b.qkv_proj", 10240, 8192},     {"70b.o_proj", 8192, 8192},
                          {"70b.gate_up_proj", 57344, 8192}, {"70b.down_proj", 8192, 28672}};
  const int64_t max_m = 16384;
  int64_t max_w = 0, max_k = 0, max_n = 0;
  for (const Shape& s : shapes) {
    max_w = std::max(max_w, s.n * s.k);
    max_k = std::max(max_k, s.k);
    max_n = std::max(max_n, s.n);
  }
  // One scale buffer for every mode: per-tensor reads one, token x channel m and n, block
  // [groups, m] (activations) and [n / 128, ld] (weights).
  GemmOperands ops;
  if (!ops.Make(max_w, max_m * max_k, max_m * max_n,
                std::max(max_n, max_m * Block128WeightScaleLd(max_k)))) {
    std::printf("cannot fill the operands\n");
    return 1;
  }
  const GemmPair pair{&**fp8_first, &**fp8_tuned, &**bf16_first, &**bf16_tuned,
                      &ops,         ops.scales,   iters};
  std::printf(
      "fp8 token x channel path: %s; random operands; first = cuBLASLt's first heuristic "
      "algorithm, tuned = the fastest of its top %d timed once per shape\n",
      (*fp8_first)->outer_vector_scales() ? "cuBLASLt outer-vector scales"
                                          : "unit-scaled fp32 product + epilogue",
      kCublasLtTuneCandidates);
  std::printf(
      "shape M bf16_first bf16_tuned tensor_first tensor_tuned channel_first channel_tuned "
      "block_first block_tuned (TFLOP/s) | tuned/first: bf16 tensor channel block | "
      "tensor_tuned/bf16_tuned block_tuned/tensor_tuned\n");
  for (const Shape& s : shapes) {
    for (int64_t m : {1024, 4096, 16384}) {
      double us[8] = {pair.Bf16(*pair.bf16_first, m, s), pair.Bf16(*pair.bf16_tuned, m, s)};
      int col = 2;
      for (Fp8GemmScaling scaling :
           {Fp8GemmScaling::kTensor, Fp8GemmScaling::kTokenChannel, Fp8GemmScaling::kBlock128}) {
        us[col++] = pair.Fp8(*pair.fp8_first, scaling, m, s);
        us[col++] = pair.Fp8(*pair.fp8_tuned, scaling, m, s);
      }
      const double flops = 2.0 * m * s.n * s.k;
      auto tflops = [&](double t) { return t > 0 ? flops / t / 1e6 : 0.0; };
      auto speedup = [&](int slow, int fast) {  // us[slow] / us[fast]
        return us[slow] > 0 && us[fast] > 0 ? us[slow] / us[fast] : 0.0;
      };
      std::printf("%s %ld", s.name, static_cast<long>(m));
      for (double t : us) std::printf(" %.0f", tflops(t));
      std::printf(" | %.3f %.3f %.3f %.3f | %.3f %.3f\n", speedup(0, 1), speedup(2, 3),
                  speedup(4, 5), speedup(6, 7), speedup(1, 3), speedup(3, 7));
    }
  }
  std::printf("plans timed: fp8 %ld (of %zu), bf16 %zu plans\n",
              static_cast<long>((*fp8_tuned)->num_tuned_plans()), (*fp8_tuned)->num_cached_plans(),
              (*bf16_tuned)->num_cached_plans());
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}

// "name: min .. max, geomean g, N of M rows >= target" for a column of ratios.
void PrintRatioSummary(const char* name, const std::vector<double>& ratios, double target) {
  if (ratios.empty()) return;
  double log_sum = 0;
  int meeting = 0;
  for (double r : ratios) {
    log_sum += std::log(r);
    meeting += r >= target ? 1 : 0;
  }
  std::printf("%s: %.3f .. %.3f, geomean %.3f, %d of %zu rows >= %.2f\n", name,
              *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()),
              std::exp(log_sum / static_cast<double>(ratios.size())), meeting, ratios.size(),
              target);
}

// One block-scaled product's buffers in the block table (cuBLASLt's layouts).
// The CUTLASS configurations (kCutlassBlockTiles) by index: count 0 where not built.
#ifdef TANDEM_CUTLASS_ENABLED
int CutlassConfigCount() { return static_cast<int>(std::size(kCutlassBlockTiles)); }
const char* CutlassConfigName(int c) { return CutlassBlockTileName(kCutlassBlockTiles[c]); }
#else
int CutlassConfigCount() { return 0; }
const char* CutlassConfigName(int) { return ""; }
#endif
int CutlassConfigIndex(const char* name) {
  for (int c = 0; c < CutlassConfigCount(); ++c) {
    if (std::strcmp(CutlassConfigName(c), name) == 0) return c;
  }
  return -1;
}

struct BlockOperands {
  const uint8_t* a8;
  const float* a_scales;  // [m, groups]: QuantizeActivations' layout
  float* a_scales_t;      // [groups, m]: what the GEMMs read, written by TransposeGroupScales
  const uint8_t* w8;
  const float* w_scales;  // [ceil(n / 128), Block128WeightScaleLd(k)]
  int64_t m, n, k;
  __nv_bfloat16* out;
};

// CutlassFp8BlockGemm (kernels/fp8/cutlass/) on `op` with TransposeGroupScales timed with it, as
// the other block columns: microseconds; 0 where it does not run (the reason printed) or is not
// built (no CUTLASS headers: printed once by the caller). tile: a forced configuration index
// into kCutlassBlockTiles, or -1 for kAuto (128 x 128 cooperative at these m).
double TimeCutlassBlock(int iters, const BlockOperands& op, int tile, const char* row) {
#ifdef TANDEM_CUTLASS_ENABLED
  CutlassFp8BlockGemmArgs args{
      op.a8, op.a_scales_t, op.w8, op.w_scales, Block128WeightScaleLd(op.k),
      op.m,  op.n,          op.k,  op.out};
  args.tile = tile < 0 ? CutlassBlockTile::kAuto : kCutlassBlockTiles[tile];
  absl::StatusOr<size_t> bytes = CutlassFp8BlockGemmWorkspaceBytes(args);
  absl::Status st = bytes.ok() ? CutlassFp8BlockGemmInit() : bytes.status();
  void* workspace = nullptr;
  if (st.ok() && *bytes > 0 && cudaMalloc(&workspace, *bytes) != cudaSuccess) {
    st = absl::ResourceExhaustedError("workspace");
  }
  if (st.ok()) st = CutlassFp8BlockGemm(args, workspace, *bytes, nullptr);
  double us = 0;
  if (st.ok()) {
    const int64_t groups = Block128Groups(op.k);
    us = TimeUs(iters, [&] {
      (void)TransposeGroupScales(op.a_scales, op.m, groups, op.a_scales_t, nullptr);
      (void)CutlassFp8BlockGemm(args, workspace, *bytes, nullptr);
    });
  } else {
    std::printf("%s cutlass_%s: %s\n", row, CutlassBlockTileName(args.tile), st.ToString().c_str());
  }
  cudaFree(workspace);
  return us;
#else
  (void)iters, (void)op, (void)tile, (void)row;
  return 0;
#endif
}

// --cutlass_configs=all: a TFLOP/s column per CUTLASS configuration (tc: kAuto's time, its
// coop128 at these m; tc64: pp64's), then the fastest one's name and its ratio to per-tensor
// (tt). Returns the fastest time (0 where none ran).
double PrintEveryCutlassConfig(int iters, const BlockOperands& op, double tc, double tc64,
                               double flops, double tt, const char* row) {
  double best = 0;
  int best_c = -1;
  for (int c = 0; c < CutlassConfigCount(); ++c) {
    double t = 0;
    if (std::strcmp(CutlassConfigName(c), "pp64") == 0) {
      t = tc64;
    } else if (tc > 0 && op.m > 64 && std::strcmp(CutlassConfigName(c), "coop128") == 0) {
      t = tc;
    } else {
      t = TimeCutlassBlock(iters, op, c, row);
    }
    std::printf(" %.0f", t > 0 ? flops / t / 1e6 : 0.0);
    if (t > 0 && (best <= 0 || t < best)) best = t, best_c = c;
  }
  std::printf(" %s %.2f", best_c < 0 ? "none" : CutlassConfigName(best_c),
              best > 0 && tt > 0 ? tt / best : 0.0);
  return best;
}

// Block-scaled FP8 GEMM (kBlock128) next to per-tensor FP8 and bf16 on the same shapes: on
// cuBLASLt, then on the wgmma kernel with staged and with direct scales and with the multicast
// form (0 where it does not run), then on its overlapped forms (Fp8BlockOverlap k128 / k192,
// called directly; `auto_n` = the tile width kAuto picks; ovl_best = the fastest of k128, k192
// and k192Serial, the last column). Every block path's activation-scale
// transpose (TransposeGroupScales) is timed with it. TANDEM_FP8_BENCH_BLOCK_ROW="shape M" (e.g.
// "v3.gate_up_proj 8192") times that row alone (for ncu). all_cutlass: after those columns one
// per CUTLASS configuration, then the fastest one's name and its ratio to per-tensor.
int BenchBlockGemm(int iters, bool all_cutlass, const std::vector<int64_t>& ms) {
  const char* only_row = std::getenv("TANDEM_FP8_BENCH_BLOCK_ROW");
  auto fp8 = CublasLtFp8Gemm::Create();
  auto bf16 = CublasLtGemm::Create();
  if (!fp8.ok() || !bf16.ok()) {
    std::printf("cannot create cuBLASLt handles\n");
    return 1;
  }
  // DeepSeek-V3: q_b_proj, o_proj, the dense layers' gate_up / down, an expert's gate_up / down.
  const Shape shapes[] = {{"8b.qkv_proj", 6144, 4096},       {"8b.o_proj", 4096, 4096},
                          {"8b.gate_up_proj", 28672, 4096},  {"8b.down_proj", 4096, 14336},
                          {"v3.q_b_proj", 24576, 1536},      {"v3.o_proj", 7168, 16384},
                          {"v3.gate_up_proj", 36864, 7168},  {"v3.down_proj", 7168, 18432},
                          {"v3.expert_gate_up", 4096, 7168}, {"v3.expert_down", 7168, 2048}};
  std::printf(
      "shape M bf16_TFLOPs fp8_tensor_TFLOPs fp8_block_TFLOPs block_vs_tensor "
      "block_vs_bf16 wgmma_TFLOPs wgmma_direct_TFLOPs wgmma_mc_TFLOPs wgmma_vs_tensor "
      "mc_vs_tensor mc_vs_cublaslt ovl128_TFLOPs ovl192_TFLOPs auto_n ovl_best_vs_tensor "
      "ovl_best_vs_cublaslt ser192_TFLOPs cutlass_TFLOPs cutlass_vs_tensor cutlass_vs_cublaslt "
      "cutlass_pp64_TFLOPs");
  const int n_configs = all_cutlass ? CutlassConfigCount() : 0;
  for (int c = 0; c < n_configs; ++c) std::printf(" cfg_%s_TFLOPs", CutlassConfigName(c));
  std::printf(all_cutlass ? " cutlass_best cutlass_best_vs_tensor\n" : "\n");
#ifndef TANDEM_CUTLASS_ENABLED
  std::printf("cutlass: not built (no CUTLASS headers: third_party/cutlass/), columns 0\n");
#endif
  std::vector<double> cutlass_vs_tensor, cublaslt_vs_tensor, best_vs_tensor;  // closing summary
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  for (const Shape& s : shapes) {
    const int64_t groups = Block128Groups(s.k);
    uint8_t* w8 = DeviceFill<uint8_t>(s.n * s.k, 0x30);
    uint8_t* a8 = DeviceFill<uint8_t>(max_m * s.k, 0x30);
    __nv_bfloat16* w16 = DeviceFill<__nv_bfloat16>(s.n * s.k, 0x3c);
    __nv_bfloat16* a16 = DeviceFill<__nv_bfloat16>(max_m * s.k, 0x3c);
    __nv_bfloat16* out = DeviceFill<__nv_bfloat16>(max_m * s.n, 0);
    float* w_scales = DeviceFill<float>((s.n + 127) / 128 * Block128WeightScaleLd(s.k), 0x3c);
    float* a_scales = DeviceFill<float>(max_m * groups, 0x3c);
    float* a_scales_t = DeviceFill<float>(max_m * groups, 0x3c);
    for (int64_t m : ms) {
      char row[64];
      std::snprintf(row, sizeof(row), "%s %ld", s.name, static_cast<long>(m));
      if (only_row != nullptr && std::strcmp(only_row, row) != 0) continue;
      const double flops = 2.0 * m * s.n * s.k;
      const double t16 = TimeUs(iters, [&] {
        (void)(*bf16)->Linear<__nv_bfloat16, __nv_bfloat16>(a16, w16, nullptr, m, s.n, s.k, out,
                                                            nullptr);
      });
      const double tt = TimeUs(iters, [&] {
        (void)(*fp8)->Linear(a8, w_scales, w8, w_scales, Fp8GemmScaling::kTensor, m, s.n, s.k, out,
                             nullptr);
      });
      // One kBlock128 kernel's time (0 and the reason printed where it does not run).
      auto time_block = [&](Fp8BlockGemmKernel kernel, const char* name) {
        absl::Status st = (*fp8)->set_block_kernel(kernel);
        if (st.ok()) {
          st = (*fp8)->Linear(a8, a_scales_t, w8, w_scales, Fp8GemmScaling::kBlock128, m, s.n, s.k,
                              out, nullptr);
        }
        if (!st.ok()) {
          std::printf("%s M=%ld %s: %s\n", s.name, static_cast<long>(m), name,
                      st.ToString().c_str());
          return 0.0;
        }
        return TimeUs(iters, [&] {
          (void)TransposeGroupScales(a_scales, m, groups, a_scales_t, nullptr);
          (void)(*fp8)->Linear(a8, a_scales_t, w8, w_scales, Fp8GemmScaling::kBlock128, m, s.n, s.k,
                               out, nullptr);
        });
      };
      const double tb = time_block(Fp8BlockGemmKernel::kCublasLt, "block");
      const double tw = time_block(Fp8BlockGemmKernel::kWgmma, "wgmma");
      const double twd = time_block(Fp8BlockGemmKernel::kWgmmaDirectScales, "wgmma_direct");
      const double twm = time_block(Fp8BlockGemmKernel::kWgmmaMulticast, "wgmma_multicast");
      // An overlapped form, called directly (0 and the reason printed where it does not run).
      auto time_overlap = [&](Fp8BlockOverlap overlap, const char* name) {
        const Fp8BlockWgmmaForm form{Fp8BlockScaleLoad::kStaged, false, overlap};
        const auto run = [&] {
          return Fp8BlockGemmWgmma(a8, a_scales_t, w8, w_scales, m, s.n, s.k, out, nullptr, nullptr,
                                   form);
        };
        const absl::Status st = run();
        if (!st.ok()) {
          std::printf("%s M=%ld %s: %s\n", s.name, static_cast<long>(m), name,
                      st.ToString().c_str());
          return 0.0;
        }
        return TimeUs(iters, [&] {
          (void)TransposeGroupScales(a_scales, m, groups, a_scales_t, nullptr);
          (void)run();
        });
      };
      const double to128 = time_overlap(Fp8BlockOverlap::k128, "overlap_128");
      const double to192 = time_overlap(Fp8BlockOverlap::k192, "overlap_192");
      const double ts192 = time_overlap(Fp8BlockOverlap::k192Serial, "serial_192");
      const BlockOperands op{a8, a_scales, a_scales_t, w8, w_scales, m, s.n, s.k, out};
      const double tc = TimeCutlassBlock(iters, op, -1, row);
      const double tc64 = TimeCutlassBlock(iters, op, CutlassConfigIndex("pp64"), row);
      double tob = 0;  // the fastest of the three
      for (double t : {to128, to192, ts192}) tob = t > 0 && (tob <= 0 || t < tob) ? t : tob;
      auto tflops = [&](double us) { return us > 0 ? flops / us / 1e6 : 0.0; };
      auto ratio = [](double num, double den) { return num > 0 && den > 0 ? num / den : 0.0; };
      std::printf("%s %ld %.0f %.0f %.0f %.2f %.2f %.0f %.0f %.0f %.2f %.2f %.2f", s.name,
                  static_cast<long>(m), tflops(t16), tflops(tt), tflops(tb), ratio(tt, tb),
                  ratio(t16, tb), tflops(tw), tflops(twd), tflops(twm), ratio(tt, tw),
                  ratio(tt, twm), ratio(tb, twm));
      std::printf(" %.0f %.0f %d %.2f %.2f %.0f", tflops(to128), tflops(to192),
                  Fp8BlockOverlapAutoTileN(m, s.n, sms), ratio(tt, tob), ratio(tb, tob),
                  tflops(ts192));
      std::printf(" %.0f %.2f %.2f %.0f", tflops(tc), ratio(tt, tc), ratio(tb, tc), tflops(tc64));
      if (all_cutlass) {
        const double best = PrintEveryCutlassConfig(iters, op, tc, tc64, flops, tt, row);
        if (best > 0 && tt > 0) best_vs_tensor.push_back(tt / best);
      }
      std::printf("\n");
      if (tc > 0 && tt > 0) cutlass_vs_tensor.push_back(tt / tc);
      if (tb > 0 && tt > 0) cublaslt_vs_tensor.push_back(tt / tb);
    }
    for (void* p : {static_cast<void*>(w8), static_cast<void*>(a8), static_cast<void*>(w16),
                    static_cast<void*>(a16), static_cast<void*>(out), static_cast<void*>(w_scales),
                    static_cast<void*>(a_scales), static_cast<void*>(a_scales_t)}) {
      cudaFree(p);
    }
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("CUDA error: %s\n", cudaGetErrorString(err));
      return 1;
    }
  }
  PrintRatioSummary("block_vs_tensor (cuBLASLt)", cublaslt_vs_tensor, 0.9);
  PrintRatioSummary("cutlass_vs_tensor", cutlass_vs_tensor, 0.9);
  if (all_cutlass) PrintRatioSummary("cutlass_best_vs_tensor", best_vs_tensor, 0.9);
  return 0;
}

// What Hopper's FP8 MMA keeps of a sum: one output row of activations 448 then (k - 1) x 2^-6
// (codes 0x7E, 0x08) against weights 1.0 (0x38), as cuBLASLt's fp32 product. Exact: 448 +
// (k - 1) / 64; with the products aligned to 448's exponent and 13 fraction bits kept (spacing
// 2^-5), each 2^-6 term vanishes inside an instruction (32 products) that also holds 448 or
// adds to a running sum near it. Large product first and last; k = 32 (one MMA) and 1024.
int ProbeAccumulation() {
  auto fp8 = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes, 0, false);
  if (!fp8.ok()) return 1;
  constexpr int64_t kRows = 16;
  for (int64_t k : {32, 1024}) {
    for (bool large_first : {true, false}) {
      std::vector<uint8_t> a(kRows * k, 0x08), w(kRows * k, 0x38);
      for (int64_t r = 0; r < kRows; ++r) a[r * k + (large_first ? 0 : k - 1)] = 0x7E;
      uint8_t* da = DeviceFill<uint8_t>(a.size(), 0);
      uint8_t* dw = DeviceFill<uint8_t>(w.size(), 0);
      float* out = DeviceFill<float>(kRows * kRows, 0);
      cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice);
      const absl::Status st = (*fp8)->ProductF32(da, dw, kRows, kRows, k, out, nullptr);
      float got = 0;
      cudaMemcpy(&got, out, sizeof(got), cudaMemcpyDeviceToHost);
      std::printf("probe k=%ld large product %s: %s fp32 product %.6f (exact %.6f)\n",
                  static_cast<long>(k), large_first ? "first" : "last", st.ToString().c_str(), got,
                  448.0 + static_cast<double>(k - 1) / 64.0);
      for (void* p : {static_cast<void*>(da), static_cast<void*>(dw), static_cast<void*>(out)}) {
        cudaFree(p);
      }
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  int iters = 200, gemm_iters = 20;
  const char* only = "all";
  bool all_cutlass = false;
  std::vector<int64_t> block_ms = {2048, 8192};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--gemm_iters=", 13) == 0) gemm_iters = std::atoi(argv[i] + 13);
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
    if (std::strcmp(argv[i], "--cutlass_configs=all") == 0) all_cutlass = true;
    if (std::strncmp(argv[i], "--block_ms=", 11) == 0) {
      block_ms.clear();
      for (const absl::string_view m : absl::StrSplit(argv[i] + 11, ',')) {
        int64_t v = 0;
        if (absl::SimpleAtoi(m, &v) && v > 0 && v % 4 == 0) block_ms.push_back(v);
      }
      if (block_ms.empty()) {
        std::fprintf(stderr, "--block_ms: positive multiples of 4, comma-separated\n");
        return 2;
      }
    }
  }
  if (std::strcmp(only, "probe") == 0) return ProbeAccumulation();
  if (std::strcmp(only, "block") == 0) return BenchBlockGemm(gemm_iters, all_cutlass, block_ms);
  if (std::strcmp(only, "gemm") == 0) return BenchGemm(gemm_iters);
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
  if (BenchGemm(gemm_iters) != 0) return 1;
  return BenchBlockGemm(gemm_iters, all_cutlass, block_ms) != 0 || ProbeAccumulation() != 0;
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
