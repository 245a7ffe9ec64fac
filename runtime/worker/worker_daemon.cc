#include "runtime/worker/worker_daemon.h"

#include <unistd.h>

#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_keepalive.h"
#include "common/grpc_listener.h"
#include "common/net.h"
#include "common/security/grpc_security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_transfer_service.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/engine/draft_model_loader.h"
#include "runtime/parallel/group_kv.h"
#include "runtime/worker/router_registration.h"
#include "runtime/worker/worker_metrics.h"
#include "runtime/worker/worker_service.h"
#include "tandem/v1/limits.h"

namespace tandem::runtime {
namespace {

// What a peer must match exactly (hashed): the model and the layout of the WHOLE model's KV (the
// endpoint's, from the full config: a rank's engine only knows its own heads); the backend names
// its KV dtype (ExecutorFactory::kv_dtype) and the model runs in it. The rank geometry (rank 0's
// share; a group adds every rank's in `ranks`) travels beside it.
tandem::v1::TransferHandshake LocalHandshake(const std::string& model_id,
                                             const RankKvEndpoint& endpoint, uint64_t epoch) {
  tandem::v1::TransferHandshake local;
  *local.mutable_compatibility() = endpoint.layout();
  local.mutable_compatibility()->set_model_id(model_id);
  *local.mutable_geometry() = endpoint.geometry();
  local.set_compatibility_hash(kvtransfer::CompatibilityHash(local.compatibility()));
  local.set_epoch(epoch);
  return local;
}

}  // namespace

// Where peers reach this worker (WorkerConfig::advertise_host).
absl::StatusOr<std::string> AdvertisedHost(const WorkerConfig& config) {
  if (!config.advertise_host.empty()) return config.advertise_host;
  const std::string listen_host = config.listen.substr(0, config.listen.rfind(':'));
  if (!IsWildcardHost(listen_host)) return listen_host;
  absl::StatusOr<std::string> first = FirstNonLoopbackAddress();
  if (!first.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", config.listen, " serves every interface but ", first.status().message(),
        "; set --advertise_address to the address peers reach"));
  }
  return *first;
}

absl::StatusOr<std::string> ResolveUcxNetDevice(const WorkerConfig& config) {
  if (config.transfer.ucx_net_device != "auto") return config.transfer.ucx_net_device;
  ASSIGN_OR_RETURN(const std::string advertise, AdvertisedHost(config));
  absl::StatusOr<std::string> iface = InterfaceForAddress(advertise);
  return iface.ok() ? *iface : "all";
}

namespace {

std::string DefaultWorkerId(tandem::v1::WorkerRole role) {
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  return absl::StrCat(RoleName(role), "-", hostname, "-", getpid());
}

// Checks the limits Create cannot start with; names an unnamed worker.
absl::Status CheckConfig(WorkerConfig& config) {
  if (config.max_queued_requests < 1) {
    return absl::InvalidArgumentError("--max_queued_requests must be >= 1");
  }
  if (config.grpc_port.max_connections < 1 ||
      config.grpc_port.handshake_timeout <= absl::ZeroDuration() ||
      config.grpc_port.max_concurrent_streams < 1 || config.grpc_port.memory_quota_bytes < 1) {
    return absl::InvalidArgumentError(
        "--grpc_max_connections, --grpc_handshake_timeout_ms, --grpc_max_concurrent_streams and "
        "--grpc_memory_quota_mb must be >= 1");
  }
  if (config.worker_id.empty()) config.worker_id = DefaultWorkerId(config.role);
  if (config.worker_id.size() > static_cast<size_t>(tandem::v1::kMaxIdBytes)) {
    return absl::InvalidArgumentError("--worker_id is too long");
  }
  return absl::OkStatus();
}

// The model the caller loaded (config.loaded, taken), else loaded here.
absl::StatusOr<BackendModel> TakeOrLoadModel(WorkerConfig& config) {
  if (!config.loaded.has_value()) return LoadModelForBackend(config.model, config.backend);
  BackendModel loaded = *std::move(config.loaded);
  config.loaded.reset();
  return loaded;
}

}  // namespace

