// MoeRoute and MoePermute (moe_cuda.h): routing and the permutation by expert on the device.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kRouteWarps = 4;  // tokens per block
constexpr int kPermuteWarps = 16;
static_assert(kMoeMaxExperts == kPermuteWarps * 32, "PermuteKernel: one thread per expert");

// The routing of one block's token, as device constants.
struct RouteParams {
  int num_experts, top_k, num_groups, topk_groups;
  bool sigmoid, top_two_sum, renormalize;
  float scale;
  const float* bias;  // [E] or null
};

// (v, i) is a better pick than (bv, bi): larger value, ties to the lower index; bi < 0: none yet.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// The warp's best (value, index) (every lane gets it: Better is a total order).
__device__ __forceinline__ void WarpArgMax(float& v, int& i) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (oi >= 0 && Better(ov, oi, v, i)) v = ov, i = oi;
  }
}

__device__ __forceinline__ float WarpReduce(float v, bool is_max) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  return v;
}

// One warp's scratch for routing one token (shared memory, `E` entries each; chosen: top_k).
struct RouteScratch {
  float *scores, *choice, *group;
  unsigned char *taken, *kept;
  int* chosen;
};

// Routes token row `row` ([E] logits) with one warp: writes its top_k ids and weights to
// ids_out / w_out (and the ids also to ids_copy when given). Ends with the warp converged and
// the scratch free for the next token.
__device__ void RouteToken(const float* __restrict__ row, const RouteParams& p,
                           const RouteScratch& s, int lane, int32_t* ids_out, float* w_out,
                           int32_t* ids_copy) {
  float* scores = s.scores;
  float* choice = s.choice;
  unsigned char* taken = s.taken;
  const int E = p.num_experts;
  float local = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    scores[e] = row[e];
    local = fmaxf(local, row[e]);
    taken[e] = 0;
  }
  if (p.sigmoid) {
    for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
  } else {
    const float max = WarpReduce(local, true);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) {
      scores[e] = expf(scores[e] - max);
      sum += scores[e];
    }
    sum = WarpReduce(sum, false);
    for (int e = lane; e < E; e += 32) scores[e] /= sum;
  }
  for (int e = lane; e < E; e += 32) {
    choice[e] = scores[e] + (p.bias != nullptr ? p.bias[e] : 0.0f);
  }
  __syncwarp();
  if (p.num_groups > 1) {
    const int G = p.num_groups, per = E / G;
    float* group = s.group;
    unsigned char* kept = s.kept;
    for (int g = lane; g < G; g += 32) {
      // max, or the sum of the two largest (ties do not change the sum)
      float a = -INFINITY, b = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float c = choice[e];
        if (c > a) {
          b = a;
          a = c;
        } else if (c > b) {
          b = c;
        }
      }
      group[g] = p.top_two_sum ? a + b : a;
      kept[g] = 0;
    }
    __syncwarp();
    for (int q = 0; q < p.topk_groups; ++q) {
      float bv = 0.0f;
      int bi = -1;
      for (int g = lane; g < G; g += 32) {
        if (!kept[g] && Better(group[g], g, bv, bi)) bv = group[g], bi = g;
      }
      WarpArgMax(bv, bi);
      if (lane == 0) kept[bi] = 1;
      __syncwarp();
    }
    // transformers 5.17: V3 (sigmoid) masks with -inf, V2 (softmax) with 0.
    for (int e = lane; e < E; e += 32) {
      if (!kept[e / per]) choice[e] = p.sigmoid ? -INFINITY : 0.0f;
    }
    __syncwarp();
  }
  for (int j = 0; j < p.top_k; ++j) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      if (!taken[e] && Better(choice[e], e, bv, bi)) bv = choice[e], bi = e;
    }
    WarpArgMax(bv, bi);
    if (lane == 0) {
      taken[bi] = 1;
      s.chosen[j] = bi;
    }
    __syncwarp();
  }
  if (lane == 0) {
    // As the CPU: V3 takes the unbiased scores, V2 / softmax top-k the (masked) choice; summed
    // in j order, renormalised (+1e-20 for sigmoid), then scaled.
    const int* chosen = s.chosen;
    float sum = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      sum += p.bias != nullptr ? scores[chosen[j]] : choice[chosen[j]];
    }
    const float denominator = sum + (p.sigmoid ? 1e-20f : 0.0f);
    for (int j = 0; j < p.top_k; ++j) {
      float v = p.bias != nullptr ? scores[chosen[j]] : choice[chosen[j]];
      if (p.renormalize) v /= denominator;
      ids_out[j] = chosen[j];
      if (ids_copy != nullptr) ids_copy[j] = chosen[j];
      w_out[j] = v * p.scale;
    }
  }
  __syncwarp();
}

