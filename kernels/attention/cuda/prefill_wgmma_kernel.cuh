// Hopper (sm_90a) prefill attention kernel behind cuda::PagedPrefillAttention for head_dim
// 64/128, bf16/fp16 (internal; included by paged_prefill_cuda.cu only).
//
// A persistent CTA of three warpgroups takes work items of 128 query rows (token x group head)
// of one (request, kv head), like FlashAttention-3:
//   * warpgroup 0 (producer, registers cut to 40 by setmaxnreg) copies the item's Q and then
//     its K/V tiles of 128 keys, newest causal tile first, from the pages into a 3-stage ring
//     (4 at head_dim 64) with cp.async (WgProducer); each copy batch is signalled on its
//     "full" mbarrier two batches later. Keys outside the item's visible range are
//     zero-filled, never read (their pages may not exist);
//   * warpgroups 1 and 2 (consumers, 232 registers) own 64 rows each: S = Q K^T by wgmma from
//     shared memory, the online softmax on the accumulators, O += P V by wgmma with P in
//     registers. Within a warpgroup the softmax of tile t overlaps the P.V product of tile t-1
//     (issued before it, waited after it); across warpgroups the two interleave naturally on
//     the tensor cores. Each consumer warp arrives on the stage's "empty" barrier once its
//     wgmma reading it has completed.
// Q, K and V sit in the 128-byte-swizzled layout wgmma reads (prefill_wgmma.cuh). The grid is
// fixed by the plan; items are walked in alternating round-robin (WalkItem), heaviest tile of each
// request first.
//
// Performance (H200, d128, causal, bf16): 389-526 TFLOP/s (README.md). A 16-byte copy costs
// the producer ~8-10 instructions (WgProducer); with ~80 (a table lookup and 64-bit address
// math per copy) it bound the kernel at ~200. What remains: per-item overhead and the static
// round-robin schedule's imbalance (README.md).
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_KERNEL_CUH_
#define TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_KERNEL_CUH_

#include <type_traits>

#include "kernels/attention/cuda/prefill_common.cuh"
#include "kernels/attention/cuda/prefill_wgmma.cuh"

