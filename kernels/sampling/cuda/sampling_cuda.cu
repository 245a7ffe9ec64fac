// Token sampling on the device, matching cpu::SampleToken (kernels/sampling/sampling.cc).
//
// A row's vocab_limit (> 0) cuts it short: both kernels see only its first vocab_limit logits,
// so a padding id past the tokenizer can never be picked.
//
// Two kernels. RowMaxKernel: (row, split) CTAs reduce a slice of the row to its max / argmax
// (lowest index on ties, NaN skipped) and counts of eligible and +inf logits. SampleRowKernel:
// one CTA per row combines the slices; greedy rows stop there; sampled rows then
//   1. top-k: radix-select the k-th largest key among eligible tokens (count per bin);
//   2. top-p: radix-select the key where the descending cumulative probability reaches
//      top_p * total (probability mass per bin), among the top-k survivors;
//   3. inverse CDF in index order over the survivors, u from Philox on the device.
// A threshold key keeps every token above it and, of the tokens equal to it, the first ones in
// index order: exactly the CPU's (logit desc, id asc) prefix, so ties resolve the same way.
//
// Probability mass is fixed point: weight exp((l - max) / T) in [0, 1], computed in fp64 like
// the CPU, times 2^62, truncated to an integer; sums are 128-bit integers. Integer sums are exact
// and independent of summation order, so the kernel is deterministic, and the truncation
// (< 2^-62 per token, total >= 1) is far below the CPU's own fp64 rounding.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "kernels/sampling/philox.h"

