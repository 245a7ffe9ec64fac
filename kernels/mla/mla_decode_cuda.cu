// MlaLatentAttention (mla_cuda.h): the tensor-core kernel for latent 512 + 64, the plain kernel
// for other widths, split-KV partials merged by cuda::MergeF32AttnStatesN.
//
// Tensor-core kernel, one CTA = 64 (query token x head) rows of one request x one split of its
// context, 8 warps. Warp w owns row block rb = w % 4 (16 rows) and half ch = w / 4: it scores
// keys [16 ch, 16 ch + 16) of each 32-latent tile against its 16 rows (S = Q K^T over all 576
// dims), and accumulates O[16 rows][256 ch .. +256) += P V over all 32 keys (V = the tile's first
// 512 dims, read transposed from the same shared-memory rows). Row maxima and sums are combined
// across the two halves through shared memory. Latent tiles stream through a 3-stage cp.async
// ring; the block table is read per latent, so any page size works.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/merge_attn_states_cuda.h"
#include "kernels/mla/mla_attention.h"  // kMlaAbsorbMaxQueryLen
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using mla_internal::LatentParams;
using mla_internal::LatentRow;
using mla_internal::StoreLse;
using mla_internal::StorePair;

// ---- the tensor-core kernel (L = 512, Dr = 64) ----

constexpr int kL = mla_internal::kTensorCoreL, kD = mla_internal::kTensorCoreD;
constexpr int kRows = mla_internal::kTensorCoreRows, kKeys = 32, kStages = 3, kThreads = 256;
constexpr int kStride = kD + 8;       // shared row stride (elements): conflict-free ldmatrix
constexpr int kChunks = kD / 8;       // 16-byte chunks per latent row
constexpr int kKSteps = kD / 16 / 2;  // k16 steps of S per warp (each warp takes half of kD)
constexpr size_t kSmemBytes = (size_t{kRows} * kStride + size_t{kStages} * kKeys * kStride) * 2 +
                              size_t{kThreads} * 16 * sizeof(float);  // + the S partial exchange

template <typename T>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  uint32_t r;
  mla_internal::StoreTwo(reinterpret_cast<T*>(&r), lo, hi);
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    MlaMmaKernel(const __grid_constant__ LatentParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = sq + kRows * kStride;
  // S partials: [16 values][8 warps][32 lanes], so each store / load is one conflict-free row.
  float* sx = reinterpret_cast<float*>(sk + kStages * kKeys * kStride);

  const mla_internal::LatentCta cta = mla_internal::LatentCtaOf(p, kRows);
  if (cta.r0 >= cta.rows_seq || mla_internal::EmptySplitDone(p, cta, kRows)) return;
  const int split = blockIdx.x, q0 = cta.q0, rows_seq = cta.rows_seq, r0 = cta.r0, kb = cta.kb;
  const int ke = cta.ke, num_tiles = cta.Tiles(kKeys);
  const int32_t* table = cta.table;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int rb = warp % 4, ch = warp / 4;

  // Q rows (zero beyond the request's rows) join the first tile's copy group.
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    const bool ok = r0 + r < rows_seq;
    const T* src = ok ? p.q + (static_cast<int64_t>(q0) * p.heads + r0 + r) * kD + k * 8 : p.q;
    mla_internal::CpAsync16(sq + r * kStride + k * 8, src, ok);
  }
  auto load_tile = [&](int t) {
    T* dst = sk + (t % kStages) * kKeys * kStride;
    const int key0 = kb + t * kKeys;
    for (int c = tid; c < kKeys * kChunks; c += kThreads) {
      const int j = c / kChunks, k = c % kChunks;
      const bool ok = key0 + j < ke;
      const T* src = ok ? LatentRow(p, table, key0 + j) + k * 8 : p.pool;
      mla_internal::CpAsync16(dst + j * kStride + k * 8, src, ok);
    }
  };
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < num_tiles) load_tile(t);
    mla_internal::CpAsyncCommit();
  }

  // This thread's two rows (lane/4 and lane/4 + 8 of the row block) and how far each sees.
  const int row_lo = rb * 16 + lane / 4, row_hi = row_lo + 8;
  const int vis_lo = cta.KeyEnd(p, row_lo), vis_hi = cta.KeyEnd(p, row_hi);
  float o[kL / 2 / 8][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const uint32_t a_base = mla_internal::SmemAddr(sq + (rb * 16 + lane % 16) * kStride +
                                                 ch * kKSteps * 16 + (lane / 16) * 8);

  for (int t = 0; t < num_tiles; ++t) {
    mla_internal::CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < num_tiles) load_tile(t + kStages - 1);
    mla_internal::CpAsyncCommit();
    const T* kt = sk + (t % kStages) * kKeys * kStride;
    const int key0 = kb + t * kKeys;

    // Partial S[16 rows][32 keys] over this warp's half of the kD dims: 4 independent chains.
    float sc[4][4] = {};
    const uint32_t b_base = mla_internal::SmemAddr(kt + ((lane / 16) * 8 + lane % 8) * kStride +
                                                   ch * kKSteps * 16 + ((lane / 8) % 2) * 8);
#pragma unroll 6
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[4], b[4], b2[4];
      mla_internal::LdMatrixX4(a_base + kk * 32, a);
      mla_internal::LdMatrixX4(b_base + kk * 32, b);
      mla_internal::LdMatrixX4(b_base + 16 * kStride * 2 + kk * 32, b2);
      mla_internal::Mma16816<T>(sc[0], a, b[0], b[1]);
      mla_internal::Mma16816<T>(sc[1], a, b[2], b[3]);
      mla_internal::Mma16816<T>(sc[2], a, b2[0], b2[1]);
      mla_internal::Mma16816<T>(sc[3], a, b2[2], b2[3]);
    }
    // Add the other half's partial (same fragment layout, same lane).
