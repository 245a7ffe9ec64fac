// Helpers of the reliability suite (tests/reliability/README.md): the "nothing is lost" checks
// every case ends with, and bounded client calls.
//
//   * WaitPoolsWhole: every live worker's KV pool back to baseline (all blocks free, nothing
//     leased, nothing running or waiting), read through WorkerService.Stats, within a bound.
//   * LeakCheck: threads (/proc/PID/task) and file descriptors (/proc/PID/fd) of every daemon
//     back to a baseline taken after a warm-up, within a small tolerance (kThreadSlack /
//     kFdSlack, justified in the .cc).
//   * Streams: a Generate stream whose every wait is bounded by its deadline.
//
// Thread safety: the free functions are thread-safe; LeakCheck and Stream are not.
#ifndef TANDEM_TESTS_RELIABILITY_RELIABILITY_UTIL_H_
#define TANDEM_TESTS_RELIABILITY_RELIABILITY_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/router.grpc.pb.h"
#include "tests/e2e/cluster.h"

namespace tandem::reliability {

using e2e::Cluster;

// `ci` normally; `full` when TANDEM_LONG is set (tests/run.sh --long).
int Iterations(int ci, int full);

// A model between the golden fixture (too fast to cancel inside a phase) and the 100M one (too
// slow for CI): 4 layers, hidden 256, vocab 1024, random weights. On one CPU thread a
// 1000-token prompt prefills in ~0.2 s and decoding runs at ~2,000 tokens/s, so every phase of
// a request lasts long enough to be hit, and 100 randomized iterations take seconds.
inline constexpr char kSmallModel[] = "tests/reliability/testdata/small";
inline constexpr uint32_t kSmallVocab = 1024;

// Options for a cluster of kSmallModel workers (role flags added per role by the caller).
e2e::ClusterOptions SmallModelCluster(int prefill, int decode, int mixed);
// Starts it; null (and a gtest failure naming why) when it does not start.
std::unique_ptr<Cluster> Start(const e2e::ClusterOptions& options);

// A greedy request with `prompt_len` tokens drawn from `seed` in [3, vocab).
tandem::v1::GenerateRequest MakeRequest(uint32_t seed, int prompt_len, int max_tokens,
                                        uint32_t vocab = kSmallVocab);

// Figures of one process from /proc.
struct ProcFigures {
  int threads = 0;
  int fds = 0;
  int64_t rss_kb = 0;
};
absl::StatusOr<ProcFigures> ReadProc(pid_t pid);

// A daemon of the cluster: "router" or a worker id, and its current process.
struct Daemon {
  std::string name;
  pid_t pid = 0;
};
// The router and every worker whose process is running.
std::vector<Daemon> Daemons(Cluster& cluster);

// Waits up to `timeout` until every running worker reports all KV blocks free, none leased and
// no request running or waiting. Returns how long that took, or an error listing each worker's
// load when the bound passed.
absl::StatusOr<absl::Duration> WaitPoolsWhole(Cluster& cluster,
                                              absl::Duration timeout = absl::Seconds(10));

// Drives `n` greedy requests at `concurrency` through the router (and one cancelled mid-stream)
// so gRPC's pools, the UCX endpoints and the KV handshakes exist before a baseline is taken.
void WarmUp(Cluster& cluster, int n = 16, int concurrency = 8);

class LeakCheck {
 public:
  // Threads that may come and go in an idle daemon: gRPC's synchronous server keeps between 1
  // and 2 idle polling threads per completion queue and lets extra ones exit only once idle;
  // gRPC core's executors add threads on demand (up to 2 x cores) and keep them; its timer
  // manager starts a thread while timer callbacks run. None of these grows with the number of
  // requests, so a leak of one thread (or fd) per request, stream, restart or connection in a
  // case of 10+ iterations exceeds the slack.
  static constexpr int kThreadSlack = 6;
  // Descriptors: a channel reconnecting (old socket not yet closed), an accepted connection the
  // server has not yet reaped, gRPC's wakeup fds of an extra poller thread.
  static constexpr int kFdSlack = 6;

  // Baseline of every running daemon of `cluster` (take it after WarmUp).
  explicit LeakCheck(Cluster& cluster);
  // Baseline for `name` again (its process was restarted: a new pid). Call after it warmed up.
  void Rebase(Cluster& cluster, const std::string& name);
  // Waits up to `settle` for every daemon that has a baseline to be within the slack of it.
  // Error: which daemon, baseline and now.
  absl::Status Check(Cluster& cluster, absl::Duration settle = absl::Seconds(10)) const;
  std::string Describe() const;

 private:
  std::map<std::string, std::pair<pid_t, ProcFigures>> baseline_;
};

// The whole "nothing is lost" check at the end of a case: pools whole, then no leak.
void ExpectNothingLost(Cluster& cluster, const LeakCheck& leaks,
                       absl::Duration pool_timeout = absl::Seconds(10));

// A request's outcome as the client saw it.
struct Outcome {
  std::vector<uint32_t> tokens;
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  grpc::Status status;
  absl::Duration took;
};

// A Generate stream with a deadline, read from the calling thread.
class Stream {
 public:
  Stream(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
         absl::Duration deadline);
  // Reads until `n` tokens arrived in total or the stream ended; returns the tokens so far.
  int ReadTokens(int n);
  // Cancels (client side) from any thread.
  void Cancel() { ctx_.TryCancel(); }
  // Reads the rest and returns the outcome (bounded by the deadline).
  Outcome Finish();
  int tokens() const { return static_cast<int>(out_.tokens.size()); }
  bool ended() const { return ended_; }

 private:
  grpc::ClientContext ctx_;
  const absl::Time start_;
  std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>> reader_;
  Outcome out_;
  bool ended_ = false;
};

// One whole request, bounded.
Outcome RunRequest(tandem::v1::Router::Stub& router, const tandem::v1::GenerateRequest& request,
                   absl::Duration deadline = absl::Seconds(60));

// A fresh channel to `address` (its own connection, not the cluster's stubs'), speaking as the
// cluster's clients do: on the router's public port TLS + the API key; on an internal port
// (the router's internal one, a worker's) mTLS with certificate `cert` of the cluster CA
// ("router", "prefill", "decode", "admin"...: the role the called method needs). Plain text when
// the cluster runs --insecure. Messages up to 64 MiB may be sent (servers must refuse them).
std::shared_ptr<grpc::Channel> Connect(Cluster& cluster, const std::string& address,
                                       const std::string& cert = "router");

}  // namespace tandem::reliability

#endif  // TANDEM_TESTS_RELIABILITY_RELIABILITY_UTIL_H_
