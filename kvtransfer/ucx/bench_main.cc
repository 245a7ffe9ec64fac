// bench: KV block pull throughput of UcxAgent between two processes on loopback, next to
// ucx_perftest's ucp_get on the same transports moving the same bytes.
//
//   bazel build //kvtransfer/ucx:bench && bazel-bin/kvtransfer/ucx/bench [--pool_blocks=1024]
//   ucx_gpu_bench (GPU bundles): the same with --cuda as the default
//
// The source is this binary re-executed as the agent_peer harness (agent_peer.h), holding
// --pool_blocks blocks of --block_bytes (default 2 MiB: one Llama-3-8B block of 16 tokens, 32
// layers x K,V x 8 KV heads x 128 x bf16). Each batch reads `n` random source blocks into
// random destination blocks (blocks are reused when n > pool, so a 4096-block batch fits in a
// 1024-block pool); --layout=contiguous reads runs instead. Pools come from AllocateMemory
// unless --allocate=false; --cuda puts both pools in GPU memory (staged through pinned host
// buffers, ucx_agent.h). Latency is PostRead -> CheckTransfer true (polled every --poll_us);
// GB/s = batch bytes / the median latency of a round's iterations.
//
// The reference: ucx_perftest -t ucp_get with message size = batch bytes (capped at
// --perftest_max_bytes; ucx_perftest needs the message on both sides), same UCX_TLS, the same
// number of iterations and warm-ups for the same bytes, and the same statistic: GB/s = message
// bytes / its median ("typical") iteration time. Each round runs ours, then ucx_perftest (the dev
// VM is shared: both then see the same background load); the table gives medians and bests over
// --rounds rounds, ours / perftest of the medians, and the median of the per-round ratios (paired,
// so load that shifts between rounds cancels). What the reference measures: one memcpy of the
// message per GET (shared memory), from and into one buffer each. glibc (2.36 on the dev VM)
// uses non-temporal stores only above 192 MiB per call (__x86_shared_non_temporal_threshold), so
// ucx_perftest gets ~8-9 GB/s up to 128 MiB and ~14-17 GB/s from 256 MiB; below a few MiB its
// buffers stay in the last-level cache, so for 1-block batches it measures cache bandwidth, not
// a random block of a big pool.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
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
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/ucx/agent_peer.h"
#include "kvtransfer/ucx/ucx_agent.h"

#ifndef TANDEM_UCX_BENCH_DEFAULT_CUDA
#define TANDEM_UCX_BENCH_DEFAULT_CUDA 0
#endif

ABSL_FLAG(uint32_t, pool_blocks, 1024, "blocks per pool (each side holds one pool)");
ABSL_FLAG(uint64_t, block_bytes, uint64_t{2} << 20, "bytes per KV block");
ABSL_FLAG(std::string, batches, "1,4,16,64,256,1024,4096", "blocks per transfer");
ABSL_FLAG(std::string, layout, "random", "random: scattered blocks; contiguous: one run");
ABSL_FLAG(uint64_t, bytes_per_point, uint64_t{4} << 30,
          "bytes per round and batch size: iterations = this / batch bytes, clamped to [5, 50]");
ABSL_FLAG(std::string, transports, "tcp,self,sm", "UCX_TLS for both agents and ucx_perftest");
ABSL_FLAG(std::string, net_device, "lo", "UCX_NET_DEVICES");
ABSL_FLAG(uint64_t, tcp_segment_bytes, 0, "UcxAgentOptions::tcp_segment_bytes");
ABSL_FLAG(bool, allocate, true,
          "both pools from UcxAgent::AllocateMemory (false: heap + RegisterMemory)");
ABSL_FLAG(bool, separate_data_endpoint, true, "UcxAgentOptions::separate_data_endpoint");
ABSL_FLAG(bool, direct_copy, true, "UcxAgentOptions::direct_copy (false: ucp_get_nbx)");
ABSL_FLAG(int, copy_threads, 2, "UcxAgentOptions::copy_threads (threads running direct copies)");
ABSL_FLAG(uint64_t, min_streaming_transfer_bytes, uint64_t{16} << 20,
          "UcxAgentOptions::min_streaming_transfer_bytes (18446744073709551615: plain memcpy)");
