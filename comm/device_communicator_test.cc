// DeviceCommunicator backends on the GPU, every collective against a reference computed here
// from fresh random inputs:
//   * NCCL with world size 1 (one GPU is enough), eagerly and inside a captured CUDA graph.
//   * Host-staged over Gloo with two ranks sharing one GPU (threads), bf16 and fp32.
//   * NCCL with two ranks as two processes, one GPU each (skipped with fewer than 2 GPUs):
//     collectives, a captured graph, and the failure model: a SIGSTOPped rank makes the other's
//     Synchronize fail DEADLINE_EXCEEDED at the deadline, a SIGKILLed one fails it (UNAVAILABLE
//     or DEADLINE_EXCEEDED) without hanging; the communicator stays broken afterwards.
// The two-process cases re-run this binary as the ranks (comm/rank_spawn.h: TANDEM_RANK_* in the
// environment, the case's mode as the argument), so no CUDA state crosses a fork.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "comm/gloo_process_group.h"
#include "comm/host_staged_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/rank_spawn.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

float RoundBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Device buffer of floats or bf16 values, filled from / read back to host floats.
class DeviceArray {
 public:
  DeviceArray(int64_t n, CommDtype dtype) : n_(n), dtype_(dtype) {
    cudaMalloc(&ptr_, std::max<int64_t>(n, 1) * CommDtypeBytes(dtype));
  }
  ~DeviceArray() { cudaFree(ptr_); }
  void* get() const { return ptr_; }
  void Set(const std::vector<float>& v) {
    if (dtype_ == CommDtype::kF32) {
      cudaMemcpy(ptr_, v.data(), n_ * 4, cudaMemcpyHostToDevice);
      return;
    }
    std::vector<__nv_bfloat16> h(n_);
    for (int64_t i = 0; i < n_; ++i) h[i] = __float2bfloat16_rn(v[i]);
    cudaMemcpy(ptr_, h.data(), n_ * 2, cudaMemcpyHostToDevice);
  }
  std::vector<float> Get() const {
    std::vector<float> v(n_);
    if (dtype_ == CommDtype::kF32) {
      cudaMemcpy(v.data(), ptr_, n_ * 4, cudaMemcpyDeviceToHost);
      return v;
    }
    std::vector<__nv_bfloat16> h(n_);
    cudaMemcpy(h.data(), ptr_, n_ * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n_; ++i) v[i] = __bfloat162float(h[i]);
    return v;
  }

 private:
  int64_t n_;
  CommDtype dtype_;
  void* ptr_ = nullptr;
};

// Inputs every rank can compute: rank r's n values of collective `salt`.
std::vector<float> Inputs(uint32_t seed, int salt, int rank, int64_t n, CommDtype dtype) {
  std::mt19937 rng(seed ^ (salt * 7919u) ^ (rank * 104729u));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = value(rng);
    if (dtype == CommDtype::kBf16) v[i] = RoundBf16(v[i]);
  }
  return v;
}

