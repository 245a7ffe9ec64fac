// Device pieces shared by the two prefill attention kernels (internal; included by
// paged_prefill_cuda.cu through prefill_mma_kernel.cuh / prefill_wgmma_kernel.cuh only):
// launch parameters, the work-item map of the persistent grid, the online softmax on mma
// accumulator fragments, and thin PTX wrappers (mma.sync, ldmatrix, mbarrier).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_COMMON_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.cuh"

namespace tandem::kernels::cuda::internal::prefill {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// KV: the pool's element type, T itself or __nv_fp8_e4m3 (the mma.sync kernel only).
template <typename T, typename KV = T>
struct PrefillParams {
  const T* q;      // [num_tokens, num_q_heads, D]
  T* out;          // same
  float* lse;      // [num_tokens, num_q_heads] or null
  const KV* pool;  // the pool at (block 0, this layer, K): + block * block_elems + kv head * D
  int64_t block_elems;
  int64_t tile_elems;  // K -> V of the same (block, layer)
  int token_stride;    // num_kv_heads * D
  int block_size;
  int block_shift;  // log2(block_size), or -1 when not a power of two
  const int32_t* query_start_loc;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int num_seqs;
  int num_q_heads;
  int num_kv_heads;
  int group;
  int num_work;  // work items the grid walks (plan bound)
  // exp2 argument = raw score * score_scale - running max * score_scale: scale * log2(e), or
  // 1 with soft-cap, where the raw score is first mapped to softcap_log2 * tanh(s * softcap_pre).
  float score_scale;
  float softcap_pre;   // scale / softcap
  float softcap_log2;  // softcap * log2(e)
  int window_left;     // -1: none
  // fp8 pools only: device dequantization scales, [num_kv_heads] when scale_per_head, else [1].
  // Folded into the scores (k) and the output (v), never applied to the codes.
  const float* k_scale;
  const float* v_scale;
  bool scale_per_head;
};

// One work item: kRows query rows (token x group head, token-major) of one request and kv head.
struct WorkItem {
  int seq;
  int kvh;
  int q_start;    // first token row of the request in q/out
  int row0;       // first packed row of the tile
  int rows_here;  // valid rows, <= kRows
  int first_pos;  // position of the request's first new token
  int lo_cta;     // keys [lo_cta, hi_cta) are visible to at least one row of the tile
  int hi_cta;
  int min_hi;  // smallest exclusive causal bound over the tile's rows
  int max_lo;  // largest window start over the tile's rows (INT_MIN without a window)
};

// Work slots: request s owns slots [SlotOf(s), SlotOf(s + 1)), SlotOf(s) = floor(query_start_loc
// [s] * group / kRows) + s, which holds at least ceil(q_len * group / kRows) tiles, so the slot
// of a request is found by binary search on query_start_loc alone (no prefix sum of tile counts,
// no extra kernel). Slots past a request's tile count are empty. Item w = slot * kv_heads + kv
// head; tiles of even requests go last-first (the heaviest, most keys under the causal mask,
// first), of odd requests first-first.
template <int kRows>
__device__ __forceinline__ int SlotOf(const int32_t* qsl, int s, int group) {
  return static_cast<int>(int64_t{qsl[s]} * group / kRows) + s;
}

template <int kRows, typename T, typename KV>
__device__ __forceinline__ bool GetWork(const PrefillParams<T, KV>& p, const int32_t* qsl, int w,
                                        WorkItem* it) {
  const int slot = w / p.num_kv_heads;
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (SlotOf<kRows>(qsl, mid, p.group) <= slot) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int s = lo;
  const int i = slot - SlotOf<kRows>(qsl, s, p.group);
  const int q_start = qsl[s];
  const int q_len = qsl[s + 1] - q_start;
  const int rows_total = q_len * p.group;
  const int n_tiles = (rows_total + kRows - 1) / kRows;
  if (i < 0 || i >= n_tiles) return false;
  // Even requests newest tile first, odd ones oldest first: with WalkItem's alternating rounds
  // this keeps equal-length batches balanced (a scheduling model of the benchmark shapes: the
  // busiest CTA <= 3.1% above the mean, vs 18% with one order for all requests).
  const int tile = (s & 1) != 0 ? i : n_tiles - 1 - i;
  it->seq = s;
  it->kvh = w - slot * p.num_kv_heads;
  it->q_start = q_start;
  it->row0 = tile * kRows;
  it->rows_here = min(kRows, rows_total - it->row0);
  it->first_pos = p.seq_lens[s] - q_len;
  const int tok_first = it->row0 / p.group;
  const int tok_last = (it->row0 + it->rows_here - 1) / p.group;
  it->hi_cta = it->first_pos + tok_last + 1;
  it->min_hi = it->first_pos + tok_first + 1;
  if (p.window_left >= 0) {
    it->lo_cta = max(0, it->first_pos + tok_first - p.window_left);
    it->max_lo = it->first_pos + tok_last - p.window_left;
  } else {
    it->lo_cta = 0;
    it->max_lo = INT_MIN;
  }
  return it->hi_cta > it->lo_cta;
}

// The persistent grid's walk: round r covers items [r * grid, (r + 1) * grid); CTA b takes item
// r * grid + b in even rounds and r * grid + grid - 1 - b in odd ones. Items come heaviest first
// (GetWork: a request's tiles newest first, and requests' slots in order), so a plain
// round-robin hands CTA 0 the heaviest item of every round; alternating pairs heavy with light.
// Returns an item index, possibly >= num_work in the last round (nothing to do).
__device__ __forceinline__ int WalkItem(int round) {
  const int b = (round & 1) != 0 ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                                 : static_cast<int>(blockIdx.x);
  return round * static_cast<int>(gridDim.x) + b;
}

// Visible keys [lo, hi) of packed row r of the item; rows past rows_here see everything (their
// q is zero-filled, their output never written), so masking never empties them.
template <typename T, typename KV>
__device__ __forceinline__ void RowBounds(const PrefillParams<T, KV>& p, const WorkItem& it, int r,
                                          int* lo, int* hi) {
  if (r >= it.rows_here) {
    *lo = INT_MIN;
    *hi = INT_MAX;
    return;
  }
  const int pos = it.first_pos + (it.row0 + r) / p.group;
  *hi = pos + 1;
  *lo = p.window_left >= 0 ? max(0, pos - p.window_left) : INT_MIN;
}

// A work item's factors: the params' own for a T pool. An fp8 pool's scores are q . code, so its
// K scale multiplies the exp2 factor (with soft-cap the pre-tanh factor instead, score_scale being
// 1 there), and O = sum p code, so its V scale multiplies the output; the LSE, from the scaled
// scores, needs nothing more.
struct ItemScales {
  float score;        // PrefillParams::score_scale (x k_scale without soft-cap)
  float softcap_pre;  // PrefillParams::softcap_pre (x k_scale with soft-cap)
  float out;          // 1, or v_scale
};

template <bool kSoftcap, typename T, typename KV>
__device__ __forceinline__ ItemScales ScalesOf(const PrefillParams<T, KV>& p, int kvh) {
  ItemScales sc{p.score_scale, p.softcap_pre, 1.0f};
  if constexpr (!std::is_same_v<T, KV>) {
    const int i = p.scale_per_head ? kvh : 0;
    const float k_scale = p.k_scale[i];
    sc.out = p.v_scale[i];
    if constexpr (kSoftcap) {
      sc.softcap_pre *= k_scale;
    } else {
      sc.score *= k_scale;
    }
  }
  return sc;
}

__device__ __forceinline__ float Ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax over one key tile on mma accumulator fragments: s[n8 * 4 + e] holds this
// thread's scores of row g (e = 0, 1) and row g + 8 (e = 2, 3) at key key0 + 8 n8 + 2 t4 +
// (e & 1). Masks to [lo, hi) (when kMask), tracks the running max m (raw-score units) and the
// partial row sum l (this thread's columns only; summed over the quad at the end), replaces s by
// the weights exp2((s - m) * score_scale), and returns the factor that rescales the old O and l. A
// row whose keys are all masked so far keeps m = -inf and weights 0 (m_use = 0 avoids -inf - -inf);
// NaN scores are skipped by fmaxf and poison l, so the row's output is NaN.
// `sc`: the item's factors (ScalesOf); the overload without it uses the params' own (T pools).
template <int kN8, bool kSoftcap, bool kMask, typename T, typename KV>
__device__ __forceinline__ void OnlineSoftmax(float* s, const PrefillParams<T, KV>& p,
                                              const ItemScales& sc, int key0, const int (&lo)[2],
                                              const int (&hi)[2], int t4, float (&m)[2],
                                              float (&l)[2], float (&corr)[2]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int n8 = 0; n8 < kN8; ++n8) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[n8 * 4 + e];
      if constexpr (kSoftcap) v = p.softcap_log2 * tanhf(v * sc.softcap_pre);
      if constexpr (kMask) {
        const int pos = key0 + n8 * 8 + 2 * t4 + (e & 1);
        if (pos < lo[e >> 1] || pos >= hi[e >> 1]) v = -INFINITY;
      }
      s[n8 * 4 + e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  }
  float ms[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
    const float m_use = mx[j] == -INFINITY ? 0.0f : mx[j];
    ms[j] = m_use * sc.score;
    corr[j] = Ex2(m[j] * sc.score - ms[j]);
    m[j] = mx[j];
  }
#pragma unroll
  for (int n8 = 0; n8 < kN8; ++n8) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float w = Ex2(fmaf(s[n8 * 4 + e], sc.score, -ms[e >> 1]));
      s[n8 * 4 + e] = w;
      sum[e >> 1] += w;
    }
  }
  l[0] = l[0] * corr[0] + sum[0];
  l[1] = l[1] * corr[1] + sum[1];
}
template <int kN8, bool kSoftcap, bool kMask, typename T>
__device__ __forceinline__ void OnlineSoftmax(float* s, const PrefillParams<T>& p, int key0,
                                              const int (&lo)[2], const int (&hi)[2], int t4,
                                              float (&m)[2], float (&l)[2], float (&corr)[2]) {
  OnlineSoftmax<kN8, kSoftcap, kMask>(s, p, ItemScales{p.score_scale, p.softcap_pre, 1.0f}, key0,
                                      lo, hi, t4, m, l, corr);
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Weights of keys [16 kk, 16 kk + 16) of the tile as the A fragment of m16n8k16 (and of wgmma
// m64nNk16 with A in registers: the same per-warp layout).
template <int kN8, typename T>
__device__ __forceinline__ void WeightsToA(const float* s, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    const float* a = s + 8 * kk;
    pa[kk][0] = PackPair<T>(a[0], a[1]);
    pa[kk][1] = PackPair<T>(a[2], a[3]);
    pa[kk][2] = PackPair<T>(a[4], a[5]);
    pa[kk][3] = PackPair<T>(a[6], a[7]);
  }
}

// Normalizes and stores this thread's two rows (g, g + 8 of the warp's 16; packed rows r0 and
// r0 + 8 of the item) of the O accumulator o[n8 * 4 + e] and their LSE.
// `sc.out` multiplies the output (an fp8 pool's V scale); sc.score gives the LSE its units.
template <int D, typename T, typename KV>
__device__ __forceinline__ void StoreRows(const PrefillParams<T, KV>& p, const ItemScales& sc,
                                          const WorkItem& it, int r0, int t4, const float* o,
                                          const float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = r0 + 8 * j;
    if (r >= it.rows_here) continue;
    const int gr = it.row0 + r;
    const int64_t row =
        int64_t{it.q_start + gr / p.group} * p.num_q_heads + it.kvh * p.group + gr % p.group;
    const bool empty = l[j] == 0.0f;  // NaN compares false: propagates
    const float inv = empty ? 0.0f : sc.out / l[j];
    uint32_t* dst = reinterpret_cast<uint32_t*>(p.out + row * D) + t4;
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8) {
      dst[n8 * 4] = PackPair<T>(o[n8 * 4 + 2 * j] * inv, o[n8 * 4 + 2 * j + 1] * inv);
    }
    if (p.lse != nullptr && t4 == 0) {
      p.lse[row] = empty ? -INFINITY : (m[j] * sc.score + __log2f(l[j])) * kLn2;
    }
  }
}
template <int D, typename T>
__device__ __forceinline__ void StoreRows(const PrefillParams<T>& p, const WorkItem& it, int r0,
                                          int t4, const float* o, const float (&m)[2],
                                          float (&l)[2]) {
  StoreRows<D>(p, ItemScales{p.score_scale, p.softcap_pre, 1.0f}, it, r0, t4, o, m, l);
}

// ---- PTX wrappers ----

// MbarInit, MbarArrive, MbarWait: kernels/cuda/tensor_map.cuh (one owner).
using internal::MbarArrive;
using internal::MbarInit;
using internal::MbarWait;
// Arrives when `pred` holds. Predicated inside the asm, not by a branch: a divergent branch
// between wgmma issue and wait makes ptxas wait for every wgmma in flight (it cannot track the
// groups across it), which would serialize the softmax with the P.V product.
__device__ __forceinline__ void MbarArriveIf(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::
          "r"(SmemAddr(bar)),
      "r"(static_cast<uint32_t>(pred))
      : "memory");
}
}  // namespace tandem::kernels::cuda::internal::prefill

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_COMMON_CUH_
