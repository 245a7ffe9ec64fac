// MoeExpertGemvFused (moe_cuda.h): the decode expert GEMVs, gate_up + SiLU * up then down, in ONE
// persistent launch, with a handoff per expert instead of a kernel boundary.
//
// Work items, handed out in order by a ticket counter: first every gate_up item (slot s, tile i:
// act columns [8 i, 8 i + 8) of the rows of the s-th active expert), then every down item (slot
// s, tile i: down features [16 i, 16 i + 16)). A gate_up item, once its act values are stored
// and fenced, adds 1 to done[s]; a down item first loads its weight chunks (they depend on
// nothing), then waits until done[s] counts every gate_up tile of slot s, then reads act through
// L2. Deadlock-free whatever the residency: a down item waits only on gate_up items, whose
// tickets were taken earlier by blocks that are running and never wait. The warp code is
// moe_expert_gemv.cuh's, as in the two-launch kernels: the same sums in the same order, so the
// same bits. The block that finishes last zeroes the counters for the next launch.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_expert_gemv.cuh"

namespace tandem::kernels::cuda {
namespace {

using moe_gemv::kGemvWarps;
using moe_gemv::kRowsPerWarp;
using moe_gemv::kUnroll;
using moe_gemv::LoadWeightChunks;
using moe_gemv::WarpRows;
using moe_gemv::WeightRows;

// sync: [0] the next ticket, [1] blocks finished, [2, 2 + slots) gate_up tiles done per slot.
constexpr int kTicket = 0, kFinished = 1, kDone = 2;

struct FusedArgs {
  int64_t hidden, inter;
  int slots;          // min(E, rows): the active-expert slots a launch covers
  int gate_up_tiles;  // per slot: ceil(inter / kGemvWarps)
  int down_tiles;     // per slot: ceil(hidden / (kGemvWarps * kRowsPerWarp))
  DeviceMoePermutation perm;
  int32_t* sync;
};

__device__ __forceinline__ int LoadAcquire(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// gate_up item: act[r, 8 tile + warp] for the rows r of slot's expert, then done[slot] += 1.
template <typename T, int M>
__device__ __forceinline__ void GateUpItem(const T* x, const T* gate_up, T* act, const FusedArgs& p,
                                           int slot, int tile) {
  const int expert = p.perm.active_experts[slot];
  if (expert < 0) return;  // uniform over the block: no expert, no down items wait on it
  const int lane = threadIdx.x & 31;
  const int64_t feature = int64_t{tile} * kGemvWarps + (threadIdx.x >> 5);
  if (feature < p.inter) {
    const T* wrow[kRowsPerWarp];
    WeightRows<T, true>(gate_up, expert, p.inter, p.hidden, feature, wrow);
    uint4 held[kRowsPerWarp][kUnroll];
    WarpRows<T, M, true, true>(x, wrow, p.inter, p.hidden, p.perm, act, feature,
                               p.perm.expert_offsets[expert], p.perm.expert_offsets[expert + 1],
                               lane, held, false);
    if (lane == 0) __threadfence();  // this warp's act values, before the count
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(p.sync + kDone + slot, 1);
  }
}

// down item: out[r, 16 tile + 2 warp + q] once every gate_up tile of the slot is done.
template <typename T, int M>
__device__ __forceinline__ void DownItem(const T* act, const T* down, T* out, const FusedArgs& p,
                                         int slot, int tile) {
  const int expert = p.perm.active_experts[slot];
  if (expert < 0) return;  // uniform over the block
  const int lane = threadIdx.x & 31;
  const int64_t feature = (int64_t{tile} * kGemvWarps + (threadIdx.x >> 5)) * kRowsPerWarp;
  const bool active = feature < p.hidden;
  const T* wrow[kRowsPerWarp];
  uint4 held[kRowsPerWarp][kUnroll];
  if (active) {  // the weights first: they do not depend on gate_up
    WeightRows<T, false>(down, expert, p.hidden, p.inter, feature, wrow);
    LoadWeightChunks<T, kRowsPerWarp>(wrow, lane, p.inter / 8, held);
  }
  if (threadIdx.x == 0) {
    while (LoadAcquire(p.sync + kDone + slot) < p.gate_up_tiles) __nanosleep(64);
  }
  __syncthreads();
  if (active) {
    WarpRows<T, M, false, true, /*kCoherentIn=*/true>(
        act, wrow, p.hidden, p.inter, p.perm, out, feature, p.perm.expert_offsets[expert],
        p.perm.expert_offsets[expert + 1], lane, held, true);
  }
}

// M = 1 (decode of a few tokens): 4 blocks an SM (<= 64 registers, no spills; 72 unbounded),
// as the two launches' kernels reach. More rows a read spill at 64: left unbounded.
template <typename T, int M>
__global__ void __launch_bounds__(kGemvWarps * 32, M == 1 ? 4 : 1)
    FusedGemvKernel(const T* __restrict__ x, const T* __restrict__ gate_up,
                    const T* __restrict__ down, T* act, T* __restrict__ out,
                    const __grid_constant__ FusedArgs p) {
  __shared__ int ticket[2];
  internal::WaitForPrecedingGrid();  // PDL: the permutation and x are the predecessors'
  internal::AllowDependentLaunch();
  const int gate_up_items = p.slots * p.gate_up_tiles;
  const int items = gate_up_items + p.slots * p.down_tiles;
  if (threadIdx.x == 0) ticket[0] = atomicAdd(p.sync + kTicket, 1);
  __syncthreads();
  for (int buf = 0;; buf ^= 1) {
    const int item = ticket[buf];
    if (item >= items) break;
    // The next ticket while this item runs (the other buffer: read by nobody until the barrier).
    if (threadIdx.x == 0) ticket[buf ^ 1] = atomicAdd(p.sync + kTicket, 1);
    if (item < gate_up_items) {
      GateUpItem<T, M>(x, gate_up, act, p, item / p.gate_up_tiles, item % p.gate_up_tiles);
    } else {
      const int d = item - gate_up_items;
      DownItem<T, M>(act, down, out, p, d / p.down_tiles, d % p.down_tiles);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // every ticket this block takes is taken: the last block resets
    __threadfence();
    if (atomicAdd(p.sync + kFinished, 1) == static_cast<int>(gridDim.x) - 1) {
      for (int s = 0; s < kDone + p.slots; ++s) p.sync[s] = 0;
      __threadfence();
    }
  }
}

template <typename T, int M>
absl::Status LaunchFused(const T* x, const T* gate_up, const T* down, T* act, T* out,
                         const FusedArgs& p, cudaStream_t stream, bool programmatic_launch) {
  const auto kernel = FusedGemvKernel<T, M>;
  int device = 0, sms = 0, per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvWarps * 32, 0));
  const int64_t items = int64_t{p.slots} * (p.gate_up_tiles + p.down_tiles);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(items, int64_t{sms} * per_sm));
  const internal::PdlLaunchConfig config(dim3(static_cast<unsigned>(blocks)), dim3(kGemvWarps * 32),
                                         stream, programmatic_launch);
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(config.get(), kernel, x, gate_up, down, act, out, p));
  return absl::OkStatus();
}

}  // namespace

