// FP8 experts of a MoE layer on the CUDA backend (issues 38 / 32): the e4m3 routed experts (and
// DeepSeek's shared experts) of an FP8 checkpoint, as the loader holds them
// (LayerWeights::experts_*_fp8, shared_*_fp8: per-row scales over 128-column groups — DeepSeek-V3's
// 128 x 128 blocks — or the whole row — compressed-tensors per-channel), kept e4m3 on the device,
// and the steps CudaMoeMlp runs on them (cuda_moe_mlp.h):
//   * decode and every CUDA graph size (T <= CudaMoeMlp::kSyncFreeMaxTokens, or under capture):
//     the input quantized as the checkpoint says (kernels/fp8 cuda::QuantizeActivations: per
//     token, 1 x 128 groups, static; none for weight-only), kernels/moe's FP8 expert GEMVs
//     (gate_up with SiLU * up, then the act rows quantized the same way, down): only the routed
//     experts' weights read, no host sync. Past max(4, E / k) tokens (the bf16 layer's GEMV bound:
//     experts then average one row or more) and with FP8 activations, the same
//     steps on the tensor cores instead (kernels/moe MoeFp8GroupedMma for gate_up rows and down,
//     MoeSiluAndMul between): the GEMVs ran the e4m3 products on CUDA cores, 1.6x slower than
//     bf16 at batch 64 (kernels/moe/BENCHMARKS.md). TANDEM_MOE_FP8=gemv keeps the GEMVs.
//     From kCutlassDecodeMinTokens (8) tokens on, where the CUTLASS grouped GEMM serves (as the
//     prefill's cutlass below, with 1 x 128 activations or on the scaled form:
//     CutlassDecodeServes), that path instead of
//     the GEMVs or MoeFp8GroupedMma (TANDEM_MOE_FP8_DECODE=cutlass, the default, read at Create;
//     mma keeps the older choice): the same code as the prefill's, capturable (its per-group
//     arguments filled on the device, a fixed workspace from Create, the shared-memory opt-in at
//     Create; CUTLASS's initialize only sets kernel attributes, its workspace init is a no-op);
//   * prefill (more tokens, not capturing), by TANDEM_MOE_FP8_PREFILL (read at Create):
//     - cutlass (the default where it applies: an sm_90 device, CUTLASS built, widths multiples of
//       128; every FP8 scheme: weights with per-row scales over 128-column groups (DeepSeek's /
//       Qwen3's blocks) or over the whole row (per-channel, and per-tensor as the loader holds
//       it), activations in 1 x 128 groups, per token or one static scale): the permuted rows
//       gathered and quantized as the checkpoint says, then ONE grouped GEMM per projection over
//       all experts (kernels/moe/cutlass MoeFp8CutlassGroupedGemm: CUTLASS's sm90 ptr-array grouped
//       GEMM with blockwise scaling, its per-group arguments filled on the device from the expert
//       offsets), MoeSiluAndMul between: no host sync. The weight scales per block where every
//       expert has 128 x 128 block scales (CudaFp8Weight::block_scales): one scale per tile and
//       k step ("fp8-cutlass-grouped-block", the default: 1.09-1.23x the per-row form on an H200,
//       kernels/moe/BENCHMARKS.md); else, or with TANDEM_MOE_FP8_CUTLASS_SCALES=row (read at
//       Create), per row as the loader holds them: 128 scales per tile and k step
//       ("fp8-cutlass-grouped"). Per-channel weights with per-token / per-tensor activations
//       (compressed-tensors' FP8_DYNAMIC, online --quantization=fp8, static checkpoints) take the
//       scaled form by default ("fp8-cutlass-grouped-scaled": no scales in the mainloop, both
//       applied to the fp32 sums in the epilogue; CutlassScaledFormServes); with
//       TANDEM_MOE_FP8_CUTLASS_SCALES=row the row form, their scales broadcast over the
//       128-column groups first in the kernel's argument fill (the same products, each row's
//       scale applied per group);
//     - mma: MoeFp8GroupedMma (as the sync-free steps past their GEMV bound; any FP8 scheme);
//     - per-expert (and cutlass where it does not apply): the expert offsets read back (the
//       layer's one host sync, as the bf16 grouped path), then every expert with rows through
//       CudaFp8Linear (cuda_fp8_linear.h: cuBLASLt's FP8 GEMM per token x per channel or 1 x 128
//       x 128 x 128 blocks, its GEMV for <= 16 rows) — one GEMM per expert and projection.
//   * the shared experts: CudaFp8Linear on the T tokens.
// Each expert has its own device allocation (CudaFp8Weight, what CudaFp8Linear takes); the
// GEMVs find them through device tables of the experts' code and scale pointers. Under expert
// parallelism the rank's experts come first and the last slot is an all-zero expert (the rows of
// other ranks' experts, weight 0: kernels/moe/moe_ep_cuda.h).
// Numerics are cpu::Fp8Linear's per expert (kernels/moe FusedMoe's FP8 experts), with bf16
// activations between the steps as the bf16 CUDA layer has.
//
// Thread safety: CudaFp8MoeExperts reuses its scratch; one caller (the model's stream).
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_fp8_cuda.h"
#include "kernels/moe/moe_gemm_cuda.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

