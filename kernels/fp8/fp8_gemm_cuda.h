// FP8 GEMM for prefill through cuBLASLt's FP8 matmul (issue 38 item 4): e4m3 activations and
// weights, fp32 accumulation, bf16 output:
//   * kTensor: one scale per matrix (per-tensor weights, static activations), applied by
//     cuBLASLt through its scale pointers; a bias is added by cuBLASLt's BIAS epilogue in fp32
//     before the one rounding to bf16 (where cuBLASLt has no such kernel for a shape: AddBias, a
//     second rounding);
//   * kTokenChannel: a per-token scale vector for the activations and a per-channel one for the
//     weights, through cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F mode where it has a
//     kernel (it has on an H200, CUDA 13, once the heuristic is asked with the scale pointers
//     set: without them it answers INVALID_VALUE, which an earlier version read as "none").
//     Create asks once; without it (or with try_outer_vector = false, or for a shape it lacks)
//     this is cuBLASLt's FP8 matmul with unit scales writing the fp32 product into a
//     preallocated accumulator, then one epilogue kernel (ScaleFp8Accumulator: acc * a_scale[i]
//     * w_scale[j] (+ bias), one rounding to bf16), m cut into chunks of rows whose fp32 product
//     fits the accumulator;
//   * kBlock128: DeepSeek's block scaling, 1 x 128 activation groups and 128 x 128 weight blocks,
//     through cuBLASLt's VEC128_32F (activations) / BLK128x128_32F (weights) scale modes (CUDA
//     12.9+, Hopper): cuBLASLt applies every group's scales to its partial products in fp32. The
//     scales are in cuBLASLt's layouts (below; TransposeGroupScales and Block128WeightScales
//     produce them), bias as for kTensor. m must be a multiple of kBlock128RowMultiple
//     (cuBLASLt has no kernel otherwise; CudaFp8Linear runs the last rows on its GEMV) and the
//     number of 128-column groups a multiple of 4 (what has run on a GPU: no padded scale rows),
//     else UNIMPLEMENTED. Every DeepSeek-V3 projection qualifies (k = 7168, 1536, 512, 2048,
//     16384, 18432). By default where it is built, CUTLASS's kernel on the same layouts
//     (block_kernel() == kCutlass: any m, k a multiple of 128, n a multiple of 8, no bias; calls
//     below its row bound on cuBLASLt as above, except those cuBLASLt has no kernel for, which
//     CUTLASS takes at any m). Or, with block_kernel() == kWgmma, our own wgmma kernel on the
//     same layouts (fp8_block_gemm_cuda.h: any m, k a multiple of 16, n even; the bias added
//     before its one rounding).
// Numerics: Hopper's FP8 tensor cores add each MMA's 32 products and the running sum aligned to
// the largest of them with 13 fraction bits, truncating (DeepSeek-V3 report 3.3.2); cuBLASLt
// without FAST_ACCUM promotes to fp32 every 128 along k. fp8_cuda_bench --only=probe shows it on
// an H200: 448 + 31 x 2^-6 in one MMA sums to exactly 448; over k = 1024 the 2^-6 terms sharing
// a 128-interval with 448 are lost, the others kept. So an output's error is a few 2^-13 of its
// per-MMA largest magnitudes, not of the sum of |terms| (fp8_gemm_cuda_test's tolerance).
//
// Thread safety: not thread-safe (plan cache, descriptor scale pointers, the accumulator), like
// CublasLtGemm.
// CUDA graphs: allocates nothing on the device after Create and never synchronizes (but for the
// one eager timing of set_autotune_max_m, and kCutlass's larger workspace where a shape needs
// more than workspace_bytes: allocated on an eager call; inside a capture such a call runs on
// cuBLASLt); warm each shape up first (plans are built on first use). A shape first met while
// its stream is capturing keeps the heuristic's first choice and is timed on its next eager
// call.
#ifndef TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_
#define TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/fp8/fp8.h"
#include "kernels/gemm/cuda/cublaslt_algo_tuner.h"

