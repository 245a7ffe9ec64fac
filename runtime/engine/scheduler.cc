#include "runtime/engine/scheduler.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/engine/dp_rank.h"

namespace tandem::runtime {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Scheduler::Scheduler(const SchedulerConfig& config, std::unique_ptr<KvCacheManager> kv_cache,
                     std::vector<int32_t> eos_token_ids, kvtransfer::KvConnector* connector)
    : config_(config),
      kv_cache_(std::move(kv_cache)),
      eos_token_ids_(std::move(eos_token_ids)),
      connector_(connector) {}

absl::Status Scheduler::Add(int64_t request_id, RequestSpec spec) {
  const bool blocks_held =
      std::any_of(deferred_frees_.begin(), deferred_frees_.end(),
                  [request_id](const auto& d) { return d.second == request_id; });
  if (requests_.contains(request_id) || held_.contains(request_id) || blocks_held) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request_id, " already exists"));
  }
  auto req = std::make_unique<Request>();
  req->id = request_id;
  req->tokens = spec.prompt;
  // A decode worker continues after the source's first token: it is output token 0.
  if (spec.first_token >= 0) req->tokens.push_back(spec.first_token);
  req->spec = std::move(spec);
  req->dp_rank = AssignDpRank();
  waiting_.push_back(req.get());
  requests_.emplace(request_id, std::move(req));
  return absl::OkStatus();
}

bool Scheduler::Abort(int64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  Request* req = it->second.get();
  if (req->status == RequestStatus::kLoadingRemoteKv) {
    // A READ may still write into its blocks: free them once the connector says it ended.
    if (!req->abort_after_load) {
      req->abort_after_load = true;
      connector_->CancelLoad(request_id);
    }
    return true;
  }
  // Still waiting with remote KV it never started to load: the source's lease can go.
  if (req->status == RequestStatus::kWaiting && req->spec.remote_kv.has_value() &&
      connector_ != nullptr) {
    connector_->DropRemote(*req->spec.remote_kv);
  }
  FreeBlocks(request_id);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), req), running_.end());
  requests_.erase(it);
  return true;
}

int64_t Scheduler::AssignDpRank() {
  const int64_t n = kv_cache_->dp_size();
  if (n == 1) return 0;
  std::vector<DpRankLoad> loads(n);
  for (int64_t r = 0; r < n; ++r) loads[r].free_blocks = kv_cache_->NumFreeBlocksOnDpRank(r);
  for (const auto& [id, req] : requests_) ++loads[req->dp_rank].requests;
  last_dp_rank_ = PickDpRank(loads, last_dp_rank_);
  return last_dp_rank_;
}

Request* Scheduler::TakePreemptionVictim(const Request& req) {
  // Without DP attention every request shares the pool: the newest. With it, only requests of
  // req's DP rank free blocks req can use (req itself is one, so there is always a victim).
  auto it = running_.end() - 1;
  while (it != running_.begin() && (*it)->dp_rank != req.dp_rank) --it;
  Request* victim = *it;
  running_.erase(it);
  return victim;
}

void Scheduler::Preempt(Request* req) {
  kv_cache_->Free(req->id);
  req->num_computed_tokens = 0;
  req->num_preemptions += 1;
  req->status = RequestStatus::kWaiting;
  waiting_.push_front(req);
}

// One Schedule() call's state, per DP rank where indexed by rank.
struct Scheduler::ScheduleStep {
  SchedulerOutput* out;
  std::vector<int64_t> budget;       // tokens still schedulable
  std::vector<bool> rank_preempted;  // a running request was preempted: admit nobody
  bool batch_drafts;                 // this step's batch-level speculative switch
};

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  // Data-parallel attention (SGLang's): the token budget and max_num_seqs hold per DP rank, and a
  // rank that cannot admit blocks only its own waiting requests. One rank without it.
  const int64_t num_ranks = kv_cache_->dp_size();
  // Batch-level switch (vLLM's speculative_disable_by_batch_size): a batch this large is no
  // longer bound by reading the weights, so verifying drafts stops paying; nobody drafts.
  const int64_t disable_at = config_.speculative.disable_by_batch_size;
  ScheduleStep step{
      .out = &out,
      .budget = std::vector<int64_t>(num_ranks, config_.max_num_batched_tokens),
      .rank_preempted = std::vector<bool>(num_ranks, false),
      .batch_drafts = disable_at == 0 || static_cast<int64_t>(running_.size()) < disable_at,
  };
  ScheduleRunning(&step);
  ScheduleWaiting(&step);
  // Block tables last: every allocation of this step is done, so the spans stay valid.
  for (ScheduledSeq& seq : out.seqs) seq.block_table = kv_cache_->BlockTable(seq.request_id);
  return out;
}

