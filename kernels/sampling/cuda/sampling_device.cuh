// Device pieces of the sampling kernels (sampling_cuda.cu): the launch constants, a row slice's
// max / argmax, the 128-bit fixed-point sums and block scans, and the row passes (radix select,
// prefix search, inverse CDF, probabilities) that SampleRowKernel chains. The method is described
// at the top of sampling_cuda.cu. Internal: include from this package's .cu files only.
#ifndef TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_DEVICE_CUH_
#define TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_DEVICE_CUH_

#include <cstdint>
#include <limits>

#include "kernels/sampling/cuda/sampling_cuda.h"

namespace tandem::kernels::cuda::sampling_internal {

using U128 = unsigned __int128;
using u64 = unsigned long long;

constexpr int kSplitThreads = 256;
constexpr int kRowThreads = 512;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kMaxSplits = 32;
constexpr int64_t kMinSplitElems = 4096;
constexpr int kTargetCtas = 264;  // ~2 waves of 132 SMs for the max pass
constexpr int kHistBins = 2048;   // radix digits: 11, 11, 10 bits
constexpr int32_t kNoIndex = std::numeric_limits<int32_t>::max();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One slice of a row, as RowMaxKernel leaves it in the workspace.
struct alignas(16) Partial {
  float max;             // largest non-NaN logit (meaningless when argmax < 0)
  int32_t argmax;        // its lowest index, -1 when the slice is all NaN
  int32_t num_eligible;  // not NaN and not -inf
  int32_t num_pos_inf;
};

inline int64_t NumSplits(int64_t num_rows, int64_t vocab) {
  const int64_t by_vocab = (vocab + kMinSplitElems - 1) / kMinSplitElems;
  const int64_t by_rows = (kTargetCtas + num_rows - 1) / num_rows;
  const int64_t splits = by_vocab < by_rows ? by_vocab : by_rows;
  return splits < 1 ? 1 : (splits > kMaxSplits ? kMaxSplits : splits);
}

// ---- Max pass ------------------------------------------------------------------------------

// (v1, a1) ranks before (v2, a2): larger value, then lower index; a < 0 means none.
__device__ __forceinline__ bool Better(float v1, int32_t a1, float v2, int32_t a2) {
  return a1 >= 0 && (a2 < 0 || v1 > v2 || (v1 == v2 && a1 < a2));
}

// The logits of a row that take part in sampling: the first vocab_limit when 0 < limit < vocab.
__device__ __forceinline__ int64_t SampledVocab(int64_t vocab, int64_t vocab_limit) {
  return vocab_limit > 0 && vocab_limit < vocab ? vocab_limit : vocab;
}

// ---- Sampling helpers ----------------------------------------------------------------------

// Order-preserving map to unsigned: a > b (floats) iff key(a) > key(b). -0 maps like +0,
// because the CPU compares logits with == and treats them as tied.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyToFloat(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ double ToDouble(U128 v) {
  return static_cast<double>(static_cast<u64>(v >> 64)) * 0x1p64 +
         static_cast<double>(static_cast<u64>(v));
}
// floor(t) for finite t >= 0 (below 2^128).
__device__ __forceinline__ U128 FloorToU128(double t) {
  if (t < 0x1p64) return static_cast<u64>(t);
  const double hi = floor(t * 0x1p-64);
  const double lo = t - hi * 0x1p64;  // exact: hi * 2^64 is t with its low bits cleared
  return (static_cast<U128>(static_cast<u64>(hi)) << 64) + static_cast<u64>(lo);
}
// ceil(t) for finite t >= 0; doubles from 2^53 up are integers.
__device__ __forceinline__ U128 CeilToU128(double t) {
  return t < 0x1p53 ? static_cast<U128>(static_cast<u64>(ceil(t))) : FloorToU128(t);
}

struct SampleSmem {
  // 128-bit bin sums as four 32-bit limbs, hist[j][b] = bits 32j.. of bin b: shared-memory
  // atomics are native for 32 bits (64-bit adds would be compare-and-swap loops, which collapse
  // under the contention of a histogram). Also the tile sums of PrefixSearch.
  uint32_t hist[4][kHistBins];
  U128 scan_warp[kRowWarps];
  U128 scan_total;
  U128 sel_above;
  U128 sel_at;
  int32_t max_warp[kRowWarps];
  int32_t sel_digit;
  int32_t result;
  float row_max;
  int32_t row_argmax;
  int64_t num_eligible;
  int64_t num_pos_inf;
};