// One layer's FP8 experts on the device (the rank's; E = the experts in the device buffers).
struct CudaFp8MoeWeights {
  std::vector<CudaFp8Weight> gate_up;  // [E] of [2 * Ie, H]: gate rows, then up rows
  std::vector<CudaFp8Weight> down;     // [E] of [H, Ie]
  // Device tables [E] of the experts' codes / scales pointers (the GEMVs' MoeFp8Experts).
  DeviceBuffer gate_up_codes, gate_up_scales, down_codes, down_scales;
  // Device tables [E] of the experts' block_scales pointers ([ceil(n / 128),
  // Block128WeightScaleLd(k)] each: the CUTLASS prefill's block form); empty unless every expert
  // of the projection has them (128 x 128 blocks with 1 x 128 activations; the zero expert of
  // expert parallelism gets zero ones).
  DeviceBuffer gate_up_block_scales, down_block_scales;
  CudaFp8Weight shared_gate_up, shared_down;  // [2 * Is, H], [H, Is]; empty without
  int64_t bytes() const;
};

// Rows [first, first + count) of a host FP8 weight with per-row scales (the loader's form), as a
// weight of its own (copies). REQUIRES: the rows exist.
Fp8LinearWeight Fp8Rows(const Fp8LinearWeight& all, int64_t first, int64_t count);

// Uploads `layer`'s FP8 experts (experts_*_fp8, and shared_*_fp8 when present; each host copy
// freed once uploaded) for the rank's `config`: E = config.num_experts, or under expert
// parallelism the held experts + 1 zero expert. max_tokens: the static activation scale vector's
// length (kStaticTensor; CudaFp8Linear reads one per row). INVALID_ARGUMENT naming the tensor when
// a shape disagrees with `config`, or a width the kernels cannot take (multiples of 16).
absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> UploadFp8MoeWeights(const ModelConfig& config,
                                                                       LayerWeights* layer,
                                                                       int64_t max_tokens);

// Device dummy weights (--load_format=dummy of an FP8 config): the rank's experts of `config`
// allocated as UploadFp8MoeWeights would hold them (E experts, or the held ones + 1 zero expert
// under expert parallelism; the shared experts when the config has them), with the grid and
// activation scheme config.quantization gives a weight quantized at load (Fp8QuantizedGrid),
// zero-filled; FillFp8MoeDummy then draws each fill of the plan into them.
absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> AllocateFp8MoeWeights(const ModelConfig& config,
                                                                         int64_t max_tokens);

// Draws `fill` (a kExpertsGateUp / kExpertsDown / kSharedGateUp / kSharedDown fill of
// DummyWeightPlan: whole rows of one expert's weight, at its offset in the stacked layout) into
// `w`, quantized on the device as QuantizeWeightsFp8 quantizes the host draw (FillFp8Dummy; the
// fp32 draw in `staging`, grown as needed). INVALID_ARGUMENT for another slot or a fill that is
// not whole rows of one expert.
absl::Status FillFp8MoeDummy(const DummyTensorFill& fill, uint64_t seed, DeviceBuffer* staging,
                             CudaFp8MoeWeights* w, cudaStream_t stream);

class CudaFp8MoeExperts {
 public:
  // Steps of at most this many tokens take the GEMVs (CudaMoeMlp::kSyncFreeMaxTokens).
  static constexpr int64_t kGemvMaxTokens = 256;
  // Sync-free steps of at least this many tokens take the CUTLASS grouped GEMM where it serves and
  // decode() is kCutlass (before the GEMVs' and the MMA's bounds), else the GEMVs / the MMA as
  // before. The default of cutlass_decode_min_tokens() (TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS=N at
  // Create sets it, an A/B). Measured on an H200 (kernels/moe/BENCHMARKS.md, eighteenth session,
  // decode steps at 1k context): Qwen3-30B-A3B-FP8 at 2 / 4 / 8 / 16 / 32 / 64 requests
  // +14% / +4% / -8% / -25% / -15% / -15% against the GEMVs / MMA, DeepSeek-V2-Lite-FP8 +13% / +6%
  // / -5% / -12% / -13% / -13%: from 8 tokens on.
  static constexpr int64_t kCutlassDecodeMinTokens = 8;
  // Scratch for steps of up to max_tokens tokens of `config` (the rank's).
  static absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> Create(const ModelConfig& config,
                                                                   int64_t max_tokens);

