// WorkerDaemon: one whole worker process's parts, wired in one place from a WorkerConfig
// (tandem_worker's flags, or a test's values): model + backend, KV transfer agent (the pool
// registered once), connector, engine loop, Worker core, the gRPC server with WorkerService and
// KvTransferService on one port, and router registration. tandem_worker's main is flags ->
// WorkerConfig -> Create -> wait for a signal -> Drain.
//
// Thread safety: Create / Drain / the destructor from one thread; worker() is thread-safe.
#ifndef TANDEM_RUNTIME_WORKER_WORKER_DAEMON_H_
#define TANDEM_RUNTIME_WORKER_WORKER_DAEMON_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_listener_options.h"
#include "common/security/security_config.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"
#include "runtime/parallel/group_channel.h"
#include "runtime/worker/transfer_agent_factory.h"
#include "runtime/worker/worker.h"
#include "tandem/v1/router.pb.h"

namespace tandem::runtime {

struct WorkerConfig {
  tandem::v1::WorkerRole role = tandem::v1::WORKER_ROLE_MIXED;
  ModelSource model;
  BackendOptions backend;
  EngineConfig engine;
  // The draft model, used when engine.speculative.method is kDraft (decode and mixed workers).
  ModelSource draft_model;
  // transfer.cuda_pool / device follow `backend`; transfer.ucx_net_device "auto" becomes the
  // interface of the advertised host ("all" when none of ours has it).
  TransferAgentFlags transfer;
  std::string listen = "127.0.0.1:0";
  // The host peers reach this worker at (registered with the router, in KV handles). Empty: the
  // listen host, or, when listening on every interface, this host's first non-loopback address.
  std::string advertise_host;
  std::string worker_id;  // empty: <role>-<hostname>-<pid>
  // GET /metrics and /health over HTTP (worker_metrics.h) on HOST:PORT; empty: none.
  std::string metrics_listen;
  std::string router;  // empty: standalone (no registration)
  // TLS and identities of every server and channel of this worker (its gRPC port, its
  // registration with the router, its KV control-plane links to sources). Default: insecure.
  security::SecurityConfig security;
  absl::Duration default_lease = absl::Seconds(30);
  absl::Duration kv_load_timeout = absl::Seconds(20);
  int64_t max_queued_requests = 4096;
  // One JSON line a model step (runtime/worker/step_trace.h) into this file; empty: none. Lines
  // past step_trace_max_lines are dropped.
  std::string step_trace;
  int64_t step_trace_max_lines = 1'000'000;
  // The gRPC port's connection cap and handshake timeout (common/grpc_listener.h).
  GrpcListenerOptions grpc_port;
  // The model and backend already loaded (rank 0 of a worker group: LoadGroupBackend, its
  // backend fanned out over the group); empty: loaded here from `model` and `backend`.
  std::optional<BackendModel> loaded;
  int tp = 1;  // ranks in this worker's group (for the checks below and the logs)
  // What the router is told of the group (WorkerInfo.group); size 0/1: none.
  tandem::v1::WorkerGroup group;
  // Rank 0 of a group (tp > 1): the line to the other ranks (LoadGroupBackend's), over which a
  // prefill or decode group moves every rank's KV heads (runtime/parallel/group_kv.h).
  std::shared_ptr<GroupChannel> group_channel;
  // KV staging per rank for re-sharded reads (kvtransfer/rank_reader.h).
  uint64_t kv_staging_bytes = uint64_t{64} << 20;
  // Makes the transfer agent (the transport seam, like LevelDB's Env); empty:
  // MakeTransferAgent(transfer). Tests pass in-process agents.
  std::function<absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>>()> make_agent;
};

// Where peers reach the worker: `advertise_host`, else the `listen` host, else (a wildcard
// listen) this host's first non-loopback address. INVALID_ARGUMENT when there is none.
absl::StatusOr<std::string> AdvertisedHost(const WorkerConfig& config);

// The UCX network devices of the worker's KV agent: `transfer.ucx_net_device` unless "auto"; then
// the interface that holds the advertised host ("lo" for 127.0.0.1), or "all" when no interface
// of this host holds it (a DNS name, an address behind NAT). Every rank of a group started on
// one host resolves it from the same flags, so all of them listen where rank 0 does.
absl::StatusOr<std::string> ResolveUcxNetDevice(const WorkerConfig& config);

class WorkerDaemon {
 public:
  // Loads the model, builds everything, starts serving and (with a router) registering.
  // INVALID_ARGUMENT for bad values, UNAVAILABLE when `listen` cannot be bound, the backend's
  // and the transfer agent's own errors otherwise.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(WorkerConfig config);
  ~WorkerDaemon();  // stops registration, the server, the engine loop, in that order

  WorkerDaemon(const WorkerDaemon&) = delete;
  WorkerDaemon& operator=(const WorkerDaemon&) = delete;

  const std::string& address() const { return address_; }  // host:port actually bound
  const std::string& worker_id() const { return worker_id_; }
  uint64_t epoch() const { return epoch_; }
  // The port of the /metrics plane (0 without --metrics_listen).
  int metrics_port() const;
  Worker& worker() { return *worker_; }

  // SIGTERM: stop taking requests (DRAINING, told to the router at once), let the ones in flight
  // finish and the KV leases held for decode workers be released or expire, for up to `timeout`
  // in all; then send a last heartbeat and stop the server.
  void Drain(absl::Duration timeout);

 private:
  struct Parts;
  explicit WorkerDaemon(std::unique_ptr<Parts> parts);

  std::unique_ptr<Parts> parts_;
  Worker* worker_ = nullptr;
  std::string address_;
  std::string worker_id_;
  uint64_t epoch_ = 0;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_WORKER_WORKER_DAEMON_H_
