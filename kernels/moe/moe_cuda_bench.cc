// The routed MoE layer's kernels on one GPU, Qwen3-30B-A3B (128 experts, top-8, hidden 2048,
// expert width 768) and Mixtral-8x7B (8 experts, top-2, hidden 4096, width 14336) shapes, bf16:
//
//   moe_cuda_bench [--tokens=1,16,128,1024,8192] [--iters=20] [--new=1] [--variants=1]
//
// Per shape and token count: the experts' time (gate_up + SiLU*up + down) on the decode GEMVs
// and on the padded strided-batched GEMM (<= 256 tokens: the sync-free paths), on one
// cublasGemmGroupedBatchedEx per projection and on one cublasGemmEx per expert; the router
// top-k, the permutation and the combine alone (microseconds); the whole layer as
// runtime/cuda/cuda_moe_mlp.h picks its path (GEMV up to max(4, E / k) tokens, padded up to
// 256, grouped / per-expert above); the best experts time as TFLOP/s and as bytes of the routed
// experts' weights (each active expert read once) per second; and, for reference, a dense
// cublasGemmEx of the same rows x (2 * width) x hidden. Routing: random logits (softmax top-k,
// renormalised); weights and activations random (a tiled normal pattern).
//
// Before / after in one process (unless --new=0): the kernels added after the first
// measurements, selectable in serving by TANDEM_MOE_KERNELS (runtime/cuda/cuda_moe_mlp.h):
// mma_ms = MoeGroupedMma per projection (gather folded in, no offsets read-back) + SiLU*up,
// mma_TF its TFLOP/s, mma_err = max |mma - cuBLAS grouped| / max |cuBLAS grouped| of the
// experts' output rows (a correctness check at the real shapes); csplit_us = MoeCombineSplit
// (cdiff = its max |difference| from MoeCombine: 0 expected); layer_new = the layer with both
// (GEMV sizes as before; above them MoeGroupedMma for E > 16, the old choice for E <= 16, as
// TANDEM_MOE_KERNELS=new makes CudaMoeMlp choose); on sm_90 then wg_ms / wg_TF / wg_err /
// layer_wg = the same with MoeGroupedWgmma (the Hopper wgmma kernel) in MoeGroupedMma's place
// (every shape, also E <= 16; the layer on it at every size), checked against cuBLAS's grouped
// call like mma_err; then glu_ms / glu_TF / glu_err / layer_glu: the same with gate_up and SiLU *
// up in one launch (MoeGroupedWgmmaGateUpSilu, then MoeGroupedWgmma's down); then (unless
// --variants=0) per other (MoeWgmmaProducer, MoeWgmmaSchedule) pair (every producer with
// kCooperative, then kPingPong and kCooperative128x256 with kTmaWeights and kTmaOperands; the
// default pair left out) wg2_ms / wg2_TF / wg2_err / layer2: the experts on MoeGroupedWgmma with
// that pair and the layer on them. For decode steps (T <= 16) also the fused route + permute
// launch and the layer in CUDA graphs with and without it and PDL (DecodeGraphs); at the GEMV
// sizes then gemv_pdl_us: the two expert GEMVs alone, PDL-launched back to back as CudaMoeMlp
// launches them (gemv_ms above is the plain launches).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/moe/moe_bench_check.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_gemm_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

struct Shape {
  const char* name;
  int64_t E, k, H, I;
};

void* Alloc(int64_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<int64_t>(bytes, 16)));
  CHECK_CUDA(cudaMemset(p, 0, std::max<int64_t>(bytes, 16)));
  return p;
}

// Fills n bf16 elements with a normal(0, sd) pattern of a prime length, tiled.
void FillRandom(bf16* dst, int64_t n, float sd, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<bf16> pattern(std::min<int64_t>(n, (1 << 20) + 7));
  for (bf16& v : pattern) v = __float2bfloat16(normal(rng));
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(pattern.size())) {
    const int64_t m = std::min<int64_t>(pattern.size(), n - i);
    CHECK_CUDA(cudaMemcpy(dst + i, pattern.data(), m * 2, cudaMemcpyHostToDevice));
  }
}

