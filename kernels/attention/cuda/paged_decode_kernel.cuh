// The flash-decoding kernel behind cuda::PagedAttention (internal; included by
// paged_attention_cuda.cu only).
//
// CTA = 4 warps = (request, kv head, row tile, KV split). Rows are (new token, group head) pairs
// of the kv head; warp w keeps rows_per_warp (RPW) of them in registers (row group w % RG) and
// walks its share of the keys (key group w / RG). K/V tiles of kT keys stream through a 3-stage
// cp.async ring in shared memory (16 KB of K/V per stage, plus the tile's per-token scales for
// int8 KV), so each K/V byte leaves HBM once per CTA. Within a warp, 8 lanes (a "subgroup") own one
// key at a time: each lane holds D/8 dims of q and of the output accumulator, dots are finished
// with 3 xor-shuffles, and each subgroup runs its own online softmax (running max m and sum l in
// the log2 domain). Subgroups are merged by shuffles, key groups through shared memory at the end.
//
// KV element types: T itself, fp8 e4m3 (per-tensor / per-head scales: K's folded into q, V's
// into the output) and int8 (per-token scales: K's multiplies each finished dot, V's each
// softmax weight; l sums the unscaled weights). head_dim 16 to 256.
//
// Decode context parallelism (dcp_size > 1): the pool holds one KV shard at local indices while
// query positions stay global; each row's visible global range becomes a range of local keys
// (DcpLocalKeyBound) once, in the prologue, and everything after it is unchanged.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_KERNEL_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/paged_decode_merge.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeStageBytes = 16384;
constexpr int kDecodeStages = 3;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// int8 KV carries one fp32 scale per (token, kv head) row (DeviceKvCache::token_scales).
template <typename KV>
inline constexpr bool kTokenScaled = std::is_same_v<KV, int8_t>;

template <typename KV, int D>
struct DecodeCfg {
  static constexpr int kT = kDecodeStageBytes / (2 * D * static_cast<int>(sizeof(KV)));  // keys
  // Stage = K tile, V tile, then (int8) the kT K scales and kT V scales.
  static constexpr int kScaleBytes = kTokenScaled<KV> ? 2 * kT * 4 : 0;
  static constexpr int kStageBytes = kDecodeStageBytes + kScaleBytes;
  static constexpr int kSmemBytes = kDecodeStages * kStageBytes;  // dynamic shared memory
  static constexpr int kDL = D / 8;                               // dims per lane
  static constexpr int kUnitBytes =
      kDL * static_cast<int>(sizeof(KV)) < 16 ? kDL * static_cast<int>(sizeof(KV)) : 16;
  static constexpr int kEU = kUnitBytes / static_cast<int>(sizeof(KV));    // elements per unit
  static constexpr int kNU = kDL / kEU;                                    // units per lane
  static constexpr int kRowUnits = D * static_cast<int>(sizeof(KV)) / 16;  // 16 B units per row
  static constexpr int kCopies = kT * kRowUnits / kDecodeThreads;          // per thread, K (and V)
  static constexpr int kKB = kT >= 32 ? 2 : 1;  // keys per subgroup per softmax step
  static_assert(kCopies * kDecodeThreads == kT * kRowUnits);
  static_assert(kT >= 16 * kKB);
  static_assert(kNU * kEU == kDL && kEU % 2 == 0);
};