namespace tandem::kernels::cuda {
namespace {

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

int64_t NumSplits(int64_t num_rows, int64_t vocab) {
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

__global__ void __launch_bounds__(kSplitThreads)
    RowMaxKernel(const float* __restrict__ logits, int64_t vocab,
                 const DeviceSamplingRow* __restrict__ rows, int splits,
                 Partial* __restrict__ partials) {
  const int64_t row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  // Slices split the whole row (the grid is fixed for a graph); a limit only shortens the last.
  const int64_t chunk = (vocab + splits - 1) / splits;
  const int64_t sampled = SampledVocab(vocab, rows[row].vocab_limit);
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < sampled ? begin + chunk : sampled;
  const float* x = logits + row * vocab;
  float best = 0.0f;
  int32_t arg = -1;
  int32_t eligible = 0, pos_inf = 0;
#pragma unroll 4
  for (int64_t i = begin + threadIdx.x; i < end; i += kSplitThreads) {
    const float l = x[i];
    if (isnan(l)) continue;
    eligible += l != -kInf;
    pos_inf += l == kInf;
    if (arg < 0 || l > best) {  // strict: the first (lowest) index of this thread wins ties
      best = l;
      arg = static_cast<int32_t>(i);
    }
  }
  __shared__ Partial warp_best[kSplitThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oa = __shfl_xor_sync(0xffffffffu, arg, o);
    eligible += __shfl_xor_sync(0xffffffffu, eligible, o);
    pos_inf += __shfl_xor_sync(0xffffffffu, pos_inf, o);
    if (Better(ob, oa, best, arg)) {
      best = ob;
      arg = oa;
    }
  }
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = {best, arg, eligible, pos_inf};
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial p = warp_best[0];
    for (int w = 1; w < kSplitThreads / 32; ++w) {
      const Partial& q = warp_best[w];
      if (Better(q.max, q.argmax, p.max, p.argmax)) {
        p.max = q.max;
        p.argmax = q.argmax;
      }
      p.num_eligible += q.num_eligible;
      p.num_pos_inf += q.num_pos_inf;
    }
    partials[blockIdx.x] = p;
  }
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
__device__ U128 BlockExclusiveScan(U128 v, U128* total, SampleSmem& s) {
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

__device__ int32_t BlockMax(int32_t v, SampleSmem& s) {
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

// Samples row blockIdx.x into out (probs null), or writes its distribution into probs ([rows,
// vocab]: cpu::TokenProbabilities; ids past the row's vocab_limit get 0).
__global__ void __launch_bounds__(kRowThreads)
    SampleRowKernel(const float* __restrict__ logits, int64_t vocab,
                    const DeviceSamplingRow* __restrict__ rows,
                    const Partial* __restrict__ partials, int splits, int32_t* __restrict__ out,
                    double* __restrict__ probs) {
  __shared__ SampleSmem s;
  const int64_t row = blockIdx.x;
  if (threadIdx.x == 0) {
    // Slices are in index order, so a strict > keeps the lowest index on ties.
    float best = 0.0f;
    int32_t arg = -1;
    int64_t eligible = 0, pos_inf = 0;
    for (int sp = 0; sp < splits; ++sp) {
      const Partial p = partials[row * splits + sp];
      eligible += p.num_eligible;
      pos_inf += p.num_pos_inf;
      if (p.argmax >= 0 && (arg < 0 || p.max > best)) {
        best = p.max;
        arg = p.argmax;
      }
    }
    s.row_max = best;
    s.row_argmax = arg;
    s.num_eligible = eligible;
    s.num_pos_inf = pos_inf;
  }
  __syncthreads();
  const DeviceSamplingRow p = rows[row];
  const int64_t sampled = SampledVocab(vocab, p.vocab_limit);  // RowCtx.vocab: the cut row
  const float max_logit = s.row_max;
  if (probs != nullptr) {
    probs += row * vocab;
    for (int64_t i = sampled + threadIdx.x; i < vocab; i += kRowThreads) probs[i] = 0.0;
  }
  // Greedy also when nothing has positive probability (all NaN / -inf): argmax, 0 if all NaN.
  if (!(p.temperature > 0.0f) || sampled == 1 || s.row_argmax < 0 || max_logit == -kInf) {
    const int32_t greedy = s.row_argmax < 0 ? 0 : s.row_argmax;
    if (probs != nullptr) {  // one-hot at the greedy choice
      for (int64_t i = threadIdx.x; i < sampled; i += kRowThreads) probs[i] = i == greedy;
    } else if (threadIdx.x == 0) {
      out[row] = greedy;
    }
    return;
  }
  const RowCtx c{logits + row * vocab, sampled, max_logit, max_logit == kInf,
                 1.0 / static_cast<double>(p.temperature)};
  const int64_t num_eligible = c.inf_max ? s.num_pos_inf : s.num_eligible;

  Cut top_k_cut, top_p_cut;  // keep everything until set
  int64_t num_kept = num_eligible;
  if (p.top_k > 0 && p.top_k < num_eligible) {
    auto eligible = [&](int64_t, float l, uint32_t) { return c.Eligible(l); };
    const Selection sel = RadixSelect(
        c, eligible, [](float) -> u64 { return 1; },
        [&](U128) { return static_cast<U128>(p.top_k); }, s);
    top_k_cut = CutAt(c, sel, 1, eligible, s);
    num_kept = p.top_k;
  }
  auto after_top_k = [&](int64_t i, float l, uint32_t key) {
    return c.Eligible(l) && top_k_cut.Keeps(i, key);
  };
  if (p.top_p < 1.0f && num_kept > 1) {
    const double top_p = p.top_p;
    const Selection sel = RadixSelect(
        c, after_top_k, [&](float l) { return c.Mass(l); },
        [&](U128 total) { return CeilToU128(top_p * ToDouble(total)); }, s);
    top_p_cut = CutAt(c, sel, c.Mass(KeyToFloat(sel.key)), after_top_k, s);
  }
  auto kept = [&](int64_t i, float l) {
    const uint32_t key = OrderKey(l);
    return after_top_k(i, l, key) && top_p_cut.Keeps(i, key);
  };
  if (probs != nullptr) {
    WriteProbabilities(c, kept, probs, s);
    return;
  }
  const int32_t token = InverseCdf(c, kept, SeededUniform(p.seed, p.step, 0), s);
  if (threadIdx.x == 0) out[row] = token;
}

}  // namespace

int64_t SampleTokensWorkspaceBytes(int64_t num_rows, int64_t vocab) {
  if (num_rows <= 0 || vocab <= 0) return 0;
  return num_rows * NumSplits(num_rows, vocab) * static_cast<int64_t>(sizeof(Partial));
}

namespace {

// SampleTokens / TokenProbabilities: the arguments checked, then the two kernels (exactly one of
// out and probs set).
absl::Status LaunchRows(const char* what, const float* logits, int64_t num_rows, int64_t vocab,
                        const DeviceSamplingRow* rows, int32_t* out, double* probs, void* workspace,
                        int64_t workspace_bytes, cudaStream_t stream) {
  if (num_rows < 0 || num_rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": num_rows must be in [0, 2^31), got ", num_rows));
  }
  if (vocab < 1 || vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": vocab must be in [1, 2^31), got ", vocab));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (logits == nullptr || rows == nullptr || (out == nullptr && probs == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::", what, ": null logits, rows or out"));
  }
  const int64_t needed = SampleTokensWorkspaceBytes(num_rows, vocab);
  if (workspace == nullptr || workspace_bytes < needed ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": workspace must be 16-byte aligned with >= ", needed,
                     " bytes for ", num_rows, " rows x ", vocab, ", got ", workspace_bytes,
                     " bytes at ", reinterpret_cast<uintptr_t>(workspace)));
  }
  const int splits = static_cast<int>(NumSplits(num_rows, vocab));
  auto* partials = static_cast<Partial*>(workspace);
  RowMaxKernel<<<static_cast<unsigned>(num_rows * splits), kSplitThreads, 0, stream>>>(
      logits, vocab, rows, splits, partials);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  SampleRowKernel<<<static_cast<unsigned>(num_rows), kRowThreads, 0, stream>>>(
      logits, vocab, rows, partials, splits, out, probs);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status SampleTokens(const float* logits, int64_t num_rows, int64_t vocab,
                          const DeviceSamplingRow* rows, int32_t* out, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream) {
  return LaunchRows("SampleTokens", logits, num_rows, vocab, rows, out, nullptr, workspace,
                    workspace_bytes, stream);
}

absl::Status TokenProbabilities(const float* logits, int64_t num_rows, int64_t vocab,
                                const DeviceSamplingRow* rows, double* probs, void* workspace,
                                int64_t workspace_bytes, cudaStream_t stream) {
  return LaunchRows("TokenProbabilities", logits, num_rows, vocab, rows, nullptr, probs, workspace,
                    workspace_bytes, stream);
}

}  // namespace tandem::kernels::cuda