// Declared in the order they must be built; destroyed in reverse (registration first, the
// transfer agent that owns the pool's memory last).
struct WorkerDaemon::Parts {
  std::unique_ptr<kvtransfer::TransferAgent> agent;
  // This rank's KV side (its reader re-shards heads from sources split differently) and, for a
  // group, the fan-out of every read to all ranks.
  std::unique_ptr<RankKvEndpoint> endpoint;
  std::unique_ptr<GroupBlockTransport> group_transport;
  std::unique_ptr<kvtransfer::PullKvConnector> connector;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<kvtransfer::KvTransferServiceImpl> kv_service;
  std::unique_ptr<kvtransfer::PeerLinks> peers;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<WorkerServiceImpl> service;
  // service and kv_service behind strict request parsing (registered instead of them).
  std::unique_ptr<StrictParsingService> strict_service, strict_kv_service;
  std::unique_ptr<grpc::Server> server;
  // The server's port, accepted by us (common/grpc_listener.h: a failed accept is retried).
  std::unique_ptr<GrpcListener> listener;
  std::unique_ptr<RouterRegistration> registration;
  std::unique_ptr<http::HttpServer> metrics;
  // Whether the KV pool is registered with `agent` (prefill and decode workers). A mixed worker
  // serves whole requests (the router never makes it a P->D source or reader), so its pool is
  // not: no host mirror of a device pool, pinned, at start (issue 31). Its connector and endpoint
  // stay (stats, KvTransferService), but the Worker gets no lease table or source links, so a
  // remote-decode Prefill or a Decode sent to it is refused (FAILED_PRECONDITION).
  bool kv_exported = true;

  // The engine on the agent's memory where the agent can share it best (UCX-mapped memory that
  // shared-memory transports read in place), else its own pool registered with the agent.
  absl::StatusOr<std::unique_ptr<Engine>> BuildEngine(WorkerConfig& config, BackendModel& loaded,
                                                      uint32_t* region);
  // The endpoint, the group fan-out (tp > 1) and the connector over them; returns the local
  // handshake (a group's lists every rank's descriptor).
  absl::StatusOr<tandem::v1::TransferHandshake> BuildKvSide(const WorkerConfig& config,
                                                            const BackendModel& loaded,
                                                            Engine& engine, uint32_t region,
                                                            uint64_t epoch);
  // The Worker's options; its per-rank KV counters read this Parts' endpoint or group fan-out.
  WorkerOptions MakeWorkerOptions(const WorkerConfig& config, const BackendModel& loaded,
                                  const tandem::v1::TransferHandshake& local, uint64_t epoch);
  // The engine loop, the KV transfer service, the source links (KV-exporting workers) and the
  // Worker with its gRPC service over them.
  void BuildServing(const WorkerConfig& config, std::unique_ptr<Engine> engine,
                    const tandem::v1::TransferHandshake& local, const WorkerOptions& options,
                    std::shared_ptr<StepTraceWriter> step_trace);
  absl::Status StartServer(const WorkerConfig& config, const std::string& host,
                           std::string* address);
  // The metrics HTTP server on `listen` (none when empty).
  absl::Status StartMetrics(const std::string& listen);
  void StartRegistration(const std::string& router, const security::SecurityConfig& security);
};

absl::StatusOr<std::unique_ptr<Engine>> WorkerDaemon::Parts::BuildEngine(WorkerConfig& config,
                                                                         BackendModel& loaded,
                                                                         uint32_t* region) {
  std::optional<uint32_t> shared_region;
  kv_exported = config.role != tandem::v1::WORKER_ROLE_MIXED;
  KvPoolAllocator allocator;  // null: the backend allocates the pool itself
  if (kv_exported) {
    allocator = [&](int64_t bytes) -> absl::StatusOr<void*> {
      absl::StatusOr<std::pair<void*, uint32_t>> shared =
          agent->AllocateMemory(static_cast<uint64_t>(bytes), tandem::v1::MEMORY_KIND_HOST);
      if (shared.status().code() == absl::StatusCode::kUnimplemented) return nullptr;
      if (!shared.ok()) return shared.status();
      shared_region = shared->second;
      return shared->first;
    };
  }
  // Start-up phases are timed in the log: a group's start to healthy is their sum (issue 31).
  const absl::Time engine_start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(config.engine, loaded.model.local_config,
                                  std::move(loaded.model.weights), allocator, &loaded.factory));
  LOG(INFO) << "worker start: engine (weights, KV pool, CUDA graphs) up in "
            << absl::Now() - engine_start;
  if (config.engine.speculative.method == SpeculativeMethod::kDraft) {
    RETURN_IF_ERROR(LoadAndAttachDraftModel(config.draft_model, config.backend, *engine));
  }
  if (config.engine.speculative.method == SpeculativeMethod::kMtp) {
    RETURN_IF_ERROR(LoadAndAttachMtp(config.model, loaded.model.config, config.backend, *engine));
  }
  if (!kv_exported) {
    LOG(INFO) << "worker start: KV pool (" << (engine->kv_pool_bytes() >> 20)
              << " MiB) not exported to the " << agent->transport()
              << " transfer agent: the role is mixed (whole requests, no P->D)";
    *region = 0;  // no region of the agent: nothing reads or serves it
    return engine;
  }
  if (!shared_region.has_value()) {
    const absl::Time register_start = absl::Now();
    absl::StatusOr<uint32_t> registered = agent->RegisterMemory(
        engine->kv_pool_data(), engine->kv_pool_bytes(),
        engine->kv_pool_on_device() ? tandem::v1::MEMORY_KIND_CUDA : tandem::v1::MEMORY_KIND_HOST);
    LOG(INFO) << "worker start: KV pool (" << (engine->kv_pool_bytes() >> 20)
              << " MiB) registered with the " << agent->transport() << " transfer agent in "
              << absl::Now() - register_start;
    if (!registered.ok()) {
      return absl::Status(
          registered.status().code(),
          absl::StrCat("registering the ", loaded.factory.name, " backend's KV pool with the ",
                       agent->transport(), " transfer agent: ", registered.status().message()));
    }
    shared_region = *registered;
  }
  *region = *shared_region;
  return engine;
}

