#include "runtime/worker/worker_service.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "glog/logging.h"
#include "tandem/v1/limits.h"

namespace tandem::runtime {
namespace {

using tandem::v1::GenerateResponse;

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

void FillUsage(const RequestUpdate& u, tandem::v1::Usage* usage) {
  usage->set_prompt_tokens(static_cast<uint32_t>(u.num_prompt_tokens));
  usage->set_completion_tokens(static_cast<uint32_t>(u.num_output_tokens));
  usage->set_cached_prompt_tokens(static_cast<uint32_t>(u.num_cached_prompt_tokens));
}

// How long a handler waits for the next update before re-checking its client.
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);

}  // namespace

tandem::v1::FinishReason FinishReasonToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return tandem::v1::FINISH_REASON_EOS;
    case FinishReason::kStopToken:
      return tandem::v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kAborted:
    case FinishReason::kError:
      return tandem::v1::FINISH_REASON_ABORTED;
    case FinishReason::kNone:
      break;
  }
  return tandem::v1::FINISH_REASON_UNSPECIFIED;
}

absl::StatusOr<RequestSpec> SpecFromProto(const tandem::v1::GenerateRequest& request) {
  if (request.request_id().empty() || request.request_id().size() > tandem::v1::kMaxIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id must have 1..", tandem::v1::kMaxIdBytes, " bytes"));
  }
  if (request.prompt_token_ids_size() > tandem::v1::kMaxPromptTokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", request.prompt_token_ids_size(),
                                                   " tokens; the limit is ",
                                                   tandem::v1::kMaxPromptTokens));
  }
  const tandem::v1::SamplingParams& sp = request.sampling();
  if (sp.stop_token_ids_size() > tandem::v1::kMaxStopTokenIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", tandem::v1::kMaxStopTokenIds, " stop token ids"));
  }
  if (request.cache_salt().size() > tandem::v1::kMaxIdBytes) {
    return absl::InvalidArgumentError("cache_salt is too long");
  }
  constexpr uint32_t kMaxId = std::numeric_limits<int32_t>::max();
  RequestSpec spec;
  spec.prompt.reserve(request.prompt_token_ids_size());
  for (uint32_t t : request.prompt_token_ids()) {
    if (t > kMaxId) return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is invalid"));
    spec.prompt.push_back(static_cast<int32_t>(t));
  }
  for (uint32_t t : sp.stop_token_ids()) {
    if (t > kMaxId) return absl::InvalidArgumentError(absl::StrCat("stop id ", t, " is invalid"));
    spec.stop_token_ids.push_back(static_cast<int32_t>(t));
  }
  spec.max_tokens = sp.max_tokens();
  spec.sampling.temperature = sp.temperature();
  spec.sampling.top_p = sp.top_p() == 0.0f ? 1.0f : sp.top_p();
  spec.sampling.top_k = static_cast<int32_t>(std::min<uint32_t>(sp.top_k(), kMaxId));
  // Without a seed, sampling is still reproducible per request id on this worker.
  spec.sampling.seed = sp.has_seed() ? sp.seed() : std::hash<std::string>()(request.request_id());
  spec.ignore_eos = sp.ignore_eos();
  spec.cache_salt = request.cache_salt();
  return spec;
}

WorkerServiceImpl::WorkerServiceImpl(EngineLoop* loop, kvtransfer::KvConnector* connector,
                                     kvtransfer::PeerLinks* peers, WorkerOptions options)
    : loop_(loop), connector_(connector), peers_(peers), options_(std::move(options)) {
  address_ = options_.address;
}

void WorkerServiceImpl::SetAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  address_ = address;
}

std::string WorkerServiceImpl::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

tandem::v1::ServingStatus WorkerServiceImpl::status() const {
  return draining_ ? tandem::v1::SERVING_STATUS_DRAINING : tandem::v1::SERVING_STATUS_SERVING;
}

