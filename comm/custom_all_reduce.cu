#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "comm/custom_all_reduce.h"
#include "common/block_reduce.cuh"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace tandem::comm {
namespace {

namespace cg = cooperative_groups;

// The flags at the start of every rank's IPC allocation. flags[phase][block][rank]: the last
// call whose barrier `phase` block `block` of `rank` reached (written by that rank into this
// one's memory); calls: this rank's calls so far (local only), advanced by the last block of a
// call to finish (blocks_done counts them), so every block of a call uses the same number.
//
// One number per call, not per block: calls of different shapes (one-shot, two-shot, fused rows)
// give a pack to different block indices, so only a whole-call order makes reuse safe. A rank
// writes staging half (m & 1) at call m + 2 only after its call m + 1 completed, i.e. after its
// block 0 met every peer's block 0 at call m + 1, which each peer launched after its own call m
// had completed: no peer still reads that half (or, two-shot, the result buffer of call m).
struct ArSignal {
  uint32_t flags[2][kArMaxBlocks][kArMaxRanks];
  uint32_t calls;
  uint32_t blocks_done;
};
constexpr int64_t kSignalBytes = 4096;
static_assert(sizeof(ArSignal) <= kSignalBytes);

// Offsets inside an allocation of max_bytes: signal | staging half 0 | staging half 1 | result.
__host__ __device__ int64_t StagingOffset(int64_t max_bytes, uint32_t call) {
  return kSignalBytes + (call & 1) * max_bytes;
}
__host__ __device__ int64_t ResultOffset(int64_t max_bytes) { return kSignalBytes + 2 * max_bytes; }

struct ArParams {
  char* base[kArMaxRanks];  // every rank's allocation, mapped here
  int rank = 0;
  int64_t max_bytes = 0;
  const uint4* in = nullptr;
  uint4* out = nullptr;
  ArLaunch launch;
  uint64_t timeout_ns = 0;
  int* abort = nullptr;  // mapped host flag
  bool pdl = false;      // launched with programmatic dependent launch
};

__device__ __forceinline__ ArSignal* SignalOf(const ArParams& p, int r) {
  return reinterpret_cast<ArSignal*>(p.base[r]);
}

__device__ __forceinline__ void StoreRelease(uint32_t* addr, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* addr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Programmatic dependent launch (PDL): a kernel launched with the attribute may start while its
// predecessor in the stream still runs, so it waits (griddepcontrol.wait: the predecessor has
// completed and its writes are visible) before touching anything; it lets its own successor
// launch early (launch_dependents), which then waits the same way. No-ops without the attribute.
__device__ __forceinline__ void WaitForPrecedingGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Block `blockIdx.x` of every rank meets here for `phase` of call `flag`: thread q < N tells
// rank q this block arrived (release: the block's earlier writes, ordered by __syncthreads, are
// visible to whoever acquires the flag) and waits until rank q's block arrived. Flags only grow,
// and a peer may already be at the next call, hence ">=" (modulo 2^32). False when a peer did
// not arrive within the timeout (then the host flag is raised).
template <int N>
__device__ bool BlockBarrier(const ArParams& p, int phase, uint32_t flag, int* failed) {
  if (threadIdx.x == 0) *failed = 0;
  __syncthreads();
  if (threadIdx.x < N) {
    const int q = threadIdx.x;
    StoreRelease(&SignalOf(p, q)->flags[phase][blockIdx.x][p.rank], flag);
    const uint32_t* mine = &SignalOf(p, p.rank)->flags[phase][blockIdx.x][q];
    uint64_t start = 0;
    for (uint32_t spins = 1; static_cast<int32_t>(LoadAcquire(mine) - flag) < 0; ++spins) {
      if ((spins & 1023) != 0) continue;
      const uint64_t now = GlobalTimerNs();
      if (start == 0) start = now;
      if (now - start > p.timeout_ns) {
        atomicExch(failed, 1);
        atomicExch(p.abort, 1);
        __threadfence_system();
        break;
      }
    }
  }
  __syncthreads();
  return *failed == 0;
}

// This call's number (every block of a call reads the same: the previous call on the stream
// completed before this one started).
__device__ __forceinline__ uint32_t CallFlag(const ArParams& p) {
  return SignalOf(p, p.rank)->calls + 1;
}

// The last block of the call to get here advances `calls` for the next call.
__device__ __forceinline__ void FinishCall(const ArParams& p, uint32_t flag) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  ArSignal* s = SignalOf(p, p.rank);
  __threadfence();
  if (atomicAdd(&s->blocks_done, 1u) == gridDim.x - 1) {
    s->blocks_done = 0;
    s->calls = flag;
  }
}

// 8 values of T per 16-byte pack, widened to fp32 and back (round to nearest even).
template <typename T>
struct Pack8;
template <>
struct Pack8<__nv_bfloat16> {
  static constexpr int kValues = 8;
  __device__ static void Add(const uint4& v, float* acc) {
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&v);
    for (int e = 0; e < kValues; ++e) acc[e] += __bfloat162float(x[e]);
  }
  __device__ static void Load(const uint4& v, float* f) {
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&v);
    for (int e = 0; e < kValues; ++e) f[e] = __bfloat162float(x[e]);
  }
  __device__ static uint4 Round(const float* acc) {
    uint4 v;
    __nv_bfloat16* x = reinterpret_cast<__nv_bfloat16*>(&v);
    for (int e = 0; e < kValues; ++e) x[e] = __float2bfloat16_rn(acc[e]);
    return v;
  }
};
template <>
struct Pack8<__half> {
  static constexpr int kValues = 8;
  __device__ static void Add(const uint4& v, float* acc) {
    const __half* x = reinterpret_cast<const __half*>(&v);
    for (int e = 0; e < kValues; ++e) acc[e] += __half2float(x[e]);
  }
  __device__ static void Load(const uint4& v, float* f) {
    const __half* x = reinterpret_cast<const __half*>(&v);
    for (int e = 0; e < kValues; ++e) f[e] = __half2float(x[e]);
  }
  __device__ static uint4 Round(const float* acc) {
    uint4 v;
    __half* x = reinterpret_cast<__half*>(&v);
    for (int e = 0; e < kValues; ++e) x[e] = __float2half_rn(acc[e]);
    return v;
  }
};
template <>
struct Pack8<float> {
  static constexpr int kValues = 4;
  __device__ static void Add(const uint4& v, float* acc) {
    const float* x = reinterpret_cast<const float*>(&v);
    for (int e = 0; e < kValues; ++e) acc[e] += x[e];
  }
  __device__ static uint4 Round(const float* acc) {
    uint4 v;
    float* x = reinterpret_cast<float*>(&v);
    for (int e = 0; e < kValues; ++e) x[e] = acc[e];
    return v;
  }
};