  // The routed experts of T tokens x [T, H] (bf16) under the permutation `perm` of rows = T * k
  // routing pairs over `num_experts` device experts, into expert_out [rows, H] (rows in the
  // permutation's order), using act [rows, Ie], gate_up [rows, 2 * Ie] and, on the per-expert
  // path, rows_in [rows, H] as scratch. `grouped` reads the offsets back (prefill path); pass null
  // for the sync-free steps (as under capture). pdl: the GEMVs launched with PDL.
  absl::Status Routed(const CudaFp8MoeWeights& w, const __nv_bfloat16* x, int64_t num_tokens,
                      const kernels::cuda::DeviceMoePermutation& perm, int64_t num_experts,
                      __nv_bfloat16* rows_in, __nv_bfloat16* gate_up, __nv_bfloat16* act,
                      __nv_bfloat16* expert_out, kernels::cuda::MoeGroupedGemm* grouped,
                      cudaStream_t stream, bool pdl);

  // out [T, H] = down(SiLU(gate) * up) of the shared experts on x [T, H]; gate_up [T, 2 * Is] and
  // act [T, Is] scratch.
  absl::Status Shared(const CudaFp8MoeWeights& w, const __nv_bfloat16* x, int64_t num_tokens,
                      __nv_bfloat16* gate_up, __nv_bfloat16* act, __nv_bfloat16* out,
                      cudaStream_t stream);

