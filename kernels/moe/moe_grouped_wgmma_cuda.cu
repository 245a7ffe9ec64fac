// MoeGroupedWgmma (moe_cuda.h): MoeGroupedMma's contract on Hopper's warpgroup MMA (sm_90a).
//
// A persistent CTA (one per SM) of three warpgroups walks the output tiles of every expert,
// DeepGEMM's "m-grouped contiguous" layout:
//   * warpgroup 0 (producer) copies each tile's A rows (gathered through a_row_index) and its
//     expert's weight rows, 64 columns of k per stage, into a ring of kStages stages with
//     cp.async (zero-fill past the expert's rows, n and k). MoeWgmmaProducer picks how a stage is
//     published on its "full" mbarrier: kWaitGroup, two batches later (cp.async.wait_group 2,
//     fence.proxy.async, arrive), as kernels/attention/cuda's prefill producer does, so a thread
//     has at most 3 stages in flight; kArriveNoinc, by cp.async.mbarrier.arrive.noinc right after
//     the copies (the barrier's arrival lands with them: the whole ring in flight), the
//     consumers then fencing the generic-proxy writes for wgmma's async proxy after their wait;
//     kTmaWeights, as kArriveNoinc for the A rows, the weight tile by TMA (one thread: a 3-d
//     tensor map [E][n][k], 128-byte swizzle, zero fill past n and k; expect-tx on the barrier);
//     kTmaOperands, as kTmaWeights, but without a gather (the down projection) the A tile by TMA
//     too (a 2-d map [rows][k]; rows of the next expert in a tile are computed, not stored), the
//     whole stage then issued by one thread;
//   * warpgroups 1 and 2 (consumers, moe_grouped_wgmma.cuh; MoeWgmmaSchedule): kCooperative, each
//     owns 64 x 128 of every tile (128 x 128 tiles with the two stacked in rows, or 64 x 256 side
//     by side for experts of ~64 rows); kPingPong, each takes every other tile whole (two 64 x 128
//     accumulator blocks), one's epilogue overlapping the other's MMAs; kCooperative128x256, each
//     64 x 256 of 128 x 256 tiles. m64n128k16 wgmma with both operands in shared memory, fp32
//     accumulators, each stage released on its "empty" barrier once the next stage's MMAs are
//     issued (wgmma.wait_group 1); the epilogue stores bf16 / fp16 pairs straight from the
//     accumulators while the producer already fills the next tile's stages. The two-block
//     schedules move registers from the producer to the consumers (setmaxnreg).
// Tile order: expert by expert, and inside an expert the m-tiles of one n-tile adjacent, so the
// CTAs running at once share an expert's weight tiles and A rows in L2. Each CTA builds the
// per-expert tile prefix from the device offsets once (shared memory) and finds a tile's expert
// by binary search: no read-back, capturable in CUDA graphs.
//
// MoeGroupedWgmmaGateUpSilu (the kernels' kGlu) runs gate_up on kCooperative128x256's tiles with
// each tile's weights as two TMA boxes (128 gate rows, the same 128 up rows: a consumer thread
// holds g and u of the same outputs) and stores silu(g) * u.
//
// Performance (H200, bf16, Qwen3-30B-A3B's experts with the gather and SiLU * up): the default
// (kTmaOperands, kCooperative128x256) 433 TFLOP/s at 8,192 tokens (55% of a dense cuBLAS GEMM;
// kCooperative 128 x 128 tiles with kTmaWeights 391-393, kPingPong 407), 210 at 1,024; with
// gate_up through MoeGroupedWgmmaGateUpSilu 489-490 (62%), 228 at 1,024 (BENCHMARKS.md).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/tensor_map.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_grouped_wgmma.cuh"

namespace tandem::kernels::cuda {
namespace moe_wgmma_internal {

using internal::MbarArriveExpectTx;
using internal::TmaLoad2d;

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// An arrival on `bar` once every cp.async this thread issued before has landed; counts as one
// of the barrier's expected arrivals (.noinc).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}

// TMA: the box at (k, row, expert) of the 3-d tensor map into shared memory at dst, completing
// its bytes on `bar`.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int k, int row,
                                          int expert, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(expert), "r"(SmemAddr(bar))
      : "memory");
}

