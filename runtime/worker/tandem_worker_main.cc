// //runtime:tandem_worker — the worker daemon (ARCHITECTURE.md, "Processes").
//
//   tandem_worker --role=prefill|decode|mixed --backend=cpu
//                 (--model=DIR | --load_format=dummy [--dummy_config=tiny] [--dummy_seed=0])
//                 [--listen=127.0.0.1:0] [--worker_id=ID] [--router=HOST:PORT]
//                 [--kv_cache_bytes=N] [--block_size=16] [--max_num_batched_tokens=2048]
//                 [--max_num_seqs=256] [--max_queued_requests=4096] [--num_threads=2]
//                 [--grpc_max_connections=4096] [--grpc_handshake_timeout_ms=30000]
//                 [--grpc_max_concurrent_streams=8192] [--grpc_memory_quota_mb=4096]
//                 [--lease_ms=30000]
//                 [--kv_load_timeout_ms=20000] [--kv_transport=ucx] [--ucx_tls=tcp,self,sm]
//                 [--ucx_net_device=auto] [--ucx_mirror_pin_granule_mb=-1]
//                 [--advertise_address=HOST]
//                 [--kv_transport=nccl --nccl_control_host=127.0.0.1]
//                 [--port_file=PATH] [--drain_timeout_ms=30000]
//                 [--step_trace=PATH [--step_trace_max_lines=1000000]]
//                 [--speculative_method=ngram --num_speculative_tokens=K [--ngram_min/max=N]]
//                 [--speculative_method=draft --draft_model=DIR|dummy:CONFIG[:SEED] ...]
//                 [--speculative_method=mtp --num_speculative_tokens=K]  (DeepSeek-V3 MTP)
//
// Serves WorkerService and KvTransferService on --listen (loopback by default), registers with
// the router and heartbeats. SIGTERM / SIGINT: stop taking requests (DRAINING), finish the ones
// in flight and serve the KV still leased to decode workers (up to --drain_timeout_ms), then
// exit 0.
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/daemon.h"
#include "common/grpc_listener_flags.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/security/flags.h"
#include "common/security/grpc_security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/engine/speculative_flags.h"
#include "runtime/parallel/group_backend.h"
#include "runtime/parallel/group_kv.h"
#include "runtime/worker/group_restart.h"
#include "runtime/worker/transfer_agent_factory.h"
#include "runtime/worker/worker_daemon.h"

ABSL_FLAG(std::string, role, "mixed", "prefill, decode or mixed");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda (CUDA builds)");
ABSL_FLAG(std::string, dtype, "auto", "cuda: bf16, fp16 or auto (fp16 for f16 checkpoints)");
ABSL_FLAG(int32_t, device, 0, "cuda: device ordinal");
ABSL_FLAG(double, gpu_memory_utilization, 0.9,
          "cuda with --kv_cache_bytes=0: fraction of free device memory to use");
ABSL_FLAG(bool, cuda_graphs, true, "cuda: capture decode steps as CUDA graphs");
ABSL_FLAG(bool, checkpoint_on_device, true,
          "cuda: read a dense 16/32-bit --model checkpoint straight into device memory, each rank "
          "its part (false: through fp32 host weights, for comparisons)");
ABSL_FLAG(std::string, prefill_kernel, "auto",
          "cuda: auto (Hopper wgmma where supported), mma (mma.sync) or decode (no prefill "
          "kernel)");
ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, load_format, "auto", "auto (read --model) or dummy (random weights)");
ABSL_FLAG(std::string, dummy_config, "tiny", "preset or config.json for --load_format=dummy");
ABSL_FLAG(uint64_t, dummy_seed, 0, "weight seed for --load_format=dummy");
ABSL_FLAG(std::string, quantization, "",
          "fp8: quantize the linear layers of a 16/32-bit checkpoint to FP8 at load (per-channel "
          "weights, dynamic per-token activations); empty: as the checkpoint says");
ABSL_FLAG(bool, quantize_lm_head, false,
          "lm_head to FP8 too (per-row scales, per-token activations), with --quantization=fp8 "
          "or on an FP8 checkpoint: faster batch-1 decode, logits less exact; Llama family");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address (port 0 = any free port)");
ABSL_FLAG(std::string, worker_id, "",
          "unique worker name (default: the one --tls_cert names; <role>-<port> with --insecure)");
