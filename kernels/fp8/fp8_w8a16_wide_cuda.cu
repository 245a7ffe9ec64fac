// Fp8W16Math::kTensorCoreWide (fp8_w8a16_gemv_cuda.h): the deep kernel's 16-row tiles, loads in
// flight and arithmetic types on the wide lane mapping (fp8_w8a16_wide_device.cuh: 128
// contiguous bytes of a weight row a warp load instead of 64). A microbenchmark that read the
// Llama-3-8B projections both ways (loads only, PDL chain, one H200) moved 7-10% more bytes a
// second at 128 bytes a row (BENCHMARKS.md, thirty-second session). Folds bit-identical to the
// unfolded kernels of the same math.
#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_device.cuh"
#include "kernels/fp8/fp8_w8a16_wide_device.cuh"

namespace tandem::kernels::cuda::fp8_w16_internal {
namespace {

template <typename TOut, int R, Fold kFold, bool kGrouped>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8W16MmaKernelWide(Args p, TOut* __restrict__ out) {
  TileKernelBody<TOut, R, kFold, kGrouped>(p, out, [&](const auto& row_of, auto& partial) {
    WideTilePartials<R, kFold, kGrouped>(p, row_of, partial);
  });
}

}  // namespace

template <typename TOut, int R, Fold kFold>
absl::Status LaunchWide(const Args& p, TOut* out, cudaStream_t stream, bool pdl, bool grouped) {
  const internal::PdlLaunchConfig pdl_config(
      dim3(static_cast<unsigned>((p.n + kMmaRows - 1) / kMmaRows)), dim3(kWarps * 32), stream, pdl);
  cudaLaunchConfig_t config = *pdl_config.get();  // its attributes stay in pdl_config
  config.dynamicSmemBytes = static_cast<size_t>((kFold == Fold::kNormIn ? 2 : 1) * p.k * 2);
  const auto kernel = grouped ? Fp8W16MmaKernelWide<TOut, R, kFold, true>
                              : Fp8W16MmaKernelWide<TOut, R, kFold, false>;
  RETURN_IF_ERROR(OptInPastTheDefaultSmem(kernel, config.dynamicSmemBytes));
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, p, out));
  return absl::OkStatus();
}

#define TANDEM_W16_WIDE_FORM(TOut, R, kFold) \
  template absl::Status LaunchWide<TOut, R, kFold>(const Args&, TOut*, cudaStream_t, bool, bool);
TANDEM_W16_TILE_FORMS(TANDEM_W16_WIDE_FORM)
#undef TANDEM_W16_WIDE_FORM

}  // namespace tandem::kernels::cuda::fp8_w16_internal