// The producer warpgroup (threads 0-127): thread tid copies 16-byte chunk u = tid % 8 of tile
// rows tid / 8 + 16 j; 16 is a multiple of 8, so all its rows share one swizzle phase.
// kTmaWeights: thread 0 loads the weight tile by TMA instead.
// TMA: the box at (k, row, half, expert) of the 4-d tensor map (glu's gate_up as [E][2][n/2][k]).
__device__ __forceinline__ void TmaLoad4d(uint32_t dst, const CUtensorMap* map, int k, int row,
                                          int half, int expert, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(half), "r"(expert),
      "r"(SmemAddr(bar))
      : "memory");
}

// The weight tile of stage `dst` (kBN rows of 64 k columns) by TMA: with kGlu the tile's gate
// rows (gate_up rows n0 / 2 ...) then its up rows (inter + n0 / 2 ...), kBN / 2 each.
template <int kBN, bool kGlu>
__device__ __forceinline__ void TmaLoadWeights(uint32_t dst, const Params& p, int kt,
                                               const TileRef& tr, uint64_t* bar) {
  if constexpr (!kGlu) {
    TmaLoad3d(dst, &p.wmap, kt * kBK, tr.n0, tr.expert, bar);
    return;
  }
  TmaLoad4d(dst, &p.wmap, kt * kBK, tr.n0 >> 1, 0, tr.expert, bar);
  TmaLoad4d(dst + kBN / 2 * 128, &p.wmap, kt * kBK, tr.n0 >> 1, 1, tr.expert, bar);
}

constexpr bool TmaWeights(Producer producer) {
  return producer == Producer::kTmaWeights || producer == Producer::kTmaOperands;
}
// kTmaOperands without a gather: one thread issues every stage, the barrier's only arrival.
__device__ __forceinline__ bool AllByTma(Producer producer, const Params& p) {
  return producer == Producer::kTmaOperands && p.a_row_index == nullptr;
}

// The producer of AllByTma: thread 0 alone, both tiles of a stage by TMA.
template <int kShape, bool kGlu>
__device__ void ProduceByTma(const Params& p, const int* start, const int* offs, uint32_t ring,
                             uint64_t* full, uint64_t* empty) {
  using C = Tile<kShape>;
  const int ktiles = (p.k + kBK - 1) / kBK;
  uint32_t step = 0;
  for (int t = blockIdx.x; t < start[p.num_experts]; t += gridDim.x) {
    const TileRef tr = FindTile<C::kBM, C::kBN>(t, start, offs, p.num_experts);
    for (int kt = 0; kt < ktiles; ++kt, ++step) {
      const int st = step % C::kStages;
      MbarWait(empty + st, ((step / C::kStages) & 1) ^ 1);
      const uint32_t stage = ring + st * C::kStageBytes;
      MbarArriveExpectTx(full + st, C::kStageBytes);
      TmaLoad2d(stage, &p.amap, kt * kBK, tr.row0, full + st);
      TmaLoadWeights<C::kBN, kGlu>(stage + C::kBOff, p, kt, tr, full + st);
    }
  }
}

