// Picks the engine's backend from command-line style options: "cpu" (always built) or "cuda"
// (built when the CUDA toolkit was found; otherwise a clear UNIMPLEMENTED error).
// Shared by //runtime:generate and //runtime:tandem_worker.
#ifndef TANDEM_RUNTIME_ENGINE_BACKEND_FACTORY_H_
#define TANDEM_RUNTIME_ENGINE_BACKEND_FACTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "runtime/engine/model_executor.h"
#include "runtime/engine/mtp_proposer.h"
#include "runtime/model/model_source.h"

namespace tandem::runtime {

struct BackendOptions {
  std::string backend = "cpu";  // "cpu" | "cuda"
  int num_threads = 2;          // cpu
  int device = 0;               // cuda: device ordinal
  std::string dtype = "auto";   // cuda: "bf16", "fp16", or "auto" (fp16 for f16 checkpoints,
                                // else bf16)
  double gpu_memory_utilization = 0.9;  // cuda, with kv_cache_bytes = 0
  bool cuda_graphs = true;              // cuda
  // cuda: speculative verify passes padded to graph sizes and captured (with cuda_graphs);
  // false: run eagerly and unpadded (CudaBackendConfig::verify_graphs).
  bool cuda_verify_graphs = true;
  // cuda: the kernel of steps with >= 16-token query runs: "auto" (Hopper wgmma where the GPU
  // and head_dim allow, else mma.sync), "mma" (always the mma.sync kernel), "decode" (no
  // prefill kernel: the split-KV decode kernel serves every step; slow, for comparisons).
  std::string prefill_kernel = "auto";
  // "auto" (the backend's KV dtype: f32 on the CPU, the activation dtype on CUDA) or "fp8"
  // (kv_layout.h: a DeepSeek MLA latent in e4m3 with one scale per token and layer, or other
  // models' K / V in e4m3 with one scale per layer's K or V; CUDA: head_dim 64 / 128).
  std::string kv_cache_dtype = "auto";
  std::optional<uint64_t> dummy_seed;       // cuda: generate dummy weights on the device
  std::vector<DummyTensorFill> dummy_plan;  // cuda, with a group: the rank's slices to draw
  // cuda: a dense 16/32-bit checkpoint (--model=DIR, no --quantization) is read straight into
  // device memory, each rank its part (runtime/cuda/checkpoint_upload.h; no fp32 host copy);
  // false: through fp32 host weights (comparisons). MoE, MLA and FP8 models load through the host.
  bool checkpoint_on_device = true;
  std::optional<CheckpointSource> checkpoint;  // cuda: set by LoadModelForBackend
  // The rank's tensor-parallel group (runtime/parallel), or null for a worker of one rank. The
  // model is loaded as that rank's shard and computes with the group.
  comm::ProcessGroup* group = nullptr;
  // cuda, with a group: its device collectives, "nccl" or "gloo" (host-staged; ranks sharing a
  // GPU), and their deadline.
  std::string tp_comm = "nccl";
  // Decode context parallelism over the group (runtime/model/tensor_parallel.h): KV shards per
  // attention slice (divides the group's size) and tokens per unit (0: the block size).
  int dcp_size = 1;
  int64_t dcp_interleave = 0;
  // Expert parallelism over the group's ranks (runtime/model/tensor_parallel.h): the model is
  // loaded with each rank's experts whole. A group of one holds every expert either way.
  bool expert_parallel = false;
  // Data-parallel attention with expert parallelism (tensor_parallel.h, "Wide expert
  // parallelism"; dp_attention_executor.h): needs expert_parallel; CPU, and CUDA for the
  // Llama-family MoE models (runtime/cuda/cuda_moe_all_to_all.h).
  bool dp_attention = false;
  absl::Duration comm_timeout = absl::Seconds(30);
};

// True when this binary was built with the CUDA backend.
bool CudaBackendAvailable();

// INVALID_ARGUMENT for an unknown backend, dtype or prefill kernel; UNIMPLEMENTED for "cuda" in a
// CPU-only build.
// `model` picks the "auto" dtype.
absl::StatusOr<ExecutorFactory> MakeExecutorFactory(const BackendOptions& options,
                                                    const ModelConfig& model);

// --speculative_method=mtp: the executor of the target `model`'s MTP layer on `options`' backend,
// in this process on one device (a group's rank 0; options' group, DCP and device dummy weights do
// not apply): the CPU's MtpModel (CpuMtpExecutorFactory), or on "cuda" CudaModelRunner::CreateMtp
// on options.device with the target's activation dtype and graphs. MakeExecutorFactory's errors.
absl::StatusOr<MtpExecutorFactory> MakeMtpExecutorFactory(BackendOptions options,
                                                          const ModelConfig& model);

// The model and the backend that will run it, as the binaries load them: with --backend=cuda
// and --load_format=dummy the weights are generated on the device (the host loads the config
// only; a tensor-parallel rank draws its slices only); with --backend=cuda and a dense 16/32-bit
// checkpoint (options.checkpoint_on_device) each rank reads its part into device memory. Errors of
// LoadModel and MakeExecutorFactory.
struct BackendModel {
  LoadedModel model;
  ExecutorFactory factory;
};
absl::StatusOr<BackendModel> LoadModelForBackend(ModelSource source, BackendOptions options);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_BACKEND_FACTORY_H_
