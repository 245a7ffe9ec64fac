// PlanMla (mla_cuda.h): the latent kernels' split-KV plan (how many CTAs a request's context
// spreads over, the kernel schedule, the in-kernel and cluster merges, the workspace), host code.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/cluster_merge.cuh"  // kMaxClusterMergeSplits
#include "kernels/attention/dcp_shard.h"
#include "kernels/mla/mla_attention.h"  // kMlaAbsorbMaxQueryLen
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kL = mla_internal::kTensorCoreL, kD = mla_internal::kTensorCoreD;
constexpr int kRows = mla_internal::kTensorCoreRows;  // the wgmma / mma.sync kernels' row tile
constexpr int kMaxLPerLane = mla_internal::kPlainMaxLPerLane;
constexpr int kMaxDPerLane = mla_internal::kPlainMaxDPerLane;

// The split-KV plan. Every latent kernel splits each (request, row tile)'s own context into
// num_splits chunks of SplitChunk(keys, num_splits) latents (mla_cuda_internal.cuh), so the plan
// fixes only a CTA count: sized here for the bound max_seq_len, a shorter request fills fewer
// CTAs with chunks of >= 64 latents, and a plan for a CUDA graph's max_model_len still spreads a
// short request's context over as many SMs as it has 64-latent tiles.
constexpr int64_t kMaxSplits = 256;
// A CTA's fixed work (its launch, the Q rows, the pipeline's fill before the first tile's math:
// about two 64-latent tiles), and the merge's launch and LSE pass, in latent reads of one SM.
constexpr double kCtaLatents = 128, kMergeLatents = 128;
// The least latents of a planned split (forced counts: kSplitAlign). Measured on an H200
// (nvidia-h200, mla_cuda_bench, 16 heads, 2026-11-29): splits of 64 latents were no faster than
// 512 at 1k (batch 1: 16 x 64 33.7 us, 2 x 512 34.8; batch 8: 36.2 vs 35.6) and half as fast at
// 4k (batch 1: 64 x 64 83.5 us, 8 x 512 41.5): a CTA's fixed cost and its fp32 partial dominate
// short splits. With per-request chunks a plan for a long bound (a CUDA graph's max_model_len)
// then runs a short request on ceil(len / 512) CTAs, not on one.
constexpr int kSplitMinLatents = 512;
// Where the TMA kernel merges its own splits (MlaPlan::merge_in_kernel) the separate merge's
// launch and serial LSE pass are gone, and shorter splits pay: measured on an H200 (nvidia-h200,
// mla_cuda_bench --merge=1 --splits=N, 16 heads, 2026-11-29, graph us): batch 1 at 1k 2 / 4 / 8 /
// 16 splits 33.8 / 24.4 / 19.7 / 21.3, at 4k 8 / 16 splits 34.3 / 29.7; batch 8 at 1k 8 splits
// 21.3 (2: 34.8), at 4k 16 splits 31.0 (8: 35.7). So 128-latent splits, at most 16 (the last CTA
// reads every split's fp32 partial back alone). Only for row tiles of <= 16 rows: at 128 heads
// (64-row tiles) the merging CTA's serial partial loads made the in-kernel merge slower (batch 1
// at 1k 48.5 vs 31.8 us with the separate merge), so 64-row tiles keep the separate merge.
constexpr int kSplitMinLatentsInKernel = 128;
// Full 64-row tiles whose splits the separate merge sums (128 heads: DeepSeek-V3 under
// --dp_attention) since the split merge (MergeF32AttnStatesN) runs CTAs per row for many partials:
// measured on an H200 (nvidia-h200, mla_cuda_bench --heads=128 --page=16 --merge=0 --splits=N,
// batch 1, graph us): 8k at 32 / 43 / 64 splits 27.7 / 27.0 / 29.5, 16k 39.0 / 35.3 / 34.7, 32k 32
// / 47 / 64 splits 61.3 / 50.3 / 46.6, 64k 47 / 64 / 94 79.5 / 67.6 / 106.9 (two waves); about 8.9
// us + 44 ns a latent of the chunk + 0.23 us a split. So splits of >= 128 latents, and a CTA's
// partial weighs kSeparateMergeWeight x its bytes in the model (the merge reads it back and the
// CTAs' stores meet at HBM at once; 1x fitted 64 splits at 8k, the measured optimum is ~43).
constexpr int kSplitMinLatentsSeparate = 128;
constexpr double kSeparateMergeWeight = 3.0;
constexpr int64_t kMaxSplitsInKernel = 16;
constexpr int64_t kMergeInKernelMaxRows = 16;
constexpr int64_t kShortSplitGroups = 8, kShortSplitCtas = 64;
constexpr int64_t kRows16TileRows = 16;  // mla_decode_rows16.cu's row tile