ABSL_FLAG(bool, cuda, TANDEM_UCX_BENCH_DEFAULT_CUDA != 0,
          "both pools in CUDA device memory, staged through pinned host buffers (CUDA builds)");
ABSL_FLAG(int, cuda_staging_buffers, 4, "UcxAgentOptions::cuda_staging_buffers");
ABSL_FLAG(uint64_t, cuda_staging_bytes, uint64_t{4} << 20, "UcxAgentOptions::cuda_staging_bytes");
ABSL_FLAG(bool, cuda_dma_from_mapped, true, "UcxAgentOptions::cuda_dma_from_mapped");
ABSL_FLAG(bool, perftest, TANDEM_UCX_BENCH_DEFAULT_CUDA == 0,
          "also run ucx_perftest -t ucp_get (needs ucx-utils; GPU bundles have none)");
ABSL_FLAG(int, poll_us, 20, "CheckTransfer polling interval (microseconds)");
ABSL_FLAG(int, rounds, 5, "rounds per batch size, ours and ucx_perftest alternating");
ABSL_FLAG(uint64_t, perftest_max_bytes, uint64_t{1} << 30, "largest ucx_perftest message");
ABSL_FLAG(int, perftest_port, 0, "ucx_perftest port (0: 20000 + pid % 10000)");

namespace tandem::kvtransfer {
namespace {

// Warm-up iterations before the measured ones, ours and ucx_perftest's alike.
constexpr int kWarmupIterations = 2;

// Measured iterations for messages (batches) of `bytes`, ours and ucx_perftest's alike.
int Iterations(uint64_t bytes) {
  return static_cast<int>(
      std::clamp<uint64_t>(absl::GetFlag(FLAGS_bytes_per_point) / bytes, 5, 50));
}

// One batch size: per round our p50 GB/s and ucx_perftest's, measured alternately so both see
// the same background load (the dev VM is shared and noisy).
struct Point {
  uint32_t blocks = 0;
  uint64_t perftest_bytes = 0;
  std::vector<double> p50_ms;
  std::vector<double> gbps;           // 1e9 bytes per second at p50
  std::vector<double> perftest_gbps;  // the same for ucx_perftest (< 0: it did not run)
  std::vector<double> ratios;         // ours / perftest per round (rounds where both ran)
};

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}
double Best(const std::vector<double>& v) {
  return v.empty() ? -1 : *std::max_element(v.begin(), v.end());
}

// ucx_perftest server + client on 127.0.0.1 moving `message_bytes` per GET; returns the client's
// bandwidth at its median iteration time in GB/s (1e9 B/s), or a negative value when it could not
// run. `port`: a fresh one per run (the last server's port may linger in TIME_WAIT).
double RunPerftest(uint64_t message_bytes, const std::string& transports, int port) {
  const int iters = Iterations(message_bytes);
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
  const std::string client =
      absl::StrCat(env, " timeout 300 ucx_perftest 127.0.0.1 -p ", port, " -t ucp_get -s ",
                   message_bytes, " -n ", iters, " -w ", kWarmupIterations, " 2>&1");
  FILE* c = popen(client.c_str(), "r");
  double lat50_us = -1;
  if (c != nullptr) {
    char line[512];
    while (std::fgets(line, sizeof(line), c) != nullptr) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      // Final: iters lat50 lat_avg lat_all bw_avg bw_all rate_avg rate_all (latencies in us per
      // iteration; one iteration = one GET of the message).
      if (f.size() >= 6 && f[0] == "Final:" && !absl::SimpleAtod(f[2], &lat50_us)) lat50_us = -1;
    }
    pclose(c);
  }
  if (server_pid > 0) kill(server_pid, SIGTERM);  // normally it already exited
  return lat50_us <= 0 ? -1 : message_bytes / (lat50_us * 1e-6) / 1e9;
}