namespace tandem::kernels::cuda {

enum class Fp8GemmScaling { kTensor, kTokenChannel, kBlock128 };

// Which kernel runs kBlock128: CUTLASS's sm90 block-scaled kernel (kernels/fp8/cutlass/
// cutlass_block_gemm.h, kCutlass: the default where it is built and the device is sm_90; calls it
// does not take, a bias, or a workspace it cannot get inside a graph capture go to cuBLASLt),
// cuBLASLt's block scale modes, or Fp8BlockGemmWgmma (fp8_block_gemm_cuda.h, sm_90 only) with its
// scales staged in shared memory (kWgmma), loaded by each thread (kWgmmaDirectScales), or staged
// with the weight tile multicast over clusters of 2 CTAs (kWgmmaMulticast). Create takes
// TANDEM_FP8_BLOCK_GEMM ("cutlass", "cublaslt", "wgmma", "wgmma_direct" or "wgmma_multicast";
// read by each Create) where it is set, else DefaultFp8BlockGemmKernel(); a kernel the device
// (or build) lacks leaves kCublasLt.
enum class Fp8BlockGemmKernel { kCublasLt, kWgmma, kWgmmaDirectScales, kWgmmaMulticast, kCutlass };
// Whether this binary has the CUTLASS kernel (built with @cutlass: third_party/cutlass/).
bool Fp8BlockGemmCutlassBuilt();
// Whether the CUTLASS kernel runs here (built, and the current device is sm_90).
bool Fp8BlockGemmCutlassAvailable();
// kCutlass where available, else kCublasLt. By default CUTLASS takes only calls of at least
// kCutlassBlockMinRows rows (the rest: cuBLASLt); TANDEM_FP8_BLOCK_GEMM=cutlass or
// set_block_kernel(kCutlass) gives it every m.
Fp8BlockGemmKernel DefaultFp8BlockGemmKernel();
// Measured on an H200 (kernels/fp8/BENCHMARKS.md, seventeenth session; fp8_cuda_bench --only=block
// --block_ms): CUTLASS / cuBLASLt's block mode 0.64-1.08 at m 64-512 (most rows below 1: a MoE
// model's per-expert GEMMs; Qwen3-30B-A3B-FP8 served on CUTLASS at every m had 9% longer TTFT),
// 0.92-1.02 at 1024, 0.97-1.17 at 2048 / 8192 (geomean ~1.05).
inline constexpr int64_t kCutlassBlockMinRows = 2048;

// cuBLASLt's scale layouts for kBlock128 (column-major in its terms, where our row-major
// activations [m, k] and weights [n, k] are k x m and k x n):
//   * activations, VEC128_32F: scales[g * m + i] for row i and group g of 128 columns, i.e. the
//     [ceil(k / 128), m] transpose of QuantizeActivations' kDynamicGroup128 scales [m, groups]
//     (TransposeGroupScales, fp8_gemm_kernels.h);
//   * weights, BLK128x128_32F: scales[b * ld + g] for row block b (128 rows) and column group g,
//     ld = Block128WeightScaleLd(k): ceil(k / 128) rounded up to 4 (16-byte rows).
inline constexpr int64_t kBlock128RowMultiple = 4;
inline int64_t Block128Groups(int64_t k) { return (k + 127) / 128; }
inline int64_t Block128WeightScaleLd(int64_t k) { return (Block128Groups(k) + 3) / 4 * 4; }
// The weight's block scales in cuBLASLt's layout from the in-memory per-row form (grid with
// block_rows 1 and block_cols 128, scales [n, ceil(k / 128)]: what the loader holds), when
// every 128-row block's rows share their scales (a DeepSeek 128 x 128 checkpoint whose fused
// parts and TP slices start on block boundaries); FAILED_PRECONDITION naming the first row that
// differs otherwise, INVALID_ARGUMENT for another grid. Padding entries are 1. Host only.
absl::StatusOr<std::vector<float>> Block128WeightScales(const float* row_scales,
                                                        const Fp8ScaleGrid& grid);

class CublasLtFp8Gemm {
 public:
  static constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;
  // The fp32 product of the kTokenChannel epilogue path: 256 MiB holds 2,340 rows of Llama-3-8B's
  // fused gate_up (n = 28672) or 16,384 rows of n = 4096 per cuBLASLt call.
  static constexpr int64_t kDefaultAccumulatorBytes = int64_t{256} << 20;