int64_t MoeExpertGemvFusedSyncInts(int64_t num_experts) { return 2 + num_experts; }

template <typename T>
absl::Status MoeExpertGemvFused(const T* x, const T* gate_up, const T* down, int64_t hidden,
                                int64_t inter, const DeviceMoePermutation& perm,
                                int64_t num_experts, int64_t rows, T* act, T* out, int32_t* sync,
                                cudaStream_t stream, bool programmatic_launch) {
  if (hidden < 1 || inter < 1 || num_experts < 1 || num_experts > kMoeMaxExperts || rows < 0 ||
      sync == nullptr || hidden > int64_t{kGemvWarps} * kRowsPerWarp * 65535 ||
      inter > int64_t{kGemvWarps} * 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExpertGemvFused: hidden ", hidden,
                                                   ", inter ", inter, ", experts ", num_experts,
                                                   ", rows ", rows, " (and a sync buffer)"));
  }
  if (rows == 0) return absl::OkStatus();
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  if (hidden % 8 != 0 || inter % 8 != 0 || !aligned(x) || !aligned(gate_up) || !aligned(down) ||
      !aligned(act)) {  // element loads: the two launches (the same results)
    RETURN_IF_ERROR(MoeExpertGemvGateUp<T>(x, gate_up, hidden, inter, perm, num_experts, rows, act,
                                           stream, programmatic_launch));
    return MoeExpertGemvDown<T>(act, down, hidden, inter, perm, num_experts, rows, out, stream,
                                programmatic_launch);
  }
  FusedArgs p;
  p.hidden = hidden;
  p.inter = inter;
  p.slots = static_cast<int>(std::min(num_experts, rows));
  p.gate_up_tiles = static_cast<int>((inter + kGemvWarps - 1) / kGemvWarps);
  p.down_tiles =
      static_cast<int>((hidden + kGemvWarps * kRowsPerWarp - 1) / (kGemvWarps * kRowsPerWarp));
  p.perm = perm;
  p.sync = sync;
  // Rows streamed per weight read: the mean rows per expert, rounded up to 1, 2, 4 or 8 (as
  // the two launches choose).
  const int64_t mean = (rows + num_experts - 1) / num_experts;
  if (mean <= 1)
    return LaunchFused<T, 1>(x, gate_up, down, act, out, p, stream, programmatic_launch);
  if (mean <= 2)
    return LaunchFused<T, 2>(x, gate_up, down, act, out, p, stream, programmatic_launch);
  if (mean <= 4)
    return LaunchFused<T, 4>(x, gate_up, down, act, out, p, stream, programmatic_launch);
  return LaunchFused<T, 8>(x, gate_up, down, act, out, p, stream, programmatic_launch);
}

#define TANDEM_MOE_FUSED_INSTANTIATE(T)                                                          \
  template absl::Status MoeExpertGemvFused<T>(const T*, const T*, const T*, int64_t, int64_t,    \
                                              const DeviceMoePermutation&, int64_t, int64_t, T*, \
                                              T*, int32_t*, cudaStream_t, bool);
TANDEM_MOE_FUSED_INSTANTIATE(__nv_bfloat16)
TANDEM_MOE_FUSED_INSTANTIATE(__half)
#undef TANDEM_MOE_FUSED_INSTANTIATE

}  // namespace tandem::kernels::cuda
