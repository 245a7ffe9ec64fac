// //tests/reliability:soak — mixed traffic with periodic faults against a real local cluster
// (router + 2 prefill + 1 decode workers, kSmallModel, TLS on), for --soak=MIN minutes:
//
//   bazel run //tests/reliability:soak -- --soak=3 [--clients=4]
//
// Traffic: --clients threads of random requests (prompts 16-600 tokens, 4-200 new tokens; a
// fifth cancelled at a random point, some with a tenant's cache_salt or a shared prefix, some
// invalid). Faults, one every 20 s in turn: kill -9 + restart of prefill-1, SIGSTOP of decode-0
// for 2 s, SIGSTOP of prefill-0 for 2 s, SIGSTOP of the router for 1 s, a burst of malformed
// protobuf on every method of every daemon, a storm of 32 streams cancelled after a few tokens.
//
// Every 10 s one line: RSS (MiB), threads and fds of every daemon, free/total and leased KV
// blocks of every worker, and the request outcomes so far. At the end (traffic stopped) the
// verdict: PASS when every pool is whole, no daemon died unasked, and the daemons that were never
// restarted (router, prefill-0, decode-0) are flat: RSS within max(10%, 16 MiB) of the first
// sample after warm-up, threads and fds within LeakCheck's slack of it. Exit 0 on PASS.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "tests/reliability/raw_wire.h"
#include "tests/reliability/reliability_util.h"

ABSL_FLAG(double, soak, 3.0, "minutes of traffic");
ABSL_FLAG(int32_t, clients, 4, "client threads");
ABSL_FLAG(int32_t, report_every_s, 10, "seconds between report lines");
ABSL_FLAG(int32_t, fault_every_s, 20, "seconds between faults");

namespace tandem::reliability {
namespace {

class Tally {
 public:
  void Add(const std::string& what) {
    absl::MutexLock lock(&mu_);
    ++counts_[what];
  }
  std::string Line() {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const auto& [k, v] : counts_) absl::StrAppend(&out, k, " ", v, ", ");
    if (!out.empty()) out.resize(out.size() - 2);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, int64_t> counts_ ABSL_GUARDED_BY(mu_);
};

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "ok";
    case grpc::StatusCode::CANCELLED:
      return "cancelled";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "invalid";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "deadline";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "exhausted";
    case grpc::StatusCode::UNAVAILABLE:
      return "unavailable";
    default:
      return absl::StrCat("code", static_cast<int>(code));
  }
}

void Client(Cluster& cluster, uint32_t seed, const std::atomic<bool>& stop, Tally& tally) {
  std::mt19937 rng(seed);
  const v1::GenerateRequest shared = MakeRequest(seed ^ 0xabc, 256, 1);
  while (!stop.load()) {
    v1::GenerateRequest r =
        MakeRequest(rng(), 16 + static_cast<int>(rng() % 585), 4 + static_cast<int>(rng() % 197));
    const int kind = static_cast<int>(rng() % 20);
    if (kind == 0) r.mutable_sampling()->set_top_p(2.0f);  // invalid
    if (kind == 1) r.set_cache_salt(absl::StrCat("tenant-", rng() % 4));
    if (kind == 2) {  // a prefix every client shares, then a token of its own
      *r.mutable_prompt_token_ids() = shared.prompt_token_ids();
      r.add_prompt_token_ids(3 + rng() % 1000);
    }
    Stream s(cluster.router(), r, absl::Seconds(30));
    if (kind >= 16) {  // cancelled after a few tokens
      s.ReadTokens(static_cast<int>(rng() % 8));
      s.Cancel();
    }
    const Outcome o = s.Finish();
    tally.Add(CodeName(o.status.error_code()));
  }
}

struct Sample {
  double t = 0;
  std::map<std::string, ProcFigures> procs;
};

std::string Report(Cluster& cluster, double t, const std::string& outcomes, Sample* sample) {
  std::string line = absl::StrFormat("t=%4.0fs", t);
  sample->t = t;
  for (const Daemon& d : Daemons(cluster)) {
    absl::StatusOr<ProcFigures> f = ReadProc(d.pid);
    if (!f.ok()) continue;
    sample->procs[d.name] = *f;
    absl::StrAppend(&line, absl::StrFormat(" | %s rss %.1fM thr %d fd %d", d.name,
                                           f->rss_kb / 1024.0, f->threads, f->fds));
    if (d.name == "router") continue;
    absl::StatusOr<v1::WorkerStats> s = cluster.Stats(d.name);
    if (s.ok()) {
      absl::StrAppend(&line,
                      absl::StrFormat(" kv %u/%u leased %u", s->load().kv_blocks_free(),
                                      s->load().kv_blocks_total(), s->load().kv_blocks_leased()));
    }
  }
  absl::StrAppend(&line, " | ", outcomes);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return line;
}

void MalformedBurst(Cluster& cluster, std::mt19937& rng) {
  for (const RawMethod& m : RouterMethods()) {
    auto channel = Connect(
        cluster, m.cert.empty() ? cluster.router_address() : cluster.internal_address(), m.cert);
    for (const Payload& p : MalformedPayloads(m, rng)) CallRaw(channel, m.path, p.bytes);
  }
  for (e2e::WorkerHandle& w : cluster.workers()) {
    if (!w.process->Running()) continue;
    for (const RawMethod& m : WorkerMethods()) {
      auto channel = Connect(cluster, w.address, m.cert);
      for (const Payload& p : MalformedPayloads(m, rng)) CallRaw(channel, m.path, p.bytes);
    }
  }
}

