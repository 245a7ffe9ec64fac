#include "runtime/engine/mtp_proposer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/sampling/sampling.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/cpu/mtp_model.h"
#include "runtime/engine/model_runner.h"

namespace tandem::runtime {
namespace {

// The SamplingUniform stream drafts are drawn from (as the draft model's; the target samples on
// stream 0, RejectionSampleDrafts uses 2 and 3).
constexpr uint32_t kDraftStream = 1;

}  // namespace

MtpExecutorFactory CpuMtpExecutorFactory(int num_threads) {
  return [num_threads](const ExecutorSpec& spec,
                       MtpWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    if (num_threads <= 0) return absl::InvalidArgumentError("num_threads must be positive");
    auto pool = std::make_unique<kernels::ThreadPool>(num_threads);
    ASSIGN_OR_RETURN(std::unique_ptr<MtpModel> model,
                     MtpModel::Create(spec.model_config, std::move(weights), pool.get()));
    const kernels::KvCacheLayout layout = model->KvLayout(spec.num_blocks, spec.block_size);
    RETURN_IF_ERROR(layout.Validate());
    return std::unique_ptr<ModelExecutor>(
        new ModelRunner(std::move(model), layout, nullptr, std::move(pool)));
  };
}

absl::StatusOr<std::unique_ptr<MtpProposer>> MtpProposer::Create(const MtpExecutorFactory& backend,
                                                                 const ModelConfig& target,
                                                                 MtpWeights weights,
                                                                 const DraftModelOptions& options) {
  if (!target.IsMla()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative_method=mtp needs a DeepSeek (MLA) model with num_nextn_predict_layers >= "
        "1; ",
        target.architecture, " has no MTP layer"));
  }
  if (!backend) return absl::InvalidArgumentError("MTP backend without a factory");
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheManager> kv_cache, CreateProposerKvCache(options));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor,
                   backend(ProposerExecutorSpec(target, options), std::move(weights)));
  return std::unique_ptr<MtpProposer>(
      new MtpProposer(target, options, std::move(kv_cache), std::move(executor)));
}

MtpProposer::MtpProposer(const ModelConfig& target, const DraftModelOptions& options,
                         std::unique_ptr<KvCacheManager> kv_cache,
                         std::unique_ptr<ModelExecutor> executor)
    : target_(target),
      options_(options),
      kv_cache_(std::move(kv_cache)),
      executor_(std::move(executor)) {}

void MtpProposer::RecordHidden(int64_t request_id, int64_t first_position,
                               absl::Span<const float> rows) {
  const int64_t H = target_.hidden_size;
  RequestState& st = state_[request_id];
  if (st.hidden.empty() || first_position < st.hidden_begin) {
    st.hidden.clear();
    st.hidden_begin = first_position;
  } else {
    // Drops rows at first_position and after (a rejected draft's), or zero-fills a gap.
    st.hidden.resize(static_cast<size_t>((first_position - st.hidden_begin) * H), 0.0f);
  }
  st.hidden.insert(st.hidden.end(), rows.begin(), rows.end());
}

void MtpProposer::Free(int64_t request_id) {
  kv_cache_->Free(request_id);
  state_.erase(request_id);
  chain_.erase(request_id);
}

int64_t MtpProposer::held_hidden_rows(int64_t request_id) const {
  auto it = state_.find(request_id);
  return it == state_.end() ? 0
                            : static_cast<int64_t>(it->second.hidden.size()) / target_.hidden_size;
}

void MtpProposer::AppendHidden(const RequestState& st, int64_t position,
                               std::vector<float>* out) const {
  const int64_t H = target_.hidden_size;
  const int64_t row = position - st.hidden_begin;
  if (row < 0 || (row + 1) * H > static_cast<int64_t>(st.hidden.size())) {
    out->insert(out->end(), static_cast<size_t>(H), 0.0f);  // never computed here
    return;
  }
  out->insert(out->end(), st.hidden.begin() + row * H, st.hidden.begin() + (row + 1) * H);
}

float* MtpProposer::LatentRow(int64_t request_id, int64_t position) {
  const int64_t width = row_width();
  const int64_t bs = options_.block_size;
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(float));
  if (executor_->pool_on_device() ||
      executor_->kv_pool_bytes() != kv_cache_->num_blocks() * bs * row_bytes) {
    return nullptr;
  }
  const absl::Span<const BlockId> table = kv_cache_->BlockTable(request_id);
  if (position < 0 || position / bs >= static_cast<int64_t>(table.size())) return nullptr;
  // One layer, one latent plane, one "head": block b's slot s is row b * bs + s.
  const int64_t row = static_cast<int64_t>(table[position / bs]) * bs + position % bs;
  return static_cast<float*>(executor_->kv_pool_data()) + row * width;
}