// Runs every collective of `comm` (rank r of n) and checks it; `graph`: the all-reduce and
// all-gather are captured into a CUDA graph that is launched twice (the second launch must give
// the same result from reset inputs).
void CheckCollectives(DeviceCommunicator& comm, cudaStream_t stream, uint32_t seed, CommDtype dtype,
                      bool graph) {
  const int n = comm.size(), r = comm.rank();
  const double tol = dtype == CommDtype::kBf16 ? 0.02 * n : 1e-5 * n;
  std::mt19937 sizes(seed);
  const int64_t count = 1 + sizes() % 5000;
  SCOPED_TRACE(::testing::Message()
               << "rank " << r << "/" << n << " count " << count << " dtype "
               << (dtype == CommDtype::kF32 ? "f32" : "bf16") << " graph " << graph);
  // all-reduce
  DeviceArray data(count, dtype);
  data.Set(Inputs(seed, 1, r, count, dtype));
  DeviceArray in(count, dtype), gathered(count * n, dtype);
  in.Set(Inputs(seed, 2, r, count, dtype));
  if (graph) {
    cudaGraph_t g = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status a = comm.AllReduceSum(data.get(), count, dtype, stream);
    const absl::Status b = comm.AllGather(in.get(), gathered.get(), count, dtype, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
    ASSERT_TRUE(a.ok()) << a;
    ASSERT_TRUE(b.ok()) << b;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    cudaGraphDestroy(g);
    for (int launch = 0; launch < 2; ++launch) {
      data.Set(Inputs(seed, 1, r, count, dtype));
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_TRUE(comm.Synchronize(stream).ok());
    }
    cudaGraphExecDestroy(exec);
  } else {
    ASSERT_TRUE(comm.AllReduceSum(data.get(), count, dtype, stream).ok());
    ASSERT_TRUE(comm.AllGather(in.get(), gathered.get(), count, dtype, stream).ok());
    ASSERT_TRUE(comm.Synchronize(stream).ok());
  }
  const std::vector<float> sum = data.Get(), all = gathered.Get();
  std::vector<std::vector<float>> ar_inputs(n);
  for (int k = 0; k < n; ++k) ar_inputs[k] = Inputs(seed, 1, k, count, dtype);
  for (int64_t i = 0; i < count; ++i) {
    double want = 0;
    for (int k = 0; k < n; ++k) want += ar_inputs[k][i];
    ASSERT_NEAR(sum[i], want, tol) << "all-reduce element " << i;
  }
  for (int k = 0; k < n; ++k) {
    const std::vector<float> theirs = Inputs(seed, 2, k, count, dtype);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(all[k * count + i], theirs[i]);
  }
  if (graph) return;
  // reduce-scatter: in [n x count] per rank.
  DeviceArray rs_in(count * n, dtype), rs_out(count, dtype);
  rs_in.Set(Inputs(seed, 3, r, count * n, dtype));
  ASSERT_TRUE(comm.ReduceScatterSum(rs_in.get(), rs_out.get(), count, dtype, stream).ok());
  ASSERT_TRUE(comm.Synchronize(stream).ok());
  const std::vector<float> rs = rs_out.Get();
  std::vector<std::vector<float>> rs_inputs(n);
  for (int k = 0; k < n; ++k) rs_inputs[k] = Inputs(seed, 3, k, count * n, dtype);
  for (int64_t i = 0; i < count; ++i) {
    double want = 0;
    for (int k = 0; k < n; ++k) want += rs_inputs[k][r * count + i];
    ASSERT_NEAR(rs[i], want, tol) << "reduce-scatter element " << i;
  }
  // all-to-all, uneven: rank i sends (i + 2 j) % 5 + j elements to rank j (zeros included).
  auto part = [](int i, int j) { return static_cast<int64_t>((i + 2 * j) % 5 + (j % 2) * 3); };
  std::vector<int64_t> send_counts(n), recv_counts(n);
  int64_t sent = 0, received = 0;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = part(r, j);
    recv_counts[j] = part(j, r);
    sent += send_counts[j];
    received += recv_counts[j];
  }
  DeviceArray a_in(sent, dtype), a_out(received, dtype);
  std::vector<float> send;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < send_counts[j]; ++k) send.push_back(100.0f * r + 10 * j + k);
  }
  a_in.Set(send);
  ASSERT_TRUE(comm.AllToAll(a_in.get(), send_counts, a_out.get(), recv_counts, dtype, stream).ok());
  ASSERT_TRUE(comm.Synchronize(stream).ok());
  const std::vector<float> got = a_out.Get();
  int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    for (int64_t k = 0; k < recv_counts[j]; ++k) {
      ASSERT_EQ(got[at++], 100.0f * j + 10 * r + k) << "all-to-all from " << j;
    }
  }
  // send/recv around the ring (n > 1).
  if (n > 1) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    DeviceArray mine(count, dtype), theirs(count, dtype);
    mine.Set(Inputs(seed, 4, r, count, dtype));
    if (r % 2 == 0) {
      ASSERT_TRUE(comm.Send(mine.get(), count, dtype, next, stream).ok());
      ASSERT_TRUE(comm.Recv(theirs.get(), count, dtype, prev, stream).ok());
    } else {
      ASSERT_TRUE(comm.Recv(theirs.get(), count, dtype, prev, stream).ok());
      ASSERT_TRUE(comm.Send(mine.get(), count, dtype, next, stream).ok());
    }
    ASSERT_TRUE(comm.Synchronize(stream).ok());
    EXPECT_EQ(theirs.Get(), Inputs(seed, 4, prev, count, dtype));
  }
  EXPECT_TRUE(comm.status().ok());
}

GlooGroupOptions HostGroup(int rank, int size, int port) {
  GlooGroupOptions o;
  o.rank = rank;
  o.world_size = size;
  o.store_port = port;
  o.serve_store = false;
  o.timeout = absl::Seconds(60);
  return o;
}