template <typename T, int kShape, Producer kProducer, bool kGlu>
__device__ void Produce(const Params& p, const int* start, const int* offs, uint32_t ring,
                        uint64_t* full, uint64_t* empty) {
  using C = Tile<kShape>;
  constexpr int kAJ = C::kBM / 16, kBJ = C::kBN / 16;
  const int tid = threadIdx.x, first = tid >> 3, u = tid & 7;
  if (AllByTma(kProducer, p)) {
    if (tid == 0) ProduceByTma<kShape, kGlu>(p, start, offs, ring, full, empty);
    return;
  }
  const uint32_t dst0 = first * 128 + ((u ^ (first & 7)) << 4);
  const T* a = static_cast<const T*>(p.a);
  const T* w = static_cast<const T*>(p.w);
  const int ktiles = (p.k + kBK - 1) / kBK;
  uint32_t step = 0;
  uint64_t* pend_old = nullptr;
  uint64_t* pend_new = nullptr;
  for (int t = blockIdx.x; t < start[p.num_experts]; t += gridDim.x) {
    const TileRef tr = FindTile<C::kBM, C::kBN>(t, start, offs, p.num_experts);
    int a_row[kAJ];  // source row of A, -1 past the expert's rows
#pragma unroll
    for (int j = 0; j < kAJ; ++j) {
      const int r = tr.row0 + first + 16 * j;
      a_row[j] = r < tr.row_end ? (p.a_row_index != nullptr ? p.a_row_index[r] : r) : -1;
    }
    const int b_rows = min(p.n - tr.n0, C::kBN);  // weight rows (output columns) of the tile
    const T* b0 = w + (static_cast<int64_t>(tr.expert) * p.n + tr.n0 + first) * p.k + u * 8;
    for (int kt = 0; kt < ktiles; ++kt, ++step) {
      const int st = step % C::kStages;
      MbarWait(empty + st, ((step / C::kStages) & 1) ^ 1);
      // b0 and the A row starts already hold this thread's u * 8; past k: nothing read, and the
      // address falls back to the row's start.
      const bool kok = kt * kBK + u * 8 < p.k;
      const uint32_t kbytes = kok ? 16u : 0u;
      const int kc = kok ? kt * kBK : -u * 8;
      const uint32_t sa = ring + st * C::kStageBytes + dst0;
#pragma unroll
      for (int j = 0; j < kAJ; ++j) {
        const T* src = a + static_cast<int64_t>(a_row[j] < 0 ? 0 : a_row[j]) * p.k + u * 8 + kc;
        CpAsync16(sa + j * 16 * 128, src, a_row[j] < 0 ? 0u : kbytes);
      }
      if constexpr (TmaWeights(kProducer)) {
        if (tid == 0) {
          MbarArriveExpectTx(full + st, C::kBN * 128);
          TmaLoadWeights<C::kBN, kGlu>(ring + st * C::kStageBytes + C::kBOff, p, kt, tr, full + st);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBJ; ++j) {
          const bool ok = first + 16 * j < b_rows;
          const T* src = ok ? b0 + static_cast<int64_t>(16 * j) * p.k + kc : w;
          CpAsync16(sa + C::kBOff + j * 16 * 128, src, ok ? kbytes : 0u);
        }
      }
      if constexpr (kProducer != Producer::kWaitGroup) {
        CpAsyncArriveNoinc(full + st);
        continue;
      }
      CpAsyncCommit();
      if (pend_old != nullptr) {  // the batch two back has landed: publish it
        CpAsyncWait<2>();
        FenceProxyAsync();
        MbarArrive(pend_old);
      }
      pend_old = pend_new;
      pend_new = full + st;
    }
  }
  if constexpr (kProducer != Producer::kWaitGroup) {  // nothing left in flight at exit
    CpAsyncCommit();
    CpAsyncWait<0>();
    return;
  }
  CpAsyncWait<0>();
  FenceProxyAsync();
  if (pend_old != nullptr) MbarArrive(pend_old);
  if (pend_new != nullptr) MbarArrive(pend_new);
}

// setmaxnreg: the producer warpgroup of the ping-pong and 128 x 256 kernels gives registers back,
// their consumers (two 64 x 128 fp32 accumulator blocks a thread) take them: 128 x 40 + 256 x 232 =
// 384 x 168, the kernel's allocation under __launch_bounds__(384, 1).
inline constexpr int kProducerRegs = 40, kConsumerRegs = 232;
template <int kRegs, bool kIncrease>
__device__ __forceinline__ void SetMaxRegs() {
  if constexpr (kIncrease) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  }
}

