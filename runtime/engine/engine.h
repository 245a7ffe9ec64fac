// The single-worker engine: one step reads like the architecture diagram,
//
//   batch = scheduler.Schedule(); out = runner.Run(batch); scheduler.Update(batch, out);
//
// Callers add requests (validated here, before anything is allocated), call Step() until
// HasUnfinished() is false, and collect per-request updates (new tokens, finish reasons,
// captured prompt logits).
//
// Thread safety: not thread-safe; one thread drives an engine (the worker daemon wraps it in
// its own loop).
#ifndef TANDEM_RUNTIME_ENGINE_ENGINE_H_
#define TANDEM_RUNTIME_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/model_executor.h"
#include "runtime/engine/mtp_proposer.h"
#include "runtime/engine/request.h"
#include "runtime/engine/scheduler.h"
#include "runtime/engine/speculative.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

struct EngineConfig {
  int64_t block_size = 16;
  // KV pool budget; num_blocks = kv_cache_bytes / bytes per block (all layers' K and V).
  // 0: the backend chooses (ExecutorFactory::default_kv_cache_bytes).
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  // 0 = the model's max_position_embeddings.
  int64_t max_model_len = 0;
  bool enable_prefix_caching = true;
  int num_threads = 2;  // CPU backend threads (when no ExecutorFactory is given)
  // Speculative decoding (speculative.h); off by default. Needs a backend that verifies drafts
  // (ExecutorFactory::verifies_drafts).
  SpeculativeConfig speculative;
  // Async scheduling (vLLM's async_scheduling, SGLang's overlap scheduler): Step() launches step
  // s + 1 before it applies step s's tokens, which step s + 1 feeds on the device (the executor's
  // Launch / Collect), so the host's scheduling overlaps the backend's step. Step() then returns
  // the updates of the step before the one it launched; a stop that only the sampled token shows
  // (EOS, a stop token) is seen one step late: the request's extra step is dropped, its blocks
  // freed once that step ended. Only plain decode steps stay in flight: a step with a prefill
  // chunk, captured prompt logits, or one that might preempt runs synchronously. Ignored (every
  // step synchronous) with speculative decoding or data-parallel attention.
  bool async_scheduling = false;
};

// Provides the KV pool's memory (`bytes`, float-aligned), e.g. from a transfer agent that can
// share it with peers; it must outlive the engine. nullptr: declined, the engine allocates.
// Errors abort Engine::Create.
using KvPoolAllocator = std::function<absl::StatusOr<void*>(int64_t bytes)>;