TEST(NcclCommunicatorTest, WorldSizeOneEagerAndInACapturedGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto group = GlooProcessGroup::Create(HostGroup(0, 1, (*server)->port()));
  ASSERT_TRUE(group.ok()) << group.status();
  NcclCommunicatorOptions options;
  auto comm = NcclCommunicator::Create(group->get(), options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_TRUE((*comm)->graph_capturable());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (CommDtype dtype : {CommDtype::kF32, CommDtype::kBf16}) {
    CheckCollectives(**comm, stream, seed, dtype, /*graph=*/false);
    CheckCollectives(**comm, stream, seed + 1, dtype, /*graph=*/true);
  }
  EXPECT_FALSE((*comm)->Send(nullptr, 1, CommDtype::kF32, 0, stream).ok()) << "no peer";
  cudaStreamDestroy(stream);
}

TEST(HostStagedCommunicatorTest, TwoRanksShareOneGpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      cudaSetDevice(0);
      auto group = GlooProcessGroup::Create(HostGroup(r, 2, (*server)->port()));
      ASSERT_TRUE(group.ok()) << group.status();
      HostStagedCommunicator comm(group->get());
      EXPECT_FALSE(comm.graph_capturable());
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      for (CommDtype dtype : {CommDtype::kF32, CommDtype::kBf16}) {
        CheckCollectives(comm, stream, seed, dtype, /*graph=*/false);
      }
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : ranks) t.join();
}

// ---- two NCCL ranks as processes ----

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// The rank's body (in the child process). Exit code 0: everything held.
int ChildMain(int rank, int port, const std::string& mode) {
  if (cudaSetDevice(rank) != cudaSuccess) return 2;
  auto group = GlooProcessGroup::Create(HostGroup(rank, 2, port));
  if (!group.ok()) return 3;
  NcclCommunicatorOptions options;
  options.device = rank;
  options.timeout = mode == "collectives" ? absl::Seconds(60) : absl::Seconds(3);
  auto comm = NcclCommunicator::Create(group->get(), options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 4;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (mode == "collectives") {
    for (CommDtype dtype : {CommDtype::kF32, CommDtype::kBf16}) {
      CheckCollectives(**comm, stream, 1234, dtype, false);
      CheckCollectives(**comm, stream, 99, dtype, true);
    }
    return ::testing::Test::HasFailure() ? 1 : 0;
  }
  // Fault modes: one good all-reduce, then rank 1 stops (or dies) and rank 0 must not hang.
  DeviceArray data(1 << 20, CommDtype::kF32);
  data.Set(std::vector<float>(1 << 20, 1.0f));
  if (!(*comm)->AllReduceSum(data.get(), 1 << 20, CommDtype::kF32, stream).ok()) return 5;
  if (!(*comm)->Synchronize(stream).ok()) return 6;
  if (!(*group)->Barrier().ok()) return 7;
  if (rank == 1) {
    raise(mode == "stop" ? SIGSTOP : SIGKILL);
    return 0;
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::Status s = (*comm)->AllReduceSum(data.get(), 1 << 20, CommDtype::kF32, stream);
  if (s.ok()) s = (*comm)->Synchronize(stream);
  const absl::Duration took = absl::Now() - start;
  std::fprintf(stderr, "rank 0 after peer %s: %s in %s\n", mode.c_str(), s.ToString().c_str(),
               absl::FormatDuration(took).c_str());
  if (s.ok()) return 8;
  if (mode == "stop" && s.code() != absl::StatusCode::kDeadlineExceeded) return 9;
  if (took > absl::Seconds(10)) return 10;
  // Broken from here on, at once.
  if ((*comm)->AllReduceSum(data.get(), 1, CommDtype::kF32, stream).code() != s.code()) return 11;
  return 0;
}

void RunTwoRanks(const std::string& mode) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one device)";
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  const pid_t r0 = SpawnRank(0, 2, (*server)->port(), {mode});
  const pid_t r1 = SpawnRank(1, 2, (*server)->port(), {mode});
  ASSERT_GT(r0, 0);
  ASSERT_GT(r1, 0);
  EXPECT_EQ(WaitRank(r0, absl::Seconds(120)), 0) << "rank 0 (" << mode << ")";
  if (mode == "collectives") {
    EXPECT_EQ(WaitRank(r1, absl::Seconds(30)), 0) << "rank 1";
  } else {
    kill(r1, SIGKILL);  // the stopped one
    WaitRank(r1, absl::Seconds(10));
  }
}

TEST(NcclCommunicatorTest, TwoRanksCollectives) {
  TANDEM_SKIP_WITHOUT_GPU();
  RunTwoRanks("collectives");
}

TEST(NcclCommunicatorTest, StoppedRankHitsTheDeadline) {
  TANDEM_SKIP_WITHOUT_GPU();
  RunTwoRanks("stop");
}

TEST(NcclCommunicatorTest, KilledRankFailsWithoutHanging) {
  TANDEM_SKIP_WITHOUT_GPU();
  RunTwoRanks("kill");
}

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  if (const int rank = tandem::comm::SpawnedRank(); rank >= 0) {  // a rank: argv[1] is its mode
    return tandem::comm::ChildMain(rank, tandem::comm::SpawnedPort(), argc > 1 ? argv[1] : "");
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
