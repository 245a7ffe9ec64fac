#include "runtime/engine/engine.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/sampling/rejection.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/engine/model_runner.h"

namespace tandem::runtime {

Engine::Engine(const EngineConfig& config, const ModelConfig& model_config, int64_t num_blocks,
               int64_t max_model_len, int64_t block_bytes, DcpBlockLayout dcp)
    : config_(config),
      model_config_(model_config),
      num_blocks_(num_blocks),
      max_model_len_(max_model_len),
      block_bytes_(block_bytes),
      dcp_(dcp) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       const ModelConfig& model_config,
                                                       ModelWeights weights,
                                                       const KvPoolAllocator& kv_pool_allocator,
                                                       const ExecutorFactory* factory) {
  if (config.block_size <= 0 || config.max_num_batched_tokens <= 0 || config.max_num_seqs <= 0 ||
      config.num_threads <= 0 || config.max_model_len < 0 || config.kv_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        "block_size, max_num_batched_tokens, max_num_seqs, num_threads must be positive; "
        "max_model_len and kv_cache_bytes not negative");
  }
  const ExecutorFactory cpu_factory =
      factory == nullptr ? CpuExecutorFactory(config.num_threads) : ExecutorFactory{};
  const ExecutorFactory& backend = factory == nullptr ? cpu_factory : *factory;
  if (!backend.create) return absl::InvalidArgumentError("ExecutorFactory without create()");
  RETURN_IF_ERROR(ValidateSpeculativeConfig(config.speculative));
  if (config.speculative.enabled() && !backend.verifies_drafts) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", backend.name, " backend cannot verify drafts (speculative decoding)"));
  }
  const int64_t max_model_len =
      config.max_model_len > 0
          ? std::min(config.max_model_len, model_config.max_position_embeddings)
          : model_config.max_position_embeddings;
  // Bytes of one block: every layer's K and V for block_size tokens in the backend's KV dtype.
  const int64_t block_bytes = KvBlockBytes(model_config, config.block_size, backend.kv_dtype);
  int64_t budget = config.kv_cache_bytes;
  if (budget == 0) {
    if (!backend.default_kv_cache_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes is 0 and the ", backend.name,
                                                     " backend has no default budget"));
    }
    ASSIGN_OR_RETURN(budget, backend.default_kv_cache_bytes(model_config));
  }
  // The budget is each rank's: with DCP every shard's pool holds num_blocks blocks.
  ASSIGN_OR_RETURN(int64_t num_blocks, NumBlocksForBudget(budget, block_bytes));
  const DcpBlockLayout dcp =
      DcpBlockLayout::FromFlags(backend.dcp_size, backend.dcp_interleave, config.block_size);
  RETURN_IF_ERROR(dcp.Validate());
  // Data-parallel attention: each DP rank's pool holds num_blocks blocks (dp_rank.h).
  const int64_t dp = std::max<int64_t>(1, backend.dp_size);

  std::unique_ptr<Engine> engine(new Engine(config, model_config, num_blocks * dcp.size * dp,
                                            max_model_len, block_bytes, dcp));
  engine->kv_dtype_ = backend.kv_dtype;
  engine->dp_size_ = dp;
  engine->async_ = config.async_scheduling && !config.speculative.enabled() && dp == 1;

  KvCacheConfig kv_config;
  kv_config.num_blocks = num_blocks * dcp.size * dp;
  kv_config.dp_size = dp;
  kv_config.block_size = config.block_size;
  kv_config.enable_prefix_caching = config.enable_prefix_caching;
  kv_config.dcp_size = dcp.size;
  kv_config.dcp_interleave = dcp.interleave;
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheManager> kv_cache, KvCacheManager::Create(kv_config));

  SchedulerConfig sched_config;
  sched_config.max_num_batched_tokens = config.max_num_batched_tokens;
  sched_config.max_num_seqs = config.max_num_seqs;
  sched_config.max_model_len = max_model_len;
  sched_config.speculative = config.speculative;
  engine->scheduler_ =
      std::make_unique<Scheduler>(sched_config, std::move(kv_cache), model_config.eos_token_ids);
  ExecutorSpec spec;
  spec.model_config = model_config;
  spec.num_blocks = num_blocks;
  spec.block_size = config.block_size;
  spec.max_num_batched_tokens = config.max_num_batched_tokens;
  spec.max_num_seqs = config.max_num_seqs;
  spec.max_model_len = max_model_len;
  spec.num_speculative_tokens =
      config.speculative.enabled() ? config.speculative.num_speculative_tokens : 0;
  if (kv_pool_allocator && backend.accepts_external_pool) {
    // nullptr: the allocator declined; the executor allocates.
    ASSIGN_OR_RETURN(spec.kv_pool, kv_pool_allocator(num_blocks * block_bytes));
  }
  ASSIGN_OR_RETURN(engine->runner_, backend.create(spec, std::move(weights)));
  return engine;
}