grpc::Status WorkerServiceImpl::Admit(tandem::v1::WorkerRole needed, const char* rpc) const {
  if (draining_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("worker ", options_.worker_id, " is draining"));
  }
  if (options_.role != needed && options_.role != tandem::v1::WORKER_ROLE_MIXED) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat(rpc, " needs a ", RoleName(needed), " or mixed worker; ",
                                     options_.worker_id, " is ", RoleName(options_.role)));
  }
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Prefill(grpc::ServerContext* context,
                                        const tandem::v1::PrefillRequest* request,
                                        tandem::v1::PrefillResponse* response) {
  grpc::Status admitted = Admit(tandem::v1::WORKER_ROLE_PREFILL, "Prefill");
  if (!admitted.ok()) return admitted;
  absl::StatusOr<RequestSpec> spec = SpecFromProto(request->request());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::string& id = request->request().request_id();
  const bool hold = request->remote_decode() && spec->max_tokens > 1;
  if (hold && connector_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no KV transfer");
  }
  // P computes the prompt and the first token; D does the rest. Validate the whole request
  // first so P never holds KV for something D must refuse.
  if (hold) {
    spec->hold_kv_for_remote = true;
    spec->lease_duration =
        request->lease_ms() > 0 ? absl::Milliseconds(request->lease_ms()) : options_.default_lease;
  }
  const int64_t original_max_tokens = spec->max_tokens;
  if (spec->prompt.size() + original_max_tokens > static_cast<size_t>(loop_->max_model_len())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("prompt (", spec->prompt.size(), " tokens) + max_tokens (",
                                     original_max_tokens, ") exceeds the model's maximum length ",
                                     loop_->max_model_len()));
  }
  spec->max_tokens = 1;
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = loop_->Submit(id, *std::move(spec));
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  RequestUpdate update;
  while (true) {
    if (context->IsCancelled()) {
      loop_->Abort(id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the prefill");
    }
    if (!(*stream)->Next(&update, kPollSlice)) continue;
    if (update.finish_reason != FinishReason::kNone) break;
  }
  if (update.finish_reason == FinishReason::kAborted) {
    return grpc::Status(grpc::StatusCode::CANCELLED, absl::StrCat("request ", id, " was aborted"));
  }
  if (update.finish_reason == FinishReason::kError) return ToGrpcStatus(update.error);
  response->set_request_id(id);
  if (!update.new_token_ids.empty()) response->set_first_token(update.new_token_ids[0]);
  FillUsage(update, response->mutable_usage());
  if (!update.kv_lease.has_value()) {
    // Finished at the first token (eos, stop token, or max_tokens 1): nothing to hand over.
    response->set_finish_reason(original_max_tokens == 1 ||
                                        update.finish_reason != FinishReason::kLength
                                    ? FinishReasonToProto(update.finish_reason)
                                    : tandem::v1::FINISH_REASON_LENGTH);
    return grpc::Status::OK;
  }
  const RequestUpdate::Lease& lease = *update.kv_lease;
  // Make the held blocks readable by peers (device -> host mirror where the agent stages GPU
  // memory) before anyone learns of them.
  if (const absl::Status ready = connector_->PrepareForRemoteRead(lease.block_ids); !ready.ok()) {
    connector_->ReleaseLease(lease.lease.lease_id);  // the blocks cannot be served
    return ToGrpcStatus(ready);
  }
  kvtransfer::KvSource source;
  source.worker_id = options_.worker_id;
  source.epoch = options_.epoch;
  source.layout_hash = options_.kv_layout_hash;
  source.transfer_endpoint = address();
  *response->mutable_kv_handle() =
      kvtransfer::ToKvHandle(source, lease.lease, lease.block_ids, lease.num_tokens);
  return grpc::Status::OK;
}

