// The decode expert GEMVs in FP8 (moe_fp8_cuda.h) next to the bf16 ones (moe_cuda.h) at the
// Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert width 768; compressed-tensors FP8:
// per-channel weights, per-token activations) and DeepSeek-V3 (256 experts, top-8, hidden 7168,
// width 2048; 128 x 128 weight blocks, 1 x 128 activations) expert shapes:
//
//   moe_fp8_cuda_bench [--tokens=1,4,8,16,64] [--iters=40] [--only=qwen3|deepseek]
//
// Per shape and token count, microseconds of gate_up (+ SiLU * up) and down over the routed
// experts, and the routed experts' weight bytes (each active expert read once) per second:
//   bf16     MoeExpertGemvGateUp + MoeExpertGemvDown on bf16 weights;
//   fp8      the CUDA layer's FP8 decode path: QuantizeActivations(x) + the FP8 gate_up GEMV +
//            QuantizeActivations(act) + the FP8 down GEMV (the checkpoint's scheme);
//   w8a16    the FP8 GEMVs on bf16 activations (weight-only FP8; no quantization passes).
// Each timed step (CUDA events) uses one of 8 random routings in turn (top-k distinct experts per
// token) after a 256 MiB memset that evicts L2 (50 MiB on an H200), so weights come from HBM.
// Weight values are constant bytes (time does not depend on them).
//
// Prefill rows (--prefill_tokens=128,256,512,2048,8192; 0: none; --mode=decode|prefill|both;
// 128 and 256: the CUDA-graph sizes, where the runtime takes MoeFp8GroupedMma): the
// experts of a prefill step (x [T, H] routed top-k, 1 x 128 activations, 128 x 128-block weights
// held per row: Qwen3-30B-A3B-FP8's and DeepSeek-V3's checkpoints), gate_up + SiLU * up + down with
// the quantization passes, milliseconds and TFLOP/s (6 x rows x H x I flops):
//   cutlass   the runtime's CUTLASS path (cuda_moe_fp8.h): QuantizeActivations of x per token,
//             MoeGatherFp8Rows, one MoeFp8CutlassGroupedGemm per projection (kernels/moe/cutlass),
//             MoeSiluAndMulQuantFp8 between; the weight scales per row (ScaleGranularityN 1: 128
//             scales per tile and k step); "cut-blk two-pass": the block form with the two-kernel
//             activation passes those replaced (MoeGatherRows + QuantizeActivations of the rows,
//             MoeSiluAndMul + QuantizeActivations);
//   cut-blk   the same with the block form (TANDEM_MOE_FP8_CUTLASS_SCALES=block: the experts'
//             block scales [ceil(n / 128), Block128WeightScaleLd(k)], ScaleGranularityN 128;
//             Qwen3's down, k = 768, through the compact copy);
//   cut-tok   the per-token form: per-channel weights (compressed-tensors', online FP8's) and
//             per-token activations in the scaled form (their scales applied in the epilogue,
//             the runtime's default); "cut-tok bcast": the same scales broadcast over the
//             128-column groups by the call into the row form (MoeFp8CutlassGroupedArgs::
//             broadcast_scales, a_scales_wide / w_scales_wide); "cut-tok swap": the scaled form
//             with the operands swapped (swap_ab: the weight first, the rows in 32-wide tiles);
//             "cut-blk swap": the block form swapped;
//   --stages=1 also times the block and per-token forms' stages apart (gather + quantize,
//             gate_up, SiLU * up + quantize, down; each after an L2 flush);
//   mma       MoeFp8GroupedMma (the gather folded into gate_up);
//   per-exp   the old runtime loop: gather, the offsets read back (a host sync), then per expert
//             QuantizeActivations + TransposeGroupScales + CublasLtFp8Gemm kBlock128 (its
//             default dispatch) on the expert's rows rounded down to 4 (the runtime's remainder
//             rows' GEMV and its <= 16-row GEMVs are not modelled).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
#include "kernels/fp8/fp8_gemm_kernels.h"
#include "kernels/moe/moe_bench_check.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_fp8_cuda.h"
#ifdef TANDEM_CUTLASS_ENABLED
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"
#endif

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