ABSL_FLAG(std::string, router, "", "router address to register with (empty: standalone)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "KV cache budget in bytes");
ABSL_FLAG(int64_t, block_size, 16, "KV block size in tokens");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto (the backend's KV dtype) or fp8: e4m3 KV, DeepSeek MLA latents with a scale per "
          "token, K / V of other models with one scale per tensor (both backends)");
ABSL_FLAG(int64_t, max_num_batched_tokens, 2048, "token budget per step (chunked prefill)");
ABSL_FLAG(int64_t, max_num_seqs, 256, "running requests at most");
ABSL_FLAG(bool, async_scheduling, false,
          "schedule step s + 1 while step s runs (runtime/engine/engine.h; decode steps)");
ABSL_FLAG(int64_t, max_queued_requests, 4096,
          "requests waiting to run at most (more: RESOURCE_EXHAUSTED)");
ABSL_FLAG(std::string, step_trace, "",
          "write one JSON line per model step here (step_trace.h: time, gap, batch shape)");
ABSL_FLAG(int64_t, step_trace_max_lines, 1000000, "step trace lines at most");
ABSL_FLAG(int64_t, max_model_len, 0, "0 = the model's max_position_embeddings");
ABSL_FLAG(int32_t, num_threads, 2, "CPU threads for the model");
ABSL_FLAG(int64_t, lease_ms, 30000, "default lease of prefilled KV held for a decode worker");
ABSL_FLAG(int64_t, kv_load_timeout_ms, 20000, "give up loading remote KV after this long");
ABSL_FLAG(std::string, kv_transport, "ucx",
          "KV transfer agent: ucx, or nccl (--backend=cuda; GPU peers on one fabric)");
ABSL_FLAG(std::string, ucx_tls, "tcp,self,sm", "UCX transports (UCX_TLS)");
ABSL_FLAG(std::string, ucx_net_device, "auto",
          "UCX network device (UCX_NET_DEVICES); auto: the interface of the advertised address");
ABSL_FLAG(int64_t, ucx_mirror_pin_granule_mb, -1,
          "--kv_transport=ucx with --backend=cuda: page-lock the KV pool's host mirror this many "
          "MiB at a time as transfers first use it; 0: all of it at start (81 s for a ~104 GB "
          "pool on nvidia-h200-x4); -1: the agent's default (16 MiB, kvtransfer/ucx/ucx_agent.h). "
          "Use one value on every worker");
ABSL_FLAG(std::string, advertise_address, "",
          "host peers reach this worker at (default: the --listen host; with a wildcard "
          "--listen, this host's first non-loopback address)");
ABSL_FLAG(std::string, nccl_control_host, "127.0.0.1",
          "--kv_transport=nccl: address the NCCL agent's control socket binds to");
ABSL_FLAG(std::string, port_file, "", "write HOST:PORT here once serving");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT of the HTTP plane with GET /metrics (Prometheus) and /health (empty: off)");
ABSL_FLAG(int64_t, drain_timeout_ms, 30000,
          "on SIGTERM, wait this long for requests in flight and KV leases held for decode");
ABSL_FLAG(bool, restart_broken_group, true,
          "--tp > 1: when a rank dies or wedges, rank 0 restarts the whole group in place (same "
          "pid and address, a new epoch; runtime/worker/group_restart.h); ranks a launcher "
          "started (--rank): rank 0 exits 1 for the launcher to restart them. false: the worker "
          "stays NOT_SERVING until restarted");
ABSL_FLAG(int32_t, group_restarts, 0,
          "internal: set by rank 0 when it restarts its broken group: quick restarts in a row "
          "(the back-off)");

namespace tandem::runtime {
namespace {

absl::StatusOr<tandem::v1::WorkerRole> ParseRole(const std::string& role) {
  if (role == "prefill") return tandem::v1::WORKER_ROLE_PREFILL;
  if (role == "decode") return tandem::v1::WORKER_ROLE_DECODE;
  if (role == "mixed") return tandem::v1::WORKER_ROLE_MIXED;
  return absl::InvalidArgumentError(
      absl::StrCat("--role must be prefill, decode or mixed, got '", role, "'"));
}

absl::StatusOr<WorkerConfig> ConfigFromFlags() {
  WorkerConfig config;
  ASSIGN_OR_RETURN(config.role, ParseRole(absl::GetFlag(FLAGS_role)));
  config.model.model_dir = absl::GetFlag(FLAGS_model);
  config.model.load_format = absl::GetFlag(FLAGS_load_format);
  config.model.dummy_config = absl::GetFlag(FLAGS_dummy_config);
  config.model.dummy_seed = absl::GetFlag(FLAGS_dummy_seed);
  config.model.quantization = absl::GetFlag(FLAGS_quantization);
  config.model.quantize_lm_head = absl::GetFlag(FLAGS_quantize_lm_head);
  config.backend.backend = absl::GetFlag(FLAGS_backend);
  config.backend.num_threads = absl::GetFlag(FLAGS_num_threads);
  config.backend.device = absl::GetFlag(FLAGS_device);
  config.backend.dtype = absl::GetFlag(FLAGS_dtype);
  config.backend.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  config.backend.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  config.backend.checkpoint_on_device = absl::GetFlag(FLAGS_checkpoint_on_device);
  config.backend.prefill_kernel = absl::GetFlag(FLAGS_prefill_kernel);
  config.backend.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  // An FP8 latent block is one range on either backend (its codes then its row scales:
  // runtime/engine/kv_layout.h Fp8LatentBlocks) and moves P -> D like any block.
  config.engine.block_size = absl::GetFlag(FLAGS_block_size);
  config.engine.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  config.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  config.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  config.engine.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  config.engine.num_threads = absl::GetFlag(FLAGS_num_threads);
  config.engine.async_scheduling = absl::GetFlag(FLAGS_async_scheduling);
  // Speculative decoding on decode and mixed workers; a prefill worker never speculates. With
  // --speculative_method=mtp a prefill worker loads the MTP layer too and runs it over its
  // prompts for the decode workers (PrefillResponse.mtp_handoff; it drafts nothing: its requests
  // end at their first token).
  ASSIGN_OR_RETURN(SpeculativeConfig speculative, SpeculativeConfigFromFlags());
  if (config.role != tandem::v1::WORKER_ROLE_PREFILL ||
      speculative.method == SpeculativeMethod::kMtp) {
    config.engine.speculative = speculative;
  }
  if (config.engine.speculative.method == SpeculativeMethod::kDraft) {
    ASSIGN_OR_RETURN(config.draft_model, DraftModelSourceFromFlags());
  }
  config.transfer.transport = absl::GetFlag(FLAGS_kv_transport);
  config.transfer.ucx_tls = absl::GetFlag(FLAGS_ucx_tls);
  config.transfer.ucx_net_device = absl::GetFlag(FLAGS_ucx_net_device);
  if (const int64_t mb = absl::GetFlag(FLAGS_ucx_mirror_pin_granule_mb); mb >= 0) {
    config.transfer.ucx_mirror_pin_granule_bytes = static_cast<uint64_t>(mb) << 20;
  }
  config.transfer.nccl_control_host = absl::GetFlag(FLAGS_nccl_control_host);
  config.listen = absl::GetFlag(FLAGS_listen);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.advertise_host = absl::GetFlag(FLAGS_advertise_address);
  config.worker_id = absl::GetFlag(FLAGS_worker_id);
  config.router = absl::GetFlag(FLAGS_router);
  config.default_lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  config.kv_load_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_load_timeout_ms));
  config.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  config.step_trace = absl::GetFlag(FLAGS_step_trace);
  config.step_trace_max_lines = absl::GetFlag(FLAGS_step_trace_max_lines);
  absl::StatusOr<tandem::GrpcListenerOptions> port = tandem::GrpcListenerOptionsFromFlags();
  if (!port.ok()) return port.status();
  config.grpc_port = *port;
  return config;
}

// A rank > 0. In a prefill or decode group it also moves its own KV heads: its transfer agent
// serves its pool to readers and reads the heads it holds when rank 0 says so (group_kv.h).
absl::Status ServeFollower(WorkerConfig& config, GroupBackend group) {
  if (config.role == tandem::v1::WORKER_ROLE_MIXED) return RunFollowerRank(std::move(group));
  config.transfer.cuda_pool = config.backend.backend == "cuda";
  config.transfer.device = group.group->device();
  const std::string& bind = group.group->bind_host();
  if (bind.empty() || bind.rfind("127.", 0) == 0) {
    // Ranks rank 0 started (collectives on loopback) serve KV where rank 0 does: the interface of
    // the advertised host, resolved from the same flags. Before, "all": a group configured on
    // 127.0.0.1 had rank 1 listening on the host's external address too.
    ASSIGN_OR_RETURN(config.transfer.ucx_net_device, ResolveUcxNetDevice(config));
  } else if (config.transfer.ucx_net_device == "auto") {
    // A launched rank: the interface of its --dist_bind address (the fabric the group was told
    // to use).
    absl::StatusOr<std::string> iface = InterfaceForAddress(bind);
    config.transfer.ucx_net_device = iface.ok() ? *iface : "all";
  }
  ASSIGN_OR_RETURN(std::unique_ptr<kvtransfer::TransferAgent> agent,
                   MakeTransferAgent(config.transfer));
  RankKvEndpointOptions options;
  options.model = group.loaded.model.config;
  options.kv_dtype = group.local_factory.kv_dtype;
  options.tp_rank = group.group->rank();
  options.tp_size = group.group->size();
  options.dcp_size = static_cast<int>(group.local_factory.dcp_size);
  options.dcp_interleave = group.local_factory.dcp_interleave;
  options.dp_size = static_cast<int>(group.local_factory.dp_size);
  RankKvEndpoint endpoint(agent.get(), options);
  return RunFollowerRank(std::move(group), &endpoint);
}

// --tls_* / --insecure (common/security) into config.security: every internal channel and server
// of this worker uses them. A worker's certificate must name its --role and its worker
// (spiffe://tandem/role/<role>/worker/<id>, make_certs.sh --worker=ID:ROLE): KV leases are bound
// to decode workers by id, and a worker proves its id with its certificate. --worker_id defaults
// to the certificate's and may not differ from it.
absl::Status SetUpSecurity(WorkerConfig& config) {
  ASSIGN_OR_RETURN(security::SecurityConfig sec,
                   security::DaemonSecurityFromFlags("tandem_worker"));
  const std::string role = absl::GetFlag(FLAGS_role);
  if (!sec.insecure && security::RoleName(sec.self->role) != role) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_cert names role '",
                                                   security::RoleName(sec.self->role),
                                                   "', this worker is --role=", role));
  }
  if (!sec.insecure) {
    const std::string& named = sec.self->worker_id;
    if (named.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert is a role certificate (", sec.self->ToString(),
          "); a worker needs its own, naming its worker id: deploy/certs/make_certs.sh DIR "
          "--worker=ID:",
          role));
    }
    if (!config.worker_id.empty() && config.worker_id != named) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker_id=", config.worker_id, " but --tls_cert is worker ", named));
    }
    config.worker_id = named;
  }
  config.security = std::move(sec);
  return absl::OkStatus();
}

