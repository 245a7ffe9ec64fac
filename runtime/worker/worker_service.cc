#include "runtime/worker/worker_service.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "glog/logging.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/request_shape.h"

namespace tandem::runtime {
namespace {

using tandem::v1::GenerateResponse;

void FillUsage(const RequestUpdate& u, tandem::v1::Usage* usage) {
  usage->set_prompt_tokens(static_cast<uint32_t>(u.num_prompt_tokens));
  usage->set_completion_tokens(static_cast<uint32_t>(u.num_output_tokens));
  usage->set_cached_prompt_tokens(static_cast<uint32_t>(u.num_cached_prompt_tokens));
}

void ToProto(const MtpHandoff& handoff, tandem::v1::MtpHandoff* out) {
  out->set_num_positions(static_cast<uint32_t>(handoff.num_positions));
  out->set_row_width(static_cast<uint32_t>(handoff.row_width));
  out->mutable_latent_rows()->Add(handoff.latent_rows.begin(), handoff.latent_rows.end());
  out->mutable_last_hidden()->Add(handoff.last_hidden.begin(), handoff.last_hidden.end());
}

// The engine checks the shapes against its MTP layer (Engine::AddRequest); here only the limits.
absl::StatusOr<MtpHandoff> FromProto(const tandem::v1::MtpHandoff& in) {
  if (in.latent_rows_size() > tandem::v1::kMaxMtpHandoffRowFloats ||
      in.last_hidden_size() > tandem::v1::kMaxMtpHandoffHiddenFloats) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mtp_handoff has ", in.latent_rows_size(), " row floats and ", in.last_hidden_size(),
        " hidden floats; the limits are ", tandem::v1::kMaxMtpHandoffRowFloats, " and ",
        tandem::v1::kMaxMtpHandoffHiddenFloats));
  }
  MtpHandoff handoff;
  handoff.num_positions = in.num_positions();
  handoff.row_width = in.row_width();
  handoff.latent_rows.assign(in.latent_rows().begin(), in.latent_rows().end());
  handoff.last_hidden.assign(in.last_hidden().begin(), in.last_hidden().end());
  return handoff;
}

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
  // The same shape check the router ran (a worker may be called directly), then only what a
  // worker adds: an id is required here (the router assigns one), ids fit an int32.
  if (absl::Status s = tandem::v1::ValidateRequestShape(request); !s.ok()) return s;
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id must have 1..", tandem::v1::kMaxIdBytes, " bytes"));
  }
  const tandem::v1::SamplingParams& sp = request.sampling();
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
  spec.sampling.vocab_limit = sp.vocab_limit();  // 0: the whole vocabulary
  spec.ignore_eos = sp.ignore_eos();
  spec.cache_salt = request.cache_salt();
  return spec;
}

WorkerServiceImpl::WorkerServiceImpl(Worker* worker) : worker_(worker) {}