// The first field of /proc/loadavg ("?" where unreadable): the table is only as good as the VM
// was quiet.
std::string LoadAverage() {
  std::string load = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r"); f != nullptr) {
    char text[32] = {0};
    if (std::fscanf(f, "%31s", text) == 1) load = text;
    std::fclose(f);
  }
  return load;
}

std::string Pct(double ours, double ref) {
  return ref > 0 ? absl::StrCat(static_cast<int>(100 * ours / ref + 0.5), "%") : "n/a";
}

// The local pool: AllocateMemory, heap + RegisterMemory, or CUDA device memory.
struct LocalPool {
  std::vector<uint8_t> heap;
  void* device = nullptr;
  ~LocalPool() { CudaDeviceFree(device); }
};

absl::Status SetUpLocalPool(UcxAgent& agent, uint64_t bytes, LocalPool& pool,
                            double* mirror_sync_gbps) {
  if (absl::GetFlag(FLAGS_cuda)) {
    absl::StatusOr<void*> dev = CudaDeviceAlloc(bytes);
    if (!dev.ok()) return dev.status();
    pool.device = *dev;
    std::vector<uint8_t> ones(bytes, 1);
    if (absl::Status s = CudaCopy(pool.device, ones.data(), bytes); !s.ok()) return s;
    absl::StatusOr<uint32_t> index =
        agent.RegisterMemory(pool.device, bytes, tandem::v1::MEMORY_KIND_CUDA);
    if (!index.ok()) return index.status();
    // What a source pays to publish held blocks: device -> mirror of the whole pool.
    const ByteRange all{0, bytes};
    const absl::Time start = absl::Now();
    if (absl::Status s = agent.SyncForRemoteRead(*index, {&all, 1}); !s.ok()) return s;
    *mirror_sync_gbps = bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
    return absl::OkStatus();
  }
  if (absl::GetFlag(FLAGS_allocate)) {
    auto allocated = agent.AllocateMemory(bytes, tandem::v1::MEMORY_KIND_HOST);
    if (!allocated.ok()) return allocated.status();
    std::memset(allocated->first, 1, bytes);  // touched: every page is real
    return absl::OkStatus();
  }
  pool.heap.assign(bytes, 1);  // touched: every page is real
  return agent.RegisterMemory(pool.heap.data(), bytes, tandem::v1::MEMORY_KIND_HOST).status();
}