void CancelStorm(Cluster& cluster, std::mt19937& rng) {
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 32; ++i) {
    streams.push_back(std::make_unique<Stream>(cluster.router(), MakeRequest(rng(), 30 + i, 500),
                                               absl::Seconds(30)));
  }
  for (auto& s : streams) {
    s->ReadTokens(static_cast<int>(rng() % 4));
    s->Cancel();
  }
  for (auto& s : streams) s->Finish();
}

std::string Fault(Cluster& cluster, int n, std::mt19937& rng) {
  auto pause = [&](e2e::Process& p, absl::Duration d) {
    p.Signal(SIGSTOP);
    absl::SleepFor(d);
    p.Signal(SIGCONT);
  };
  switch (n % 6) {
    case 0: {
      const absl::Status s = cluster.RestartWorker("prefill-1", SIGKILL);
      return absl::StrCat("kill -9 + restart prefill-1: ", s.ok() ? "ok" : s.ToString());
    }
    case 1:
      pause(*cluster.worker("decode-0")->process, absl::Seconds(2));
      return "SIGSTOP decode-0 2 s";
    case 2:
      pause(*cluster.worker("prefill-0")->process, absl::Seconds(2));
      return "SIGSTOP prefill-0 2 s";
    case 3:
      pause(cluster.router_process(), absl::Seconds(1));
      return "SIGSTOP router 1 s";
    case 4:
      MalformedBurst(cluster, rng);
      return "malformed protobuf on every method of every daemon";
    default:
      CancelStorm(cluster, rng);
      return "32 streams cancelled after 0-3 tokens";
  }
}

int Soak() {
  const double minutes = absl::GetFlag(FLAGS_soak);
  e2e::ClusterOptions options = SmallModelCluster(2, 1, 0);
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  if (!started.ok()) {
    std::fprintf(stderr, "cluster: %s\n", started.status().ToString().c_str());
    return 1;
  }
  Cluster& cluster = **started;
  WarmUp(cluster);
  std::printf("soak: %.1f min, %d clients, router + prefill-0 + prefill-1 + decode-0 (%s)\n",
              minutes, absl::GetFlag(FLAGS_clients), kSmallModel);
  std::atomic<bool> stop{false};
  Tally tally;
  std::vector<std::thread> clients;
  for (int i = 0; i < absl::GetFlag(FLAGS_clients); ++i) {
    clients.emplace_back([&, i] { Client(cluster, 1000u + i, stop, tally); });
  }
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(minutes * 60);
  const absl::Duration report_every = absl::Seconds(absl::GetFlag(FLAGS_report_every_s));
  const absl::Duration fault_every = absl::Seconds(absl::GetFlag(FLAGS_fault_every_s));
  absl::Time next_report = start;
  absl::Time next_fault = start + fault_every;
  std::vector<Sample> samples;
  std::mt19937 rng(7);
  int faults = 0;
  while (absl::Now() < end) {
    if (absl::Now() >= next_report) {
      Sample s;
      Report(cluster, absl::ToDoubleSeconds(absl::Now() - start), tally.Line(), &s);
      samples.push_back(std::move(s));
      next_report += report_every;
    }
    if (absl::Now() >= next_fault) {
      std::printf("fault %d: %s\n", faults, Fault(cluster, faults, rng).c_str());
      ++faults;
      next_fault += fault_every;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  stop.store(true);
  for (std::thread& t : clients) t.join();
  absl::StatusOr<absl::Duration> whole = WaitPoolsWhole(cluster, absl::Seconds(30));
  Sample last;
  Report(cluster, absl::ToDoubleSeconds(absl::Now() - start), tally.Line(), &last);

  // Verdict.
  bool pass = true;
  std::string why;
  if (!whole.ok()) {
    pass = false;
    absl::StrAppend(&why, "\n  pools not whole: ", whole.status().ToString());
  }
  for (e2e::WorkerHandle& w : cluster.workers()) {
    if (!w.process->Running()) {
      pass = false;
      absl::StrAppend(&why, "\n  ", w.id, " is not running");
    }
  }
  // The first sample after warm-up: 30 s in (or the first one).
  const Sample* base = &samples.front();
  for (const Sample& s : samples) {
    if (s.t >= 30) {
      base = &s;
      break;
    }
  }
  for (const char* name : {"router", "prefill-0", "decode-0"}) {
    auto b = base->procs.find(name);
    auto e = last.procs.find(name);
    if (b == base->procs.end() || e == last.procs.end()) {
      pass = false;
      absl::StrAppend(&why, "\n  ", name, ": no figures");
      continue;
    }
    const double rss_growth = (e->second.rss_kb - b->second.rss_kb) / 1024.0;
    const double allowed = std::max(16.0, 0.10 * b->second.rss_kb / 1024.0);
    const bool flat = rss_growth <= allowed &&
                      e->second.threads <= b->second.threads + LeakCheck::kThreadSlack &&
                      e->second.fds <= b->second.fds + LeakCheck::kFdSlack;
    absl::StrAppend(
        &why, absl::StrFormat("\n  %s: rss %.1f -> %.1f MiB (%+.1f, allowed +%.1f), threads %d -> "
                              "%d, fds %d -> %d: %s",
                              name, b->second.rss_kb / 1024.0, e->second.rss_kb / 1024.0,
                              rss_growth, allowed, b->second.threads, e->second.threads,
                              b->second.fds, e->second.fds, flat ? "flat" : "GROWING"));
    pass = pass && flat;
  }
  std::printf("verdict (baseline t=%.0fs, %d faults, %s): %s%s\n", base->t, faults,
              whole.ok() ? "pools whole" : "POOLS NOT WHOLE", pass ? "PASS" : "FAIL", why.c_str());
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace tandem::reliability

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::reliability::Soak();
}