absl::Status Engine::AttachDraftModel(const ModelConfig& draft_config, ModelWeights draft_weights,
                                      const ExecutorFactory* backend) {
  if (config_.speculative.method != SpeculativeMethod::kDraft) {
    return absl::InvalidArgumentError("a draft model needs --speculative_method=draft");
  }
  if (draft_ != nullptr) return absl::FailedPreconditionError("a draft model is attached already");
  DraftModelOptions options;
  options.num_blocks = num_blocks_ / dcp_.size;
  options.block_size = config_.block_size;
  options.max_num_batched_tokens = config_.max_num_batched_tokens;
  options.max_num_seqs = config_.max_num_seqs;
  options.max_model_len = max_model_len_;
  const ExecutorFactory cpu =
      backend == nullptr ? CpuExecutorFactory(config_.num_threads) : ExecutorFactory{};
  if (dcp_.size > 1) {
    return absl::InvalidArgumentError(
        "--speculative_method=draft does not run under decode context parallelism (--dcp > 1)");
  }
  ASSIGN_OR_RETURN(draft_,
                   DraftModelProposer::Create(backend == nullptr ? cpu : *backend, model_config_,
                                              draft_config, std::move(draft_weights), options));
  return absl::OkStatus();
}

absl::Status Engine::AttachMtp(const ModelConfig& config, MtpWeights weights,
                               const MtpExecutorFactory* backend) {
  if (config_.speculative.method != SpeculativeMethod::kMtp) {
    return absl::InvalidArgumentError("an MTP layer needs --speculative_method=mtp");
  }
  if (config.hidden_size != model_config_.hidden_size ||
      config.vocab_size != model_config_.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the MTP layer's model (hidden ", config.hidden_size, ", vocabulary ",
                     config.vocab_size, ") is not this engine's (hidden ",
                     model_config_.hidden_size, ", vocabulary ", model_config_.vocab_size, ")"));
  }
  if (mtp_ != nullptr) return absl::FailedPreconditionError("an MTP layer is attached already");
  if (dcp_.size > 1) {
    return absl::InvalidArgumentError(
        "--speculative_method=mtp does not run under decode context parallelism (--dcp > 1)");
  }
  DraftModelOptions options;
  options.num_blocks = num_blocks_ / dcp_.size;
  options.block_size = config_.block_size;
  options.max_num_batched_tokens = config_.max_num_batched_tokens;
  options.max_num_seqs = config_.max_num_seqs;
  options.max_model_len = max_model_len_;
  const MtpExecutorFactory cpu =
      backend == nullptr ? CpuMtpExecutorFactory(config_.num_threads) : MtpExecutorFactory{};
  ASSIGN_OR_RETURN(mtp_, MtpProposer::Create(backend == nullptr ? cpu : *backend, config,
                                             std::move(weights), options));
  return absl::OkStatus();
}