// The fp32 sum of pack `pack` over the N staging buffers, in rank order 0..N-1 (every rank sums
// in the same order: bit-identical results). __ldcg: peer memory is read past L1.
template <typename T, int N>
__device__ __forceinline__ uint4 SumPack(const ArParams& p, int64_t staging, int64_t pack) {
  float acc[Pack8<T>::kValues] = {};
#pragma unroll
  for (int q = 0; q < N; ++q) {
    Pack8<T>::Add(__ldcg(reinterpret_cast<const uint4*>(p.base[q] + staging) + pack), acc);
  }
  return Pack8<T>::Round(acc);
}

template <typename T, int N>
__global__ void __launch_bounds__(kArThreads) OneShotKernel(ArParams p) {
  __shared__ int failed;
  WaitForPrecedingGrid();
  const uint32_t flag = CallFlag(p);
  const int64_t staging = StagingOffset(p.max_bytes, flag);
  uint4* mine = reinterpret_cast<uint4*>(p.base[p.rank] + staging);
  const int b = blockIdx.x, t = threadIdx.x;
  for (int64_t k = 0, i; (i = ArIndex(p.launch, b, t, k, p.launch.packs)) >= 0; ++k) {
    mine[i] = p.in[i];
  }
  if (!BlockBarrier<N>(p, 0, flag, &failed)) return;
  AllowDependentLaunch();
  for (int64_t k = 0, i; (i = ArIndex(p.launch, b, t, k, p.launch.packs)) >= 0; ++k) {
    p.out[i] = SumPack<T, N>(p, staging, i);
  }
  FinishCall(p, flag);
}