// How many of `splits` CTAs a context of ctx latents fills: chunks of SplitChunk(ctx, splits).
int64_t SplitsFilled(int64_t ctx, int64_t splits, int min_chunk) {
  const int64_t chunk =
      mla_internal::SplitChunk(static_cast<int>(ctx), static_cast<int>(splits), min_chunk);
  return std::max<int64_t>(1, (ctx + chunk - 1) / chunk);
}

// Splits per (request, row tile) of the tensor-core kernels (one CTA per SM, `ctas` of them per
// split): the fewest that minimize the modelled time (a larger count only where it gains 2%),
// in one SM's latent reads (D x 2 bytes),
//   waves x (chunk + kCtaLatents + partial) + kMergeLatents + filled x ctas x partial / SMs
// (unsplit: waves x (ctx + kCtaLatents)), where filled = SplitsFilled(ctx, s), chunk =
// SplitChunk(ctx, s), waves = ceil(ctas x filled / SMs), partial = a CTA's fp32 rows out in
// latent reads (rows_tile x L x 4 bytes; the merge reads them back spread over all SMs).
// w = merge_weight: 1, or kSeparateMergeWeight for full tiles merged by the separate kernel.
// With 512-latent splits, V2-Lite without the in-kernel merge (16 heads, 16 rows a tile: partial
// ~28): batch 1 at 1k -> 2, at 32k -> 64; batch 8 at 32k -> 16; batch 64 at 4k -> 2. V3 (128
// heads, 2 tiles of 64 rows: partial ~114, w 3, >= 128 latents): batch 1 at 4k -> 22, at 16k ->
// 43, at >= 32k -> 64 (one wave); batch 4 -> 16; 16 requests at 4k -> 4 (one wave; 8 would run
// two); 64 at 32k -> 1.
int64_t SplitsForWaves(int64_t ctas, int64_t rows_tile, const MlaDims& dims, int num_sms,
                       int64_t ctx, int64_t max_splits, int min_chunk, double merge_weight) {
  ctas = std::max<int64_t>(ctas, 1);
  const double partial =
      static_cast<double>(rows_tile * dims.kv_lora_rank * 4) / (dims.LatentDim() * 2);
  auto cost = [&](int64_t s) {
    const int64_t filled = SplitsFilled(ctx, s, min_chunk);
    const double waves = static_cast<double>((ctas * filled + num_sms - 1) / num_sms);
    if (filled == 1) return waves * (static_cast<double>(ctx) + kCtaLatents);
    const double chunk =
        mla_internal::SplitChunk(static_cast<int>(ctx), static_cast<int>(s), min_chunk);
    return waves * (chunk + kCtaLatents + partial) + kMergeLatents +
           merge_weight * static_cast<double>(filled * ctas) * partial / num_sms;
  };
  int64_t best = 1;
  double best_cost = cost(1);
  for (int64_t s = 2; s <= max_splits; ++s) {
    const double c = cost(s);
    if (c < best_cost * 0.98) {  // more splits only for a clear gain (fewer partials)
      best = s;
      best_cost = c;
    }
  }
  return best;
}