// What main does once every part of the worker is gone (the group's rank processes too).
struct ServeResult {
  // Rank 0 of a broken local group: run this binary again in place with these flags appended.
  std::optional<std::vector<std::string>> restart_with;
};

// The flags rank 0 restarts its group with: the address it was bound to (a --listen or
// --metrics_listen port 0 became a real one: the router and peers keep it), its worker id, and
// its count of quick restarts in a row (GroupRestartDelay).
std::vector<std::string> RestartFlags(const WorkerDaemon& daemon, int quick_restarts) {
  auto with_port = [](const std::string& listen, absl::string_view bound) {
    return absl::StrCat(listen.substr(0, listen.rfind(':')), bound.substr(bound.rfind(':')));
  };
  std::vector<std::string> flags = {
      absl::StrCat("--listen=", with_port(absl::GetFlag(FLAGS_listen), daemon.address())),
      absl::StrCat("--worker_id=", daemon.worker_id()),
      absl::StrCat("--group_restarts=", quick_restarts)};
  if (const std::string metrics = absl::GetFlag(FLAGS_metrics_listen); !metrics.empty()) {
    flags.push_back(absl::StrCat("--metrics_listen=",
                                 with_port(metrics, absl::StrCat(":", daemon.metrics_port()))));
  }
  return flags;
}

