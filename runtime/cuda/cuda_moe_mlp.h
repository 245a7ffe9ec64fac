// The mixture-of-experts MLP on the CUDA backend: the device twin of runtime/cpu/moe_mlp.h,
// shared by the decoders that have MoE layers (CudaLlamaModel for Mixtral / Qwen2-MoE /
// Qwen3-MoE; a DeepSeek MLA model for its MoE layers). Per layer:
//   router GEMM (fp32 logits) -> MoeRoute (the config's routing) -> MoePermute (both one
//   MoeRouteAndPermute launch up to kFusedRouteMaxTokens tokens) -> experts:
//     kGemv (T <= max(4, E / k)): expert GEMVs reading only the routed experts' weights (gather
//       and SiLU*up folded in);
//     kPadded (T <= kSyncFreeMaxTokens, every CUDA graph size): rows padded to T per expert,
//       one strided-batched GEMM per projection over all experts (fixed shapes);
//     kGrouped (larger prefill steps, never under capture): gather, one cuBLAS grouped GEMM per
//       projection (one cublasGemmEx per expert when E <= 16), after one read-back of the
//       expert offsets (MoeGroupedGemm::ReadOffsets): the layer's only host sync;
//   -> MoeCombine (weighted, deterministic, + the shared expert, sigmoid-gated for Qwen2-MoE).
// kernels/moe/moe_cuda.h has the kernels and their contracts.
//
// Tensor parallelism: the config is the rank's (LocalModelConfig): every rank holds the same
// slice of every expert's intermediate rows (and of the shared expert's), routes the same
// replicated tokens, and the caller's all-reduce after the MLP sums the slices, as on the CPU.
// Expert parallelism over the TP ranks (config.expert_placement, --enable_expert_parallel): the
// rank's device buffers hold its experts whole plus one all-zero expert; after routing,
// MoeLocalizeRouting (kernels/moe/moe_ep_cuda.h) sends the rows of other ranks' experts to the
// zero expert with weight 0, so the paths below run unchanged and the caller's all-reduce sums
// the ranks' parts. Those rows are still computed (against zeros): EP here saves expert memory,
// not yet expert FLOPs. With data-parallel attention (UseAllToAll) the rows travel instead:
// CudaMoeAllToAll (cuda_moe_all_to_all.h) dispatches each token once per rank holding one of its
// experts, this rank's experts run on the rows received (the same zero-expert routing), and the
// rows come back to be summed.
//
// Thread safety: Forward() reuses scratch; one caller (the model's stream) at a time.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_MOE_MLP_H_
#define TANDEM_RUNTIME_CUDA_CUDA_MOE_MLP_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/device_communicator.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_gemm_cuda.h"
#include "runtime/cuda/cuda_moe_all_to_all.h"
#include "runtime/cuda/cuda_moe_fp8.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

// One MoE layer's device weights (the rank's slices), in the activation dtype unless noted;
// E = num_experts (under expert parallelism in the expert buffers: the rank's experts + 1 zero
// expert), Ie / Is = the (local) expert / shared-expert widths.
struct CudaMoeWeights {
  DeviceBuffer router;              // [E, H]
  DeviceBuffer router_bias;         // [E] fp32 (DeepSeek-V3 e_score_correction_bias) or empty
  DeviceBuffer experts_gate_up;     // [E, 2 * Ie, H]: per expert its gate rows, then up rows
  DeviceBuffer experts_down;        // [E, H, Ie]
  DeviceBuffer shared_gate_up;      // [2 * Is, H] or empty
  DeviceBuffer shared_down;         // [H, Is] or empty
  DeviceBuffer shared_expert_gate;  // [H] or empty (Qwen2-MoE)
  // FP8 checkpoints (cuda_moe_fp8.h): the e4m3 experts (and shared experts when e4m3); the
  // 16-bit expert buffers above are then empty (and the shared ones when `fp8` has them).
  std::unique_ptr<CudaFp8MoeWeights> fp8;
  int64_t bytes() const;
  // Whether the layer has shared experts (16-bit, or e4m3 in `fp8`).
  bool has_shared() const {
    return !shared_down.empty() || (fp8 != nullptr && !fp8->shared_down.empty());
  }
};

