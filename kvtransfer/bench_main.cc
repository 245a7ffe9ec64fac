// bench: KV block pull throughput of UcxAgent between two processes on loopback, next to
// ucx_perftest's ucp_get bandwidth with the same transports.
//
//   bazel build //kvtransfer:bench && bazel-bin/kvtransfer/bench [--pool_blocks=1024]
//
// The source is an agent_peer child holding --pool_blocks blocks of --block_bytes (default
// 2 MiB: one Llama-3-8B block of 16 tokens, 32 layers x K,V x 8 KV heads x 128 x bf16). Each
// batch reads `n` random source blocks into random destination blocks (blocks are reused when
// n > pool, so a 4096-block batch fits in a 1024-block pool); --layout=contiguous reads runs
// instead. Pools come from AllocateMemory unless --allocate=false. Latency is PostRead ->
// CheckTransfer true (busy polling); GB/s = batch bytes / p50.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/peer_process.h"
#include "kvtransfer/ucx_agent.h"

ABSL_FLAG(uint32_t, pool_blocks, 1024, "blocks per pool (each side holds one pool)");
ABSL_FLAG(uint64_t, block_bytes, uint64_t{2} << 20, "bytes per KV block");
ABSL_FLAG(std::string, batches, "1,4,16,64,256,1024,4096", "blocks per transfer");
ABSL_FLAG(std::string, layout, "random", "random: scattered blocks; contiguous: one run");
ABSL_FLAG(uint64_t, bytes_per_point, uint64_t{4} << 30, "bytes moved per batch size (>= 3 iters)");
ABSL_FLAG(std::string, transports, "tcp,self,sm", "UCX_TLS for both agents and ucx_perftest");
ABSL_FLAG(std::string, net_device, "lo", "UCX_NET_DEVICES");
ABSL_FLAG(uint64_t, tcp_segment_bytes, 0, "UcxAgentOptions::tcp_segment_bytes");
ABSL_FLAG(bool, allocate, true,
          "both pools from UcxAgent::AllocateMemory (false: heap + RegisterMemory)");
ABSL_FLAG(bool, separate_data_endpoint, true, "UcxAgentOptions::separate_data_endpoint");
ABSL_FLAG(bool, perftest, true, "also run ucx_perftest -t ucp_get (needs ucx-utils)");
ABSL_FLAG(int, perftest_port, 0, "ucx_perftest port (0: 20000 + pid % 10000)");