grpc::Status WorkerServiceImpl::Prefill(grpc::ServerContext* context,
                                        const tandem::v1::PrefillRequest* request,
                                        tandem::v1::PrefillResponse* response) {
  if (absl::Status s = worker_->Admit(tandem::v1::WORKER_ROLE_PREFILL, "Prefill"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<RequestSpec> spec = SpecFromProto(request->request());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::string& id = request->request().request_id();
  absl::StatusOr<PrefillResult> result = worker_->Prefill(
      id, *std::move(spec), request->remote_decode(), absl::Milliseconds(request->lease_ms()),
      [context] { return context->IsCancelled(); }, request->decode_worker_id());
  if (!result.ok()) return ToGrpcStatus(result.status());
  const RequestUpdate& first = result->first;
  response->set_request_id(id);
  if (!first.new_token_ids.empty()) response->set_first_token(first.new_token_ids[0]);
  FillUsage(first, response->mutable_usage());
  response->set_finish_reason(FinishReasonToProto(first.finish_reason));
  if (result->kv_handle.has_value()) *response->mutable_kv_handle() = *std::move(result->kv_handle);
  *response->mutable_worker_times() = result->times;
  if (first.mtp_handoff.has_value() && response->has_kv_handle()) {
    ToProto(*first.mtp_handoff, response->mutable_mtp_handoff());
  }
  return grpc::Status::OK;
}

UpdateSink WorkerServiceImpl::StreamTo(const std::string& id,
                                       grpc::ServerWriter<GenerateResponse>* writer,
                                       const tandem::v1::WorkerPhaseTimes* times) {
  return [id, writer, times](const RequestUpdate& update) {
    GenerateResponse out;
    out.set_request_id(id);
    if (update.finish_reason == FinishReason::kAborted) {
      out.set_finish_reason(tandem::v1::FINISH_REASON_ABORTED);
      writer->Write(out);
      return true;  // ends the stream either way
    }
    for (int32_t t : update.new_token_ids) out.add_token_ids(static_cast<uint32_t>(t));
    if (update.finish_reason != FinishReason::kNone) {
      out.set_finish_reason(FinishReasonToProto(update.finish_reason));
      FillUsage(update, out.mutable_usage());
      if (times != nullptr) *out.mutable_worker_times() = *times;
    }
    return writer->Write(out);
  };
}

grpc::Status WorkerServiceImpl::Decode(grpc::ServerContext* context,
                                       const tandem::v1::DecodeRequest* request,
                                       grpc::ServerWriter<GenerateResponse>* writer) {
  if (absl::Status s = worker_->Admit(tandem::v1::WORKER_ROLE_DECODE, "Decode"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<RequestSpec> spec = SpecFromProto(request->request());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  if (request->has_mtp_handoff()) {
    absl::StatusOr<MtpHandoff> handoff = FromProto(request->mtp_handoff());
    if (!handoff.ok()) return ToGrpcStatus(handoff.status());
    spec->mtp_handoff = *std::move(handoff);
  }
  const std::string& id = request->request().request_id();
  const int32_t first_token = static_cast<int32_t>(
      std::min<uint32_t>(request->first_token(), std::numeric_limits<int32_t>::max()));
  const KvLoadFailurePolicy policy =
      request->on_kv_failure() == tandem::v1::KV_LOAD_FAILURE_POLICY_FAIL
          ? KvLoadFailurePolicy::kFail
          : KvLoadFailurePolicy::kRecompute;
  tandem::v1::WorkerPhaseTimes times;  // filled by the worker before the final message
  return ToGrpcStatus(worker_->Decode(
      id, *std::move(spec), request->kv_handle(), first_token, policy,
      [context] { return context->IsCancelled(); }, StreamTo(id, writer, &times), &times));
}

grpc::Status WorkerServiceImpl::Generate(grpc::ServerContext* context,
                                         const tandem::v1::GenerateRequest* request,
                                         grpc::ServerWriter<GenerateResponse>* writer) {
  if (absl::Status s = worker_->Admit(tandem::v1::WORKER_ROLE_MIXED, "Generate"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<RequestSpec> spec = SpecFromProto(*request);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::string& id = request->request_id();
  tandem::v1::WorkerPhaseTimes times;
  return ToGrpcStatus(worker_->Generate(
      id, *std::move(spec), [context] { return context->IsCancelled(); },
      StreamTo(id, writer, &times), &times));
}

grpc::Status WorkerServiceImpl::Abort(grpc::ServerContext* /*context*/,
                                      const tandem::v1::AbortRequest* request,
                                      tandem::v1::AbortResponse* response) {
  response->set_found(worker_->Abort(request->request_id()));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::ReassignLease(grpc::ServerContext* /*context*/,
                                              const tandem::v1::ReassignLeaseRequest* request,
                                              tandem::v1::ReassignLeaseResponse* /*response*/) {
  return ToGrpcStatus(worker_->ReassignLease(request->request_id(), request->lease_id(),
                                             request->decode_worker_id()));
}

grpc::Status WorkerServiceImpl::Health(grpc::ServerContext* /*context*/,
                                       const tandem::v1::WorkerHealthRequest* /*request*/,
                                       tandem::v1::HealthResponse* response) {
  response->set_status(worker_->status());
  response->set_detail(
      absl::StrCat(worker_->options().worker_id, " (", RoleName(worker_->options().role), ")"));
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Stats(grpc::ServerContext* /*context*/,
                                      const tandem::v1::WorkerStatsRequest* /*request*/,
                                      tandem::v1::WorkerStats* response) {
  *response = worker_->StatsProto();
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictWorkerService(
    tandem::v1::WorkerService::Service* service) {
  using S = tandem::v1::WorkerService::Service;
  auto strict = std::make_unique<StrictParsingService>(
      tandem::v1::WorkerService::service_full_name(), tandem::v1::kMaxGrpcMessageBytes);
  strict->Unary("Prefill", service, &S::Prefill)
      .ServerStreaming("Decode", service, &S::Decode)
      .ServerStreaming("Generate", service, &S::Generate)
      .Unary("Abort", service, &S::Abort)
      .Unary("ReassignLease", service, &S::ReassignLease)
      .Unary("Health", service, &S::Health)
      .Unary("Stats", service, &S::Stats);
  if (absl::Status s = strict->Complete(); !s.ok()) return s;
  return strict;
}

}  // namespace tandem::runtime
