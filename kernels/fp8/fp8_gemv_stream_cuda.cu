// The streaming decode FP8 GEMV (fp8_gemv_cuda.h, Fp8GemvKernel::kStreaming; kAuto runs it at
// m = 1, and for weight-only FP8 at m <= 8, with per-row scales), for activations given as e4m3
// codes and for weight-only FP8.
//
// What the register-load kernel (fp8_gemv_cuda.cu) left on the table (ncu, H200, o_proj m = 1:
// DRAM 37% of peak, 127 registers -> 25% occupancy, most stalls on the weight loads): its loads
// went to registers in bursts (issue a few groups, wait, compute, issue again), so each warp
// held its bytes in flight in registers and had none in flight while it computed; the activation
// and scale loads of each group waited behind the weights'. Here:
//   * every lane streams its fragment bytes (16-byte cp.async, evict-first for the weight) into
//     a private kStages-deep ring in shared memory and reads back only what it wrote itself:
//     no barrier in the k loop, and the loads of item j + kStages are issued as item j is used,
//     so a warp always has kStages groups of weight, activations and scales in flight while it
//     computes, at 68-100 registers a thread;
//   * the work is (16-row tile, 128-column group) items; a block of 4 warps (codes, m <= 8; 2
//     otherwise: the ring must fit 48 KB of static shared memory) splits a tile's groups, and
//     where there are too few tiles to fill the GPU a CLUSTER of 2 blocks splits them further,
//     the blocks' partial sums meeting in distributed shared memory (no workspace, no atomics);
//     where there are more tiles than the GPU holds at once, each block walks several tiles (a
//     persistent grid sized to one wave, so no partial last wave) and its ring runs on across
//     the tile boundary;
//   * per-group scales (128-column weight blocks, 1 x 128 activation groups) stream in the
//     ring beside their group; per-row / per-token scales and the bias are applied once at the
//     end; the first kStages groups' weight loads are issued before the PDL wait.
// Products and fp32 promotion per 128-column group are the register kernel's (GroupE4m3 /
// GroupBf16): the same numerics up to fp32 summation order. Measured (BENCHMARKS.md): 1.67 TB/s
// on the 16.8 MB o_proj alone (ncu: DRAM 35%, 0.78 waves, achieved occupancy 23%), 3.0-3.5 TB/s
// on the 67-470 MB 70B projections at m = 1: not yet the bandwidth limit.
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_gemv_device.cuh"