namespace tandem::kernels::cuda::internal::prefill {

template <int D>
struct WgCfg {
  static constexpr int kThreads = 384;
  static constexpr int kRows = 128;  // two consumer warpgroups x 64
  static constexpr int kKeys = 128;
  // Q + kStages x (K + V) must fit the 227 KB opt-in limit: 32 + 3 x 64 KB at head_dim 128.
  static constexpr int kStages = D == 64 ? 4 : 3;
  static constexpr int kUnits = D / 8;
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kKeys * D * 2;
  static constexpr int kBlockBytes = kKeys * 128;  // one 64-column block of a Q/K/V tile
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + kStages * kTileBytes;
  static constexpr int kBarOff = kVOff + kStages * kTileBytes;
  static constexpr int kNumBars = 2 + 4 * kStages;
  static constexpr int kQslCache = 256;  // requests whose query_start_loc is cached in smem
  static constexpr int kQslOff = kBarOff + kNumBars * 8;
  static constexpr int kSmemBytes = kQslOff + (kQslCache + 1) * 4 + 1024;  // + alignment slack
  static_assert(D == 64 || D == 128);
  static_assert(kRows * 128 == kBlockBytes, "Q and K blocks share one geometry");
  static_assert(kSmemBytes <= 227 * 1024);
};

// cp.async of 16 bytes from global byte address `src` to shared address `dst`; src_bytes = 0
// zero-fills the destination and reads nothing.
__device__ __forceinline__ void CpAsync16Raw(uint32_t dst, uint64_t src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// The producer warpgroup: copies each work item's Q and then its K/V tiles (newest first) into
// the ring. Thread tid owns 16-byte unit u = tid % kUnits of rows tid / kUnits + j * kCopyRows
// of every Q/K/V tile. A tile is stored as 64-column blocks of kBlockBytes, 128-byte swizzled
// (unit u of row r at (u / 8) * kBlockBytes + r * 128 + ((u % 8) ^ (r % 8)) * 16); kCopyRows is
// a multiple of 8, so all of a thread's rows share one swizzle phase and its destinations are a
// constant kCopyRows * 128 bytes apart.
//
// Paged K/V, fast path (block_size a power of two >= 4, so a 128-key tile spans <= 32 pages):
// once per tile each lane turns one block-table entry into the 64-bit address of its page's
// rows for this kv head (plus the tile's row offset inside a page larger than the tile); a copy
// then costs a shuffle of that address, one multiply-add for the row within the page and the
// cp.async. Tiles wholly inside the item's visible keys skip the zero-fill predicate. The
// table entries of the next tile are loaded one tile ahead. Other block sizes take a generic
// per-copy path.
//
// Each copy batch (Q of an item, K or V of a tile) is one cp.async group whose "full" barrier
// is signalled two batches later: this thread waits for the batch to land (cp.async.wait_group
// 2 leaves the two newest in flight), makes its writes visible to the async proxy the wgmma
// reads through (fence.proxy.async), then arrives. (An arrival by cp.async.mbarrier.arrive
// right after the copies stalled the producer for a full memory round trip per batch.) Two
// batches in flight never deadlock with >= 3 stages: every barrier the producer blocks on is
// released by work that needs only batches at least two behind, and it flushes before waiting
// for Q.
template <typename T, int D>
__device__ __forceinline__ void WgProducer(const PrefillParams<T>& p, const int32_t* qsl,
                                           uint8_t* smem, uint64_t* bars) {
  using C = WgCfg<D>;
  constexpr int kU = C::kUnits;
  constexpr int kCopyRows = 128 / kU;            // rows one pass of the 128 threads covers
  constexpr int kCopies = C::kKeys / kCopyRows;  // passes per tile (Q: kRows == kKeys)
  static_assert(kCopyRows % 8 == 0 && C::kRows == C::kKeys);
  uint64_t* q_full = bars;
  uint64_t* q_empty = bars + 1;
  uint64_t* k_full = bars + 2;
  uint64_t* v_full = k_full + C::kStages;
  uint64_t* k_empty = v_full + C::kStages;
  uint64_t* v_empty = k_empty + C::kStages;
  const int tid = threadIdx.x, lane = tid & 31;
  const int first_row = tid / kU, u = tid % kU;
  const uint32_t smem_base = SmemAddr(smem);
  const uint32_t dst0 =
      (u >> 3) * C::kBlockBytes + first_row * 128 + (((u & 7) ^ (first_row & 7)) << 4);
  // Row offsets inside a page (< 128 rows) stay 32-bit on the fast path.
  const bool fast = p.block_shift >= 2 && p.token_stride < (1 << 23);
  const int shift = p.block_shift;
  const int bs_mask = p.block_size - 1;
  const uint32_t row_bytes = static_cast<uint32_t>(p.token_stride) * 2;
  const uint64_t block_bytes = static_cast<uint64_t>(p.block_elems) * 2;
  const uint64_t v_bytes = static_cast<uint64_t>(p.tile_elems) * 2;

  uint32_t kvc = 0, qc = 0;
  uint64_t* pend_old = nullptr;
  uint64_t* pend_new = nullptr;
  auto commit_job = [&](uint64_t* full) {
    CpAsyncCommit();
    if (pend_old != nullptr) {
      CpAsyncWait<2>();
      FenceProxyAsync();
      MbarArrive(pend_old);
    }
    pend_old = pend_new;
    pend_new = full;
  };
  auto flush = [&] {
    CpAsyncWait<0>();
    FenceProxyAsync();
    if (pend_old != nullptr) MbarArrive(pend_old);
    if (pend_new != nullptr) MbarArrive(pend_new);
    pend_old = pend_new = nullptr;
  };

  for (int round = 0; round * static_cast<int>(gridDim.x) < p.num_work; ++round) {
    const int w = WalkItem(round);
    WorkItem it;
    if (w >= p.num_work || !GetWork<C::kRows>(p, qsl, w, &it)) continue;
    const int nb_lo = it.lo_cta / C::kKeys, nb_hi = (it.hi_cta - 1) / C::kKeys;
    // The consumers release Q after their last QK^T of the previous item, which needs that
    // item's K tiles signalled: flush before blocking.
    flush();
    MbarWait(q_empty, (qc & 1) ^ 1);
    {
      // Packed row r = token * group + head; one division per item, then steps of kCopyRows
      // rows = (kCopyRows / group tokens, kCopyRows % group heads).
      const int dtok = kCopyRows / p.group, dh = kCopyRows - dtok * p.group;
      int tok = (it.row0 + first_row) / p.group;
      int h = it.row0 + first_row - tok * p.group;
      const T* q_head = p.q + int64_t{it.kvh} * p.group * D + u * 8;
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const bool valid = first_row + j * kCopyRows < it.rows_here;
        const T* src = q_head + (int64_t{it.q_start + tok} * p.num_q_heads + h) * D;
        CpAsync16Raw(smem_base + dst0 + j * kCopyRows * 128,
                     reinterpret_cast<uint64_t>(valid ? src : p.q), valid ? 16u : 0u);
        h += dh;
        tok += dtok;
        if (h >= p.group) {
          h -= p.group;
          ++tok;
        }
      }
    }
    commit_job(q_full);
    ++qc;
    const uint64_t head_base = reinterpret_cast<uint64_t>(p.pool + int64_t{it.kvh} * D);
    const int32_t* table = p.block_tables + int64_t{it.seq} * p.max_blocks_per_seq;

    // Fast path: lane's page of tile nb, or -1 (no entry loaded: not a page of the tile, or no
    // visible key in it; such pages may lie past the table row).
    auto lane_entry = [&](int nb) -> int32_t {
      const int tile_start = nb * C::kKeys;
      const int blk = (tile_start >> shift) + lane;
      const int64_t key_lo = int64_t{blk} * p.block_size;
      const bool needed = blk <= ((tile_start + C::kKeys - 1) >> shift) && key_lo < it.hi_cta &&
                          key_lo + p.block_size > it.lo_cta;
      return needed ? table[blk] : -1;
    };
    auto load_fast = [&](uint32_t dst, uint64_t lane_base, int tile_start, auto all_visible) {
      constexpr bool kAllVisible = decltype(all_visible)::value;
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const int key = first_row + j * kCopyRows;
        const uint64_t base = __shfl_sync(0xffffffffu, lane_base, key >> shift);
        const uint32_t off = static_cast<uint32_t>(key & bs_mask) * row_bytes + u * 16;
        uint32_t bytes = 16;
        if constexpr (!kAllVisible) {
          const int pos = tile_start + key;
          bytes = pos >= it.lo_cta && pos < it.hi_cta ? 16u : 0u;
        }
        CpAsync16Raw(dst + j * kCopyRows * 128, base + off, bytes);
      }
    };
    // Generic path (block size not a power of two, or < 4): per-copy table lookup.
    const T* kv = p.pool + int64_t{it.kvh} * D;
    auto load_generic = [&](uint32_t dst, int64_t v_off, int tile_start) {
#pragma unroll 4
      for (int j = 0; j < kCopies; ++j) {
        const int key = first_row + j * kCopyRows;
        const int pos = tile_start + key;
        const T* src = p.pool;
        uint32_t bytes = 0;
        if (pos >= it.lo_cta && pos < it.hi_cta) {
          const int blk = pos / p.block_size;
          const int off = pos - blk * p.block_size;
          src = kv + int64_t{table[blk]} * p.block_elems + v_off + int64_t{off} * p.token_stride +
                u * 8;
          bytes = 16;
        }
        CpAsync16Raw(dst + j * kCopyRows * 128, reinterpret_cast<uint64_t>(src), bytes);
      }
    };

    int32_t next_entry = fast ? lane_entry(nb_hi) : 0;
    for (int nb = nb_hi; nb >= nb_lo; --nb) {
      const int st = kvc % C::kStages;
      const uint32_t ph = (kvc / C::kStages) & 1;
      const int tile_start = nb * C::kKeys;
      const uint32_t k_dst = smem_base + C::kKOff + st * C::kTileBytes + dst0;
      const uint32_t v_dst = smem_base + C::kVOff + st * C::kTileBytes + dst0;
      if (fast) {
        const int32_t entry = next_entry;
        if (nb > nb_lo) next_entry = lane_entry(nb - 1);  // in flight during this tile
        // Pages larger than the tile: the tile's rows start (tile_start & bs_mask) rows in.
        const uint64_t lane_base =
            entry < 0 ? head_base
                      : head_base + static_cast<uint64_t>(entry) * block_bytes +
                            static_cast<uint64_t>(tile_start & bs_mask) * row_bytes;
        const bool all_visible = tile_start >= it.lo_cta && tile_start + C::kKeys <= it.hi_cta;
        MbarWait(k_empty + st, ph ^ 1);
        if (all_visible) {
          load_fast(k_dst, lane_base, tile_start, std::true_type{});
        } else {
          load_fast(k_dst, lane_base, tile_start, std::false_type{});
        }
        commit_job(k_full + st);
        MbarWait(v_empty + st, ph ^ 1);
        if (all_visible) {
          load_fast(v_dst, lane_base + v_bytes, tile_start, std::true_type{});
        } else {
          load_fast(v_dst, lane_base + v_bytes, tile_start, std::false_type{});
        }
        commit_job(v_full + st);
      } else {
        MbarWait(k_empty + st, ph ^ 1);
        load_generic(k_dst, 0, tile_start);
        commit_job(k_full + st);
        MbarWait(v_empty + st, ph ^ 1);
        load_generic(v_dst, p.tile_elems, tile_start);
        commit_job(v_full + st);
      }
      ++kvc;
    }
  }
  flush();
}