absl::StatusOr<tandem::v1::TransferHandshake> WorkerDaemon::Parts::BuildKvSide(
    const WorkerConfig& config, const BackendModel& loaded, Engine& engine, uint32_t region,
    uint64_t epoch) {
  RankKvEndpointOptions endpoint_options;
  endpoint_options.model = loaded.model.config;
  endpoint_options.kv_dtype = engine.kv_dtype();
  endpoint_options.tp_size = config.tp;
  endpoint_options.dcp_size = static_cast<int>(engine.dcp().size);
  endpoint_options.dcp_interleave = engine.dcp().interleave;
  endpoint_options.dp_size = static_cast<int>(engine.dp_size());
  endpoint_options.staging_bytes = config.kv_staging_bytes;
  endpoint = std::make_unique<RankKvEndpoint>(agent.get(), endpoint_options);
  char* host_pool =
      engine.kv_pool_on_device() ? nullptr : static_cast<char*>(engine.kv_pool_data());
  RETURN_IF_ERROR(endpoint->AttachPool(region, host_pool,
                                       engine.kv_pool_bytes() / engine.kv_block_bytes(),
                                       engine.block_size(), engine.kv_pool_bytes()));
  tandem::v1::TransferHandshake local = LocalHandshake(loaded.model.model_id, *endpoint, epoch);
  local.set_worker_id(config.worker_id);
  kvtransfer::BlockTransport* transport = endpoint->reader();
  if (config.tp > 1 && config.role != tandem::v1::WORKER_ROLE_MIXED) {
    if (config.group_channel == nullptr) {
      return absl::InvalidArgumentError("a worker group without its channel to the ranks");
    }
    group_transport = std::make_unique<GroupBlockTransport>(config.group_channel, endpoint.get());
    ASSIGN_OR_RETURN(std::vector<tandem::v1::TransferHandshake> ranks,
                     group_transport->DescribeRanks());
    for (tandem::v1::TransferHandshake& rank : ranks) *local.add_ranks() = std::move(rank);
    transport = group_transport.get();
  }
  kvtransfer::PullKvConnectorOptions connector_options;
  connector_options.block_size = engine.block_size();
  connector_options.block_bytes = static_cast<uint64_t>(engine.kv_block_bytes());
  connector_options.local_region = region;
  connector = std::make_unique<kvtransfer::PullKvConnector>(transport, connector_options);
  return local;
}

absl::Status WorkerDaemon::Parts::StartServer(const WorkerConfig& config, const std::string& host,
                                              std::string* address) {
  // The port is known only after the server starts; the worker learns the final address before
  // it is announced (printed, written to the port file, registered).
  ASSIGN_OR_RETURN(strict_service, StrictWorkerService(service.get()));
  ASSIGN_OR_RETURN(strict_kv_service, kvtransfer::StrictKvTransferService(kv_service.get()));
  grpc::ServerBuilder builder;
  ASSIGN_OR_RETURN(listener, GrpcListener::Add(config.listen,
                                               security::InternalServerCredentials(config.security),
                                               &builder, config.grpc_port));
  const int port = listener->port();
  builder.SetMaxReceiveMessageSize(static_cast<int>(tandem::v1::kMaxGrpcMessageBytes));
  AllowKeepalivePings(builder);  // the router's channels ping every second
  builder.RegisterService(strict_service.get());
  builder.RegisterService(strict_kv_service.get());
  server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen));
  }
  listener->Start();
  *address = absl::StrCat(host, ":", port);
  worker->SetAddress(*address);
  return absl::OkStatus();
}