// Rank 0 (or a worker of one rank): serves until a signal (drain, exit 0) or, with
// --restart_broken_group, until its group breaks (group_restart.h).
absl::StatusOr<ServeResult> ServeLeader(WorkerConfig config, GroupBackend group,
                                        const RankGroupOptions& group_options,
                                        TerminationSignals& signals) {
  config.tp = group.group->size();
  config.group_channel = group.channel;
  config.group.set_size(static_cast<uint32_t>(config.tp));
  config.group.set_dcp_size(static_cast<uint32_t>(group_options.dcp));
  config.group.set_dcp_interleave(static_cast<uint32_t>(group_options.dcp_interleave));
  if (config.tp > 1) {
    const bool cuda = config.backend.backend == "cuda";
    config.group.set_backend(!cuda                              ? "gloo"
                             : group_options.TpComm() == "nccl" ? "nccl"
                                                                : "gloo-host-staged");
    if (cuda && group_options.rank < 0) {  // this host started every rank
      for (int r = 0; r < config.tp; ++r) {
        config.group.add_devices(group_options.share_device ? config.backend.device
                                                            : config.backend.device + r);
      }
    }
  }
  config.loaded = std::move(group.loaded);
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerDaemon> daemon, WorkerDaemon::Create(std::move(config)));
  std::printf("worker %s (%s) listening on %s\n", daemon->worker_id().c_str(),
              absl::GetFlag(FLAGS_role).c_str(), daemon->address().c_str());
  std::fflush(stdout);
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    RETURN_IF_ERROR(WritePortFile(file, daemon->address()));
  }
  const absl::Time serving_since = absl::Now();
  std::function<absl::Status()> group_health;
  if (group.channel != nullptr && absl::GetFlag(FLAGS_restart_broken_group)) {
    group_health = [&group] {
      RETURN_IF_ERROR(group.group->CheckRanksAlive());
      return group.channel->status();
    };
  }
  const ServeEnd end = WaitForSignalOrBrokenGroup(signals, group_health);
  if (end.signal != 0) {
    LOG(INFO) << "signal " << end.signal;
    daemon->Drain(absl::Milliseconds(absl::GetFlag(FLAGS_drain_timeout_ms)));
    std::printf("worker %s stopped\n", daemon->worker_id().c_str());
    return ServeResult{};
  }
  // Nothing in flight can finish (its steps fail): tell the router now, stop serving, end the
  // other ranks at once, then let go of the engine and the group.
  LOG(ERROR) << "worker group broken: " << end.broken;
  daemon->Drain(absl::ZeroDuration());
  const int quick =
      absl::Now() - serving_since < kStableServing ? absl::GetFlag(FLAGS_group_restarts) + 1 : 1;
  std::vector<std::string> restart = RestartFlags(*daemon, quick);
  group.group->KillRanks();
  daemon.reset();
  group.channel.reset();
  group.group.reset();
  if (group_options.rank >= 0) {
    return absl::UnavailableError(absl::StrCat(
        end.broken.message(), "; rank 0 exits so that its launcher restarts every rank"));
  }
  const absl::Duration delay = GroupRestartDelay(quick);
  std::printf("worker group broken (%s); restarting it in place (quick restart %d, in %s)\n",
              std::string(end.broken.message()).c_str(), quick,
              absl::FormatDuration(delay).c_str());
  if (const int sig = signals.WaitFor(delay); sig != 0) return ServeResult{};
  return ServeResult{std::move(restart)};
}

