// WorkerServiceImpl: the worker daemon's gRPC edge (proto WorkerService) over a Worker
// (worker.h). Each handler translates: proto -> RequestSpec (SpecFromProto: wire limits),
// the caller's cancellation -> CallerGone, updates -> GenerateResponse messages, and
// absl::Status -> grpc::Status. What the RPCs do and their errors: worker.h.
//
// Thread safety: thread-safe (gRPC calls handlers concurrently).
#ifndef TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_
#define TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc_strict_parse.h"
#include "runtime/worker/worker.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::runtime {

// RequestSpec from the wire: INVALID_ARGUMENT for the shape the router checks too
// (proto/tandem/v1/request_shape.h), a missing id, and values the engine cannot represent; the
// engine checks the rest (vocabulary, lengths, sampling).
absl::StatusOr<RequestSpec> SpecFromProto(const tandem::v1::GenerateRequest& request);
tandem::v1::FinishReason FinishReasonToProto(FinishReason reason);

class WorkerServiceImpl final : public tandem::v1::WorkerService::Service {
 public:
  // `worker` must outlive the service.
  explicit WorkerServiceImpl(Worker* worker);

  grpc::Status Prefill(grpc::ServerContext* context, const tandem::v1::PrefillRequest* request,
                       tandem::v1::PrefillResponse* response) override;
  grpc::Status Decode(grpc::ServerContext* context, const tandem::v1::DecodeRequest* request,
                      grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context, const tandem::v1::GenerateRequest* request,
                        grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const tandem::v1::AbortRequest* request,
                     tandem::v1::AbortResponse* response) override;
  grpc::Status ReassignLease(grpc::ServerContext* context,
                             const tandem::v1::ReassignLeaseRequest* request,
                             tandem::v1::ReassignLeaseResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const tandem::v1::WorkerHealthRequest* request,
                      tandem::v1::HealthResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const tandem::v1::WorkerStatsRequest* request,
                     tandem::v1::WorkerStats* response) override;

 private:
  // Writes a request's updates as GenerateResponse messages (an abort as a final ABORTED one);
  // the final one carries `*times` (the worker fills it before; may be null).
  static UpdateSink StreamTo(const std::string& id,
                             grpc::ServerWriter<tandem::v1::GenerateResponse>* writer,
                             const tandem::v1::WorkerPhaseTimes* times);

  Worker* const worker_;
};

// `service`'s methods behind strict request parsing (common/grpc_strict_parse.h): request bytes
// that do not parse are INVALID_ARGUMENT. Register the result instead of `service` (which must
// outlive it); an error when the list misses a WorkerService method.
absl::StatusOr<std::unique_ptr<StrictParsingService>> StrictWorkerService(
    tandem::v1::WorkerService::Service* service);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_