// One warp per token (no block-wide barriers: a decode step's few tokens cost one short warp
// each). Per warp in shared memory: scores[E], choice[E], group scores, kept / taken flags.
__global__ void __launch_bounds__(kRouteWarps * 32)
    RouteKernel(const float* __restrict__ logits, int num_tokens, RouteParams p,
                int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float s_scores[kRouteWarps][kMoeMaxExperts], s_choice[kRouteWarps][kMoeMaxExperts],
      s_group[kRouteWarps][kMoeMaxExperts];
  __shared__ unsigned char s_taken[kRouteWarps][kMoeMaxExperts],
      s_kept[kRouteWarps][kMoeMaxExperts];
  __shared__ int s_chosen[kRouteWarps][64];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= num_tokens) return;  // the whole warp
  const RouteScratch s{s_scores[warp], s_choice[warp], s_group[warp],
                       s_taken[warp],  s_kept[warp],   s_chosen[warp]};
  const int64_t first = static_cast<int64_t>(t) * p.top_k;
  RouteToken(logits + static_cast<int64_t>(t) * p.num_experts, p, s, lane, ids + first,
             weights + first, nullptr);
}

// The fused kernel's routing of one token (E <= kFusedE): RouteToken's ids and weights bit for
// bit, with the token's scores in registers (lane holds experts lane + 32 i) instead of shared
// memory, all of its loads issued at once, and each top-k pick one pair of warp reductions
// (redux.sync) on order-preserving keys instead of a shuffle tree: the picks are the total order's
// (larger value, ties to the lower id) first k, as RouteToken's Better. The softmax's max / sum and
// the weights' j-order sum are RouteToken's expressions in the same order. NaN scores are outside
// the contract (RouteToken's pick among NaNs is lane-order dependent).
constexpr int kFusedE = static_cast<int>(kMoeFusedMaxExperts);
constexpr int kLaneExperts = kFusedE / 32;
static_assert(kLaneExperts * 32 == kFusedE);

// Larger float -> larger key, -0 and +0 equal; 0 is below every non-NaN key (the "taken" mark).
__device__ __forceinline__ unsigned OrderKey(float v) {
  const unsigned b = __float_as_uint(v);
  if (b == 0x80000000u) return 0x80000000u;  // -0 as +0
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// Per warp, shared: the choice scores [E] and the groups' scores / kept flags (grouped routings).
struct FastScratch {
  float *choice, *group;
  unsigned char* kept;
};

// DeepSeek's group-limited choice: masks the experts of all but the best topk_groups groups (group
// score: max, or the sum of the two largest), as RouteToken; a group is kept when fewer than
// topk_groups groups beat it in Better's order (= RouteToken's topk_groups successive picks).
__device__ __forceinline__ void MaskGroups(const RouteParams& p, const FastScratch& s, int lane,
                                           float (&choice)[kLaneExperts]) {
  const int E = p.num_experts, G = p.num_groups, per = E / G;
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) {
    if (lane + 32 * i < E) s.choice[lane + 32 * i] = choice[i];
  }
  __syncwarp();
  for (int g = lane; g < G; g += 32) {
    float a = -INFINITY, b = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      const float c = s.choice[e];
      if (c > a) {
        b = a;
        a = c;
      } else if (c > b) {
        b = c;
      }
    }
    s.group[g] = p.top_two_sum ? a + b : a;
  }
  __syncwarp();
  for (int g = lane; g < G; g += 32) {
    const float v = s.group[g];
    int beaten_by = 0;
    for (int o = 0; o < G; ++o) beaten_by += Better(s.group[o], o, v, g) ? 1 : 0;
    s.kept[g] = beaten_by < p.topk_groups ? 1 : 0;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) {
    const int e = lane + 32 * i;
    if (e < E && !s.kept[e / per]) choice[i] = p.sigmoid ? -INFINITY : 0.0f;
  }
  __syncwarp();  // the scratch is free for the warp's next token
}

