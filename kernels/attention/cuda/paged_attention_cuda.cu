// Host side of cuda::PagedAttention: the planner and the argument checks; the KV dtype picks one
// of the LaunchPagedDecode instantiations (paged_decode_launch.cuh, compiled in
// paged_decode_{16bit,fp8,int8}.cu), where head_dim and rows-per-warp become template constants.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/cuda/paged_decode_kernel.cuh"
#include "kernels/attention/cuda/paged_decode_launch.cuh"
#include "kernels/attention/cuda/paged_decode_tc_kernel.cuh"

namespace tandem::kernels::cuda {
namespace {

static_assert(internal::kMergeCounterBytes == kPagedAttentionCounterBytes);

using internal::DecodeParams;
using internal::LaunchPagedDecode;
using internal::TcCfg;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("cuda::PagedAttention: ", args...));
}

// Largest rows-per-warp kept in registers: q and the accumulator take 2 x head_dim / 8 floats
// per row, and the kernel must fit 128 registers (4 CTAs of 128 threads per SM).
int MaxRowsPerWarp(int64_t head_dim) { return head_dim <= 64 ? 4 : head_dim <= 128 ? 2 : 1; }

// Keys of one tile (see DecodeCfg): splits are whole tiles.
int64_t TileKeys(int64_t head_dim, KvDtype dtype) {
  return internal::kDecodeStageBytes / (2 * head_dim * KvDtypeBytes(dtype));
}

// Blocks per SM of the tensor-core kernel for this head_dim / KV dtype (shared-memory bound).
int TcCtasPerSm(int64_t head_dim, KvDtype dtype) {
  const bool d64 = head_dim <= 64;
  switch (dtype) {
    case KvDtype::kFp8E4m3:
      return d64 ? TcCfg<64, __nv_fp8_e4m3>::kCtasPerSm : TcCfg<128, __nv_fp8_e4m3>::kCtasPerSm;
    case KvDtype::kInt8:
      return d64 ? TcCfg<64, int8_t>::kCtasPerSm : TcCfg<128, int8_t>::kCtasPerSm;
    default:
      return d64 ? TcCfg<64, __half>::kCtasPerSm : TcCfg<128, __half>::kCtasPerSm;
  }
}