// Adds v to the 128-bit sum held in limbs limb0[0], limb0[stride], limb0[2 * stride], ...:
// each 32-bit atomic that wraps carries one into the next limb. Integer addition is
// associative, so the final sum is exact and independent of the atomics' order.
__device__ __forceinline__ void AtomicAddLimbs(uint32_t* limb0, int stride, U128 v) {
  uint32_t carry = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t part = static_cast<uint32_t>(v >> (32 * j));
    uint32_t next_carry = 0;
    if (part != 0) {
      const uint32_t old = atomicAdd(limb0 + j * stride, part);
      next_carry += old + part < old;
    }
    if (carry != 0) {
      const uint32_t old = atomicAdd(limb0 + j * stride, carry);
      next_carry += old + carry < old;
    }
    carry = next_carry;
    if (carry == 0 && (j == 3 || (v >> (32 * (j + 1))) == 0)) break;
  }
}
__device__ __forceinline__ U128 Bin(const SampleSmem& s, int b) {
  return static_cast<U128>(s.hist[0][b]) | (static_cast<U128>(s.hist[1][b]) << 32) |
         (static_cast<U128>(s.hist[2][b]) << 64) | (static_cast<U128>(s.hist[3][b]) << 96);
}

__device__ __forceinline__ U128 ShflUp(U128 v, int d) {
  const u64 lo = __shfl_up_sync(0xffffffffu, static_cast<u64>(v), d);
  const u64 hi = __shfl_up_sync(0xffffffffu, static_cast<u64>(v >> 64), d);
  return (static_cast<U128>(hi) << 64) | lo;
}

__device__ __forceinline__ U128 WarpSum(U128 v) {
  for (int o = 16; o > 0; o /= 2) {
    const u64 lo = __shfl_xor_sync(0xffffffffu, static_cast<u64>(v), o);
    const u64 hi = __shfl_xor_sync(0xffffffffu, static_cast<u64>(v >> 64), o);
    v += (static_cast<U128>(hi) << 64) | lo;
  }
  return v;
}

// Exclusive prefix sum over threads in threadIdx order; *total = the sum of all.
__device__ inline U128 BlockExclusiveScan(U128 v, U128* total, SampleSmem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  U128 incl = v;
  for (int d = 1; d < 32; d *= 2) {
    const U128 o = ShflUp(incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) s.scan_warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const U128 w = lane < kRowWarps ? s.scan_warp[lane] : U128{0};
    U128 w_incl = w;
    for (int d = 1; d < 32; d *= 2) {
      const U128 o = ShflUp(w_incl, d);
      if (lane >= d) w_incl += o;
    }
    if (lane < kRowWarps) s.scan_warp[lane] = w_incl - w;
    if (lane == kRowWarps - 1) s.scan_total = w_incl;
  }
  __syncthreads();
  const U128 result = s.scan_warp[warp] + incl - v;
  *total = s.scan_total;
  __syncthreads();  // scan_* are reused by the next scan
  return result;
}

__device__ inline int32_t BlockMax(int32_t v, SampleSmem& s) {
  v = __reduce_max_sync(0xffffffffu, v);
  if (threadIdx.x % 32 == 0) s.max_warp[threadIdx.x / 32] = v;
  __syncthreads();
  int32_t m = s.max_warp[0];
  for (int w = 1; w < kRowWarps; ++w) m = max(m, s.max_warp[w]);
  __syncthreads();
  return m;
}

// Everything about one row that the passes need.
struct RowCtx {
  const float* x;
  int64_t vocab;
  float max;        // largest non-NaN logit (> -inf here)
  bool inf_max;     // max == +inf: only +inf logits have probability, all equal
  double inv_temp;  // 1 / temperature in fp64, as on the CPU

  // Has nonzero probability before top-k/top-p (CPU: the `kept` list's first fill).
  __device__ bool Eligible(float l) const {
    return !isnan(l) && l != -kInf && (!inf_max || l == kInf);
  }
  // Fixed-point weight of an eligible logit: exp((l - max) / T) * 2^62, truncated.
  __device__ u64 Mass(float l) const {
    if (inf_max) return 1ull << 62;
    const double arg = (static_cast<double>(l) - static_cast<double>(max)) * inv_temp;
    if (arg < -44.0) return 0;  // weight < 2^-63: below one unit (skips the exp)
    return static_cast<u64>(exp(arg) * 0x1p62);
  }
};

// Keeps tokens with key > key, and those with key == key up to index last.
struct Cut {
  uint32_t key = 0;
  int32_t last = kNoIndex;
  __device__ bool Keeps(int64_t i, uint32_t k) const { return k > key || (k == key && i <= last); }
};

struct Selection {
  uint32_t key;  // threshold key K
  U128 above;    // mass of candidates with key > K; above < target <= above + at
  U128 at;       // mass of candidates with key == K
  U128 target;
};