// The token's scores (softmax or sigmoid) and choice scores (+ bias), RouteToken's arithmetic.
__device__ __forceinline__ void ScoreToken(const float* __restrict__ row, const RouteParams& p,
                                           int lane, float (&score)[kLaneExperts],
                                           float (&choice)[kLaneExperts]) {
  const int E = p.num_experts;
  float bias[kLaneExperts];
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) {
    const int e = lane + 32 * i;
    score[i] = e < E ? row[e] : -INFINITY;
    bias[i] = e < E && p.bias != nullptr ? p.bias[e] : 0.0f;
  }
  if (p.sigmoid) {
#pragma unroll
    for (int i = 0; i < kLaneExperts; ++i) score[i] = 1.0f / (1.0f + expf(-score[i]));
  } else {
    float local = -INFINITY;
#pragma unroll
    for (int i = 0; i < kLaneExperts; ++i) local = fmaxf(local, score[i]);
    const float max = WarpReduce(local, true);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneExperts; ++i) {
      if (lane + 32 * i < E) {
        score[i] = expf(score[i] - max);
        sum += score[i];
      }
    }
    sum = WarpReduce(sum, false);
#pragma unroll
    for (int i = 0; i < kLaneExperts; ++i) score[i] /= sum;
  }
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) choice[i] = score[i] + bias[i];
}

__device__ __forceinline__ void RouteTokenFast(const float* __restrict__ row, const RouteParams& p,
                                               const FastScratch& s, int lane, int32_t* ids_out,
                                               float* w_out, int32_t* ids_copy) {
  const int E = p.num_experts;
  float score[kLaneExperts], choice[kLaneExperts];
  ScoreToken(row, p, lane, score, choice);
  if (p.num_groups > 1) MaskGroups(p, s, lane, choice);
  unsigned key[kLaneExperts];
  float source[kLaneExperts];  // the weight source: the unbiased score with a bias, else the choice
#pragma unroll
  for (int i = 0; i < kLaneExperts; ++i) {
    key[i] = lane + 32 * i < E ? OrderKey(choice[i]) : 0u;
    source[i] = p.bias != nullptr ? score[i] : choice[i];
  }
  // Pick j: the warp's largest key, then the lowest id holding it (its lane's best: a lane scans
  // its experts in id order); the winner's source value broadcast and summed in j order. Static
  // register indices only (a pick marks a bit of `taken`), so nothing goes to local memory.
  float sum = 0.0f, v0 = 0.0f, v1 = 0.0f;
  int id0 = 0, id1 = 0;
  unsigned taken = 0;
  for (int j = 0; j < p.top_k; ++j) {
    unsigned best = 0;
    int bi = 0;
    float bv = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneExperts; ++i) {
      const unsigned k = (taken >> i) & 1u ? 0u : key[i];
      if (k > best) best = k, bi = i, bv = source[i];
    }
    const unsigned top = __reduce_max_sync(0xffffffffu, best);
    const int e = static_cast<int>(__reduce_min_sync(
        0xffffffffu, best == top ? static_cast<unsigned>(lane + 32 * bi) : 0xffffffffu));
    const float v = __shfl_sync(0xffffffffu, bv, e & 31);
    if (lane == (e & 31)) taken |= 1u << bi;
    sum += v;
    if (j == lane) id0 = e, v0 = v;
    if (j == lane + 32) id1 = e, v1 = v;
  }
  const float denominator = sum + (p.sigmoid ? 1e-20f : 0.0f);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = lane + 32 * h;
    if (j < p.top_k) {
      const int e = h == 0 ? id0 : id1;
      float v = h == 0 ? v0 : v1;
      if (p.renormalize) v /= denominator;
      ids_out[j] = e;
      if (ids_copy != nullptr) ids_copy[j] = e;
      w_out[j] = v * p.scale;
    }
  }
}

