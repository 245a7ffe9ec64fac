// A generation request as the engine tracks it: what was asked, and how far it got.
//
// The scheduler owns Request objects; the model runner reads the few fields it needs through
// ScheduledSeq (scheduler.h) and never sees this type's policy fields.
#ifndef TANDEM_RUNTIME_ENGINE_REQUEST_H_
#define TANDEM_RUNTIME_ENGINE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/sampling/sampling.h"
#include "kvtransfer/connector.h"
#include "runtime/engine/speculative.h"

namespace tandem::runtime {

enum class FinishReason {
  kNone,       // still running
  kLength,     // max_tokens generated
  kEos,        // the model's eos token (unless ignore_eos)
  kStopToken,  // one of stop_token_ids
  kAborted,
  kError,  // the request could not continue (e.g. its remote KV failed to load, policy fail)
};

// What a decode worker does when a request's remote KV cannot be loaded.
enum class KvLoadFailurePolicy {
  kRecompute,  // prefill the prompt locally
  kFail,       // finish the request with FinishReason::kError and the load's status
};

const char* FinishReasonName(FinishReason reason);

// MTP drafting across prefill -> decode (mtp_proposer.h): what the prefill worker's MTP layer
// computed over a prompt of L tokens, for the decode worker's MTP layer: its latent KV rows of
// positions 0 .. L - 2 (position i made from the pair (t_{i+1}, h_i)) and the target's final
// hidden state h_{L-1} (paired on the decode worker with the first token t_L).
struct MtpHandoff {
  int64_t num_positions = 0;       // L - 1
  int64_t row_width = 0;           // floats per latent row (kv_lora_rank + qk_rope_head_dim)
  std::vector<float> latent_rows;  // [num_positions, row_width]
  std::vector<float> last_hidden;  // [hidden_size]
};

// What a caller asks for. Validated by Engine::AddRequest.
struct RequestSpec {
  // The caller's (router's) id of the request, carried along for the connector's lease lookup
  // and for logs; may be empty. The engine's own key is the int64 id of AddRequest.
  std::string external_id;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  kernels::SamplingParams sampling;  // temperature 0 = greedy; seed for reproducible sampling
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::string cache_salt;  // isolates prefix-cache sharing between tenants
  bool capture_last_prompt_logits = false;

  // Disaggregated serving, source side (P): when the request finishes by length, keep its KV
  // blocks under a lease of lease_duration for a remote reader instead of freeing them; the
  // update reports the lease (RequestUpdate::kv_lease).
  bool hold_kv_for_remote = false;
  absl::Duration lease_duration = absl::Seconds(30);

  // Disaggregated serving, destination side (D): the prompt's KV lives on another worker; the
  // request starts with `first_token` (sampled there) as its first output token, loads the
  // prompt's KV through the connector, then decodes.
  std::optional<kvtransfer::RemoteKvSpec> remote_kv;
  int32_t first_token = -1;
  KvLoadFailurePolicy on_kv_failure = KvLoadFailurePolicy::kRecompute;
  // With an MTP layer attached (speculative_method=mtp): the prefill worker's MTP state of the
  // prompt (RequestUpdate::mtp_handoff there); without it the prompt's positions enter the MTP's
  // KV with zero hidden states (exact, lower acceptance). Ignored by an engine without MTP.
  std::optional<MtpHandoff> mtp_handoff;

  // When the request reached the worker (EngineLoop::Submit sets it): the scheduler reports the
  // time from it to the request's first admission (Scheduler::TakeQueueTimes). InfinitePast:
  // not measured.
  absl::Time arrival = absl::InfinitePast();
};

enum class RequestStatus {
  kWaiting,
  kLoadingRemoteKv,  // blocks allocated, waiting for the connector's load to end
  kRunning,
  kFinished,
};

// Async scheduling: stands in `Request::tokens` for a token sampled on the device and not yet
// read back (never fed to a model: the executor takes the real one from the previous step).
inline constexpr int32_t kPendingToken = -1;

struct Request {
  int64_t id = 0;
  RequestSpec spec;
  // prompt followed by the generated tokens so far.
  std::vector<int32_t> tokens;
  // Tokens whose K/V are in the cache (computed or taken from the prefix cache).
  int64_t num_computed_tokens = 0;
  // Prompt tokens served from the prefix cache at the last (re)admission.
  int64_t num_cached_prompt_tokens = 0;
  int64_t num_preemptions = 0;
  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<float> last_prompt_logits;  // filled once when captured
  // Aborted while its KV was loading: waits (in the loading set) for the load to end, then goes.
  bool abort_after_load = false;
  // Admitted by the scheduler at least once (to run, or to load its remote KV).
  bool scheduled = false;
  // Speculative decoding: this step's verify input, [last token, drafts...] (the scheduled
  // sequence's new_tokens point here until Update).
  std::vector<int32_t> verify_input;
  // Speculative decoding: this request's adaptive draft length (speculative.h).
  DraftLengthState draft_length;
  // Data-parallel attention (dp_rank.h): the group rank running this request's attention and
  // holding its KV, fixed when it is added; 0 without.
  int64_t dp_rank = 0;
  // Async scheduling (EngineConfig::async_scheduling): the index in `tokens` of the placeholder
  // (kPendingToken) for the token that the launched, not yet collected step samples for this
  // request, and this request's sequence index in that step; -1: none.
  int64_t pending_index = -1;
  int64_t pending_seq = -1;

  int64_t num_prompt_tokens() const { return static_cast<int64_t>(spec.prompt.size()); }
  int64_t num_output_tokens() const {
    return static_cast<int64_t>(tokens.size()) - num_prompt_tokens();
  }
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_REQUEST_H_