namespace tandem::kernels::cuda::fp8_gemv_internal {
namespace {

namespace cg = ::cooperative_groups;

constexpr int kStages = 3;
// Clusters of 4 and 8 blocks lost to the register kernel on every shape they ran (H200: 8B
// o_proj 10.4 vs 6.4 us, down_proj 22.3 vs 18.7 us), pairs won (70B o_proj 20.8 vs 29.9 us).
constexpr int kMaxSplits = 2;

// One ring stage of a lane, in 16-byte slots: the weight [ch][h], the activations [ch][mt]
// (codes) or [ch][mt][half] (bf16), the group's scales (floats: weight rows g and g + 8, then
// activation [mt][j] of token 8 mt + 2 t + j). Slot s of stage st of thread x is
// ring[(st * kSlots + s) * kThreads + x]: a warp reads 512 contiguous bytes (no bank conflict).
template <ActForm kForm, int MT, int kThreads>
struct Ring {
  static constexpr int kWeightSlots = 4;
  static constexpr int kActSlots = 2 * MT * (kForm == ActForm::kBf16 ? 2 : 1);
  static constexpr int kScaleFloats = 2 + 2 * MT;
  static constexpr int kScaleSlots = (kScaleFloats + 3) / 4;
  static constexpr int kSlots = kWeightSlots + kActSlots + kScaleSlots;
  static constexpr int kEntries = kStages * kSlots * kThreads;  // uint4s
};

__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared (L2 only), zeros where !valid (src is then not read). With a
// "memory" clobber, unlike device_utils.cuh's CpAsync16: the ring's plain shared-memory reads
// must stay between the wait and the next copy into the same slots.
__device__ __forceinline__ void Copy16(void* dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                   internal::SmemAddr(dst)),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void Copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(internal::SmemAddr(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void Copy4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(internal::SmemAddr(dst)),
               "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void CommitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// What one lane of one warp works on.
struct Lane {
  int warp, lane, g, t;
  int64_t first, stride;  // the warp's first group in a tile, the step between its groups
  int64_t per_tile;       // groups of a tile this warp takes
};

// Item j of the lane's warp: its tile and group.
__device__ __forceinline__ void ItemAt(const Lane& l, int64_t j, int64_t& tile, int64_t& gi) {
  const int64_t ti = j / l.per_tile;
  tile = blockIdx.x + ti * gridDim.x;
  gi = l.first + (j - ti * l.per_tile) * l.stride;
}

// The weight bytes of (tile, gi) into `stage` (evict-first: each is read once).
template <int kThreads>
__device__ __forceinline__ void IssueWeights(const Params& p, const Lane& l, int64_t tile,
                                             int64_t gi, uint4* stage, uint64_t policy) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = tile * 16 + h * 8 + l.g;
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
      const int64_t c = gi * kGroup + l.t * 16 + ch * 64;
      const bool valid = row < p.n && c < p.k;
      Copy16(stage + (ch * 2 + h) * kThreads + threadIdx.x, p.w + (valid ? row * p.k + c : 0),
             valid, policy);
    }
  }
}

// The activations and (with group scales) the scales of (tile, gi) into `stage`: after the PDL
// wait, since the preceding kernel writes them.
template <ActForm kForm, int MT, int kThreads>
__device__ __forceinline__ void IssueRest(const Params& p, const Lane& l, int64_t tile, int64_t gi,
                                          uint4* stage) {
  using R = Ring<kForm, MT, kThreads>;
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
    const int64_t c = gi * kGroup + l.t * 16 + ch * 64;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int tok = mt * 8 + l.g;
      const bool valid = tok < p.m && c < p.k;
      const int64_t at = valid ? tok * p.k + c : 0;
      if constexpr (kForm == ActForm::kBf16) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          Copy16(stage + (R::kWeightSlots + (ch * MT + mt) * 2 + e) * kThreads + threadIdx.x,
                 p.a_values + at + (valid ? 8 * e : 0), valid);
        }
      } else {
        Copy16(stage + (R::kWeightSlots + ch * MT + mt) * kThreads + threadIdx.x, p.a_codes + at,
               valid);
      }
    }
  }
  if (!p.group_scales) return;
  float* scales = reinterpret_cast<float*>(stage + (R::kWeightSlots + R::kActSlots) * kThreads);
  const auto slot = [&](int f) { return scales + ((f / 4) * kThreads + threadIdx.x) * 4 + f % 4; };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = tile * 16 + h * 8 + l.g;
    const bool valid = row < p.n;
    Copy4(slot(h), p.w_scales + (valid ? row * p.w_groups + (p.w_groups > 1 ? gi : 0) : 0), valid);
  }
  if constexpr (kForm == ActForm::kCodes) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tj = mt * 8 + 2 * l.t + j;
        const bool valid = tj < p.m;
        const int64_t idx = tj * p.a_scale_stride + (p.a_scale_stride > 1 ? gi : 0);
        Copy4(slot(2 + mt * 2 + j), p.a_scales + (valid ? idx : 0), valid);
      }
    }
  }
}