namespace tandem::kvtransfer {
namespace {

struct Point {
  uint32_t blocks;
  double mib;
  double p50_ms;
  double gbps;  // 1e9 bytes per second at p50
};

// ucx_perftest server + client on 127.0.0.1; returns the client's average bandwidth in GB/s
// (1e9 B/s), or a negative value when it could not run.
double RunPerftest(uint64_t message_bytes, const std::string& transports) {
  const int port = absl::GetFlag(FLAGS_perftest_port) != 0 ? absl::GetFlag(FLAGS_perftest_port)
                                                           : 20000 + getpid() % 10000;
  const std::string env =
      absl::StrCat("UCX_TLS=", transports, " UCX_NET_DEVICES=", absl::GetFlag(FLAGS_net_device));
  const std::string server =
      absl::StrCat(env, " ucx_perftest -p ", port, " >/dev/null 2>&1 & echo $!");
  FILE* s = popen(server.c_str(), "r");
  if (s == nullptr) return -1;
  int server_pid = 0;
  if (std::fscanf(s, "%d", &server_pid) != 1) server_pid = 0;
  pclose(s);
  absl::SleepFor(absl::Milliseconds(700));  // let the server listen
  const std::string client = absl::StrCat(env, " timeout 120 ucx_perftest 127.0.0.1 -p ", port,
                                          " -t ucp_get -s ", message_bytes, " -n 500 -w 50 2>&1");
  FILE* c = popen(client.c_str(), "r");
  double mbps = -1;
  if (c != nullptr) {
    char line[512];
    while (std::fgets(line, sizeof(line), c) != nullptr) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      // Final: iters lat50 lat_avg lat_all bw_avg bw_all rate_avg rate_all
      if (f.size() >= 6 && f[0] == "Final:" && !absl::SimpleAtod(f[5], &mbps)) mbps = -1;
    }
    pclose(c);
  }
  if (server_pid > 0) kill(server_pid, SIGTERM);  // normally it already exited
  // ucx_perftest's MB is 2^20 bytes.
  return mbps < 0 ? -1 : mbps * (1 << 20) / 1e9;
}

int Run() {
  const uint32_t pool_blocks = absl::GetFlag(FLAGS_pool_blocks);
  const uint64_t block = absl::GetFlag(FLAGS_block_bytes);
  const uint64_t pool_bytes = pool_blocks * block;
  const bool contiguous = absl::GetFlag(FLAGS_layout) == "contiguous";
  std::vector<uint32_t> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(b, &n) || n == 0) {
      std::fprintf(stderr, "bad --batches\n");
      return 2;
    }
    batches.push_back(n);
  }
  std::printf(
      "pool: %u blocks x %.1f MiB per side (%s), layout %s, UCX_TLS=%s, %s endpoint, %ld cpus\n",
      pool_blocks, block / 1048576.0, absl::GetFlag(FLAGS_allocate) ? "AllocateMemory" : "heap",
      contiguous ? "contiguous" : "random", absl::GetFlag(FLAGS_transports).c_str(),
      absl::GetFlag(FLAGS_separate_data_endpoint) ? "data+monitor" : "single PEER",
      sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);

  auto peer = PeerProcess::Start(
      SiblingBinary("agent_peer"),
      {absl::StrCat("--region_bytes=", pool_bytes), "--seed=7",
       absl::StrCat("--transports=", absl::GetFlag(FLAGS_transports)),
       absl::StrCat("--net_device=", absl::GetFlag(FLAGS_net_device)),
       absl::StrCat("--tcp_segment_bytes=", absl::GetFlag(FLAGS_tcp_segment_bytes)),
       absl::StrCat("--allocate=", absl::GetFlag(FLAGS_allocate) ? "true" : "false"),
       absl::StrCat("--separate_data_endpoint=",
                    absl::GetFlag(FLAGS_separate_data_endpoint) ? "true" : "false")},
      absl::Seconds(120));
  if (!peer.ok()) {
    std::fprintf(stderr, "agent_peer: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  auto agent =
      UcxAgent::Create({.transports = absl::GetFlag(FLAGS_transports),
                        .net_device = absl::GetFlag(FLAGS_net_device),
                        .tcp_segment_bytes = absl::GetFlag(FLAGS_tcp_segment_bytes),
                        .separate_data_endpoint = absl::GetFlag(FLAGS_separate_data_endpoint)});
  if (!agent.ok()) {
    std::fprintf(stderr, "UcxAgent: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> heap_pool;
  bool registered = false;
  if (absl::GetFlag(FLAGS_allocate)) {
    auto allocated = (*agent)->AllocateMemory(pool_bytes, tandem::v1::MEMORY_KIND_HOST);
    if (allocated.ok()) {
      std::memset(allocated->first, 1, pool_bytes);  // touched: every page is real
      registered = true;
    }
  } else {
    heap_pool.assign(pool_bytes, 1);  // touched: every page is real
    registered =
        (*agent)->RegisterMemory(heap_pool.data(), pool_bytes, tandem::v1::MEMORY_KIND_HOST).ok();
  }
  if (!registered || !(*agent)->AddPeer("p", (*peer)->descriptor()).ok()) {
    std::fprintf(stderr, "register/connect failed\n");
    return 1;
  }

  std::mt19937 rng(12345);
  std::vector<Point> points;
  for (uint32_t n : batches) {
    const uint64_t batch_bytes = uint64_t{n} * block;
    const int iters = static_cast<int>(
        std::clamp<uint64_t>(absl::GetFlag(FLAGS_bytes_per_point) / batch_bytes, 3, 50));
    std::vector<double> ms;
    for (int it = -1; it < iters; ++it) {  // it == -1: warm-up
      std::vector<uint32_t> src(n), dst(n);
      std::vector<uint32_t> perm_src(pool_blocks), perm_dst(pool_blocks);
      for (uint32_t i = 0; i < pool_blocks; ++i) perm_src[i] = perm_dst[i] = i;
      if (!contiguous) {
        std::shuffle(perm_src.begin(), perm_src.end(), rng);
        std::shuffle(perm_dst.begin(), perm_dst.end(), rng);
      }
      for (uint32_t i = 0; i < n; ++i) {
        src[i] = perm_src[i % pool_blocks];
        dst[i] = perm_dst[i % pool_blocks];
      }
      const std::vector<CopyOp> ops = BlockCopyOps(0, 0, block, dst, src);
      const absl::Time start = absl::Now();
      absl::StatusOr<TransferId> id = (*agent)->PostRead("p", ops);
      if (!id.ok()) {
        std::fprintf(stderr, "PostRead: %s\n", id.status().ToString().c_str());
        return 1;
      }
      absl::StatusOr<bool> done;
      // Poll like a connector would, leaving the cores to the progress threads.
      while ((done = (*agent)->CheckTransfer(*id)).ok() && !*done) {
        absl::SleepFor(absl::Microseconds(20));
      }
      if (!done.ok()) {
        std::fprintf(stderr, "transfer: %s\n", done.status().ToString().c_str());
        return 1;
      }
      if (it >= 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    std::sort(ms.begin(), ms.end());
    const double p50 = ms[ms.size() / 2];
    points.push_back({n, batch_bytes / 1048576.0, p50, batch_bytes / (p50 * 1e-3) / 1e9});
  }

  const double perftest =
      absl::GetFlag(FLAGS_perftest) ? RunPerftest(block, absl::GetFlag(FLAGS_transports)) : -1;
  // Also perftest on TCP alone: what a single peer-failure-handling endpoint gets on UCX 1.13
  // (--separate_data_endpoint=false; see ucx_agent.h).
  const double perftest_tcp = absl::GetFlag(FLAGS_perftest) ? RunPerftest(block, "tcp,self") : -1;
  auto pct = [](double ours, double ref) {
    return ref > 0 ? absl::StrCat(static_cast<int>(100 * ours / ref + 0.5), "%")
                   : std::string("n/a");
  };
  std::printf(
      "\n| blocks |      MiB |  p50 ms  |  GB/s  | %% perftest (same TLS) | %% perftest (tcp) |\n");
  std::printf(
      "|-------:|---------:|---------:|-------:|---------------------:|-----------------:|\n");
  for (const Point& p : points) {
    std::printf("| %6u | %8.0f | %8.2f | %6.2f | %20s | %16s |\n", p.blocks, p.mib, p.p50_ms,
                p.gbps, pct(p.gbps, perftest).c_str(), pct(p.gbps, perftest_tcp).c_str());
  }
  if (absl::GetFlag(FLAGS_perftest)) {
    std::printf(
        "\nucx_perftest -t ucp_get -s %lu on 127.0.0.1: UCX_TLS=%s %.2f GB/s, "
        "UCX_TLS=tcp,self %.2f GB/s (negative: did not run)\n",
        static_cast<unsigned long>(block), absl::GetFlag(FLAGS_transports).c_str(), perftest,
        perftest_tcp);
  }
  (*peer)->Stop();
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::kvtransfer::Run();
}