  // The cuBLASLt handle, a device workspace and the fp32 accumulator on the current device.
  // RESOURCE_EXHAUSTED when they do not fit. try_outer_vector: ask cuBLASLt once whether it has
  // outer-vector FP8 kernels and use them for kTokenChannel where it does (false: always the
  // epilogue path, as tests force it).
  static absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> Create(
      int64_t workspace_bytes = kDefaultWorkspaceBytes,
      int64_t accumulator_bytes = kDefaultAccumulatorBytes, bool try_outer_vector = true);

  CublasLtFp8Gemm(const CublasLtFp8Gemm&) = delete;
  CublasLtFp8Gemm& operator=(const CublasLtFp8Gemm&) = delete;
  ~CublasLtFp8Gemm();

  // out[m, n] = sum_k (a[i, c] * a_scale) * (w[j, c] * w_scale) in fp32 (+ bias[j]), rounded
  // once to bf16 (twice with a bias where cuBLASLt has no BIAS epilogue kernel for the shape).
  // a_codes: [m, k] e4m3, row-major; w_codes: [n, k] e4m3 (nn.Linear layout); both 16-byte
  // aligned, k a multiple of 16 (n a multiple of 8 or cuBLASLt may have no kernel:
  // UNIMPLEMENTED). Scales are device fp32: kTensor one each; kTokenChannel a_scales [m] and
  // w_scales [n]; kBlock128 the layouts above (16-byte aligned). bias: [n] bf16 or null.
  // Asynchronous on `stream`. m == 0 or n == 0: OK, nothing launched. INVALID_ARGUMENT for bad
  // sizes or pointers; UNIMPLEMENTED when cuBLASLt has no kernel for the shape (named).
  absl::Status Linear(const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes,
                      const float* w_scales, Fp8GemmScaling scaling, int64_t m, int64_t n,
                      int64_t k, __nv_bfloat16* out, cudaStream_t stream,
                      const __nv_bfloat16* bias = nullptr);

  // out[m, n] = the unit-scaled FP8 product in fp32 (what the kTokenChannel epilogue path
  // scales; also how fp8_cuda_bench probes the MMA's accumulation). Same requirements as Linear.
  absl::Status ProductF32(const uint8_t* a_codes, const uint8_t* w_codes, int64_t m, int64_t n,
                          int64_t k, float* out, cudaStream_t stream);

  // The kBlock128 kernel. set_block_kernel: FAILED_PRECONDITION for the wgmma ones and kCutlass
  // on a device that is not sm_90, and for kCutlass where it is not built (the kernels'
  // shared-memory opt-in is made here: before any graph capture); kCutlass for calls of at least
  // min_rows rows (0: every call; Create's default: kCutlassBlockMinRows), cuBLASLt below.
  Fp8BlockGemmKernel block_kernel() const { return block_kernel_; }
  absl::Status set_block_kernel(Fp8BlockGemmKernel kernel, int64_t min_rows = 0);
  int64_t cutlass_min_rows() const { return cutlass_min_rows_; }
  // The kernel that ran the last kBlock128 call that launched one (kCublasLt before any, and
  // where kCutlass fell back to cuBLASLt).
  Fp8BlockGemmKernel last_block_kernel() const { return last_block_kernel_; }

  // Plans for m <= max_m (every scaling; kBlock128 on cuBLASLt only) first used from now on are
  // chosen by timing up to kCublasLtTuneCandidates heuristic candidates on their first call that
  // is not being captured into a CUDA graph (kernels/gemm/cuda/cublaslt_algo_tuner.h: 12
  // launches each on `stream` with the caller's buffers, out overwritten anyway, one
  // synchronization per candidate); until then, and for larger m, the heuristic's first.
  // The choice is kept per (m, n, k, scaling path, bias epilogue): the plan cache. 0 (default):
  // never time; kAutotuneAllM: every m (benchmarks). As CublasLtGemm::set_autotune_max_m.
  void set_autotune_max_m(int64_t max_m) { autotune_max_m_ = max_m; }
  int64_t autotune_max_m() const { return autotune_max_m_; }
  // Cached plans (shapes and paths seen so far), and how many of them were timed: a repeated
  // call changes neither.
  size_t num_cached_plans() const { return plans_.size(); }
  int64_t num_tuned_plans() const { return num_tuned_plans_; }

