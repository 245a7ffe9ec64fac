#include "runtime/engine/draft_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {
namespace {

// The stream of SamplingUniform the draft tokens are drawn from (0 is the target's samples;
// RejectionSampleDrafts uses 2 and 3).
constexpr uint32_t kDraftStream = 1;

}  // namespace

absl::StatusOr<std::unique_ptr<KvCacheManager>> CreateProposerKvCache(
    const DraftModelOptions& options) {
  KvCacheConfig kv_config;
  kv_config.num_blocks = options.num_blocks;
  kv_config.block_size = options.block_size;
  kv_config.enable_prefix_caching = false;  // per-request tables; nothing shared
  return KvCacheManager::Create(kv_config);
}

ExecutorSpec ProposerExecutorSpec(const ModelConfig& config, const DraftModelOptions& options) {
  ExecutorSpec spec;
  spec.model_config = config;
  spec.num_blocks = options.num_blocks;
  spec.block_size = options.block_size;
  spec.max_num_batched_tokens = options.max_num_batched_tokens;
  spec.max_num_seqs = options.max_num_seqs;
  spec.max_model_len = options.max_model_len;
  return spec;
}

absl::StatusOr<std::unique_ptr<DraftModelProposer>> DraftModelProposer::Create(
    const ExecutorFactory& backend, const ModelConfig& target, const ModelConfig& draft,
    ModelWeights weights, const DraftModelOptions& options) {
  if (draft.vocab_size != target.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft_model must share the target's vocabulary: the draft has ",
                     draft.vocab_size, " token ids, the target ", target.vocab_size));
  }
  if (draft.max_position_embeddings < options.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("the draft model's max_position_embeddings (", draft.max_position_embeddings,
                     ") is below the target's maximum length (", options.max_model_len, ")"));
  }
  if (backend.dcp_size > 1) {
    return absl::InvalidArgumentError(
        "--speculative_method=draft does not run under decode context parallelism (--dcp > 1)");
  }
  if (!backend.create) return absl::InvalidArgumentError("draft backend without create()");
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheManager> kv_cache, CreateProposerKvCache(options));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor,
                   backend.create(ProposerExecutorSpec(draft, options), std::move(weights)));
  return std::unique_ptr<DraftModelProposer>(
      new DraftModelProposer(draft, options, std::move(kv_cache), std::move(executor)));
}

DraftModelProposer::DraftModelProposer(const ModelConfig& config, const DraftModelOptions& options,
                                       std::unique_ptr<KvCacheManager> kv_cache,
                                       std::unique_ptr<ModelExecutor> executor)
    : config_(config),
      options_(options),
      kv_cache_(std::move(kv_cache)),
      executor_(std::move(executor)) {}

void DraftModelProposer::Free(int64_t request_id) {
  kv_cache_->Free(request_id);
  fed_.erase(request_id);
}

absl::Status DraftModelProposer::Propose(absl::Span<DraftJob> jobs) {
  std::vector<DraftJob*> active;
  int64_t max_drafts = 0;
  for (DraftJob& job : jobs) {
    job.drafts.clear();
    job.probs.clear();
    if (job.num_drafts <= 0 || job.tokens.empty()) continue;
    const int64_t len = static_cast<int64_t>(job.tokens.size());
    // Positions 0 .. len - 2 + num_drafts get draft KV (the last draft is never fed).
    if (!kv_cache_->Allocate(job.request_id, len - 1 + job.num_drafts, nullptr)) continue;
    // What stays valid: the common prefix of what was fed and the tokens now, short of the last
    // token (step 0 feeds it, so its logits come out).
    std::vector<int32_t>& fed = fed_[job.request_id];
    const int64_t limit = std::min<int64_t>(static_cast<int64_t>(fed.size()), len - 1);
    int64_t valid = 0;
    while (valid < limit && fed[valid] == job.tokens[valid]) ++valid;
    fed.resize(static_cast<size_t>(valid));
    active.push_back(&job);
    max_drafts = std::max(max_drafts, job.num_drafts);
  }
  if (active.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CatchUp(active));
  for (int64_t round = 0; round < max_drafts; ++round) RETURN_IF_ERROR(DraftRound(active, round));
  return absl::OkStatus();
}