// Radix select over the candidates (pred) of the row: the key K where the mass, accumulated
// from the largest key down, first reaches target_of_total(total mass of the candidates).
template <typename Pred, typename MassFn, typename TargetFn>
__device__ Selection RadixSelect(const RowCtx& c, Pred pred, MassFn mass, TargetFn target_of_total,
                                 SampleSmem& s) {
  uint32_t prefix = 0, mask = 0;
  U128 above = 0, at = 0, target = 0;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int bins = pass == 2 ? 1024 : 2048;
    for (int b = threadIdx.x; b < bins; b += kRowThreads) {
      s.hist[0][b] = s.hist[1][b] = s.hist[2][b] = s.hist[3][b] = 0;
    }
    if (threadIdx.x == 0) {
      s.sel_digit = 0;
      s.sel_above = above;
      s.sel_at = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < c.vocab; i += kRowThreads) {
      const float l = c.x[i];
      const uint32_t key = OrderKey(l);
      if ((key & mask) != prefix || !pred(i, l, key)) continue;
      const u64 m = mass(l);
      if (m == 0) continue;
      const int d = static_cast<int>((key >> shift) & static_cast<uint32_t>(bins - 1));
      AtomicAddLimbs(&s.hist[0][d], kHistBins, m);
    }
    __syncthreads();
    // Thread t owns bins_per_thread bins, thread 0 the highest: a prefix scan over threads
    // is then the mass of all higher bins.
    const int per = bins / kRowThreads;
    U128 mine = 0;
    for (int j = 0; j < per; ++j) mine += Bin(s, bins - 1 - (threadIdx.x * per + j));
    U128 total;
    const U128 higher = BlockExclusiveScan(mine, &total, s);
    if (pass == 0) {
      target = target_of_total(total);
      if (target < 1) target = 1;
      if (target > total) target = total;
    }
    const U128 base = above + higher;
    if (base < target && target <= base + mine) {
      U128 acc = base;
      for (int j = 0; j < per; ++j) {
        const int b = bins - 1 - (threadIdx.x * per + j);
        const U128 mass_b = Bin(s, b);
        if (target <= acc + mass_b) {
          s.sel_digit = b;
          s.sel_above = acc;
          s.sel_at = mass_b;
          break;
        }
        acc += mass_b;
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.sel_digit) << shift;
    mask |= static_cast<uint32_t>(bins - 1) << shift;
    above = s.sel_above;
    at = s.sel_at;
    __syncthreads();  // the next pass rewrites hist and sel_*
  }
  return {prefix, above, at, target};
}

// Level-1 tiles of PrefixSearch: contiguous index ranges of `tile` elements (a multiple of
// kRowThreads, at least 4 per thread), at most kRowThreads of them.
struct TileGrid {
  int64_t tile;
  int num_tiles;
};
__device__ __forceinline__ TileGrid Tiles(int64_t vocab) {
  int64_t tile = (vocab + kRowThreads - 1) / kRowThreads;
  tile = tile > 4 * kRowThreads ? tile : 4 * kRowThreads;
  tile = (tile + kRowThreads - 1) / kRowThreads * kRowThreads;
  return {tile, static_cast<int>((vocab + tile - 1) / tile)};
}

// The first index, in index order, at which the running sum of weight(i, logit) exceeds
// threshold_of_total(total of all weights); -1 when the threshold is >= the total.
// *last_positive: the largest index of nonzero weight (-1 if none).
// Level 1 reads the row once, coalesced, summing each tile (warp sums, limb atomics) and finds
// the tile by a scan over tile sums; level 2 splits that tile into contiguous runs of
// tile / kRowThreads elements, one per thread, scans again, and only the owner of the crossing
// walks its few elements. No thread walks more than a handful of elements serially.
template <typename WeightFn, typename ThresholdFn>
__device__ int32_t PrefixSearch(const RowCtx& c, WeightFn weight, ThresholdFn threshold_of_total,
                                int32_t* last_positive, SampleSmem& s) {
  const TileGrid g = Tiles(c.vocab);
  for (int b = threadIdx.x; b < g.num_tiles; b += kRowThreads) {
    s.hist[0][b] = s.hist[1][b] = s.hist[2][b] = s.hist[3][b] = 0;
  }
  if (threadIdx.x == 0) {
    s.result = -1;
    s.sel_digit = -1;
  }
  __syncthreads();
  int32_t last = -1;
  for (int t = 0; t < g.num_tiles; ++t) {
    const int64_t end = min(c.vocab, (t + 1) * g.tile);
    U128 part = 0;
    for (int64_t i = t * g.tile + threadIdx.x; i < end; i += kRowThreads) {
      const u64 w = weight(i, c.x[i]);
      if (w != 0) {
        part += w;
        last = static_cast<int32_t>(i);
      }
    }
    part = WarpSum(part);
    if (threadIdx.x % 32 == 0 && part != 0) AtomicAddLimbs(&s.hist[0][t], kHistBins, part);
  }
  *last_positive = BlockMax(last, s);  // its barrier also completes the tile sums
  const U128 mine = threadIdx.x < g.num_tiles ? Bin(s, threadIdx.x) : U128{0};
  U128 total;
  const U128 before = BlockExclusiveScan(mine, &total, s);
  const U128 threshold = threshold_of_total(total);
  if (before <= threshold && threshold < before + mine) {
    s.sel_digit = threadIdx.x;
    s.sel_above = before;
  }
  __syncthreads();
  const int owner = s.sel_digit;
  const U128 owner_before = s.sel_above;
  __syncthreads();
  if (owner < 0) return -1;  // block-uniform
  const int64_t per = g.tile / kRowThreads;
  const int64_t begin = min(c.vocab, owner * g.tile + threadIdx.x * per);
  const int64_t end = min(c.vocab, begin + per);
  U128 mine2 = 0;
  for (int64_t i = begin; i < end; ++i) mine2 += weight(i, c.x[i]);
  U128 total2;
  const U128 before2 = owner_before + BlockExclusiveScan(mine2, &total2, s);
  if (before2 <= threshold && threshold < before2 + mine2) {
    U128 cum = before2;
    for (int64_t i = begin; i < end; ++i) {
      cum += weight(i, c.x[i]);
      if (cum > threshold) {
        s.result = static_cast<int32_t>(i);
        break;
      }
    }
  }
  __syncthreads();
  const int32_t result = s.result;
  __syncthreads();
  return result;
}