template <typename T>
struct DecodeParams {
  const T* q;
  T* out;
  float* lse;
  float* part_o;    // [splits][num_tokens * num_q_heads][D] when num_splits > 1
  float* part_lse;  // [splits][num_tokens * num_q_heads]
  // In-kernel merge (non-null only when num_splits > 1): one ticket counter per (request, kv
  // head, row tile) at blockIdx.z * gridDim.y + blockIdx.y (paged_decode_merge.cuh).
  unsigned int* merge_counters;
  // The plan's max_seq_len (clamped to int): the tensor-core kernel loads the block-table
  // entries of the split a request of this length would get together with seq_lens, before it
  // knows the request's length, and uses them when the split starts where that one does.
  int planned_keys;
  const void* pool;
  int64_t block_elems;
  int64_t tile_elems;
  int64_t layer_offset;
  int token_stride;  // num_kv_heads * D
  int block_size;
  int block_shift;  // log2(block_size), or -1
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int num_q_heads;
  int num_kv_heads;
  int group;
  int64_t num_tokens;
  float q_scale;       // scale (x log2e without softcap)
  float softcap_log2;  // softcap * log2e (> 0: soft-cap on)
  float inv_softcap;
  int window_left;
  int num_splits;
  int rows_per_cta;
  int row_groups;
  const float* k_scale;  // fp8 only
  const float* v_scale;
  int per_head_scale;
  // int8 only: token_scales + scale_layer_offset + kv head is the scale of (block 0, offset 0)'s
  // K row; + block * scale_block_stride + offset * num_kv_heads moves within K, + scale_tile to V.
  const float* token_scales;
  int64_t scale_block_stride;  // block_elems / D
  int64_t scale_tile;          // tile_elems / D
  int64_t scale_layer_offset;  // layer_offset / D
  // Decode context parallelism: dcp_size > 1 when the pool holds only one shard; then seq_lens
  // are global and local_seq_lens[seq] is the shard's length of the request. 32-bit, with the
  // products precomputed (DcpShardValid keeps size * interleave <= 2^30).
  int dcp_size;
  int dcp_interleave;
  int dcp_cycle;   // interleave * size
  int dcp_offset;  // rank * interleave
  const int32_t* local_seq_lens;
};

// Under decode context parallelism (dcp_size > 1), the key bound in the shard for the global
// bound x (keys at positions < x): the number of the shard's keys before x (DcpLocalCount of
// dcp_shard.h in 32-bit arithmetic), at most the request's local length. The kernels compute
// their bounds as global positions, issue the q loads, and only then convert every bound in one
// uniform branch: per-bound branches (and 64-bit division) slowed the dcp_size 1 path by 0.3 us
// at batch 1 and made the fp8 kernel spill.
template <typename T>
__device__ __forceinline__ int DcpLocalKeyBound(const DecodeParams<T>& p, int x, int local_len) {
  const int cycles = x / p.dcp_cycle;
  const int partial = min(max(x - cycles * p.dcp_cycle - p.dcp_offset, 0), p.dcp_interleave);
  return min(local_len, cycles * p.dcp_interleave + partial);
}

// Under DCP, the CTA's key bounds and its rows' (N per thread) from global positions to the
// shard's local indices, in the one uniform branch DcpLocalKeyBound's comment asks for.
template <int N, typename T>
__device__ __forceinline__ void LocalizeKeyBounds(const DecodeParams<T>& p, int seq, int& lo_cta,
                                                  int& hi_cta, int (&lo)[N], int (&hi)[N]) {
  if (p.dcp_size > 1) {  // the pool holds one KV shard: global bounds -> local key indices
    const int local_len = p.local_seq_lens[seq];
    lo_cta = DcpLocalKeyBound(p, lo_cta, local_len);
    hi_cta = DcpLocalKeyBound(p, hi_cta, local_len);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      lo[i] = DcpLocalKeyBound(p, lo[i], local_len);
      hi[i] = DcpLocalKeyBound(p, hi[i], local_len);
    }
  }
}