void Scheduler::AddSeq(Request* req, int64_t num_new, ScheduleStep* step) {
  ScheduledSeq seq;
  seq.request_id = req->id;
  seq.num_computed_tokens = req->num_computed_tokens;
  // num_new past the request's tokens: its verify_input (last token + drafts) is fed.
  const int64_t known = static_cast<int64_t>(req->tokens.size()) - req->num_computed_tokens;
  seq.num_draft_tokens = std::max<int64_t>(0, num_new - known);
  seq.new_tokens =
      seq.num_draft_tokens > 0
          ? absl::MakeConstSpan(req->verify_input)
          : absl::MakeConstSpan(req->tokens).subspan(req->num_computed_tokens, num_new);
  const int64_t end = req->num_computed_tokens + num_new - seq.num_draft_tokens;
  seq.samples = end == static_cast<int64_t>(req->tokens.size());
  seq.capture_prompt_logits = req->spec.capture_last_prompt_logits &&
                              req->last_prompt_logits.empty() && seq.samples &&
                              end == req->num_prompt_tokens();
  seq.sampling = req->spec.sampling;
  seq.sample_step = req->num_output_tokens();
  seq.dp_rank = req->dp_rank;
  seq.may_draft_next = MayDraftNext(*req, step->batch_drafts);
  if (req->pending_index >= 0 && req->pending_index == req->num_computed_tokens) {
    seq.input_from_prev_seq = req->pending_seq;
  }
  step->out->seqs.push_back(seq);
  step->out->num_batched_tokens += num_new;
  step->budget[req->dp_rank] -= num_new;
}

bool Scheduler::GrowOrPreempt(Request* req, int64_t num_new, ScheduleStep* step) {
  while (!kv_cache_->Allocate(req->id, req->num_computed_tokens + num_new, nullptr, req->dp_rank)) {
    Request* victim = TakePreemptionVictim(*req);
    Preempt(victim);
    ++step->out->num_preempted;
    step->rank_preempted[req->dp_rank] = true;
    if (victim == req) return false;
  }
  return true;
}

void Scheduler::ScheduleRunning(ScheduleStep* step) {
  // Oldest first; grow their block tables, preempting the newest if needed. A rank whose request
  // preempted itself schedules no more of its running requests.
  std::vector<int64_t>& budget = step->budget;
  std::vector<bool> rank_done(budget.size(), false);
  for (size_t i = 0; i < running_.size();) {
    Request* req = running_[i];
    const int64_t rank = req->dp_rank;
    const int64_t remaining = static_cast<int64_t>(req->tokens.size()) - req->num_computed_tokens;
    // Async scheduling: a request whose in-flight token is its last by length feeds nothing more.
    const bool ends = req->pending_index >= 0 &&
                      CheckStopAt(*req, req->pending_index + 1) == FinishReason::kLength;
    const int64_t num_new = rank_done[rank] || ends ? 0 : std::min(remaining, budget[rank]);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    // A decoding request may verify drafts: only when its blocks can grow without preempting.
    if (const int64_t drafts = remaining == 1 && step->batch_drafts ? Draft(req, budget[rank]) : 0;
        drafts > 0 && kv_cache_->Allocate(req->id, req->num_computed_tokens + 1 + drafts, nullptr,
                                          req->dp_rank)) {
      AddSeq(req, 1 + drafts, step);
      ++i;
      continue;
    }
    if (!GrowOrPreempt(req, num_new, step)) {  // out of running_: running_[i] is the next one
      rank_done[rank] = true;
      continue;
    }
    AddSeq(req, num_new, step);
    ++i;
  }
}