// acc += the products of the group in `stage`, with its scales when they change per group.
template <ActForm kForm, int MT, int kThreads>
__device__ __forceinline__ void UseStage(const Params& p, const uint4* stage,
                                         float (&acc)[1][MT][4]) {
  using R = Ring<kForm, MT, kThreads>;
  const int x = threadIdx.x;
  uint4 wv[2][1][2];
#pragma unroll
  for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
    for (int h = 0; h < 2; ++h) wv[ch][0][h] = stage[(ch * 2 + h) * kThreads + x];
  }
  float gacc[1][MT][4] = {};
  if constexpr (kForm == ActForm::kBf16) {
    uint4 av[2][MT][2];
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          av[ch][mt][e] = stage[(R::kWeightSlots + (ch * MT + mt) * 2 + e) * kThreads + x];
        }
      }
    }
    GroupBf16<1, MT>(wv, av, gacc);
  } else {
    uint32_t b[2][MT][4];
#pragma unroll
    for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4 v = stage[(R::kWeightSlots + ch * MT + mt) * kThreads + x];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[ch][mt][i] = Word(v, i);
      }
    }
    GroupE4m3<1, MT>(wv, b, gacc);
  }
  if (!p.group_scales) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][mt][i] += gacc[0][mt][i];
    }
    return;
  }
  const float* scales =
      reinterpret_cast<const float*>(stage + (R::kWeightSlots + R::kActSlots) * kThreads);
  const auto scale = [&](int f) { return scales[((f / 4) * kThreads + x) * 4 + f % 4]; };
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = kForm == ActForm::kBf16 ? 1.0f : scale(2 + mt * 2 + (i & 1));
      acc[0][mt][i] = fmaf(gacc[0][mt][i], scale(i >> 1) * a, acc[0][mt][i]);
    }
  }
}

// Block (x, split): tiles x, x + gridDim.x, ...; of each, the groups split * kWarps + warp +
// i * gridDim.y * kWarps. gridDim.y > 1 only as one cluster of gridDim.y blocks along y.
template <ActForm kForm, int MT, int kWarps, typename TOut>
__global__ void __launch_bounds__(kWarps * 32)
    StreamKernel(const __grid_constant__ Params p, TOut* __restrict__ out) {
  constexpr int kThreads = kWarps * 32;
  using R = Ring<kForm, MT, kThreads>;
  constexpr int kElems = MT * 4 * 32;
  __shared__ uint4 ring[R::kEntries];
  __shared__ float partial[kWarps][kElems];
  __shared__ float block_sum[kElems];
  Lane l;
  l.warp = threadIdx.x >> 5;
  l.lane = threadIdx.x & 31;
  l.g = l.lane >> 2;
  l.t = l.lane & 3;
  const int splits = gridDim.y;
  const int64_t groups = (p.k + kGroup - 1) / kGroup, tiles = (p.n + 15) / 16;
  l.first = int64_t{blockIdx.y} * kWarps + l.warp;
  l.stride = int64_t{splits} * kWarps;
  l.per_tile = l.first < groups ? (groups - l.first + l.stride - 1) / l.stride : 0;
  const int64_t my_tiles = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t items = l.per_tile * my_tiles;
  const uint64_t policy = EvictFirstPolicy();
  const auto stage_at = [&](int64_t j) { return ring + (j % kStages) * R::kSlots * kThreads; };
  // The prologue: kStages items' weight loads (before the PDL wait when early: the preceding
  // kernel never writes weights), then their activations and scales; one commit group each, so
  // that item j is always complete once at most kStages - 1 groups are pending (WaitCopies).
  const auto issue_weights = [&](int64_t j) {
    int64_t tile, gi;
    ItemAt(l, j, tile, gi);
    IssueWeights<kThreads>(p, l, tile, gi, stage_at(j), policy);
  };
  const auto issue_rest = [&](int64_t j) {
    int64_t tile, gi;
    ItemAt(l, j, tile, gi);
    IssueRest<kForm, MT, kThreads>(p, l, tile, gi, stage_at(j));
  };
  if (p.early_weight_loads) {
    for (int j = 0; j < kStages; ++j) {
      if (j < items) issue_weights(j);
      CommitCopies();
    }
  }
  internal::WaitForPrecedingGrid();
  internal::AllowDependentLaunch();
  if (!p.early_weight_loads) {
    for (int j = 0; j < kStages; ++j) {
      if (j < items) issue_weights(j);
      CommitCopies();
    }
  }
  for (int j = 0; j < kStages; ++j) {
    if (j < items) issue_rest(j);
    CommitCopies();
  }
  int64_t j = 0;
  for (int64_t ti = 0; ti < my_tiles; ++ti) {
    const int64_t tile = blockIdx.x + ti * gridDim.x;
    float acc[1][MT][4] = {};
    for (int64_t q = 0; q < l.per_tile; ++q, ++j) {
      WaitCopies<kStages - 1>();
      UseStage<kForm, MT, kThreads>(p, stage_at(j), acc);
      // The stage's registers are consumed (the MMAs read them), so its slots take item
      // j + kStages; one commit group per item, empty or not.
      if (j + kStages < items) {
        issue_weights(j + kStages);
        issue_rest(j + kStages);
      }
      CommitCopies();
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[l.warp][(mt * 4 + i) * 32 + l.lane] = acc[0][mt][i];
    }
    __syncthreads();
    if (splits == 1) {
      for (int idx = threadIdx.x; idx < kElems; idx += kThreads) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += partial[w][idx];
        Finish<kForm, MT>(p, tile, idx, v, out);
      }
      __syncthreads();  // `partial` is the next tile's
      continue;
    }
    for (int idx = threadIdx.x; idx < kElems; idx += kThreads) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += partial[w][idx];
      block_sum[idx] = v;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    for (int idx = rank * kThreads + threadIdx.x; idx < kElems; idx += splits * kThreads) {
      float v = 0.0f;
      for (int r = 0; r < splits; ++r) v += *cluster.map_shared_rank(block_sum + idx, r);
      Finish<kForm, MT>(p, tile, idx, v, out);
    }
    cluster.sync();  // no block overwrites or leaves its block_sum while another reads it
  }
}

