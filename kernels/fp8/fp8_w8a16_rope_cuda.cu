// Fp8W16GemvNormInRopeKv (fp8_w8a16_gemv_cuda.h): the batch-1 W8A16 qkv GEMV with the input
// RMSNorm in its prologue and RoPE + the KV write in its epilogue, on the tensor-core inner loop
// or its wide lane mapping (kTensorCoreWide).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"
#include "kernels/fp8/fp8_w8a16_wide_device.cuh"
#include "kernels/gemm/cuda/gemv_norm_stage.cuh"
#include "kernels/gemm/cuda/gemv_rope_store.cuh"

namespace tandem::kernels::cuda {
namespace {

using namespace fp8_w16_internal;  // NOLINT(build/namespaces): this package's internal pieces

// Output pairs (16 consecutive i of one head) a block: its two 16-row tiles.
constexpr int kPairsPerBlock = kMmaRows;

// Block b: head h = b / (D / 32), i0 = 16 (b % (D / 32)); row set 0 = weight rows h D + i0 ..
// + 15 (the pairs' first rows), row set 1 = those rows + D / 2 (their partners), streamed as
// Fp8W16MmaKernel<R = 2> streams SiLU-and-mul's gate and up tiles. Each weight row keeps the
// slot of its 16-row tile that Fp8W16GemvNormIn gives it (D / 2 and i0 are multiples of 16), so
// the products are bit for bit that kernel's (the tensor core's fp32 sums may differ in the last
// bit between slots; the loads in flight differ, the order of every sum does not). Thread j < 16
// then rounds both products to bf16 as the qkv buffer would and stores pair (h, i0 + j) through
// RopeKvStore: q rotated into q_out, k rotated and v copied into the pool. kGrouped: scales per
// row and 128-column group. The name starts with Fp8W16MmaKernel so decode_step_bench --trace
// (runtime/cuda/step_breakdown.cc) counts it as the qkv GEMV, not as a RoPE kernel.
//
// kWide: the same tiles on the wide lane mapping (WideTilePartials, 2 CTAs an SM), whose products
// are Fp8W16GemvNormIn's under kTensorCoreWide bit for bit by the same slot argument.
template <bool kGrouped, bool kWide>
__device__ __forceinline__ void RopeKvTile(const Args& p, const GemvRopeKv& rope) {
  __shared__ float partial[kWarps][2][kMmaRows];
  const int half = rope.head_dim / 2;
  const int blocks_per_head = half / kPairsPerBlock;
  const int64_t head = blockIdx.x / blocks_per_head;
  const int i0 = static_cast<int>(blockIdx.x % blocks_per_head) * kPairsPerBlock;
  const int64_t base = head * rope.head_dim + i0;  // weight row of tile row 0, set 0
  const auto row_of = [&](int j, int r) -> int64_t { return base + r * half + j; };
  if constexpr (kWide) {
    WideTilePartials<2, Fold::kNormIn, kGrouped>(p, row_of, partial);
  } else {
    MmaTilePartials<2, Fold::kNormIn, kGrouped>(p, row_of, partial);
  }
  if (threadIdx.x >= kPairsPerBlock) return;
  float dot[2];
  SumPartials<2>(partial, threadIdx.x, dot);
  float x[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = base + r * half + threadIdx.x;
    x[r] = __bfloat162float(__float2bfloat16_rn(RowValue<!kGrouped>(p, row, dot[r], 1.0f)));
  }
  gemv_internal::RopeKvStore<bf16>(rope, head * half + i0 + threadIdx.x, 0, x[0], x[1]);
}

template <bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32) Fp8W16MmaKernelRopeKv(Args p, GemvRopeKv rope) {
  RopeKvTile<kGrouped, false>(p, rope);
}
template <bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelRopeKvWide(Args p, GemvRopeKv rope) {
  RopeKvTile<kGrouped, true>(p, rope);
}

bool MathHasRopeForm(Fp8W16Math math) {
  return math == Fp8W16Math::kTensorCore || math == Fp8W16Math::kAuto ||
         math == Fp8W16Math::kTensorCoreWide || math == Fp8W16Math::kAutoWaves;
}

}  // namespace

bool Fp8W16GemvNormInRopeKvSupported(const void* x, const void* norm_weight,
                                     const Fp8DeviceWeight& w, int64_t m, const GemvRopeKv& rope,
                                     Fp8W16Math math) {
  const int64_t width =
      (int64_t{rope.num_q_heads} + 2 * int64_t{rope.num_kv_heads}) * rope.head_dim;
  return m == 1 && MathHasRopeForm(math) && rope.head_dim >= 2 * kPairsPerBlock &&
         rope.head_dim % (2 * kPairsPerBlock) == 0 && rope.num_q_heads >= 1 &&
         rope.num_kv_heads >= 1 && w.grid.rows == width && rope.positions != nullptr &&
         rope.slot_mapping != nullptr && rope.inv_freq != nullptr && rope.q_out != nullptr &&
         rope.pool != nullptr && rope.block_size >= 1 &&
         Fp8W16GemvNormInSupported(x, norm_weight, w, m);
}

absl::Status Fp8W16GemvNormInRopeKv(const bf16* x, const bf16* norm_weight, float eps,
                                    const Fp8DeviceWeight& w, const bf16* bias, int64_t m,
                                    const GemvRopeKv& rope, cudaStream_t stream,
                                    bool programmatic_launch, bool early_weight_loads,
                                    Fp8W16Math math) {
  if (!Fp8W16GemvNormInRopeKvSupported(x, norm_weight, w, m, rope, math)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fp8W16GemvNormInRopeKv: needs Fp8W16GemvNormInSupported, w's rows = (q heads + 2 kv "
        "heads) * head_dim, head_dim a positive multiple of 32, heads >= 1, non-null rope / pool "
        "pointers and math kTensorCore, kAuto, kTensorCoreWide or kAutoWaves; got m=",
        m, " rows=", w.grid.rows, " k=", w.grid.cols, " head_dim=", rope.head_dim,
        " math=", static_cast<int>(math)));
  }
  const Args p{x,           w.codes, w.scales,          bias, w.grid.rows, w.grid.cols,
               norm_weight, eps,     early_weight_loads};
  const int64_t blocks = w.grid.rows / (2 * kPairsPerBlock);
  const internal::PdlLaunchConfig pdl_config(dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32),
                                             stream, programmatic_launch);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>(2 * p.k * sizeof(bf16));  // row + norm weight
  // kAutoWaves: the wide mapping where the plain GEMVs take it (scales constant along k).
  const bool grouped = Fp8W16GroupedScales(w.grid);
  const bool wide =
      math == Fp8W16Math::kTensorCoreWide || (math == Fp8W16Math::kAutoWaves && !grouped);
  const auto kernel =
      wide ? (grouped ? Fp8W16MmaKernelRopeKvWide<true> : Fp8W16MmaKernelRopeKvWide<false>)
           : (grouped ? Fp8W16MmaKernelRopeKv<true> : Fp8W16MmaKernelRopeKv<false>);
  RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, rope));
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
