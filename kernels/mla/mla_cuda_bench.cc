// MLA decode bandwidth on the first CUDA device, DeepSeek-V3 shape: 128 heads, latent 512 + 64,
// nope 128, v 128, bf16, page 64 (--page), q_len 1; batch x context table.
//   mla_cuda_bench [--batches=1,16,64,128] [--contexts=1024,4096,16384,32768] [--splits=N]
//                  [--plan_len=N]  (plan for max_seq_len max(N, context), as serving's CUDA-graph
//                                   plans do for max_model_len; the requests stay at the context)
//                  [--heads=128]   (16: DeepSeek-V2-Lite, or V3 at TP 8: memory-bound)
//                  [--page=64]     (latents a block; the serving runtime's default is 16)
//                  [--wgmma=0|1]   (the Hopper kernel or the mma.sync one; default: the plan's)
//                  [--tma=0|1]     (the Hopper kernel's TMA variant or its cp.async one; default 1)
//                  [--schedule=0|1|2|3] (the TMA variant's warpgroup schedule, MlaTmaSchedule:
//                                   0 serial, 1 hand-off, 2 seesaw, 3 rows16 (mma.sync, <= 16
//                                   rows; more heads run serial); default: MlaPlanInput's)
//                  [--merge=0|1]   (1, the default: the workspace's merge tickets zeroed once,
//                                   MlaPlanInput::workspace_zeroed, so the TMA kernel merges its
//                                   own splits; 0: MergeAttnStatesN + ConvertFromF32 launches)
//                  [--prefetch=N]  (the TMA kernel's L2 prefetch of the latents of the next N
//                                   tiles, MlaPlanInput::tma_l2_prefetch_tiles; default 0: off)
//                  [--graph=0|1]   (the CUDA-graph timing; default 1; 0 prints 0 there: for ncu and
//                                   compute-sanitizer runs)
//                  [--prewait=0|1] (kRows16: MlaPlanInput::prewait, the PDL launch with its
//                                   prologue before griddepcontrol.wait; default 0)
//                  [--cluster_merge=0|1] (kRows16: MlaPlanInput::cluster_merge, the splits
//                                   merged through a thread-block cluster and DSMEM; default 0;
//                                   the splits column shows "c" where the plan took it)
//                  [--phases=0|1]  (after each cell's timings: two more calls captured in one
//                                   graph, each with MlaPlanInput::phase_stamps; the second's
//                                   per-phase table, mla_phase_stamps.h; TMA kernels only)
//                  [--fp8=1]       (an FP8 latent pool: e4m3 codes + one fp32 scale per row,
//                                   planar; bytes counted as 576 + 4 per latent; --wgmma=1: the
//                                   Hopper FP8 kernel, mla_decode_fp8.cu, or with --schedule=3
//                                   kRows16's FP8 kernel, mla_decode_rows16_fp8.cu; 0: plain)
// For each config: the latent attention (MlaLatentAttention: the tensor-core kernel + split
// merge) and the whole absorbed step (MlaAbsorbedAttention: + the W_UK / W_UV GEMMs), mean of
// 20 eager calls between CUDA events after 3 warm-ups; and the latent attention as serving runs
// it, 20 calls captured in one CUDA graph, mean per call over 5 replays after one ("graph us",
// its TB/s and %4.6 beside it). TB/s counts the latent bytes read once per
// request (context x 576 x 2 bytes) over the attention time; "%4.6" is against 4.6 TB/s (the
// H200's usable HBM bandwidth). Small configs cycle through up to 16 block-table sets over a
// pool >= 2 GiB, so repeated calls do not run from the 60 MB L2. Prints a table; no pass/fail.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "kernels/cuda/graph_timing.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_phase_stamps.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

constexpr double kPeak = 4.6e12;
constexpr const char* kScheduleNames[] = {"wgmma-tma", "wgmma-tma-handoff", "wgmma-tma-seesaw",
                                          "tma-rows16-mma"};