// MlaPlanInput::cluster_merge where it is valid: kRows16 (its TMA kernel), one cluster of
// num_splits CTAs a group (2 .. kMaxClusterMergeSplits: 8 is the portable cluster size, 16 needs
// the non-portable attribute), room on the device for one such cluster (a device query, only when
// asked). Short requests' CTAs past their filled splits hold empty splits in the cluster. Sets
// plan.cluster_merge, or plan.cluster_merge_fallback (why not) where it was asked.
using internal::kMaxClusterMergeSplits;  // the largest cluster the merge takes
void TakeClusterMerge(MlaPlan& plan) {
  if (!plan.input.cluster_merge) return;
  if (!plan.use_tma || plan.tma_schedule != MlaTmaSchedule::kRows16) {
    plan.cluster_merge_fallback = "not the kRows16 kernel";
  } else if (plan.num_splits < 2 || plan.num_splits > kMaxClusterMergeSplits) {
    plan.cluster_merge_fallback = "splits not in 2..16";
  } else if (const int fit = mla_internal::MlaRows16MaxActiveClusters(plan.num_splits); fit <= 0) {
    plan.cluster_merge_fallback = "no room for the cluster (cudaOccupancyMaxActiveClusters)";
  } else if (plan.input.cluster_merge_one_wave && plan.input.num_seqs * plan.row_tiles > fit) {
    // More clusters than fit at once run in a second wave (measured: 16 x 4k, 8-CTA clusters,
    // 33.5 -> 50.0 us; BENCHMARKS.md, sixteenth session): the ticket merge is faster there.
    plan.cluster_merge_fallback = "more clusters than fit at once (one wave only)";
  } else {
    plan.cluster_merge = true;
  }
}

}  // namespace

