#include "runtime/worker/worker.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "tandem/v1/limits.h"

namespace tandem::runtime {
namespace {

// How long a call waits for the next update before asking whether its caller is still there.
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

}  // namespace

const char* RoleName(tandem::v1::WorkerRole role) {
  switch (role) {
    case tandem::v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case tandem::v1::WORKER_ROLE_DECODE:
      return "decode";
    case tandem::v1::WORKER_ROLE_MIXED:
      return "mixed";
    default:
      return "unspecified";
  }
}

Worker::Worker(EngineLoop* loop, kvtransfer::KvLeaseTable* leases,
               kvtransfer::KvConnectorMetrics* kv_metrics, kvtransfer::KvSourceLinks* links,
               WorkerOptions options)
    : loop_(loop),
      leases_(leases),
      kv_metrics_(kv_metrics),
      links_(links),
      options_(std::move(options)),
      first_token_(http::LatencyBuckets()),
      inter_token_(http::InterTokenBuckets()),
      e2e_(http::LatencyBuckets()) {
  address_ = options_.address;
}

void Worker::SetAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  address_ = address;
}

std::string Worker::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

tandem::v1::ServingStatus Worker::status() const {
  if (draining_) return tandem::v1::SERVING_STATUS_DRAINING;
  if (KvUnhealthy()) return tandem::v1::SERVING_STATUS_NOT_SERVING;
  // A worker group with a dead or wedged rank cannot run a step again.
  if (!loop_->ExecutorHealth().ok()) return tandem::v1::SERVING_STATUS_NOT_SERVING;
  return tandem::v1::SERVING_STATUS_SERVING;
}

bool Worker::KvUnhealthy() const {
  if (kv_metrics_ == nullptr || options_.kv_failures_unhealthy <= 0) return false;
  const kvtransfer::KvConnectorStats stats = kv_metrics_->Stats();
  const uint64_t failures = stats.load_failures + kv_link_failures_.load();
  absl::MutexLock lock(&health_mu_);
  if (stats.loads_completed > seen_completed_) failure_streak_ = 0;  // a load worked
  failure_streak_ += static_cast<int64_t>(failures - seen_failures_);
  seen_completed_ = stats.loads_completed;
  seen_failures_ = failures;
  const absl::Time now = absl::Now();
  if (failure_streak_ < options_.kv_failures_unhealthy) return false;
  if (unhealthy_since_ == absl::InfinitePast()) {
    unhealthy_since_ = now;
    LOG(WARNING) << "worker " << options_.worker_id << ": the last " << failure_streak_
                 << " KV loads failed; reporting NOT_SERVING (probing again in "
                 << options_.kv_unhealthy_probe << ")";
  }
  if (now - unhealthy_since_ < options_.kv_unhealthy_probe) return true;
  // Probe: serve again; the next failures (or a success) decide.
  failure_streak_ = 0;
  unhealthy_since_ = absl::InfinitePast();
  return false;
}

absl::Status Worker::Admit(tandem::v1::WorkerRole needed, const char* rpc) const {
  if (draining_) {
    return absl::UnavailableError(absl::StrCat("worker ", options_.worker_id, " is draining"));
  }
  if (options_.role != needed && options_.role != tandem::v1::WORKER_ROLE_MIXED) {
    return absl::FailedPreconditionError(absl::StrCat(rpc, " needs a ", RoleName(needed),
                                                      " or mixed worker; ", options_.worker_id,
                                                      " is ", RoleName(options_.role)));
  }
  return absl::OkStatus();
}