absl::StatusOr<ServeResult> Serve(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(WorkerConfig config, ConfigFromFlags());
  RETURN_IF_ERROR(SetUpSecurity(config));
  // Every rank runs with the worker's certificate, so all derive the same key and accept the
  // NCCL control tokens rank 0's KvTransferService hands out.
  config.transfer.nccl_token_key = NcclControlTokenKey(config.security);
  TerminationSignals signals;  // before any thread starts
  RaiseOpenFileLimit();        // peers' connections and KV transfers are descriptors
  IgnoreBrokenPipes();         // a dead rank or peer is an error, not SIGPIPE
  const RankGroupOptions group_options = RankGroupOptionsFromFlags(config.backend.device);
  if (group_options.dcp > 1 && config.role == tandem::v1::WORKER_ROLE_PREFILL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp=", group_options.dcp,
        " with --role=prefill: decode context parallelism is for "
        "decode and mixed groups (a prefill group of any --tp hands whole blocks to a DCP decode "
        "group)"));
  }
  // A worker group (--tp): rank 0 serves, the other ranks execute its steps. Declared before
  // the daemon: the group outlives the engine that uses it.
  ASSIGN_OR_RETURN(GroupBackend group,
                   LoadGroupBackend(config.model, config.backend, group_options, argv));
  if (!group.is_leader()) {
    RETURN_IF_ERROR(ServeFollower(config, std::move(group)));
    return ServeResult{};
  }
  return ServeLeader(std::move(config), std::move(group), group_options, signals);
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status logging = tandem::InitLogging(argv[0]); !logging.ok()) {
    std::fprintf(stderr, "tandem_worker: %s\n", logging.ToString().c_str());
  }
  absl::StatusOr<tandem::runtime::ServeResult> result = tandem::runtime::Serve(args);
  if (result.ok() && result->restart_with.has_value()) {
    result = tandem::runtime::ExecSelf(args, *result->restart_with);  // returns only on failure
  }
  if (!result.ok()) {
    std::fprintf(stderr, "tandem_worker: %s\n", result.status().ToString().c_str());
    return 1;
  }
  return 0;
}
