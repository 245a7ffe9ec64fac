// Continuous-batching scheduler with chunked prefill and preemption by recompute.
//
// Each step:
//   1. Running requests first (decode first): each gets the tokens it still needs (1 for a
//      decode; the rest of its prompt, capped by the token budget, for a chunked prefill). When
//      the block pool cannot grow a request, the most recently admitted running request is
//      preempted (blocks freed, progress reset, put back at the head of the waiting queue) until
//      it fits; if the request itself is the latest, it is preempted and scheduling stops.
//   2. Then waiting requests in FCFS order while the token budget and max_num_seqs allow: each
//      takes its cached prefix from the prefix cache and schedules (a chunk of) the rest.
//      Waiting requests are never admitted by preempting running ones.
// Under data-parallel attention (KvCacheConfig::dp_size > 1; dp_rank.h) every DP rank has its own
// token budget, max_num_seqs and pool, as SGLang's DP attention: a rank that preempted or
// cannot admit its next waiting request stops only its own requests (FCFS within the rank),
// never the other ranks'.
//
// The scheduler owns requests and the KV cache manager (bookkeeping only); it never touches
// KV memory. Update() applies the model's sampled tokens and decides who finished.
//
// Thread safety: not thread-safe; the engine's step loop owns it.
#ifndef TANDEM_RUNTIME_ENGINE_SCHEDULER_H_
#define TANDEM_RUNTIME_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/connector.h"
#include "runtime/engine/request.h"
#include "runtime/engine/speculative.h"
#include "runtime/kv_cache/kv_cache_manager.h"

namespace tandem::runtime {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget per step (per DP rank)
  int64_t max_num_seqs = 256;             // running requests at most (per DP rank)
  int64_t max_model_len = 4096;           // prompt + output tokens per request
  // Off by default. When on, a decoding request feeds its last token plus up to K drafts
  // (speculative.h); drafts count against the token budget and never cause a preemption.
  SpeculativeConfig speculative;
};

// One request's share of a step, as the model runner needs it.
struct ScheduledSeq {
  int64_t request_id = 0;
  absl::Span<const int32_t> new_tokens;  // tokens[num_computed, num_computed + num_new)
  int64_t num_computed_tokens = 0;       // context already in the cache (start position)
  absl::Span<const BlockId> block_table;
  // True when this step processes the request's last known token, so its logits yield a token.
  bool samples = false;
  // True when this step processes the last prompt token and the caller wants its logits.
  bool capture_prompt_logits = false;
  kernels::SamplingParams sampling;
  int64_t sample_step = 0;  // output index of the token sampled this step (Philox counter)
  // Speculative decoding: the last num_draft_tokens of new_tokens are drafts. The executor then
  // samples at each of the last num_draft_tokens + 1 positions, position j with Philox counter
  // sample_step + j (RunnerOutput::draft_samples, sampled_tokens holding the last).
  int64_t num_draft_tokens = 0;
  // Speculative decoding with a draft model, sampling requests: the executor also returns the
  // logits of the num_draft_tokens + 1 sampled positions (RunnerOutput::verify_logits) for
  // rejection sampling against the draft's distributions (the engine sets it).
  bool return_verify_logits = false;
  // With return_verify_logits: the draft distributions q ([num_draft_tokens][vocab], the
  // engine's draft job) for executors that verify on their own device (the CUDA runner).
  absl::Span<const double> draft_probs;
  // Speculative decoding: false when the request cannot draft in the next step, whatever this
  // step yields (its adaptive draft length pauses past it, the batch is too large to draft, a
  // bench hook caps its drafts at 0); true otherwise and without speculation. The engine asks for
  // MTP hidden states only for sequences that may draft next (mtp_proposer.h).
  bool may_draft_next = true;
  // The MTP layer's own steps (mtp_proposer.h): the first zero_hidden_rows fed tokens pair with
  // a zero hidden state (positions whose target hidden state was never asked for) and have no row
  // in SchedulerOutput::input_hidden; the executor fills them with zeros (on the device for CUDA).
  int64_t zero_hidden_rows = 0;
  // Data-parallel attention (dp_rank.h): the DP rank that runs this sequence (its block ids are
  // in that rank's pool, KvCacheConfig::dp_size); 0 without.
  int64_t dp_rank = 0;
  // Async scheduling (Scheduler::MarkLaunched): >= 0 when the fed token (new_tokens holds
  // kPendingToken, one token) is the one the previous launched step sampled for its sequence of
  // this index; the executor takes it from that step's output (on the device for CUDA).
  int64_t input_from_prev_seq = -1;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;  // running (decode) first, then newly admitted
  int64_t num_batched_tokens = 0;
  int64_t num_preempted = 0;
  // Multi-token prediction (mtp_proposer.h; set by the engine, off otherwise): return every fed
  // token's final hidden state (RunnerOutput::hidden_states); and, on the MTP layer's own steps,
  // the hidden state paired with each fed token, [num_batched_tokens, hidden] in batch order.
  bool return_hidden_states = false;
  // With return_hidden_states: one row per sequence, its last fed token's ([seqs.size(), hidden],
  // what the MTP layer's chained drafts need), not every fed token's.
  bool return_last_hidden_only = false;
  // [num_batched_tokens - the sequences' zero_hidden_rows, hidden].
  absl::Span<const float> input_hidden;
  // Data-parallel attention (set by DpAttentionExecutor on each rank's part of the step): the
  // most sequences any DP rank runs when every DP rank's part decodes (one new token each, an
  // idle rank included), so that every rank can pad alike (the CUDA runner's graphs and fixed
  // MoE dispatch capacity); 0 when some DP rank prefills; -1: not a DP executor's part.
  int64_t dp_decode_seqs = -1;
  bool empty() const { return seqs.empty(); }
};