// Checks the decode worker a lease is to be bound to (Prefill, ReassignLease).
absl::Status Worker::CheckReader(const std::string& decode_worker_id) const {
  if (decode_worker_id.size() > static_cast<size_t>(tandem::v1::kMaxIdBytes)) {
    return absl::InvalidArgumentError("decode_worker_id is too long");
  }
  if (decode_worker_id.empty() && options_.require_decode_worker) {
    return absl::InvalidArgumentError(
        "decode_worker_id is required: the KV lease is bound to the decode worker it is for");
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefillResult> Worker::Prefill(const std::string& id, RequestSpec spec,
                                              bool remote_decode, absl::Duration lease,
                                              const CallerGone& gone,
                                              const std::string& decode_worker_id) {
  const bool hold = remote_decode && spec.max_tokens > 1;
  if (hold && leases_ == nullptr) {
    return absl::FailedPreconditionError("this worker has no KV transfer");
  }
  if (remote_decode) RETURN_IF_ERROR(CheckReader(decode_worker_id));
  if (hold) {
    spec.hold_kv_for_remote = true;
    spec.lease_duration =
        lease > absl::ZeroDuration() ? std::min(lease, options_.max_lease) : options_.default_lease;
  }
  // P computes the prompt and the first token; D does the rest. Validate the whole request
  // first so P never holds KV for something D must refuse.
  const int64_t max_tokens = spec.max_tokens;
  if (static_cast<int64_t>(spec.prompt.size()) + max_tokens > loop_->max_model_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", spec.prompt.size(), " tokens) + max_tokens (", max_tokens,
                     ") exceeds the model's maximum length ", loop_->max_model_len()));
  }
  spec.max_tokens = 1;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = loop_->Submit(id, std::move(spec));
  if (!stream.ok()) return stream.status();
  PrefillResult result;
  RequestUpdate& update = result.first;
  while (true) {
    if (gone()) {
      // Still in the engine: the abort frees its KV (and a lease granted meanwhile). Already
      // ended: its final update, queued here, holds the only word of its lease.
      if (!loop_->Abort(id)) {
        while ((*stream)->Next(&update, absl::ZeroDuration())) {
          if (update.kv_lease.has_value() && leases_ != nullptr) {
            leases_->ReleaseLease(update.kv_lease->lease.lease_id);
          }
        }
      }
      return absl::CancelledError("client cancelled the prefill");
    }
    if (!(*stream)->Next(&update, kPollSlice)) continue;
    if (update.finish_reason != FinishReason::kNone) break;
  }
  if (update.finish_reason == FinishReason::kAborted) {
    return absl::CancelledError(absl::StrCat("request ", id, " was aborted"));
  }
  if (update.finish_reason == FinishReason::kError) return update.error;
  const absl::Duration took = absl::Now() - start;
  first_token_.Observe(absl::ToDoubleSeconds(took));
  e2e_.Observe(absl::ToDoubleSeconds(took));
  result.times.set_prefill_micros(Micros(took));
  if (!update.kv_lease.has_value()) return result;  // ended at its first token: nothing to hand
  const RequestUpdate::Lease& held = *update.kv_lease;
  // Make the held blocks readable by peers (device -> host mirror where the agent stages GPU
  // memory) before anyone learns of them.
  if (const absl::Status ready = leases_->PrepareForRemoteRead(held.block_ids); !ready.ok()) {
    leases_->ReleaseLease(held.lease.lease_id);  // the blocks cannot be served
    return ready;
  }
  // The lease serves exactly this request's blocks, to the decode worker the router named.
  if (const absl::Status bound = leases_->BindLease(
          held.lease.lease_id, {decode_worker_id, id, held.block_ids, held.num_tokens});
      !bound.ok()) {
    leases_->ReleaseLease(held.lease.lease_id);  // e.g. aborted meanwhile: nothing to hand
    return bound;
  }
  kvtransfer::KvSource source;
  source.worker_id = options_.worker_id;
  source.epoch = options_.epoch;
  source.layout_hash = options_.kv_layout_hash;
  source.transfer_endpoint = address();
  result.kv_handle =
      kvtransfer::ToKvHandle(source, held.lease, held.block_ids, held.num_tokens, id);
  update.finish_reason = FinishReason::kNone;  // it goes on at the decode worker
  // The caller left while the prompt ended (a router that gave up on this worker while it was
  // stopped): nobody will read the handle, so the lease must not wait for its expiry.
  if (gone()) {
    leases_->ReleaseLease(held.lease.lease_id);
    return absl::CancelledError("client cancelled the prefill");
  }
  return result;
}

absl::Status Worker::Relay(const std::string& id, RequestStream& stream, absl::Time start,
                           const CallerGone& gone, const UpdateSink& sink,
                           tandem::v1::WorkerPhaseTimes* times) {
  absl::Time last = absl::InfinitePast();
  while (true) {
    if (gone()) {
      loop_->Abort(id);
      return absl::CancelledError("client cancelled");
    }
    RequestUpdate update;
    if (!stream.Next(&update, kPollSlice)) continue;
    if (update.finish_reason == FinishReason::kError) {
      return absl::UnavailableError(
          absl::StrCat("request ", id, " failed: ", update.error.message()));
    }
    const bool finished = update.finish_reason != FinishReason::kNone;
    if (update.new_token_ids.empty() && !finished) continue;
    const absl::Time now = absl::Now();
    if (!update.new_token_ids.empty()) {
      if (last == absl::InfinitePast()) {
        first_token_.Observe(absl::ToDoubleSeconds(now - start));
        if (times != nullptr) times->set_first_token_micros(Micros(now - start));
      } else {
        inter_token_.Observe(absl::ToDoubleSeconds(now - last));
      }
      last = now;
    }
    if (finished) e2e_.Observe(absl::ToDoubleSeconds(now - start));
    if (finished && times != nullptr) {
      times->set_decode_micros(Micros(now - start));
      if (kv_metrics_ != nullptr) {
        if (std::optional<kvtransfer::KvLoadRecord> load =
                kv_metrics_->TakeLoadRecord(stream.engine_id());
            load.has_value()) {
          times->set_kv_load_micros(load->micros);
          times->set_kv_bytes(load->bytes);
        }
      }
    }
    if (!sink(update)) {
      loop_->Abort(id);
      return absl::CancelledError("client went away");
    }
    if (finished) return absl::OkStatus();
  }
}