absl::StatusOr<MlaPlan> PlanMla(const MlaPlanInput& in) {
  RETURN_IF_ERROR(in.dims.Validate());
  const int64_t L = in.dims.kv_lora_rank, D = in.dims.LatentDim(), H = in.dims.num_heads;
  if (D % 8 != 0 || L % 4 != 0 || L > 32 * kMaxLPerLane || D > 32 * kMaxDPerLane) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanMla: latent ", L, " + ", in.dims.qk_rope_head_dim,
        " unsupported (L a multiple of 4 up to 1024, L + Dr a multiple of 8 up to 1152)"));
  }
  if (in.num_seqs < 0 || in.num_tokens < 0 || in.max_q_len < 1 || in.max_seq_len < 0 ||
      in.max_seq_len > (int64_t{1} << 30) || in.num_tokens > (int64_t{1} << 24) ||
      in.num_splits < 0 || in.num_sms < 1) {
    return absl::InvalidArgumentError("PlanMla: negative or out-of-range bounds");
  }
  if (!DcpShardValid(in.dcp)) {
    return absl::InvalidArgumentError(absl::StrCat("PlanMla: invalid DCP shard (size ", in.dcp.size,
                                                   ", rank ", in.dcp.rank, ", interleave ",
                                                   in.dcp.interleave, ")"));
  }
  MlaPlan plan;
  plan.input = in;
  plan.use_mma = L == kL && D == kD;
  plan.use_wgmma = plan.use_mma && in.allow_wgmma;
  plan.use_tma = plan.use_wgmma && in.allow_tma;
  if (plan.use_tma) plan.tma_schedule = in.tma_schedule;
  const int64_t ctx = std::max<int64_t>(in.max_seq_len, 1);
  const int64_t seqs = std::max<int64_t>(in.num_seqs, 1);
  // rows16_small_batches: kRows16 for <= 16 heads, <= rows16_max_requests requests and decode /
  // verification rows (max_q_len <= kMlaAbsorbMaxQueryLen: a verify pass's tokens in 16-row tiles,
  // so a token's rows run the same kernel as in a one-token step). A step with a prefill chunk
  // among its requests keeps kSerial: kRows16's grid has a 16-row tile per max_q_len x heads rows
  // of every request, 4x kSerial's (measured: served V2-Lite at concurrency 64 lost 6% of its
  // throughput to such mixed steps; BENCHMARKS.md, seventeenth session).
  if (in.rows16_small_batches && plan.use_tma && plan.tma_schedule == MlaTmaSchedule::kSerial &&
      in.workspace_zeroed && in.num_splits == 0 && H <= kRows16TileRows &&
      seqs <= in.rows16_max_requests && in.max_q_len <= kMlaAbsorbMaxQueryLen) {
    plan.tma_schedule = MlaTmaSchedule::kRows16;
  }
  if (plan.tma_schedule == MlaTmaSchedule::kRows16 &&
      (H > kRows16TileRows || in.tma_l2_prefetch_tiles > 0)) {
    // kRows16: 16-row tiles of <= 16 heads, no L2-prefetch variant (a kSerial / kHandOff A/B).
    plan.tma_schedule = MlaTmaSchedule::kSerial;
  }
  const int64_t tile_rows =
      plan.tma_schedule == MlaTmaSchedule::kRows16 ? kRows16TileRows : int64_t{kRows};
  plan.row_tiles = (in.max_q_len * H + tile_rows - 1) / tile_rows;
  const int64_t rows_tile = std::min<int64_t>(in.max_q_len * H, tile_rows);
  // The TMA kernel merges its own splits (when there are several) where the caller zeroed the
  // tickets; a planned split count only for small row tiles (kMergeInKernelMaxRows), a forced one
  // at any (tests, benchmarks).
  const bool merge_possible = in.workspace_zeroed && plan.use_tma &&
                              plan.tma_schedule != MlaTmaSchedule::kSeesaw &&
                              seqs * plan.row_tiles <= kMlaMergeCounterBytes / 4 &&
                              (in.num_splits > 0 || rows_tile <= kMergeInKernelMaxRows);
  // Short (128-latent) planned splits where the kernel merges them and the batch is small: at
  // most kShortSplitCtas CTAs in all (measured, nvidia-h200, 16 heads, in the decode step: 16
  // splits x 8 requests = 128 CTAs at 4k lost 1.5% against 8 x 512 although the kernel alone
  // gained; capping larger batches' splits to 64 CTAs lost 14% at 32 requests x 4k, so those keep
  // the 512-latent planner below, their partials merged in the kernel).
  const bool short_splits =
      merge_possible && in.num_splits == 0 && seqs * plan.row_tiles <= kShortSplitGroups;
  const bool separate_full_tiles = !merge_possible && rows_tile == kRows;
  plan.split_min_latents = in.num_splits > 0     ? mla_internal::kSplitAlign
                           : short_splits        ? kSplitMinLatentsInKernel
                           : separate_full_tiles ? kSplitMinLatentsSeparate
                                                 : kSplitMinLatents;
  const int64_t max_splits = std::clamp<int64_t>(
      (ctx + plan.split_min_latents - 1) / plan.split_min_latents, 1,
      short_splits
          ? std::min<int64_t>(kMaxSplitsInKernel, kShortSplitCtas / (seqs * plan.row_tiles))
          : kMaxSplits);
  int64_t splits = std::min<int64_t>(in.num_splits, kMaxSplits);
  if (splits == 0) {
    // The plain kernel runs several CTAs per SM: about one wave of them.
    splits = plan.use_mma ? SplitsForWaves(seqs * plan.row_tiles, rows_tile, in.dims, in.num_sms,
                                           ctx, max_splits, plan.split_min_latents,
                                           separate_full_tiles ? kSeparateMergeWeight : 1.0)
                          : std::clamp<int64_t>((in.num_sms + seqs - 1) / seqs, 1, max_splits);
  }
  // The workspace's partials grow with the splits: fewer until they fit (one always does).
  for (;; splits = plan.num_splits - 1) {
    plan.num_splits = static_cast<int>(SplitsFilled(ctx, splits, plan.split_min_latents));
    plan.workspace_bytes = mla_internal::MlaWorkspace(in, plan.num_splits).total;
    if (plan.num_splits == 1 || in.max_workspace_bytes <= 0 ||
        plan.workspace_bytes <= in.max_workspace_bytes) {
      plan.merge_in_kernel = merge_possible && plan.num_splits > 1;
      TakeClusterMerge(plan);
      return plan;
    }
  }
}

}  // namespace tandem::kernels::cuda