  // The path the last Routed call took: "fp8-expert-w8a16-gemv" (WeightOnly), "fp8-expert-gemv",
  // "fp8-grouped-mma", "fp8-cutlass-grouped", "fp8-cutlass-grouped-block",
  // "fp8-cutlass-grouped-block-swapped", "fp8-cutlass-grouped-scaled",
  // "fp8-cutlass-grouped-swapped" (prefill, or sync-free
  // steps from kCutlassDecodeMinTokens) or "fp8-per-expert-gemm".
  const char* last_path() const { return last_path_; }
  // Batch 1 (one token) of experts with per-128-column weight scales (DeepSeek's / Qwen3's FP8
  // checkpoints) weight-only: the expert GEMVs read x and act as bf16 values (scheme kNone, which
  // kernels/moe/moe_fp8_cuda.h's GEMVs take with any weight scales), no QuantizeActivations before
  // gate_up and down; the shared experts likewise (CudaFp8Linear::set_w8a16_gemv). Numerics:
  // cpu::Fp8Linear with scheme kNone. Create: on unless TANDEM_FP8_W16_GEMV=0.
  void set_w8a16_gemv(bool on);
  bool w8a16_gemv() const { return w8a16_gemv_; }
  // Whether sync-free steps past max(4, E / k) tokens with FP8 activations take MoeFp8GroupedMma
  // (Create: true unless TANDEM_MOE_FP8=gemv).
  void set_grouped_mma(bool on) { grouped_mma_ = on; }
  bool grouped_mma() const { return grouped_mma_; }
  // The prefill steps' kernels (TANDEM_MOE_FP8_PREFILL=cutlass|mma|per-expert at Create; default
  // kCutlass). kCutlass runs where CutlassPrefillServes, else the per-expert loop.
  enum class Prefill { kCutlass, kMma, kPerExpert };
  void set_prefill(Prefill p) { prefill_ = p; }
  Prefill prefill() const { return prefill_; }
  // The sync-free steps' grouped kernel past the GEMV bound (TANDEM_MOE_FP8_DECODE=cutlass|mma at
  // Create; default kCutlass): kCutlass from kCutlassDecodeMinTokens tokens where
  // CutlassDecodeServes, else (and kMma) MoeFp8GroupedMma.
  enum class Decode { kCutlass, kMma };
  void set_decode(Decode d) { decode_ = d; }
  Decode decode() const { return decode_; }
  void set_cutlass_decode_min_tokens(int64_t n) { cutlass_decode_min_tokens_ = n; }
  int64_t cutlass_decode_min_tokens() const { return cutlass_decode_min_tokens_; }
  // Whether prefill steps on `w` can take the CUTLASS grouped GEMM (built, an sm_90 device, its
  // workspace allocated at Create, per-row weight scales over 128-column groups or the whole row,
  // FP8 activations of any scheme (the broadcast scratch allocated at Create for the config's), k
  // of both projections multiples of 128, n multiples of 8, scratch for `rows` quantized rows).
  bool CutlassPrefillServes(const CudaFp8MoeWeights& w, int64_t rows) const;
  // Whether sync-free steps (decode) take it: CutlassPrefillServes with 1 x 128 activations, or
  // where CutlassScaledFormServes (per-token / static activations on the scaled form: on an H200,
  // Qwen3-30B-A3B online FP8, steps of 8 / 16 / 32 / 64 / 128 requests -2 / -20 / -10 / -10 / -10%
  // against MoeFp8GroupedMma, kernels/moe/BENCHMARKS.md, twentieth session). Their broadcast row
  // form (TANDEM_MOE_FP8_CUTLASS_SCALES=row) keeps MoeFp8GroupedMma: it measured +13% at 8
  // requests, -10% at 16, +1-2% at 32-64 (nineteenth session).
  bool CutlassDecodeServes(const CudaFp8MoeWeights& w, int64_t rows) const;
  // How the CUTLASS prefill reads the weight scales (TANDEM_MOE_FP8_CUTLASS_SCALES=row|block at
  // Create, default kDefaultCutlassScales): kRow the per-row scales (ScaleGranularityN 1, any
  // 128-column-grouped weight; per-channel ones broadcast over the groups), kBlock the block
  // scales (ScaleGranularityN 128) where CutlassBlockScalesServe, the scaled form where
  // CutlassScaledFormServes, else kRow.
  enum class CutlassScales { kRow, kBlock };
  static constexpr CutlassScales kDefaultCutlassScales = CutlassScales::kBlock;
  void set_cutlass_scales(CutlassScales s) { cutlass_scales_ = s; }
  CutlassScales cutlass_scales() const { return cutlass_scales_; }
  // Whether the CUTLASS prefill on `w` (where CutlassPrefillServes) takes the block form: kBlock,
  // every expert's block scales present (the tables), the workspace sized for it at Create.
  bool CutlassBlockScalesServe(const CudaFp8MoeWeights& w) const;
  // Whether it takes the scaled form (kernels/moe/cutlass: scales in the epilogue): not kRow,
  // per-channel weight scales on both projections, per-token or static activation scales.
  bool CutlassScaledFormServes(const CudaFp8MoeWeights& w) const;
  // Whether the scaled or the block form runs with its operands swapped (kernels/moe/cutlass
  // swap_ab: the weight as the 128-row operand, the rows in 32-wide tiles): where it serves (the
  // block form with 1 x 128 activations) and the call's rows average at most cutlass_swap_rows()
  // an expert (TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS=N at Create; 0: never).
  bool CutlassSwapServes(const CudaFp8MoeWeights& w, int64_t rows, int64_t E) const;
  // Measured on an H200 (kernels/moe/BENCHMARKS.md, twentieth session): swapped -11 to -15% at
  // <= 16 rows an expert (Qwen3-30B-A3B, DeepSeek-V3 experts), even at 32, slower from 64.
  static constexpr int64_t kCutlassSwapRows = 16;
  void set_cutlass_swap_rows(int64_t n) { cutlass_swap_rows_ = n; }
  int64_t cutlass_swap_rows() const { return cutlass_swap_rows_; }
  // The CUTLASS path's last_path() name for `w` and a call of `rows` over E experts.
  const char* CutlassPath(const CudaFp8MoeWeights& w, int64_t rows, int64_t E) const;