  // Whether kTokenChannel runs on cuBLASLt's outer-vector scale mode (true on an H200, CUDA 13).
  bool outer_vector_scales() const { return outer_vector_; }
  // Rows per cuBLASLt call on the epilogue path for n output columns (0: not even one fits).
  int64_t EpilogueChunkRows(int64_t n) const;

 private:
  struct Plan;
  // The plan kinds: cuBLASLt-scaled per tensor (bf16 out), outer vectors (bf16 out), unit
  // scales with the fp32 product out (the epilogue path), or 128-blocks (bf16 out).
  enum PlanKind : int {
    kTensorPlan = 0,
    kOuterVectorPlan = 1,
    kUnscaledF32Plan = 2,
    kBlock128Plan = 3
  };
  // m, n, k, kind, with cuBLASLt's BIAS epilogue.
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool>;

  CublasLtFp8Gemm(cublasLtHandle_t handle, void* workspace, int64_t workspace_bytes,
                  float* accumulator, int64_t accumulator_bytes);
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key);
  absl::Status BuildPlan(const PlanKey& key, bool swap_ab, Plan* plan);
  // Enqueues plan's product (first / second: cuBLASLt's A and B), first timing its candidates
  // where it has any and `stream` is not capturing (set_autotune_max_m).
  absl::Status Run(Plan* plan, const void* first, const void* second, void* out,
                   cudaStream_t stream);
  // The cuBLASLt-scaled paths (kTensor, outer vectors, kBlock128): the plan with the BIAS
  // epilogue where a bias is given and cuBLASLt has one, else AddBias after the matmul.
  absl::Status ScaledLinear(PlanKind kind, const uint8_t* a_codes, const float* a_scales,
                            const uint8_t* w_codes, const float* w_scales, int64_t m, int64_t n,
                            int64_t k, __nv_bfloat16* out, const __nv_bfloat16* bias,
                            cudaStream_t stream);
  // kCutlass: CutlassFp8BlockGemm on the workspace (the object's if large enough, else one of
  // its own, grown outside graph capture only). OK(false) where CUTLASS does not take the call
  // (not built, a bias, sizes it refuses, no workspace inside a capture): cuBLASLt runs it.
  absl::StatusOr<bool> CutlassBlockLinear(const uint8_t* a_codes, const float* a_scales,
                                          const uint8_t* w_codes, const float* w_scales, int64_t m,
                                          int64_t n, int64_t k, __nv_bfloat16* out,
                                          const __nv_bfloat16* bias, cudaStream_t stream);
  absl::Status EpilogueLinear(const uint8_t* a_codes, const float* a_scales, const uint8_t* w_codes,
                              const float* w_scales, int64_t m, int64_t n, int64_t k,
                              __nv_bfloat16* out, const __nv_bfloat16* bias, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  int64_t workspace_bytes_;
  float* accumulator_;
  int64_t accumulator_bytes_;
  bool outer_vector_ = false;
  int64_t autotune_max_m_ = 0;
  int64_t num_tuned_plans_ = 0;
  Fp8BlockGemmKernel block_kernel_ = Fp8BlockGemmKernel::kCublasLt;
  int64_t cutlass_min_rows_ = 0;  // kCutlass: calls of fewer rows run on cuBLASLt
  Fp8BlockGemmKernel last_block_kernel_ = Fp8BlockGemmKernel::kCublasLt;
  // kCutlass's workspace where workspace_ is too small (null until then); the ones it replaced
  // stay allocated until destruction (a captured graph may still use them).
  void* cutlass_workspace_ = nullptr;
  int64_t cutlass_workspace_bytes_ = 0;
  std::vector<void*> retired_workspaces_;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
  // Shapes cuBLASLt has no algorithm for, with the answer it gave.
  absl::flat_hash_map<PlanKey, absl::Status> no_kernel_;
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_FP8_FP8_GEMM_CUDA_H_