// What one step ran (the worker's step trace and step metrics): sequences, how many of them
// decode (one fed token besides drafts), the prompt tokens of the others, and draft tokens.
struct StepShape {
  int64_t seqs = 0;
  int64_t decode_seqs = 0;
  int64_t prefill_tokens = 0;  // fed tokens of the sequences that do not decode
  int64_t draft_tokens = 0;
  int64_t tokens = 0;  // SchedulerOutput::num_batched_tokens
  bool has_prefill() const { return decode_seqs < seqs; }
};
StepShape ShapeOf(const SchedulerOutput& batch);

// Per-request result of a step, returned by Update().
struct RequestUpdate {
  int64_t request_id = 0;
  // 0 or 1 token; up to K + 1 when a verify pass accepted drafts (cut at a stop condition).
  std::vector<int32_t> new_token_ids;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<float> last_prompt_logits;  // moved out once, when captured
  int64_t num_prompt_tokens = 0;
  int64_t num_output_tokens = 0;
  int64_t num_cached_prompt_tokens = 0;
  // Set when the request finished holding its KV for a remote reader (RequestSpec::
  // hold_kv_for_remote): the lease and the blocks it covers (num_tokens = prompt tokens whose KV
  // is in them).
  struct Lease {
    kvtransfer::KvLease lease;
    std::vector<int32_t> block_ids;
    int64_t num_tokens = 0;
  };
  std::optional<Lease> kv_lease;
  // With kv_lease on an engine with an MTP layer: its state of the prompt for the decode worker
  // (RequestSpec::mtp_handoff there); unset when none could be made (MtpProposer::ExportPrompt).
  std::optional<MtpHandoff> mtp_handoff;
  absl::Status error;  // set with FinishReason::kError
};