// One CTA of either decode kernel: grid (KV split, row tile x kv head, request) and its
// request's query rows (token x group head), rows_per_cta of them from row0.
struct DecodeCta {
  int split, kvh, row_tile, seq, q_start, q_len, seq_len, rows_total, row0;
};
template <typename T>
__device__ __forceinline__ DecodeCta LocateDecodeCta(const DecodeParams<T>& p, int rows_per_cta) {
  DecodeCta c;
  c.split = blockIdx.x;
  c.kvh = blockIdx.y % p.num_kv_heads;
  c.row_tile = blockIdx.y / p.num_kv_heads;
  c.seq = blockIdx.z;
  c.q_start = p.query_start_loc[c.seq];
  c.q_len = p.query_start_loc[c.seq + 1] - c.q_start;
  c.seq_len = p.seq_lens[c.seq];
  c.rows_total = c.q_len * p.group;
  c.row0 = c.row_tile * rows_per_cta;
  return c;
}

// The keys of one KV split (the CTA's blockIdx.x) of both decode kernels: the CTA's span
// [lo_cta, hi_cta) cut into num_splits chunks of whole kT-key tiles; [begin, end) is split
// `split`'s part, n_tiles its tiles (0: an empty split, which still writes its empty partial).
struct KeySplit {
  int begin, end, n_tiles;
};
template <int kT>
__device__ __forceinline__ KeySplit SplitKeys(int lo_cta, int hi_cta, int num_splits, int split) {
  const int span = hi_cta - lo_cta;
  const int chunk = ((span + num_splits - 1) / num_splits + kT - 1) / kT * kT;
  const int begin = lo_cta + split * chunk;
  const int end = min(hi_cta, begin + chunk);
  return {begin, end, end > begin ? (end - begin + kT - 1) / kT : 0};
}

// Row of out / lse (and of a split's partials) of the CTA's rr-th query row: row0 + rr is its
// request's (token x group head) index.
template <typename T>
__device__ __forceinline__ int64_t DecodeRow(const DecodeParams<T>& p, const DecodeCta& c, int rr) {
  const int gr = c.row0 + rr;
  return int64_t{c.q_start + gr / p.group} * p.num_q_heads + c.kvh * p.group + gr % p.group;
}

// The in-kernel merge (p.merge_counters set), called by every thread once the CTA stored its
// n_rows rows' partials: the last split CTA of the (request, kv head, row tile) merges them.
// smem: the kernel's dynamic shared memory, free by now.
template <int D, typename T>
__device__ __forceinline__ void MergeIfLastSplit(const DecodeParams<T>& p, const DecodeCta& c,
                                                 int n_rows, void* smem) {
  if (p.merge_counters == nullptr) return;
  float* smem_f = static_cast<float*>(smem);  // MergeSmemFloats: the flag, then the weights
  if (!TakeMergeTicket(p.merge_counters + blockIdx.z * gridDim.y + blockIdx.y, p.num_splits,
                       reinterpret_cast<int*>(smem_f))) {
    return;
  }
  MergeGroupSplits<T, D>(
      p.part_o, p.part_lse, p.num_splits, p.num_tokens * p.num_q_heads, n_rows,
      [&](int rr) { return DecodeRow(p, c, rr); }, p.out, p.lse, smem_f + 4);
}

// cp.async of 4 bytes (the per-token scales); src_bytes = 0 zero-fills.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}

// int8 -> fp32 four at a time without I2F: the byte, offset to unsigned, becomes the low
// mantissa bits of 2^23 (exact), and subtracting 2^23 + 128 restores the signed value.
template <int N>
__device__ __forceinline__ void VecToFloat(const Vec<int8_t, N>& in, float* out) {
  if constexpr (N % 4 == 0) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(in.v);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint32_t u = w[i] ^ 0x80808080u;
      out[4 * i] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7540)) - 8388736.0f;
      out[4 * i + 1] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7541)) - 8388736.0f;
      out[4 * i + 2] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7542)) - 8388736.0f;
      out[4 * i + 3] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7543)) - 8388736.0f;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = static_cast<float>(in.v[i]);
  }
}

