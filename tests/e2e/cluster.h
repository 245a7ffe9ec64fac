// Test harness for multi-process serving tests: spawns the real tandem_router and tandem_worker
// binaries (from the test's runfiles) on loopback, waits until the router sees every worker
// healthy, and hands out gRPC stubs. Processes are killed (SIGKILL) when the Cluster goes away.
//
// Secure by default (`tls`): certificates from deploy/certs/make_certs.sh (a runfile), the
// router's public port with TLS and an API key (the router stub sends it with every call), its
// internal port (mTLS) where the workers register with their own certificates (certs_dir/ID.pem,
// naming worker ID and its role: KV leases are bound to decode workers by id), and worker
// stubs that present the admin certificate (Stats). `tls = false` runs everything --insecure.
#ifndef TANDEM_TESTS_E2E_CLUSTER_H_
#define TANDEM_TESTS_E2E_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::e2e {

// A child process with stdout/stderr in a log file.
class Process {
 public:
  static absl::StatusOr<std::unique_ptr<Process>> Spawn(const std::vector<std::string>& argv,
                                                        const std::string& log_path);
  ~Process();  // SIGKILL + reap if still running
  void Signal(int sig);
  // Waits up to `timeout` for exit; returns the wait status, or -1 on timeout.
  int Wait(absl::Duration timeout);
  bool Running();
  pid_t pid() const { return pid_; }
  std::string LogTail(int max_bytes = 4000) const;

 private:
  Process(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}
  pid_t pid_;
  std::string log_;
  bool reaped_ = false;
};

struct ClusterOptions {
  int prefill = 1;
  int decode = 1;
  int mixed = 0;
  std::string model_dir;  // runfiles-relative or absolute HF directory
  // When set, workers use --load_format=dummy --dummy_config=<this> instead of model_dir.
  std::string dummy_config;
  std::vector<std::string> worker_flags;
  // Added after worker_flags for the workers of one role (e.g. --tp=2 for the prefill group).
  std::vector<std::string> prefill_flags, decode_flags, mixed_flags;
  std::vector<std::string> router_flags;
  bool tls = true;
  // More worker certificates ("ID:ROLE", naming ID), for tests that speak as a worker they do
  // not start (the registry admits a worker id only with a certificate naming it).
  std::vector<std::string> extra_worker_certs;
};

struct WorkerHandle {
  std::string id;
  std::string role;
  std::string address;
  std::vector<std::string> argv;  // how it was started (RestartWorker reuses it)
  int restarts = 0;
  std::unique_ptr<Process> process;
  std::unique_ptr<tandem::v1::WorkerService::Stub> stub;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  ~Cluster();

  tandem::v1::Router::Stub& router() { return *router_stub_; }
  const std::string& router_address() const { return router_address_; }
  // Where workers register (the router's internal port; router_address() when insecure).
  const std::string& internal_address() const { return internal_address_; }
  // With TLS: the certificates' directory (ca.pem, NAME.pem/key, api_key); empty otherwise.
  const std::string& certs_dir() const { return certs_dir_; }
  // The public port's operator (admin) API key, make_certs.sh's admin_api_key (empty when
  // insecure): it generates and lists workers.
  const std::string& api_key() const { return api_key_; }
  std::vector<WorkerHandle>& workers() { return workers_; }
  WorkerHandle* worker(const std::string& id);
  // `wait_for_ready`: the call waits (up to its 5 s deadline) for the channel to connect instead
  // of failing at once while it reconnects, for a caller waiting for a restarted worker.
  absl::StatusOr<tandem::v1::WorkerStats> Stats(const std::string& worker_id,
                                                bool wait_for_ready = false);
  // Kills the worker with `sig` (if running), waits for it to exit, and starts it again with
  // the same flags on the same address (a new process: a new epoch). Returns once it serves
  // (its port file is written); the router learns of it by its registration.
  absl::Status RestartWorker(const std::string& worker_id, int sig);
  // Waits until the router reports exactly `healthy` healthy workers.
  absl::Status WaitHealthy(int healthy, absl::Duration timeout);
  std::string Logs();
  // The router process (tests signal it and read its /proc entries).
  Process& router_process() { return *router_process_; }
  // Kills the router with `sig` (if running), waits for it to exit, and starts it again with
  // the same flags on the same address. Returns once it listens; the workers register with it
  // again on their own (their heartbeats come back unknown). router() is a new stub then (the
  // old channel would wait out gRPC's reconnect backoff).
  absl::Status RestartRouter(int sig);

 private:
  std::string dir_;
  std::vector<std::string> router_argv_;  // how the router was started
  int router_restarts_ = 0;
  std::unique_ptr<Process> router_process_;
  std::string router_address_;
  std::string internal_address_;
  std::string certs_dir_;
  std::string api_key_;
  std::unique_ptr<tandem::v1::Router::Stub> router_stub_;
  std::vector<WorkerHandle> workers_;
};

// The TLS flags presenting certificate NAME of `certs_dir` ({"--insecure"} when it is empty).
std::vector<std::string> SecurityFlags(const std::string& certs_dir, const std::string& name);

// Path of a runfile of this workspace (e.g. "runtime/tandem_worker").
std::string Runfile(const std::string& path);

}  // namespace tandem::e2e

#endif  // TANDEM_TESTS_E2E_CLUSTER_H_
