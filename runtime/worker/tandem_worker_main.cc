// //runtime:tandem_worker — the worker daemon (ARCHITECTURE.md, "Processes").
//
//   tandem_worker --role=prefill|decode|mixed --backend=cpu
//                 (--model=DIR | --load_format=dummy [--dummy_config=tiny] [--dummy_seed=0])
//                 [--listen=127.0.0.1:0] [--worker_id=ID] [--router=HOST:PORT]
//                 [--kv_cache_bytes=N] [--block_size=16] [--max_num_batched_tokens=2048]
//                 [--max_num_seqs=256] [--max_queued_requests=4096] [--num_threads=2]
//                 [--lease_ms=30000]
//                 [--kv_load_timeout_ms=20000] [--kv_transport=ucx] [--ucx_tls=tcp,self,sm]
//                 [--ucx_net_device=lo] [--kv_transport=nccl --nccl_control_host=127.0.0.1]
//                 [--port_file=PATH] [--drain_timeout_ms=30000]
//
// Serves WorkerService and KvTransferService on --listen (loopback by default), registers with
// the router and heartbeats. SIGTERM / SIGINT: stop taking requests (DRAINING), finish the ones
// in flight (up to --drain_timeout_ms), then exit 0.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "kvtransfer/handshake.h"
#include "kvtransfer/kv_transfer_service.h"
#include "kvtransfer/pull_connector.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"
#include "runtime/worker/engine_loop.h"
#include "runtime/worker/router_registration.h"
#include "runtime/worker/transfer_agent_factory.h"
#include "runtime/worker/worker_service.h"
#include "tandem/v1/limits.h"

ABSL_FLAG(std::string, role, "mixed", "prefill, decode or mixed");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda (CUDA builds)");
ABSL_FLAG(std::string, dtype, "auto", "cuda: bf16, fp16 or auto (fp16 for f16 checkpoints)");
ABSL_FLAG(int32_t, device, 0, "cuda: device ordinal");
ABSL_FLAG(double, gpu_memory_utilization, 0.9,
          "cuda with --kv_cache_bytes=0: fraction of free device memory to use");