#pragma unroll
    for (int e = 0; e < 16; ++e) sx[(e * 8 + warp) * 32 + lane] = sc[e / 4][e % 4];
    __syncthreads();
    const int other = (1 - ch) * 4 + rb;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int j = e / 4, c = e % 4;
      const int key = key0 + j * 8 + 2 * (lane % 4) + (c & 1);
      const float v = (sc[j][c] + sx[(e * 8 + other) * 32 + lane]) * p.scale_log2;
      sc[j][c] = key < (c < 2 ? vis_lo : vis_hi) ? v : -INFINITY;
      mx[c / 2] = fmaxf(mx[c / 2], sc[j][c]);
    }
    float alpha[2], m_use[2];
    mla_internal::UpdateRunningMax2(mx, m_run, l_run, alpha, m_use);
    // P in registers: the S accumulator layout of keys 16kk..16kk+15 is the A fragment of P V.
    uint32_t pa[2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = exp2f(sc[j][0] - m_use[0]), p1 = exp2f(sc[j][1] - m_use[0]);
      const float p2 = exp2f(sc[j][2] - m_use[1]), p3 = exp2f(sc[j][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      pa[j / 2][(j % 2) * 2] = Pack<T>(p0, p1);
      pa[j / 2][(j % 2) * 2 + 1] = Pack<T>(p2, p3);
    }
#pragma unroll
    for (int n = 0; n < kL / 2 / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // O[16 rows][256 cols] += P[16 rows][32 keys] V[32 keys][256 cols].
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t v_base =
          mla_internal::SmemAddr(kt + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride +
                                 ch * (kL / 2) + (lane / 16) * 8);
#pragma unroll
      for (int n = 0; n < kL / 2 / 16; ++n) {
        uint32_t b[4];
        mla_internal::LdMatrixX4Trans(v_base + n * 32, b);
        mla_internal::Mma16816<T>(o[2 * n], pa[kk], b[0], b[1]);
        mla_internal::Mma16816<T>(o[2 * n + 1], pa[kk], b[2], b[3]);
      }
    }
  }
  mla_internal::CpAsyncWait<0>();

  // Row sums over the quad (both halves hold the same P, so the same sums).
  mla_internal::QuadSum2(l_run);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h == 0 ? row_lo : row_hi;
    if (r0 + r >= rows_seq) continue;
    const float l = l_run[h];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t row = static_cast<int64_t>(q0) * p.heads + r0 + r;
#pragma unroll
    for (int n = 0; n < kL / 2 / 8; ++n) {
      StorePair(p, split, row, ch * (kL / 2) + n * 8 + 2 * (lane % 4), o[n][2 * h] * inv,
                o[n][2 * h + 1] * inv);
    }
    if (ch == 0 && lane % 4 == 0) {
      StoreLse(p, split, row, l > 0.0f ? (m_run[h] + log2f(l)) * kLn2 : -INFINITY);
    }
  }
}