template <typename T, int N>
__global__ void __launch_bounds__(kArThreads) TwoShotKernel(ArParams p) {
  __shared__ int failed[2];
  WaitForPrecedingGrid();
  const uint32_t flag = CallFlag(p);
  const int64_t staging = StagingOffset(p.max_bytes, flag);
  const int64_t result = ResultOffset(p.max_bytes);
  uint4* mine = reinterpret_cast<uint4*>(p.base[p.rank] + staging);
  const int b = blockIdx.x, t = threadIdx.x;
  const int64_t n = p.launch.segment;
  for (int64_t k = 0, i; (i = ArIndex(p.launch, b, t, k, n)) >= 0; ++k) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t pack = ArSegmentPack(p.launch, j, i);
      if (pack >= 0) mine[pack] = p.in[pack];
    }
  }
  if (!BlockBarrier<N>(p, 0, flag, &failed[0])) return;
  AllowDependentLaunch();
  // Reduce-scatter: this rank's segment, kept in its result buffer for the peers.
  uint4* my_result = reinterpret_cast<uint4*>(p.base[p.rank] + result);
  for (int64_t k = 0, i; (i = ArIndex(p.launch, b, t, k, n)) >= 0; ++k) {
    const int64_t pack = ArSegmentPack(p.launch, p.rank, i);
    if (pack < 0) continue;
    const uint4 v = SumPack<T, N>(p, staging, pack);
    my_result[pack] = v;
    p.out[pack] = v;
  }
  if (!BlockBarrier<N>(p, 1, flag, &failed[1])) return;
  // All-gather: every other segment from its owner.
  for (int64_t k = 0, i; (i = ArIndex(p.launch, b, t, k, n)) >= 0; ++k) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t pack = ArSegmentPack(p.launch, j, i);
      if (j == p.rank || pack < 0) continue;
      p.out[pack] = __ldcg(reinterpret_cast<const uint4*>(p.base[j] + result) + pack);
    }
  }
  FinishCall(p, flag);
}

// The fused norm's own arguments (AddRmsNormArgs on the device).
template <typename T>
struct ArNormParams {
  ArNormLaunch launch;
  T* residual = nullptr;
  const T* weight = nullptr;
  T* out = nullptr;
  int64_t hidden = 0;
  float eps = 0.0f;
  bool add_residual = true;
};

// The sum of one float per logical thread over a row's kArNormThreads logical threads, in
// common/block_reduce.cuh BlockSum's order (a butterfly per warp, then the warp sums in warp
// order from 0.0f), when the row's threads are spread over `row_blocks` blocks of a cluster:
// every warp writes its sum into `sums` (kArNormThreads / 32 floats, this row's buffer) of every
// block of the cluster, then each block adds them up. Callers alternate two buffers row by row:
// the cluster barrier of row k + 1 orders row k's reads before row k + 2's writes.
__device__ __forceinline__ float RowSum(float v, float* sums, int row_blocks, int threads) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = ((blockIdx.x % row_blocks) * threads + threadIdx.x) / 32;
  if (row_blocks == 1) {
    if (threadIdx.x % 32 == 0) sums[warp] = v;
    __syncthreads();
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x % 32 == 0) {
      for (int d = 0; d < row_blocks; ++d) cluster.map_shared_rank(sums, d)[warp] = v;
    }
    cluster.sync();
  }
  v = 0.0f;
#pragma unroll
  for (int w = 0; w < kArNormThreads / 32; ++w) v += sums[w];
  return v;
}

// One-shot all-reduce of whole rows, then per row: residual (+)= sum, out = RMSNorm(residual)
// (custom_all_reduce_layout.h: PlanAllReduceNorm, ArNormPack). The thread's packs stay in
// registers: its weight (and residual) packs are loaded before the barrier, all N x kVecs peer
// loads are issued together after it. The sum of a pack is SumPack's (the plain kernel's value);
// the add, the squares (fmaf in pack order per logical thread), the row sum and the scaling are
// kernels/layers/cuda RmsNormKernel's: bit-identical. PDL: waits for its predecessor before
// touching anything, lets its successor launch once every block passed the barrier.
template <typename T, int N, int kVecs>
__global__ void __launch_bounds__(kArNormThreads) AddNormKernel(ArParams p, ArNormParams<T> n) {
  __shared__ int failed;
  __shared__ float row_sums[2][kArNormThreads / 32];
  WaitForPrecedingGrid();
  const ArNormLaunch& L = n.launch;
  const uint32_t flag = CallFlag(p);
  const int64_t staging = StagingOffset(p.max_bytes, flag);
  uint4* mine = reinterpret_cast<uint4*>(p.base[p.rank] + staging);
  const int group = blockIdx.x / L.row_blocks;
  int64_t pack[kVecs];  // index in the row, or -1
#pragma unroll
  for (int v = 0; v < kVecs; ++v) pack[v] = ArNormPack(L, blockIdx.x, threadIdx.x, v);
  for (int64_t row = group; row < L.rows; row += L.groups) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      if (pack[v] >= 0) mine[row * L.row_packs + pack[v]] = p.in[row * L.row_packs + pack[v]];
    }
  }
  const uint4* weight = reinterpret_cast<const uint4*>(n.weight);
  uint4* residual = reinterpret_cast<uint4*>(n.residual);
  uint4* out = reinterpret_cast<uint4*>(n.out);
  uint4 w[kVecs] = {}, res[kVecs] = {};
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    if (pack[v] < 0) continue;
    w[v] = weight[pack[v]];
    if (n.add_residual && group < L.rows) res[v] = residual[group * L.row_packs + pack[v]];
  }
  const bool ok = BlockBarrier<N>(p, 0, flag, &failed);
  AllowDependentLaunch();
  int it = 0;
  for (int64_t row = group; row < L.rows; row += L.groups, ++it) {
    const int64_t base = row * L.row_packs;
    uint4 peer[kVecs][N];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      if (pack[v] < 0 || !ok) continue;
#pragma unroll
      for (int q = 0; q < N; ++q) {
        peer[v][q] = __ldcg(reinterpret_cast<const uint4*>(p.base[q] + staging) + base + pack[v]);
      }
      if (n.add_residual && row != group) res[v] = residual[base + pack[v]];
    }
    float r[kVecs][8];
    float sum_sq = 0.0f;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      if (pack[v] < 0 || !ok) continue;
      float acc[8] = {};