template <typename T, int D, bool kSoftcap>
__global__ void __launch_bounds__(WgCfg<D>::kThreads, 1)
    PrefillWgmmaKernel(const __grid_constant__ PrefillParams<T> p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgCfg<D>;
  constexpr int kN8 = C::kKeys / 8, kO = D / 2;
  extern __shared__ uint8_t smem_raw[];
  // wgmma's swizzle is a function of address bits 7-9: blocks must be 1024-byte aligned.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kBarOff);
  uint64_t* q_full = bars;
  uint64_t* q_empty = bars + 1;
  uint64_t* k_full = bars + 2;
  uint64_t* v_full = k_full + C::kStages;
  uint64_t* k_empty = v_full + C::kStages;
  uint64_t* v_empty = k_empty + C::kStages;
  int32_t* qsl_cache = reinterpret_cast<int32_t*>(smem + C::kQslOff);

  if (threadIdx.x == 0) {
    MbarInit(q_full, 128);  // producer threads
    MbarInit(q_empty, 8);   // consumer warps
    for (int s = 0; s < C::kStages; ++s) {
      MbarInit(k_full + s, 128);
      MbarInit(v_full + s, 128);
      MbarInit(k_empty + s, 8);
      MbarInit(v_empty + s, 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  const bool cached = p.num_seqs <= C::kQslCache;
  if (cached) {
    for (int i = threadIdx.x; i <= p.num_seqs; i += C::kThreads) {
      qsl_cache[i] = p.query_start_loc[i];
    }
  }
  __syncthreads();
  const int32_t* qsl = cached ? qsl_cache : p.query_start_loc;

  if (threadIdx.x < 128) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    WgProducer<T, D>(p, qsl, smem, bars);
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int ctid = threadIdx.x - 128;
  const int wg = ctid / 128, warp = (ctid / 32) % 4, lane = ctid % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int r0 = wg * 64 + warp * 16 + g;  // this thread's rows: r0, r0 + 8
  const uint32_t q_addr = SmemAddr(smem) + wg * 64 * 128;
  const uint32_t k_addr = SmemAddr(smem + C::kKOff);
  const uint32_t v_addr = SmemAddr(smem + C::kVOff);

  auto qk = [&](float* s, int st) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t koff = (kk >> 2) * C::kBlockBytes + (kk & 3) * 32;
      WgmmaSS128<T>(s, SmemDesc(q_addr + koff, 16, 1024),
                    SmemDesc(k_addr + st * C::kTileBytes + koff, 16, 1024), kk > 0 ? 1u : 0u);
    }
  };
  auto pv = [&](float* o, uint32_t(*pa)[4], int st) {
#pragma unroll
    for (int kk = 0; kk < C::kKeys / 16; ++kk) {
      WgmmaRS<T, D>(o, pa[kk],
                    SmemDesc(v_addr + st * C::kTileBytes + kk * 16 * 128, C::kBlockBytes, 1024));
    }
  };
  // The producer fenced its copies into the async proxy before arriving: a wait suffices.
  auto wait_full = [&](uint64_t* bar, uint32_t parity) { MbarWait(bar, parity); };

  uint32_t kvc = 0, qc = 0;
  for (int round = 0; round * static_cast<int>(gridDim.x) < p.num_work; ++round) {
    const int w = WalkItem(round);
    WorkItem it;
    if (w >= p.num_work || !GetWork<C::kRows>(p, qsl, w, &it)) continue;
    const int nb_lo = it.lo_cta / C::kKeys, nb_hi = (it.hi_cta - 1) / C::kKeys;
    const int n_tiles = nb_hi - nb_lo + 1;
    int lo[2], hi[2];
    RowBounds(p, it, r0, &lo[0], &hi[0]);
    RowBounds(p, it, r0 + 8, &lo[1], &hi[1]);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
    float s[kN8 * 4];
    float o[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.0f;
    uint32_t pa[kN8 / 2][4];
    // Tiles wholly inside every row's visible range skip the mask: compile-time variants of
    // the softmax, chosen per tile by a warp-uniform branch taken where no wgmma is in flight.
    auto needs_mask = [&](int t) {
      const int key0 = (nb_hi - t) * C::kKeys;
      return key0 + C::kKeys > it.min_hi || key0 < it.max_lo;
    };

    MbarWait(q_full, qc & 1);
    ++qc;
    // Tile 0 (the newest keys): scores and softmax only.
    int st = kvc % C::kStages;
    uint32_t ph = (kvc / C::kStages) & 1;
    wait_full(k_full + st, ph);
    WgmmaFence();
    qk(s, st);
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < kN8 * 4; ++i) FenceOperand(s[i]);
    MbarArriveIf(k_empty + st, lane == 0);
    MbarArriveIf(q_empty, lane == 0 && n_tiles == 1);
    if (needs_mask(0)) {
      OnlineSoftmax<kN8, kSoftcap, true>(s, p, nb_hi * C::kKeys, lo, hi, t4, m, l, corr);
    } else {
      OnlineSoftmax<kN8, kSoftcap, false>(s, p, nb_hi * C::kKeys, lo, hi, t4, m, l, corr);
    }
    WeightsToA<kN8, T>(s, pa);
    int pst = st;
    uint32_t pph = ph;
    ++kvc;

    // One key tile: S(t) = Q K(t)^T and O += P(t-1) V(t-1) issued together; the softmax of
    // S(t) runs while the P.V product is still on the tensor cores.
    auto step = [&](int t, auto mask_tag) {
      constexpr bool kMask = decltype(mask_tag)::value;
      st = kvc % C::kStages;
      ph = (kvc / C::kStages) & 1;
      wait_full(k_full + st, ph);
      WgmmaFence();
      qk(s, st);
      WgmmaCommit();
      wait_full(v_full + pst, pph);
      // Each batch gets its own fence, as in FA3 (one warpgroup_arrive per GEMM): with the
      // barrier-wait loop between the QK^T batch and this one, ptxas would otherwise inject
      // the same warpgroup.arrive here itself and say so (C7519) in every build.
      WgmmaFence();
      pv(o, pa, pst);
      WgmmaCommit();
      WgmmaWait<1>();  // scores of tile t ready; P.V of tile t-1 may still run
#pragma unroll
      for (int i = 0; i < kN8 * 4; ++i) FenceOperand(s[i]);
      MbarArriveIf(k_empty + st, lane == 0);
      MbarArriveIf(q_empty, lane == 0 && t == n_tiles - 1);
      OnlineSoftmax<kN8, kSoftcap, kMask>(s, p, (nb_hi - t) * C::kKeys, lo, hi, t4, m, l, corr);
#pragma unroll
      for (int i = 0; i < kN8 * 4; ++i) FenceOperand(s[i]);
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < kO; ++i) FenceOperand(o[i]);
#pragma unroll
      for (int kk = 0; kk < kN8 / 2; ++kk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) FenceOperand(pa[kk][e]);
      }
      MbarArriveIf(v_empty + pst, lane == 0);
#pragma unroll
      for (int n8 = 0; n8 < D / 8; ++n8) {
        o[n8 * 4 + 0] *= corr[0];
        o[n8 * 4 + 1] *= corr[0];
        o[n8 * 4 + 2] *= corr[1];
        o[n8 * 4 + 3] *= corr[1];
      }
      WeightsToA<kN8, T>(s, pa);
      pst = st;
      pph = ph;
      ++kvc;
    };
    for (int t = 1; t < n_tiles; ++t) {
      if (needs_mask(t)) {
        step(t, std::true_type{});
      } else {
        step(t, std::false_type{});
      }
    }
    wait_full(v_full + pst, pph);
    WgmmaFence();
    pv(o, pa, pst);
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < kO; ++i) FenceOperand(o[i]);
    MbarArriveIf(v_empty + pst, lane == 0);
    StoreRows<D>(p, it, r0, t4, o, m, l);
  }
#endif
}

}  // namespace tandem::kernels::cuda::internal::prefill

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_PREFILL_WGMMA_KERNEL_CUH_