void WorkerDaemon::Parts::StartRegistration(const std::string& router,
                                            const security::SecurityConfig& security) {
  RegistrationCallbacks callbacks;
  Worker* w = worker.get();
  EngineLoop* l = loop.get();
  callbacks.info = [w] { return w->Info(); };
  callbacks.status = [w] { return w->status(); };
  callbacks.load = [w] { return w->Load(); };
  callbacks.cache_events = [l](std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
    l->TakeCacheEvents(added, removed);
  };
  callbacks.all_cached_hashes = [l] { return l->CachedHashes(); };
  registration = std::make_unique<RouterRegistration>(router, security, std::move(callbacks));
  registration->Start();
}

WorkerOptions WorkerDaemon::Parts::MakeWorkerOptions(const WorkerConfig& config,
                                                     const BackendModel& loaded,
                                                     const tandem::v1::TransferHandshake& local,
                                                     uint64_t epoch) {
  WorkerOptions options;
  options.worker_id = config.worker_id;
  options.epoch = epoch;
  options.role = config.role;
  options.model_id = loaded.model.model_id;
  options.kv_layout_hash = local.compatibility_hash();
  options.kv_dtype = tandem::v1::KvDtype_Name(local.compatibility().layout().kv_dtype());
  options.default_lease = config.default_lease;
  // With mTLS a lease is bound to the decode worker the router names (it proves its id with its
  // certificate); --insecure has no identities, so an unnamed reader is allowed there.
  options.require_decode_worker = !config.security.insecure;
  options.kv_load_timeout = config.kv_load_timeout;
  options.group = config.group;
  options.rank_kv_stats = [p = this](tandem::v1::WorkerStats* out) {
    if (p->group_transport != nullptr) {
      const GroupKvStats g = p->group_transport->stats();
      for (size_t r = 0; r < g.bytes_kept.size(); ++r) {
        out->add_kv_bytes_received_per_rank(g.bytes_kept[r]);
        out->add_kv_bytes_read_per_rank(g.bytes_read[r]);
        out->add_kv_copy_ops_per_rank(g.copy_ops[r]);
      }
      return;
    }
    const kvtransfer::RankKvReaderStats s = p->endpoint->reader()->stats();
    out->add_kv_bytes_received_per_rank(s.bytes_kept);
    out->add_kv_bytes_read_per_rank(s.bytes_read);
    out->add_kv_copy_ops_per_rank(s.copy_ops);
  };
  return options;
}

void WorkerDaemon::Parts::BuildServing(const WorkerConfig& config, std::unique_ptr<Engine> engine,
                                       const tandem::v1::TransferHandshake& local,
                                       const WorkerOptions& options,
                                       std::shared_ptr<StepTraceWriter> step_trace) {
  EngineLoopOptions loop_options;
  loop_options.max_queued_requests = config.max_queued_requests;
  loop_options.step_trace = std::move(step_trace);
  loop_options.release_orphan_lease = [c = connector.get()](uint64_t lease) {
    c->ReleaseLease(lease);
  };
  loop = std::make_unique<EngineLoop>(std::move(engine), loop_options);
  kv_service = std::make_unique<kvtransfer::KvTransferServiceImpl>(agent.get(), connector.get(),
                                                                   local, options.max_lease);
  kvtransfer::PeerLinks::SourceLinker linker =
      [p = this](const std::string& peer, const tandem::v1::TransferHandshake& source) {
        return p->group_transport != nullptr ? p->group_transport->AddSource(peer, source)
                                             : p->endpoint->reader()->AddSource(peer, source);
      };
  kvtransfer::PeerLinks::LinkCheck linked = [p = this](const std::string& peer) {
    return p->group_transport != nullptr ? p->group_transport->SourceLinked(peer)
                                         : p->endpoint->reader()->SourceLinked(peer);
  };
  if (kv_exported) {
    peers = std::make_unique<kvtransfer::PeerLinks>(agent.get(), local, config.security,
                                                    absl::Seconds(5), std::move(linker),
                                                    std::move(linked));
  }
  // A mixed worker: no lease table, no source links (Parts::kv_exported); its KV counters stay.
  worker = std::make_unique<Worker>(loop.get(), kv_exported ? connector.get() : nullptr,
                                    connector.get(), peers.get(), options);
  service = std::make_unique<WorkerServiceImpl>(worker.get());
}

