// Per-command latency of rank 0's command line (command_line.h), Gloo broadcast vs shared memory,
// with every rank a process of this host (as `--tp=N` alone starts them). Not a test: numbers go
// to BENCHMARKS.md.
//
//   bazel run -c opt //runtime/parallel:plan_line_bench -- [commands]
//
// Rank 0 sends `commands` step plans of ~2 KiB (64 decode sequences, 8 blocks each) back to back.
// Twice: back to back, and paced (rank 0 idles 1 ms before each, so followers wait asleep as they
// do between steps). Reported: rank 0's time per command (Send, including waiting for the previous
// one to be taken), and each follower's one-way latency (rank 0's send time, carried in the plan,
// to the parsed command; CLOCK_MONOTONIC is one clock for the host), p50 / p99.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/tcp_store.h"
#include "runtime/parallel/command_line.h"
#include "runtime/parallel/plan_segment.h"
#include "runtime/parallel/shm_command_line.h"

namespace tandem::runtime {
namespace {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

tandem::v1::RankCommand DecodePlan(int64_t sent_ns) {
  tandem::v1::RankCommand c;
  tandem::v1::StepPlan* plan = c.mutable_step();
  plan->set_num_batched_tokens(64);
  for (int s = 0; s < 64; ++s) {
    tandem::v1::PlannedSeq* seq = plan->add_seqs();
    seq->set_request_id(s);
    seq->add_new_tokens(1000 + s);
    seq->set_num_computed_tokens(100 + s);
    for (int b = 0; b < 8; ++b) seq->add_block_table(s * 8 + b);
    seq->set_samples(true);
    seq->set_temperature(0.7f);
    seq->set_top_k(40);
    seq->set_seed(s == 0 ? sent_ns : s);
  }
  return c;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// One rank of one run. Returns the process exit code.
// `gap`: rank 0 idles this long between commands (followers then wait asleep, as between steps).
int RunRank(int rank, int size, int port, bool shm, PlanSegment* segment, int commands,
            absl::Duration gap) {
  comm::GlooGroupOptions o;
  o.rank = rank;
  o.world_size = size;
  o.store_port = port;
  o.serve_store = false;
  o.timeout = absl::Seconds(30);
  auto group = comm::GlooProcessGroup::Create(o);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<PlanSegment> attached;
  if (shm && rank > 0) {
    auto a = PlanSegment::Attach(dup(segment->fd()));
    if (!a.ok()) return 1;
    attached = *std::move(a);
  }
  std::unique_ptr<CommandLine> line =
      shm ? std::unique_ptr<CommandLine>(new ShmCommandLine(rank == 0 ? segment : attached.get(),
                                                            group->get(), absl::Seconds(30)))
          : GlooCommandLine(group->get());
  const std::string kind =
      absl::StrCat(shm ? "shm " : "gloo", gap > absl::ZeroDuration() ? " paced" : " stream");
  if (rank == 0) {
    const std::string bytes = DecodePlan(0).SerializeAsString();
    std::vector<double> send_us;
    const int64_t start = MonotonicNs();
    for (int i = 0; i < commands; ++i) {
      if (gap > absl::ZeroDuration()) absl::SleepFor(gap);
      const int64_t t0 = MonotonicNs();
      if (!line->Send(DecodePlan(t0)).ok()) return 1;
      send_us.push_back((MonotonicNs() - t0) / 1e3);
    }
    const double total_us = (MonotonicNs() - start) / 1e3;
    tandem::v1::RankCommand shutdown;
    shutdown.set_shutdown(true);
    if (!line->Send(shutdown).ok()) return 1;
    std::printf("%s ranks=%d plan=%zuB rank0: %.1f us/command (send p50 %.1f p99 %.1f us)\n",
                kind.c_str(), size, bytes.size(), total_us / commands, Percentile(send_us, 0.5),
                Percentile(send_us, 0.99));
    std::fflush(stdout);
    return 0;
  }
  std::vector<double> one_way_us;
  while (true) {
    auto c = line->Receive();
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
      return 1;
    }
    if (c->shutdown()) break;
    one_way_us.push_back((MonotonicNs() - c->step().seqs(0).seed()) / 1e3);
  }
  std::printf("%s ranks=%d rank%d: one-way p50 %.1f us p99 %.1f us\n", kind.c_str(), size, rank,
              Percentile(one_way_us, 0.5), Percentile(one_way_us, 0.99));
  std::fflush(stdout);
  return 0;
}

// Forks ranks 1..size-1 (they learn the rendezvous port through a pipe), runs rank 0 here.
bool RunGroup(int size, bool shm, int commands, absl::Duration gap) {
  std::unique_ptr<PlanSegment> segment;
  if (shm) {
    auto s = PlanSegment::Create(size);
    if (!s.ok()) return false;
    segment = *std::move(s);
  }
  std::vector<int> port_pipes;
  std::vector<pid_t> children;
  for (int r = 1; r < size; ++r) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof(port)) != sizeof(port)) _exit(1);
      _exit(RunRank(r, size, port, shm, segment.get(), commands, gap));
    }
    close(fds[0]);
    port_pipes.push_back(fds[1]);
    children.push_back(pid);
  }
  auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) return false;
  const int port = (*server)->port();
  for (int fd : port_pipes) {
    if (write(fd, &port, sizeof(port)) != sizeof(port)) return false;
    close(fd);
  }
  bool ok = RunRank(0, size, port, shm, segment.get(), commands, gap) == 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  const int commands = argc > 1 ? std::atoi(argv[1]) : 5000;
  for (int size : {2, 4}) {
    for (bool shm : {false, true}) {
      // Back to back (throughput), then paced at 1 ms (a follower asleep between steps).
      if (!tandem::runtime::RunGroup(size, shm, commands, absl::ZeroDuration()) ||
          !tandem::runtime::RunGroup(size, shm, commands / 5, absl::Milliseconds(1))) {
        std::fprintf(stderr, "run failed: ranks=%d shm=%d\n", size, shm);
        return 1;
      }
    }
  }
  return 0;
}