struct Bufs {
  MlaDims dims = mla_test::kV3Dims;
  void* pool = nullptr;
  KvCacheLayout layout;
  __nv_bfloat16 *q = nullptr, *kv_b = nullptr, *out = nullptr, *q_cat = nullptr, *o_lat = nullptr;
  float* lse = nullptr;
  int32_t *qsl = nullptr, *lens = nullptr, *tables = nullptr;
  void* ws = nullptr;
  cublasHandle_t cublas = nullptr;
  bool wgmma = MlaPlanInput{}.allow_wgmma;
  bool tma = MlaPlanInput{}.allow_tma;
  MlaTmaSchedule schedule = MlaPlanInput{}.tma_schedule;
  bool graph = true;
  int prefetch = 0;             // MlaPlanInput::tma_l2_prefetch_tiles
  bool merge = true;            // MlaPlanInput::workspace_zeroed (the in-kernel split merge)
  bool prewait = false;         // MlaPlanInput::prewait
  bool cluster_merge = false;   // MlaPlanInput::cluster_merge
  bool phases = false;          // --phases=1: the phase-stamp table per cell
  float* fp8_scales = nullptr;  // non-null: the pool is read as FP8 codes with these row scales
  int64_t page = 64;            // --page: latents a block (the runtime's default is 16)
};

// Mean us per call of call(i) (i = 0, 1, ...: which block-table set), eager: 20 calls between
// CUDA events after 3 warm-ups.
template <typename Call>
absl::StatusOr<double> EagerUs(Call&& call, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(call(i));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  constexpr int kIters = 20;
  cudaEventRecord(e0, stream);
  for (int i = 0; i < kIters; ++i) RETURN_IF_ERROR(call(i));
  cudaEventRecord(e1, stream);
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3 / kIters;
}

// The plan of one config: max_seq_len the context, or plan_len where that is longer.
absl::StatusOr<MlaPlan> BenchPlan(const Bufs& b, int64_t batch, int64_t ctx, int splits,
                                  int64_t plan_len) {
  return PlanMla({.dims = b.dims,
                  .num_seqs = batch,
                  .num_tokens = batch,
                  .max_q_len = 1,
                  .max_seq_len = std::max(ctx, plan_len),
                  .num_splits = splits,
                  .allow_wgmma = b.wgmma,
                  .allow_tma = b.tma,
                  .tma_schedule = b.schedule,
                  .workspace_zeroed = b.merge,
                  .tma_l2_prefetch_tiles = b.prefetch,
                  .prewait = b.prewait,
                  .cluster_merge = b.cluster_merge});
}

// min / median / max of v (empty: zeros).
struct Spread {
  double lo = 0, med = 0, hi = 0;
  int n = 0;
};
Spread SpreadOf(std::vector<double> v) {
  Spread r;
  r.n = static_cast<int>(v.size());
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  r.lo = v.front();
  r.med = v[v.size() / 2];
  r.hi = v.back();
  return r;
}