void Scheduler::ScheduleWaiting(ScheduleStep* step) {
  // FCFS within each DP rank, only on ranks where nobody had to be preempted (their pool is tight
  // then). A request with remote KV takes blocks and starts loading; it runs once loaded.
  std::vector<int64_t>& budget = step->budget;
  std::vector<int64_t> seqs(budget.size(), 0);
  for (const Request* req : running_) ++seqs[req->dp_rank];
  for (const auto& [id, req] : loading_) ++seqs[req->dp_rank];
  std::vector<bool> blocked = step->rank_preempted;
  int64_t open = std::count(blocked.begin(), blocked.end(), false);
  for (auto it = waiting_.begin(); it != waiting_.end() && open > 0;) {
    Request* req = *it;
    const int64_t rank = req->dp_rank;
    if (blocked[rank]) {
      ++it;
      continue;
    }
    const int64_t num_new = budget[rank] > 0 && seqs[rank] < config_.max_num_seqs
                                ? AdmitWaiting(req, budget[rank])
                                : -1;
    if (num_new < 0) {  // this rank admits nobody after it
      blocked[rank] = true;
      --open;
      ++it;
      continue;
    }
    it = waiting_.erase(it);
    ++seqs[rank];
    MarkScheduled(req);
    if (num_new > 0) AddSeq(req, num_new, step);
  }
}

int64_t Scheduler::AdmitWaiting(Request* req, int64_t budget) {
  if (req->spec.remote_kv.has_value() && connector_ != nullptr) {
    if (!AdmitRemoteKv(req)) return -1;
    if (req->status == RequestStatus::kLoadingRemoteKv) return 0;
    // Everything it needs is in the local prefix cache: admit it like any request.
  }
  PrefixMatch prefix = kv_cache_->FindCachedPrefix(req->tokens, req->spec.cache_salt,
                                                   /*record_stats=*/false, req->dp_rank);
  const int64_t remaining = static_cast<int64_t>(req->tokens.size()) - prefix.num_tokens;
  const int64_t num_new = std::min(remaining, budget);
  if (!kv_cache_->Allocate(req->id, prefix.num_tokens + num_new, &prefix, req->dp_rank)) return -1;
  // Count the lookup once, for the admission that succeeded.
  kv_cache_->FindCachedPrefix(req->tokens, req->spec.cache_salt, /*record_stats=*/true,
                              req->dp_rank);
  req->num_computed_tokens = prefix.num_tokens;
  req->num_cached_prompt_tokens = std::min(prefix.num_tokens, req->num_prompt_tokens());
  req->status = RequestStatus::kRunning;
  running_.push_back(req);
  return num_new;
}

FinishReason Scheduler::CheckStop(const Request& req) const {
  return CheckStopAt(req, static_cast<int64_t>(req.tokens.size()));
}

FinishReason Scheduler::CheckStopAt(const Request& req, int64_t len) const {
  const int32_t last = req.tokens[len - 1];
  if (!req.spec.ignore_eos &&
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), last) != eos_token_ids_.end()) {
    return FinishReason::kEos;
  }
  const auto& stops = req.spec.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), last) != stops.end()) return FinishReason::kStopToken;
  if (len - req.num_prompt_tokens() >= req.spec.max_tokens) return FinishReason::kLength;
  if (len >= config_.max_model_len) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

bool Scheduler::AdmitRemoteKv(Request* req) {
  const kvtransfer::RemoteKvSpec& remote = *req->spec.remote_kv;
  // tokens = prompt + first token, so the cap of FindCachedPrefix admits every full prompt block.
  PrefixMatch prefix = kv_cache_->FindCachedPrefix(req->tokens, req->spec.cache_salt,
                                                   /*record_stats=*/false, req->dp_rank);
  const int64_t external = connector_->GetNumNewMatchedTokens(req->id, remote, prefix.num_tokens);
  if (external <= 0) {
    connector_->DropRemote(remote);  // all of it is cached here: the source's copy can go
    req->spec.remote_kv.reset();
    return true;
  }
  if (!kv_cache_->Allocate(req->id, prefix.num_tokens + external, &prefix, req->dp_rank)) {
    return false;
  }
  kv_cache_->FindCachedPrefix(req->tokens, req->spec.cache_salt, /*record_stats=*/true,
                              req->dp_rank);
  req->num_computed_tokens = prefix.num_tokens;
  req->num_cached_prompt_tokens = std::min(prefix.num_tokens, req->num_prompt_tokens());
  connector_->UpdateStateAfterAlloc(req->id, remote, kv_cache_->BlockTable(req->id),
                                    prefix.num_tokens);
  req->status = RequestStatus::kLoadingRemoteKv;
  loading_[req->id] = req;
  return true;
}