absl::Status Engine::AddRequest(int64_t request_id, RequestSpec spec) {
  RETURN_IF_ERROR(ValidateRequest(spec));
  if (config_.speculative.method == SpeculativeMethod::kDraft && draft_ == nullptr) {
    return absl::FailedPreconditionError(
        "--speculative_method=draft but no draft model is attached (--draft_model)");
  }
  if (config_.speculative.method == SpeculativeMethod::kMtp && mtp_ == nullptr) {
    return absl::FailedPreconditionError(
        "--speculative_method=mtp but no MTP layer is attached (Engine::AttachMtp)");
  }
  std::optional<MtpHandoff> handoff = std::move(spec.mtp_handoff);
  spec.mtp_handoff.reset();
  if (handoff.has_value() && mtp_ != nullptr) {
    RETURN_IF_ERROR(mtp_->ValidateHandoff(*handoff));
    if (handoff->num_positions != static_cast<int64_t>(spec.prompt.size()) - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the MTP handoff covers ", handoff->num_positions, " positions; a ",
                       spec.prompt.size(), "-token prompt has ", spec.prompt.size() - 1));
    }
  }
  RETURN_IF_ERROR(scheduler_->Add(request_id, std::move(spec)));
  if (handoff.has_value() && mtp_ != nullptr) mtp_->ImportPrompt(request_id, *handoff);
  return absl::OkStatus();
}

absl::Status Engine::ValidateRequest(const RequestSpec& spec) const {
  const int64_t vocab = model_config_.vocab_size;
  const int64_t n = static_cast<int64_t>(spec.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("prompt is empty");
  for (int64_t i = 0; i < n; ++i) {
    if (spec.prompt[i] < 0 || spec.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", spec.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (int32_t t : spec.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (spec.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", spec.max_tokens));
  }
  if (n + spec.max_tokens > max_model_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", n, " tokens) + max_tokens (", spec.max_tokens,
                     ") exceeds the model's maximum length of ", max_model_len_, " tokens"));
  }
  // Shard 0 holds the most blocks of any request (shards fill in order).
  const int64_t blocks_needed = dcp_.NumShardBlocks(n + spec.max_tokens, 0);
  const int64_t shard_blocks = num_blocks_ / (dcp_.size * dp_size_);
  if (blocks_needed > shard_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request needs ", blocks_needed, " KV blocks",
        dcp_.size > 1 ? absl::StrCat(" on DCP shard 0 of ", dcp_.size) : "", " but the whole ",
        dcp_.size > 1 ? "shard's " : "", "pool has ", shard_blocks, "; raise --kv_cache_bytes",
        dcp_.size > 1 ? " or --dcp" : "", " or lower max_tokens"));
  }
  RETURN_IF_ERROR(kernels::ValidateSamplingParams(spec.sampling));
  return ValidateDisaggregation(spec);
}

absl::Status Engine::ValidateDisaggregation(const RequestSpec& spec) const {
  const int64_t n = static_cast<int64_t>(spec.prompt.size());
  if ((spec.hold_kv_for_remote || spec.remote_kv.has_value()) && connector_ == nullptr) {
    return absl::InvalidArgumentError(
        "request needs remote KV transfer but this engine has no KV connector");
  }
  if (spec.hold_kv_for_remote && spec.lease_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease duration must be positive");
  }
  if (spec.first_token >= model_config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("first token ", spec.first_token,
                                                   " is outside the vocabulary [0, ",
                                                   model_config_.vocab_size, ")"));
  }
  if (!spec.remote_kv.has_value()) return absl::OkStatus();
  const kvtransfer::RemoteKvSpec& remote = *spec.remote_kv;
  if (spec.first_token < 0) {
    return absl::InvalidArgumentError("a request with remote KV needs the first token");
  }
  if (spec.max_tokens < 2) {
    return absl::InvalidArgumentError("a request with remote KV needs max_tokens >= 2");
  }
  if (remote.num_tokens != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote KV covers ", remote.num_tokens, " tokens but the prompt has ", n));
  }
  if (!dcp_.WholeBlocks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote KV into a DCP group needs --dcp_interleave a multiple of the block size ",
        config_.block_size, " (whole blocks per shard); this group deals ", dcp_.interleave,
        " tokens per shard"));
  }
  const int64_t blocks = (remote.num_tokens + config_.block_size - 1) / config_.block_size;
  if (static_cast<int64_t>(remote.block_ids.size()) != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("remote KV lists ", remote.block_ids.size(),
                                                   " blocks; ", remote.num_tokens, " tokens need ",
                                                   blocks));
  }
  if (remote.peer.empty()) return absl::InvalidArgumentError("remote KV names no source peer");
  return absl::OkStatus();
}