// kPingPong: the ping-pong schedule's consumers (k64x256 or k128x128); k128x256 tiles take the
// cooperative ConsumeWide. kGlu: MoeGroupedWgmmaGateUpSilu (k128x256, or k64x256 ping-pong).
template <typename T, int kShape, Producer kProducer, bool kPingPong, bool kGlu>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWgmmaKernel(const __grid_constant__ Params p) {
  static_assert(!kGlu || kShape == k128x256 || (kShape == k64x256 && kPingPong),
                "kGlu's epilogue is on ConsumeWide's and the 64 x 256 ping-pong tiles only");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Tile<kShape>;
  extern __shared__ uint8_t smem_raw[];
  // wgmma's 128-byte swizzle is a function of address bits 7-9: 1024-byte aligned stages.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarOff);
  uint64_t* empty = full + C::kStages;
  uint64_t* turn = empty + C::kStages;
  int* start = reinterpret_cast<int*>(smem + C::kTableOff);
  int* offs = start + C::kTableInts;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      // The producer threads (and the weight TMA's expect-tx arrival).
      MbarInit(full + s, AllByTma(kProducer, p) ? 1 : TmaWeights(kProducer) ? 129 : 128);
      MbarInit(empty + s, kPingPong ? 4 : 8);  // the consuming warps
    }
    MbarInit(turn, 1);
    MbarInit(turn + 1, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  BuildTileTable(p.offsets, p.num_experts, C::kBM, (p.n + C::kBN - 1) / C::kBN, start, offs);
  __syncthreads();
  constexpr bool kTwoBlocks = kPingPong || kShape == k128x256;
  if (threadIdx.x < 128) {
    if constexpr (kTwoBlocks) SetMaxRegs<kProducerRegs, false>();
    Produce<T, kShape, kProducer, kGlu>(p, start, offs, SmemAddr(smem), full, empty);
  } else if constexpr (kShape == k128x256) {
    SetMaxRegs<kConsumerRegs, true>();
    ConsumeWide<T, kProducer, kGlu>(p, start, offs, SmemAddr(smem), full, empty);
  } else if constexpr (kPingPong) {
    SetMaxRegs<kConsumerRegs, true>();
    ConsumePingPong<T, kShape, kProducer, kGlu>(p, start, offs, SmemAddr(smem), full, empty, turn);
  } else {
    Consume<T, kShape, kProducer>(p, start, offs, SmemAddr(smem), full, empty);
  }
#endif
}

}  // namespace moe_wgmma_internal

namespace {

using moe_wgmma_internal::GroupedWgmmaKernel;
using moe_wgmma_internal::kThreads;
using moe_wgmma_internal::Params;
using moe_wgmma_internal::Tile;
constexpr MoeWgmmaProducer kWait = MoeWgmmaProducer::kWaitGroup;
constexpr MoeWgmmaProducer kNoinc = MoeWgmmaProducer::kArriveNoinc;
constexpr MoeWgmmaProducer kTma = MoeWgmmaProducer::kTmaWeights;
constexpr MoeWgmmaProducer kTmaOps = MoeWgmmaProducer::kTmaOperands;

absl::StatusOr<bool> IsSm90() {
  int dev = 0, major = 0, minor = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

template <typename T, int kShape, MoeWgmmaProducer kProducer, bool kPingPong, bool kGlu>
absl::Status Launch(const Params& p, int64_t rows, cudaStream_t stream) {
  using C = Tile<kShape>;
  const auto kernel = GroupedWgmmaKernel<T, kShape, kProducer, kPingPong, kGlu>;
  // The shared-memory opt-in is a host call: made here unless capturing (MoeGroupedWgmmaInit
  // made it before capture then).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture == cudaStreamCaptureStatusNone) {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  }
  int dev = 0, sms = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  // Tiles: sum over experts of ceil(count / BM) x n-tiles <= (ceil(rows / BM) + experts with
  // rows) x n-tiles; one CTA per SM walks them (CTAs past the last tile exit).
  const int64_t m_tiles = (rows + C::kBM - 1) / C::kBM + std::min<int64_t>(p.num_experts, rows);
  const int64_t tiles = m_tiles * ((p.n + C::kBN - 1) / C::kBN);
  const int grid = static_cast<int>(std::min<int64_t>(sms, tiles));
  kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// A row-major T tensor (dims innermost first) as a TMA tensor map: boxes of `box`, 128-byte
// swizzle (wgmma's layout; box[0] = 64 columns = 128 bytes), zeros past the tensor's ends.
template <int kRank>
absl::StatusOr<CUtensorMap> EncodeMap(const void* base, bool bf16, const cuuint64_t (&dims)[kRank],
                                      const cuuint32_t (&box)[kRank]) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = internal::TensorMapEncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is not available");
  cuuint64_t strides[kRank - 1];
  cuuint32_t elem_strides[kRank];
  cuuint64_t bytes = 2;
  for (int i = 0; i < kRank; ++i) {
    elem_strides[i] = 1;
    bytes *= dims[i];
    if (i + 1 < kRank) strides[i] = bytes;
  }
  CUtensorMap map{};
  const CUresult r =
      encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, kRank,
             const_cast<void*>(base), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("MoeGroupedWgmma: cuTensorMapEncodeTiled failed: ", static_cast<int>(r)));
  }
  return map;
}

