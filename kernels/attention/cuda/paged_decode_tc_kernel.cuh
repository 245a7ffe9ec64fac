// Tensor-core flash-decoding kernel behind cuda::PagedAttention for bf16/fp16/fp8/int8 KV with
// head_dim 64/128 (internal; included by paged_attention_cuda.cu only).
//
// CTA = 4 warps = (request, kv head, row tile of up to 16 query rows, KV split), like the CUDA-
// core kernel in paged_decode_kernel.cuh, but scores and P.V run on mma.sync m16n8k16: the
// rows (token x group head, zero-padded to 16) are the A operand, K and V go from shared memory
// to B fragments with ldmatrix (.trans for V), so the kernel issues a few instructions per
// 16-byte unit of KV and stays memory-bound. K/V tiles of 64 keys (128 for 1-byte KV) stream
// through a cp.async ring; shared-memory rows are XOR-swizzled in 16-byte units so ldmatrix's 8-row
// reads hit 8 distinct bank groups. Each warp owns 16 (1-byte KV: 32) keys of every tile with its
// own online softmax (fp32, log2 domain); P is rounded to the MMA type for the P.V product (as
// FlashAttention does) while l sums the fp32 weights. Warps merge at the end through shared memory.
//
// 1-byte KV (fp8 e4m3, int8) stays 1-byte in shared memory and is widened to fp16 in registers,
// straight into the B fragments (as FlashInfer and vLLM do), so the MMA runs in fp16:
//  * K: one ldmatrix 8x8 b16 matrix is 8 keys x 16 one-byte dims; a thread gets 4 consecutive
//    dims 4*t4..4*t4+3 of key g, which widen to the two B registers of one k16 step if the k
//    index is permuted (k 2t4, 2t4+1 -> dims 4t4, 4t4+1; k 2t4+8, 2t4+9 -> dims 4t4+2, 4t4+3).
//    q's A fragment is loaded with the same permutation, so q.k is unchanged.
//  * V: ldmatrix.trans of the same 8 x 16-byte matrix gives a thread, for keys 2t4 and 2t4+1,
//    the bytes of dims 2g and 2g+1; a byte permute pairs them per dim, and two MMAs (even and
//    odd dims) cover the unit. Output column n of the even (odd) MMA of unit u is dim
//    16u + 2n (+ 1); the final merge writes dims through that map.
//  * fp8 -> fp16 is one hardware cvt per pair (exact); int8 -> fp16 puts the byte, offset to
//    unsigned, into the mantissa of 1024 and subtracts 1152 (exact, no I2F).
//  * Scales: fp8's per-tensor/per-head K scale is folded into q, the V scale into the output.
//    int8's per-token K scale multiplies each score after the MMA; its V scale is folded into P
//    before rounding to fp16, normalized by the warp tile's largest V scale (so P' <= 1 keeps
//    fp16's precision), with the accumulator kept in units of that scale (rescaled together
//    with the softmax correction; the units are clamped to [2^-40, 2^40] so ratios stay finite).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_TC_KERNEL_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_TC_KERNEL_CUH_

#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/attention/cuda/paged_decode_kernel.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal {

template <int D, typename KV>
struct TcCfg {
  static constexpr int kKvBytes = static_cast<int>(sizeof(KV));
  static constexpr bool kByte = kKvBytes == 1;  // fp8 / int8: widened in registers
  // Keys per tile: 16 x kKeyBlocks per warp. 1-byte tiles take twice the keys, so a tile is as
  // many bytes as a 2-byte one and the per-tile costs (barrier, softmax update, accumulator
  // rescale) are spread over as many bytes.
  static constexpr int kKeyBlocks = kByte ? 2 : 1;
  static constexpr int kT = 64 * kKeyBlocks;
  // 3 stages at head_dim 128 for every KV dtype: 2 CTAs (8 warps) per SM. fp8 ran 2 stages at
  // 3 CTAs per SM while each 16-byte copy cost a table lookup (latency-bound: the extra warps
  // gained more than the shallower ring lost); with page-shuffled copies the deeper ring wins
  // (H200, attention_cuda_bench --flush_l2, same call: 64 x 4k 72.4 -> 81.8% of 4.3 TB/s,
  // 64 x 16k 91.3 -> 95.9%, 256 x 4k 88.6 -> 91.0%, 16 x 16k 79.2 -> 81.4%, 1 x 64k 44 -> 47%).
  static constexpr int kStages = D <= 64 ? 4 : 3;
  static constexpr int kRowUnits = D * kKvBytes / 16;       // 16-byte units per stored row
  static constexpr int kDataBytes = 2 * kT * D * kKvBytes;  // K + V as stored
  static constexpr int kScaleBytes = kTokenScaled<KV> ? 2 * kT * 4 : 0;  // int8: K, V scales
  static constexpr int kStageBytes = kDataBytes + kScaleBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kCopies = kT * kRowUnits / kDecodeThreads;  // per thread, K (and V)
  static constexpr int kCtasPerSm =
      (227 * 1024) / (kSmemBytes + 1024) < 4 ? (227 * 1024) / (kSmemBytes + 1024) : 4;
  static constexpr int kRows = 16;
  // Swizzle of 16-byte units: the 8 consecutive keys one ldmatrix matrix reads at one logical
  // unit land in 8 distinct 16-byte bank groups (rows shorter than 128 B share a 128 B line).
  static constexpr int kKeysPerLine = kRowUnits >= 8 ? 1 : 8 / kRowUnits;
  static constexpr int kSwizzleMask = (kRowUnits >= 8 ? 8 : kRowUnits) - 1;
  static __device__ __forceinline__ int Swizzle(int key, int unit) {
    return unit ^ ((key / kKeysPerLine) & kSwizzleMask);
  }
  static_assert(4 * (kRows * (D + 2)) * 4 <= kSmemBytes);
  static_assert(kCopies * kDecodeThreads == kT * kRowUnits);
  static_assert(!kByte || kRowUnits % 2 == 0);
};

