// DeepSeek's block-scaled FP8 GEMM (1 x 128 activation groups, 128 x 128 weight blocks) on
// Hopper's warpgroup MMA: our own kernel beside cuBLASLt's VEC128_32F / BLK128x128_32F modes
// (CublasLtFp8Gemm::kBlock128 picks one: fp8_gemm_cuda.h). DeepGEMM's sm90 design, our code:
//   * a persistent CTA per SM walks 128 x 128 output tiles (grouped raster: 8 m-tiles share the
//     n-tiles the CTAs run at once, so their A rows and weight rows stay in L2);
//   * one producer warp loads each 128-column k-group of A [128 x 128] and the weight
//     [128 x 128] by TMA (128-byte swizzle, zeros past m, n and k) into a ring of 6 stages;
//   * two consumer warpgroups own 64 rows each: per k-group four m64n128k32 e4m3 wgmma into
//     fresh fp32 registers, then the promotion final += part * a_scale[row] * w_scale[block] on
//     the CUDA cores (the other warpgroup's MMAs run meanwhile); the scales as
//     Fp8BlockScaleLoad says;
//   * bf16 output (with an optional bias added in fp32 before the one rounding) stored straight
//     from the registers while the producer already fills the next tile's stages.
// Performance (H200, BENCHMARKS.md): 708-1038 TFLOP/s staged at the Llama-3-8B / DeepSeek-V3
// shapes, 0.62-0.77x cuBLASLt's block kernel (direct scales a few % slower, multicast 30-40%
// slower): about half of the tensor cores' time idle, each warpgroup keeping one group's MMAs in
// flight. Hence not the default.
// Numerics: as cuBLASLt's (fp8_gemm_cuda.h): each MMA instruction's 32 products are summed with
// ~13 fraction bits, promoted to fp32 every 128 along k.
//
// Scale layouts are cuBLASLt's (fp8_gemm_cuda.h): a_scales [ceil(k / 128), m] (group-major, the
// TransposeGroupScales of QuantizeActivations' [m, groups]), w_scales [ceil(n / 128), ld] with
// ld = Block128WeightScaleLd(k). Any m >= 1, n even, k a multiple of 16 (a partial last group
// reads zeros past k); no padding of the scales' groups is read.
// CUDA graphs: Fp8BlockGemmWgmmaInit before capture (the shared-memory opt-in); nothing is
// allocated and nothing synchronizes.
#ifndef TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// How the consumers get a k-group's scales. kStaged (DeepGEMM's way): the producer warp copies
// the tile's 128 activation scales and the weight block's scale into shared memory beside the
// stage (cp.async, published on the stage's barrier with the TMA bytes), read after the wait.
// kDirect: every thread loads its two rows' scales and the block's from global memory one group
// ahead (no producer work; their latency overlaps the previous group's MMAs).
enum class Fp8BlockScaleLoad { kStaged, kDirect };

// Whether a consumer warpgroup overlaps its promotion with its next MMAs
// (fp8_block_gemm_overlap.cu). kNone: the kernel above (288 threads, `wgmma.wait_group 0` before
// each promotion). The others: 384 threads (a producer warpgroup at 40 registers, two consumer
// warpgroups at 232 by setmaxnreg), the MMAs in chunks into two partial register sets in turn,
// chunk c + 1 in flight while chunk c is promoted. k128: 128 x 128 tiles, a k-group one
// m64n128 chunk; k192: 128 x 192 tiles (1.5x the FLOP per byte loaded), a k-group two m64n96
// chunks; kAuto: k192 or k128 by shape (Fp8BlockOverlapAutoTileN). k192Serial (no overlap, for
// comparison): k192's tiles and threads, one m64n192 chunk a group, waited for before its
// promotion as in kNone.
// Staged scales, no multicast.
enum class Fp8BlockOverlap { kNone, k128, k192, kAuto, k192Serial };

// The tile width (128 or 192) kAuto picks for m x n on `sms` SMs: 192 unless its column-waves
// (ceil(tiles / sms) x tile width) exceed 128 x 128 tiles' by more than 1/16 (a first guess,
// not measured yet), else 128.
int Fp8BlockOverlapAutoTileN(int64_t m, int64_t n, int sms);

struct Fp8BlockWgmmaForm {
  Fp8BlockScaleLoad scales = Fp8BlockScaleLoad::kStaged;
  // Clusters of 2 CTAs on adjacent m-tiles of one n-tile, each loading half of the weight tile
  // by TMA and multicasting it into both (a quarter less traffic from L2 to shared memory);
  // staged scales only.
  bool multicast = false;
  Fp8BlockOverlap overlap = Fp8BlockOverlap::kNone;
};

// Whether the current device runs the kernel (sm_90: wgmma and TMA; sm_90a code).
bool Fp8BlockGemmWgmmaSupported();

// The kernel's shared-memory opt-in on the current device (a host call: before graph capture).
// OK and nothing done where the device is not sm_90.
absl::Status Fp8BlockGemmWgmmaInit();

// out[i, j] = sum over groups g of (sum_{c in g} a[i, c] w[j, c]) * a_scales[g * m + i]
//             * w_scales[(j / 128) * ld + g] (+ bias[j]), rounded once to bf16.
// a_codes [m, k] and w_codes [n, k] e4m3 row-major, 16-byte aligned; out [m, n] bf16, bias [n]
// bf16 or null. Asynchronous on `stream`. m == 0 or n == 0: OK, nothing launched.
// INVALID_ARGUMENT for k not a positive multiple of 16, odd n, misaligned or null pointers,
// multicast with direct scales, an overlapped form with direct scales or multicast;
// FAILED_PRECONDITION on a device that is not sm_90.
absl::Status Fp8BlockGemmWgmma(const uint8_t* a_codes, const float* a_scales,
                               const uint8_t* w_codes, const float* w_scales, int64_t m, int64_t n,
                               int64_t k, __nv_bfloat16* out, const __nv_bfloat16* bias,
                               cudaStream_t stream, Fp8BlockWgmmaForm form = {});

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_BLOCK_GEMM_CUDA_H_