// The tensor maps of the TMA producers (kTmaWeights, kTmaOperands) into p, then the launch.
template <typename T, int kShape, MoeWgmmaProducer kProducer, bool kPingPong, bool kGlu>
absl::Status LaunchTma(Params p, int64_t rows, cudaStream_t stream) {
  using C = Tile<kShape>;
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const auto n = static_cast<cuuint64_t>(p.n), k = static_cast<cuuint64_t>(p.k);
  const auto experts = static_cast<cuuint64_t>(p.num_experts);
  if constexpr (kGlu) {  // [E][2][n / 2][k]: zeros past n / 2 in each half
    ASSIGN_OR_RETURN(p.wmap,
                     EncodeMap<4>(p.w, bf16, {k, n / 2, 2, experts}, {64, C::kBN / 2, 1, 1}));
  } else {
    ASSIGN_OR_RETURN(p.wmap, EncodeMap<3>(p.w, bf16, {k, n, experts}, {64, C::kBN, 1}));
  }
  if (kProducer == MoeWgmmaProducer::kTmaOperands && p.a_row_index == nullptr) {
    ASSIGN_OR_RETURN(p.amap,
                     EncodeMap<2>(p.a, bf16, {k, static_cast<cuuint64_t>(rows)}, {64, C::kBM}));
  }
  return Launch<T, kShape, kProducer, kPingPong, kGlu>(p, rows, stream);
}

// The launch of `producer` on kShape tiles, kPingPong or not (the ping-pong schedule, the
// 128 x 256 tiles and kGlu are built for the TMA producers only: the callers check).
template <typename T, int kShape, bool kPingPong, bool kGlu = false>
absl::Status LaunchVariant(MoeWgmmaProducer producer, const Params& p, int64_t rows,
                           cudaStream_t stream) {
  if (producer == kTmaOps) return LaunchTma<T, kShape, kTmaOps, kPingPong, kGlu>(p, rows, stream);
  if (producer == kTma) return LaunchTma<T, kShape, kTma, kPingPong, kGlu>(p, rows, stream);
  if constexpr (kPingPong || kGlu || kShape == moe_wgmma_internal::k128x256) {
    return absl::InvalidArgumentError("MoeGroupedWgmma: this schedule needs a TMA producer");
  } else if (producer == kNoinc) {
    return Launch<T, kShape, kNoinc, false, false>(p, rows, stream);
  } else {
    return Launch<T, kShape, kWait, false, false>(p, rows, stream);
  }
}

// The shared-memory opt-in of the bf16 and fp16 kernels of one tile shape, producer and schedule.
template <int kShape, MoeWgmmaProducer kProducer, bool kPingPong, bool kGlu = false>
absl::Status SetSmem() {
  constexpr int kBytes = Tile<kShape>::kSmemBytes;
  const auto set = [](auto kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  };
  CUDA_RETURN_IF_ERROR(set(GroupedWgmmaKernel<__nv_bfloat16, kShape, kProducer, kPingPong, kGlu>));
  CUDA_RETURN_IF_ERROR(set(GroupedWgmmaKernel<__half, kShape, kProducer, kPingPong, kGlu>));
  return absl::OkStatus();
}

// Both of a producer's shapes of MoeGroupedWgmmaWith's kCooperative (kPingPong false) or
// kPingPong schedule.
template <MoeWgmmaProducer kProducer, bool kPingPong>
absl::Status SetSmemBoth() {
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k64x256, kProducer, kPingPong>()));
  return SetSmem<moe_wgmma_internal::k128x128, kProducer, kPingPong>();
}

}  // namespace