// Loads N elements of T as fp32, up to 16 bytes at a time (src aligned to that access).
template <typename T, int N>
__device__ __forceinline__ void LoadRowPart(const T* src, float* dst) {
  constexpr int kV = N < 16 / static_cast<int>(sizeof(T)) ? N : 16 / static_cast<int>(sizeof(T));
  static_assert(N % kV == 0);
#pragma unroll
  for (int i = 0; i < N / kV; ++i) {
    VecToFloat(*reinterpret_cast<const Vec<T, kV>*>(src + i * kV), dst + i * kV);
  }
}
template <typename T, int N>
__device__ __forceinline__ void StoreRowPart(const float* src, T* dst) {
  constexpr int kV = N < 16 / static_cast<int>(sizeof(T)) ? N : 16 / static_cast<int>(sizeof(T));
  static_assert(N % kV == 0);
#pragma unroll
  for (int i = 0; i < N / kV; ++i) {
    *reinterpret_cast<Vec<T, kV>*>(dst + i * kV) = FloatToVec<T, kV>(src + i * kV);
  }
}

// Merges online-softmax state (mb, lb, accb) into (m, l, acc); log2 domain.
template <int N>
__device__ __forceinline__ void MergeState(float& m, float& l, float* acc, float mb, float lb,
                                           const float* accb) {
  const float m_new = fmaxf(m, mb);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // both empty: avoid -inf - -inf
  const float ca = exp2f(m - m_use);
  const float cb = exp2f(mb - m_use);
  l = l * ca + lb * cb;
#pragma unroll
  for (int d = 0; d < N; ++d) acc[d] = acc[d] * ca + accb[d] * cb;
  m = m_new;
}

template <typename T, typename KV, int D, int RPW>
__global__ void __launch_bounds__(kDecodeThreads, 4)
    PagedDecodeKernel(const __grid_constant__ DecodeParams<T> p) {
  using C = DecodeCfg<KV, D>;
  constexpr int kT = C::kT, kDL = C::kDL, kEU = C::kEU, kNU = C::kNU, kKB = C::kKB;
  constexpr bool kScaled = kTokenScaled<KV>;
  extern __shared__ uint4 smem_u4[];  // C::kSmemBytes
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  AllowDependentLaunch();  // the split merge (paged_decode_merge.cuh) may be scheduled now

  const DecodeCta cta = LocateDecodeCta(p, p.rows_per_cta);
  const int split = cta.split, kvh = cta.kvh, seq = cta.seq, q_start = cta.q_start;
  const int q_len = cta.q_len, seq_len = cta.seq_len, rows_total = cta.rows_total, row0 = cta.row0;
  if (row0 >= rows_total) return;  // whole CTA: padding request or beyond its rows
  WaitForPrecedingGrid();  // PDL: q, the pool and the workspace may be the previous kernel's

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, l8 = lane & 7, sgw = lane >> 3;
  const int RG = p.row_groups;
  const int KG = 4 / RG;
  const int rg = warp % RG, kg = warp / RG;

  // Keys any row of this CTA sees: lo of its first token .. hi of its last (both monotone).
  const int first_pos = seq_len - q_len;
  const int tok_first = row0 / p.group;
  const int tok_last = (min(row0 + p.rows_per_cta, rows_total) - 1) / p.group;
  int lo_cta = p.window_left >= 0 ? max(0, first_pos + tok_first - p.window_left) : 0;
  int hi_cta = first_pos + tok_last + 1;

  // This warp's rows: visible keys [lo, hi) (global until the split is known), q pre-scaled,
  // fresh state.
  int lo[RPW], hi[RPW], tok[RPW], head[RPW];
  bool valid[RPW];
  float qf[RPW][kDL], acc[RPW][kDL], m[RPW], l[RPW];
  float k_deq = 1.0f, v_deq = 1.0f;
  if constexpr (std::is_same_v<KV, __nv_fp8_e4m3>) {
    k_deq = p.k_scale[p.per_head_scale ? kvh : 0];
    v_deq = p.v_scale[p.per_head_scale ? kvh : 0];
  }
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int gr = row0 + rg * RPW + i;
    valid[i] = gr < rows_total && rg * RPW + i < p.rows_per_cta;
    tok[i] = valid[i] ? gr / p.group : 0;
    head[i] = kvh * p.group + (valid[i] ? gr % p.group : 0);
    const int pos = first_pos + tok[i];
    lo[i] = p.window_left >= 0 ? max(0, pos - p.window_left) : 0;
    hi[i] = pos + 1;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDL; ++d) acc[i][d] = 0.0f;
    const T* q_row = p.q + (int64_t{q_start + tok[i]} * p.num_q_heads + head[i]) * D;
    const float qs = p.q_scale * k_deq;