// Inclusive sums over the block (kPermuteWarps * 32 threads) of a and b at once; `red` holds
// 2 * kPermuteWarps ints, used once per kernel (no barrier after the reads).
__device__ int2 BlockInclusiveScan2(int a, int b, int* red, int2* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 1; off < 32; off <<= 1) {
    const int oa = __shfl_up_sync(0xffffffffu, a, off);
    const int ob = __shfl_up_sync(0xffffffffu, b, off);
    if (lane >= off) a += oa, b += ob;
  }
  if (lane == 31) red[warp] = a, red[kPermuteWarps + warp] = b;
  __syncthreads();
  int2 before{0, 0}, all{0, 0};
#pragma unroll
  for (int w = 0; w < kPermuteWarps; ++w) {
    const int ra = red[w], rb = red[kPermuteWarps + w];
    if (w < warp) before.x += ra, before.y += rb;
    all.x += ra;
    all.y += rb;
  }
  *total = all;
  return {a + before.x, b + before.y};
}

// One block. Warp w < nw owns the pairs [w * seg, (w + 1) * seg) (seg >= 32: decode-sized steps
// take one or a few warps) and a row of counts seg_base[w][E] (shared, kPermuteWarps * E ints;
// `red` 2 * kPermuteWarps ints): pass 1 counts its pairs per expert, the scans turn the counts
// into each warp's first row per expert, pass 2 hands out rows in pair order (match_any: equal
// ids in one 32-pair chunk ranked by lane). Stable, deterministic, no global atomics. `ids` may
// be shared or global memory. load_before: expert_load[threadIdx.x] as the caller read it (early,
// so its latency hides) for threads < E when expert_load is given.
__device__ void PermuteBlock(const int32_t* ids, int rows, int top_k, int num_experts,
                             const DeviceMoePermutation& perm, int64_t* expert_load,
                             int64_t load_before, int* seg_base, int* red) {
  const int E = num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = max(32, (rows + kPermuteWarps - 1) / kPermuteWarps);
  const int nw = (rows + seg - 1) / seg;  // warps with pairs (<= kPermuteWarps)
  for (int i = threadIdx.x; i < nw * E; i += blockDim.x) seg_base[i] = 0;
  __syncthreads();
  const int begin = warp * seg, end = min(rows, begin + seg);
  int* mine = seg_base + warp * E;
  for (int c = begin; c < end; c += 32) {
    const int r = c + lane;
    const int id = r < end ? ids[r] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, id);
    if (id >= 0 && lane == __ffs(peers) - 1) mine[id] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Thread e (E <= kMoeMaxExperts = the block's threads): each warp's exclusive start within
  // expert e, the expert's count, its first row and its place among the active (block scans).
  const int e = threadIdx.x;
  int count = 0;
  if (e < E) {
    for (int w = 0; w < nw; ++w) {
      const int c = seg_base[w * E + e];
      seg_base[w * E + e] = count;
      count += c;
    }
  }
  int2 totals;
  const int2 inclusive = BlockInclusiveScan2(count, count > 0 ? 1 : 0, red, &totals);
  const int offset = inclusive.x - count, active_rank = inclusive.y - 1;
  const int rows_total = totals.x, num_active = totals.y;
  if (e < E) {
    perm.expert_offsets[e] = offset;
    for (int w = 0; w < nw; ++w) seg_base[w * E + e] += offset;
    if (count > 0) perm.active_experts[active_rank] = e;
    if (e >= num_active) perm.active_experts[e] = -1;  // never an active slot: rank < num_active
    if (expert_load != nullptr) expert_load[e] = load_before + count;
  }
  if (e == 0) perm.expert_offsets[E] = rows_total;
  __syncthreads();
  for (int c = begin; c < end; c += 32) {
    const int r = c + lane;
    const int id = r < end ? ids[r] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, id);
    int base = 0;
    if (id >= 0) base = mine[id];
    __syncwarp();
    if (id >= 0) {
      const int slot = base + __popc(peers & ((1u << lane) - 1u));
      perm.token_of_row[slot] = r / top_k;
      perm.row_of_pair[r] = slot;
      if (lane == __ffs(peers) - 1) mine[id] = base + __popc(peers);
    }
    __syncwarp();
  }
}