// ---- the plain kernel: one warp per (token, head) row, any L <= 1024, D <= 1152 ----

constexpr int kPlainWarps = 4;
constexpr int kMaxLPerLane = mla_internal::kPlainMaxLPerLane;
constexpr int kMaxDPerLane = mla_internal::kPlainMaxDPerLane;

// Latent value c of the row at element offset `off`: the pool's T, or an FP8 code times the row's
// scale (`rs`).
template <typename T, bool kFp8>
__device__ __forceinline__ float LatentValue(const LatentParams<T>& p, int64_t off, int c,
                                             float rs) {
  if constexpr (kFp8) {
    return internal::ToFloat(*reinterpret_cast<const __nv_fp8_e4m3*>(p.pool8 + off + c)) * rs;
  } else {
    return internal::ToFloat(p.pool[off + c]);
  }
}

template <typename T, bool kFp8>
__global__ void __launch_bounds__(kPlainWarps * 32)
    MlaPlainKernel(const __grid_constant__ LatentParams<T> p) {
  const int lane = threadIdx.x % 32, split = blockIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kPlainWarps + threadIdx.x / 32;
  if (row >= static_cast<int64_t>(p.num_tokens) * p.heads) return;
  const int t = static_cast<int>(row / p.heads);
  int lo = 0, hi = p.num_seqs;  // the request holding token t: qsl[s] <= t < qsl[s + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (p.qsl[mid] <= t ? lo : hi) = mid;
  }
  const int q0 = p.qsl[lo], q_len = p.qsl[lo + 1] - q0;
  if (t < q0 || t >= q0 + q_len) return;  // padding past the batch's tokens
  const int ctx = p.seq_lens[lo];
  // The split rule of the tensor-core kernels (SplitChunk) over this row's own key end.
  const int keys = mla_internal::LocalKeyEnd(p, ctx - q_len + (t - q0) + 1);
  const int chunk = mla_internal::SplitChunk(keys, p.num_splits, p.split_min);
  const int kb = split * chunk, ke = min(kb + chunk, keys);
  if (p.num_splits > 1 && kb >= ke) {  // an empty split: LSE -inf, out unread (EmptySplitDone)
    if (lane == 0) StoreLse(p, split, row, -INFINITY);
    return;
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(lo) * p.max_blocks;
  float q[kMaxDPerLane], acc[kMaxLPerLane] = {};
#pragma unroll
  for (int k = 0; k < kMaxDPerLane; ++k) {
    const int c = lane + 32 * k;
    q[k] = c < p.dim ? internal::ToFloat(p.q[row * p.dim + c]) : 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int key = kb; key < ke; ++key) {
    const int64_t blk = table[key / p.block_size];
    const int64_t in = p.layer_offset + static_cast<int64_t>(key % p.block_size) * p.dim;
    const int64_t off = blk * (kFp8 ? p.code_block_stride : p.block_elems) + in;
    const float rs = kFp8 ? p.row_scales[blk * p.scale_block_stride + in / p.dim] : 1.0f;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxDPerLane; ++k) {
      const int c = lane + 32 * k;
      if (c < p.dim) dot += q[k] * LatentValue<T, kFp8>(p, off, c, rs);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float sv = dot * p.scale_log2, m_new = fmaxf(m, sv);
    const float alpha = exp2f(m - m_new), w = exp2f(sv - m_new);
    l = l * alpha + w;
    m = m_new;
#pragma unroll
    for (int k = 0; k < kMaxLPerLane; ++k) {
      const int c = lane + 32 * k;
      if (c < p.lora) acc[k] = acc[k] * alpha + w * LatentValue<T, kFp8>(p, off, c, rs);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxLPerLane; ++k) {
    const int c = lane + 32 * k;
    if (c >= p.lora) continue;
    if (p.num_splits == 1) {
      p.o_lat[row * p.lora + c] = internal::FromFloat<T>(acc[k] * inv);
    } else {
      p.part_o[(static_cast<int64_t>(split) * p.num_tokens * p.heads + row) * p.lora + c] =
          acc[k] * inv;
    }
  }
  if (lane == 0) StoreLse(p, split, row, l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY);
}

}  // namespace

