#include "runtime/engine/backend_factory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/engine/dp_attention_executor.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/model_runner.h"
#if defined(TANDEM_WITH_CUDA)
#include "runtime/cuda/cuda_model_runner.h"
#endif

namespace tandem::runtime {

bool CudaBackendAvailable() {
#if defined(TANDEM_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

// --kv_cache_dtype=fp8 (kv_layout.h): a DeepSeek MLA latent pool in e4m3 with row scales, or a
// GQA model's K / V pool in e4m3 with one scale per tensor, on either backend (the CUDA prefill
// kernels read FP8 K / V of head_dim 64 and 128 only; the CPU attention any head_dim).
absl::Status CheckFp8Kv(const BackendOptions& options, const ModelConfig& model) {
  if (!model.IsMla()) {
    if (options.backend == "cuda" && model.head_dim != 64 && model.head_dim != 128) {
      return absl::UnimplementedError(
          absl::StrCat("--kv_cache_dtype=", options.kv_cache_dtype, ": the CUDA FP8 K / V pool ",
                       "takes head_dim 64 or 128; ", model.architecture, " has ", model.head_dim,
                       " (use --kv_cache_dtype=auto)"));
    }
    return absl::OkStatus();
  }
  // A tensor-parallel group keeps the whole latent on every rank (each rank quantizes the same
  // rows), DCP splits its tokens; both as over a 16-bit / f32 latent, on either backend (CPU:
  // mla_fp8_kv_parallel_test; CUDA: tests/gpu/mla_fp8_cuda_golden.sh). Data-parallel attention
  // keeps each request's latent, codes and row scales inside the same blocks, in its DP rank's
  // own pool (the DP executor hands the runner local block ids of that pool; a row's codes and
  // scale depend on its token alone), on either backend (CPU: mla_fp8_kv_parallel_test; CUDA,
  // decode padding and graph replays over the FP8 pool: mla_fp8_cuda_golden.sh fp8-tp2-ep-dp).
  return absl::OkStatus();
}

#if defined(TANDEM_WITH_CUDA)
// The device, dtype, graph and kernel choices of `options` (no group, DCP or dummy weights).
cuda::CudaBackendConfig CudaConfigOf(const BackendOptions& options, const ModelConfig& model) {
  cuda::CudaBackendConfig config;
  config.device = options.device;
  const bool fp16 =
      options.dtype == "fp16" || (options.dtype == "auto" && model.dtype == WeightDtype::kF16);
  config.dtype = fp16 ? cuda::ActDtype::kFp16 : cuda::ActDtype::kBf16;
  config.gpu_memory_utilization = options.gpu_memory_utilization;
  config.enable_cuda_graphs = options.cuda_graphs;
  config.verify_graphs = options.cuda_verify_graphs;
  config.use_prefill_kernel = options.prefill_kernel != "decode";
  config.prefill_allow_wgmma = options.prefill_kernel == "auto";
  return config;
}
#endif

}  // namespace

absl::StatusOr<MtpExecutorFactory> MakeMtpExecutorFactory(BackendOptions options,
                                                          const ModelConfig& model) {
  options.group = nullptr;  // the MTP layer runs in this process alone, from host weights
  options.dcp_size = 1;
  options.dp_attention = false;
  options.dummy_seed.reset();
  options.dummy_plan.clear();
  options.kv_cache_dtype = "auto";  // its own 16-bit latent pool
  RETURN_IF_ERROR(MakeExecutorFactory(options, model).status());
  if (options.backend == "cpu") return CpuMtpExecutorFactory(options.num_threads);
    // An FP8 checkpoint's MTP layer (DeepSeek-V3: the block's projections and experts e4m3 with
    // 128x128 scales, the glue bf16) runs its block through CudaMlaModel's FP8 path, as the
    // target's layers do (cuda_mtp_model.h).
#if defined(TANDEM_WITH_CUDA)
  const cuda::CudaBackendConfig config = CudaConfigOf(options, model);
  return MtpExecutorFactory(
      [config](const ExecutorSpec& spec,
               MtpWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
        ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaModelRunner> runner,
                         cuda::CudaModelRunner::CreateMtp(config, spec, std::move(weights)));
        return std::unique_ptr<ModelExecutor>(std::move(runner));
      });
#else
  return absl::UnimplementedError("--backend=cuda: this binary was built without the CUDA toolkit");
#endif
}