absl::Status MoeGroupedWgmmaInit() {
  ASSIGN_OR_RETURN(const bool sm90, IsSm90());
  if (!sm90) return absl::OkStatus();
  RETURN_IF_ERROR((SetSmemBoth<kWait, false>()));
  RETURN_IF_ERROR((SetSmemBoth<kNoinc, false>()));
  RETURN_IF_ERROR((SetSmemBoth<kTma, false>()));
  RETURN_IF_ERROR((SetSmemBoth<kTmaOps, false>()));
  RETURN_IF_ERROR((SetSmemBoth<kTma, true>()));
  RETURN_IF_ERROR((SetSmemBoth<kTmaOps, true>()));
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k128x256, kTma, false>()));
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k128x256, kTmaOps, false>()));
  // MoeGroupedWgmmaGateUpSilu's kernels.
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k128x256, kTma, false, true>()));
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k128x256, kTmaOps, false, true>()));
  RETURN_IF_ERROR((SetSmem<moe_wgmma_internal::k64x256, kTma, true, true>()));
  return SetSmem<moe_wgmma_internal::k64x256, kTmaOps, true, true>();
}

bool MoeGroupedWgmmaSupported(const void* a, const void* w, int64_t n, int64_t k) {
  const absl::StatusOr<bool> sm90 = IsSm90();
  return sm90.ok() && *sm90 && MoeGroupedMmaSupported(a, w, n, k) && n <= 0x7fffffff;
}

namespace {

// MoeGroupedWgmmaWith's argument checks (n = gate_up's width for MoeGroupedWgmmaGateUpSilu).
absl::Status CheckArgs(const char* name, MoeWgmmaProducer producer, MoeWgmmaSchedule schedule,
                       const void* a, const void* w, const void* out, int64_t num_experts,
                       int64_t rows, int64_t n, int64_t k) {
  if (!MoeGroupedWgmmaSupported(a, w, n, k) || reinterpret_cast<uintptr_t>(out) % 4 != 0 ||
      num_experts < 1 || num_experts > kMoeMaxExperts || rows < 0 || rows > 0x3fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": n ", n, ", k ", k,
                     " (multiples of 8, 16-byte aligned operands, an sm_90 device), experts ",
                     num_experts, ", rows ", rows));
  }
  if (schedule != MoeWgmmaSchedule::kCooperative && producer != kTma && producer != kTmaOps) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        ": the ping-pong and 128 x 256 schedules need a TMA producer (kTmaWeights, kTmaOperands)"));
  }
  return absl::OkStatus();
}

// The launch of p's kernel for `producer` and `schedule`: 64 x 256 tiles while experts average
// <= 64 rows (Qwen3-30B-A3B at ~1k tokens), else 128 x 128 (128 x 256 for kCooperative128x256).
template <typename T>
absl::Status Dispatch(MoeWgmmaProducer producer, MoeWgmmaSchedule schedule, const Params& p,
                      int64_t rows, cudaStream_t stream) {
  using moe_wgmma_internal::k128x128;
  using moe_wgmma_internal::k128x256;
  using moe_wgmma_internal::k64x256;
  const bool wide = rows <= int64_t{64} * p.num_experts;
  if (schedule == MoeWgmmaSchedule::kCooperative) {
    return wide ? LaunchVariant<T, k64x256, false>(producer, p, rows, stream)
                : LaunchVariant<T, k128x128, false>(producer, p, rows, stream);
  }
  if (wide) return LaunchVariant<T, k64x256, true>(producer, p, rows, stream);
  return schedule == MoeWgmmaSchedule::kPingPong
             ? LaunchVariant<T, k128x128, true>(producer, p, rows, stream)
             : LaunchVariant<T, k128x256, false>(producer, p, rows, stream);
}

template <typename T>
Params MakeParams(const T* a, const int32_t* a_row_index, const T* w, const int32_t* expert_offsets,
                  int64_t num_experts, int64_t n, int64_t k, T* out) {
  Params p{};
  p.a = a;
  p.a_row_index = a_row_index;
  p.w = w;
  p.offsets = expert_offsets;
  p.out = out;
  p.num_experts = static_cast<int>(num_experts);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  return p;
}

}  // namespace