// Index of the r-th (1-based) token in index order with pred (kNoIndex when fewer).
template <typename Pred>
__device__ int32_t NthInIndexOrder(const RowCtx& c, Pred pred, U128 r, SampleSmem& s) {
  int32_t last;
  const int32_t index = PrefixSearch(
      c, [&](int64_t i, float l) -> u64 { return pred(i, l) ? 1 : 0; }, [&](U128) { return r - 1; },
      &last, s);
  return index >= 0 ? index : kNoIndex;
}

// Turns a selection into a cut: of the tokens at the threshold key (all of mass unit_mass),
// keep just enough, lowest indices first, for above + kept * unit_mass to reach the target.
template <typename Pred>
__device__ Cut CutAt(const RowCtx& c, const Selection& sel, u64 unit_mass, Pred pred,
                     SampleSmem& s) {
  Cut cut;
  cut.key = sel.key;
  const U128 needed = (sel.target - sel.above + unit_mass - 1) / unit_mass;
  const U128 present = sel.at / unit_mass;
  if (needed < present) {
    cut.last = NthInIndexOrder(
        c, [&](int64_t i, float l) { return OrderKey(l) == sel.key && pred(i, l, sel.key); },
        needed, s);
  }
  return cut;
}

// Inverse CDF over the kept tokens in index order: the first token whose cumulative mass
// exceeds u * total (CPU: `target < cum`); the last kept token of nonzero mass if rounding
// puts u * total at the very end.
template <typename Kept>
__device__ int32_t InverseCdf(const RowCtx& c, Kept kept, double u, SampleSmem& s) {
  int32_t last = -1;
  const int32_t index = PrefixSearch(
      c, [&](int64_t i, float l) -> u64 { return kept(i, l) ? c.Mass(l) : 0; },
      [&](U128 total) { return FloorToU128(u * ToDouble(total)); }, &last, s);
  return index >= 0 ? index : last;
}

// probs[i] = the kept token i's weight / the kept total (0 for the others): cpu::TokenProbabilities
// over the first c.vocab ids, weights exp((l - max) / T) in fp64 (1 for +inf rows), the total the
// exact fixed-point sum of the same weights (within ~1e-16 of the CPU's fp64 sum).
template <typename Kept>
__device__ void WriteProbabilities(const RowCtx& c, Kept kept, double* probs, SampleSmem& s) {
  U128 mine = 0;
  for (int64_t i = threadIdx.x; i < c.vocab; i += kRowThreads) {
    if (kept(i, c.x[i])) mine += c.Mass(c.x[i]);
  }
  U128 total;
  BlockExclusiveScan(mine, &total, s);
  const double inv_total = 0x1p62 / ToDouble(total);  // the max logit is kept: total >= 2^62
  for (int64_t i = threadIdx.x; i < c.vocab; i += kRowThreads) {
    const float l = c.x[i];
    double w = 0.0;
    if (kept(i, l)) {
      w = c.inf_max ? 1.0 : exp((static_cast<double>(l) - static_cast<double>(c.max)) * c.inv_temp);
    }
    probs[i] = w * inv_total;
  }
}

}  // namespace tandem::kernels::cuda::sampling_internal

#endif  // TANDEM_KERNELS_SAMPLING_CUDA_SAMPLING_DEVICE_CUH_