// The split count before issue 35 (legacy_split_merge): minimize waves x (keys per split +
// 192), waves counted against ctas-per-SM slots, >= 256 keys per split.
int LegacySplits(int64_t keys, int64_t tile, int64_t base, int64_t slots) {
  const int64_t max_splits = std::clamp<int64_t>(keys / 256, 1, 256);
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t per_split = ((keys + s - 1) / s + tile - 1) / tile * tile;
    const int64_t waves = (base * s + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * static_cast<double>(per_split + 192);
    if (s == 1 || cost < best_cost * 0.98) {
      best = s;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

// The split count: minimizes a cost in key-times of one SM, fitted to H200 measurements
// (BENCHMARKS.md, bf16 d128, L2 flushed): an SM streams the keys of all the CTAs it runs at about
// one rate, only ~10% faster with two CTAs resident than with one (batch 1: 16 splits of 16k
// keys on 128 SMs beat 32 on 2 CTAs per SM; 16 x 16k: 2 splits beat 1 by 7%); each CTA costs
// ~192 keys of latency (block table, then the first tiles); a merge costs ~100 keys plus 2 per
// split. So at batch 1 the splits fill the SMs with one CTA each (nvidia-h200-x4, one call, the
// PDL merge: 1 x 4k, 16 x 1k / 4k / 16k ran fastest at the count chosen here, 1 x 16k tied with
// 32 splits, 1 x 1k at 8 splits; 1 x 64k was not swept).
int PlanSplits(int64_t keys, int64_t tile, int64_t base, int num_sms, int ctas_per_sm) {
  // >= 128 keys per split: at 1 x 1k, 8 splits of 128 keys ran 14.7 us, 16 of 64 keys 15.2.
  const int64_t max_splits = std::clamp<int64_t>(keys / 128, 1, 256);
  int64_t best = 1;
  double best_cost = 0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t per_split = ((keys + s - 1) / s + tile - 1) / tile * tile;
    const int64_t ctas_on_sm = (base * s + num_sms - 1) / num_sms;  // all waves
    const double rate = ctas_on_sm >= 2 && ctas_per_sm >= 2 ? 1.1 : 1.0;
    double cost = static_cast<double>(ctas_on_sm) * static_cast<double>(per_split + 192) / rate;
    if (s > 1) cost += 100.0 + 2.0 * static_cast<double>(s);
    if (s == 1 || cost < best_cost * 0.98) {
      best = s;
      best_cost = cost;
    }
  }
  return static_cast<int>(best);
}

// Clusters of `cluster` cluster-merge decode CTAs resident at once on the current device.
absl::StatusOr<int> MaxActiveClusters(int64_t head_dim, KvDtype dtype, int cluster) {
  switch (dtype) {
    case KvDtype::kFp8E4m3:
      return internal::MaxActiveDecodeClusters<__nv_bfloat16, __nv_fp8_e4m3>(head_dim, cluster);
    case KvDtype::kInt8:
      return internal::MaxActiveDecodeClusters<__nv_bfloat16, int8_t>(head_dim, cluster);
    case KvDtype::kFp16:
      return internal::MaxActiveDecodeClusters<__half, __half>(head_dim, cluster);
    default:
      return internal::MaxActiveDecodeClusters<__nv_bfloat16, __nv_bfloat16>(head_dim, cluster);
  }
}

// PagedAttentionPlanInput::cluster_merge: takes it (no workspace, no other merge) where valid,
// else leaves the plan as it is and names the reason in cluster_merge_fallback.
void PlanClusterMerge(PagedAttentionPlan& plan) {
  const PagedAttentionPlanInput& in = plan.input;
  const char* why = nullptr;
  if (!plan.use_tensor_cores) {
    why = "not the tensor-core kernel";
  } else if (in.legacy_split_merge) {
    why = "legacy_split_merge";
  } else if (plan.num_splits < 2 || plan.num_splits > internal::kMaxClusterMergeSplits) {
    why = "num_splits outside 2..16";
  } else {
    const absl::StatusOr<int> clusters =
        MaxActiveClusters(in.head_dim, in.kv_dtype, plan.num_splits);
    if (!clusters.ok()) {
      (void)cudaGetLastError();  // the query's error (e.g. no device) is not the caller's
      why = "cudaOccupancyMaxActiveClusters failed";
    } else if (*clusters <= 0) {
      why = "no cluster of num_splits CTAs fits an SM group";
    } else if (in.cluster_merge_one_wave &&
               in.num_seqs * in.num_kv_heads * plan.row_tiles > *clusters) {
      // More clusters than fit at once run in a second wave (measured: 8 x 1k, 4-CTA clusters,
      // 16.1 -> 22.1 us; BENCHMARKS.md, sixteenth session): the ticket merge is faster there.
      why = "more clusters than fit at once (one wave only)";
    }
  }
  if (why != nullptr) {
    plan.cluster_merge_fallback = why;
    return;
  }
  plan.cluster_merge = true;
  plan.merge_in_kernel = false;
  plan.workspace_bytes = 0;
}

}  // namespace

absl::StatusOr<PagedAttentionPlan> PlanPagedAttention(const PagedAttentionPlanInput& in) {
  if (in.num_kv_heads <= 0 || in.num_q_heads <= 0 || in.num_q_heads % in.num_kv_heads != 0) {
    return Invalid("num_q_heads ", in.num_q_heads, " is not a positive multiple of num_kv_heads ",
                   in.num_kv_heads);
  }
  if (in.head_dim != 16 && in.head_dim != 32 && in.head_dim != 64 && in.head_dim != 128 &&
      in.head_dim != 256) {
    return Invalid("head_dim ", in.head_dim, " not supported (16, 32, 64, 128, 256)");
  }
  if (in.num_seqs < 0 || in.num_tokens < 0 || in.max_q_len < 1 || in.max_seq_len < 0 ||
      in.num_sms <= 0 || in.forced_splits < 0) {
    return Invalid("plan bounds must be non-negative (max_q_len >= 1, num_sms > 0): num_seqs=",
                   in.num_seqs, " num_tokens=", in.num_tokens, " max_q_len=", in.max_q_len,
                   " max_seq_len=", in.max_seq_len, " num_sms=", in.num_sms);
  }
  if (in.num_seqs > 65535) return Invalid("num_seqs ", in.num_seqs, " > 65535");
  if (in.max_seq_len > (int64_t{1} << 30) || in.num_tokens > (int64_t{1} << 30)) {
    return Invalid("max_seq_len / num_tokens beyond 2^30");
  }
  PagedAttentionPlan plan;
  plan.input = in;
  const int64_t group = in.num_q_heads / in.num_kv_heads;
  const int64_t rows_total = in.max_q_len * group;
  const int max_rpw = MaxRowsPerWarp(in.head_dim);
  // Rows per CTA: up to 4 warps x max_rpw; as few warps on rows (more on keys) as fit.
  const int64_t rows_cta = std::min<int64_t>(rows_total, 4 * max_rpw);
  int rpw = 1;
  while (rpw < max_rpw && rpw < rows_cta) rpw *= 2;
  int rg = 1;
  while (rg * rpw < rows_cta) rg *= 2;
  plan.use_tensor_cores = in.allow_tensor_cores && (in.head_dim == 64 || in.head_dim == 128);
  if (plan.use_tensor_cores) {  // one m16 tile of rows per CTA
    rpw = 4;
    rg = 4;
  }
  plan.rows_per_warp = rpw;
  plan.row_groups = rg;
  plan.row_tiles = static_cast<int>((rows_total + rg * rpw - 1) / (rg * rpw));
  if (in.num_kv_heads * plan.row_tiles > 65535) {
    return Invalid("num_kv_heads x row tiles ", in.num_kv_heads * plan.row_tiles, " > 65535");
  }

  const int64_t tile = !plan.use_tensor_cores           ? TileKeys(in.head_dim, in.kv_dtype)
                       : KvDtypeBytes(in.kv_dtype) == 1 ? TcCfg<128, int8_t>::kT
                                                        : TcCfg<128, __half>::kT;
  const int64_t base = std::max<int64_t>(1, in.num_seqs * in.num_kv_heads * plan.row_tiles);
  const int ctas_per_sm = plan.use_tensor_cores ? TcCtasPerSm(in.head_dim, in.kv_dtype) : 4;
  const int64_t keys = std::max<int64_t>(in.max_seq_len, 1);
  if (in.forced_splits > 0) {
    plan.num_splits = in.forced_splits;
  } else if (in.legacy_split_merge) {
    plan.num_splits = LegacySplits(keys, tile, base, int64_t{in.num_sms} * ctas_per_sm);
  } else {
    plan.num_splits = PlanSplits(keys, tile, base, in.num_sms, ctas_per_sm);
  }
  if (plan.num_splits > 1) {
    const int64_t rows = in.num_tokens * in.num_q_heads;
    plan.workspace_bytes = internal::kMergeCounterBytes +
                           plan.num_splits * rows * (in.head_dim + 1) * int64_t{sizeof(float)};
    // In-kernel merge: a counter per (request, kv head, row tile) in the fixed counter range,
    // the merge's weights in the smallest dynamic shared memory of a decode kernel (48 KB).
    const int64_t rows_per_cta = int64_t{plan.rows_per_warp} * plan.row_groups;
    plan.merge_in_kernel =
        in.workspace_zeroed && !in.legacy_split_merge &&
        in.num_seqs * in.num_kv_heads * plan.row_tiles <= internal::kMaxMergeGroups &&
        internal::MergeSmemFloats(rows_per_cta, plan.num_splits) * 4 <=
            internal::kDecodeStages * internal::kDecodeStageBytes;
  }
  if (in.cluster_merge) PlanClusterMerge(plan);
  return plan;
}

template <typename T>
absl::Status PagedAttention(const T* q, const DeviceKvCache& cache, int64_t layer,
                            const AttentionBatch& batch, const AttentionParams& params,
                            const PagedAttentionPlan& plan, T* out, float* lse, void* workspace,
                            cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateDeviceKvCache(cache, "cuda::PagedAttention"));
  const KvCacheLayout& layout = cache.layout;
  const PagedAttentionPlanInput& in = plan.input;
  RETURN_IF_ERROR(ValidateAttentionGeometry("cuda::PagedAttention", cache, layer, batch,
                                            in.num_kv_heads, in.head_dim, in.kv_dtype,
                                            in.num_seqs));
  constexpr KvDtype kOwn = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  if (cache.dtype != kOwn && cache.dtype != KvDtype::kFp8E4m3 && cache.dtype != KvDtype::kInt8) {
    return Invalid(KvDtypeName(cache.dtype), " pool with ", KvDtypeName(kOwn), " activations");
  }
  RETURN_IF_ERROR(ValidateAttentionParams("cuda::PagedAttention", params));
  if (in.num_seqs == 0 || in.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateAttentionPointers("cuda::PagedAttention", q, out, batch));
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return Invalid("plan needs ", plan.workspace_bytes, " bytes of workspace, got null");
  }
  if (params.dcp_size > 1 && batch.local_seq_lens == nullptr) {
    return Invalid("local_seq_lens must be non-null under decode context parallelism");
  }

  DecodeParams<T> p{};
  p.q = q;
  p.out = out;
  p.lse = lse;
  if (plan.num_splits > 1 && !plan.cluster_merge) {
    p.part_o =
        reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + internal::kMergeCounterBytes);
    if (plan.merge_in_kernel) p.merge_counters = static_cast<unsigned int*>(workspace);
    p.part_lse = p.part_o + int64_t{plan.num_splits} * in.num_tokens * in.num_q_heads * in.head_dim;
  }
  p.pool = cache.data;
  p.block_elems = layout.BlockElems();
  p.tile_elems = layout.TileElems();
  p.layer_offset = layout.TileOffset(0, layer, 0);
  p.token_stride = static_cast<int>(layout.num_kv_heads * layout.head_dim);
  p.block_size = static_cast<int>(layout.block_size);
  p.block_shift = -1;
  for (int s = 0; s < 31; ++s) {
    if ((int64_t{1} << s) == layout.block_size) p.block_shift = s;
  }
  p.query_start_loc = batch.query_start_loc;
  p.seq_lens = batch.seq_lens;
  p.block_tables = batch.block_tables;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.num_q_heads = static_cast<int>(in.num_q_heads);
  p.num_kv_heads = static_cast<int>(in.num_kv_heads);
  p.group = static_cast<int>(in.num_q_heads / in.num_kv_heads);
  p.num_tokens = in.num_tokens;
  p.planned_keys = static_cast<int>(in.max_seq_len);  // <= 2^30: checked by the planner
  const bool softcap = params.softcap > 0;
  p.q_scale = softcap ? params.scale : params.scale * internal::kLog2e;
  p.softcap_log2 = softcap ? params.softcap * internal::kLog2e : 0.0f;
  p.inv_softcap = softcap ? 1.0f / params.softcap : 0.0f;
  p.window_left = static_cast<int>(params.window_left);
  p.num_splits = plan.num_splits;
  p.rows_per_cta = plan.rows_per_warp * plan.row_groups;
  p.row_groups = plan.row_groups;
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  p.per_head_scale = cache.per_head_scale ? 1 : 0;
  p.token_scales = cache.token_scales;
  p.scale_block_stride = layout.BlockElems() / layout.head_dim;
  p.scale_tile = layout.TileElems() / layout.head_dim;
  p.scale_layer_offset = p.layer_offset / layout.head_dim;
  // 32-bit on the device: ValidateAttentionParams checked DcpShardValid (size * interleave
  // <= 2^30).
  p.dcp_size = static_cast<int>(params.dcp_size);
  p.dcp_interleave = static_cast<int>(params.dcp_interleave);
  p.dcp_cycle = static_cast<int>(params.dcp_size * params.dcp_interleave);
  p.dcp_offset = static_cast<int>(params.dcp_rank * params.dcp_interleave);
  p.local_seq_lens = batch.local_seq_lens;

  switch (cache.dtype) {
    case KvDtype::kFp8E4m3:
      return LaunchPagedDecode<T, __nv_fp8_e4m3>(p, plan, stream);
    case KvDtype::kInt8:
      return LaunchPagedDecode<T, int8_t>(p, plan, stream);
    default:
      return LaunchPagedDecode<T, T>(p, plan, stream);
  }
}

template absl::Status PagedAttention<__nv_bfloat16>(const __nv_bfloat16*, const DeviceKvCache&,
                                                    int64_t, const AttentionBatch&,
                                                    const AttentionParams&,
                                                    const PagedAttentionPlan&, __nv_bfloat16*,
                                                    float*, void*, cudaStream_t);
template absl::Status PagedAttention<__half>(const __half*, const DeviceKvCache&, int64_t,
                                             const AttentionBatch&, const AttentionParams&,
                                             const PagedAttentionPlan&, __half*, float*, void*,
                                             cudaStream_t);

}  // namespace tandem::kernels::cuda