bool Engine::Abort(int64_t request_id) {
  if (draft_ != nullptr) draft_->Free(request_id);
  if (mtp_ != nullptr) mtp_->Free(request_id);
  return scheduler_->Abort(request_id);
}

void Engine::AttachConnector(kvtransfer::KvConnector* connector) {
  connector_ = connector;
  scheduler_->set_connector(connector);
}

bool Engine::HasWork() const {
  return HasUnfinished() || (connector_ != nullptr && connector_->HasPendingLoads());
}

absl::StatusOr<std::vector<RequestUpdate>> Engine::Step() {
  std::vector<RequestUpdate> updates;
  if (connector_ != nullptr) {
    // Worker half first: finished loads become runnable this very step.
    kvtransfer::FinishedTransfers finished = connector_->GetFinished(absl::Now());
    updates = scheduler_->ApplyConnectorResults(finished, connector_->GetLoadErrors());
  }
  last_step_ = StepShape{};
  if (async_) return StepAsync(std::move(updates));
  SchedulerOutput batch = scheduler_->Schedule();
  if (connector_ != nullptr) RETURN_IF_ERROR(connector_->StartLoad(connector_->BuildStepMeta()));
  if (batch.empty()) return updates;
  if (drafts_by_model()) RETURN_IF_ERROR(ProposeDrafts(&batch));
  last_step_ = ShapeOf(batch);
  // MTP: the target's hidden states only where the MTP layer may draft next step (none while
  // every request's adaptive draft length pauses; mtp_proposer.h).
  batch.return_hidden_states =
      mtp_ != nullptr && std::any_of(batch.seqs.begin(), batch.seqs.end(),
                                     [](const ScheduledSeq& seq) { return seq.may_draft_next; });
  ASSIGN_OR_RETURN(RunnerOutput out, runner_->Run(batch));
  if (batch.return_hidden_states) RETURN_IF_ERROR(RecordHidden(batch, out));
  if (drafts_by_model()) VerifyByRejection(batch, &out);
  std::vector<RequestUpdate> stepped =
      scheduler_->Update(batch, out.sampled_tokens, &out.last_prompt_logits, out.draft_samples);
  for (RequestUpdate& u : stepped) {
    if (u.finish_reason == FinishReason::kNone) continue;
    if (draft_ != nullptr) draft_->Free(u.request_id);
    if (mtp_ == nullptr) continue;
    // P -> D: the MTP's state of the prompt goes to the decode worker with the lease.
    if (u.kv_lease.has_value()) {
      u.mtp_handoff = mtp_->ExportPrompt(u.request_id, u.kv_lease->num_tokens);
    }
    mtp_->Free(u.request_id);
  }
  if (updates.empty()) return stepped;
  for (RequestUpdate& u : stepped) updates.push_back(std::move(u));
  return updates;
}