int64_t Scheduler::Draft(Request* req, int64_t budget) {
  const SpeculativeConfig& spec = config_.speculative;
  // Only a request past its first output token drafts: the step that feeds the last prompt token
  // (a 1-token last prefill chunk) may capture that token's logits.
  if (!spec.enabled() || req->num_output_tokens() < 1) return 0;
  // Drafts plus the correction / bonus token never exceed max_tokens (so their positions stay
  // inside the KV the request was validated for) or the step's token budget.
  int64_t room = std::min({NextDraftLength(spec, &req->draft_length),
                           req->spec.max_tokens - req->num_output_tokens() - 1, budget - 1});
  if (spec.bench_hook != nullptr) room = std::min(room, spec.bench_hook->MaxDrafts(req->id));
  if (room <= 0) return 0;
  // A draft model or the MTP layer drafts after scheduling (SetDrafts): reserve `room` slots
  // with placeholders.
  std::vector<int32_t> drafts;
  if (spec.method == SpeculativeMethod::kDraft || spec.method == SpeculativeMethod::kMtp) {
    drafts.assign(room, req->tokens.back());
  } else {
    std::optional<std::vector<int32_t>> hooked;
    if (spec.bench_hook != nullptr) hooked = spec.bench_hook->Draft(req->id, req->tokens, room);
    drafts = hooked.has_value() ? *std::move(hooked) : NgramDraft(req->tokens, spec, room);
    if (static_cast<int64_t>(drafts.size()) > room) drafts.resize(room);
  }
  if (drafts.empty()) return 0;
  req->verify_input.assign(1, req->tokens.back());
  req->verify_input.insert(req->verify_input.end(), drafts.begin(), drafts.end());
  return static_cast<int64_t>(drafts.size());
}

bool Scheduler::MayDraftNext(const Request& req, bool batch_drafts) const {
  const SpeculativeConfig& spec = config_.speculative;
  // A prefill worker's request hands its prompt's MTP state on (MtpProposer::ExportPrompt).
  if (!spec.enabled() || req.spec.hold_kv_for_remote) return true;
  if (!batch_drafts || (spec.adaptive && req.draft_length.paused > 0)) return false;
  return spec.bench_hook == nullptr || spec.bench_hook->MaxDrafts(req.id) > 0;
}

void Scheduler::SetDrafts(absl::Span<const int32_t> drafts, ScheduledSeq* seq,
                          SchedulerOutput* output) {
  auto it = requests_.find(seq->request_id);
  if (it == requests_.end() || seq->num_draft_tokens == 0) return;
  Request* req = it->second.get();
  const int64_t k = std::min<int64_t>(seq->num_draft_tokens, static_cast<int64_t>(drafts.size()));
  output->num_batched_tokens -= seq->num_draft_tokens - k;
  seq->num_draft_tokens = k;
  if (k == 0) {  // a plain decode step of the last token
    seq->new_tokens = absl::MakeConstSpan(req->tokens).subspan(req->num_computed_tokens, 1);
    return;
  }
  req->verify_input.resize(1);
  req->verify_input.insert(req->verify_input.end(), drafts.begin(), drafts.begin() + k);
  seq->new_tokens = req->verify_input;
}

absl::Span<const int32_t> Scheduler::Tokens(int64_t request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second->tokens;
}