 private:
  CudaFp8MoeExperts(const ModelConfig& config, int64_t max_tokens)
      : config_(config), max_tokens_(max_tokens) {}
  absl::Status Gemvs(const CudaFp8MoeWeights& w, const __nv_bfloat16* x, int64_t num_tokens,
                     const kernels::cuda::DeviceMoePermutation& perm, int64_t num_experts,
                     __nv_bfloat16* act, __nv_bfloat16* expert_out, cudaStream_t stream, bool pdl);
  // MoeFp8GroupedMma for gate_up (into gate_up [rows, 2 * Ie]), SiLU * up, and down.
  absl::Status Mma(const CudaFp8MoeWeights& w, const __nv_bfloat16* x, int64_t num_tokens,
                   const kernels::cuda::DeviceMoePermutation& perm, int64_t num_experts,
                   __nv_bfloat16* gate_up, __nv_bfloat16* act, __nv_bfloat16* expert_out,
                   cudaStream_t stream);
  // TANDEM_MOE_FP8_PREFILL into prefill_, TANDEM_MOE_FP8_CUTLASS_SCALES into cutlass_scales_,
  // TANDEM_MOE_FP8_DECODE into decode_, TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS into
  // cutlass_decode_min_tokens_ (INVALID_ARGUMENT for an unknown value or a count < 1).
  absl::Status ReadPrefillEnv();
  // Where prefill_ or decode_ is kCutlass, CUTLASS is built, the device is sm_90 and the
  // checkpoint's activations are 1 x 128 groups: the kernel's opt-in and cutlass_workspace_.
  absl::Status AllocateCutlass();
  // The CUTLASS grouped GEMM (prefill, and sync-free steps from kCutlassDecodeMinTokens): x
  // quantized per token, its codes gathered (kernels/moe MoeGatherFp8Rows), gate_up, SiLU * up
  // quantized in one pass (MoeSiluAndMulQuantFp8), down; no host sync, capturable.
  absl::Status CutlassGrouped(const CudaFp8MoeWeights& w, const __nv_bfloat16* x,
                              int64_t num_tokens, const kernels::cuda::DeviceMoePermutation& perm,
                              int64_t num_experts, __nv_bfloat16* gate_up, __nv_bfloat16* act,
                              __nv_bfloat16* expert_out, cudaStream_t stream);
  // Prefill one GEMM per expert (the offsets read back through `grouped`).
  absl::Status PerExpert(const CudaFp8MoeWeights& w, const __nv_bfloat16* x, int64_t num_tokens,
                         const kernels::cuda::DeviceMoePermutation& perm, int64_t num_experts,
                         __nv_bfloat16* rows_in, __nv_bfloat16* gate_up, __nv_bfloat16* act,
                         __nv_bfloat16* expert_out, kernels::cuda::MoeGroupedGemm* grouped,
                         cudaStream_t stream);
  // Whether a step of num_tokens runs the routed experts weight-only (set_w8a16_gemv).
  bool WeightOnly(const CudaFp8MoeWeights& w, int64_t num_tokens) const;
  // The activations of one projection as `like`'s scheme says: bf16, or codes + scales (bf16
  // whatever the scheme when weight_only).
  absl::StatusOr<kernels::cuda::MoeFp8Activations> Input(const __nv_bfloat16* values, int64_t m,
                                                         int64_t k, const CudaFp8Weight& like,
                                                         cudaStream_t stream,
                                                         bool weight_only = false);

  const ModelConfig config_;
  const int64_t max_tokens_;
  const char* last_path_ = "";
  bool grouped_mma_ = true;
  bool w8a16_gemv_ = true;
  Prefill prefill_ = Prefill::kCutlass;
  Decode decode_ = Decode::kCutlass;
  int64_t cutlass_decode_min_tokens_ = kCutlassDecodeMinTokens;
  CutlassScales cutlass_scales_ = kDefaultCutlassScales;
  int64_t cutlass_swap_rows_ = kCutlassSwapRows;
  bool cutlass_block_ = false;  // cutlass_workspace_ holds the block form's too
  std::unique_ptr<CudaFp8Linear> linear_;
  // Activation codes: [max(T * H, T * k * Ie, T * k * H)] (the last: the CUTLASS prefill's
  // gathered rows, quantized per row); scales for as many rows in 1 x 128 groups.
  DeviceBuffer codes_;
  DeviceBuffer scales_;
  // The CUTLASS grouped GEMM's workspace for num_experts + 1 groups, either form (empty where it
  // is not built or the device is not sm_90).
  DeviceBuffer cutlass_workspace_;
  // Its broadcast scales (kc::MoeFp8CutlassGroupedArgs): per-token / per-tensor activation scales
  // over [rows, max(H, Ie) / 128] (allocated unless the activations are 1 x 128 groups), and
  // per-channel weight scales over [num_experts + 1, n, k / 128] of the larger projection
  // (unless the config's weights are 128-column blocks).
  DeviceBuffer a_scales_wide_;
  DeviceBuffer w_scales_wide_;
  // x [max_tokens, H] quantized once per token before the CUTLASS path's gather (codes, scales).
  DeviceBuffer x_codes_;
  DeviceBuffer x_scales_;
  int64_t cutlass_experts_ = 0;  // the groups cutlass_workspace_ holds
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MOE_FP8_H_