absl::Status MtpProposer::CatchUpPrompt(int64_t request_id, absl::Span<const int32_t> prompt) {
  const int64_t n = static_cast<int64_t>(prompt.size()) - 1;  // positions 0 .. L - 2
  // A device pool's rows are not handed over (ExportPrompt): no catch-up for nothing.
  if (n <= 0 || executor_->pool_on_device() ||
      n * row_width() * static_cast<int64_t>(sizeof(float)) > kMaxHandoffBytes ||
      !kv_cache_->Allocate(request_id, n, nullptr)) {
    return absl::OkStatus();
  }
  const CatchUpJob job{request_id, prompt, n, nullptr};
  return CatchUp(absl::MakeConstSpan(&job, 1));
}

std::optional<MtpHandoff> MtpProposer::ExportPrompt(int64_t request_id, int64_t num_tokens) {
  const int64_t H = target_.hidden_size;
  const int64_t width = row_width();
  const int64_t n = num_tokens - 1;  // positions 0 .. L - 2
  auto it = state_.find(request_id);
  if (n < 0 || it == state_.end() || it->second.valid != n ||
      n * width * static_cast<int64_t>(sizeof(float)) > kMaxHandoffBytes ||
      (n > 0 && LatentRow(request_id, n - 1) == nullptr)) {
    return std::nullopt;
  }
  const RequestState& st = it->second;
  const int64_t last = n - st.hidden_begin;  // h_{L-1}'s row
  if (last < 0 || (last + 1) * H > static_cast<int64_t>(st.hidden.size())) return std::nullopt;
  MtpHandoff handoff;
  handoff.num_positions = n;
  handoff.row_width = width;
  handoff.latent_rows.resize(static_cast<size_t>(n * width));
  for (int64_t p = 0; p < n; ++p) {
    const float* row = LatentRow(request_id, p);
    std::copy(row, row + width, handoff.latent_rows.begin() + p * width);
  }
  handoff.last_hidden.assign(st.hidden.begin() + last * H, st.hidden.begin() + (last + 1) * H);
  ++num_handoffs_;
  return handoff;
}

absl::Status MtpProposer::ValidateHandoff(const MtpHandoff& handoff) const {
  const int64_t H = target_.hidden_size;
  if (handoff.row_width != row_width() || static_cast<int64_t>(handoff.last_hidden.size()) != H) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prefill worker's MTP handoff has latent rows of ", handoff.row_width,
                     " and a hidden state of ", handoff.last_hidden.size(),
                     " floats; this worker's MTP layer has ", row_width(), " and ", H,
                     " (another model on the prefill worker?)"));
  }
  if (handoff.num_positions < 0 ||
      static_cast<int64_t>(handoff.latent_rows.size()) != handoff.num_positions * row_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTP handoff: ", handoff.latent_rows.size(), " floats of latent rows for ",
                     handoff.num_positions, " positions of ", row_width()));
  }
  return absl::OkStatus();
}

void MtpProposer::ImportPrompt(int64_t request_id, const MtpHandoff& handoff) {
  const int64_t n = handoff.num_positions;
  const int64_t width = row_width();
  if (n > 0 && !kv_cache_->Allocate(request_id, n, nullptr)) return;
  if (n > 0 && LatentRow(request_id, 0) == nullptr) {
    kv_cache_->Free(request_id);
    return;
  }
  for (int64_t p = 0; p < n; ++p) {
    std::copy(handoff.latent_rows.begin() + p * width,
              handoff.latent_rows.begin() + (p + 1) * width, LatentRow(request_id, p));
  }
  RequestState& st = state_[request_id];
  st.valid = n;
  RecordHidden(request_id, n, handoff.last_hidden);
  ++num_handoffs_;
}

absl::Status MtpProposer::Propose(absl::Span<DraftJob> jobs) {
  std::vector<DraftJob*> active;
  std::vector<CatchUpJob> catch_up;
  int64_t max_drafts = 0;
  for (DraftJob& job : jobs) {
    job.drafts.clear();
    job.probs.clear();
    const int64_t len = static_cast<int64_t>(job.tokens.size());
    if (job.num_drafts <= 0 || len < 2) continue;
    // MTP positions 0 .. len - 3 + num_drafts get latent KV: the catch-up up to len - 2, then one
    // per chained draft.
    if (!kv_cache_->Allocate(job.request_id, len - 2 + job.num_drafts, nullptr)) continue;
    RequestState& st = state_[job.request_id];
    st.valid = std::min(st.valid, len - 2);  // position len - 2 always runs: it gives d_1
    active.push_back(&job);
    catch_up.push_back({job.request_id, job.tokens, len - 1, &job});
    max_drafts = std::max(max_drafts, job.num_drafts);
  }
  if (active.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CatchUp(catch_up));
  for (int64_t round = 1; round < max_drafts; ++round) {
    RETURN_IF_ERROR(ChainRound(active, round));
  }
  for (DraftJob* job : active) chain_.erase(job->request_id);
  return absl::OkStatus();
}

