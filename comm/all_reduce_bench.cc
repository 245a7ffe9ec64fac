// All-reduce latency and bus bandwidth on the GPUs of one host, one process per GPU: the custom
// one-shot / two-shot kernels (custom_all_reduce.h, through NcclCommunicator) next to NCCL
// alone, bf16, eager (a host-timed loop of calls, as torch.distributed is timed by
// tests/gpu/torch_allreduce_bench.py) and replayed from a CUDA graph (as decode steps run).
//
//   all_reduce_bench [--world=N] [--min_bytes=2048] [--max_bytes=268435456]
//
// Prints one row per size on rank 0: path, microseconds per call, bus GB/s (2 (N-1)/N bytes / t).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/nccl_communicator.h"
#include "comm/rank_spawn.h"
#include "comm/tcp_store.h"

ABSL_FLAG(int, world, 0, "ranks (one GPU each); 0: every visible GPU");
ABSL_FLAG(int64_t, min_bytes, 2048, "smallest message");
ABSL_FLAG(int64_t, max_bytes, int64_t{256} << 20, "largest message (sizes x4 from the smallest)");

namespace tandem::comm {
namespace {

// Microseconds per call: eager (host loop, synchronized at the end) or graph (10 calls captured,
// the graph replayed).
double TimeCalls(DeviceCommunicator& comm, ProcessGroup& group, cudaStream_t stream, void* buf,
                 int64_t count, bool graph) {
  const int iters = count * 2 <= (1 << 20) ? 200 : 20;
  auto call = [&] { (void)comm.AllReduceSum(buf, count, CommDtype::kBf16, stream); };
  for (int i = 0; i < 5; ++i) call();
  (void)comm.Synchronize(stream);
  cudaGraphExec_t exec = nullptr;
  constexpr int kPerGraph = 10;
  if (graph) {
    cudaGraph_t g = nullptr;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < kPerGraph; ++i) call();
    cudaStreamEndCapture(stream, &g);
    cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    cudaGraphLaunch(exec, stream);
    (void)comm.Synchronize(stream);
  }
  (void)group.Barrier();
  const absl::Time start = absl::Now();
  const int launches = graph ? (iters + kPerGraph - 1) / kPerGraph : iters;
  for (int i = 0; i < launches; ++i) graph ? (void)cudaGraphLaunch(exec, stream) : call();
  (void)comm.Synchronize(stream);
  const double us =
      absl::ToDoubleMicroseconds(absl::Now() - start) / (graph ? launches * kPerGraph : launches);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  return us;
}

int RankMain() {
  const int rank = SpawnedRank(), world = SpawnedWorld();
  cudaSetDevice(rank);
  GlooGroupOptions g;
  g.rank = rank;
  g.world_size = world;
  g.store_port = SpawnedPort();
  g.serve_store = false;
  g.timeout = absl::Seconds(120);
  auto group = GlooProcessGroup::Create(g);
  if (!group.ok()) return 2;
  NcclCommunicatorOptions o;
  o.device = rank;
  o.timeout = absl::Seconds(120);
  auto custom = NcclCommunicator::Create(group->get(), o);
  o.custom_all_reduce_max_bytes = 0;
  auto nccl = NcclCommunicator::Create(group->get(), o);
  if (!custom.ok() || !nccl.ok()) return 3;
  if (rank == 0) {
    std::printf("all_reduce_bench: world %d, bf16, custom all-reduce %s\n", world,
                (*custom)->backend() == "nccl+custom-ar"
                    ? "on"
                    : ("OFF: " + (*custom)->custom_all_reduce_off_reason()).c_str());
    std::printf("%11s %8s %10s %10s %10s %10s %11s %11s\n", "bytes", "path", "custom_us",
                "graph_us", "nccl_us", "nccl_gr_us", "custom_GB/s", "nccl_GB/s");
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const ArLimits limits;
  for (int64_t bytes = absl::GetFlag(FLAGS_min_bytes); bytes <= absl::GetFlag(FLAGS_max_bytes);
       bytes *= 4) {
    const int64_t count = bytes / 2;
    void* buf = nullptr;
    cudaMalloc(&buf, bytes);
    std::vector<uint16_t> host(count);
    std::mt19937 rng(rank);
    for (uint16_t& x : host) x = static_cast<uint16_t>(0x3c00 + rng() % 256);  // small positives
    cudaMemcpy(buf, host.data(), bytes, cudaMemcpyHostToDevice);
    const ArPath path = PlanAllReduce(bytes, world, true, limits).path;
    const bool on = (*custom)->backend() == "nccl+custom-ar" && path != ArPath::kNccl;
    const double c = on ? TimeCalls(**custom, **group, stream, buf, count, false) : 0;
    const double cg = on ? TimeCalls(**custom, **group, stream, buf, count, true) : 0;
    const double n = TimeCalls(**nccl, **group, stream, buf, count, false);
    const double ng = TimeCalls(**nccl, **group, stream, buf, count, true);
    const double bus = 2.0 * (world - 1) / world * static_cast<double>(bytes) / 1e3;
    if (rank == 0) {
      const char* name = !on ? "nccl" : path == ArPath::kOneShot ? "1-shot" : "2-shot";
      std::printf("%11lld %8s %10.1f %10.1f %10.1f %10.1f %11.1f %11.1f\n",
                  static_cast<long long>(bytes), name, c, cg, n, ng, on ? bus / c : 0.0, bus / n);
      std::fflush(stdout);
    }
    cudaFree(buf);
  }
  return 0;
}

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  using namespace tandem::comm;
  if (SpawnedRank() >= 0) {
    absl::ParseCommandLine(argc, argv);
    return RankMain();
  }
  absl::ParseCommandLine(argc, argv);
  int world = absl::GetFlag(FLAGS_world);
  if (world <= 0) cudaGetDeviceCount(&world);
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) return 1;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) pids.push_back(SpawnRank(r, world, (*server)->port(), args));
  int rc = 0;
  for (pid_t p : pids) rc |= WaitRank(p, absl::Minutes(8)) != 0;
  return rc;
}