// Reads `n` random (or contiguous) source blocks into random local blocks, Iterations() times
// after the warm-ups; returns the p50 latency in ms.
absl::StatusOr<double> MeasureBatch(UcxAgent& agent, uint32_t n, uint32_t pool_blocks,
                                    uint64_t block, bool contiguous, std::mt19937& rng) {
  const int iters = Iterations(uint64_t{n} * block);
  std::vector<double> ms;
  for (int it = -kWarmupIterations; it < iters; ++it) {  // it < 0: warm-up
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
    absl::StatusOr<TransferId> id = agent.PostRead("p", ops);
    if (!id.ok()) return id.status();
    absl::StatusOr<bool> done;
    // Poll like a connector would, leaving the cores to the progress threads.
    while ((done = agent.CheckTransfer(*id)).ok() && !*done) {
      absl::SleepFor(absl::Microseconds(absl::GetFlag(FLAGS_poll_us)));
    }
    if (!done.ok()) return done.status();
    if (it >= 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  return Median(ms);
}

int Run() {
  const uint32_t pool_blocks = absl::GetFlag(FLAGS_pool_blocks);
  const uint64_t block = absl::GetFlag(FLAGS_block_bytes);
  const uint64_t pool_bytes = pool_blocks * block;
  const bool contiguous = absl::GetFlag(FLAGS_layout) == "contiguous";
  const bool cuda = absl::GetFlag(FLAGS_cuda);
  std::vector<uint32_t> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(b, &n) || n == 0) {
      std::fprintf(stderr, "bad --batches\n");
      return 2;
    }
    batches.push_back(n);
  }
  const std::string memory =
      cuda ? absl::StrCat("CUDA, staged: ", absl::GetFlag(FLAGS_cuda_staging_buffers), " x ",
                          absl::GetFlag(FLAGS_cuda_staging_bytes) >> 10,
                          " KiB buffers, dma from mapped ",
                          absl::GetFlag(FLAGS_cuda_dma_from_mapped) ? "on" : "off")
           : (absl::GetFlag(FLAGS_allocate) ? "AllocateMemory" : "heap");
  std::printf(
      "pool: %u blocks x %.1f MiB per side (%s), layout %s, UCX_TLS=%s, %s endpoint, "
      "direct_copy %d, copy_threads %d, min_streaming_transfer_bytes %lu, poll %d us, %ld cpus, "
      "load %s\n",
      pool_blocks, block / 1048576.0, memory.c_str(), contiguous ? "contiguous" : "random",
      absl::GetFlag(FLAGS_transports).c_str(),
      absl::GetFlag(FLAGS_separate_data_endpoint) ? "data+monitor" : "single PEER",
      absl::GetFlag(FLAGS_direct_copy), absl::GetFlag(FLAGS_copy_threads),
      static_cast<unsigned long>(absl::GetFlag(FLAGS_min_streaming_transfer_bytes)),
      absl::GetFlag(FLAGS_poll_us), sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  std::fflush(stdout);

  const auto [peer_binary, peer_args] = ReexecAsAgentPeer(
      {absl::StrCat("--region_bytes=", pool_bytes), "--seed=7",
       absl::StrCat("--transports=", absl::GetFlag(FLAGS_transports)),
       absl::StrCat("--net_device=", absl::GetFlag(FLAGS_net_device)),
       absl::StrCat("--tcp_segment_bytes=", absl::GetFlag(FLAGS_tcp_segment_bytes)),
       absl::StrCat("--allocate=", absl::GetFlag(FLAGS_allocate) ? "true" : "false"),
       absl::StrCat("--cuda=", cuda ? "true" : "false"),
       absl::StrCat("--separate_data_endpoint=",
                    absl::GetFlag(FLAGS_separate_data_endpoint) ? "true" : "false")});
  auto peer = PeerProcess::Start(peer_binary, peer_args, absl::Seconds(300));
  if (!peer.ok()) {
    std::fprintf(stderr, "agent_peer: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  std::vector<Point> points;
  double mirror_sync_gbps = -1;
  {
    LocalPool pool;  // freed after the agent
    auto agent = UcxAgent::Create(
        {.transports = absl::GetFlag(FLAGS_transports),
         .net_device = absl::GetFlag(FLAGS_net_device),
         .tcp_segment_bytes = absl::GetFlag(FLAGS_tcp_segment_bytes),
         .separate_data_endpoint = absl::GetFlag(FLAGS_separate_data_endpoint),
         .direct_copy = absl::GetFlag(FLAGS_direct_copy),
         .copy_threads = absl::GetFlag(FLAGS_copy_threads),
         .min_streaming_transfer_bytes = absl::GetFlag(FLAGS_min_streaming_transfer_bytes),
         .stage_cuda_memory = cuda,
         .cuda_staging_buffers = absl::GetFlag(FLAGS_cuda_staging_buffers),
         .cuda_staging_bytes = absl::GetFlag(FLAGS_cuda_staging_bytes),
         .cuda_dma_from_mapped = absl::GetFlag(FLAGS_cuda_dma_from_mapped)});
    if (!agent.ok()) {
      std::fprintf(stderr, "UcxAgent: %s\n", agent.status().ToString().c_str());
      return 1;
    }
    if (absl::Status s = SetUpLocalPool(**agent, pool_bytes, pool, &mirror_sync_gbps); !s.ok()) {
      std::fprintf(stderr, "local pool: %s\n", s.ToString().c_str());
      return 1;
    }
    if (absl::Status s = (*agent)->AddPeer("p", (*peer)->descriptor()); !s.ok()) {
      std::fprintf(stderr, "AddPeer: %s\n", s.ToString().c_str());
      return 1;
    }
    std::mt19937 rng(12345);
    const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
    const bool perftest = absl::GetFlag(FLAGS_perftest);
    const int base_port = absl::GetFlag(FLAGS_perftest_port) != 0
                              ? absl::GetFlag(FLAGS_perftest_port)
                              : 20000 + getpid() % 10000;
    int perftest_runs = 0;
    for (uint32_t n : batches) {
      Point point;
      point.blocks = n;
      point.perftest_bytes =
          std::min<uint64_t>(uint64_t{n} * block, absl::GetFlag(FLAGS_perftest_max_bytes));
      for (int round = 0; round < rounds; ++round) {
        absl::StatusOr<double> p50 = MeasureBatch(**agent, n, pool_blocks, block, contiguous, rng);
        if (!p50.ok()) {
          std::fprintf(stderr, "%s\n", p50.status().ToString().c_str());
          return 1;
        }
        point.p50_ms.push_back(*p50);
        point.gbps.push_back(uint64_t{n} * block / (*p50 * 1e-3) / 1e9);
        if (perftest) {
          const double ref = RunPerftest(point.perftest_bytes, absl::GetFlag(FLAGS_transports),
                                         base_port + perftest_runs++);
          if (ref > 0) {
            point.perftest_gbps.push_back(ref);
            point.ratios.push_back(point.gbps.back() / ref);
          }
        }
      }
      points.push_back(std::move(point));
    }
  }
  (*peer)->Stop();

  std::printf(
      "\n| blocks |    MiB | p50 ms | GB/s median | GB/s best | perftest MiB | perftest median "
      "| perftest best | %% of medians | %% paired | %% best |\n");
  std::printf(
      "|-------:|-------:|-------:|------------:|----------:|-------------:|----------------:"
      "|--------------:|-------------:|---------:|-------:|\n");
  for (const Point& p : points) {
    const double ref_median = Median(p.perftest_gbps);
    const double ref_best = Best(p.perftest_gbps);
    const double paired = Median(p.ratios);
    std::printf(
        "| %6u | %6.0f | %6.2f | %11.2f | %9.2f | %12.0f | %15.2f | %13.2f | %12s | %8s | %6s |\n",
        p.blocks, p.blocks * block / 1048576.0, Median(p.p50_ms), Median(p.gbps), Best(p.gbps),
        p.perftest_bytes / 1048576.0, ref_median, ref_best, Pct(Median(p.gbps), ref_median).c_str(),
        Pct(paired, paired > 0 ? 1.0 : -1.0).c_str(), Pct(Best(p.gbps), ref_best).c_str());
  }
  if (absl::GetFlag(FLAGS_perftest)) {
    std::printf(
        "\nperftest: ucx_perftest 127.0.0.1 -t ucp_get -s <perftest MiB> with UCX_TLS=%s, run "
        "alternately with ours (%d rounds, %d warm-ups + clamp(%lu / bytes, 5, 50) iterations "
        "each, GB/s at the median iteration; -1: did not run). %% paired: median over rounds of "
        "ours / perftest in the same round. It re-reads one buffer, which is cache-resident up "
        "to a few MiB.\n",
        absl::GetFlag(FLAGS_transports).c_str(), absl::GetFlag(FLAGS_rounds), kWarmupIterations,
        static_cast<unsigned long>(absl::GetFlag(FLAGS_bytes_per_point)));
  }
  std::printf("load average (1 min) at the end: %s\n", LoadAverage().c_str());
  if (cuda) {
    std::printf(
        "source side: SyncForRemoteRead of the whole %.0f MiB pool (device -> mirror) "
        "at %.2f GB/s\n",
        pool_bytes / 1048576.0, mirror_sync_gbps);
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  int exit_code = 0;
  if (tandem::kvtransfer::MaybeRunAsAgentPeer(argc, argv, &exit_code)) return exit_code;
  absl::ParseCommandLine(argc, argv);
  return tandem::kvtransfer::Run();
}
