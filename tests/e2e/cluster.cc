#include "tests/e2e/cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/security/grpc_security.h"
#include "common/security/security_config.h"
#include "grpcpp/grpcpp.h"

namespace tandem::e2e {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits for a non-empty port file written by the daemon once it listens.
absl::StatusOr<std::string> WaitPortFile(const std::string& path, Process& process,
                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string text = ReadFile(path);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (!text.empty()) return text;
    if (!process.Running()) {
      return absl::InternalError(
          absl::StrCat("process exited before listening:\n", process.LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no port file ", path, "\n", process.LogTail()));
}

// TLS material for the test's own clients: the CA, and NAME's certificate when given.
security::SecurityConfig ClientSecurity(const std::string& certs_dir, const std::string& name) {
  if (certs_dir.empty()) return security::SecurityConfig();
  security::SecurityOptions o;
  o.files.ca = certs_dir + "/ca.pem";
  if (!name.empty())
    o.files = {certs_dir + "/" + name + ".pem", certs_dir + "/" + name + ".key", o.files.ca};
  o.require_cert = !name.empty();
  absl::StatusOr<security::SecurityConfig> config = security::LoadSecurityConfig(o);
  if (!config.ok()) {
    std::fprintf(stderr, "cluster: %s\n", config.status().ToString().c_str());
    std::abort();
  }
  return *std::move(config);
}

// Generates the cluster's certificates and API key under `dir`: the role certificates plus one
// per worker (`workers`: "ID:ROLE"), naming it (a worker with TLS needs its own).
absl::Status MakeCerts(const std::string& dir, const std::vector<std::string>& workers) {
  std::string cmd =
      absl::StrCat("'", Runfile("deploy/certs/make_certs.sh"), "' '", dir, "' --api_key");
  for (const std::string& w : workers) absl::StrAppend(&cmd, " --worker=", w);
  absl::StrAppend(&cmd, " > '", dir, ".log' 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("make_certs.sh failed: ", ReadFile(dir + ".log")));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SecurityFlags(const std::string& certs_dir, const std::string& name) {
  if (certs_dir.empty()) return {"--insecure"};
  return {absl::StrCat("--tls_cert=", certs_dir, "/", name, ".pem"),
          absl::StrCat("--tls_key=", certs_dir, "/", name, ".key"),
          absl::StrCat("--tls_ca=", certs_dir, "/ca.pem")};
}

std::string Runfile(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) return path;
  return absl::StrCat(srcdir, "/tandem/", path);
}

absl::StatusOr<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv,
                                                        const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Said in the log when exec fails (e.g. the binary is being relinked): built before fork, the
  // child of a threaded process only write()s it.
  const std::string exec_failed =
      absl::StrCat("exec of ", argv.empty() ? "" : argv[0],
                   " failed (exit 127: missing, busy or not a binary)\n");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    // Unblock what the test runner may have blocked, so SIGTERM reaches the daemon's sigwait.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    [[maybe_unused]] const ssize_t said = write(2, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return 0;
}

bool Process::Running() {
  if (reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

std::string Process::LogTail(int max_bytes) const {
  std::string text = ReadFile(log_);
  if (static_cast<int>(text.size()) > max_bytes) text = text.substr(text.size() - max_bytes);
  return absl::StrCat("--- ", log_, " ---\n", text);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& options) {
  auto cluster = std::unique_ptr<Cluster>(new Cluster());
  const char* tmp = std::getenv("TEST_TMPDIR");
  char templ[512];
  snprintf(templ, sizeof(templ), "%s/cluster.XXXXXX", tmp != nullptr ? tmp : "/tmp");
  if (mkdtemp(templ) == nullptr) return absl::InternalError("mkdtemp failed");
  cluster->dir_ = templ;
  const std::string& dir = cluster->dir_;

  if (options.tls) {
    cluster->certs_dir_ = dir + "/certs";
    std::vector<std::string> workers;
    for (const auto& [role, count] : {std::pair<std::string, int>{"prefill", options.prefill},
                                      {"decode", options.decode},
                                      {"mixed", options.mixed}}) {
      for (int i = 0; i < count; ++i) workers.push_back(absl::StrCat(role, "-", i, ":", role));
    }
    workers.insert(workers.end(), options.extra_worker_certs.begin(),
                   options.extra_worker_certs.end());
    if (absl::Status s = MakeCerts(cluster->certs_dir_, workers); !s.ok()) return s;
    // The operator's key: the tests also list workers (ListWorkers is admin-only).
    cluster->api_key_ = ReadFile(cluster->certs_dir_ + "/admin_api_key");
    while (!cluster->api_key_.empty() && cluster->api_key_.back() == '\n')
      cluster->api_key_.pop_back();
  }
  const std::string& certs = cluster->certs_dir_;
  std::vector<std::string> router_argv = {Runfile("router/tandem_router"), "--listen=127.0.0.1:0",
                                          absl::StrCat("--port_file=", dir, "/router.port"),
                                          "--heartbeat_interval_ms=200",
                                          "--worker_timeout_ms=1500"};
  for (const std::string& flag : SecurityFlags(certs, "router")) router_argv.push_back(flag);
  if (options.tls) {
    router_argv.push_back("--internal_listen=127.0.0.1:0");
    router_argv.push_back(absl::StrCat("--internal_port_file=", dir, "/internal.port"));
    router_argv.push_back(absl::StrCat("--api_key_file=", certs, "/api_keys"));
  }
  router_argv.insert(router_argv.end(), options.router_flags.begin(), options.router_flags.end());
  cluster->router_argv_ = router_argv;
  auto router = Process::Spawn(router_argv, dir + "/router.log");
  if (!router.ok()) return router.status();
  cluster->router_process_ = std::move(*router);
  auto address = WaitPortFile(dir + "/router.port", *cluster->router_process_, absl::Seconds(30));
  if (!address.ok()) return address.status();
  cluster->router_address_ = *address;
  cluster->internal_address_ = *address;
  if (options.tls) {
    auto internal =
        WaitPortFile(dir + "/internal.port", *cluster->router_process_, absl::Seconds(30));
    if (!internal.ok()) return internal.status();
    cluster->internal_address_ = *internal;
  }
  cluster->router_stub_ = tandem::v1::Router::NewStub(
      security::CreateChannelWithApiKey(*address, ClientSecurity(certs, ""), cluster->api_key_));

  auto spawn = [&](const std::string& role, int index) -> absl::Status {
    WorkerHandle w;
    w.role = role;
    w.id = absl::StrCat(role, "-", index);
    std::vector<std::string> argv = {Runfile("runtime/tandem_worker"),
                                     absl::StrCat("--role=", role),
                                     options.dummy_config.empty()
                                         ? absl::StrCat("--model=", Runfile(options.model_dir))
                                         : absl::StrCat("--dummy_config=", options.dummy_config),
                                     absl::StrCat("--worker_id=", w.id),
                                     absl::StrCat("--router=", cluster->internal_address_),
                                     absl::StrCat("--port_file=", dir, "/", w.id, ".port"),
                                     "--num_threads=1",
                                     "--kv_cache_bytes=16777216"};
    if (!options.dummy_config.empty()) argv.push_back("--load_format=dummy");
    for (const std::string& flag : SecurityFlags(certs, w.id)) argv.push_back(flag);
    argv.insert(argv.end(), options.worker_flags.begin(), options.worker_flags.end());
    const std::vector<std::string>& by_role = role == "prefill"  ? options.prefill_flags
                                              : role == "decode" ? options.decode_flags
                                                                 : options.mixed_flags;
    argv.insert(argv.end(), by_role.begin(), by_role.end());
    auto process = Process::Spawn(argv, absl::StrCat(dir, "/", w.id, ".log"));
    if (!process.ok()) return process.status();
    w.process = std::move(*process);
    w.argv = std::move(argv);
    cluster->workers_.push_back(std::move(w));
    return absl::OkStatus();
  };
  for (int i = 0; i < options.prefill; ++i) {
    if (auto s = spawn("prefill", i); !s.ok()) return s;
  }
  for (int i = 0; i < options.decode; ++i) {
    if (auto s = spawn("decode", i); !s.ok()) return s;
  }
  for (int i = 0; i < options.mixed; ++i) {
    if (auto s = spawn("mixed", i); !s.ok()) return s;
  }
  for (WorkerHandle& w : cluster->workers_) {
    auto addr = WaitPortFile(absl::StrCat(dir, "/", w.id, ".port"), *w.process, absl::Seconds(60));
    if (!addr.ok()) return addr.status();
    w.address = *addr;
    w.stub = tandem::v1::WorkerService::NewStub(
        security::CreateChannel(w.address, ClientSecurity(certs, "admin")));
  }
  absl::Status healthy =
      cluster->WaitHealthy(static_cast<int>(cluster->workers_.size()), absl::Seconds(60));
  if (!healthy.ok()) return healthy;
  return cluster;
}

Cluster::~Cluster() {
  workers_.clear();  // SIGKILL workers first, then the router
  router_process_.reset();
}

WorkerHandle* Cluster::worker(const std::string& id) {
  for (WorkerHandle& w : workers_) {
    if (w.id == id) return &w;
  }
  return nullptr;
}

absl::StatusOr<tandem::v1::WorkerStats> Cluster::Stats(const std::string& worker_id,
                                                       bool wait_for_ready) {
  WorkerHandle* w = worker(worker_id);
  if (w == nullptr) return absl::NotFoundError(worker_id);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  ctx.set_wait_for_ready(wait_for_ready);
  tandem::v1::WorkerStats stats;
  grpc::Status s = w->stub->Stats(&ctx, tandem::v1::WorkerStatsRequest(), &stats);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return stats;
}

absl::Status Cluster::RestartWorker(const std::string& worker_id, int sig) {
  WorkerHandle* w = worker(worker_id);
  if (w == nullptr) return absl::NotFoundError(worker_id);
  if (w->process->Running()) {
    w->process->Signal(sig);
    if (w->process->Wait(absl::Seconds(30)) == -1) {
      return absl::DeadlineExceededError(absl::StrCat(worker_id, " did not exit"));
    }
  }
  ++w->restarts;
  const std::string port_file = absl::StrCat(dir_, "/", w->id, ".port");
  std::remove(port_file.c_str());
  std::vector<std::string> argv = w->argv;
  argv.push_back(absl::StrCat("--listen=", w->address));
  auto process = Process::Spawn(argv, absl::StrCat(dir_, "/", w->id, ".", w->restarts, ".log"));
  if (!process.ok()) return process.status();
  w->process = std::move(*process);
  auto addr = WaitPortFile(port_file, *w->process, absl::Seconds(60));
  if (!addr.ok()) return addr.status();
  if (*addr != w->address) {
    return absl::InternalError(
        absl::StrCat(worker_id, " came back on ", *addr, ", not on ", w->address));
  }
  // A fresh channel: the old one may sit in gRPC's reconnect backoff after the refused
  // connections of the restart, failing calls for seconds.
  w->stub = tandem::v1::WorkerService::NewStub(
      security::CreateChannel(w->address, ClientSecurity(certs_dir_, "admin")));
  return absl::OkStatus();
}

absl::Status Cluster::RestartRouter(int sig) {
  if (router_process_->Running()) {
    router_process_->Signal(sig);
    if (router_process_->Wait(absl::Seconds(30)) == -1) {
      return absl::DeadlineExceededError("the router did not exit");
    }
  }
  ++router_restarts_;
  const std::string port_file = absl::StrCat(dir_, "/router.port");
  std::remove(port_file.c_str());
  std::vector<std::string> argv = router_argv_;
  argv.push_back(absl::StrCat("--listen=", router_address_));  // the last --listen wins
  if (internal_address_ != router_address_) {
    argv.push_back(absl::StrCat("--internal_listen=", internal_address_));
  }
  auto process = Process::Spawn(argv, absl::StrCat(dir_, "/router.", router_restarts_, ".log"));
  if (!process.ok()) return process.status();
  router_process_ = std::move(*process);
  auto addr = WaitPortFile(port_file, *router_process_, absl::Seconds(30));
  if (!addr.ok()) return addr.status();
  if (*addr != router_address_) {
    return absl::InternalError(
        absl::StrCat("the router came back on ", *addr, ", not on ", router_address_));
  }
  // A new channel: the old one is in gRPC's reconnect backoff (seconds after a short outage).
  router_stub_ = tandem::v1::Router::NewStub(
      security::CreateChannelWithApiKey(router_address_, ClientSecurity(certs_dir_, ""), api_key_));
  return absl::OkStatus();
}

absl::Status Cluster::WaitHealthy(int healthy, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int seen = -1;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    tandem::v1::ListWorkersResponse list;
    if (router_stub_->ListWorkers(&ctx, tandem::v1::ListWorkersRequest(), &list).ok()) {
      seen = 0;
      for (const auto& w : list.workers()) seen += w.healthy() ? 1 : 0;
      if (seen == healthy) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("router sees ", seen, " healthy workers, want ", healthy, "\n", Logs()));
}

std::string Cluster::Logs() {
  std::string out = router_process_->LogTail(2000);
  for (WorkerHandle& w : workers_) out += "\n" + w.process->LogTail(2000);
  return out;
}

}  // namespace tandem::e2e