void Scheduler::ApplyVerify(const ScheduledSeq& seq, int32_t last_sample,
                            absl::Span<const int32_t> draft_samples, Request* req,
                            RequestUpdate* update) {
  const int64_t k = seq.num_draft_tokens;
  const absl::Span<const int32_t> drafts = seq.new_tokens.subspan(1);
  const int64_t accepted = AcceptedDraftLength(drafts, draft_samples);
  spec_stats_.verify_passes += 1;
  spec_stats_.drafted_tokens += static_cast<uint64_t>(k);
  spec_stats_.accepted_tokens += static_cast<uint64_t>(accepted);
  UpdateDraftLength(config_.speculative, k, accepted, &req->draft_length);
  // The request gains x_0 .. x_accepted: the accepted drafts (x_i == d_{i+1}) and the sample at
  // the first rejected position, or the bonus sample after the last draft. The KV of the fed
  // last token and of the accepted drafts is valid; the rejected drafts' slots are rewritten by
  // later steps (their positions are >= num_computed_tokens, never in a shared block).
  int64_t emitted = 0;
  for (int64_t i = 0; i <= accepted; ++i) {
    const int32_t token = i < k ? draft_samples[i] : last_sample;
    req->tokens.push_back(token);
    update->new_token_ids.push_back(token);
    ++emitted;
    update->finish_reason = CheckStop(*req);
    if (update->finish_reason != FinishReason::kNone) break;
  }
  req->num_computed_tokens += emitted;  // the last token and the accepted drafts before the cut
}

void Scheduler::MarkScheduled(Request* req) {
  if (req->scheduled) return;
  req->scheduled = true;
  if (req->spec.arrival == absl::InfinitePast()) return;
  queue_times_.push_back(std::max(absl::ZeroDuration(), absl::Now() - req->spec.arrival));
}

RequestUpdate Scheduler::MakeUpdate(const Request& req) const {
  RequestUpdate update;
  update.request_id = req.id;
  update.num_prompt_tokens = req.num_prompt_tokens();
  update.num_output_tokens = req.num_output_tokens();
  update.num_cached_prompt_tokens = req.num_cached_prompt_tokens;
  return update;
}

std::vector<RequestUpdate> Scheduler::ApplyConnectorResults(
    const kvtransfer::FinishedTransfers& finished, std::vector<kvtransfer::LoadError> errors) {
  std::vector<RequestUpdate> updates;
  for (int64_t id : finished.sending_done) {
    if (held_.erase(id) > 0) kv_cache_->Free(id);
  }
  for (int64_t id : finished.receiving_done) {
    auto it = loading_.find(id);
    if (it == loading_.end()) continue;
    Request* req = it->second;
    loading_.erase(it);
    if (req->abort_after_load) {
      kv_cache_->Free(id);
      requests_.erase(id);
      continue;
    }
    req->num_computed_tokens = req->spec.remote_kv->num_tokens;
    // The loaded blocks now hold this prefix's KV: share them like computed ones.
    kv_cache_->CacheBlocks(id, req->tokens, req->spec.cache_salt, req->num_computed_tokens);
    // The KV is local now and the source's lease is released (the connector did when the load
    // ended): a later preemption recomputes here. Keeping the spec made a preempted request read
    // the source's blocks again after the release, when they may hold another request's KV
    // (wrong tokens, and another tenant's data; tests/reliability kv_test, both pools tiny).
    req->spec.remote_kv.reset();
    req->status = RequestStatus::kRunning;
    running_.push_back(req);
  }
  for (kvtransfer::LoadError& error : errors) {
    auto it = loading_.find(error.request_id);
    if (it == loading_.end()) continue;
    Request* req = it->second;
    loading_.erase(it);
    // The load ended (connector contract), so its blocks are safe to free; none was cached.
    kv_cache_->Free(req->id);
    if (req->abort_after_load) {
      requests_.erase(req->id);
      continue;
    }
    req->spec.remote_kv.reset();
    req->num_computed_tokens = 0;
    req->num_cached_prompt_tokens = 0;
    if (req->spec.on_kv_failure == KvLoadFailurePolicy::kRecompute) {
      ++kv_recomputes_;
      req->status = RequestStatus::kWaiting;
      waiting_.push_front(req);
      continue;
    }
    RequestUpdate update = MakeUpdate(*req);
    update.finish_reason = FinishReason::kError;
    update.error = std::move(error.status);
    req->finish_reason = FinishReason::kError;
    requests_.erase(req->id);
    updates.push_back(std::move(update));
  }
  return updates;
}

void Scheduler::Finish(Request* req, FinishReason reason, RequestUpdate* update) {
  req->finish_reason = reason;
  req->status = RequestStatus::kFinished;
  if (connector_ != nullptr && req->spec.hold_kv_for_remote && reason == FinishReason::kLength) {
    absl::Span<const BlockId> table = kv_cache_->BlockTable(req->id);
    std::optional<kvtransfer::KvLease> lease =
        connector_->RequestFinished(req->id, req->spec.external_id, /*hold_for_remote=*/true,
                                    static_cast<int64_t>(table.size()), req->spec.lease_duration);
    if (lease.has_value()) {
      RequestUpdate::Lease held;
      held.lease = *lease;
      held.block_ids.assign(table.begin(), table.end());
      held.num_tokens = req->num_computed_tokens;
      update->kv_lease = std::move(held);
      held_.insert(req->id);
      return;
    }
  }
  FreeBlocks(req->id);
}