template <typename T>
absl::Status MlaLatentAttention(const T* q_cat, const DeviceKvCache& cache, int64_t layer,
                                const AttentionBatch& batch, float scale, const MlaPlan& plan,
                                void* workspace, T* o_lat, float* lse, cudaStream_t stream) {
  const MlaPlanInput& in = plan.input;
  RETURN_IF_ERROR(mla_internal::CheckLatentPool<T>(cache, in.dims, layer, "MlaLatentAttention",
                                                   /*fp8_ok=*/true));
  const bool fp8 = cache.dtype == KvDtype::kFp8E4m3;
  if (!(scale > 0.0f) || !std::isfinite(scale) || batch.num_seqs != in.num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("MlaLatentAttention: scale ", scale,
                                                   " or num_seqs ", batch.num_seqs, " != plan's ",
                                                   in.num_seqs));
  }
  if (in.num_seqs == 0 || in.num_tokens == 0) return absl::OkStatus();
  if (q_cat == nullptr || o_lat == nullptr || batch.query_start_loc == nullptr ||
      batch.seq_lens == nullptr || batch.block_tables == nullptr ||
      (plan.num_splits > 1 && workspace == nullptr)) {
    return absl::InvalidArgumentError("MlaLatentAttention: null pointer");
  }
  if (in.dcp.size > 1 && lse == nullptr) {
    return absl::InvalidArgumentError(
        "MlaLatentAttention: a DCP shard's partial needs its LSE (lse is null)");
  }
  const mla_internal::MlaWorkspace ws(in, plan.num_splits);
  LatentParams<T> p{};
  p.q = q_cat;
  p.pool = static_cast<const T*>(cache.data);
  p.layer_offset = cache.layout.TileOffset(0, layer, 0);
  p.block_elems = cache.layout.BlockElems();
  p.block_size = static_cast<int>(cache.layout.block_size);
  p.qsl = batch.query_start_loc;
  p.seq_lens = batch.seq_lens;
  p.block_tables = batch.block_tables;
  p.max_blocks = static_cast<int>(batch.max_blocks_per_seq);
  p.num_seqs = static_cast<int>(in.num_seqs);
  p.num_tokens = static_cast<int>(in.num_tokens);
  p.heads = static_cast<int>(in.dims.num_heads);
  p.dim = static_cast<int>(in.dims.LatentDim());
  p.lora = static_cast<int>(in.dims.kv_lora_rank);
  p.scale_log2 = scale * kLog2e;
  p.num_splits = plan.num_splits;
  p.split_min = plan.split_min_latents;
  p.o_lat = o_lat;
  p.lse = lse;
  p.dcp_size = static_cast<int>(in.dcp.size);
  p.dcp_interleave = static_cast<int>(in.dcp.interleave);
  p.dcp_cycle = static_cast<int>(in.dcp.size * in.dcp.interleave);
  p.dcp_offset = static_cast<int>(in.dcp.rank * in.dcp.interleave);
  p.l2_prefetch_tiles = plan.use_tma ? std::clamp(in.tma_l2_prefetch_tiles, 0, 16) : 0;
  p.phase_stamps = in.phase_stamps;
  if (fp8) {  // the codes: the FP8 wgmma kernel where it runs, else the plain kernel
    p.pool = nullptr;
    p.pool8 = static_cast<const uint8_t*>(cache.data);
    p.row_scales = cache.token_scales;
    const mla_internal::Fp8BlockStrides strides = mla_internal::Fp8Strides(cache);
    p.code_block_stride = strides.codes;
    p.scale_block_stride = strides.scales;
  }
  unsigned char* base = static_cast<unsigned char*>(workspace);
  if (plan.num_splits > 1) {
    p.part_o = reinterpret_cast<float*>(base + ws.part_o);
    p.part_lse = reinterpret_cast<float*>(base + ws.part_lse);
  }
  // The TMA kernel merges its own splits (plan.merge_in_kernel, where it runs).
  bool merged_in_kernel = false;
  bool wgmma = plan.use_wgmma && (!fp8 || mla_internal::MlaFp8TileFits(p));
  if (wgmma) {  // sm_90a machine code only (its compute_90 twin is empty)
    ASSIGN_OR_RETURN(wgmma, mla_internal::DeviceIsSm90());
  }
  // kRows16 over an FP8 pool: the 16-row kernel reading the codes (mla_decode_rows16_fp8.cu);
  // other FP8 plans the 64-row FP8 wgmma kernel.
  const bool rows16_fp8 = wgmma && fp8 && in.rows16_fp8 && plan.use_tma &&
                          plan.tma_schedule == MlaTmaSchedule::kRows16 &&
                          mla_internal::MlaRows16Fp8Fits(p, cache);
  if (wgmma && fp8 && !rows16_fp8) {
    RETURN_IF_ERROR(mla_internal::LaunchMlaFp8<T>(
        p, dim3(plan.num_splits, plan.row_tiles, in.num_seqs), stream));
  } else if (wgmma && plan.use_tma && (rows16_fp8 || mla_internal::MlaTmaFits(cache))) {
    const dim3 grid(plan.num_splits, plan.row_tiles, in.num_seqs);
    const MlaTmaSchedule schedule = plan.tma_schedule;
    const bool cluster = plan.cluster_merge && schedule == MlaTmaSchedule::kRows16;
    if (plan.merge_in_kernel && !cluster) {  // the counters: the workspace's first 16 KiB
      p.merge_counters = static_cast<unsigned int*>(workspace);
      merged_in_kernel = true;
    }
    merged_in_kernel = merged_in_kernel || cluster;  // the cluster merges its splits itself
    RETURN_IF_ERROR(
        rows16_fp8 ? mla_internal::LaunchMlaRows16Fp8<T>(p, cache, layer, grid, in.prewait, cluster,
                                                         stream)
        : schedule == MlaTmaSchedule::kSeesaw
            ? mla_internal::LaunchMlaSeesaw<T>(p, cache, layer, grid, stream)
        : schedule == MlaTmaSchedule::kRows16
            ? mla_internal::LaunchMlaRows16<T>(p, cache, layer, grid, in.prewait, cluster, stream)
            : mla_internal::LaunchMlaTma<T>(p, cache, layer, grid,
                                            schedule == MlaTmaSchedule::kHandOff, stream));
  } else if (wgmma) {
    RETURN_IF_ERROR(mla_internal::LaunchMlaWgmma<T>(
        p, dim3(plan.num_splits, plan.row_tiles, in.num_seqs), stream));
  } else if (plan.use_mma && !fp8) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        MlaMmaKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    const dim3 grid(plan.num_splits, plan.row_tiles, in.num_seqs);
    MlaMmaKernel<T><<<grid, kThreads, kSmemBytes, stream>>>(p);
  } else {
    const dim3 grid(plan.num_splits,
                    (in.num_tokens * in.dims.num_heads + kPlainWarps - 1) / kPlainWarps);
    if (fp8) {
      MlaPlainKernel<T, true><<<grid, kPlainWarps * 32, 0, stream>>>(p);
    } else {
      MlaPlainKernel<T, false><<<grid, kPlainWarps * 32, 0, stream>>>(p);
    }
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (plan.num_splits == 1 || merged_in_kernel) return absl::OkStatus();
  const int64_t rows = in.num_tokens * in.dims.num_heads;
  AttnPartials<float> parts{p.part_o, rows * p.lora, p.part_lse, rows, plan.num_splits};
  return MergeF32AttnStatesN<T>(parts, in.num_tokens, in.dims.num_heads, p.lora, o_lat, lse,
                                stream);
}

template absl::Status MlaLatentAttention<__nv_bfloat16>(const __nv_bfloat16*, const DeviceKvCache&,
                                                        int64_t, const AttentionBatch&, float,
                                                        const MlaPlan&, void*, __nv_bfloat16*,
                                                        float*, cudaStream_t);
template absl::Status MlaLatentAttention<__half>(const __half*, const DeviceKvCache&, int64_t,
                                                 const AttentionBatch&, float, const MlaPlan&,
                                                 void*, __half*, float*, cudaStream_t);

}  // namespace tandem::kernels::cuda