absl::Status MtpProposer::BoundHeld(absl::Span<const MtpFedTokens> fed) {
  const int64_t H = target_.hidden_size;
  std::vector<CatchUpJob> catch_up;
  for (const MtpFedTokens& f : fed) {
    auto it = state_.find(f.request_id);
    if (it == state_.end() || held_hidden_rows(f.request_id) < kMaxHeldRows) continue;
    RequestState& st = it->second;
    // Position p pairs t_{p+1} with h_p: both must be the request's own (not a draft's).
    const int64_t end =
        std::min(f.fed_end, static_cast<int64_t>(f.tokens.size()) - 1);  // positions < end
    if (end <= st.valid) continue;
    if (!kv_cache_->Allocate(f.request_id, end, nullptr)) {
      // No MTP blocks: drop the rows anyway (those positions enter with zeros later: still
      // exact, acceptance may drop), so that the memory stays bounded.
      const int64_t drop =
          std::min<int64_t>(end - st.hidden_begin, static_cast<int64_t>(st.hidden.size()) / H);
      if (drop > 0) {
        st.hidden.erase(st.hidden.begin(), st.hidden.begin() + drop * H);
        st.hidden_begin += drop;
      }
      continue;
    }
    catch_up.push_back({f.request_id, f.tokens, end, nullptr});
  }
  if (catch_up.empty()) return absl::OkStatus();
  return CatchUp(catch_up);
}