absl::StatusOr<ExecutorFactory> MakeExecutorFactory(const BackendOptions& options,
                                                    const ModelConfig& model) {
  ASSIGN_OR_RETURN(const KvDtype kv, ParseKvCacheDtype(options.kv_cache_dtype, KvDtype::kBf16));
  const bool fp8_kv = kv == KvDtype::kFp8E4m3;
  if (fp8_kv) RETURN_IF_ERROR(CheckFp8Kv(options, model));
  if (options.backend == "cpu") {
    if (options.num_threads <= 0) return absl::InvalidArgumentError("num_threads must be > 0");
    ExecutorFactory cpu =
        CpuExecutorFactory(options.num_threads, options.group, options.dcp_size,
                           options.dcp_interleave, fp8_kv ? KvDtype::kFp8E4m3 : KvDtype::kF32);
    if (options.dp_attention && options.group != nullptr && options.group->size() > 1) {
      return DpAttentionExecutorFactory(std::move(cpu), options.group);
    }
    return cpu;
  }
  if (options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu or cuda, got '", options.backend, "'"));
  }
  if (options.dtype != "auto" && options.dtype != "bf16" && options.dtype != "fp16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be auto, bf16 or fp16, got '", options.dtype, "'"));
  }
  if (options.prefill_kernel != "auto" && options.prefill_kernel != "mma" &&
      options.prefill_kernel != "decode") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefill_kernel must be auto, mma or decode, got '", options.prefill_kernel, "'"));
  }
  // DeepSeek multi-head latent attention on CUDA (runtime/cuda/cuda_mla_model.h): one GPU or a
  // tensor-parallel group, dense and MoE layers, DCP (latent token shards, 16-bit or FP8 latent).
  // The CUDA model runs the Llama-family layers (Llama, Qwen2, Mistral, Qwen3's q/k norms) and
  // MoE MLPs of up to kernels::cuda::kMoeMaxExperts (512) experts: refused at startup, before any
  // device work, naming the numbers.
  if (model.IsMoe() && model.num_experts > 512) {
    return absl::UnimplementedError(
        absl::StrCat("--backend=cuda cannot run ", model.architecture, " with ", model.num_experts,
                     " experts (the CUDA MoE kernels take at most 512); use --backend=cpu"));
  }
  // FP8 weights (issue 38; runtime/cuda/cuda_fp8_linear.h): every scheme the loader accepts, with
  // bf16 activations (the FP8 kernels read and write bf16). FP8 MoE experts
  // (runtime/cuda/cuda_moe_fp8.h) and DeepSeek's FP8 MLA projections (cuda_mla_model_fp8.cc) run
  // e4m3 on CUDA from checkpoint weights, on one GPU, a TP / EP (a) group or under --dp_attention
  // (EP (b): each rank's FP8 experts on the rows dispatched to it). Device dummy weights of an
  // FP8 config (--load_format=dummy) are drawn and quantized on the device, the dense
  // projections, DeepSeek's MLA projections and the MoE experts (FillFp8Dummy, FillMoeDummy,
  // CudaMlaModel::FillFp8DummyProjection) as the host quantizes them (128 x 128 configs: one
  // scale per tile, as their checkpoints hold them). The FP8 MTP layer: MakeMtpExecutorFactory.
  const bool fp16_act =
      options.dtype == "fp16" || (options.dtype == "auto" && model.dtype == WeightDtype::kF16);
  if (model.quantization.IsFp8() && fp16_act) {
    return absl::UnimplementedError(
        absl::StrCat("--backend=cuda runs FP8 weights (", model.quantization.Describe(),
                     ") with bf16 activations only; pass --dtype=bf16 or use --backend=cpu"));
  }
#if defined(TANDEM_WITH_CUDA)
  cuda::CudaBackendConfig config = CudaConfigOf(options, model);
  config.dummy_seed = options.dummy_seed;
  config.dummy_plan = options.dummy_plan;
  config.checkpoint = options.checkpoint;
  if (options.group != nullptr && options.group->size() > 1) {
    // The runner builds its device communicator over the group (NCCL or host-staged); graphs
    // stay on where the communicator can be captured.
    config.group = options.group;
    config.tp_comm = options.tp_comm;
    config.comm_timeout = options.comm_timeout;
  }
  // Decode context parallelism over the group (the runner refuses it without one).
  config.dcp_size = options.dcp_size;
  config.dcp_interleave = options.dcp_interleave;
  config.fp8_kv = fp8_kv;
  // Data-parallel attention with expert parallelism on CUDA (runtime/cuda/cuda_moe_all_to_all.h):
  // the Llama-family MoE decoders and DeepSeek's MLA model (each rank its sequences' latent); each
  // rank's runner gets its own DP rank's sequences only.
  if (options.dp_attention && options.group != nullptr && options.group->size() > 1) {
    return DpAttentionExecutorFactory(cuda::CudaExecutorFactory(config), options.group);
  }
  return cuda::CudaExecutorFactory(config);
#else
  (void)model;
  return absl::UnimplementedError(
      "--backend=cuda: this binary was built without the CUDA toolkit (CPU-only build); "
      "rebuild on a machine with CUDA or use --backend=cpu");
#endif
}

absl::StatusOr<BackendModel> LoadModelForBackend(ModelSource source, BackendOptions options) {
  if (options.backend == "cuda" && source.load_format == "dummy") {
    source.dummy_weights_on_backend = true;  // generated on the device, each rank its slices
    options.dummy_seed = source.dummy_seed;
  }
  if (options.group != nullptr) {
    source.shard = TpShard{options.group->rank(), options.group->size(), options.dcp_size};
  }
  source.shard.expert_parallel = options.expert_parallel;
  source.shard.dp_attention = options.dp_attention;
  if (options.backend == "cuda" && options.checkpoint_on_device && source.load_format == "auto" &&
      (source.quantization.empty() || source.quantization == "none") && !source.model_dir.empty()) {
    ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(source.model_dir));
    // CudaLlamaModel reads dense 16/32-bit checkpoints on the device; the others through the host.
    source.checkpoint_on_backend =
        !config.IsMla() && !config.IsMoe() && !config.quantization.IsFp8();
  }
  BackendModel out;
  ASSIGN_OR_RETURN(out.model, LoadModel(source));
  if (source.dummy_weights_on_backend && options.group != nullptr) {
    ASSIGN_OR_RETURN(options.dummy_plan, DummyWeightPlan(out.model.config, source.shard));
  }
  if (source.checkpoint_on_backend) {
    options.checkpoint = CheckpointSource{source.model_dir, out.model.config, source.shard, {}};
  }
  ASSIGN_OR_RETURN(out.factory, MakeExecutorFactory(options, out.model.config));
  return out;
}

}  // namespace tandem::runtime