class Engine {
 public:
  // `kv_pool_allocator` may be null: the backend allocates the pool itself (it is also not
  // called for backends that do not accept external pools). `factory` picks the backend;
  // null: the CPU backend with config.num_threads threads.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineConfig& config, const ModelConfig& model_config, ModelWeights weights,
      const KvPoolAllocator& kv_pool_allocator = {}, const ExecutorFactory* factory = nullptr);

  // INVALID_ARGUMENT for an empty prompt, token ids outside the vocabulary, max_tokens < 1,
  // prompt + max_tokens beyond the model's maximum length or the KV pool, bad sampling
  // parameters; ALREADY_EXISTS for a duplicate id. Nothing is allocated on error.
  absl::Status AddRequest(int64_t request_id, RequestSpec spec);
  // AddRequest's checks alone (all but ALREADY_EXISTS). Thread-safe with a running Step(): it
  // reads only what is fixed before the first request (model, limits, pool size, connector).
  absl::Status ValidateRequest(const RequestSpec& spec) const;

  // Drops a request and frees its blocks; false if it is unknown (or already finished).
  bool Abort(int64_t request_id);

  // Disaggregated serving: routes remote KV through `connector` (must outlive the engine; its
  // agent must have kv_pool_data() registered). Call once, before the first request.
  // Requests with RequestSpec::remote_kv / hold_kv_for_remote need it (INVALID_ARGUMENT without).
  void AttachConnector(kvtransfer::KvConnector* connector);
  // Speculative decoding with a draft model (SpeculativeMethod::kDraft; draft_model.h): the draft
  // model, same vocabulary as the target, run on an executor of `backend` (null: the CPU backend
  // with config.num_threads threads) with a KV cache of as many blocks as the target's. Call once,
  // before the first request; requests are refused (FAILED_PRECONDITION) until it is attached.
  // INVALID_ARGUMENT when the method is not kDraft or DraftModelProposer::Create refuses.
  absl::Status AttachDraftModel(const ModelConfig& draft_config, ModelWeights draft_weights,
                                const ExecutorFactory* backend = nullptr);
  // The attached draft model (null without one), for tests and stats.
  const DraftModelProposer* draft_model() const { return draft_.get(); }
  // Speculative decoding with DeepSeek-V3's MTP layer (SpeculativeMethod::kMtp; mtp_proposer.h),
  // loaded from the target's checkpoint (LoadMtpWeights) for `config`, the whole model's (a
  // tensor-parallel group's engine holds its rank's config), run on an executor of `backend` (null:
  // the CPU backend with config.num_threads threads) with a latent KV cache of as many blocks as
  // the target's. Call once, before the first request; requests are refused (FAILED_PRECONDITION)
  // until it is attached. INVALID_ARGUMENT when the method is not kMtp, under DCP, or when
  // MtpProposer::Create refuses, or when `config`'s hidden size or vocabulary is not the engine's.
  // While attached, a step returns the target's hidden states of the sequences that may draft in
  // the next step (ScheduledSeq::may_draft_next: not during an adaptive pause).
  absl::Status AttachMtp(const ModelConfig& config, MtpWeights weights,
                         const MtpExecutorFactory* backend = nullptr);
  const MtpProposer* mtp() const { return mtp_.get(); }
  // True while the engine has work that needs Step() calls: unfinished requests or KV loads.
  bool HasWork() const;
  // True when Step() runs steps asynchronously (EngineConfig::async_scheduling, where it applies).
  bool async_scheduling() const { return async_; }
  void* kv_pool_data() { return runner_->kv_pool_data(); }
  int64_t kv_pool_bytes() const { return runner_->kv_pool_bytes(); }
  bool kv_pool_on_device() const { return runner_->pool_on_device(); }
  ExecutorStats executor_stats() const { return runner_->stats(); }
  // ModelExecutor::health(): thread-safe, may be read while a step runs.
  absl::Status executor_health() const { return runner_->health(); }
  int64_t kv_block_bytes() const { return block_bytes_; }
  KvDtype kv_dtype() const { return kv_dtype_; }  // the backend's (ExecutorFactory::kv_dtype)
  int64_t block_size() const { return config_.block_size; }
  int64_t num_running() const { return scheduler_->num_running() + scheduler_->num_loading(); }
  int64_t num_waiting() const { return scheduler_->num_waiting(); }
  int64_t num_loading() const { return scheduler_->num_loading(); }
  // Scheduler::TakeQueueTimes / num_kv_recomputes.
  std::vector<absl::Duration> TakeQueueTimes() { return scheduler_->TakeQueueTimes(); }
  uint64_t num_kv_recomputes() const { return scheduler_->num_kv_recomputes(); }
  // Speculative decoding counters (all zero when off).
  const SpecStats& spec_stats() const { return scheduler_->spec_stats(); }
  // Prefix-cache change log (KvCacheManager::EnableCacheEvents / TakeCacheEvents).
  void EnableCacheEvents(bool enable) { scheduler_->mutable_kv_cache().EnableCacheEvents(enable); }
  void TakeCacheEvents(std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
    scheduler_->mutable_kv_cache().TakeCacheEvents(added, removed);
  }
  std::vector<uint64_t> CachedHashesShort() const {
    return scheduler_->kv_cache().CachedHashesShort();
  }

  // Runs one scheduling step. Returns the updates of the requests it advanced.
  absl::StatusOr<std::vector<RequestUpdate>> Step();
  // What the last Step() scheduled (launched, under async scheduling); all zero when it ran no
  // model step.
  const StepShape& last_step() const { return last_step_; }

  // Also true while a launched step's tokens are not yet applied (async scheduling).
  bool HasUnfinished() const { return scheduler_->HasUnfinished() || launched_.has_value(); }
  KvCacheStats kv_cache_stats() const { return scheduler_->kv_cache().Stats(); }
  // Blocks over all DCP shards (the KV-cache manager's id space); each rank's pool holds
  // num_kv_blocks() / dcp().size of them.
  int64_t num_kv_blocks() const { return num_blocks_; }
  const DcpBlockLayout& dcp() const { return dcp_; }
  // Data-parallel attention ranks, each with its own pool of num_kv_blocks() / dp_size() blocks
  // (ExecutorFactory::dp_size; 1 without).
  int64_t dp_size() const { return dp_size_; }
  int64_t max_model_len() const { return max_model_len_; }
  const ModelConfig& model_config() const { return model_config_; }

 private:
  Engine(const EngineConfig& config, const ModelConfig& model_config, int64_t num_blocks,
         int64_t max_model_len, int64_t block_bytes, DcpBlockLayout dcp);

  absl::Status ValidateDisaggregation(const RequestSpec& spec) const;
  // Draft-model speculation around the target's step: fills the batch's drafts (draft_jobs_), then
  // turns the target's verify logits into Leviathan rejection-sampling outcomes.
  absl::Status ProposeDrafts(SchedulerOutput* batch);
  void VerifyByRejection(const SchedulerOutput& batch, RunnerOutput* out) const;
  // MTP: hands the step's hidden states to the MTP proposer, per request that may draft next.
  absl::Status RecordHidden(const SchedulerOutput& batch, const RunnerOutput& out);
  bool drafts_by_model() const { return draft_ != nullptr || mtp_ != nullptr; }
  // Async scheduling (engine_async.cc): Step() when async_, after the connector's results.
  absl::StatusOr<std::vector<RequestUpdate>> StepAsync(std::vector<RequestUpdate> updates);
  // Collects the launched step (if any) and applies its tokens, appending the updates.
  absl::Status Drain(std::vector<RequestUpdate>* updates);

  const EngineConfig config_;
  const ModelConfig model_config_;
  const int64_t num_blocks_;
  const int64_t max_model_len_;
  const int64_t block_bytes_;
  const DcpBlockLayout dcp_;
  int64_t dp_size_ = 1;  // data-parallel attention ranks, each with its own pool of blocks
  KvDtype kv_dtype_ = KvDtype::kF32;
  kvtransfer::KvConnector* connector_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelExecutor> runner_;
  std::unique_ptr<DraftModelProposer> draft_;
  std::unique_ptr<MtpProposer> mtp_;
  // This step's draft jobs; draft_job_of_seq_[i] indexes them for batch.seqs[i] (-1: none).
  std::vector<DraftJob> draft_jobs_;
  std::vector<int64_t> draft_job_of_seq_;
  // Async scheduling: on, and the launched step whose tokens are not yet applied.
  struct LaunchedStep {
    SchedulerOutput batch;  // ids, counts and flags only: its spans are stale once launched
    uint64_t tag = 0;
  };
  bool async_ = false;
  std::optional<LaunchedStep> launched_;
  StepShape last_step_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_ENGINE_H_
