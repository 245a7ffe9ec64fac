// WorkerServiceImpl: the worker daemon's gRPC API (proto WorkerService) over an EngineLoop.
//
//   Prefill  (prefill/mixed) runs the prompt; with remote_decode the blocks stay leased and the
//            reply carries a KvHandle naming them (and this worker's KvTransferService address).
//   Decode   (decode/mixed)  handshakes with the handle's source (once per source incarnation),
//            loads the KV through the connector, streams the tokens after the first one, and
//            releases the source's lease as soon as the load has ended.
//   Generate (mixed)         a whole request here.
//   Abort / Health / Stats.
//
// Errors at this edge: bad input INVALID_ARGUMENT, a duplicate id ALREADY_EXISTS, the wrong role
// FAILED_PRECONDITION, draining UNAVAILABLE, a failed KV load with policy fail UNAVAILABLE,
// client cancel CANCELLED (the request is aborted and its blocks freed).
//
// Thread safety: thread-safe (gRPC calls handlers concurrently).
#ifndef TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_
#define TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/connector.h"
#include "kvtransfer/kv_handle.h"
#include "kvtransfer/kv_transfer_service.h"
#include "runtime/worker/engine_loop.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::runtime {

struct WorkerOptions {
  std::string worker_id;
  uint64_t epoch = 0;
  tandem::v1::WorkerRole role = tandem::v1::WORKER_ROLE_MIXED;
  std::string address;  // host:port of this worker's gRPC server (also its KV endpoint)
  std::string model_id;
  uint64_t kv_layout_hash = 0;
  absl::Duration default_lease = absl::Seconds(30);
  absl::Duration kv_load_timeout = absl::Seconds(20);
};

// RequestSpec from the wire: INVALID_ARGUMENT for limits (proto/tandem/v1/limits.h) and values
// the engine cannot represent; the engine checks the rest (vocabulary, lengths, sampling).
absl::StatusOr<RequestSpec> SpecFromProto(const tandem::v1::GenerateRequest& request);
tandem::v1::FinishReason FinishReasonToProto(FinishReason reason);

class WorkerServiceImpl final : public tandem::v1::WorkerService::Service {
 public:
  // `connector` and `peers` may be null (no disaggregation): then Prefill with remote_decode
  // and Decode are refused. All pointers must outlive the service. The connector owns every KV
  // lease (granting, releasing on Abort, and on D renewing/releasing the source's).
  WorkerServiceImpl(EngineLoop* loop, kvtransfer::KvConnector* connector,
                    kvtransfer::PeerLinks* peers, WorkerOptions options);

  grpc::Status Prefill(grpc::ServerContext* context, const tandem::v1::PrefillRequest* request,
                       tandem::v1::PrefillResponse* response) override;
  grpc::Status Decode(grpc::ServerContext* context, const tandem::v1::DecodeRequest* request,
                      grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context, const tandem::v1::GenerateRequest* request,
                        grpc::ServerWriter<tandem::v1::GenerateResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const tandem::v1::AbortRequest* request,
                     tandem::v1::AbortResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const tandem::v1::WorkerHealthRequest* request,
                      tandem::v1::HealthResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const tandem::v1::WorkerStatsRequest* request,
                     tandem::v1::WorkerStats* response) override;

  // SIGTERM: refuse new requests (UNAVAILABLE), keep serving the ones in flight.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  tandem::v1::ServingStatus status() const;
  tandem::v1::WorkerInfo Info() const;
  tandem::v1::WorkerLoad Load() const;
  tandem::v1::WorkerStats StatsProto() const;
  // The address this worker serves on, once the server knows its port (before it is announced).
  void SetAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  std::string address() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  grpc::Status Admit(tandem::v1::WorkerRole needed, const char* rpc) const;
  // Relays `stream` to `writer` until the request finishes, the client goes away, or the stream
  // stalls past the load timeout; calls on_first(), once, at the first update.
  template <typename OnFirst>
  grpc::Status Relay(grpc::ServerContext* context, const std::string& id, RequestStream& stream,
                     grpc::ServerWriter<tandem::v1::GenerateResponse>* writer, OnFirst on_first);

  EngineLoop* const loop_;
  kvtransfer::KvConnector* const connector_;
  kvtransfer::PeerLinks* const peers_;
  const WorkerOptions options_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> kv_load_failures_{0};

  mutable absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_WORKER_SERVICE_H_