#pragma unroll
      for (int q = 0; q < N; ++q) Pack8<T>::Add(peer[v][q], acc);
      uint4 sum = Pack8<T>::Round(acc);
      if (n.add_residual) {
        float b[8];
        Pack8<T>::Load(res[v], r[v]);
        Pack8<T>::Load(sum, b);
#pragma unroll
        for (int e = 0; e < 8; ++e) r[v][e] += b[e];
        sum = Pack8<T>::Round(r[v]);
      }
      residual[base + pack[v]] = sum;
      Pack8<T>::Load(sum, r[v]);  // the rounded residual, as the next layer sees it
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq = fmaf(r[v][e], r[v][e], sum_sq);
    }
    const float row_sum_sq = RowSum(sum_sq, row_sums[it & 1], L.row_blocks, L.threads);
    const float inv_rms = rsqrtf(row_sum_sq / static_cast<float>(n.hidden) + n.eps);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      if (pack[v] < 0 || !ok) continue;
      float wf[8];
      Pack8<T>::Load(w[v], wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) r[v][e] = (r[v][e] * inv_rms) * wf[e];
      out[base + pack[v]] = Pack8<T>::Round(r[v]);
    }
  }
  if (ok) FinishCall(p, flag);
}

// A cudaLaunchKernelEx configuration: `cluster` blocks per cluster (1: none), programmatic
// stream serialization when `pdl`.
class ArLaunchConfig {
 public:
  ArLaunchConfig(int blocks, int threads, int cluster, bool pdl, cudaStream_t stream) {
    config_.gridDim = dim3(static_cast<unsigned>(blocks));
    config_.blockDim = dim3(static_cast<unsigned>(threads));
    config_.stream = stream;
    int k = 0;
    if (cluster > 1) {
      attrs_[k].id = cudaLaunchAttributeClusterDimension;
      attrs_[k].val.clusterDim.x = static_cast<unsigned>(cluster);
      attrs_[k].val.clusterDim.y = 1;
      attrs_[k].val.clusterDim.z = 1;
      ++k;
    }
    if (pdl) {
      attrs_[k].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs_[k].val.programmaticStreamSerializationAllowed = 1;
      ++k;
    }
    config_.attrs = attrs_;
    config_.numAttrs = k;
  }
  ArLaunchConfig(const ArLaunchConfig&) = delete;
  ArLaunchConfig& operator=(const ArLaunchConfig&) = delete;
  const cudaLaunchConfig_t* get() const { return &config_; }

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attrs_[2] = {};
};

template <typename T, int N>
cudaError_t LaunchNormFor(const ArParams& p, const ArNormParams<T>& n, cudaStream_t stream) {
  const ArLaunchConfig config(n.launch.blocks, n.launch.threads, n.launch.row_blocks, p.pdl,
                              stream);
  switch (n.launch.vecs) {
    case 1:
      return cudaLaunchKernelEx(config.get(), AddNormKernel<T, N, 1>, p, n);
    case 2:
      return cudaLaunchKernelEx(config.get(), AddNormKernel<T, N, 2>, p, n);
    case 4:
      return cudaLaunchKernelEx(config.get(), AddNormKernel<T, N, 4>, p, n);
    default:
      return cudaLaunchKernelEx(config.get(), AddNormKernel<T, N, 8>, p, n);
  }
}