template <typename T>
absl::Status MoeGroupedWgmmaWith(MoeWgmmaProducer producer, MoeWgmmaSchedule schedule, const T* a,
                                 const int32_t* a_row_index, const T* w,
                                 const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                                 int64_t n, int64_t k, T* out, cudaStream_t stream) {
  RETURN_IF_ERROR(
      CheckArgs("MoeGroupedWgmma", producer, schedule, a, w, out, num_experts, rows, n, k));
  if (rows == 0) return absl::OkStatus();
  return Dispatch<T>(producer, schedule,
                     MakeParams(a, a_row_index, w, expert_offsets, num_experts, n, k, out), rows,
                     stream);
}

template <typename T>
absl::Status MoeGroupedWgmmaGateUpSilu(const T* a, const int32_t* a_row_index, const T* gate_up,
                                       const int32_t* expert_offsets, int64_t num_experts,
                                       int64_t rows, int64_t inter, int64_t k, T* act,
                                       cudaStream_t stream, MoeWgmmaProducer producer) {
  constexpr MoeWgmmaSchedule kWide = MoeWgmmaSchedule::kCooperative128x256;
  if (inter % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeGroupedWgmmaGateUpSilu: inter ", inter, " (a multiple of 8)"));
  }
  RETURN_IF_ERROR(CheckArgs("MoeGroupedWgmmaGateUpSilu", producer, kWide, a, gate_up, act,
                            num_experts, rows, 2 * inter, k));
  if (rows == 0) return absl::OkStatus();
  const Params p =
      MakeParams(a, a_row_index, gate_up, expert_offsets, num_experts, 2 * inter, k, act);
  // kCooperative128x256's tiles as Dispatch picks them: 64 x 256 ping-pong while experts average
  // <= 64 rows, else 128 x 256.
  using moe_wgmma_internal::k128x256;
  using moe_wgmma_internal::k64x256;
  return rows <= int64_t{64} * num_experts
             ? LaunchVariant<T, k64x256, true, true>(producer, p, rows, stream)
             : LaunchVariant<T, k128x256, false, true>(producer, p, rows, stream);
}

template <typename T>
absl::Status MoeGroupedWgmma(const T* a, const int32_t* a_row_index, const T* w,
                             const int32_t* expert_offsets, int64_t num_experts, int64_t rows,
                             int64_t n, int64_t k, T* out, cudaStream_t stream) {
  return MoeGroupedWgmmaWith<T>(kMoeWgmmaDefaultProducer, kMoeWgmmaDefaultSchedule, a, a_row_index,
                                w, expert_offsets, num_experts, rows, n, k, out, stream);
}

template absl::Status MoeGroupedWgmma<__nv_bfloat16>(const __nv_bfloat16*, const int32_t*,
                                                     const __nv_bfloat16*, const int32_t*, int64_t,
                                                     int64_t, int64_t, int64_t, __nv_bfloat16*,
                                                     cudaStream_t);
template absl::Status MoeGroupedWgmmaWith<__nv_bfloat16>(MoeWgmmaProducer, MoeWgmmaSchedule,
                                                         const __nv_bfloat16*, const int32_t*,
                                                         const __nv_bfloat16*, const int32_t*,
                                                         int64_t, int64_t, int64_t, int64_t,
                                                         __nv_bfloat16*, cudaStream_t);
template absl::Status MoeGroupedWgmmaWith<__half>(MoeWgmmaProducer, MoeWgmmaSchedule, const __half*,
                                                  const int32_t*, const __half*, const int32_t*,
                                                  int64_t, int64_t, int64_t, int64_t, __half*,
                                                  cudaStream_t);
#define TANDEM_MOE_WGMMA_GATE_UP_SILU(T)                                                        \
  template absl::Status MoeGroupedWgmmaGateUpSilu<T>(const T*, const int32_t*, const T*,        \
                                                     const int32_t*, int64_t, int64_t, int64_t, \
                                                     int64_t, T*, cudaStream_t, MoeWgmmaProducer);
TANDEM_MOE_WGMMA_GATE_UP_SILU(__nv_bfloat16)
TANDEM_MOE_WGMMA_GATE_UP_SILU(__half)
#undef TANDEM_MOE_WGMMA_GATE_UP_SILU
template absl::Status MoeGroupedWgmma<__half>(const __half*, const int32_t*, const __half*,
                                              const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                              __half*, cudaStream_t);

}  // namespace tandem::kernels::cuda
