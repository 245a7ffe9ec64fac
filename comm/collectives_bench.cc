// collectives_bench: latency and bus bandwidth of the Gloo process group's all-reduce and
// all-to-all vs message size, ranks as threads on loopback (each with its own store client,
// Gloo device and context, as processes would have). Bus bandwidth as nccl-tests defines it:
// all-reduce 2 (n-1)/n x bytes / time, all-to-all (n-1)/n x bytes / time.
//
//   bazel run -c opt //comm:collectives_bench -- [--ranks=2,4] [--max_mib=64] [--iters=0 (auto)]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"

ABSL_FLAG(std::string, ranks, "2,4", "world sizes to run");
ABSL_FLAG(int, max_mib, 64, "largest message per rank, MiB");
ABSL_FLAG(int, iters, 0, "iterations per size (0: about 0.5 s worth, at least 3)");

namespace tandem::comm {
namespace {

struct Row {
  int64_t bytes = 0;
  double allreduce_us = 0, alltoall_us = 0;
};

// Every rank runs the same sizes; rank 0's timings are reported.
void RankMain(int rank, int size, int port, std::vector<Row>* rows) {
  GlooGroupOptions o;
  o.rank = rank;
  o.world_size = size;
  o.store_port = port;
  o.serve_store = false;
  o.timeout = absl::Seconds(120);
  auto group = GlooProcessGroup::Create(o);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
    return;
  }
  const int64_t max_bytes = int64_t{absl::GetFlag(FLAGS_max_mib)} << 20;
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const int64_t n = bytes / 4;
    std::vector<float> data(n, 1.0f), out(n);
    std::vector<int64_t> counts(size, n / size);
    counts[size - 1] += n - (n / size) * size;
    int iters = absl::GetFlag(FLAGS_iters);
    if (iters <= 0) iters = static_cast<int>(std::clamp<int64_t>((64 << 20) / bytes, 3, 200));
    auto time = [&](auto op) {
      (void)(*group)->Barrier();
      op();  // warm-up
      const absl::Time start = absl::Now();
      for (int i = 0; i < iters; ++i) op();
      return absl::ToDoubleMicroseconds(absl::Now() - start) / iters;
    };
    Row row;
    row.bytes = bytes;
    row.allreduce_us = time([&] { (void)(*group)->AllReduceSum(absl::MakeSpan(data)); });
    row.alltoall_us =
        time([&] { (void)(*group)->AllToAll(data, counts, absl::MakeSpan(out), counts); });
    if (rank == 0) rows->push_back(row);
  }
}

void Run(int size) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) return;
  std::vector<Row> rows;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { RankMain(r, size, (*server)->port(), &rows); });
  }
  for (auto& t : threads) t.join();
  std::printf("gloo, %d ranks (threads, loopback)\n", size);
  std::printf("%12s %14s %16s %14s %16s\n", "bytes/rank", "allreduce_us", "allreduce_GB/s",
              "alltoall_us", "alltoall_GB/s");
  const double f = static_cast<double>(size - 1) / size;
  for (const Row& r : rows) {
    std::printf("%12lld %14.1f %16.3f %14.1f %16.3f\n", static_cast<long long>(r.bytes),
                r.allreduce_us, 2 * f * r.bytes / r.allreduce_us / 1e3, r.alltoall_us,
                f * r.bytes / r.alltoall_us / 1e3);
  }
}

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int size = 0;
    if (absl::SimpleAtoi(s, &size) && size >= 2) tandem::comm::Run(size);
  }
  return 0;
}
