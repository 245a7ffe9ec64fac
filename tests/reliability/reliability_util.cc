#include "tests/reliability/reliability_util.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security/grpc_security.h"
#include "common/security/security_config.h"
#include "gtest/gtest.h"

namespace tandem::reliability {
namespace {

// Entries of a /proc directory, without "." and "..". -1 when it cannot be read (process gone).
int CountEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

}  // namespace

int Iterations(int ci, int full) {
  const char* env = std::getenv("TANDEM_LONG");
  return env != nullptr && env[0] != '\0' && env[0] != '0' ? full : ci;
}

e2e::ClusterOptions SmallModelCluster(int prefill, int decode, int mixed) {
  e2e::ClusterOptions options;
  options.prefill = prefill;
  options.decode = decode;
  options.mixed = mixed;
  options.dummy_config = e2e::Runfile(kSmallModel);
  return options;
}

std::unique_ptr<Cluster> Start(const e2e::ClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

tandem::v1::GenerateRequest MakeRequest(uint32_t seed, int prompt_len, int max_tokens,
                                        uint32_t vocab) {
  std::mt19937 rng(seed);
  tandem::v1::GenerateRequest r;
  for (int i = 0; i < prompt_len; ++i) r.add_prompt_token_ids(3 + rng() % (vocab - 3));
  r.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

absl::StatusOr<ProcFigures> ReadProc(pid_t pid) {
  ProcFigures f;
  const std::string base = absl::StrCat("/proc/", pid);
  f.threads = CountEntries(base + "/task");
  f.fds = CountEntries(base + "/fd");
  if (f.threads < 0 || f.fds < 0) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::ifstream status(base + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.size() >= 2) (void)absl::SimpleAtoi(parts[1], &f.rss_kb);
  }
  return f;
}

std::vector<Daemon> Daemons(Cluster& cluster) {
  std::vector<Daemon> out;
  if (cluster.router_process().Running()) out.push_back({"router", cluster.router_process().pid()});
  for (e2e::WorkerHandle& w : cluster.workers()) {
    if (w.process->Running()) out.push_back({w.id, w.process->pid()});
  }
  return out;
}

absl::StatusOr<absl::Duration> WaitPoolsWhole(Cluster& cluster, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  std::string last;
  while (true) {
    bool whole = true;
    last.clear();
    for (e2e::WorkerHandle& w : cluster.workers()) {
      if (!w.process->Running()) continue;
      absl::StatusOr<tandem::v1::WorkerStats> stats = cluster.Stats(w.id);
      if (!stats.ok()) {
        whole = false;
        absl::StrAppend(&last, w.id, ": ", stats.status().ToString(), "; ");
        continue;
      }
      const tandem::v1::WorkerLoad& l = stats->load();
      const bool ok = l.kv_blocks_free() == l.kv_blocks_total() && l.kv_blocks_leased() == 0 &&
                      l.num_running() == 0 && l.num_waiting() == 0;
      whole = whole && ok;
      absl::StrAppend(&last, w.id, ": free ", l.kv_blocks_free(), "/", l.kv_blocks_total(),
                      " leased ", l.kv_blocks_leased(), " running ", l.num_running(), " waiting ",
                      l.num_waiting(), " (leases granted ", stats->leases_granted(), " released ",
                      stats->leases_released(), " expired ", stats->leases_expired(), "); ");
    }
    if (whole) return absl::Now() - start;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("KV pools not back to baseline after ",
                                                      absl::FormatDuration(timeout), ": ", last));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void WarmUp(Cluster& cluster, int n, int concurrency) {
  std::vector<std::thread> threads;
  for (int t = 0; t < concurrency; ++t) {
    threads.emplace_back([&cluster, n, concurrency, t] {
      for (int i = t; i < n; i += concurrency) {
        Outcome o = RunRequest(cluster.router(), MakeRequest(1000 + i, 20 + 7 * i, 8));
        EXPECT_TRUE(o.status.ok()) << "warm-up " << i << ": " << o.status.error_message();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Stream s(cluster.router(), MakeRequest(999, 30, 2000), absl::Seconds(30));
  s.ReadTokens(3);
  s.Cancel();
  s.Finish();
}

LeakCheck::LeakCheck(Cluster& cluster) {
  for (const Daemon& d : Daemons(cluster)) Rebase(cluster, d.name);
}

void LeakCheck::Rebase(Cluster& cluster, const std::string& name) {
  for (const Daemon& d : Daemons(cluster)) {
    if (d.name != name) continue;
    absl::StatusOr<ProcFigures> f = ReadProc(d.pid);
    EXPECT_TRUE(f.ok()) << name << ": " << f.status();
    if (f.ok()) baseline_[name] = {d.pid, *f};
  }
}

absl::Status LeakCheck::Check(Cluster& cluster, absl::Duration settle) const {
  const absl::Time deadline = absl::Now() + settle;
  while (true) {
    std::string bad;
    for (const Daemon& d : Daemons(cluster)) {
      auto it = baseline_.find(d.name);
      if (it == baseline_.end()) continue;
      if (it->second.first != d.pid) {
        absl::StrAppend(&bad, d.name, " was restarted (pid ", it->second.first, " -> ", d.pid,
                        ") without a new baseline; ");
        continue;
      }
      absl::StatusOr<ProcFigures> now = ReadProc(d.pid);
      if (!now.ok()) continue;  // exited meanwhile: not a leak
      const ProcFigures& base = it->second.second;
      if (now->threads > base.threads + kThreadSlack || now->fds > base.fds + kFdSlack) {
        absl::StrAppend(&bad, d.name, ": threads ", base.threads, " -> ", now->threads, ", fds ",
                        base.fds, " -> ", now->fds, "; ");
      }
    }
    if (bad.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::InternalError(absl::StrCat("threads or fds above baseline + slack (",
                                              kThreadSlack, " threads, ", kFdSlack,
                                              " fds): ", bad));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

std::string LeakCheck::Describe() const {
  std::string out;
  for (const auto& [name, entry] : baseline_) {
    absl::StrAppend(&out, name, ": ", entry.second.threads, " threads, ", entry.second.fds,
                    " fds; ");
  }
  return out;
}

void ExpectNothingLost(Cluster& cluster, const LeakCheck& leaks, absl::Duration pool_timeout) {
  absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(cluster, pool_timeout);
  EXPECT_TRUE(whole.ok()) << whole.status() << "\n" << cluster.Logs();
  absl::Status no_leak = leaks.Check(cluster);
  EXPECT_TRUE(no_leak.ok()) << no_leak << "\nbaseline: " << leaks.Describe();
}

Stream::Stream(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
               absl::Duration deadline)
    : start_(absl::Now()) {
  ctx_.set_deadline(absl::ToChronoTime(start_ + deadline));
  reader_ = router.Generate(&ctx_, request);
}

int Stream::ReadTokens(int n) {
  tandem::v1::GenerateResponse msg;
  while (!ended_ && tokens() < n) {
    if (!reader_->Read(&msg)) {
      ended_ = true;
      break;
    }
    out_.tokens.insert(out_.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED)
      out_.finish = msg.finish_reason();
  }
  return tokens();
}

Outcome Stream::Finish() {
  ReadTokens(std::numeric_limits<int>::max());
  out_.status = reader_->Finish();
  out_.took = absl::Now() - start_;
  return out_;
}

Outcome RunRequest(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
                   absl::Duration deadline) {
  Stream s(router, request, deadline);
  return s.Finish();
}

std::shared_ptr<grpc::Channel> Connect(Cluster& cluster, const std::string& address,
                                       const std::string& cert) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  const std::string& certs = cluster.certs_dir();
  if (certs.empty()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  security::SecurityOptions o;
  o.files.ca = certs + "/ca.pem";
  const bool public_port =
      address == cluster.router_address() && cluster.router_address() != cluster.internal_address();
  if (!public_port) {
    o.files.cert = absl::StrCat(certs, "/", cert, ".pem");
    o.files.key = absl::StrCat(certs, "/", cert, ".key");
  }
  o.require_cert = !public_port;
  absl::StatusOr<security::SecurityConfig> config = security::LoadSecurityConfig(o);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  if (public_port) {
    return security::CreateChannelWithApiKey(address, *config, cluster.api_key(), args);
  }
  return security::CreateChannel(address, *config, args);
}

}  // namespace tandem::reliability