absl::Status Engine::ProposeDrafts(SchedulerOutput* batch) {
  draft_jobs_.clear();
  draft_job_of_seq_.assign(batch->seqs.size(), -1);
  for (size_t i = 0; i < batch->seqs.size(); ++i) {
    const ScheduledSeq& seq = batch->seqs[i];
    if (seq.num_draft_tokens == 0) continue;
    DraftJob job;
    job.request_id = seq.request_id;
    job.tokens = scheduler_->Tokens(seq.request_id);
    job.num_drafts = seq.num_draft_tokens;
    job.sampling = seq.sampling;
    job.sample_step = seq.sample_step;
    draft_job_of_seq_[i] = static_cast<int64_t>(draft_jobs_.size());
    draft_jobs_.push_back(std::move(job));
  }
  if (draft_jobs_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(draft_ != nullptr ? draft_->Propose(absl::MakeSpan(draft_jobs_))
                                    : mtp_->Propose(absl::MakeSpan(draft_jobs_)));
  for (size_t i = 0; i < batch->seqs.size(); ++i) {
    if (draft_job_of_seq_[i] < 0) continue;
    ScheduledSeq& seq = batch->seqs[i];
    const DraftJob& job = draft_jobs_[draft_job_of_seq_[i]];
    scheduler_->SetDrafts(job.drafts, &seq, batch);
    seq.return_verify_logits = seq.num_draft_tokens > 0 && !job.probs.empty();
    if (seq.return_verify_logits) seq.draft_probs = job.probs;
  }
  return absl::OkStatus();
}

absl::Status Engine::RecordHidden(const SchedulerOutput& batch, const RunnerOutput& out) {
  const int64_t H = model_config_.hidden_size;
  int64_t tokens = 0;
  for (const ScheduledSeq& seq : batch.seqs) tokens += static_cast<int64_t>(seq.new_tokens.size());
  if (static_cast<int64_t>(out.hidden_states.size()) != tokens * H) {
    return absl::InternalError(
        "the backend returned no hidden states (the MTP drafter needs them)");
  }
  int64_t row = 0;
  std::vector<MtpFedTokens> fed;
  std::vector<const ScheduledSeq*> fed_seqs;  // fed[i]'s sequence
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    row += n;
    // A sequence that cannot draft next step (an adaptive pause): its positions enter the MTP's
    // KV with zero hidden states later, as positions never computed here do.
    if (!seq.may_draft_next) continue;
    mtp_->RecordHidden(seq.request_id, seq.num_computed_tokens,
                       absl::MakeConstSpan(out.hidden_states).subspan((row - n) * H, n * H));
    fed.push_back({seq.request_id, scheduler_->Tokens(seq.request_id),
                   seq.num_computed_tokens + n - seq.num_draft_tokens});
    fed_seqs.push_back(&seq);
  }
  RETURN_IF_ERROR(mtp_->BoundHeld(fed));
  if (connector_ == nullptr) return absl::OkStatus();
  // A prompt completed here may go on at a decode worker: run the MTP over it now, while its
  // tokens are at hand (ExportPrompt copies it out if the request then holds its KV).
  for (size_t i = 0; i < fed.size(); ++i) {
    const ScheduledSeq& seq = *fed_seqs[i];
    const int64_t len = static_cast<int64_t>(fed[i].tokens.size());
    if (!seq.samples || seq.num_draft_tokens > 0 || fed[i].fed_end != len) continue;
    RETURN_IF_ERROR(mtp_->CatchUpPrompt(seq.request_id, fed[i].tokens));
  }
  return absl::OkStatus();
}

void Engine::VerifyByRejection(const SchedulerOutput& batch, RunnerOutput* out) const {
  const int64_t vocab = model_config_.vocab_size;
  std::vector<double> target;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& seq = batch.seqs[i];
    if (!seq.return_verify_logits || i >= out->verify_logits.size()) continue;
    const std::vector<float>& logits = out->verify_logits[i];
    const int64_t k = seq.num_draft_tokens;
    // A backend without verify logits leaves the samples: the match rule (exact as well).
    if (static_cast<int64_t>(logits.size()) != (k + 1) * vocab) continue;
    const DraftJob& job = draft_jobs_[draft_job_of_seq_[i]];
    target.resize(static_cast<size_t>((k + 1) * vocab));
    for (int64_t r = 0; r <= k; ++r) {
      kernels::cpu::TokenProbabilities(logits.data() + r * vocab, vocab, seq.sampling,
                                       target.data() + r * vocab);
    }
    const absl::Span<const int32_t> drafts = seq.new_tokens.subspan(1);
    const kernels::RejectionOutcome verdict =
        kernels::cpu::RejectionSampleDrafts(target, job.probs, drafts, vocab, seq.sampling.seed,
                                            static_cast<uint64_t>(seq.sample_step));
    // Re-express the outcome as the samples Scheduler::ApplyVerify reads: the accepted drafts,
    // then the residual sample (never the rejected draft), or the bonus token after all k.
    std::vector<int32_t>& samples = out->draft_samples[i];
    samples.assign(drafts.begin(), drafts.end());
    if (verdict.accepted < k) {
      samples[verdict.accepted] = verdict.next_token;
    } else {
      out->sampled_tokens[i] = verdict.next_token;
    }
  }
}

}  // namespace tandem::runtime