absl::Status WorkerDaemon::Parts::StartMetrics(const std::string& listen) {
  if (listen.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(metrics, StartWorkerHttp(listen, worker.get()));
  LOG(INFO) << "metrics on http://" << listen.substr(0, listen.rfind(':')) << ":" << metrics->port()
            << "/metrics";
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(WorkerConfig config) {
  RETURN_IF_ERROR(CheckConfig(config));
  std::shared_ptr<StepTraceWriter> step_trace;  // opened first: a bad path fails before the load
  if (!config.step_trace.empty()) {
    ASSIGN_OR_RETURN(step_trace,
                     StepTraceWriter::Open(config.step_trace, config.step_trace_max_lines));
  }
  ASSIGN_OR_RETURN(const std::string advertise, AdvertisedHost(config));
  ASSIGN_OR_RETURN(config.transfer.ucx_net_device, ResolveUcxNetDevice(config));
  ASSIGN_OR_RETURN(BackendModel loaded, TakeOrLoadModel(config));
  auto parts = std::make_unique<Parts>();
  config.transfer.cuda_pool = config.backend.backend == "cuda";
  config.transfer.device = config.backend.device;
  const absl::Time agent_start = absl::Now();
  ASSIGN_OR_RETURN(parts->agent,
                   config.make_agent ? config.make_agent() : MakeTransferAgent(config.transfer));
  LOG(INFO) << "worker start: " << parts->agent->transport() << " transfer agent up in "
            << absl::Now() - agent_start;
  uint32_t region = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, parts->BuildEngine(config, loaded, &region));
  engine->EnableCacheEvents(!config.router.empty());
  const uint64_t epoch = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  const absl::Time kv_side_start = absl::Now();
  ASSIGN_OR_RETURN(tandem::v1::TransferHandshake local,
                   parts->BuildKvSide(config, loaded, *engine, region, epoch));
  LOG(INFO) << "worker start: KV transfer side up in " << absl::Now() - kv_side_start;
  engine->AttachConnector(parts->connector.get());
  const WorkerOptions options = parts->MakeWorkerOptions(config, loaded, local, epoch);
  parts->BuildServing(config, std::move(engine), local, options, std::move(step_trace));
  std::string address;
  RETURN_IF_ERROR(parts->StartServer(config, advertise, &address));
  RETURN_IF_ERROR(parts->StartMetrics(config.metrics_listen));
  if (!config.router.empty()) parts->StartRegistration(config.router, config.security);
  LOG(INFO) << "worker " << config.worker_id << " epoch " << epoch << " serving on " << address;
  auto daemon = std::unique_ptr<WorkerDaemon>(new WorkerDaemon(std::move(parts)));
  daemon->address_ = address;
  daemon->worker_id_ = config.worker_id;
  daemon->epoch_ = epoch;
  return daemon;
}

WorkerDaemon::WorkerDaemon(std::unique_ptr<Parts> parts)
    : parts_(std::move(parts)), worker_(parts_->worker.get()) {}

int WorkerDaemon::metrics_port() const {
  return parts_->metrics == nullptr ? 0 : parts_->metrics->port();
}

WorkerDaemon::~WorkerDaemon() {
  parts_->metrics.reset();
  if (parts_->registration != nullptr) parts_->registration->Stop();
  if (parts_->server != nullptr) {
    parts_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    parts_->server->Wait();
  }
}

void WorkerDaemon::Drain(absl::Duration timeout) {
  // A prefill worker's finished requests may still hold KV leases a decode worker has yet to
  // read: keep serving KvTransferService until each is released (or expires, on the engine
  // loop's idle polls), so a restart under load costs no recompute and no failed request.
  auto leases = [this] { return parts_->connector->Stats().leases_active; };
  LOG(INFO) << "draining " << worker_->NumInFlight() << " requests, " << leases() << " KV leases";
  worker_->StartDraining();
  // Tell the router now, not at the next heartbeat, so it stops routing here at once.
  if (parts_->registration != nullptr) parts_->registration->HeartbeatNow();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  while ((worker_->NumInFlight() > 0 || leases() > 0) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (worker_->NumInFlight() > 0 || leases() > 0) {
    LOG(WARNING) << "drain timed out after " << timeout << " with " << worker_->NumInFlight()
                 << " requests and " << leases() << " KV leases left";
  } else {
    LOG(INFO) << "drained in " << absl::Now() - start;
  }
  // Last word to the router (DRAINING), then stop serving.
  if (parts_->registration != nullptr) {
    parts_->registration->Stop();
    parts_->registration.reset();
  }
  parts_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  parts_->server->Wait();
  parts_->listener.reset();
  parts_->server.reset();
}

}  // namespace tandem::runtime