template <typename T>
T* Alloc(int64_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
  return p;
}

struct Shape {
  const char* name;
  int64_t E, k, H, I;
  bool blocks;  // 128-column weight groups + 1 x 128 activations; else per-channel + per-token
};

// Stacked weights of one projection ([E, rows, cols]) in both forms, and the FP8 pointer tables.
struct Projection {
  bf16* bf16_w;
  uint8_t* codes;
  float* scales;
  MoeFp8Experts fp8;
};

Projection MakeProjection(int64_t E, int64_t rows, int64_t cols, bool blocks,
                          bool with_bf16 = true) {
  Projection p{};
  const int64_t groups = blocks ? (cols + 127) / 128 : 1;
  p.bf16_w = with_bf16 ? Alloc<__nv_bfloat16>(E * rows * cols) : nullptr;
  p.codes = Alloc<uint8_t>(E * rows * cols);
  p.scales = Alloc<float>(E * rows * groups);
  if (with_bf16) CHECK_CUDA(cudaMemset(p.bf16_w, 0x3c, E * rows * cols * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMemset(p.codes, 0x38, E * rows * cols));
  CHECK_CUDA(cudaMemset(p.scales, 0, E * rows * groups * sizeof(float)));
  std::vector<const uint8_t*> c(E);
  std::vector<const float*> s(E);
  for (int64_t e = 0; e < E; ++e) {
    c[e] = p.codes + e * rows * cols;
    s[e] = p.scales + e * rows * groups;
  }
  auto* dc = Alloc<const uint8_t*>(E);
  auto* ds = Alloc<const float*>(E);
  CHECK_CUDA(cudaMemcpy(dc, c.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(ds, s.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
  p.fp8 = {dc, ds, groups};
  return p;
}

void FreeProjection(const Projection& p) {
  cudaFree(p.bf16_w);
  cudaFree(p.codes);
  cudaFree(p.scales);
  cudaFree(const_cast<const uint8_t**>(p.fp8.codes));
  cudaFree(const_cast<const float**>(p.fp8.scales));
}

void RunShape(const Shape& s, const std::vector<int64_t>& tokens, int iters) {
  const int64_t E = s.E, k = s.k, H = s.H, I = s.I;
  const Fp8ActivationScheme scheme =
      s.blocks ? Fp8ActivationScheme::kDynamicGroup128 : Fp8ActivationScheme::kDynamicToken;
  const Projection gu = MakeProjection(E, 2 * I, H, s.blocks);
  const Projection dn = MakeProjection(E, H, I, s.blocks);
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end()), max_rows = max_t * k;
  bf16* x = Alloc<bf16>(max_t * H);
  bf16* act = Alloc<bf16>(max_rows * I);
  bf16* out = Alloc<bf16>(max_rows * H);
  CHECK_CUDA(cudaMemset(x, 0x3c, max_t * H * sizeof(bf16)));
  uint8_t* codes = Alloc<uint8_t>(std::max(max_t * H, max_rows * I));
  float* ascales = Alloc<float>(std::max(max_t * H, max_rows * I) / 16 + 16);
  char* flush = Alloc<char>(256 << 20);
  constexpr int kRoutings = 8;
  int32_t* ids = Alloc<int32_t>(kRoutings * max_rows);
  int32_t *offsets = Alloc<int32_t>(kRoutings * (E + 1)), *active = Alloc<int32_t>(kRoutings * E);
  int32_t *tor = Alloc<int32_t>(kRoutings * max_rows), *rop = Alloc<int32_t>(kRoutings * max_rows);
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  std::mt19937 rng(7);
  const double expert_bytes = static_cast<double>(3 * I * H);  // per FP8 expert; bf16 twice
  for (int64_t T : tokens) {
    const int64_t rows = T * k;
    double unique = 0;
    std::vector<DeviceMoePermutation> perms;
    for (int r = 0; r < kRoutings; ++r) {
      std::vector<int32_t> h(rows), all(E);
      std::set<int32_t> used;
      for (int64_t t = 0; t < T; ++t) {
        for (int32_t e = 0; e < E; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t j = 0; j < k; ++j) used.insert(h[t * k + j] = all[j]);
      }
      unique += static_cast<double>(used.size()) / kRoutings;
      CHECK_CUDA(cudaMemcpy(ids + r * max_rows, h.data(), rows * 4, cudaMemcpyHostToDevice));
      perms.push_back(
          {offsets + r * (E + 1), active + r * E, tor + r * max_rows, rop + r * max_rows});
      CHECK_OK(MoePermute(ids + r * max_rows, T, k, E, perms.back(), nullptr, nullptr));
    }
    auto time = [&](auto step) {
      double total = 0;
      for (int i = -2; i < iters; ++i) {  // two warm-ups
        CHECK_CUDA(cudaMemsetAsync(flush, i & 0xff, 256 << 20));
        CHECK_CUDA(cudaEventRecord(t0));
        step(perms[(i + kRoutings) % kRoutings]);
        CHECK_CUDA(cudaEventRecord(t1));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        if (i >= 0) total += ms;
      }
      return 1e3 * total / iters;  // microseconds
    };
    const double bf16_us = time([&](const DeviceMoePermutation& p) {
      CHECK_OK(MoeExpertGemvGateUp<bf16>(x, gu.bf16_w, H, I, p, E, rows, act, nullptr));
      CHECK_OK(MoeExpertGemvDown<bf16>(act, dn.bf16_w, H, I, p, E, rows, out, nullptr));
    });
    const double fp8_us = time([&](const DeviceMoePermutation& p) {
      MoeFp8Activations a{scheme, x, codes, ascales};
      CHECK_OK(QuantizeActivations(x, T, H, scheme, 0.0f, codes, ascales, nullptr));
      CHECK_OK(MoeFp8ExpertGemvGateUp(a, gu.fp8, H, I, p, E, rows, act, nullptr));
      CHECK_OK(QuantizeActivations(act, rows, I, scheme, 0.0f, codes, ascales, nullptr));
      a.values = act;
      CHECK_OK(MoeFp8ExpertGemvDown(a, dn.fp8, H, I, p, E, rows, out, nullptr));
    });
    const double w8_us = time([&](const DeviceMoePermutation& p) {
      const MoeFp8Activations xa{Fp8ActivationScheme::kNone, x, nullptr, nullptr};
      const MoeFp8Activations aa{Fp8ActivationScheme::kNone, act, nullptr, nullptr};
      CHECK_OK(MoeFp8ExpertGemvGateUp(xa, gu.fp8, H, I, p, E, rows, act, nullptr));
      CHECK_OK(MoeFp8ExpertGemvDown(aa, dn.fp8, H, I, p, E, rows, out, nullptr));
    });
    const double fp8_bytes = unique * expert_bytes;
    std::printf(
        "%-9s T=%-4lld active=%6.1f | bf16 %8.1f us %5.2f TB/s | fp8 %8.1f us %5.2f TB/s | "
        "w8a16 %8.1f us %5.2f TB/s | fp8/bf16 speedup %.2fx\n",
        s.name, static_cast<long long>(T), unique, bf16_us, 2 * fp8_bytes / bf16_us / 1e6, fp8_us,
        fp8_bytes / fp8_us / 1e6, w8_us, fp8_bytes / w8_us / 1e6, bf16_us / fp8_us);
    std::fflush(stdout);
  }
  FreeProjection(gu);
  FreeProjection(dn);
  for (void* p :
       std::vector<void*>{x, act, out, codes, ascales, flush, ids, offsets, active, tor, rop}) {
    cudaFree(p);
  }
}

// Random top-k routings (distinct experts per token) of T tokens into perm's buffers.
void Route(int64_t T, int64_t k, int64_t E, std::mt19937& rng, int32_t* ids,
           const DeviceMoePermutation& perm) {
  std::vector<int32_t> h(T * k), all(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < k; ++j) h[t * k + j] = all[j];
  }
  CHECK_CUDA(cudaMemcpy(ids, h.data(), T * k * 4, cudaMemcpyHostToDevice));
  CHECK_OK(MoePermute(ids, T, k, E, perm, nullptr, nullptr));
}

// The prefill buffers of one shape at up to max_t tokens.
struct PrefillBuffers {
  bf16 *x, *rows_in, *gate_up, *act, *out;
  uint8_t* codes;
  float *scales, *scales_t;
  int32_t *ids, *offsets, *active, *tor, *rop;
  char* flush;
};

// One projection of the old per-expert loop: per expert with rows, its rows quantized, their
// scales transposed, cuBLASLt's block GEMM on the rows rounded down to 4. false where cuBLASLt
// has no kernel (ceil(k / 128) not a multiple of 4, e.g. Qwen3-30B-A3B's down, k = 768: the
// runtime then ran its FP8 GEMV in row chunks, which this bench does not reproduce).
bool PerExpertProjection(CublasLtFp8Gemm& gemm, const std::vector<int32_t>& o, const bf16* in,
                         const Projection& w, const float* w_blocks, int64_t n, int64_t kk,
                         PrefillBuffers& b, bf16* out) {
  const int64_t groups = kk / 128, ld = Block128WeightScaleLd(kk), E = o.size() - 1;
  const Fp8ActivationScheme scheme = Fp8ActivationScheme::kDynamicGroup128;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = (o[e + 1] - o[e]) / 4 * 4;
    if (m == 0) continue;
    CHECK_OK(QuantizeActivations(in + o[e] * kk, m, kk, scheme, 0.0f, b.codes, b.scales, nullptr));
    CHECK_OK(TransposeGroupScales(b.scales, m, groups, b.scales_t, nullptr));
    const absl::Status st = gemm.Linear(
        b.codes, b.scales_t, w.codes + e * n * kk, w_blocks + e * ((n + 127) / 128) * ld,
        Fp8GemmScaling::kBlock128, m, n, kk, out + o[e] * n, nullptr);
    if (absl::IsUnimplemented(st)) return false;
    CHECK_OK(st);
  }
  return true;
}

// A device table of E pointers blocks + e * per_expert.
const float** BlockTable(const float* blocks, int64_t E, int64_t per_expert) {
  std::vector<const float*> h(E);
  for (int64_t e = 0; e < E; ++e) h[e] = blocks + e * per_expert;
  const float** d = Alloc<const float*>(E);
  CHECK_CUDA(cudaMemcpy(d, h.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
  return d;
}

// The CUTLASS step's forms: the weight scales per row (over 128-column groups) or per 128 x 128
// block, with 1 x 128 activations; per channel with per-token activations (broadcast scales).
enum class CutForm { kRow, kBlock, kToken, kTokenBroadcast, kTokenSwap, kBlockSwap };

void RunPrefill(const Shape& s, const std::vector<int64_t>& tokens, int iters, bool stages) {
  const int64_t E = s.E, k = s.k, H = s.H, I = s.I;
  const Fp8ActivationScheme scheme = Fp8ActivationScheme::kDynamicGroup128;
  const Projection gu = MakeProjection(E, 2 * I, H, true, false);
  const Projection dn = MakeProjection(E, H, I, true, false);
  // cuBLASLt's block scales [ceil(n / 128), ld] per expert (the upload's copy), zero as the
  // per-row scales; the tables of their per-expert pointers (the CUTLASS block form's).
  const int64_t gu_block_floats = ((2 * I + 127) / 128) * Block128WeightScaleLd(H);
  const int64_t dn_block_floats = ((H + 127) / 128) * Block128WeightScaleLd(I);
  float* gu_blocks = Alloc<float>(E * gu_block_floats);
  float* dn_blocks = Alloc<float>(E * dn_block_floats);
  CHECK_CUDA(cudaMemset(gu_blocks, 0, E * gu_block_floats * sizeof(float)));
  CHECK_CUDA(cudaMemset(dn_blocks, 0, E * dn_block_floats * sizeof(float)));
  const float** gu_block_table = BlockTable(gu_blocks, E, gu_block_floats);
  const float** dn_block_table = BlockTable(dn_blocks, E, dn_block_floats);
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end()), max_rows = max_t * k;
  PrefillBuffers b{};
  b.x = Alloc<bf16>(max_t * H);
  b.rows_in = Alloc<bf16>(max_rows * H);
  b.gate_up = Alloc<bf16>(max_rows * 2 * I);
  b.act = Alloc<bf16>(max_rows * I);
  b.out = Alloc<bf16>(max_rows * H);
  b.codes = Alloc<uint8_t>(max_rows * H);
  b.scales = Alloc<float>(max_rows * H / 128);
  b.scales_t = Alloc<float>(max_rows * H / 128);
  b.ids = Alloc<int32_t>(max_rows);
  b.offsets = Alloc<int32_t>(E + 1);
  b.active = Alloc<int32_t>(E);
  b.tor = Alloc<int32_t>(max_rows);
  b.rop = Alloc<int32_t>(max_rows);
  b.flush = Alloc<char>(256 << 20);
  CHECK_CUDA(cudaMemset(b.x, 0x3c, max_t * H * sizeof(bf16)));
  auto gemm = CublasLtFp8Gemm::Create();
  CHECK_OK(gemm.status());
#ifdef TANDEM_CUTLASS_ENABLED
  const bool cutlass = MoeFp8CutlassGroupedSupported();
  size_t ws_bytes = 0;
  char* ws = nullptr;
  // The per-token form's per-channel projections and broadcast scratch.
  Projection gu_ch{}, dn_ch{};
  float *a_wide = nullptr, *w_wide = nullptr, *x_scales = nullptr;
  uint8_t* x_codes = nullptr;
  if (cutlass) {
    gu_ch = MakeProjection(E, 2 * I, H, false, false);
    dn_ch = MakeProjection(E, H, I, false, false);
    a_wide = Alloc<float>(max_rows * std::max(H, I) / 128);
    x_codes = Alloc<uint8_t>(max_t * H);
    x_scales = Alloc<float>(max_t * H / 128);
    w_wide = Alloc<float>(std::max(MoeFp8CutlassWideWeightScales(E, 2 * I, H),
                                   MoeFp8CutlassWideWeightScales(E, H, I)));
    CHECK_OK(MoeFp8CutlassGroupedInit());
    auto bytes = MoeFp8CutlassGroupedWorkspaceBytes(E);
    CHECK_OK(bytes.status());
    auto gu_bytes = MoeFp8CutlassGroupedBlockWorkspaceBytes(E, 2 * I, H, Block128WeightScaleLd(H));
    CHECK_OK(gu_bytes.status());
    auto dn_bytes = MoeFp8CutlassGroupedBlockWorkspaceBytes(E, H, I, Block128WeightScaleLd(I));
    CHECK_OK(dn_bytes.status());
    ws_bytes = std::max({*bytes, *gu_bytes, *dn_bytes});
    ws = Alloc<char>(ws_bytes);
  }
#else
  const bool cutlass = false;
#endif
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  std::mt19937 rng(11);
  for (int64_t T : tokens) {
    const int64_t rows = T * k;
    const DeviceMoePermutation perm{b.offsets, b.active, b.tor, b.rop};
    Route(T, k, E, rng, b.ids, perm);
    auto time = [&](auto step) {
      double total = 0;
      for (int i = -2; i < iters; ++i) {  // two warm-ups
        CHECK_CUDA(cudaMemsetAsync(b.flush, i & 0xff, 256 << 20));
        CHECK_CUDA(cudaEventRecord(t0));
        step();
        CHECK_CUDA(cudaEventRecord(t1));
        CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        if (i >= 0) total += ms;
      }
      return total / iters;  // milliseconds
    };
    double cutlass_ms = 0, block_ms = 0, token_ms = 0, token_bcast_ms = 0, block_2pass_ms = 0;
    double token_swap_ms = 0, block_swap_ms = 0;
    bool no_act = false;  // --stages: the fused SiLU * up pass without writing act
#ifdef TANDEM_CUTLASS_ENABLED
    // One CUTLASS prefill step in `form`; stage -1: all of it, else only that stage (0 gather +
    // quantize, 1 gate_up, 2 SiLU * up + quantize, 3 down: --stages). fused: the runtime's
    // activation passes (x quantized per token, its codes gathered; SiLU * up quantized in one
    // pass), else the two-kernel passes they replaced (gather bf16 rows, quantize them; SiLU * up,
    // quantize).
    auto cutlass_step = [&](CutForm form, int stage, bool fused = true) {
      const bool token = form == CutForm::kToken || form == CutForm::kTokenBroadcast ||
                         form == CutForm::kTokenSwap;
      const bool block = form == CutForm::kBlock || form == CutForm::kBlockSwap;
      const Fp8ActivationScheme sch = token ? Fp8ActivationScheme::kDynamicToken : scheme;
      auto run = [&](int st) { return stage < 0 || stage == st; };
      if (run(0) && fused) {
        CHECK_OK(QuantizeActivations(b.x, T, H, sch, 0.0f, x_codes, x_scales, nullptr));
        CHECK_OK(
            MoeGatherFp8Rows(x_codes, x_scales, H, sch, b.tor, rows, b.codes, b.scales, nullptr));
      } else if (run(0)) {
        CHECK_OK(MoeGatherRows<bf16>(b.x, H, b.tor, rows, b.rows_in, nullptr));
        CHECK_OK(QuantizeActivations(b.rows_in, rows, H, sch, 0.0f, b.codes, b.scales, nullptr));
      }
      MoeFp8CutlassGroupedArgs args{
          b.codes, b.scales, (token ? gu_ch : gu).fp8, b.offsets, E, 2 * I, H, b.gate_up};
      if (block) {
        args.block_scales = gu_block_table;
        args.block_scale_ld = Block128WeightScaleLd(H);
      }
      if (token) args.a_scheme = sch, args.a_scales_wide = a_wide, args.w_scales_wide = w_wide;
      args.broadcast_scales = form == CutForm::kTokenBroadcast;
      args.swap_ab = form == CutForm::kTokenSwap || form == CutForm::kBlockSwap;
      if (run(1)) CHECK_OK(MoeFp8CutlassGroupedGemm(args, ws, ws_bytes, nullptr));
      if (run(2) && fused) {
        CHECK_OK(MoeSiluAndMulQuantFp8(b.gate_up, rows, I, sch, 0.0f, no_act ? nullptr : b.act,
                                       b.codes, b.scales, nullptr));
      } else if (run(2)) {
        CHECK_OK(MoeSiluAndMul<bf16>(b.gate_up, rows, I, b.act, nullptr));
        CHECK_OK(QuantizeActivations(b.act, rows, I, sch, 0.0f, b.codes, b.scales, nullptr));
      }
      args.w = (token ? dn_ch : dn).fp8;
      args.n = H;
      args.k = I;
      args.out = b.out;
      if (block) {
        args.block_scales = dn_block_table;
        args.block_scale_ld = Block128WeightScaleLd(I);
      }
      if (run(3)) CHECK_OK(MoeFp8CutlassGroupedGemm(args, ws, ws_bytes, nullptr));
    };
    if (cutlass) {
      cutlass_ms = time([&] { cutlass_step(CutForm::kRow, -1); });
      block_ms = time([&] { cutlass_step(CutForm::kBlock, -1); });
      token_ms = time([&] { cutlass_step(CutForm::kToken, -1); });
      token_bcast_ms = time([&] { cutlass_step(CutForm::kTokenBroadcast, -1); });
      token_swap_ms = time([&] { cutlass_step(CutForm::kTokenSwap, -1); });
      block_swap_ms = time([&] { cutlass_step(CutForm::kBlockSwap, -1); });
      block_2pass_ms = time([&] { cutlass_step(CutForm::kBlock, -1, false); });
      if (stages) {
        for (const CutForm form :
             {CutForm::kBlock, CutForm::kToken, CutForm::kTokenBroadcast, CutForm::kTokenSwap}) {
          double ms[4], two_pass[4];
          for (int st = 0; st < 4; ++st) ms[st] = time([&] { cutlass_step(form, st); });
          for (int st : {0, 2}) two_pass[st] = time([&] { cutlass_step(form, st, false); });
          no_act = true;  // the fused pass without the bf16 act rows
          const double no_act_ms = time([&] { cutlass_step(form, 2); });
          no_act = false;
          std::printf(
              "stages %-9s T=%-5lld %-5s | gather+quant %.3f ms (two-pass %.3f) | gate_up %.3f ms "
              "%6.1f TFLOP/s | silu+quant %.3f ms (no act %.3f, two-pass %.3f) | down %.3f ms "
              "%6.1f TFLOP/s\n",
              s.name, static_cast<long long>(T),
              form == CutForm::kBlock            ? "block"
              : form == CutForm::kToken          ? "token"
              : form == CutForm::kTokenBroadcast ? "bcast"
                                                 : "swap",
              ms[0], two_pass[0], ms[1], 4.0 * rows * H * I / 1e9 / ms[1], ms[2], no_act_ms,
              two_pass[2], ms[3], 2.0 * rows * H * I / 1e9 / ms[3]);
        }
      }
    }
#endif
    const double mma_ms = time([&] {
      MoeFp8Activations a{scheme, b.x, b.codes, b.scales};
      CHECK_OK(QuantizeActivations(b.x, T, H, scheme, 0.0f, b.codes, b.scales, nullptr));
      CHECK_OK(
          MoeFp8GroupedMma(a, b.tor, gu.fp8, b.offsets, E, rows, 2 * I, H, b.gate_up, nullptr));
      CHECK_OK(MoeSiluAndMul<bf16>(b.gate_up, rows, I, b.act, nullptr));
      CHECK_OK(QuantizeActivations(b.act, rows, I, scheme, 0.0f, b.codes, b.scales, nullptr));
      a.values = b.act;
      CHECK_OK(MoeFp8GroupedMma(a, nullptr, dn.fp8, b.offsets, E, rows, H, I, b.out, nullptr));
    });
    bool per_expert_ran = true;  // 0 printed where cuBLASLt has no kernel for a projection
    double per_expert_ms = time([&] {
      CHECK_OK(MoeGatherRows<bf16>(b.x, H, b.tor, rows, b.rows_in, nullptr));
      std::vector<int32_t> o(E + 1);  // the read-back: the loop's host sync
      CHECK_CUDA(cudaMemcpy(o.data(), b.offsets, (E + 1) * 4, cudaMemcpyDeviceToHost));
      per_expert_ran &=
          PerExpertProjection(**gemm, o, b.rows_in, gu, gu_blocks, 2 * I, H, b, b.gate_up);
      CHECK_OK(MoeSiluAndMul<bf16>(b.gate_up, rows, I, b.act, nullptr));
      per_expert_ran &= PerExpertProjection(**gemm, o, b.act, dn, dn_blocks, H, I, b, b.out);
    });
    if (!per_expert_ran) per_expert_ms = 0.0;
    const double tflop = 6.0 * rows * H * I / 1e12;
    auto rate = [&](bool ran, double ms) { return ran ? tflop / ms * 1e3 : 0.0; };
    std::printf(
        "prefill %-9s T=%-5lld rows=%-6lld | cutlass %8.3f ms %6.1f TFLOP/s | cut-blk %8.3f ms "
        "%6.1f TFLOP/s | cut-tok %8.3f ms %6.1f TFLOP/s | mma %8.3f ms %6.1f TFLOP/s | per-exp "
        "%8.3f ms %6.1f TFLOP/s | cutlass vs mma %.2fx vs per-exp %.2fx | cut-blk vs cutlass "
        "%.2fx vs mma %.2fx | cut-blk two-pass %8.3f ms | cut-tok bcast %8.3f ms %6.1f TFLOP/s | "
        "cut-tok swap %8.3f ms %6.1f TFLOP/s | cut-blk swap %8.3f ms %6.1f TFLOP/s\n",
        s.name, static_cast<long long>(T), static_cast<long long>(rows), cutlass_ms,
        rate(cutlass, cutlass_ms), block_ms, rate(cutlass, block_ms), token_ms,
        rate(cutlass, token_ms), mma_ms, rate(true, mma_ms), per_expert_ms,
        rate(per_expert_ran, per_expert_ms), cutlass ? mma_ms / cutlass_ms : 0.0,
        cutlass ? per_expert_ms / cutlass_ms : 0.0, cutlass ? cutlass_ms / block_ms : 0.0,
        cutlass ? mma_ms / block_ms : 0.0, block_2pass_ms, token_bcast_ms,
        rate(cutlass, token_bcast_ms), token_swap_ms, rate(cutlass, token_swap_ms), block_swap_ms,
        rate(cutlass, block_swap_ms));
    std::fflush(stdout);
  }
  if (!cutlass) std::printf("prefill %s: cutlass not built or not sm_90 (zeros)\n", s.name);
  FreeProjection(gu);
  FreeProjection(dn);
#ifdef TANDEM_CUTLASS_ENABLED
  cudaFree(ws);
  if (cutlass) {
    FreeProjection(gu_ch);
    FreeProjection(dn_ch);
    cudaFree(a_wide);
    cudaFree(w_wide);
    cudaFree(x_codes);
    cudaFree(x_scales);
  }
#endif
  cudaFree(gu_block_table);
  cudaFree(dn_block_table);
  for (void* p : std::vector<void*>{gu_blocks, dn_blocks, b.x, b.rows_in, b.gate_up, b.act, b.out,
                                    b.codes, b.scales, b.scales_t, b.ids, b.offsets, b.active,
                                    b.tor, b.rop, b.flush}) {
    cudaFree(p);
  }
}

int Main(int argc, char** argv) {
  std::vector<int64_t> tokens = {1, 4, 8, 16, 64};
  std::vector<int64_t> prefill_tokens = {128, 256, 512, 2048, 8192};
  std::string mode = "both";
  bool stages = false;
  int iters = 40;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--tokens=", 0) == 0) {
      tokens.clear();
      for (const char* p = a.c_str() + 9; *p != '\0';) {
        char* end = nullptr;
        tokens.push_back(std::strtoll(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a.rfind("--iters=", 0) == 0) {
      iters = std::atoi(a.c_str() + 8);
    } else if (a.rfind("--only=", 0) == 0) {
      only = a.substr(7);
    } else if (a.rfind("--mode=", 0) == 0) {
      mode = a.substr(7);
    } else if (a == "--stages=1") {
      stages = true;
    } else if (a.rfind("--prefill_tokens=", 0) == 0) {
      prefill_tokens.clear();
      for (const char* p = a.c_str() + 17; *p != '\0';) {
        char* end = nullptr;
        const int64_t t = std::strtoll(p, &end, 10);
        if (t > 0) prefill_tokens.push_back(t);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const Shape shapes[] = {{"qwen3", 128, 8, 2048, 768, false},
                          {"deepseek", 256, 8, 7168, 2048, true}};
  for (const Shape& s : shapes) {
    if ((only.empty() || only == s.name) && mode != "prefill") RunShape(s, tokens, iters);
  }
  for (const Shape& s : shapes) {  // both checkpoints' experts are 128 x 128 blocks here
    if ((only.empty() || only == s.name) && mode != "decode" && !prefill_tokens.empty()) {
      RunPrefill(s, prefill_tokens, iters, stages);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