// max |a - b| / max |b| over n device bf16 elements (b the reference); -1 when b is all zero.
double RelDiff(const bf16* a, const bf16* b, int64_t n) {
  std::vector<bf16> ha(n), hb(n);
  CHECK_CUDA(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
    diff = std::max(diff, std::isfinite(x) ? std::abs(x - y) : 1e30);
    ref = std::max(ref, std::abs(y));
  }
  return ref > 0.0 ? diff / ref : -1.0;
}

// Mean milliseconds of fn over iters runs (after 3 warm-up runs).
double TimeMs(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms / iters;
}

// Decode steps (T <= 16): MoeRouteAndPermute alone against MoeRoute + MoePermute (fused_us,
// rp_us), its outputs checked equal (fsame), then the layer as CudaMoeMlp runs it (route,
// permute, the experts' path, split combine) captured kGraphLayers times back to back in one CUDA
// graph, as a model's layers are: microseconds per layer with the separate launches (g_sep_us)
// and with TANDEM_MOE_KERNELS' fused_route + pdl (g_fused_us).
constexpr int kGraphLayers = 48;
void DecodeGraphs(const Shape& s, int T, const GroupedRoutingParams& p, const bf16* x,
                  const bf16* gate_up, const bf16* down, const float* logits, int32_t* ids,
                  float* weights, const DeviceMoePermutation& perm, bf16* xs, bf16* gu, bf16* act,
                  bf16* eout, int32_t* padded_rows, bf16* out, MoeGroupedGemm& grouped, int iters) {
  const int64_t E = s.E, k = s.k, H = s.H, I = s.I, rows = T * k;
  const bool use_gemv = T <= std::max<int64_t>(4, E / k);
  const auto bf = MoeGroupedGemm::Dtype::kBf16;
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Equality of the fused launch's outputs with the separate kernels'.
  const int64_t n = rows + E + 1 + E + rows;
  std::vector<int32_t> sep(n), fused(n);
  auto snapshot = [&](std::vector<int32_t>* dst) {
    CHECK_CUDA(cudaStreamSynchronize(st));
    int32_t* d = dst->data();
    CHECK_CUDA(cudaMemcpy(d, ids, rows * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(d + rows, perm.expert_offsets, (E + 1) * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(d + rows + E + 1, perm.active_experts, E * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(
        cudaMemcpy(d + rows + 2 * E + 1, perm.row_of_pair, rows * 4, cudaMemcpyDeviceToHost));
  };
  auto separate = [&] {
    CHECK_OK(MoeRoute(logits, T, p, ids, weights, st));
    CHECK_OK(MoePermute(ids, T, k, E, perm, nullptr, st));
  };
  auto fused_route = [&](bool pdl) {
    CHECK_OK(MoeRouteAndPermute(logits, T, p, ids, weights, perm, nullptr, st, pdl));
  };
  separate();
  snapshot(&sep);
  fused_route(false);
  snapshot(&fused);
  const bool same = sep == fused;
  auto time_on_stream = [&](const std::function<void()>& fn) {
    for (int i = 0; i < 3; ++i) fn();
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    CHECK_CUDA(cudaEventRecord(a, st));
    for (int i = 0; i < iters; ++i) fn();
    CHECK_CUDA(cudaEventRecord(b, st));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return 1e3 * ms / iters;
  };
  const double rp_us = time_on_stream(separate);
  const double fused_us = time_on_stream([&] { fused_route(false); });
  auto layer = [&](bool fast) {
    if (fast) {
      fused_route(true);
    } else {
      separate();
    }
    const int32_t* row_map = perm.row_of_pair;
    if (use_gemv) {
      CHECK_OK(MoeExpertGemvGateUp<bf16>(x, gate_up, H, I, perm, E, rows, act, st, fast));
      CHECK_OK(MoeExpertGemvDown<bf16>(act, down, H, I, perm, E, rows, eout, st, fast));
    } else if (E > 16) {
      CHECK_OK(MoeGroupedMma<bf16>(x, perm.token_of_row, gate_up, perm.expert_offsets, E, rows,
                                   2 * I, H, gu, st));
      CHECK_OK(MoeSiluAndMul<bf16>(gu, rows, I, act, st));
      CHECK_OK(
          MoeGroupedMma<bf16>(act, nullptr, down, perm.expert_offsets, E, rows, H, I, eout, st));
    } else {
      CHECK_OK(MoePadRows<bf16>(x, H, ids, perm, E, rows, T, xs, padded_rows, st));
      CHECK_OK(grouped.RunPadded(xs, gate_up, E, T, 2 * I, H, gu, bf, st));
      CHECK_OK(MoeSiluAndMul<bf16>(gu, E * T, I, act, st));
      CHECK_OK(grouped.RunPadded(act, down, E, T, H, I, eout, bf, st));
      row_map = padded_rows;
    }
    CHECK_OK(
        MoeCombineSplit<bf16>(eout, weights, row_map, T, k, H, nullptr, nullptr, x, out, st, fast));
  };
  double graph_us[2];
  for (int fast = 0; fast < 2; ++fast) {
    layer(fast != 0);  // outside capture first (cuBLAS workspaces, module loads)
    CHECK_CUDA(cudaStreamSynchronize(st));
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < kGraphLayers; ++l) layer(fast != 0);
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    graph_us[fast] = time_on_stream([&] { CHECK_CUDA(cudaGraphLaunch(exec, st)); }) / kGraphLayers;
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }
  std::printf(" | %6.1f %8.1f %5s %8.1f %10.1f", rp_us, fused_us, same ? "yes" : "NO", graph_us[0],
              graph_us[1]);
  if (use_gemv) {  // the two GEMVs alone, PDL-launched back to back (eager), as the step's
    const double pdl_us = time_on_stream([&] {
      CHECK_OK(MoeExpertGemvGateUp<bf16>(x, gate_up, H, I, perm, E, rows, act, st, true));
      CHECK_OK(MoeExpertGemvDown<bf16>(act, down, H, I, perm, E, rows, eout, st, true));
    });
    std::printf(" | %11.1f", pdl_us);
  }
  CHECK_CUDA(cudaStreamDestroy(st));
}

void Run(const Shape& s, const std::vector<int>& token_counts, int iters, bool with_new, bool wgmma,
         bool variants, cublasHandle_t blas) {
  const int64_t E = s.E, k = s.k, H = s.H, I = s.I;
  const int64_t max_t = *std::max_element(token_counts.begin(), token_counts.end());
  const int64_t max_rows = max_t * k;
  std::mt19937 rng(7);
  auto* gate_up = static_cast<bf16*>(Alloc(E * 2 * I * H * 2));
  auto* down = static_cast<bf16*>(Alloc(E * H * I * 2));
  FillRandom(gate_up, E * 2 * I * H, 0.03f, rng);
  FillRandom(down, E * H * I, 0.03f, rng);
  auto* x = static_cast<bf16*>(Alloc(max_t * H * 2));
  FillRandom(x, max_t * H, 1.0f, rng);
  const int64_t most = std::max(max_rows, E * std::min<int64_t>(max_t, 256));
  auto* xs = static_cast<bf16*>(Alloc(most * H * 2));
  auto* gu = static_cast<bf16*>(Alloc(most * 2 * I * 2));
  auto* act = static_cast<bf16*>(Alloc(most * I * 2));
  auto* eout = static_cast<bf16*>(Alloc(most * H * 2));
  auto* eout_ref = static_cast<bf16*>(Alloc(max_rows * H * 2));
  auto* out_ref = static_cast<bf16*>(Alloc(max_t * H * 2));
  auto* padded_rows = static_cast<int32_t*>(Alloc(max_rows * 4));
  auto* out = static_cast<bf16*>(Alloc(max_t * H * 2));
  auto* logits = static_cast<float*>(Alloc(max_t * E * 4));
  auto* ids = static_cast<int32_t*>(Alloc(max_rows * 4));
  auto* weights = static_cast<float*>(Alloc(max_rows * 4));
  DeviceMoePermutation perm{
      static_cast<int32_t*>(Alloc((E + 1) * 4)), static_cast<int32_t*>(Alloc(E * 4)),
      static_cast<int32_t*>(Alloc(max_rows * 4)), static_cast<int32_t*>(Alloc(max_rows * 4))};
  auto grouped = MoeGroupedGemm::Create(E);
  CHECK_OK(grouped.status());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host_logits(max_t * E);
  for (float& v : host_logits) v = normal(rng);
  CHECK_CUDA(
      cudaMemcpy(logits, host_logits.data(), host_logits.size() * 4, cudaMemcpyHostToDevice));
  GroupedRoutingParams p;
  p.num_experts = E;
  p.top_k = k;
  p.renormalize = true;
  std::printf("\n%s: %ld experts, top-%ld, hidden %ld, expert width %ld (bf16)\n", s.name, E, k, H,
              I);
  std::printf(
      "%6s %6s %8s %9s %10s %10s %8s %7s %7s %9s %7s %8s %7s %8s | %8s %7s %8s %9s %7s %9s\n",
      "tokens", "active", "gemv_ms", "padded_ms", "grouped_ms", "per_exp_ms", "route_us", "perm_us",
      "comb_us", "layer_ms", "TFLOP/s", "dense_TF", "GB/s", "expert_GB", "mma_ms", "mma_TF",
      "mma_err", "csplit_us", "cdiff", "layer_new");
  std::printf(
      "%*s(sm_90: | wg_ms wg_TF wg_err layer_wg | glu_ms glu_TF glu_err layer_glu {| wg2_ms wg2_TF "
      "wg2_err layer2} x 7: the other "
      "producer / schedule pairs)\n",
      150, "");
  std::printf(
      "%*s(T <= 16: | rp_us fused_us fsame g_sep_us g_fused_us; GEMV sizes: | gemv_pdl_us)\n", 150,
      "");
  const auto bf = MoeGroupedGemm::Dtype::kBf16;
  for (int T : token_counts) {
    const int64_t rows = T * k;
    CHECK_OK(MoeRoute(logits, T, p, ids, weights, nullptr));
    CHECK_OK(MoePermute(ids, T, k, E, perm, nullptr, nullptr));
    CHECK_OK((*grouped)->ReadOffsets(perm.expert_offsets, E, nullptr));
    int active = 0;
    for (int64_t e = 0; e < E; ++e) {
      active += (*grouped)->offsets()[e + 1] > (*grouped)->offsets()[e];
    }
    const double flops = 2.0 * rows * (3.0 * I * H);
    const double weight_bytes = active * 3.0 * I * H * 2;
    auto gemv = [&] {
      CHECK_OK(MoeExpertGemvGateUp<bf16>(x, gate_up, H, I, perm, E, rows, act, nullptr));
      CHECK_OK(MoeExpertGemvDown<bf16>(act, down, H, I, perm, E, rows, eout, nullptr));
    };
    auto padded = [&] {
      CHECK_OK(MoePadRows<bf16>(x, H, ids, perm, E, rows, T, xs, padded_rows, nullptr));
      CHECK_OK((*grouped)->RunPadded(xs, gate_up, E, T, 2 * I, H, gu, bf, nullptr));
      CHECK_OK(MoeSiluAndMul<bf16>(gu, E * T, I, act, nullptr));
      CHECK_OK((*grouped)->RunPadded(act, down, E, T, H, I, eout, bf, nullptr));
    };
    auto gemm = [&](MoeGroupedGemm::Mode mode) {
      CHECK_OK(MoeGatherRows<bf16>(x, H, perm.token_of_row, rows, xs, nullptr));
      CHECK_OK((*grouped)->Run(xs, gate_up, 2 * I, H, gu, bf, 0, mode, nullptr));
      CHECK_OK(MoeSiluAndMul<bf16>(gu, rows, I, act, nullptr));
      CHECK_OK((*grouped)->Run(act, down, H, I, eout, bf, 1, mode, nullptr));
    };
    const bool small = T <= 256;
    const double gemv_ms = small ? TimeMs(gemv, iters) : -1.0;
    const double padded_ms = small ? TimeMs(padded, iters) : -1.0;
    const double grouped_ms = TimeMs([&] { gemm(MoeGroupedGemm::Mode::kGrouped); }, iters);
    const double per_ms = TimeMs([&] { gemm(MoeGroupedGemm::Mode::kPerExpert); }, iters);
    auto route = [&] { CHECK_OK(MoeRoute(logits, T, p, ids, weights, nullptr)); };
    auto permute = [&] { CHECK_OK(MoePermute(ids, T, k, E, perm, nullptr, nullptr)); };
    auto combine = [&](const int32_t* row_map) {
      CHECK_OK(
          MoeCombine<bf16>(eout, weights, row_map, T, k, H, nullptr, nullptr, x, out, nullptr));
    };
    const double route_us = 1e3 * TimeMs(route, iters);
    const double perm_us = 1e3 * TimeMs(permute, iters);
    const double comb_us = 1e3 * TimeMs([&] { combine(perm.row_of_pair); }, iters);
    // The layer's own choice of path (cuda_moe_mlp.cc).
    const bool use_gemv = T <= std::max<int64_t>(4, E / k);
    const double layer_ms = TimeMs(
        [&] {
          route();
          permute();
          if (use_gemv) {
            gemv();
          } else if (small) {
            padded();
          } else {
            CHECK_OK((*grouped)->ReadOffsets(perm.expert_offsets, E, nullptr));
            gemm(E <= 16 ? MoeGroupedGemm::Mode::kPerExpert : MoeGroupedGemm::Mode::kGrouped);
          }
          combine(small && !use_gemv ? padded_rows : perm.row_of_pair);
        },
        iters);
    // Dense reference: the same rows through one [rows, H] x [H, 2I] GEMM (the gate_up shape).
    const float one = 1.0f, zero = 0.0f;
    const double dense_ms = TimeMs(
        [&] {
          cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * I),
                       static_cast<int>(rows), static_cast<int>(H), &one, gate_up, CUDA_R_16BF,
                       static_cast<int>(H), xs, CUDA_R_16BF, static_cast<int>(H), &zero, gu,
                       CUDA_R_16BF, static_cast<int>(2 * I), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT);
        },
        iters);
    const double best =
        small ? std::min({gemv_ms, padded_ms, grouped_ms, per_ms}) : std::min(grouped_ms, per_ms);
    std::printf(
        "%6d %6d %8.4f %9.4f %10.4f %10.4f %8.1f %7.1f %7.1f %9.4f %7.1f %8.1f %7.0f %8.3f |", T,
        active, gemv_ms, padded_ms, grouped_ms, per_ms, route_us, perm_us, comb_us, layer_ms,
        flops / best / 1e9, 2.0 * rows * 2 * I * H / dense_ms / 1e9, weight_bytes / best / 1e6,
        weight_bytes / 1e9);
    std::fflush(stdout);
    if (!with_new) {
      std::printf("\n");
      continue;
    }
    // The new kernels: references first (cuBLAS grouped experts, one-block-per-token combine).
    gemm(MoeGroupedGemm::Mode::kGrouped);
    CHECK_CUDA(cudaMemcpy(eout_ref, eout, rows * H * 2, cudaMemcpyDeviceToDevice));
    combine(perm.row_of_pair);
    CHECK_CUDA(cudaMemcpy(out_ref, out, T * H * 2, cudaMemcpyDeviceToDevice));
    // The experts on one grouped kernel (MoeGroupedMma or MoeGroupedWgmma: gate_up with the
    // gather, SiLU * up, down), and its output rows against cuBLAS's.
    auto grouped_experts = [&](auto kernel) {
      CHECK_OK(kernel(x, perm.token_of_row, gate_up, perm.expert_offsets, E, rows, 2 * I, H, gu,
                      nullptr));
      CHECK_OK(MoeSiluAndMul<bf16>(gu, rows, I, act, nullptr));
      CHECK_OK(kernel(act, nullptr, down, perm.expert_offsets, E, rows, H, I, eout, nullptr));
    };
    auto experts_err = [&](const std::function<void()>& experts) {
      CHECK_CUDA(cudaMemset(eout, 0xff, rows * H * 2));  // NaN: rows the kernel misses show
      experts();
      CHECK_CUDA(cudaDeviceSynchronize());
      return RelDiff(eout, eout_ref, rows * H);
    };
    auto mma = [&] { grouped_experts(MoeGroupedMma<bf16>); };
    const double mma_err = experts_err(mma);
    const double mma_ms = TimeMs(mma, iters);
    auto split = [&](const int32_t* row_map) {
      CHECK_OK(MoeCombineSplit<bf16>(eout, weights, row_map, T, k, H, nullptr, nullptr, x, out,
                                     nullptr));
    };
    CHECK_CUDA(cudaMemcpy(eout, eout_ref, rows * H * 2, cudaMemcpyDeviceToDevice));
    split(perm.row_of_pair);
    CHECK_CUDA(cudaDeviceSynchronize());
    const double cdiff = RelDiff(out, out_ref, T * H);
    const double split_us = 1e3 * TimeMs([&] { split(perm.row_of_pair); }, iters);
    const double layer_new_ms = TimeMs(
        [&] {
          route();
          permute();
          if (use_gemv) {
            gemv();
          } else if (E > 16) {
            mma();
          } else if (small) {
            padded();
          } else {
            CHECK_OK((*grouped)->ReadOffsets(perm.expert_offsets, E, nullptr));
            gemm(MoeGroupedGemm::Mode::kPerExpert);
          }
          split(small && !use_gemv && E <= 16 ? padded_rows : perm.row_of_pair);
        },
        iters);
    std::printf(" %8.4f %7.1f %8.1e %9.1f %7.1e %9.4f", mma_ms, flops / mma_ms / 1e9, mma_err,
                split_us, cdiff, layer_new_ms);
    if (wgmma) {  // MoeGroupedWgmma in mma's place: experts alone, its check, the layer
      // One column group: the experts' time, TFLOP/s, check and the layer on them.
      auto report = [&](const std::function<void()>& experts) {
        const double err = experts_err(experts);
        const double ms = TimeMs(experts, iters);
        const double layer_ms = TimeMs(
            [&] {
              route();
              permute();
              experts();
              split(perm.row_of_pair);
            },
            iters);
        std::printf(" | %8.4f %7.1f %8.1e %9.4f", ms, flops / ms / 1e9, err, layer_ms);
      };
      report([&] { grouped_experts(MoeGroupedWgmma<bf16>); });
      // gate_up with SiLU * up in its epilogue (the default producer), then the default down.
      report([&] {
        CHECK_OK(MoeGroupedWgmmaGateUpSilu<bf16>(x, perm.token_of_row, gate_up, perm.expert_offsets,
                                                 E, rows, I, H, act, nullptr));
        CHECK_OK(MoeGroupedWgmma<bf16>(act, nullptr, down, perm.expert_offsets, E, rows, H, I, eout,
                                       nullptr));
      });
      // The other producers (MoeWgmmaProducer) in the same place, in enum order, then the
      // ping-pong and 128 x 256 schedules with the TMA producers; each also in the layer.
      using P = MoeWgmmaProducer;
      constexpr MoeWgmmaSchedule kCoop = MoeWgmmaSchedule::kCooperative;
      constexpr MoeWgmmaSchedule kPp = MoeWgmmaSchedule::kPingPong;
      constexpr MoeWgmmaSchedule kWide = MoeWgmmaSchedule::kCooperative128x256;
      const std::pair<P, MoeWgmmaSchedule> pairs[] = {
          {P::kWaitGroup, kCoop},   {P::kArriveNoinc, kCoop}, {P::kTmaWeights, kCoop},
          {P::kTmaOperands, kCoop}, {P::kTmaWeights, kPp},    {P::kTmaOperands, kPp},
          {P::kTmaWeights, kWide},  {P::kTmaOperands, kWide}};
      for (const auto& [producer, schedule] : pairs) {
        if (!variants) break;
        if (producer == kMoeWgmmaDefaultProducer && schedule == kMoeWgmmaDefaultSchedule) continue;
        report([&, producer = producer, schedule = schedule] {
          grouped_experts([producer, schedule](auto... args) {
            return MoeGroupedWgmmaWith<bf16>(producer, schedule, args...);
          });
        });
      }
    }
    if (T <= 16 && MoeRouteAndPermuteSupported(p, T)) {
      DecodeGraphs(s, T, p, x, gate_up, down, logits, ids, weights, perm, xs, gu, act, eout,
                   padded_rows, out, **grouped, iters);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (void* ptr :
       {static_cast<void*>(gate_up), static_cast<void*>(down), static_cast<void*>(x),
        static_cast<void*>(xs), static_cast<void*>(gu), static_cast<void*>(act),
        static_cast<void*>(eout), static_cast<void*>(out), static_cast<void*>(logits),
        static_cast<void*>(eout_ref), static_cast<void*>(out_ref), static_cast<void*>(ids),
        static_cast<void*>(weights), static_cast<void*>(perm.expert_offsets),
        static_cast<void*>(perm.active_experts), static_cast<void*>(perm.token_of_row),
        static_cast<void*>(perm.row_of_pair), static_cast<void*>(padded_rows)}) {
    cudaFree(ptr);
  }
}

int Main(int argc, char** argv) {
  std::vector<int> tokens = {1, 16, 128, 1024, 8192};
  int iters = 20;
  bool with_new = true, variants = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokens=", 9) == 0) {
      tokens.clear();
      for (const char* q = argv[i] + 9; *q != '\0';) {
        tokens.push_back(std::atoi(q));
        const char* comma = std::strchr(q, ',');
        if (comma == nullptr) break;
        q = comma + 1;
      }
    }
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
    if (std::strncmp(argv[i], "--new=", 6) == 0) with_new = std::atoi(argv[i] + 6) != 0;
    if (std::strncmp(argv[i], "--variants=", 11) == 0) variants = std::atoi(argv[i] + 11) != 0;
  }
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  CHECK_OK(MoeGroupedMmaInit());  // before the decode graphs' capture
  CHECK_OK(MoeGroupedWgmmaInit());
  const bool wgmma = with_new && MoeGroupedWgmmaSupported(nullptr, nullptr, 8, 8);
  std::printf(
      "gemv / grouped / per_exp: the experts only (grouped and per-expert include the "
      "gather); layer: route + permute + experts + combine; TFLOP/s and GB/s of the best "
      "experts time; dense_TF: one cublasGemmEx of rows x 2I x H\n");
  Run({"Qwen3-30B-A3B", 128, 8, 2048, 768}, tokens, iters, with_new, wgmma, variants, blas);
  Run({"Mixtral-8x7B", 8, 2, 4096, 14336}, tokens, iters, with_new, wgmma, variants, blas);
  cublasDestroy(blas);
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