// Uploads `layer`'s MoE tensors (fp32 host, each freed once uploaded) converted to T
// (__nv_bfloat16 / __half); the router bias stays fp32. INVALID_ARGUMENT naming the tensor when
// a size disagrees with `config` (the rank's). FP8 experts (layer->experts_*_fp8) stay e4m3
// (UploadFp8MoeWeights; fp8_max_tokens: its static activation scale vectors' length).
template <typename T>
absl::StatusOr<CudaMoeWeights> UploadMoeWeights(const ModelConfig& config, LayerWeights* layer,
                                                cudaStream_t stream, int64_t fp8_max_tokens = 1);
// Zero-filled buffers of `config`'s shapes (2-byte elements), for device dummy weights; an FP8
// config's experts and shared experts e4m3 instead (AllocateFp8MoeWeights, fp8_max_tokens as in
// UploadMoeWeights; the router and Qwen2-MoE's shared-expert gate stay 16-bit).
absl::StatusOr<CudaMoeWeights> AllocateMoeWeights(const ModelConfig& config, cudaStream_t stream,
                                                  int64_t fp8_max_tokens = 1);
// Whether a checkpoint slot lands in CudaMoeWeights.
bool IsMoeSlot(WeightSlot slot);
// Draws `fill` (a MoE slot of DummyWeightPlan) into `w` (T elements; the router bias fp32; e4m3
// experts through FillFp8MoeDummy, their fp32 draw in `fp8_staging`, grown as needed).
template <typename T>
absl::Status FillMoeDummy(const DummyTensorFill& fill, uint64_t seed, CudaMoeWeights* w,
                          DeviceBuffer* fp8_staging, cudaStream_t stream);

// Kernel choices added after the first device measurements (kernels/moe/BENCHMARKS.md):
//   split_combine: MoeCombineSplit (each token over several blocks, 16-byte loads) instead of
//     MoeCombine (one block per token);
//   mma_grouped: for E > 16, every step past the GEMV sizes on MoeGroupedMma (one tensor-core
//     launch per projection over all experts, gather folded in, no offsets read-back, so also
//     under capture) instead of the padded strided-batched GEMM and cuBLAS's grouped call.
//     Mixtral-sized expert counts (E <= 16) keep cuBLAS;
//   fused_route: steps of at most kFusedRouteMaxTokens tokens route and permute in one launch
//     (MoeRouteAndPermute; not under expert parallelism, whose localization sits between them);
//   pdl: the router GEMV, that launch, the expert GEMVs, the one-token shared-expert GEMVs and
//     the split combine are launched with programmatic stream serialization (PDL), so each one's
//     blocks are scheduled while its predecessor finishes (independent of
//     CudaBackendConfig::programmatic_launch);
//   wgmma_grouped: on sm_90, steps of at least kWgmmaMinTokens tokens that would take
//     MoeGroupedMma take MoeGroupedWgmma (the Hopper warpgroup-MMA grouped kernel) instead:
//     Qwen3-30B-A3B's layer 1.12x / 1.28x faster at 1,024 / 8,192 tokens (nvidia-h200,
//     kernels/moe/BENCHMARKS.md; greedy tokens and logits of a Qwen3-30B-A3B-shaped model equal
//     to the old kernels': tests/gpu/moe_wgmma_e2e.sh); not at CUDA graph sizes, where it has
//     not run under capture;
//   fused_glu: on those MoeGroupedWgmma steps, gate_up with SiLU * up in its epilogue
//     (MoeGroupedWgmmaGateUpSilu: bit-identical to MoeGroupedWgmma + MoeSiluAndMul, one launch
//     and the gate_up buffer's round trip less) where the expert width is a multiple of 8.
// The first four are the default since their first GPU runs (nvidia-h200-x2 / -x4: moe_cuda_test,
// and moe_cuda_golden.sh with all four; Qwen3-30B-A3B decode step at batch 1: 5.37 -> 3.89 ms with
// the first two, 3.68 -> 3.59 ms with the last two), wgmma_grouped since its first run.
// FromEnv(): TANDEM_MOE_KERNELS, a comma-separated subset of "split_combine", "mma_grouped",
// "fused_route", "pdl", "wgmma_grouped", "fused_glu" ("new" or unset: all six; "old": none, the
// first A/B baseline), read once per CudaMoeMlp::Create so the device A/B needs no new flag on
// every binary (fused_glu off: the list without it, tests/gpu/moe_fused_glu_call.sh).
// INVALID_ARGUMENT naming an unknown entry.
struct CudaMoeKernels {
  bool split_combine = true;
  bool mma_grouped = true;
  bool fused_route = true;
  bool pdl = true;
  bool wgmma_grouped = true;
  bool fused_glu = true;
  static absl::StatusOr<CudaMoeKernels> FromEnv();
};

class CudaMoeMlp {
 public:
  // Steps of at most this many tokens (every CUDA graph size) take a sync-free path.
  static constexpr int64_t kSyncFreeMaxTokens = 256;
  // Steps of at most this many tokens take MoeRouteAndPermute (CudaMoeKernels::fused_route).
  static constexpr int64_t kFusedRouteMaxTokens = 16;
  // Steps of at least this many tokens take MoeGroupedWgmma (CudaMoeKernels::wgmma_grouped):
  // past every CUDA graph size.
  static constexpr int64_t kWgmmaMinTokens = kSyncFreeMaxTokens + 1;
  enum class Path { kAuto, kGemv, kPadded, kGrouped };

  // Scratch for steps of up to max_tokens tokens; per-expert load counters for every layer.
  // INVALID_ARGUMENT for a config the kernels cannot route (kernels/moe/moe_cuda.h).
  static absl::StatusOr<std::unique_ptr<CudaMoeMlp>> Create(const ModelConfig& config,
                                                            int64_t max_tokens);

  // out[T, H] = the layer's MoE MLP of x[T, H] (normalized hidden states) from this rank's
  // slices; out may alias x. `layer` indexes the load counters. Enqueues on `stream`; the host
  // waits (once) only on the prefill path, never while `stream` is capturing.
  // add_to_out: out is a residual stream (not overlapping x) and gets out = round(out + the MLP's
  // rounded output) (kernels::cuda::MoeCombineAddTo: bit-identical to the MLP into a buffer
  // followed by FusedAddRmsNorm's residual update); UNIMPLEMENTED under UseAllToAll.
  template <typename T>
  absl::Status Forward(const CudaMoeWeights& w, const T* x, int64_t num_tokens, int64_t layer,
                       T* out, kernels::cuda::CublasLtGemm& gemm, cudaStream_t stream,
                       bool add_to_out = false);

  // Tokens routed to each expert of each layer since creation ([num_hidden_layers][E], global
  // expert ids also under expert parallelism; dense layers stay 0). Copies the device counters back
  // (synchronous).
  absl::StatusOr<std::vector<int64_t>> ExpertLoad() const;

  // Data-parallel attention with expert parallelism (config.dp_attention; cuda_moe_all_to_all.h):
  // from now on Forward routes the rank's OWN tokens (T may be 0: an idle rank still joins every
  // layer's collectives), dispatches the rows to their experts' ranks over `comm` (outliving
  // this; its size the placement's), runs this rank's experts on the rows it receives and
  // combines; the shared expert runs locally. Create's max_tokens must then cover the rows
  // received, comm->size() x `rank_max_tokens` (this rank's tokens per step). Never under graph
  // capture (one host sync per layer) unless set_dispatch_capacity. Call once, before the first
  // Forward.
  absl::Status UseAllToAll(comm::DeviceCommunicator* comm, int64_t rank_max_tokens);
  // Under UseAllToAll, a step without tokens on this rank: Forward with T = 0 (every collective,
  // this rank's experts on the rows received) of each MoE layer l of the config, `weights(l)`
  // its weights, in `bf16` or fp16 activations. The decoders' ForwardIdle (CudaLlamaModel,
  // CudaMlaModel). FAILED_PRECONDITION without UseAllToAll.
  absl::Status ForwardIdle(const std::function<const CudaMoeWeights&(int64_t)>& weights, bool bf16,
                           kernels::cuda::CublasLtGemm& gemm, cudaStream_t stream);
  const CudaMoeAllToAll* all_to_all() const { return all_to_all_.get(); }
  // Under UseAllToAll, for every later Forward: 0 (the default) exchanges the uneven splits
  // after one counts read-back per layer; C > 0 the fixed layout of C rows per pair of ranks
  // (CudaMoeAllToAll::Dispatch's capacity; no host sync, so capturable): every rank of the step
  // must set the same C >= its tokens, at most rank_max_tokens.
  void set_dispatch_capacity(int64_t capacity) { dispatch_capacity_ = capacity; }

  // The experts' path for every step (kAuto: by size, as above; kPadded needs T <=
  // kSyncFreeMaxTokens; under graph capture kGrouped falls back to kAuto). For benchmarks.
  void set_path(Path path) { path_ = path; }
  // Kernel choices for every later step (Create takes CudaMoeKernels::FromEnv()). Turning
  // mma_grouped on here before any CUDA graph capture needs kernels::cuda::MoeGroupedMmaInit().
  void set_kernels(const CudaMoeKernels& kernels) { kernels_ = kernels; }
  const CudaMoeKernels& kernels() const { return kernels_; }
  // Steps whose experts ran gate_up through MoeGroupedWgmmaGateUpSilu (CudaMoeKernels::fused_glu)
  // since creation, for tests.
  int64_t fused_glu_steps() const { return fused_glu_steps_; }

 private:
  CudaMoeMlp(const ModelConfig& config, int64_t max_tokens);
  template <typename T>
  absl::Status Experts(const CudaMoeWeights& w, const T* x, int64_t num_tokens,
                       const int32_t** row_map, cudaStream_t stream);
  template <typename T>
  absl::Status GroupedMma(const CudaMoeWeights& w, const T* x, int64_t num_tokens,
                          cudaStream_t stream);
  // Forward under UseAllToAll (cuda_moe_mlp_dispatch.cc).
  template <typename T>
  absl::Status ForwardDispatched(const CudaMoeWeights& w, const T* x, int64_t num_tokens,
                                 int64_t layer, T* out, kernels::cuda::CublasLtGemm& gemm,
                                 cudaStream_t stream);
  template <typename T>
  absl::Status SharedExpert(const CudaMoeWeights& w, const T* x, int64_t num_tokens,
                            kernels::cuda::CublasLtGemm& gemm, cudaStream_t stream);

  const ModelConfig config_;
  const int64_t max_tokens_;
  int64_t experts_ = 0;  // experts in the device buffers (DeviceExperts in the .cc)
  int64_t dispatch_capacity_ = 0;
  int64_t fused_glu_steps_ = 0;
  Path path_ = Path::kAuto;
  CudaMoeKernels kernels_;
  kernels::GroupedRoutingParams routing_;
  std::unique_ptr<kernels::cuda::MoeGroupedGemm> grouped_;
  DeviceBuffer logits_, ids_, weights_, offsets_, active_, token_of_row_, row_of_pair_,
      padded_row_of_pair_;
  DeviceBuffer rows_in_, gate_up_, act_, expert_out_, shared_gate_up_, shared_act_, shared_out_;
  DeviceBuffer load_;            // [num_hidden_layers, E] int64
  DeviceBuffer slot_of_expert_;  // expert parallelism: [E] int32, the local slot or -1
  std::unique_ptr<CudaMoeAllToAll> all_to_all_;  // data-parallel attention only
  std::unique_ptr<CudaFp8MoeExperts> fp8_;       // FP8 checkpoints only
};

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_MOE_MLP_H_