class Scheduler {
 public:
  // `connector` (may be null: no remote KV) must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, std::unique_ptr<KvCacheManager> kv_cache,
            std::vector<int32_t> eos_token_ids, kvtransfer::KvConnector* connector = nullptr);

  // Queues a request. REQUIRES: spec validated (Engine::AddRequest does it).
  // ALREADY_EXISTS for a duplicate id.
  absl::Status Add(int64_t request_id, RequestSpec spec);

  // Removes a waiting or running request and frees its blocks. A request whose KV is loading is
  // cancelled and goes (blocks freed) once the load has ended. Returns false if unknown.
  bool Abort(int64_t request_id);
  // Applies the connector's results (call before Schedule()): loaded requests start decoding,
  // failed loads recompute or fail (per request policy; returned as updates), ended leases free
  // their blocks.
  std::vector<RequestUpdate> ApplyConnectorResults(const kvtransfer::FinishedTransfers& finished,
                                                   std::vector<kvtransfer::LoadError> errors);

  SchedulerOutput Schedule();

  // Applies one step's results. sampled_tokens[i] belongs to output.seqs[i] (ignored unless
  // seqs[i].samples); prompt_logits[i] (possibly empty) to seqs[i] when capture_prompt_logits;
  // draft_samples[i] (seqs[i].num_draft_tokens > 0) the samples at the positions before each
  // draft (speculative.h). Returns one update per scheduled request that produced a token or
  // finished.
  std::vector<RequestUpdate> Update(const SchedulerOutput& output,
                                    absl::Span<const int32_t> sampled_tokens,
                                    std::vector<std::vector<float>>* prompt_logits,
                                    absl::Span<const std::vector<int32_t>> draft_samples = {});

  // Async scheduling (EngineConfig::async_scheduling, Engine::Step): a step is launched, the
  // next one scheduled, and only then the first one's tokens applied. MarkLaunched applies
  // `output` as launched: every sequence's tokens count as computed and a sampling one gets a
  // kPendingToken placeholder that the next Schedule() feeds (ScheduledSeq::input_from_prev_seq);
  // a request whose placeholder is its last token by length is not scheduled again. Returns the
  // step's tag. REQUIRES: no speculative decoding, one DP rank.
  uint64_t MarkLaunched(const SchedulerOutput& output);
  // Applies the tokens of the launched step `tag` (its `output`; only ids, counts and flags are
  // read: the spans may be stale), as Update() does: the placeholders take the sampled tokens,
  // stop conditions are checked on them, finished requests go. A finished or aborted request that
  // is also in a later launched step keeps its blocks until that step is resolved (its KV is
  // still being written); results for requests gone meanwhile are dropped.
  std::vector<RequestUpdate> Resolve(const SchedulerOutput& output, uint64_t tag,
                                     absl::Span<const int32_t> sampled_tokens,
                                     std::vector<std::vector<float>>* prompt_logits);
  // True when every running request can grow to all of its tokens without a preemption (the
  // engine resolves its launched step first otherwise: a preempted request must not hold a
  // placeholder).
  bool GrowsWithoutPreemption() const;

  // Speculative decoding with a draft model (SpeculativeMethod::kDraft): Schedule() reserves
  // num_draft_tokens slots per speculating request and feeds placeholders there; the engine then
  // puts the draft model's drafts in with SetDrafts (fewer, or none, shrink the sequence: none
  // makes it a plain decode step) before running the step.
  void SetDrafts(absl::Span<const int32_t> drafts, ScheduledSeq* seq, SchedulerOutput* output);
  // A running request's tokens (prompt + output so far); empty for an unknown id. Valid until the
  // next Update().
  absl::Span<const int32_t> Tokens(int64_t request_id) const;

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_loading() const { return static_cast<int64_t>(loading_.size()); }
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }
  // Queue times of the requests admitted for the first time (to run, or to load their remote
  // KV) since the last call: from RequestSpec::arrival to the Schedule() that admitted them.
  // Requests without an arrival time are not reported. A preempted or recomputed request is
  // counted once.
  std::vector<absl::Duration> TakeQueueTimes() {
    std::vector<absl::Duration> out;
    out.swap(queue_times_);
    return out;
  }
  // Requests whose remote KV failed to load and that were queued to prefill here instead
  // (KvLoadFailurePolicy::kRecompute).
  uint64_t num_kv_recomputes() const { return kv_recomputes_; }
  // Speculative decoding counters since the scheduler started.
  const SpecStats& spec_stats() const { return spec_stats_; }
  bool HasUnfinished() const { return !waiting_.empty() || !running_.empty() || !loading_.empty(); }
  const KvCacheManager& kv_cache() const { return *kv_cache_; }
  KvCacheManager& mutable_kv_cache() { return *kv_cache_; }
  // Attaches the connector (before the first request). May be null.
  void set_connector(kvtransfer::KvConnector* connector) { connector_ = connector; }

 private:
  // Frees `req`'s blocks and puts it back at the head of the waiting queue.
  void Preempt(Request* req);
  // Data-parallel attention: the DP rank for a request being added (dp_rank.h).
  int64_t AssignDpRank();
  // The newest running request whose blocks free room for `req` (its DP rank's), out of running_.
  Request* TakePreemptionVictim(const Request& req);
  FinishReason CheckStop(const Request& req) const;
  // Marks `req` finished and frees its blocks, or hands them to a lease (filling update->kv_lease).
  void Finish(Request* req, FinishReason reason, RequestUpdate* update);
  // Drops the finished requests of `updates` from running_ and requests_ (after an Update).
  void DropFinished(const std::vector<RequestUpdate>& updates);
  // Waiting request with remote KV: allocates and registers its load. False: no room now.
  bool AdmitRemoteKv(Request* req);
  // A waiting request (still in waiting_) within `budget` tokens: running (the tokens to
  // schedule), loading its remote KV (0), or -1 when there is no room now.
  int64_t AdmitWaiting(Request* req, int64_t budget);
  RequestUpdate MakeUpdate(const Request& req) const;
  // A decoding request's drafts for this step (at most `budget` - 1 of them), in
  // req->verify_input after its last token; 0 when it does not speculate.
  int64_t Draft(Request* req, int64_t budget);
  // ScheduledSeq::may_draft_next of `req` once this step's Draft has run; `batch_drafts`: this
  // step's batch-level switch (taken as the next step's).
  bool MayDraftNext(const Request& req, bool batch_drafts) const;
  // Applies a verify pass to `req` (num_computed_tokens not yet advanced): appends the accepted
  // drafts and the correction / bonus token, stopping at a stop condition, into `update`.
  void ApplyVerify(const ScheduledSeq& seq, int32_t last_sample,
                   absl::Span<const int32_t> draft_samples, Request* req, RequestUpdate* update);
  // `req` was admitted: the first time, its queue time is reported (TakeQueueTimes).
  void MarkScheduled(Request* req);
  // Schedule()'s steps. ScheduleStep (scheduler.cc) holds one call's output and per-DP-rank
  // token budgets. ScheduleRunning: step 1 (running requests, preempting to grow);
  // ScheduleWaiting: step 2 (admits waiting requests on ranks that preempted nobody).
  struct ScheduleStep;
  void ScheduleRunning(ScheduleStep* step);
  void ScheduleWaiting(ScheduleStep* step);
  // Grows `req`'s blocks to hold `num_new` more tokens, preempting the newest running requests
  // of its DP rank; false when `req` itself was preempted (it is then out of running_).
  bool GrowOrPreempt(Request* req, int64_t num_new, ScheduleStep* step);
  // Schedules `num_new` tokens of `req` (past its tokens: its drafts) into `step`.
  void AddSeq(Request* req, int64_t num_new, ScheduleStep* step);
  // Stop condition of `req` as if its tokens were the first `len` (Update: all of them).
  FinishReason CheckStopAt(const Request& req, int64_t len) const;
  // Frees request `id`'s blocks now, or once the launched step holding it is resolved.
  void FreeBlocks(int64_t id);

  const SchedulerConfig config_;
  std::unique_ptr<KvCacheManager> kv_cache_;
  const std::vector<int32_t> eos_token_ids_;
  absl::flat_hash_map<int64_t, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;                   // admission order
  absl::flat_hash_map<int64_t, Request*> loading_;  // remote KV in flight
  absl::flat_hash_set<int64_t> held_;               // finished, blocks under a lease
  kvtransfer::KvConnector* connector_;
  std::vector<absl::Duration> queue_times_;
  uint64_t kv_recomputes_ = 0;
  int64_t last_dp_rank_ = -1;  // data-parallel attention: the previous pick (round robin)
  SpecStats spec_stats_;
  // Async scheduling: the newest launched, unresolved step (its tag and request ids; tag 0: none)
  // and blocks waiting for a step to be resolved (tag, request id).
  uint64_t last_tag_ = 0;
  uint64_t launched_tag_ = 0;
  absl::flat_hash_set<int64_t> launched_ids_;
  std::vector<std::pair<uint64_t, int64_t>> deferred_frees_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_SCHEDULER_H_