absl::Status Worker::Decode(const std::string& id, RequestSpec spec,
                            const tandem::v1::KvHandle& handle, int32_t first_token,
                            KvLoadFailurePolicy on_kv_failure, const CallerGone& gone,
                            const UpdateSink& sink, tandem::v1::WorkerPhaseTimes* times) {
  if (leases_ == nullptr || links_ == nullptr) {
    return absl::FailedPreconditionError("this worker has no KV transfer");
  }
  if (absl::Status valid = kvtransfer::ValidateKvHandle(handle, options_.kv_layout_hash);
      !valid.ok()) {
    return valid;
  }
  if (handle.request_id() != id) {
    return absl::InvalidArgumentError(absl::StrCat("KV handle was issued for request '",
                                                   handle.request_id(), "', not '", id, "'"));
  }
  spec.first_token = first_token;
  spec.on_kv_failure = on_kv_failure;
  bool recompute = false;  // the source is unreachable: this worker prefills the prompt
  const absl::Time link_start = absl::Now();
  // The source must honour the handle for this request and this worker before a byte moves, and
  // before it describes its pool to us (a handshake answers only a worker it holds a lease for):
  // a restarted source says so (stale: recompute), a lease that is gone is NOT_FOUND
  // (recompute), one that is not ours PERMISSION_DENIED (refused).
  absl::Status linked = links_->AuthorizeRead(handle);
  if (linked.ok()) linked = links_->EnsurePeer(handle);
  if (times != nullptr) times->set_kv_link_micros(Micros(absl::Now() - link_start));
  if (absl::IsPermissionDenied(linked)) {
    LOG(WARNING) << "request " << id << ": KV source " << handle.worker_id()
                 << " does not honour its handle for this worker: " << linked;
    return absl::PermissionDeniedError(absl::StrCat(
        "KV handle of request ", id, " is not honoured for this worker: ", linked.message()));
  }
  if (linked.ok()) {
    // From here on the connector owns the source's lease: it stops reading a little before the
    // lease deadline, renews it while a long load runs, and releases it when the load has ended.
    spec.remote_kv = kvtransfer::ToRemoteKvSpec(handle, absl::Now() + options_.kv_load_timeout,
                                                links_->lease_client());
  } else {
    ++kv_link_failures_;
    LOG(WARNING) << "request " << id << ": cannot reach KV source " << handle.worker_id() << ": "
                 << linked;
    // The source's lease is released anyway: a source known from before that is only slow to
    // answer gets it when it answers again (the release is retried); else it expires.
    links_->lease_client()->ReleaseLeaseAsync(handle.worker_id(), handle.epoch(),
                                              handle.lease_id());
    if (on_kv_failure == KvLoadFailurePolicy::kFail) {
      return absl::UnavailableError(
          absl::StrCat("KV of request ", id, " is unavailable: ", linked.message()));
    }
    // Recompute: prefill prompt + first token here.
    recompute = true;
  }
  std::optional<kvtransfer::RemoteKvSpec> remote = spec.remote_kv;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = loop_->Submit(id, std::move(spec));
  if (!stream.ok()) {
    if (remote.has_value()) kvtransfer::ReleaseSourceLease(*remote);  // never reached the engine
    return stream.status();
  }
  if (recompute) ++kv_link_recomputes_;
  if (times != nullptr) times->set_kv_recomputed(recompute);
  return Relay(id, **stream, start, gone, sink, times);
}

absl::Status Worker::Generate(const std::string& id, RequestSpec spec, const CallerGone& gone,
                              const UpdateSink& sink, tandem::v1::WorkerPhaseTimes* times) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = loop_->Submit(id, std::move(spec));
  if (!stream.ok()) return stream.status();
  return Relay(id, **stream, start, gone, sink, times);
}