// cp.async of 16 bytes to shared address `dst`; src_bytes = 0 zero-fills and reads nothing.
__device__ __forceinline__ void CpAsync16At(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  Vec<T, 2> v;
  v.v[0] = FromFloat<T>(lo);
  v.v[1] = FromFloat<T>(hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 4 one-byte K dims (bytes 0-3 of x) -> the two fp16x2 B registers of one k16 step:
// lo = (byte 0, byte 1), hi = (byte 2, byte 3).
template <typename KV>
__device__ __forceinline__ void WidenK(uint32_t x, uint32_t& lo, uint32_t& hi);
// ldmatrix.trans word (bytes: key 2t4 dims 2g, 2g+1; key 2t4+1 dims 2g, 2g+1) -> per-dim key
// pairs: even = (byte 0, byte 2), odd = (byte 1, byte 3).
template <typename KV>
__device__ __forceinline__ void WidenV(uint32_t x, uint32_t& even, uint32_t& odd);

__device__ __forceinline__ uint32_t Fp8PairToHalf2(uint32_t pair16) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair16), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
// u: int8 bytes xor 0x80 (i.e. x + 128); sel picks two of them into the low bytes of two fp16
// 0x64XX = 1024 + (x + 128); subtracting 1152 leaves x, exactly.
__device__ __forceinline__ uint32_t Int8PairToHalf2(uint32_t u, uint32_t sel) {
  const uint32_t biased = __byte_perm(u, 0x64646464u, sel);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&biased),
                            __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ void WidenK<__nv_fp8_e4m3>(uint32_t x, uint32_t& lo, uint32_t& hi) {
  lo = Fp8PairToHalf2(x & 0xffffu);
  hi = Fp8PairToHalf2(x >> 16);
}
template <>
__device__ __forceinline__ void WidenV<__nv_fp8_e4m3>(uint32_t x, uint32_t& even, uint32_t& odd) {
  const uint32_t y = __byte_perm(x, 0u, 0x3120);  // bytes 0, 2, 1, 3
  even = Fp8PairToHalf2(y & 0xffffu);
  odd = Fp8PairToHalf2(y >> 16);
}
template <>
__device__ __forceinline__ void WidenK<int8_t>(uint32_t x, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = x ^ 0x80808080u;
  lo = Int8PairToHalf2(u, 0x4140);
  hi = Int8PairToHalf2(u, 0x4342);
}
template <>
__device__ __forceinline__ void WidenV<int8_t>(uint32_t x, uint32_t& even, uint32_t& odd) {
  const uint32_t u = x ^ 0x80808080u;
  even = Int8PairToHalf2(u, 0x4240);
  odd = Int8PairToHalf2(u, 0x4341);
}

// kClusterMerge (PagedAttentionPlan::cluster_merge): the grid's num_splits CTAs along x form one
// cluster; each keeps its split's partial in shared memory (after the warp merge's rows) and the
// cluster merges them (ClusterMergeSplits): no workspace, no ticket, no merge kernel. A template
// constant, so the default kernels compile as before.
template <typename T, typename KV, int D, bool kClusterMerge = false>
__global__ void __launch_bounds__(kDecodeThreads, TcCfg<D, KV>::kCtasPerSm)
    PagedDecodeTcKernel(const __grid_constant__ DecodeParams<T> p) {
  using C = TcCfg<D, KV>;
  constexpr bool kByte = C::kByte;
  constexpr bool kFp8 = std::is_same_v<KV, __nv_fp8_e4m3>;
  constexpr bool kScaled = kTokenScaled<KV>;
  using M = std::conditional_t<kByte, __half, T>;  // MMA operand type
  constexpr int kT = C::kT, kRU = C::kRowUnits, kKs = D / 16;
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  AllowDependentLaunch();  // the split merge (paged_decode_merge.cuh) may be scheduled now
  constexpr int kAhead = C::kStages - 1;  // tiles in flight ahead of the one computed

  // Fast copy path (block size a power of two, a tile spanning at most 32 pages; see below).
  const int shift = p.block_shift;
  const bool fast = shift >= 0 && ((kT - 1) >> shift) + 2 <= 32 &&
                    int64_t{p.block_size} * p.token_stride < (int64_t{1} << 30);
  const int32_t* table = p.block_tables + int64_t{blockIdx.z} * p.max_blocks_per_seq;
  // The first tiles' block-table entries for the split a request of the plan's length gets,
  // loaded with seq_lens (the table row's address does not depend on it): when this split starts
  // there (always for split 0 without a window; every split at the planned length) the K/V copies
  // do not wait for a second dependent round trip. Entries past the request's last page are
  // never used, and the loads stay inside the table row.
  const int spec_begin = SplitKeys<kT>(0, p.planned_keys, p.num_splits, blockIdx.x).begin;
  int32_t spec_entries[kAhead];
#pragma unroll
  for (int t = 0; t < kAhead; ++t) {
    const int64_t page = ((spec_begin + t * kT) >> max(shift, 0)) + threadIdx.x % 32;
    spec_entries[t] = fast && p.max_blocks_per_seq > 0
                          ? table[page < p.max_blocks_per_seq ? page : p.max_blocks_per_seq - 1]
                          : 0;
  }

  const DecodeCta cta = LocateDecodeCta(p, C::kRows);
  const int split = cta.split, kvh = cta.kvh, seq = cta.seq, q_start = cta.q_start;
  const int q_len = cta.q_len, seq_len = cta.seq_len, rows_total = cta.rows_total, row0 = cta.row0;
  if (row0 >= rows_total) return;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int first_pos = seq_len - q_len;
  const int rows_here = min(C::kRows, rows_total - row0);
  const int tok_first = row0 / p.group;
  const int tok_last = (row0 + rows_here - 1) / p.group;
  int lo_cta = p.window_left >= 0 ? max(0, first_pos + tok_first - p.window_left) : 0;
  int hi_cta = first_pos + tok_last + 1;
  // PDL (PagedAttentionPlanInput::programmatic_launch): the request's bounds and the first
  // block-table entries above are the host's; q, the pool and the workspace may be the previous
  // kernel's. A no-op in a grid launched without the attribute.
  WaitForPrecedingGrid();

  // This thread's two rows (g, g + 8): visible keys (global until the split is known) and q as
  // A fragments.
  int lo[2], hi[2];
  const T* q_row[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int rr = g + 8 * j;
    const bool valid = rr < rows_here;
    const int gr = row0 + rr;
    const int tok = valid ? gr / p.group : 0;
    const int pos = first_pos + tok;
    lo[j] = p.window_left >= 0 ? max(0, pos - p.window_left) : 0;
    hi[j] = valid ? pos + 1 : 0;  // invalid rows: empty
    q_row[j] =
        valid ? p.q + (int64_t{q_start + tok} * p.num_q_heads + kvh * p.group + gr % p.group) * D
              : nullptr;
  }
  float k_deq = 1.0f, v_deq = 1.0f;
  if constexpr (kFp8) {
    k_deq = p.k_scale[p.per_head_scale ? kvh : 0];
    v_deq = p.v_scale[p.per_head_scale ? kvh : 0];
  }
  uint32_t qa[kKs][4];
#pragma unroll
  for (int ks = 0; ks < kKs; ++ks) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const T* row = q_row[r & 1];
      qa[ks][r] = 0u;
      if (row == nullptr) continue;
      if constexpr (kByte) {  // permuted k (see the file comment); q x fp8 k_scale, as fp16
        const T* src = row + ks * 16 + t4 * 4 + 2 * (r >> 1);
        qa[ks][r] = PackPair<M>(ToFloat(src[0]) * k_deq, ToFloat(src[1]) * k_deq);
      } else {
        qa[ks][r] = *reinterpret_cast<const uint32_t*>(row + ks * 16 + t4 * 2 + 8 * (r >> 1));
      }
    }
  }

  LocalizeKeyBounds(p, seq, lo_cta, hi_cta, lo, hi);
  const KeySplit keys = SplitKeys<kT>(lo_cta, hi_cta, p.num_splits, split);
  const int k_begin = keys.begin, k_end = keys.end, n_tiles = keys.n_tiles;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    lo[j] = max(k_begin, lo[j]);
    hi[j] = min(k_end, hi[j]);
  }

  const KV* pool = static_cast<const KV*>(p.pool) + p.layer_offset + int64_t{kvh} * D;
  const float* scales = kScaled ? p.token_scales + p.scale_layer_offset + kvh : nullptr;
  // Copies of tile t into its ring stage. Thread tid copies unit tid % kRU of keys
  // tid / kRU + j * kKeyStep (all at one swizzle phase, so its destinations are a constant
  // kDstStep apart). Fast path (block size a power of two, a tile spanning at most 32 pages):
  // lane i holds the table entry of the tile's i-th page, loaded one tile ahead (lane_entry),
  // and a copy takes its page by a shuffle: ~12 SASS instructions per 16-byte K+V copy pair,
  // where the per-copy table lookup of the generic path cost ~50 and a dependent global load
  // on each copy's issue path.
  constexpr int kKeyStep = kDecodeThreads / kRU;
  constexpr int kDstStep = kKeyStep * kRU * 16;
  static_assert(kDecodeThreads % kRU == 0 &&
                kKeyStep % (C::kKeysPerLine * (C::kSwizzleMask + 1)) == 0);
  const int first_key = tid / kRU, unit = tid % kRU;
  const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                        (first_key * kRU + C::Swizzle(first_key, unit)) * 16;
  const int unit_elems = unit * (16 / C::kKvBytes);
  const KV* pool_unit = pool + unit_elems;
  // (Row offsets inside a page stay 32-bit on the fast path.)
  const int bs_mask = p.block_size - 1;
  auto lane_entry = [&](int t) -> int32_t {
    const int tile_start = k_begin + t * kT;
    const int page = (tile_start >> shift) + lane;
    const int last = (min(tile_start + kT, k_end) - 1) >> shift;
    return page <= last ? table[page] : 0;
  };
  auto load_fast = [&](int t, int32_t entry, auto all_valid) {
    constexpr bool kAllValid = decltype(all_valid)::value;
    const uint32_t kdst = dst0 + (t % C::kStages) * C::kStageBytes;
    const int tile_start = k_begin + t * kT;
    const int page0 = tile_start >> shift;
    // Lane i: the address of its page's rows for this kv head (+ the thread's unit below).
    const KV* lane_page = pool + int64_t{entry} * p.block_elems;
#pragma unroll
    for (int j = 0; j < C::kCopies; ++j) {
      const int pos = tile_start + first_key + j * kKeyStep;
      const KV* page = reinterpret_cast<const KV*>(__shfl_sync(
          0xffffffffu, reinterpret_cast<uintptr_t>(lane_page), ((pos >> shift) - page0) & 31));
      const KV* src = page + ((pos & bs_mask) * p.token_stride + unit_elems);
      int bytes = 16;
      int64_t v_off = p.tile_elems;
      if constexpr (!kAllValid) {
        if (pos >= k_end) {
          src = pool;
          bytes = 0;
          v_off = 0;
        }
      }
      CpAsync16At(kdst + j * kDstStep, src, bytes);
      CpAsync16At(kdst + C::kDataBytes / 2 + j * kDstStep, src + v_off, bytes);
    }
    if constexpr (kScaled) {  // 2 x kT scales, K then V
      static_assert(2 * kT % kDecodeThreads == 0);
      uint8_t* ks = smem + (t % C::kStages) * C::kStageBytes;
#pragma unroll
      for (int j = 0; j < 2 * kT / kDecodeThreads; ++j) {
        const int c = tid + j * kDecodeThreads;
        const int pos = tile_start + c % kT;
        const int32_t e = __shfl_sync(0xffffffffu, entry, ((pos >> shift) - page0) & 31);
        const bool valid = pos < k_end;
        const float* src = valid ? scales + int64_t{e} * p.scale_block_stride +
                                       int64_t{pos & bs_mask} * p.num_kv_heads +
                                       (c >= kT ? p.scale_tile : 0)
                                 : scales;
        CpAsync4(reinterpret_cast<float*>(ks + C::kDataBytes) + c, src, valid ? 4 : 0);
      }
    }
  };
  // Generic path: any block size, a table lookup per copy.
  auto load_generic = [&](int t) {
    uint8_t* ks = smem + (t % C::kStages) * C::kStageBytes;
    uint8_t* vs = ks + C::kDataBytes / 2;
    const int tile_start = k_begin + t * kT;
#pragma unroll
    for (int j = 0; j < C::kCopies; ++j) {
      const int c = tid + j * kDecodeThreads;
      const int key = c / kRU;
      const int pos = tile_start + key;
      const KV* src = pool;
      int bytes = 0;
      if (pos < k_end) {
        const int blk = pos / p.block_size;
        const int off = pos - blk * p.block_size;
        src = pool_unit + int64_t{table[blk]} * p.block_elems + int64_t{off} * p.token_stride;
        bytes = 16;
      }
      const int dst = (key * kRU + C::Swizzle(key, unit)) * 16;
      CpAsync16(ks + dst, src, bytes);
      CpAsync16(vs + dst, src + (bytes ? p.tile_elems : 0), bytes);
    }
    if constexpr (kScaled) {
#pragma unroll
      for (int j = 0; j < 2 * kT / kDecodeThreads; ++j) {
        const int c = tid + j * kDecodeThreads;
        const int pos = tile_start + c % kT;
        const float* src = scales;
        int bytes = 0;
        if (pos < k_end) {
          const int blk = pos / p.block_size;
          const int off = pos - blk * p.block_size;
          src = scales + int64_t{table[blk]} * p.scale_block_stride +
                int64_t{off} * p.num_kv_heads + (c >= kT ? p.scale_tile : 0);
          bytes = 4;
        }
        CpAsync4(reinterpret_cast<float*>(ks + C::kDataBytes) + c, src, bytes);
      }
    }
  };
  auto load_tile = [&](int t, int32_t entry) {
    if (!fast) {
      load_generic(t);
    } else if (k_begin + (t + 1) * kT <= k_end) {
      load_fast(t, entry, std::true_type{});
    } else {
      load_fast(t, entry, std::false_type{});
    }
  };

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float ounit = 1.0f;  // int8: o holds the output in units of this V scale
  constexpr int kKB = C::kKeyBlocks, kNT = 2 * kKB;  // 16-key blocks, 8-key n-tiles per warp
  const int key0 = warp * 16 * kKB;
  const int mi = lane >> 3, mr = lane & 7;

  {
    const bool spec_hit = k_begin == spec_begin;  // uniform over the CTA
    int32_t entries[kAhead];
#pragma unroll
    for (int t = 0; t < kAhead; ++t) {
      entries[t] = !fast || t >= n_tiles ? 0 : spec_hit ? spec_entries[t] : lane_entry(t);
    }
#pragma unroll
    for (int t = 0; t < kAhead; ++t) {
      if (t < n_tiles) load_tile(t, entries[t]);
      CpAsyncCommit();
    }
  }
  int32_t next_entry = fast && kAhead < n_tiles ? lane_entry(kAhead) : 0;
  for (int t = 0; t < n_tiles; ++t) {
    CpAsyncWait<C::kStages - 2>();
    __syncthreads();
    if (t + kAhead < n_tiles) {
      load_tile(t + kAhead, next_entry);
      // The next tile's entries load while this tile computes.
      if (fast && t + kAhead + 1 < n_tiles) next_entry = lane_entry(t + kAhead + 1);
    }
    CpAsyncCommit();
    const uint8_t* tile = smem + (t % C::kStages) * C::kStageBytes;
    const uint32_t kbase = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
    const uint32_t vbase = kbase + C::kDataBytes / 2;
    const int tile_start = k_begin + t * kT;
    if (tile_start + key0 >= k_end) continue;  // this warp's keys are all beyond the split

    // ldmatrix lanes: matrices 0/1 = keys 0-7 / 8-15 of a 16-key block, at units u / u + 1
    // (1-byte) or (K) 8-dim halves of a k16 step (2-byte). s[nt]: keys key0 + 8 nt ...
    float s[kNT][4] = {};
    if constexpr (kByte) {
#pragma unroll
      for (int kb = 0; kb < kKB; ++kb) {
        const int key = key0 + kb * 16 + (mi & 1) * 8 + mr;
#pragma unroll
        for (int u = 0; u < kRU; u += 2) {
          uint32_t b[4];
          LdMatrixX4(kbase + (key * kRU + C::Swizzle(key, u + (mi >> 1))) * 16, b);
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // unit u + h = k16 step u + h
            uint32_t lo0, hi0, lo1, hi1;
            WidenK<KV>(b[2 * h], lo0, hi0);
            WidenK<KV>(b[2 * h + 1], lo1, hi1);
            Mma16816<M>(s[2 * kb], qa[u + h], lo0, hi0);
            Mma16816<M>(s[2 * kb + 1], qa[u + h], lo1, hi1);
          }
        }
      }
    } else {
      const int key = key0 + (mi >> 1) * 8 + mr;
#pragma unroll
      for (int ks = 0; ks < kKs; ++ks) {
        uint32_t b[4];
        LdMatrixX4(kbase + (key * kRU + C::Swizzle(key, ks * 2 + (mi & 1))) * 16, b);
        Mma16816<M>(s[0], qa[ks], b[0], b[1]);
        Mma16816<M>(s[1], qa[ks], b[2], b[3]);
      }
    }
    // int8: this thread's keys key0 + nt * 8 + 2 * t4 + (e & 1) and their K / V scales.
    float ksc[kNT][2] = {}, vsc[kNT][2] = {};
    if constexpr (kScaled) {
      const float* sc = reinterpret_cast<const float*>(tile + C::kDataBytes);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const float2 kp = *reinterpret_cast<const float2*>(sc + key0 + nt * 8 + 2 * t4);
        const float2 vp = *reinterpret_cast<const float2*>(sc + kT + key0 + nt * 8 + 2 * t4);
        ksc[nt][0] = kp.x;
        ksc[nt][1] = kp.y;
        vsc[nt][0] = vp.x;
        vsc[nt][1] = vp.y;
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = e >> 1;
        const int pos = tile_start + key0 + nt * 8 + t4 * 2 + (e & 1);
        float v = s[nt][e];
        if constexpr (kScaled) v *= ksc[nt][e & 1];
        v = p.softcap_log2 > 0.0f ? p.softcap_log2 * tanhf(v * p.q_scale * p.inv_softcap)
                                  : v * p.q_scale;
        if (pos < lo[j] || pos >= hi[j]) v = -INFINITY;
        s[nt][e] = v;
        mx[j] = fmaxf(mx[j], v);
      }
    }
    // int8: the unit of this tile's P.V = the warp's largest V scale of its keys (fmaxf drops
    // NaN scales; a NaN still reaches the output through its own weight).
    float tile_unit = 1.0f;
    if constexpr (kScaled) {
      tile_unit = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) tile_unit = fmaxf(tile_unit, fmaxf(vsc[nt][0], vsc[nt][1]));
      tile_unit = fmaxf(tile_unit, __shfl_xor_sync(0xffffffffu, tile_unit, 1));
      tile_unit = fmaxf(tile_unit, __shfl_xor_sync(0xffffffffu, tile_unit, 2));
      tile_unit = fminf(fmaxf(tile_unit, 0x1p-40f), 0x1p40f);
    }
    float m_use[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
      const float m_new = fmaxf(m[j], mx[j]);
      m_use[j] = m_new == -INFINITY ? 0.0f : m_new;
      const float c = exp2f(m[j] - m_use[j]);
      l[j] *= c;
      // (Fast division: the units are within [2^-40, 2^40], where it is accurate to 2 ulp.)
      const float oc = kScaled ? c * __fdividef(ounit, tile_unit) : c;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * j] *= oc;
        o[n][2 * j + 1] *= oc;
      }
      m[j] = m_new;
    }
    ounit = tile_unit;
    const float inv_unit = __fdividef(1.0f, tile_unit);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float w = exp2f(s[nt][e] - m_use[e >> 1]);
        l[e >> 1] += w;
        // int8: fold the key's V scale into its weight (a masked key's scale is never read).
        s[nt][e] = kScaled ? (w == 0.0f ? 0.0f : w * (vsc[nt][e & 1] * inv_unit)) : w;
      }
    }
    if constexpr (kByte) {
#pragma unroll
      for (int kb = 0; kb < kKB; ++kb) {
        const uint32_t pa[4] = {PackPair<M>(s[2 * kb][0], s[2 * kb][1]),
                                PackPair<M>(s[2 * kb][2], s[2 * kb][3]),
                                PackPair<M>(s[2 * kb + 1][0], s[2 * kb + 1][1]),
                                PackPair<M>(s[2 * kb + 1][2], s[2 * kb + 1][3])};
        const int key = key0 + kb * 16 + (mi & 1) * 8 + mr;
#pragma unroll
        for (int u = 0; u < kRU; u += 2) {
          uint32_t b[4];
          LdMatrixX4Trans(vbase + (key * kRU + C::Swizzle(key, u + (mi >> 1))) * 16, b);
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // unit u + h: dims 16 (u + h) .. + 15
            uint32_t e0, o0, e1, o1;
            WidenV<KV>(b[2 * h], e0, o0);      // keys 0-7 of the block
            WidenV<KV>(b[2 * h + 1], e1, o1);  // keys 8-15
            Mma16816<M>(o[2 * (u + h)], pa, e0, e1);
            Mma16816<M>(o[2 * (u + h) + 1], pa, o0, o1);
          }
        }
      }
    } else {
      const uint32_t pa[4] = {PackPair<M>(s[0][0], s[0][1]), PackPair<M>(s[0][2], s[0][3]),
                              PackPair<M>(s[1][0], s[1][1]), PackPair<M>(s[1][2], s[1][3])};
      const int key = key0 + (mi & 1) * 8 + mr;
#pragma unroll
      for (int dt = 0; dt < kKs; ++dt) {
        uint32_t b[4];
        LdMatrixX4Trans(vbase + (key * kRU + C::Swizzle(key, dt * 2 + (mi >> 1))) * 16, b);
        Mma16816<M>(o[2 * dt], pa, b[0], b[1]);
        Mma16816<M>(o[2 * dt + 1], pa, b[2], b[3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // ring free: reuse it for the warp merge

  // Row sums live spread over the 4 lanes of a row.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
  float* red = reinterpret_cast<float*>(smem) + warp * C::kRows * (D + 2);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // Column map of the accumulators (1-byte: even/odd-dim MMAs per 16-dim unit).
      const int dim =
          kByte ? (n >> 1) * 16 + 4 * t4 + 2 * (e & 1) + (n & 1) : n * 8 + t4 * 2 + (e & 1);
      red[(g + 8 * (e >> 1)) * (D + 2) + dim] = kScaled ? o[n][e] * ounit : o[n][e];
    }
  }
  if (t4 == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      red[(g + 8 * j) * (D + 2) + D] = m[j];
      red[(g + 8 * j) * (D + 2) + D + 1] = l[j];
    }
  }
  __syncthreads();

  const float* base = reinterpret_cast<const float*>(smem);
  // Cluster merge: the CTA's partial [kRows][D] and LSEs [kRows], then ClusterMergeSplits'
  // scratch, behind the warp merge's rows (16-byte aligned: the rows are 256 (D + 2) bytes).
  constexpr int kRedFloats = 4 * C::kRows * (D + 2);
  float* const cpart_o = reinterpret_cast<float*>(smem) + kRedFloats;
  float* const cpart_lse = cpart_o + C::kRows * D;
  static_assert(!kClusterMerge || (kRedFloats + C::kRows * (D + 1) +
                                   ClusterMergeSmemFloats(C::kRows, kMaxClusterMergeSplits)) *
                                          4 <=
                                      C::kSmemBytes);
  for (int idx = tid; idx < rows_here * D; idx += kDecodeThreads) {
    const int rr = idx / D, d = idx % D;
    float mw[4], mstar = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mw[w] = base[(w * C::kRows + rr) * (D + 2) + D];
      mstar = fmaxf(mstar, mw[w]);
    }
    const float m_use = mstar == -INFINITY ? 0.0f : mstar;
    float lsum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float c = exp2f(mw[w] - m_use);
      lsum += c * base[(w * C::kRows + rr) * (D + 2) + D + 1];
      acc += c * base[(w * C::kRows + rr) * (D + 2) + d];
    }
    const int gr = row0 + rr;
    const int64_t row =
        int64_t{q_start + gr / p.group} * p.num_q_heads + kvh * p.group + gr % p.group;
    const bool empty = lsum == 0.0f;  // NaN compares false: propagates
    const float out = empty ? 0.0f : acc * v_deq / lsum;
    const float lse_row = empty ? -INFINITY : (mstar + log2f(lsum)) * kLn2;
    if (p.num_splits == 1) {
      p.out[row * D + d] = FromFloat<T>(out);
      if (p.lse != nullptr && d == 0) p.lse[row] = lse_row;
    } else if constexpr (kClusterMerge) {
      cpart_o[idx] = out;
      if (d == 0) cpart_lse[rr] = lse_row;
    } else {
      const int64_t prow = split * p.num_tokens * p.num_q_heads + row;
      p.part_o[prow * D + d] = out;
      if (d == 0) p.part_lse[prow] = lse_row;
    }
  }
  if constexpr (kClusterMerge) {
    ClusterMergeSplits<T, D>(
        cpart_o, cpart_lse, rows_here, [&](int rr) { return DecodeRow(p, cta, rr); }, p.out, p.lse,
        cpart_lse + C::kRows);
  } else {
    MergeIfLastSplit<D>(p, cta, rows_here, smem);
  }
}

}  // namespace tandem::kernels::cuda::internal

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PAGED_DECODE_TC_KERNEL_CUH_