absl::Status DraftModelProposer::CatchUp(absl::Span<DraftJob* const> active) {
  while (true) {
    // Grow every job's fed tokens by its next chunk (all pushes before any span is taken).
    int64_t budget = options_.max_num_batched_tokens;
    std::vector<std::pair<DraftJob*, int64_t>> chunks;  // job, tokens fed before this step
    for (DraftJob* job : active) {
      std::vector<int32_t>& fed = fed_[job->request_id];
      const int64_t start = static_cast<int64_t>(fed.size());
      const int64_t want = static_cast<int64_t>(job->tokens.size()) - 1 - start;
      const int64_t take = std::min(want, budget);
      if (take <= 0) continue;
      fed.insert(fed.end(), job->tokens.begin() + start, job->tokens.begin() + start + take);
      chunks.emplace_back(job, start);
      budget -= take;
    }
    if (chunks.empty()) return absl::OkStatus();
    SchedulerOutput step;
    for (const auto& [job, start] : chunks) {
      const std::vector<int32_t>& fed = fed_[job->request_id];
      ScheduledSeq seq;
      seq.request_id = job->request_id;
      seq.num_computed_tokens = start;
      seq.new_tokens = absl::MakeConstSpan(fed).subspan(static_cast<size_t>(start));
      seq.block_table = kv_cache_->BlockTable(job->request_id);
      seq.sampling = job->sampling;
      step.num_batched_tokens += static_cast<int64_t>(seq.new_tokens.size());
      step.seqs.push_back(seq);
    }
    RETURN_IF_ERROR(executor_->Run(step).status());
  }
}

absl::Status DraftModelProposer::DraftRound(absl::Span<DraftJob* const> active, int64_t round) {
  std::vector<DraftJob*> jobs;
  for (DraftJob* job : active) {
    if (job->num_drafts <= round) continue;
    fed_[job->request_id].push_back(round == 0 ? job->tokens.back() : job->drafts.back());
    jobs.push_back(job);
  }
  SchedulerOutput step;
  for (DraftJob* job : jobs) {
    const std::vector<int32_t>& fed = fed_[job->request_id];
    ScheduledSeq seq;
    seq.request_id = job->request_id;
    seq.num_computed_tokens = static_cast<int64_t>(fed.size()) - 1;
    seq.new_tokens = absl::MakeConstSpan(fed).subspan(fed.size() - 1);
    seq.block_table = kv_cache_->BlockTable(job->request_id);
    seq.samples = true;
    // The logits of a sampling request give q; a greedy one needs only the executor's argmax.
    seq.capture_prompt_logits = job->sampling.temperature > 0.0f;
    seq.sampling = job->sampling;
    seq.sample_step = job->sample_step + round;
    step.num_batched_tokens += 1;
    step.seqs.push_back(seq);
  }
  ASSIGN_OR_RETURN(RunnerOutput out, executor_->Run(step));
  const int64_t vocab = config_.vocab_size;
  for (size_t s = 0; s < jobs.size(); ++s) {
    DraftJob* job = jobs[s];
    if (!step.seqs[s].capture_prompt_logits) {
      job->drafts.push_back(out.sampled_tokens[s]);
      continue;
    }
    const std::vector<float>& logits = out.last_prompt_logits[s];
    if (static_cast<int64_t>(logits.size()) != vocab) {
      return absl::InternalError("the draft executor returned no logits row");
    }
    job->probs.resize(job->probs.size() + static_cast<size_t>(vocab));
    double* q = job->probs.data() + round * vocab;
    kernels::cpu::TokenProbabilities(logits.data(), vocab, job->sampling, q);
    const uint64_t step_index = static_cast<uint64_t>(job->sample_step + round);
    job->drafts.push_back(kernels::cpu::SampleFromWeights(
        q, vocab, kernels::SamplingUniform(job->sampling.seed, step_index, kDraftStream)));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime
