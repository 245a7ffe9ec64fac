// The engine's view of a backend: something that runs one scheduled step on a KV pool it owns
// (or was given) and returns sampled tokens. The CPU backend (ModelRunner) and the CUDA backend
// (runtime/cuda: CudaModelRunner) implement it; the engine and scheduler are shared.
//
// Thread safety: executors are not thread-safe; the engine calls them from its step loop.
#ifndef TANDEM_RUNTIME_ENGINE_MODEL_EXECUTOR_H_
#define TANDEM_RUNTIME_ENGINE_MODEL_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

struct RunnerOutput {
  std::vector<int32_t> sampled_tokens;                 // [num seqs]; -1 where not sampling
  std::vector<std::vector<float>> last_prompt_logits;  // [num seqs]; filled where captured
  // [num seqs]; for a sequence with num_draft_tokens = K > 0: the K samples at the positions of
  // its last token and its first K - 1 drafts (sampled_tokens holds the one after the last draft).
  std::vector<std::vector<int32_t>> draft_samples;
  // [num seqs]; for a sequence with return_verify_logits: its num_draft_tokens + 1 sampled rows of
  // logits, [K + 1][vocab]. Empty where not asked or where the backend does not return them (the
  // engine then verifies by the samples above, which is exact too, with lower acceptance).
  std::vector<std::vector<float>> verify_logits;
  // [num_batched_tokens, hidden] when the batch asks (SchedulerOutput::return_hidden_states): the
  // model's final hidden state of every fed token, in batch order (MTP drafting, mtp_proposer.h);
  // [num seqs, hidden] with SchedulerOutput::return_last_hidden_only.
  std::vector<float> hidden_states;
};

// The MTP layer's input hidden states (SchedulerOutput::input_hidden) over a step's fed tokens,
// in token order: runs of zero rows (ScheduledSeq::zero_hidden_rows) and runs of given rows
// (input_hidden's rows from src_row on), adjacent runs of a kind merged. Executors that take
// input hidden states fill their [num_batched_tokens, hidden] rows from these.
struct HiddenRowRun {
  int64_t dst_row = 0;  // the step's token row
  int64_t src_row = 0;  // input_hidden's row (given rows only)
  int64_t rows = 0;
  bool zero = false;
};
// INVALID_ARGUMENT when input_hidden does not hold exactly the rows that are not zero, or a
// sequence has more zero rows than fed tokens.
absl::StatusOr<std::vector<HiddenRowRun>> InputHiddenRuns(const SchedulerOutput& batch,
                                                          int64_t hidden);
// The token rows whose hidden states a step returns with return_last_hidden_only: each sequence's
// last fed token, in sequence order (-1 for a sequence that feeds nothing).
std::vector<int64_t> LastTokenRows(const SchedulerOutput& batch);

// Counters for tests and benchmarks (backends fill what applies).
struct ExecutorStats {
  int64_t graph_steps = 0;   // steps replayed from a CUDA graph
  int64_t padded_steps = 0;  // decode steps run padded to a graph batch size (graph or eager)
  int64_t eager_steps = 0;   // other steps
  int64_t graphs_captured = 0;
  // Host time spent inside the graph launch calls of graph_steps (cudaGraphLaunch), summed: the
  // GPU idles through most of it between two decode steps (runtime/cuda/BENCHMARKS.md).
  int64_t graph_launch_ns = 0;
  // Decode-kernel steps whose KV splits were merged inside the decode kernel (CUDA:
  // CudaBackendConfig::decode_merge_in_kernel; graph replays included).
  int64_t split_merge_in_kernel_steps = 0;
  // Decode-kernel steps whose KV splits were merged through a thread-block cluster (CUDA:
  // CudaBackendConfig::decode_cluster_merge; graph replays included).
  int64_t split_merge_cluster_steps = 0;
  // Steps whose residual adds + RMSNorms ran inside the GEMVs (CUDA: CudaBackendConfig::
  // fold_norm; graph replays included).
  int64_t folded_norm_steps = 0;
  // Of those, steps whose qkv GEMVs also applied RoPE and wrote the KV pool (CUDA:
  // CudaBackendConfig::fold_rope).
  int64_t folded_rope_steps = 0;
  // Prefill-kernel steps over an FP8 K / V pool that widened it for the wgmma kernel (CUDA:
  // CudaBackendConfig::prefill_fp8_widen_max_bytes).
  int64_t widened_fp8_prefill_steps = 0;
  // Mixture-of-experts models: tokens routed to each expert ([num_experts], global ids), summed
  // over the MoE layers and steps (one per token and chosen expert); empty for dense models and
  // backends that do not count.
  std::vector<uint64_t> moe_expert_tokens;
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  // Runs the model over the step's new tokens (writing their K/V into the pool) and samples
  // where batch.seqs[i].samples.
  virtual absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) = 0;

  // Async scheduling (EngineConfig::async_scheduling): Launch starts a step, Collect returns the
  // oldest launched step's output; the engine launches step s + 1 before it collects step s, so
  // at most two are outstanding. A sequence with input_from_prev_seq >= 0 feeds the token that
  // the previously launched step sampled for that sequence. The default runs the step inside
  // Launch (substituting those tokens on the host): exact, without overlap. A backend that
  // overrides them returns from Launch before the step ends and feeds the tokens on the device.
  virtual absl::Status Launch(const SchedulerOutput& batch);
  virtual absl::StatusOr<RunnerOutput> Collect();

  // The KV pool (block-major [blocks][layers][2][block_size][kv_heads][head_dim]), for
  // registering with a transfer agent; device memory when pool_on_device().
  virtual void* kv_pool_data() = 0;
  virtual int64_t kv_pool_bytes() const = 0;
  virtual bool pool_on_device() const { return false; }
  virtual ExecutorStats stats() const { return {}; }
  // OK while the executor can run steps; a worker group's broken process group otherwise (the
  // worker then reports NOT_SERVING). Thread-safe.
  virtual absl::Status health() const { return absl::OkStatus(); }

 private:
  std::deque<RunnerOutput> launched_;  // the default Launch's outputs, oldest first
  std::vector<int32_t> last_sampled_;  // the newest launched step's sampled tokens
};

