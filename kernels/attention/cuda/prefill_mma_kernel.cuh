// mma.sync prefill attention kernel behind cuda::PagedPrefillAttention (internal; included by
// paged_prefill_cuda.cu only): head_dim 64/128/192/256, bf16/fp16 (pools of that dtype, or fp8
// e4m3 at head_dim 64/128), any sm_80+ GPU, and the reference the Hopper kernel is compared
// against. DV < D (MLA's unabsorbed prefill: keys of 192, values of 128) reads and multiplies only
// the first DV columns of each V row and writes out rows of DV.
//
// FlashAttention-2 shape: a persistent CTA of 4 warps takes work items of 64 query rows (token
// x group head); each warp owns 16 rows. Q sits in shared memory for the whole item; K/V tiles
// of 64 keys (32 at head_dim 256) stream from the pages through a cp.async ring, newest causal
// tile first. Scores and P.V run on mma.sync m16n8k16 with ldmatrix operands from XOR-swizzled
// rows (16-byte unit u of row r at u ^ (r & 7): 8-row ldmatrix reads hit distinct banks), the
// online softmax in registers (fp32, log2 domain), P rounded to T for the P.V product.
//
// fp8 e4m3 pools (KV = __nv_fp8_e4m3, head_dim 64/128): the ring holds the raw codes (half the
// bytes of a 16-bit stage) and each landed stage is widened into one T K/V tile pair before the
// same ldmatrix / mma code reads it (WidenFp8Tiles); the scales are folded into the scores and
// the output (ItemScales). Per tile: wait, barrier, issue the next copy (into the stage
// widened one tile ago, so already free), widen, barrier, compute.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_MMA_KERNEL_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_MMA_KERNEL_CUH_

#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/attention/cuda/prefill_common.cuh"

namespace tandem::kernels::cuda::internal::prefill {

// ---- fp8 e4m3 tiles ----
// The pool's codes arrive through the cp.async ring as they are (kKeys x D bytes per K or V tile,
// row-major, no swizzle); once a stage has landed the CTA widens it into one T-typed K/V tile pair
// laid out like the 16-bit ring's tiles. Exact: every e4m3 value is an fp16 (one hardware cvt per
// pair), and every fp16 of that range is a bf16 too (3 mantissa bits, exponents within bf16's).
// The codes are NOT multiplied by their scale (the kernel folds the scales into the scores and
// the output), so NaN codes (0x7f, 0xff) stay NaN and poison as a NaN in a 16-bit pool would.

// Two e4m3 codes (low byte first) -> two T values (the first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t Fp8PairTo(uint32_t pair16) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair16), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  } else {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// codes: one ring stage, the K tile's kKeys x D codes then the V tile's; dst: the K tile then the
// V tile as T (kKeys x D each), swizzled. Each thread widens 8 codes (one 16-byte unit of dst) per
// step: 8 consecutive threads read 64 consecutive bytes and write the 8 units of one row's aligned
// group of 8, which the swizzle only permutes, so neither side has bank conflicts.
template <typename T, int D, int kKeys, int kThreads>
__device__ __forceinline__ void WidenFp8Tiles(const uint8_t* codes, uint8_t* dst, int tid) {
  constexpr int kU = D / 8;
  static_assert(kU % 8 == 0 && kKeys % 8 == 0 && (2 * kKeys * kU) % kThreads == 0);
  // 4 steps in flight: fully unrolled (16 at head_dim 128), the loads all hoisted, the kernel ran
  // out of registers while the O accumulator is live (255 and a 28-byte spill; 4: none).
#pragma unroll 4
  for (int j = 0; j < 2 * kKeys * kU / kThreads; ++j) {
    const int c = tid + j * kThreads;
    const int row = c / kU, u = c % kU;  // row of K (< kKeys) or V; row & 7 == key & 7
    const uint2 x = *reinterpret_cast<const uint2*>(codes + c * 8);
    uint4 y;
    y.x = Fp8PairTo<T>(x.x & 0xffffu);
    y.y = Fp8PairTo<T>(x.x >> 16);
    y.z = Fp8PairTo<T>(x.y & 0xffffu);
    y.w = Fp8PairTo<T>(x.y >> 16);
    *reinterpret_cast<uint4*>(dst + (row * kU + (u ^ (row & 7))) * 16) = y;
  }
}

// kKvBytes: bytes of a pool element, 2 (T) or 1 (fp8 codes, widened to T in shared memory).
template <int D, int kKvBytes = 2>
struct MmaCfg {
  static constexpr int kThreads = 128;
  static constexpr int kRows = 64;
  static constexpr int kKeys = D <= 128 ? 64 : 32;
  static constexpr int kStages = D <= 128 ? 3 : 2;
  static constexpr int kUnits = D / 8;  // 16-byte units per row
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kKeys * D * 2;              // a K or V tile as T
  static constexpr int kStageTileBytes = kKeys * D * kKvBytes;  // a K or V tile in a ring stage
  // Q, the ring of K/V stages, and for fp8 one widened K/V tile pair.
  static constexpr int kWideOffset = kQBytes + kStages * 2 * kStageTileBytes;
  static constexpr int kSmemBytes = kWideOffset + (kKvBytes == 2 ? 0 : 2 * kTileBytes);
  static constexpr int kCtasPerSm =
      (227 * 1024) / (kSmemBytes + 1024) < 4 ? (227 * 1024) / (kSmemBytes + 1024) : 4;
  static_assert(kUnits >= 8, "swizzle needs rows of at least 128 bytes");
};

template <typename T, typename KV, int D, bool kSoftcap, int DV = D>
__global__ void __launch_bounds__(MmaCfg<D>::kThreads, 2)
    PrefillMmaKernel(const __grid_constant__ PrefillParams<T, KV> p) {
  constexpr bool kFp8 = !std::is_same_v<KV, T>;
  static_assert(!kFp8 || (std::is_same_v<KV, __nv_fp8_e4m3> && D <= 128 && DV == D),
                "fp8 pools: e4m3, head_dim 64 / 128, V of head_dim");
  using C = MmaCfg<D, int{sizeof(KV)}>;
  constexpr int kU = C::kUnits, kN8 = C::kKeys / 8;
  constexpr int kCU = D * int{sizeof(KV)} / 16, kChunkElems = 16 / int{sizeof(KV)};
  static_assert(DV % 16 == 0 && DV <= D, "V columns: a multiple of 16, at most D");
  extern __shared__ uint4 smem_u4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_u4);
  uint8_t* q_smem = smem;
  uint8_t* ring = smem + C::kQBytes;
  uint8_t* wide = smem + C::kWideOffset;  // fp8 only

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int mi = lane >> 3, mr = lane & 7;
  const uint32_t q_base = SmemAddr(q_smem);
  const uint32_t ring_base = SmemAddr(ring);
  const uint32_t wide_base = SmemAddr(wide);