template <typename OnFirst>
grpc::Status WorkerServiceImpl::Relay(grpc::ServerContext* context, const std::string& id,
                                      RequestStream& stream,
                                      grpc::ServerWriter<GenerateResponse>* writer,
                                      OnFirst on_first) {
  bool first = true;
  while (true) {
    if (context->IsCancelled()) {
      loop_->Abort(id);
      if (first) on_first();
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
    }
    RequestUpdate update;
    if (!stream.Next(&update, kPollSlice)) continue;
    if (first) {
      first = false;
      on_first();
    }
    if (update.finish_reason == FinishReason::kError) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("request ", id, " failed: ", update.error.message()));
    }
    if (update.finish_reason == FinishReason::kAborted) {
      GenerateResponse last;
      last.set_request_id(id);
      last.set_finish_reason(tandem::v1::FINISH_REASON_ABORTED);
      writer->Write(last);
      return grpc::Status::OK;
    }
    GenerateResponse out;
    out.set_request_id(id);
    for (int32_t t : update.new_token_ids) out.add_token_ids(static_cast<uint32_t>(t));
    const bool finished = update.finish_reason != FinishReason::kNone;
    if (finished) {
      out.set_finish_reason(FinishReasonToProto(update.finish_reason));
      FillUsage(update, out.mutable_usage());
    }
    if (out.token_ids_size() == 0 && !finished) continue;
    if (!writer->Write(out)) {
      loop_->Abort(id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    if (finished) return grpc::Status::OK;
  }
}

grpc::Status WorkerServiceImpl::Decode(grpc::ServerContext* context,
                                       const tandem::v1::DecodeRequest* request,
                                       grpc::ServerWriter<GenerateResponse>* writer) {
  grpc::Status admitted = Admit(tandem::v1::WORKER_ROLE_DECODE, "Decode");
  if (!admitted.ok()) return admitted;
  if (connector_ == nullptr || peers_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this worker has no KV transfer");
  }
  absl::StatusOr<RequestSpec> spec = SpecFromProto(request->request());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::string& id = request->request().request_id();
  const tandem::v1::KvHandle& handle = request->kv_handle();
  if (absl::Status valid = kvtransfer::ValidateKvHandle(handle, options_.kv_layout_hash);
      !valid.ok()) {
    return ToGrpcStatus(valid);
  }
  spec->first_token = static_cast<int32_t>(
      std::min<uint32_t>(request->first_token(), std::numeric_limits<int32_t>::max()));
  spec->on_kv_failure = request->on_kv_failure() == tandem::v1::KV_LOAD_FAILURE_POLICY_FAIL
                            ? KvLoadFailurePolicy::kFail
                            : KvLoadFailurePolicy::kRecompute;

  absl::Status linked = peers_->EnsurePeer(handle);
  if (linked.ok()) {
    // From here on the connector owns the source's lease: it stops reading a little before the
    // lease deadline, renews it while a long load runs, and releases it when the load has ended.
    spec->remote_kv = kvtransfer::ToRemoteKvSpec(handle, absl::Now() + options_.kv_load_timeout,
                                                 peers_->lease_client());
  } else {
    ++kv_load_failures_;
    LOG(WARNING) << "request " << id << ": cannot reach KV source " << handle.worker_id() << ": "
                 << linked;
    if (spec->on_kv_failure == KvLoadFailurePolicy::kFail) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("KV of request ", id, " is unavailable: ", linked.message()));
    }
    // Recompute: prefill prompt + first token here; the source's lease just expires.
  }
  std::optional<kvtransfer::RemoteKvSpec> remote = spec->remote_kv;
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = loop_->Submit(id, *std::move(spec));
  if (!stream.ok()) {
    if (remote.has_value()) connector_->DropRemote(*remote);  // never reached the engine
    return ToGrpcStatus(stream.status());
  }
  return Relay(context, id, **stream, writer, [] {});
}