#pragma unroll
    for (int u = 0; u < kNU; ++u) {
      if (valid[i]) {
        LoadRowPart<T, kEU>(q_row + (l8 + 8 * u) * kEU, &qf[i][u * kEU]);
      } else {
#pragma unroll
        for (int e = 0; e < kEU; ++e) qf[i][u * kEU + e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < kEU; ++e) qf[i][u * kEU + e] *= qs;
    }
  }

  LocalizeKeyBounds(p, seq, lo_cta, hi_cta, lo, hi);
  const KeySplit keys = SplitKeys<kT>(lo_cta, hi_cta, p.num_splits, split);
  const int k_begin = keys.begin, k_end = keys.end, n_tiles = keys.n_tiles;
  int common_lo = k_begin, common_hi = k_end;  // keys visible to every valid row of the warp
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    lo[i] = valid[i] ? max(k_begin, lo[i]) : 0;
    hi[i] = valid[i] ? min(k_end, hi[i]) : 0;
    if (valid[i]) {
      common_lo = max(common_lo, lo[i]);
      common_hi = min(common_hi, hi[i]);
    }
  }

  // Tile loader: thread copies kCopies 16-byte units of K and the same units of V (and, int8,
  // some of the tile's 2 x kT scales).
  const KV* pool = static_cast<const KV*>(p.pool) + p.layer_offset + int64_t{kvh} * D;
  const float* scales = kScaled ? p.token_scales + p.scale_layer_offset + kvh : nullptr;
  const int32_t* table = p.block_tables + int64_t{seq} * p.max_blocks_per_seq;
  auto load_tile = [&](int t) {
    uint8_t* ks = smem + (t % kDecodeStages) * C::kStageBytes;
    uint8_t* vs = ks + kDecodeStageBytes / 2;
    const int tile_start = k_begin + t * kT;
#pragma unroll
    for (int j = 0; j < C::kCopies; ++j) {
      const int c = tid + j * kDecodeThreads;
      const int key = c / C::kRowUnits;
      const int unit = c % C::kRowUnits;
      const int pos = tile_start + key;
      const KV* src = pool;
      int bytes = 0;
      if (pos < k_end) {
        const int blk = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
        const int off = pos - blk * p.block_size;
        src = pool + int64_t{table[blk]} * p.block_elems + int64_t{off} * p.token_stride +
              unit * (16 / static_cast<int>(sizeof(KV)));
        bytes = 16;
      }
      CpAsync16(ks + c * 16, src, bytes);
      CpAsync16(vs + c * 16, src + (bytes ? p.tile_elems : 0), bytes);
    }
    if constexpr (kScaled) {
      float* sc = reinterpret_cast<float*>(ks + kDecodeStageBytes);  // [2][kT]: K, V
#pragma unroll
      for (int j = 0; j < (2 * kT + kDecodeThreads - 1) / kDecodeThreads; ++j) {
        const int c = tid + j * kDecodeThreads;
        if (c >= 2 * kT) break;
        const int key = c % kT;
        const int pos = tile_start + key;
        const float* src = scales;
        int bytes = 0;
        if (pos < k_end) {
          const int blk = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
          const int off = pos - blk * p.block_size;
          src = scales + int64_t{table[blk]} * p.scale_block_stride +
                int64_t{off} * p.num_kv_heads + (c >= kT ? p.scale_tile : 0);
          bytes = 4;
        }
        CpAsync4(sc + c, src, bytes);
      }
    }
  };

  const int nsg = 4 * KG;           // subgroups sharing a tile's keys
  const int sg = kg * 4 + sgw;      // this subgroup's index among them
  const int nb = kT / (nsg * kKB);  // softmax steps per tile

  auto compute_tile = [&](int t, auto masked_tag) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    const KV* ks = reinterpret_cast<const KV*>(smem + (t % kDecodeStages) * C::kStageBytes);
    const KV* vs = ks + kT * D;
    const float* k_sc = reinterpret_cast<const float*>(ks + 2 * kT * D);  // int8 only
    const float* v_sc = k_sc + kT;
    const int tile_start = k_begin + t * kT;
    for (int b = 0; b < nb; ++b) {
      const int key0 = b * nsg * kKB + sg * kKB;
      float s[RPW][kKB];
#pragma unroll
      for (int kk = 0; kk < kKB; ++kk) {
        float kf[kDL];
#pragma unroll
        for (int u = 0; u < kNU; ++u) {
          VecToFloat(
              *reinterpret_cast<const Vec<KV, kEU>*>(ks + (key0 + kk) * D + (l8 + 8 * u) * kEU),
              &kf[u * kEU]);
        }
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
          float dot = 0.0f;
#pragma unroll
          for (int d = 0; d < kDL; ++d) dot = fmaf(qf[i][d], kf[d], dot);
          s[i][kk] = dot;
        }
      }
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
#pragma unroll
        for (int kk = 0; kk < kKB; ++kk) {
          float v = s[i][kk];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          if constexpr (kScaled) v *= k_sc[key0 + kk];
          if (p.softcap_log2 > 0.0f) v = p.softcap_log2 * tanhf(v * p.inv_softcap);
          if constexpr (kMasked) {
            const int pos = tile_start + key0 + kk;
            if (pos < lo[i] || pos >= hi[i]) v = -INFINITY;
          }
          s[i][kk] = v;
        }
      }
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        float mx = s[i][0];
#pragma unroll
        for (int kk = 1; kk < kKB; ++kk) mx = fmaxf(mx, s[i][kk]);
        const float m_new = fmaxf(m[i], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        if (m_new > m[i]) {
          const float c = exp2f(m[i] - m_use);
          l[i] *= c;
#pragma unroll
          for (int d = 0; d < kDL; ++d) acc[i][d] *= c;
          m[i] = m_new;
        }
#pragma unroll
        for (int kk = 0; kk < kKB; ++kk) {
          s[i][kk] = exp2f(s[i][kk] - m_use);  // now the weight; 0 for masked keys
          l[i] += s[i][kk];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKB; ++kk) {
        float vf[kDL];
#pragma unroll
        for (int u = 0; u < kNU; ++u) {
          VecToFloat(
              *reinterpret_cast<const Vec<KV, kEU>*>(vs + (key0 + kk) * D + (l8 + 8 * u) * kEU),
              &vf[u * kEU]);
        }
        const float v_tok = kScaled ? v_sc[key0 + kk] : 1.0f;
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
          const float w = s[i][kk];
          // A masked key's V may be NaN (never-written slot of a partial block): skip, as
          // 0 * NaN would poison the row. (l sums w; the int8 V scale only weights V.)
          if (!kMasked || w != 0.0f) {
            const float wv = kScaled ? w * v_tok : w;
#pragma unroll
            for (int d = 0; d < kDL; ++d) acc[i][d] = fmaf(wv, vf[d], acc[i][d]);
          }
        }
      }
    }
  };