// expert_load[threadIdx.x] for PermuteBlock's load_before (0 where not read).
__device__ __forceinline__ int64_t LoadBefore(const int64_t* expert_load, int num_experts) {
  return expert_load != nullptr && static_cast<int>(threadIdx.x) < num_experts
             ? expert_load[threadIdx.x]
             : 0;
}

__global__ void __launch_bounds__(kPermuteWarps * 32)
    PermuteKernel(const int32_t* __restrict__ ids, int rows, int top_k, int num_experts,
                  DeviceMoePermutation perm, int64_t* expert_load) {
  extern __shared__ int seg_base[];  // [kPermuteWarps][E]
  __shared__ int red[2 * kPermuteWarps];
  const int64_t load_before = LoadBefore(expert_load, num_experts);
  PermuteBlock(ids, rows, top_k, num_experts, perm, expert_load, load_before, seg_base, red);
}

// MoeRouteAndPermute: one block of kPermuteWarps warps; warp w routes tokens w, w + 16, ...
// (RouteTokenFast, ids also kept in shared memory), then the block permutes them (PermuteBlock).
// Static shared memory only (~26 KB at kMoeFusedMaxExperts = 128): no opt-in, PDL-launchable.
__global__ void __launch_bounds__(kPermuteWarps * 32)
    RoutePermuteKernel(const float* __restrict__ logits, int num_tokens, RouteParams p,
                       int32_t* __restrict__ ids, float* __restrict__ weights,
                       DeviceMoePermutation perm, int64_t* expert_load) {
  __shared__ float s_choice[kPermuteWarps][kFusedE], s_group[kPermuteWarps][kFusedE];
  __shared__ unsigned char s_kept[kPermuteWarps][kFusedE];
  __shared__ int32_t s_ids[kMoeFusedMaxPairs];
  __shared__ int seg_base[kPermuteWarps * kFusedE];
  __shared__ int red[2 * kPermuteWarps];
  internal::WaitForPrecedingGrid();  // the logits (PDL: nothing read or written before)
  internal::AllowDependentLaunch();
  const int64_t load_before = LoadBefore(expert_load, p.num_experts);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const FastScratch s{s_choice[warp], s_group[warp], s_kept[warp]};
  for (int t = warp; t < num_tokens; t += kPermuteWarps) {
    const int64_t first = static_cast<int64_t>(t) * p.top_k;
    RouteTokenFast(logits + static_cast<int64_t>(t) * p.num_experts, p, s, lane, ids + first,
                   weights + first, s_ids + first);
  }
  __syncthreads();
  PermuteBlock(s_ids, num_tokens * p.top_k, p.top_k, p.num_experts, perm, expert_load, load_before,
               seg_base, red);
}