// Splits S (a cluster of S blocks per tile) while twice as many blocks still fit in one wave
// and every warp keeps a group; then a grid of at most one wave, each block the same number of
// tiles.
template <ActForm kForm, int MT, int kWarps, typename TOut>
cudaError_t Launch(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  constexpr int kThreads = kWarps * 32;
  const auto kernel = StreamKernel<kForm, MT, kWarps, TOut>;
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (e != cudaSuccess) return e;
  const int64_t capacity = std::max<int64_t>(1, int64_t{sms} * per_sm);
  const int64_t tiles = (p.n + 15) / 16, groups = (p.k + kGroup - 1) / kGroup;
  int splits = 1;
  while (splits < kMaxSplits && tiles * 2 * splits <= capacity && groups >= 2 * splits * kWarps) {
    splits *= 2;
  }
  const int64_t waves = (tiles * splits + capacity - 1) / capacity;
  const int64_t grid_x = (tiles + waves - 1) / waves;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(splits));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attrs[2] = {};
  int count = 0;
  if (pdl) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (splits > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count].val.clusterDim.x = 1;
    attrs[count].val.clusterDim.y = static_cast<unsigned>(splits);
    attrs[count++].val.clusterDim.z = 1;
  }
  config.attrs = attrs;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, p, out);
}

}  // namespace

template <ActForm kForm, typename TOut>
cudaError_t LaunchStream(const Params& p, TOut* out, cudaStream_t stream, bool pdl) {
  // 4 warps a block where the ring fits the 48 KB of static shared memory (codes, m <= 8), else
  // 2: a wider window of each weight row in flight per block.
  if constexpr (kForm == ActForm::kCodes) {
    if (p.m <= 8) return Launch<kForm, 1, 4, TOut>(p, out, stream, pdl);
  }
  return p.m <= 8 ? Launch<kForm, 1, 2, TOut>(p, out, stream, pdl)
                  : Launch<kForm, 2, 2, TOut>(p, out, stream, pdl);
}

template cudaError_t LaunchStream<ActForm::kCodes, __nv_bfloat16>(const Params&, __nv_bfloat16*,
                                                                  cudaStream_t, bool);
template cudaError_t LaunchStream<ActForm::kCodes, float>(const Params&, float*, cudaStream_t,
                                                          bool);
template cudaError_t LaunchStream<ActForm::kBf16, __nv_bfloat16>(const Params&, __nv_bfloat16*,
                                                                 cudaStream_t, bool);
template cudaError_t LaunchStream<ActForm::kBf16, float>(const Params&, float*, cudaStream_t, bool);

}  // namespace tandem::kernels::cuda::fp8_gemv_internal