  for (int w = blockIdx.x; w < p.num_work; w += gridDim.x) {
    WorkItem it;
    if (!GetWork<C::kRows>(p, p.query_start_loc, w, &it)) continue;
    const int nb_lo = it.lo_cta / C::kKeys, nb_hi = (it.hi_cta - 1) / C::kKeys;
    const int n_tiles = nb_hi - nb_lo + 1;
    const ItemScales sc = ScalesOf<kSoftcap>(p, it.kvh);
    const KV* kv = p.pool + int64_t{it.kvh} * D;
    const int32_t* table = p.block_tables + int64_t{it.seq} * p.max_blocks_per_seq;

    __syncthreads();  // the previous item is done with Q and the ring
    for (int c = tid; c < C::kRows * kU; c += C::kThreads) {
      const int r = c / kU, u = c % kU;
      const T* src = p.q;
      int bytes = 0;
      if (r < it.rows_here) {
        const int gr = it.row0 + r;
        src =
            p.q +
            (int64_t{it.q_start + gr / p.group} * p.num_q_heads + it.kvh * p.group + gr % p.group) *
                D +
            u * 8;
        bytes = 16;
      }
      CpAsync16(q_smem + (r * kU + (u ^ (r & 7))) * 16, src, bytes);
    }
    // Tile t holds keys [(nb_hi - t) * kKeys, + kKeys); keys outside [lo_cta, hi_cta) are
    // zero-filled (never read: their pages may not exist) and masked. T rows land swizzled for
    // ldmatrix, fp8 codes row-major (WidenFp8Tiles swizzles as it widens).
    auto load_tile = [&](int t) {
      uint8_t* ks = ring + (t % C::kStages) * 2 * C::kStageTileBytes;
      uint8_t* vs = ks + C::kStageTileBytes;
      const int key0 = (nb_hi - t) * C::kKeys;
#pragma unroll
      for (int j = 0; j < C::kKeys * kCU / C::kThreads; ++j) {
        const int c = tid + j * C::kThreads;
        const int key = c / kCU, u = c % kCU;
        const int pos = key0 + key;
        const KV* src = p.pool;
        int bytes = 0;
        if (pos >= it.lo_cta && pos < it.hi_cta) {
          const int blk = p.block_shift >= 0 ? pos >> p.block_shift : pos / p.block_size;
          const int off = pos - blk * p.block_size;
          src = kv + int64_t{table[blk]} * p.block_elems + int64_t{off} * p.token_stride +
                u * kChunkElems;
          bytes = 16;
        }
        const int dst = kFp8 ? c * 16 : (key * kU + (u ^ (key & 7))) * 16;
        CpAsync16(ks + dst, src, bytes);
        // Units past DV / 8 of a V row stay unread (the swizzle keeps u < DV / 8 below DV / 8).
        if (DV == D || u < DV / 8) CpAsync16(vs + dst, src + (bytes ? p.tile_elems : 0), bytes);
      }
    };
#pragma unroll
    for (int t = 0; t < C::kStages - 1; ++t) {
      if (t < n_tiles) load_tile(t);
      CpAsyncCommit();  // the first group carries Q too
    }

    int lo[2], hi[2];
    RowBounds(p, it, warp * 16 + g, &lo[0], &hi[0]);
    RowBounds(p, it, warp * 16 + g + 8, &lo[1], &hi[1]);
    float o[DV / 8 * 4];
#pragma unroll
    for (int i = 0; i < DV / 8 * 4; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_tiles; ++t) {
      CpAsyncWait<C::kStages - 2>();
      __syncthreads();
      if (t + C::kStages - 1 < n_tiles) load_tile(t + C::kStages - 1);
      CpAsyncCommit();
      uint32_t kbase = ring_base + (t % C::kStages) * 2 * C::kStageTileBytes;
      if constexpr (kFp8) {
        // Every thread's copies of stage t have landed and every warp is done with the previous
        // tile's widened pair (the barrier above): widen, then publish.
        WidenFp8Tiles<T, D, C::kKeys, C::kThreads>(ring + (t % C::kStages) * 2 * C::kStageTileBytes,
                                                   wide, tid);
        __syncthreads();
        kbase = wide_base;
      }
      const uint32_t vbase = kbase + C::kTileBytes;
      const int key0 = (nb_hi - t) * C::kKeys;

      float s[kN8 * 4];
#pragma unroll
      for (int i = 0; i < kN8 * 4; ++i) s[i] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[4];
        {
          const int r = warp * 16 + (mi & 1) * 8 + mr;
          LdMatrixX4(q_base + (r * kU + ((2 * ks + (mi >> 1)) ^ (r & 7))) * 16, qa);
        }
#pragma unroll
        for (int kb = 0; kb < kN8 / 2; ++kb) {
          const int key = kb * 16 + (mi >> 1) * 8 + mr;
          uint32_t b[4];
          LdMatrixX4(kbase + (key * kU + ((2 * ks + (mi & 1)) ^ (key & 7))) * 16, b);
          Mma16816<T>(s + (2 * kb) * 4, qa, b[0], b[1]);
          Mma16816<T>(s + (2 * kb + 1) * 4, qa, b[2], b[3]);
        }
      }
      const bool mask = key0 + C::kKeys > it.min_hi || key0 < it.max_lo;
      float corr[2];
      if (mask) {
        OnlineSoftmax<kN8, kSoftcap, true>(s, p, sc, key0, lo, hi, t4, m, l, corr);
      } else {
        OnlineSoftmax<kN8, kSoftcap, false>(s, p, sc, key0, lo, hi, t4, m, l, corr);
      }
#pragma unroll
      for (int n8 = 0; n8 < DV / 8; ++n8) {
        o[n8 * 4 + 0] *= corr[0];
        o[n8 * 4 + 1] *= corr[0];
        o[n8 * 4 + 2] *= corr[1];
        o[n8 * 4 + 3] *= corr[1];
      }
      uint32_t pa[kN8 / 2][4];
      WeightsToA<kN8, T>(s, pa);
#pragma unroll
      for (int kk = 0; kk < kN8 / 2; ++kk) {
        const int key = kk * 16 + (mi & 1) * 8 + mr;
#pragma unroll
        for (int dt = 0; dt < DV / 16; ++dt) {
          uint32_t b[4];
          LdMatrixX4Trans(vbase + (key * kU + ((2 * dt + (mi >> 1)) ^ (key & 7))) * 16, b);
          Mma16816<T>(o + (2 * dt) * 4, pa[kk], b[0], b[1]);
          Mma16816<T>(o + (2 * dt + 1) * 4, pa[kk], b[2], b[3]);
        }
      }
    }
    CpAsyncWait<0>();
    StoreRows<DV>(p, sc, it, warp * 16 + g, t4, o, m, l);
  }
}

}  // namespace tandem::kernels::cuda::internal::prefill

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_MMA_KERNEL_CUH_