// The kernel's parameters from the host's, after GroupedTopK's checks; INVALID_ARGUMENT names
// the numbers.
absl::Status ToRouteParams(const GroupedRoutingParams& p, int64_t num_tokens, RouteParams* rp) {
  const int64_t e = p.num_experts, g = p.num_groups;
  if (e < 1 || e > kMoeMaxExperts || p.top_k < 1 || p.top_k > e || p.top_k > 64 || g < 1 ||
      e % g != 0 || p.topk_groups < 1 || p.topk_groups > g ||
      (p.group_score == MoeGroupScore::kTopTwoSum && g > 1 && e / g < 2) || num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: ", e, " experts (at most ", kMoeMaxExperts, "), top_k ", p.top_k,
        " (at most 64), ", g, " groups, topk_group ", p.topk_groups, ", tokens ", num_tokens));
  }
  rp->num_experts = static_cast<int>(e);
  rp->top_k = static_cast<int>(p.top_k);
  rp->num_groups = static_cast<int>(g);
  rp->topk_groups = static_cast<int>(p.topk_groups);
  rp->sigmoid = p.scoring == MoeScoring::kSigmoid;
  rp->top_two_sum = p.group_score == MoeGroupScore::kTopTwoSum;
  rp->renormalize = p.renormalize;
  rp->scale = p.routed_scaling_factor;
  rp->bias = p.correction_bias;
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRoute(const float* router_logits, int64_t num_tokens, const GroupedRoutingParams& p,
                      int32_t* expert_ids, float* weights, cudaStream_t stream) {
  RouteParams rp;
  RETURN_IF_ERROR(ToRouteParams(p, num_tokens, &rp));
  if (num_tokens == 0) return absl::OkStatus();
  RouteKernel<<<static_cast<unsigned>((num_tokens + kRouteWarps - 1) / kRouteWarps),
                kRouteWarps * 32, 0, stream>>>(router_logits, static_cast<int>(num_tokens), rp,
                                               expert_ids, weights);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool MoeRouteAndPermuteSupported(const GroupedRoutingParams& p, int64_t num_tokens) {
  return p.num_experts >= 1 && p.num_experts <= kMoeFusedMaxExperts && p.top_k >= 1 &&
         num_tokens >= 0 && num_tokens * p.top_k <= kMoeFusedMaxPairs;
}

absl::Status MoeRouteAndPermute(const float* router_logits, int64_t num_tokens,
                                const GroupedRoutingParams& p, int32_t* expert_ids, float* weights,
                                const DeviceMoePermutation& perm, int64_t* expert_load,
                                cudaStream_t stream, bool programmatic_launch) {
  RouteParams rp;
  RETURN_IF_ERROR(ToRouteParams(p, num_tokens, &rp));
  if (!MoeRouteAndPermuteSupported(p, num_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRouteAndPermute: ", p.num_experts, " experts (at most ", kMoeFusedMaxExperts, "), ",
        num_tokens, " tokens x top_k ", p.top_k, " (at most ", kMoeFusedMaxPairs, " pairs)"));
  }
  // An empty step still writes the offsets (all 0) and the active list (all -1), as MoePermute.
  const internal::PdlLaunchConfig config(dim3(1), dim3(kPermuteWarps * 32), stream,
                                         programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), RoutePermuteKernel, router_logits,
                                          static_cast<int>(num_tokens), rp, expert_ids, weights,
                                          perm, expert_load));
  return absl::OkStatus();
}

absl::Status MoePermute(const int32_t* expert_ids, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts, const DeviceMoePermutation& perm, int64_t* expert_load,
                        cudaStream_t stream) {
  if (num_experts < 1 || num_experts > kMoeMaxExperts || top_k < 1 || num_tokens < 0 ||
      num_tokens * top_k > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("MoePermute: ", num_experts,
                                                   " experts (at most ", kMoeMaxExperts,
                                                   "), top_k ", top_k, ", tokens ", num_tokens));
  }
  const size_t smem = sizeof(int) * kPermuteWarps * num_experts;
  PermuteKernel<<<1, kPermuteWarps * 32, smem, stream>>>(
      expert_ids, static_cast<int>(num_tokens * top_k), static_cast<int>(top_k),
      static_cast<int>(num_experts), perm, expert_load);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