Worker::Latencies Worker::LatencySnapshots() const {
  http::HistogramSnapshot kv_load =
      kv_metrics_ != nullptr ? kv_metrics_->Stats().load_seconds : http::HistogramSnapshot{};
  if (kv_load.bounds.empty()) kv_load = http::Histogram(http::LatencyBuckets()).Snapshot();
  return {first_token_.Snapshot(),    inter_token_.Snapshot(), e2e_.Snapshot(),
          loop_->QueueTimeSnapshot(), std::move(kv_load),      loop_->StepSnapshot()};
}

absl::Status Worker::ReassignLease(const std::string& id, uint64_t lease_id,
                                   const std::string& decode_worker_id) {
  if (leases_ == nullptr) return absl::FailedPreconditionError("this worker has no KV transfer");
  RETURN_IF_ERROR(CheckReader(decode_worker_id));
  return leases_->ReassignLease(id, lease_id, decode_worker_id);
}

bool Worker::Abort(const std::string& id) {
  bool found = loop_->Abort(id);
  // A prefilled request whose decode will not happen: give its blocks back now.
  if (leases_ != nullptr) found |= leases_->ReleaseLeaseOf(id);
  return found;
}

tandem::v1::WorkerInfo Worker::Info() const {
  tandem::v1::WorkerInfo info;
  info.set_worker_id(options_.worker_id);
  info.set_address(address());
  info.set_role(options_.role);
  info.set_epoch(options_.epoch);
  info.set_model_id(options_.model_id);
  const ModelConfig& model = loop_->model_config();
  info.set_vocab_size(static_cast<uint32_t>(model.vocab_size));
  info.set_max_model_len(static_cast<uint32_t>(loop_->max_model_len()));
  info.set_block_size(static_cast<uint32_t>(loop_->block_size()));
  info.set_kv_layout_hash(options_.kv_layout_hash);
  info.set_kv_dtype(options_.kv_dtype);
  for (int32_t eos : model.eos_token_ids) info.add_eos_token_ids(static_cast<uint32_t>(eos));
  if (options_.group.size() > 1) *info.mutable_group() = options_.group;
  return info;
}

tandem::v1::WorkerLoad Worker::Load() const {
  const EngineLoopStats stats = loop_->Stats();
  tandem::v1::WorkerLoad load;
  load.set_num_running(static_cast<uint32_t>(stats.num_running));
  load.set_num_waiting(static_cast<uint32_t>(stats.num_waiting));
  load.set_kv_blocks_total(static_cast<uint32_t>(stats.kv.num_blocks));
  load.set_kv_blocks_free(static_cast<uint32_t>(stats.kv.num_free_blocks));
  if (kv_metrics_ != nullptr) {
    load.set_kv_blocks_leased(static_cast<uint32_t>(kv_metrics_->Stats().blocks_leased));
  }
  return load;
}

tandem::v1::WorkerStats Worker::StatsProto() const {
  tandem::v1::WorkerStats out;
  *out.mutable_info() = Info();
  out.set_status(status());
  *out.mutable_load() = Load();
  const EngineLoopStats stats = loop_->Stats();
  out.set_prefix_cache_queried_tokens(stats.kv.prefix_queried_tokens);
  out.set_prefix_cache_hit_tokens(stats.kv.prefix_hit_tokens);
  out.set_requests_finished(stats.requests_finished);
  out.set_requests_aborted(stats.requests_aborted);
  uint64_t load_failures = kv_link_failures_;
  if (kv_metrics_ != nullptr) {
    const kvtransfer::KvConnectorStats c = kv_metrics_->Stats();
    out.set_leases_granted(c.leases_granted);
    out.set_leases_released(c.leases_released);
    out.set_leases_expired(c.leases_expired);
    out.set_kv_bytes_received(c.bytes_loaded);
    out.set_kv_load_micros(c.load_micros);
    out.set_kv_loads_completed(c.loads_completed);
    load_failures += c.load_failures;
  }
  out.set_kv_load_failures(load_failures);
  out.set_kv_recomputes(kv_link_recomputes_ + stats.kv_recomputes);
  out.set_spec_verify_passes(stats.spec.verify_passes);
  out.set_spec_draft_tokens(stats.spec.drafted_tokens);
  out.set_spec_accepted_tokens(stats.spec.accepted_tokens);
  out.set_spec_mtp_handoffs(stats.mtp_handoffs);
  for (uint64_t n : stats.moe_expert_tokens) out.add_moe_expert_tokens(n);
  for (int64_t free : stats.kv.free_blocks_per_shard) out.add_kv_free_blocks_per_shard(free);
  if (options_.rank_kv_stats) options_.rank_kv_stats(&out);
  // kv_bytes_sent stays 0: in pull mode the reader's one-sided READs are invisible to the source
  // (its readers report kv_bytes_received).
  return out;
}

}  // namespace tandem::runtime