template <typename T>
cudaError_t LaunchNormWorld(int world, const ArParams& p, const ArNormParams<T>& n,
                            cudaStream_t stream) {
  switch (world) {
    case 2:
      return LaunchNormFor<T, 2>(p, n, stream);
    case 4:
      return LaunchNormFor<T, 4>(p, n, stream);
    default:
      return LaunchNormFor<T, 8>(p, n, stream);
  }
}

template <typename T, int N>
cudaError_t LaunchFor(const ArParams& p, cudaStream_t stream) {
  const ArLaunchConfig config(p.launch.blocks, kArThreads, 1, p.pdl, stream);
  if (p.launch.path == ArPath::kOneShot) {
    return cudaLaunchKernelEx(config.get(), OneShotKernel<T, N>, p);
  }
  return cudaLaunchKernelEx(config.get(), TwoShotKernel<T, N>, p);
}

template <typename T>
cudaError_t LaunchWorld(int world, const ArParams& p, cudaStream_t stream) {
  switch (world) {
    case 2:
      return LaunchFor<T, 2>(p, stream);
    case 4:
      return LaunchFor<T, 4>(p, stream);
    default:
      return LaunchFor<T, 8>(p, stream);
  }
}

}  // namespace

int64_t CustomAllReduce::AllocationBytes(int64_t max_bytes) {
  return ResultOffset(max_bytes) + max_bytes;
}

ArLaunch CustomAllReduce::Plan(int64_t bytes) const {
  return PlanAllReduce(bytes, world_, true, options_.limits);
}

bool CustomAllReduce::Aborted() const { return *abort_host_ != 0; }

absl::StatusOr<bool> CustomAllReduce::AllReduceAddRmsNorm(const AddRmsNormArgs& args,
                                                          CommDtype dtype, cudaStream_t stream) {
  const ArNormLaunch launch = PlanAllReduceNorm(args.rows, args.hidden, CommDtypeBytes(dtype),
                                                world_, true, options_.limits);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!launch.fused || dtype == CommDtype::kF32 || !aligned(args.in) || !aligned(args.residual) ||
      !aligned(args.weight) || !aligned(args.out)) {
    return false;
  }
  ArParams p;
  for (int r = 0; r < world_; ++r) p.base[r] = static_cast<char*>(peers_[r]);
  p.rank = rank_;
  p.max_bytes = options_.limits.max_bytes;
  p.in = static_cast<const uint4*>(args.in);
  p.timeout_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.timeout));
  p.abort = abort_device_;
  p.pdl = options_.programmatic_launch;
  auto params = [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    ArNormParams<T> n;
    n.launch = launch;
    n.residual = static_cast<T*>(args.residual);
    n.weight = static_cast<const T*>(args.weight);
    n.out = static_cast<T*>(args.out);
    n.hidden = args.hidden;
    n.eps = args.eps;
    n.add_residual = args.add_residual;
    return n;
  };
  const cudaError_t e =
      dtype == CommDtype::kBf16
          ? LaunchNormWorld(world_, p, params(static_cast<__nv_bfloat16*>(nullptr)), stream)
          : LaunchNormWorld(world_, p, params(static_cast<__half*>(nullptr)), stream);
  CUDA_RETURN_IF_ERROR(e);
  return true;
}

absl::Status CustomAllReduce::AllReduce(const void* in, void* out, int64_t count, CommDtype dtype,
                                        cudaStream_t stream) {
  ArParams p;
  p.launch = Plan(count * CommDtypeBytes(dtype));
  if (p.launch.path == ArPath::kNccl) {
    return absl::InvalidArgumentError(
        absl::StrCat("custom all-reduce: ", count, " elements take another path"));
  }
  if (reinterpret_cast<uintptr_t>(in) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return absl::InvalidArgumentError("custom all-reduce: buffers must be 16-byte aligned");
  }
  for (int r = 0; r < world_; ++r) p.base[r] = static_cast<char*>(peers_[r]);
  p.rank = rank_;
  p.max_bytes = options_.limits.max_bytes;
  p.in = static_cast<const uint4*>(in);
  p.out = static_cast<uint4*>(out);
  p.timeout_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.timeout));
  p.abort = abort_device_;
  p.pdl = options_.programmatic_launch;
  cudaError_t e = cudaSuccess;
  switch (dtype) {
    case CommDtype::kBf16:
      e = LaunchWorld<__nv_bfloat16>(world_, p, stream);
      break;
    case CommDtype::kF16:
      e = LaunchWorld<__half>(world_, p, stream);
      break;
    case CommDtype::kF32:
      e = LaunchWorld<float>(world_, p, stream);
      break;
  }
  CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

}  // namespace tandem::comm