// Everything a backend needs to build its executor. `kv_pool` is memory for the pool from the
// engine's KvPoolAllocator (kv_pool_bytes of it, see ExecutorFactory::kv_dtype), or null:
// the executor allocates it.
struct ExecutorSpec {
  ModelConfig model_config;
  int64_t num_blocks = 0;  // this rank's pool (one DCP shard's)
  int64_t block_size = 0;
  void* kv_pool = nullptr;
  // The scheduler's bounds (EngineConfig), so a backend can size buffers once.
  int64_t max_num_batched_tokens = 0;
  int64_t max_num_seqs = 0;
  int64_t max_model_len = 0;
  // Speculative decoding's K (0: off): a step samples up to max_num_seqs * (K + 1) rows.
  int64_t num_speculative_tokens = 0;
};

// A backend: the size of one KV element (so the engine can turn a byte budget into blocks) and
// how to build an executor. Made by CpuExecutorFactory (runtime/engine/model_runner.h) or
// CudaExecutorFactory (runtime/cuda/cuda_model_runner.h).
struct ExecutorFactory {
  std::string name = "cpu";
  // The element type of the KV pool this backend keeps (fp32 on the CPU; the activation dtype
  // on CUDA). The engine turns a byte budget into blocks with it; the worker's transfer
  // compatibility names it.
  KvDtype kv_dtype = KvDtype::kF32;
  int64_t kv_elem_bytes() const { return KvDtypeBytes(kv_dtype); }
  // The KvPoolAllocator may provide the pool only for host-memory backends.
  bool accepts_external_pool = true;
  // The executor samples every draft position of a verify pass (ScheduledSeq::num_draft_tokens,
  // RunnerOutput::draft_samples); the engine refuses speculative decoding on backends without.
  bool verifies_drafts = false;
  // Decode context parallelism (runtime/kv_cache/dcp_blocks.h): the executor's group keeps each
  // request's KV in dcp_size shards, tokens dealt in units of dcp_interleave (0 = the block size).
  // The engine then books blocks per shard; ExecutorSpec::num_blocks is one shard's pool.
  int64_t dcp_size = 1;
  int64_t dcp_interleave = 0;
  // Data-parallel attention (dp_attention_executor.h): the group's dp_size ranks each keep their
  // own requests' KV; the engine then books blocks per DP rank (KvCacheConfig::dp_size) and
  // ExecutorSpec::num_blocks is one rank's pool.
  int64_t dp_size = 1;
  std::function<absl::StatusOr<std::unique_ptr<ModelExecutor>>(const ExecutorSpec& spec,
                                                               ModelWeights weights)>
      create;
  // Used when EngineConfig::kv_cache_bytes is 0: the backend's own budget (e.g. a fraction of
  // free GPU memory after the weights). Null: a budget of 0 is an error.
  std::function<absl::StatusOr<int64_t>(const ModelConfig&)> default_kv_cache_bytes;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_MODEL_EXECUTOR_H_