grpc::Status WorkerServiceImpl::Generate(grpc::ServerContext* context,
                                         const tandem::v1::GenerateRequest* request,
                                         grpc::ServerWriter<GenerateResponse>* writer) {
  grpc::Status admitted = Admit(tandem::v1::WORKER_ROLE_MIXED, "Generate");
  if (!admitted.ok()) return admitted;
  absl::StatusOr<RequestSpec> spec = SpecFromProto(*request);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  absl::StatusOr<std::shared_ptr<RequestStream>> stream =
      loop_->Submit(request->request_id(), *std::move(spec));
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  return Relay(context, request->request_id(), **stream, writer, [] {});
}

grpc::Status WorkerServiceImpl::Abort(grpc::ServerContext* /*context*/,
                                      const tandem::v1::AbortRequest* request,
                                      tandem::v1::AbortResponse* response) {
  bool found = loop_->Abort(request->request_id());
  // A prefilled request whose decode will not happen: give its blocks back now.
  if (connector_ != nullptr) found |= connector_->ReleaseLeaseOf(request->request_id());
  response->set_found(found);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Health(grpc::ServerContext* /*context*/,
                                       const tandem::v1::WorkerHealthRequest* /*request*/,
                                       tandem::v1::HealthResponse* response) {
  response->set_status(status());
  response->set_detail(absl::StrCat(options_.worker_id, " (", RoleName(options_.role), ")"));
  return grpc::Status::OK;
}

tandem::v1::WorkerInfo WorkerServiceImpl::Info() const {
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
  for (int32_t eos : model.eos_token_ids) info.add_eos_token_ids(static_cast<uint32_t>(eos));
  return info;
}

tandem::v1::WorkerLoad WorkerServiceImpl::Load() const {
  const EngineLoopStats stats = loop_->Stats();
  tandem::v1::WorkerLoad load;
  load.set_num_running(static_cast<uint32_t>(stats.num_running));
  load.set_num_waiting(static_cast<uint32_t>(stats.num_waiting));
  load.set_kv_blocks_total(static_cast<uint32_t>(stats.kv.num_blocks));
  load.set_kv_blocks_free(static_cast<uint32_t>(stats.kv.num_free_blocks));
  if (connector_ != nullptr) {
    load.set_kv_blocks_leased(static_cast<uint32_t>(connector_->Stats().blocks_leased));
  }
  return load;
}

tandem::v1::WorkerStats WorkerServiceImpl::StatsProto() const {
  tandem::v1::WorkerStats out;
  *out.mutable_info() = Info();
  out.set_status(status());
  *out.mutable_load() = Load();
  const EngineLoopStats stats = loop_->Stats();
  out.set_prefix_cache_queried_tokens(stats.kv.prefix_queried_tokens);
  out.set_prefix_cache_hit_tokens(stats.kv.prefix_hit_tokens);
  out.set_requests_finished(stats.requests_finished);
  out.set_requests_aborted(stats.requests_aborted);
  uint64_t load_failures = kv_load_failures_;
  if (connector_ != nullptr) {
    const kvtransfer::KvConnectorStats c = connector_->Stats();
    out.set_leases_granted(c.leases_granted);
    out.set_leases_released(c.leases_released);
    out.set_leases_expired(c.leases_expired);
    out.set_kv_bytes_received(c.bytes_loaded);
    out.set_kv_load_micros(c.load_micros);
    out.set_kv_loads_completed(c.loads_completed);
    load_failures += c.load_failures;
  }
  out.set_kv_load_failures(load_failures);
  // kv_bytes_sent stays 0: in pull mode the reader's one-sided READs are invisible to the source
  // (its readers report kv_bytes_received).
  return out;
}

grpc::Status WorkerServiceImpl::Stats(grpc::ServerContext* /*context*/,
                                      const tandem::v1::WorkerStatsRequest* /*request*/,
                                      tandem::v1::WorkerStats* response) {
  *response = StatsProto();
  return grpc::Status::OK;
}

}  // namespace tandem::runtime