ABSL_FLAG(bool, cuda_graphs, true, "cuda: capture decode steps as CUDA graphs");
ABSL_FLAG(std::string, prefill_kernel, "auto",
          "cuda: auto (Hopper wgmma where supported), mma (mma.sync) or decode (no prefill "
          "kernel)");
ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, load_format, "auto", "auto (read --model) or dummy (random weights)");
ABSL_FLAG(std::string, dummy_config, "tiny", "preset or config.json for --load_format=dummy");
ABSL_FLAG(uint64_t, dummy_seed, 0, "weight seed for --load_format=dummy");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address (port 0 = any free port)");
ABSL_FLAG(std::string, worker_id, "", "unique worker name (default: <role>-<port>)");
ABSL_FLAG(std::string, router, "", "router address to register with (empty: standalone)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "KV cache budget in bytes");
ABSL_FLAG(int64_t, block_size, 16, "KV block size in tokens");
ABSL_FLAG(int64_t, max_num_batched_tokens, 2048, "token budget per step (chunked prefill)");
ABSL_FLAG(int64_t, max_num_seqs, 256, "running requests at most");
ABSL_FLAG(int64_t, max_queued_requests, 4096,
          "requests waiting to run at most (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, max_model_len, 0, "0 = the model's max_position_embeddings");
ABSL_FLAG(int32_t, num_threads, 2, "CPU threads for the model");
ABSL_FLAG(int64_t, lease_ms, 30000, "default lease of prefilled KV held for a decode worker");
ABSL_FLAG(int64_t, kv_load_timeout_ms, 20000, "give up loading remote KV after this long");
ABSL_FLAG(std::string, kv_transport, "ucx",
          "KV transfer agent: ucx, or nccl (--backend=cuda; GPU peers on one fabric)");
ABSL_FLAG(std::string, ucx_tls, "tcp,self,sm", "UCX transports (UCX_TLS)");
ABSL_FLAG(std::string, ucx_net_device, "lo", "UCX network device (UCX_NET_DEVICES)");
ABSL_FLAG(std::string, nccl_control_host, "127.0.0.1",
          "--kv_transport=nccl: address the NCCL agent's control socket binds to");
ABSL_FLAG(std::string, port_file, "", "write HOST:PORT here once serving");
ABSL_FLAG(int64_t, drain_timeout_ms, 30000, "on SIGTERM, wait this long for requests in flight");

namespace tandem::runtime {
namespace {

absl::StatusOr<tandem::v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return tandem::v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return tandem::v1::WORKER_ROLE_DECODE;
  if (role == "mixed") return tandem::v1::WORKER_ROLE_MIXED;
  return absl::InvalidArgumentError(
      absl::StrCat("--role must be prefill, decode or mixed, got '", role, "'"));
}

tandem::v1::KvDtype ToProto(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return tandem::v1::KV_DTYPE_F32;
    case KvDtype::kF16:
      return tandem::v1::KV_DTYPE_F16;
    case KvDtype::kBf16:
      return tandem::v1::KV_DTYPE_BF16;
  }
  return tandem::v1::KV_DTYPE_UNSPECIFIED;
}

// What a peer must match exactly (hashed), from the engine's own facts: the backend names its KV
// dtype (ExecutorFactory::kv_dtype); the model runs in the same dtype.
tandem::v1::CompatibilityInfo Compatibility(const std::string& model_id, const Engine& engine) {
  const ModelConfig& m = engine.model_config();
  kvtransfer::KvCompatibilityFacts facts;
  facts.model_id = model_id;
  facts.model_dtype = KvDtypeName(engine.kv_dtype());
  facts.num_layers = static_cast<uint32_t>(m.num_hidden_layers);
  facts.num_kv_heads = static_cast<uint32_t>(m.num_key_value_heads);
  facts.head_dim = static_cast<uint32_t>(m.head_dim);
  facts.block_size = static_cast<uint32_t>(engine.block_size());
  facts.kv_dtype = ToProto(engine.kv_dtype());
  return kvtransfer::CompatibilityFor(facts);
}

absl::Status Serve() {
  ASSIGN_OR_RETURN(tandem::v1::WorkerRole role, ParseRole(absl::GetFlag(FLAGS_role)));
  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ModelSource source;
  source.model_dir = absl::GetFlag(FLAGS_model);
  source.load_format = absl::GetFlag(FLAGS_load_format);
  source.dummy_config = absl::GetFlag(FLAGS_dummy_config);
  source.dummy_seed = absl::GetFlag(FLAGS_dummy_seed);
  BackendOptions backend;
  backend.backend = absl::GetFlag(FLAGS_backend);
  backend.num_threads = absl::GetFlag(FLAGS_num_threads);
  backend.device = absl::GetFlag(FLAGS_device);
  backend.dtype = absl::GetFlag(FLAGS_dtype);
  backend.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  backend.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  backend.prefill_kernel = absl::GetFlag(FLAGS_prefill_kernel);
  ASSIGN_OR_RETURN(BackendModel loaded, LoadModelForBackend(source, backend));
  LoadedModel& model = loaded.model;
  const ExecutorFactory& factory = loaded.factory;
  EngineConfig engine_config;
  engine_config.block_size = absl::GetFlag(FLAGS_block_size);
  engine_config.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  engine_config.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  engine_config.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  engine_config.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  engine_config.num_threads = absl::GetFlag(FLAGS_num_threads);
  // KV transfer: the whole pool registered once (allocated by the agent where it can share it
  // best: UCX-mapped memory that shared-memory transports read in place); one connector for both
  // directions.
  TransferAgentFlags agent_flags;
  agent_flags.transport = absl::GetFlag(FLAGS_kv_transport);
  agent_flags.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  agent_flags.ucx_net_device = absl::GetFlag(FLAGS_ucx_net_device);
  agent_flags.cuda_pool = backend.backend == "cuda";
  agent_flags.device = backend.device;
  agent_flags.nccl_control_host = absl::GetFlag(FLAGS_nccl_control_host);
  ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::TransferAgent> agent,
                   MakeTransferAgent(agent_flags));
  std::optional<uint32_t> region;
  KvPoolAllocator allocator = [&](int64_t bytes) -> absl::StatusOr<void*> {
    absl::StatusOr<std::pair<void*, uint32_t>> shared =
        agent->AllocateMemory(static_cast<uint64_t>(bytes), tandem::v1::MEMORY_KIND_HOST);
    if (shared.status().code() == absl::StatusCode::kUnimplemented) return nullptr;
    if (!shared.ok()) return shared.status();
    region = shared->second;
    return shared->first;
  };
  ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(engine_config, model.config, std::move(model.weights), allocator, &factory));
  if (!region.has_value()) {  // the agent did not allocate: register the engine's own pool
    absl::StatusOr<uint32_t> registered = agent->RegisterMemory(
        engine->kv_pool_data(), engine->kv_pool_bytes(),
        engine->kv_pool_on_device() ? tandem::v1::MEMORY_KIND_CUDA : tandem::v1::MEMORY_KIND_HOST);
    if (!registered.ok()) {
      return absl::Status(
          registered.status().code(),
          absl::StrCat("registering the ", factory.name, " backend's KV pool with the ",
                       agent->transport(), " transfer agent: ", registered.status().message()));
    }
    region = *registered;
  }
  const std::string router = absl::GetFlag(FLAGS_router);
  engine->EnableCacheEvents(!router.empty());
  const uint64_t epoch = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  kvtransfer::PullKvConnectorOptions connector_options;
  connector_options.block_size = engine->block_size();
  connector_options.block_bytes = static_cast<uint64_t>(engine->kv_block_bytes());
  connector_options.local_region = *region;
  connector_options.remote_region = 0;
  connector_options.first_lease_id = std::random_device{}() | 1;
  auto connector = std::make_unique<kvtransfer::PullKvConnector>(agent.get(), connector_options);
  engine->AttachConnector(connector.get());

  const std::string listen = absl::GetFlag(FLAGS_listen);
  tandem::v1::TransferHandshake local;
  *local.mutable_compatibility() = Compatibility(model.model_id, *engine);
  *local.mutable_geometry() = kvtransfer::SingleRankGeometry(
      local.compatibility(), static_cast<uint64_t>(engine->kv_block_bytes()));
  local.set_compatibility_hash(kvtransfer::CompatibilityHash(local.compatibility()));
  local.set_epoch(epoch);

  WorkerOptions options;
  options.epoch = epoch;
  options.role = role;
  options.model_id = model.model_id;
  options.kv_layout_hash = local.compatibility_hash();
  options.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.kv_load_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_load_timeout_ms));
  EngineLoopOptions loop_options;
  loop_options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  if (loop_options.max_queued_requests < 1) {
    return absl::InvalidArgumentError("--max_queued_requests must be >= 1");
  }
  EngineLoop loop(std::move(engine), loop_options);

  // The port is known only after the server starts; the services learn the final address before
  // it is announced (printed, written to --port_file, registered).
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(tandem::v1::kMaxGrpcMessageBytes));
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) {
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    worker_id = absl::StrCat(absl::GetFlag(FLAGS_role), "-", hostname, "-", getpid());
  }
  if (worker_id.size() > static_cast<size_t>(tandem::v1::kMaxIdBytes)) {
    return absl::InvalidArgumentError("--worker_id is too long");
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  options.worker_id = worker_id;
  local.set_worker_id(worker_id);
  auto kv_service =
      std::make_unique<kvtransfer::KvTransferServiceImpl>(agent.get(), connector.get(), local);
  auto peers = std::make_unique<kvtransfer::PeerLinks>(agent.get(), local);
  Worker worker(&loop, connector.get(), peers.get(), options);
  WorkerServiceImpl service(&worker);
  builder.RegisterService(&service);
  builder.RegisterService(kv_service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  const std::string address = absl::StrCat(host, ":", port);
  worker.SetAddress(address);
  LOG(INFO) << "worker " << worker_id << " epoch " << epoch;
  std::printf("worker %s (%s) listening on %s\n", worker_id.c_str(),
              absl::GetFlag(FLAGS_role).c_str(), address.c_str());
  std::fflush(stdout);
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::ofstream(file + ".tmp") << address << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }

  std::unique_ptr<RouterRegistration> registration;
  if (!router.empty()) {
    RegistrationCallbacks callbacks;
    callbacks.info = [&worker] { return worker.Info(); };
    callbacks.status = [&worker] { return worker.status(); };
    callbacks.load = [&worker] { return worker.Load(); };
    callbacks.cache_events = [&loop](std::vector<uint64_t>* added, std::vector<uint64_t>* removed) {
      loop.TakeCacheEvents(added, removed);
    };
    callbacks.all_cached_hashes = [&loop] { return loop.CachedHashes(); };
    registration = std::make_unique<RouterRegistration>(router, std::move(callbacks));
    registration->Start();
  }

  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "signal " << sig << ": draining " << loop.NumInFlight() << " requests";
  worker.StartDraining();
  const absl::Time drain_deadline =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms));
  while (loop.NumInFlight() > 0 && absl::Now() < drain_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (registration != nullptr) registration->Stop();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server->Wait();
  std::printf("worker %s stopped\n", worker_id.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status logging = tandem::InitLogging(argv[0]); !logging.ok()) {
    std::fprintf(stderr, "tandem_worker: %s\n", logging.ToString().c_str());
  }
  absl::Status status = tandem::runtime::Serve();
  if (!status.ok()) {
    std::fprintf(stderr, "tandem_worker: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