// The phase-stamp table of one call (h: its stamps, kMlaStampWords a CTA); prev_last_ns: the
// latest stamp of the call before it in the same graph (0: none). sm_khz: the clock clock64 is
// converted with.
void PrintPhases(const std::vector<unsigned long long>& h, int64_t ctas, double sm_khz,
                 unsigned long long prev_last_ns) {
  unsigned long long t0 = ~0ull;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long e = h[c * kMlaStampWords + kMlaPhaseEntry];
    if (e != 0) t0 = std::min(t0, e);
  }
  if (t0 == ~0ull) {
    std::printf("  (no stamps: not a TMA kernel)\n");
    return;
  }
  std::printf(
      "  phases of the 2nd of 2 graph-captured calls, %ld CTAs; t = %%globaltimer - the "
      "earliest CTA entry (us); d = clock64 since the CTA's own entry (us at %.0f MHz)\n",
      static_cast<long>(ctas), sm_khz / 1e3);
  if (prev_last_ns != 0) {
    std::printf("  gap: the previous call's last stamp -> this call's first entry: %.2f us\n",
                (static_cast<double>(t0) - static_cast<double>(prev_last_ns)) / 1e3);
  }
  std::printf("  | phase | CTAs | t min | t med | t max | d min | d med | d max |\n");
  for (int ph = 0; ph < kMlaPhases; ++ph) {
    std::vector<double> t, d;
    for (int64_t c = 0; c < ctas; ++c) {
      const unsigned long long* w = h.data() + c * kMlaStampWords;
      if (w[ph] == 0 || w[kMlaPhaseEntry] == 0) continue;
      t.push_back((static_cast<double>(w[ph]) - static_cast<double>(t0)) / 1e3);
      d.push_back(static_cast<double>(w[kMlaPhases + ph] - w[kMlaPhases + kMlaPhaseEntry]) /
                  sm_khz * 1e3);
    }
    const Spread a = SpreadOf(t), e = SpreadOf(d);
    std::printf("  | %-14s | %4d | %6.2f | %6.2f | %6.2f | %6.2f | %6.2f | %6.2f |\n",
                kMlaPhaseNames[ph], a.n, a.lo, a.med, a.hi, e.lo, e.med, e.hi);
  }
  std::vector<double> merge, wait, clock_mhz, m_lse, m_weights, m_rows;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long* w = h.data() + c * kMlaStampWords;
    const unsigned long long* ck = w + kMlaPhases;
    if (w[kMlaStampTicket] == 2 && w[kMlaPhaseMergeDone] != 0) {
      merge.push_back(static_cast<double>(ck[kMlaPhaseMergeDone] - ck[kMlaPhaseTicket]) / sm_khz *
                      1e3);
      wait.push_back(static_cast<double>(ck[kMlaPhaseTicket] - ck[kMlaPhaseStored]) / sm_khz * 1e3);
      const unsigned long long lse_ck = w[kMlaStampMergeLse], wt_ck = w[kMlaStampMergeWeights];
      if (lse_ck != 0 && wt_ck != 0) {  // the merge's own phases (clock64)
        m_lse.push_back(static_cast<double>(lse_ck - ck[kMlaPhaseTicket]) / sm_khz * 1e3);
        m_weights.push_back(static_cast<double>(wt_ck - lse_ck) / sm_khz * 1e3);
        m_rows.push_back(static_cast<double>(ck[kMlaPhaseMergeDone] - wt_ck) / sm_khz * 1e3);
      }
    }
    int last = kMlaPhases - 1;
    while (last > 0 && w[last] == 0) --last;
    if (w[kMlaPhaseEntry] != 0 && w[last] > w[kMlaPhaseEntry]) {
      clock_mhz.push_back(static_cast<double>(ck[last] - ck[kMlaPhaseEntry]) * 1e3 /
                          static_cast<double>(w[last] - w[kMlaPhaseEntry]));
    }
  }
  const Spread m = SpreadOf(merge), wt = SpreadOf(wait), mhz = SpreadOf(clock_mhz);
  std::printf(
      "  mergers (ticket won): %d; merge (ticket -> merge done, clock64) min / med / max "
      "%.2f / %.2f / %.2f us; stored -> ticket %.2f / %.2f / %.2f us\n",
      m.n, m.lo, m.med, m.hi, wt.lo, wt.med, wt.hi);
  const Spread ml = SpreadOf(m_lse), mw = SpreadOf(m_weights), mr = SpreadOf(m_rows);
  std::printf(
      "  merge phases (median us): LSEs staged %.2f, weights %.2f, weighted rows + stores %.2f\n",
      ml.med, mw.med, mr.med);
  std::printf(
      "  SM clock measured (clock64 / globaltimer over each CTA): min / med / max %.0f / "
      "%.0f / %.0f MHz\n",
      mhz.lo, mhz.med, mhz.hi);
}