void Scheduler::FreeBlocks(int64_t id) {
  if (launched_tag_ != 0 && launched_ids_.contains(id)) {
    deferred_frees_.emplace_back(launched_tag_, id);
    return;
  }
  kv_cache_->Free(id);
}

std::vector<RequestUpdate> Scheduler::Update(const SchedulerOutput& output,
                                             absl::Span<const int32_t> sampled_tokens,
                                             std::vector<std::vector<float>>* prompt_logits,
                                             absl::Span<const std::vector<int32_t>> draft_samples) {
  std::vector<RequestUpdate> updates;
  bool any_finished = false;
  for (size_t i = 0; i < output.seqs.size(); ++i) {
    const ScheduledSeq& seq = output.seqs[i];
    auto it = requests_.find(seq.request_id);
    if (it == requests_.end()) continue;  // aborted after scheduling
    Request* req = it->second.get();
    if (req->status != RequestStatus::kRunning) continue;
    RequestUpdate update;
    update.request_id = req->id;
    if (seq.num_draft_tokens > 0) {
      // A backend without the drafts' samples wasted the step: nothing advances (Engine::Create
      // refuses speculation on such a backend, so this is a guard, not a path).
      if (seq.samples && i < sampled_tokens.size() && i < draft_samples.size() &&
          static_cast<int64_t>(draft_samples[i].size()) >= seq.num_draft_tokens) {
        ApplyVerify(seq, sampled_tokens[i], draft_samples[i], req, &update);
      }
    } else {
      req->num_computed_tokens += static_cast<int64_t>(seq.new_tokens.size());
    }
    if (seq.capture_prompt_logits && prompt_logits != nullptr && i < prompt_logits->size()) {
      req->last_prompt_logits = std::move((*prompt_logits)[i]);
      update.last_prompt_logits = req->last_prompt_logits;
    }
    if (seq.samples && seq.num_draft_tokens == 0 && i < sampled_tokens.size()) {
      req->tokens.push_back(sampled_tokens[i]);
      update.new_token_ids.push_back(sampled_tokens[i]);
      update.finish_reason = CheckStop(*req);
    }
    // Full blocks among the computed tokens become shareable.
    kv_cache_->CacheBlocks(req->id, req->tokens, req->spec.cache_salt, req->num_computed_tokens);
    update.num_prompt_tokens = req->num_prompt_tokens();
    update.num_output_tokens = req->num_output_tokens();
    update.num_cached_prompt_tokens = req->num_cached_prompt_tokens;
    if (update.finish_reason != FinishReason::kNone) {
      Finish(req, update.finish_reason, &update);
      any_finished = true;
    }
    if (!update.new_token_ids.empty() || update.finish_reason != FinishReason::kNone ||
        !update.last_prompt_logits.empty()) {
      updates.push_back(std::move(update));
    }
  }
  if (any_finished) DropFinished(updates);
  return updates;
}

void Scheduler::DropFinished(const std::vector<RequestUpdate>& updates) {
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](Request* r) { return r->status == RequestStatus::kFinished; }),
                 running_.end());
  for (const RequestUpdate& u : updates) {
    if (u.finish_reason != FinishReason::kNone) requests_.erase(u.request_id);
  }
}

StepShape ShapeOf(const SchedulerOutput& batch) {
  StepShape shape;
  shape.seqs = static_cast<int64_t>(batch.seqs.size());
  shape.tokens = batch.num_batched_tokens;
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t fed = static_cast<int64_t>(seq.new_tokens.size()) - seq.num_draft_tokens;
    shape.draft_tokens += seq.num_draft_tokens;
    if (fed == 1 && seq.num_computed_tokens > 0) {
      ++shape.decode_seqs;
    } else {
      shape.prefill_tokens += fed;
    }
  }
  return shape;
}

}  // namespace tandem::runtime