absl::Status MtpProposer::CatchUp(absl::Span<const CatchUpJob> jobs) {
  const int64_t H = target_.hidden_size;
  // The held hidden rows of one chunk, sized once: the vector's regrowth copied them repeatedly.
  int64_t rows = 0;
  for (const CatchUpJob& job : jobs) {
    rows += std::min<int64_t>(std::max<int64_t>(0, job.end - state_[job.request_id].valid),
                              held_hidden_rows(job.request_id));
  }
  std::vector<float> input_hidden;
  input_hidden.reserve(static_cast<size_t>(std::min(rows, options_.max_num_batched_tokens) * H));
  while (true) {
    int64_t budget = options_.max_num_batched_tokens;
    SchedulerOutput step;
    std::vector<const CatchUpJob*> step_jobs;
    input_hidden.clear();
    for (const CatchUpJob& job : jobs) {
      const RequestState& st = state_[job.request_id];
      const int64_t take = std::min(job.end - st.valid, budget);  // positions < end
      if (take <= 0) continue;
      ScheduledSeq seq;
      seq.request_id = job.request_id;
      seq.num_computed_tokens = st.valid;
      // Position i is fed the token at i + 1 (with the hidden state of i).
      seq.new_tokens =
          job.tokens.subspan(static_cast<size_t>(st.valid + 1), static_cast<size_t>(take));
      seq.block_table = kv_cache_->BlockTable(job.request_id);
      // A draft job's last catch-up position yields its first draft.
      seq.samples = job.draft != nullptr && st.valid + take == job.end;
      if (job.draft != nullptr) {
        seq.capture_prompt_logits = seq.samples && job.draft->sampling.temperature > 0.0f;
        seq.sampling = job.draft->sampling;
        seq.sample_step = job.draft->sample_step;
        step.return_hidden_states |= seq.samples && job.draft->num_drafts > 1;
      }
      // Positions before the held rows (an adaptive pause, a prefix-cache hit) pair with zero
      // hidden states: the executor fills them (on the device), they are not sent.
      seq.zero_hidden_rows =
          st.hidden.empty() ? take : std::clamp<int64_t>(st.hidden_begin - st.valid, 0, take);
      for (int64_t p = st.valid + seq.zero_hidden_rows; p < st.valid + take; ++p) {
        AppendHidden(st, p, &input_hidden);
      }
      step.num_batched_tokens += take;
      budget -= take;
      step.seqs.push_back(seq);
      step_jobs.push_back(&job);
    }
    if (step.seqs.empty()) break;
    step.input_hidden = input_hidden;
    step.return_last_hidden_only = true;
    ASSIGN_OR_RETURN(RunnerOutput out, executor_->Run(step));
    RETURN_IF_ERROR(CheckLastHidden(step, out));
    for (size_t s = 0; s < step.seqs.size(); ++s) {
      const ScheduledSeq& seq = step.seqs[s];
      const CatchUpJob& job = *step_jobs[s];
      RequestState& st = state_[job.request_id];
      st.valid += static_cast<int64_t>(seq.new_tokens.size());
      // Every target hidden state before `valid` is in the MTP's KV now.
      const int64_t drop =
          std::min<int64_t>(st.valid - st.hidden_begin, static_cast<int64_t>(st.hidden.size()) / H);
      if (drop > 0) {
        st.hidden.erase(st.hidden.begin(), st.hidden.begin() + drop * H);
        st.hidden_begin += drop;
      }
      if (!seq.samples) continue;
      RETURN_IF_ERROR(TakeDraft(out, s, seq, job.draft));
      if (step.return_hidden_states) {
        chain_[job.request_id].assign(out.hidden_states.begin() + s * H,
                                      out.hidden_states.begin() + (s + 1) * H);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MtpProposer::ChainRound(absl::Span<DraftJob* const> active, int64_t round) {
  const int64_t H = target_.hidden_size;
  SchedulerOutput step;
  std::vector<DraftJob*> step_jobs;
  std::vector<float> input_hidden;
  for (DraftJob* job : active) {
    if (job->num_drafts <= round || static_cast<int64_t>(job->drafts.size()) != round) continue;
    const std::vector<float>& h = chain_[job->request_id];
    if (static_cast<int64_t>(h.size()) != H) {
      return absl::InternalError("the MTP executor returned no hidden state to chain on");
    }
    ScheduledSeq seq;
    seq.request_id = job->request_id;
    // Draft d_round sits at position len - 1 + round - 1 of the verify pass; the MTP run there
    // pairs it with its own output of the position before.
    seq.num_computed_tokens = static_cast<int64_t>(job->tokens.size()) - 2 + round;
    seq.new_tokens = absl::MakeConstSpan(job->drafts).subspan(static_cast<size_t>(round - 1), 1);
    seq.block_table = kv_cache_->BlockTable(job->request_id);
    seq.samples = true;
    seq.capture_prompt_logits = job->sampling.temperature > 0.0f;
    seq.sampling = job->sampling;
    seq.sample_step = job->sample_step + round;
    input_hidden.insert(input_hidden.end(), h.begin(), h.end());
    step.return_hidden_states |= job->num_drafts > round + 1;
    step.num_batched_tokens += 1;
    step.seqs.push_back(seq);
    step_jobs.push_back(job);
  }
  if (step.seqs.empty()) return absl::OkStatus();
  step.input_hidden = input_hidden;
  step.return_last_hidden_only = true;
  ASSIGN_OR_RETURN(RunnerOutput out, executor_->Run(step));
  RETURN_IF_ERROR(CheckLastHidden(step, out));
  for (size_t s = 0; s < step.seqs.size(); ++s) {
    RETURN_IF_ERROR(TakeDraft(out, s, step.seqs[s], step_jobs[s]));
    if (step.return_hidden_states) {
      chain_[step_jobs[s]->request_id].assign(out.hidden_states.begin() + s * H,
                                              out.hidden_states.begin() + (s + 1) * H);
    }
  }
  return absl::OkStatus();
}

absl::Status MtpProposer::CheckLastHidden(const SchedulerOutput& step,
                                          const RunnerOutput& out) const {
  const size_t want = step.seqs.size() * static_cast<size_t>(target_.hidden_size);
  if (step.return_hidden_states && out.hidden_states.size() != want) {
    return absl::InternalError(absl::StrCat("the MTP executor returned ", out.hidden_states.size(),
                                            " hidden-state values, not one row per sequence (",
                                            want, ")"));
  }
  return absl::OkStatus();
}

absl::Status MtpProposer::TakeDraft(const RunnerOutput& out, size_t s, const ScheduledSeq& seq,
                                    DraftJob* job) const {
  if (!seq.capture_prompt_logits) {
    job->drafts.push_back(out.sampled_tokens[s]);
    return absl::OkStatus();
  }
  const int64_t vocab = target_.vocab_size;
  const std::vector<float>& logits = out.last_prompt_logits[s];
  if (static_cast<int64_t>(logits.size()) != vocab) {
    return absl::InternalError("the MTP executor returned no logits row");
  }
  const size_t round = job->drafts.size();
  job->probs.resize((round + 1) * static_cast<size_t>(vocab));
  double* q = job->probs.data() + round * vocab;
  kernels::cpu::TokenProbabilities(logits.data(), vocab, job->sampling, q);
  job->drafts.push_back(kernels::cpu::SampleFromWeights(
      q, vocab,
      kernels::SamplingUniform(job->sampling.seed, static_cast<uint64_t>(seq.sample_step),
                               kDraftStream)));
  return absl::OkStatus();
}

}  // namespace tandem::runtime