// --phases=1: two calls captured in one graph (as CapturedCallsUs's), each writing phase stamps;
// the second's table.
template <typename Attn>
absl::Status PhaseRun(const MlaPlan& plan, int64_t batch, Attn&& attn, cudaStream_t stream) {
  const int64_t ctas = int64_t{plan.num_splits} * plan.row_tiles * batch;
  const int64_t words = ctas * kMlaStampWords;
  unsigned long long* st = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&st, 2 * words * 8));
  CUDA_RETURN_IF_ERROR(cudaMemset(st, 0, 2 * words * 8));
  MlaPlan p0 = plan, p1 = plan;
  p0.input.phase_stamps = st;
  p1.input.phase_stamps = st + words;
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  absl::Status s = attn(p0, 0);
  if (s.ok()) s = attn(p1, 1);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  RETURN_IF_ERROR(s);
  CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec = nullptr;
  CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));  // warm-up, then the stamped replay
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  CUDA_RETURN_IF_ERROR(cudaMemset(st, 0, 2 * words * 8));
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<unsigned long long> h(2 * words);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), st, 2 * words * 8, cudaMemcpyDeviceToHost));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(st);
  unsigned long long prev_last = 0;
  for (int64_t i = 0; i < words; ++i) {
    if (i % kMlaStampWords < kMlaPhases) prev_last = std::max(prev_last, h[i]);
  }
  int khz = 0;  // cudaDevAttrClockRate: the SM's peak (boost) clock in kHz
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  std::printf("  (clock64 converted at cudaDevAttrClockRate = %d kHz, the peak SM clock)\n", khz);
  PrintPhases(std::vector<unsigned long long>(h.begin() + words, h.end()), ctas, khz, prev_last);
  return absl::OkStatus();
}

absl::Status RunConfig(Bufs& b, int64_t batch, int64_t ctx, int splits, int64_t plan_len,
                       cudaStream_t stream) {
  const int64_t blocks_per_seq = (ctx + b.page - 1) / b.page;
  const int64_t set_blocks = batch * blocks_per_seq;
  const int sets = static_cast<int>(std::clamp<int64_t>(b.layout.num_blocks / set_blocks, 1, 16));
  std::vector<int32_t> ids(b.layout.num_blocks), tables(sets * set_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::copy_n(ids.begin(), tables.size(), tables.begin());
  std::vector<int32_t> qsl(batch + 1), lens(batch, static_cast<int32_t>(ctx));
  std::iota(qsl.begin(), qsl.end(), 0);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.tables, tables.data(), tables.size() * 4, cudaMemcpyDefault));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.qsl, qsl.data(), qsl.size() * 4, cudaMemcpyDefault));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(b.lens, lens.data(), lens.size() * 4, cudaMemcpyDefault));
  ASSIGN_OR_RETURN(const MlaPlan plan, BenchPlan(b, batch, ctx, splits, plan_len));
  DeviceKvCache cache{b.pool, b.layout, KvDtype::kBf16};
  if (b.fp8_scales != nullptr) {
    cache.dtype = KvDtype::kFp8E4m3;
    cache.token_scales = b.fp8_scales;
  }
  const float scale = 1.0f / std::sqrt(192.0f);
  auto batch_of = [&](int i) {
    return AttentionBatch{b.qsl, b.lens, b.tables + (i % sets) * set_blocks, batch, blocks_per_seq};
  };
  auto attn = [&](int i) {
    return MlaLatentAttention<__nv_bfloat16>(b.q_cat, cache, 0, batch_of(i), scale, plan, b.ws,
                                             b.o_lat, b.lse, stream);
  };
  ASSIGN_OR_RETURN(const double attn_us, EagerUs(attn, stream));
  double graph_us = 0.0;
  if (b.graph) {
    ASSIGN_OR_RETURN(graph_us, CapturedCallsUs(attn, stream));  // as serving replays decode
  }
  auto step = [&](int i) {
    return MlaAbsorbedAttention<__nv_bfloat16>(b.cublas, b.q, b.kv_b, cache, 0, batch_of(i), scale,
                                               plan, b.ws, b.out, b.lse, stream);
  };
  ASSIGN_OR_RETURN(const double step_us, EagerUs(step, stream));
  auto stamped = [&](const MlaPlan& pl, int i) {
    return MlaLatentAttention<__nv_bfloat16>(b.q_cat, cache, 0, batch_of(i), scale, pl, b.ws,
                                             b.o_lat, b.lse, stream);
  };
  const double bytes = double(batch) * ctx *
                       (b.fp8_scales != nullptr ? b.dims.LatentDim() + 4 : b.dims.LatentDim() * 2);
  const double flops = double(batch) * ctx * b.dims.num_heads * 2 * (576 + 512);
  std::printf(
      "| %5ld | %6ld | %3d%s | %9.1f | %6.2f | %4.0f%% | %6.0f | %9.1f | %6.2f | %4.0f%% | %9.1f "
      "|\n",
      static_cast<long>(batch), static_cast<long>(ctx), plan.num_splits,
      plan.cluster_merge ? "c" : "", attn_us, bytes / attn_us / 1e6,
      100.0 * bytes / attn_us / 1e6 / (kPeak / 1e12), flops / attn_us / 1e6, graph_us,
      bytes / graph_us / 1e6, 100.0 * bytes / graph_us / 1e6 / (kPeak / 1e12), step_us);
  if (b.phases) RETURN_IF_ERROR(PhaseRun(plan, batch, stamped, stream));
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  const char* batches_arg = nullptr;
  const char* contexts_arg = nullptr;
  int splits = 0, heads = 128;
  int64_t plan_len = 0;
  bool wgmma = MlaPlanInput{}.allow_wgmma, tma = MlaPlanInput{}.allow_tma, fp8 = false;
  MlaTmaSchedule schedule = MlaPlanInput{}.tma_schedule;
  bool graph = true, merge = true, prewait = false, phases = false, cluster_merge = false;
  int prefetch = 0;
  int64_t page = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--batches=", 0) == 0) batches_arg = argv[i] + 10;
    if (a.rfind("--contexts=", 0) == 0) contexts_arg = argv[i] + 11;
    if (a.rfind("--splits=", 0) == 0) splits = std::atoi(argv[i] + 9);
    if (a.rfind("--plan_len=", 0) == 0) plan_len = std::atoll(argv[i] + 11);
    if (a.rfind("--heads=", 0) == 0) heads = std::atoi(argv[i] + 8);
    if (a.rfind("--wgmma=", 0) == 0) wgmma = std::atoi(argv[i] + 8) != 0;
    if (a.rfind("--tma=", 0) == 0) tma = std::atoi(argv[i] + 6) != 0;
    if (a.rfind("--fp8=", 0) == 0) fp8 = std::atoi(argv[i] + 6) != 0;
    if (a.rfind("--schedule=", 0) == 0) {
      schedule = static_cast<MlaTmaSchedule>(std::clamp(std::atoi(argv[i] + 11), 0, 3));
    }
    if (a.rfind("--graph=", 0) == 0) graph = std::atoi(argv[i] + 8) != 0;
    if (a.rfind("--merge=", 0) == 0) merge = std::atoi(argv[i] + 8) != 0;
    if (a.rfind("--prefetch=", 0) == 0) prefetch = std::atoi(argv[i] + 11);
    if (a.rfind("--prewait=", 0) == 0) prewait = std::atoi(argv[i] + 10) != 0;
    if (a.rfind("--cluster_merge=", 0) == 0) cluster_merge = std::atoi(argv[i] + 16) != 0;
    if (a.rfind("--phases=", 0) == 0) phases = std::atoi(argv[i] + 9) != 0;
    if (a.rfind("--page=", 0) == 0) page = std::max(1, std::atoi(argv[i] + 7));
  }
  const std::vector<int64_t> batches = mla_test::ParseInt64List(batches_arg, {1, 16, 64, 128});
  const std::vector<int64_t> contexts =
      mla_test::ParseInt64List(contexts_arg, {1024, 4096, 16384, 32768});
  const int64_t max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t max_c = *std::max_element(contexts.begin(), contexts.end());
  Bufs b;
  b.dims.num_heads = heads;
  b.wgmma = wgmma;
  b.tma = tma;
  b.schedule = schedule;
  b.graph = graph;
  b.merge = merge;
  b.prefetch = prefetch;
  b.prewait = prewait;
  b.phases = phases;
  b.cluster_merge = cluster_merge;
  b.page = page;
  const int64_t kBlock = page;
  const int64_t block_bytes = kBlock * b.dims.LatentDim() * 2;
  const int64_t pool_bytes =
      std::max<int64_t>(int64_t{2} << 30, max_b * ((max_c + kBlock - 1) / kBlock) * block_bytes);
  b.layout = {.num_blocks = pool_bytes / block_bytes,
              .num_layers = 1,
              .block_size = kBlock,
              .num_kv_heads = 1,
              .head_dim = b.dims.LatentDim(),
              .num_planes = 1};
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.pool, b.layout.num_blocks * block_bytes));
  RETURN_IF_ERROR(FillRandomBf16(b.pool, b.layout.num_blocks * block_bytes));
  if (fp8) {  // the pool's first bytes as e4m3 codes, every row scale 0.75 (0x3f3f3f3f)
    CUDA_RETURN_IF_ERROR(cudaMalloc(&b.fp8_scales, b.layout.num_blocks * kBlock * 4));
    CUDA_RETURN_IF_ERROR(cudaMemset(b.fp8_scales, 0x3f, b.layout.num_blocks * kBlock * 4));
  }
  const int64_t H = b.dims.num_heads, kvb = H * 256 * 512;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.q, max_b * H * 192 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.kv_b, kvb * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.out, max_b * H * 128 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.q_cat, max_b * H * 576 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.o_lat, max_b * H * 512 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.lse, max_b * H * 4));
  RETURN_IF_ERROR(FillRandomBf16(b.q, max_b * H * 192 * 2));
  RETURN_IF_ERROR(FillRandomBf16(b.kv_b, kvb * 2));
  RETURN_IF_ERROR(FillRandomBf16(b.q_cat, max_b * H * 576 * 2));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.qsl, (max_b + 1) * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.lens, max_b * 4));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.tables, b.layout.num_blocks * 4));
  // Workspace for the largest plan (more splits only at small batches: bound by 128 x rows).
  const int64_t ws_bytes = int64_t{1} << 30;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&b.ws, ws_bytes));
  CUDA_RETURN_IF_ERROR(cudaMemset(b.ws, 0, kMlaMergeCounterBytes));  // the merge tickets
  if (cublasCreate(&b.cublas) != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublas");
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "MLA decode, %s: %d heads, latent 512+64, %s, page %ld, q_len 1, %s kernel, plan_len %ld, "
      "split merge %s, L2 prefetch %d tiles, prewait (PDL) %d, cluster merge %d\n",
      prop.name, heads, fp8 ? "fp8 e4m3 pool" : "bf16", static_cast<long>(kBlock),
      fp8 ? (!wgmma ? "plain (FP8)"
             : tma && schedule == MlaTmaSchedule::kRows16
                 ? "tma-rows16-fp8 (codes on the fp16 mma)"
                 : "wgmma-fp8 (codes dequantized in shared memory)")
          : (wgmma ? (tma ? kScheduleNames[static_cast<int>(schedule)] : "wgmma") : "mma.sync"),
      static_cast<long>(plan_len), merge ? "in-kernel (where the TMA kernel runs)" : "separate",
      prefetch, prewait ? 1 : 0, cluster_merge ? 1 : 0);
  std::printf(
      "| batch | ctx | splits | attn us | TB/s | %%4.6 | TFLOP/s | graph us | TB/s | %%4.6 | step "
      "us |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int64_t bt : batches) {
    for (int64_t c : contexts) {
      ASSIGN_OR_RETURN(const MlaPlan plan, BenchPlan(b, bt, c, splits, plan_len));
      if (plan.workspace_bytes > ws_bytes) return absl::InternalError("workspace too small");
      RETURN_IF_ERROR(RunConfig(b, bt, c, splits, plan_len, stream));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) {
  const absl::Status s = tandem::kernels::cuda::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "mla_cuda_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