#pragma unroll
  for (int t = 0; t < kDecodeStages - 1; ++t) {
    if (t < n_tiles) load_tile(t);
    CpAsyncCommit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<kDecodeStages - 2>();
    __syncthreads();
    if (t + kDecodeStages - 1 < n_tiles) load_tile(t + kDecodeStages - 1);
    CpAsyncCommit();
    const int tile_start = k_begin + t * kT;
    if (tile_start >= common_lo && tile_start + kT <= common_hi) {
      compute_tile(t, std::false_type{});
    } else {
      compute_tile(t, std::true_type{});
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the ring is free: reused for the key-group merge below

  // Merge the 4 subgroups of the warp (butterfly: afterwards every subgroup holds the result).
#pragma unroll
  for (int off = 8; off <= 16; off *= 2) {
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const float mb = __shfl_xor_sync(0xffffffffu, m[i], off);
      const float lb = __shfl_xor_sync(0xffffffffu, l[i], off);
      float accb[kDL];
#pragma unroll
      for (int d = 0; d < kDL; ++d) accb[d] = __shfl_xor_sync(0xffffffffu, acc[i][d], off);
      MergeState<kDL>(m[i], l[i], acc[i], mb, lb, accb);
    }
  }
  // Merge key groups through shared memory: [warp][row][D + 2] floats.
  if (KG > 1) {
    float* red = reinterpret_cast<float*>(smem);
    if (kg > 0 && sgw == 0) {
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        float* dst = red + (warp * RPW + i) * (D + 2);
#pragma unroll
        for (int u = 0; u < kNU; ++u) {
#pragma unroll
          for (int e = 0; e < kEU; ++e) dst[(l8 + 8 * u) * kEU + e] = acc[i][u * kEU + e];
        }
        if (l8 == 0) {
          dst[D] = m[i];
          dst[D + 1] = l[i];
        }
      }
    }
    __syncthreads();
    if (kg == 0) {
      for (int g = 1; g < KG; ++g) {
        const int other = warp + g * RG;
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
          const float* src = red + (other * RPW + i) * (D + 2);
          float accb[kDL];
#pragma unroll
          for (int u = 0; u < kNU; ++u) {
#pragma unroll
            for (int e = 0; e < kEU; ++e) accb[u * kEU + e] = src[(l8 + 8 * u) * kEU + e];
          }
          MergeState<kDL>(m[i], l[i], acc[i], src[D], src[D + 1], accb);
        }
      }
    }
  }
  if (kg == 0 && sgw == 0) {  // one subgroup of the first key group writes
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      if (!valid[i]) continue;
      const int64_t row = int64_t{q_start + tok[i]} * p.num_q_heads + head[i];
      float o[kDL];
      float lse_row;
      if (l[i] == 0.0f) {  // no visible key in this split (NaN l compares false: propagates)
#pragma unroll
        for (int d = 0; d < kDL; ++d) o[d] = 0.0f;
        lse_row = -INFINITY;
      } else {
        const float inv = v_deq / l[i];
#pragma unroll
        for (int d = 0; d < kDL; ++d) o[d] = acc[i][d] * inv;
        lse_row = (m[i] + log2f(l[i])) * kLn2;
      }
      if (p.num_splits == 1) {
#pragma unroll
        for (int u = 0; u < kNU; ++u) {
          StoreRowPart<T, kEU>(&o[u * kEU], p.out + row * D + (l8 + 8 * u) * kEU);
        }
        if (p.lse != nullptr && l8 == 0) p.lse[row] = lse_row;
      } else {
        const int64_t prow = split * p.num_tokens * p.num_q_heads + row;
#pragma unroll
        for (int u = 0; u < kNU; ++u) {
          StoreRowPart<float, kEU>(&o[u * kEU], p.part_o + prow * D + (l8 + 8 * u) * kEU);
        }
        if (l8 == 0) p.part_lse[prow] = lse_row;
      }
    }
  }
  MergeIfLastSplit<D>(p, cta, min(p.rows_per_cta, rows_total - row0), smem);
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_KERNEL_CUH_
