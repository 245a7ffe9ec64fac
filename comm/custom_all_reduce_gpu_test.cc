// The custom all-reduce (custom_all_reduce.h) on 2 and 4 GPUs, one process per GPU, through
// NcclCommunicator (which routes small all-reduces to it): for every size from 2 KiB to 8 MiB
// (powers of two and odd multiples of 16 bytes; one-shot and two-shot) on random bf16 / fp32
// inputs, every rank's result equals the host reference (fp32 in rank order, rounded once) bit
// for bit and NCCL's within the dtype's tolerance; then the same inside a captured CUDA graph
// replayed with fresh inputs. Skipped with fewer GPUs than ranks.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/custom_all_reduce_reference.h"
#include "comm/gloo_process_group.h"
#include "comm/nccl_communicator.h"
#include "comm/rank_spawn.h"
#include "comm/tcp_store.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

// Rank r's values for (size, salt) as raw element bits (bf16) or floats, computable anywhere.
std::vector<uint16_t> Bf16Inputs(int rank, int64_t count, int salt) {
  std::mt19937 rng(static_cast<uint32_t>(count * 131 + rank * 7919 + salt * 104729));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (uint16_t& x : v) x = ArFloatToBf16(normal(rng));
  return v;
}
std::vector<float> F32Inputs(int rank, int64_t count, int salt) {
  std::mt19937 rng(static_cast<uint32_t>(count * 131 + rank * 7919 + salt * 104729));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

// One size: custom (through `comm`) and NCCL (through `nccl`) on the same inputs.
int CheckSize(NcclCommunicator& comm, NcclCommunicator& nccl, cudaStream_t stream, int rank,
              int world, int64_t bytes, CommDtype dtype, int salt) {
  const int64_t elem = CommDtypeBytes(dtype), count = bytes / elem;
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  std::vector<char> host(bytes), got(bytes), theirs(bytes);
  std::vector<std::vector<uint16_t>> in16(world);
  std::vector<std::vector<float>> in32(world);
  for (int r = 0; r < world; ++r) {
    if (dtype == CommDtype::kBf16) in16[r] = Bf16Inputs(r, count, salt);
    if (dtype == CommDtype::kF32) in32[r] = F32Inputs(r, count, salt);
  }
  std::memcpy(host.data(),
              dtype == CommDtype::kBf16 ? static_cast<void*>(in16[rank].data())
                                        : static_cast<void*>(in32[rank].data()),
              bytes);
  cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(b, host.data(), bytes, cudaMemcpyHostToDevice);
  absl::Status s = comm.AllReduceSum(a, count, dtype, stream);
  if (s.ok()) s = comm.Synchronize(stream);
  if (s.ok()) s = nccl.AllReduceSum(b, count, dtype, stream);
  if (s.ok()) s = nccl.Synchronize(stream);
  cudaMemcpy(got.data(), a, bytes, cudaMemcpyDeviceToHost);
  cudaMemcpy(theirs.data(), b, bytes, cudaMemcpyDeviceToHost);
  cudaFree(a);
  cudaFree(b);
  const std::string what =
      absl::StrCat(bytes, " bytes ", dtype == CommDtype::kBf16 ? "bf16" : "f32");
  if (!s.ok()) return Fail(rank, absl::StrCat(what, ": ", s.ToString()));
  int64_t bad = 0, first = -1;
  double worst_nccl = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    float want = 0.0f, mine = 0.0f, ref = 0.0f, scale = 0.0f;
    if (dtype == CommDtype::kBf16) {
      for (int r = 0; r < world; ++r) want += ArBf16ToFloat(in16[r][i]);
      want = ArBf16ToFloat(ArFloatToBf16(want));
      uint16_t m, n;
      std::memcpy(&m, &got[i * 2], 2);
      std::memcpy(&n, &theirs[i * 2], 2);
      mine = ArBf16ToFloat(m);
      ref = ArBf16ToFloat(n);
      scale = 0.01f * world;
    } else {
      for (int r = 0; r < world; ++r) want += in32[r][i];
      std::memcpy(&mine, &got[i * 4], 4);
      std::memcpy(&ref, &theirs[i * 4], 4);
      scale = 1e-5f * world;
    }
    if (mine != want) {
      if (first < 0) first = i;
      ++bad;
    }
    worst_nccl = std::max(worst_nccl, static_cast<double>(std::fabs(mine - ref)) / scale);
  }
  if (bad > 0) {
    return Fail(
        rank, absl::StrCat(what, ": ", bad, " elements differ from the reference, first ", first));
  }
  if (worst_nccl > 4.0) return Fail(rank, absl::StrCat(what, ": far from NCCL"));
  return 0;
}

// Three all-reduces captured once, replayed three times with fresh inputs.
int CheckGraph(NcclCommunicator& comm, cudaStream_t stream, int rank, int world) {
  const std::vector<int64_t> sizes = {8192, 1 << 20, 4 << 20};
  std::vector<void*> bufs(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) cudaMalloc(&bufs[k], sizes[k]);
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  absl::Status s;
  for (size_t k = 0; k < sizes.size() && s.ok(); ++k) {
    s = comm.AllReduceSum(bufs[k], sizes[k] / 2, CommDtype::kBf16, stream);
  }
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !s.ok()) {
    return Fail(rank, absl::StrCat("capture: ", s.ToString()));
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return Fail(rank, "instantiate");
  int failures = 0;
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<std::vector<std::vector<uint16_t>>> inputs(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (int r = 0; r < world; ++r) inputs[k].push_back(Bf16Inputs(r, sizes[k] / 2, 50 + replay));
      cudaMemcpy(bufs[k], inputs[k][rank].data(), sizes[k], cudaMemcpyHostToDevice);
    }
    cudaGraphLaunch(exec, stream);
    if (absl::Status sync = comm.Synchronize(stream); !sync.ok()) {
      return Fail(rank, absl::StrCat("replay ", replay, ": ", sync.ToString()));
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<uint16_t> got(sizes[k] / 2);
      cudaMemcpy(got.data(), bufs[k], sizes[k], cudaMemcpyDeviceToHost);
      if (got != AllReduceReferenceBf16(inputs[k])) {
        failures += Fail(rank, absl::StrCat("graph replay ", replay, " size ", sizes[k]));
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (void* p : bufs) cudaFree(p);
  return failures;
}

int RankMain() {
  const int rank = SpawnedRank(), world = SpawnedWorld();
  if (cudaSetDevice(rank) != cudaSuccess) return 2;
  GlooGroupOptions g;
  g.rank = rank;
  g.world_size = world;
  g.store_port = SpawnedPort();
  g.serve_store = false;
  g.timeout = absl::Seconds(60);
  auto group = GlooProcessGroup::Create(g);
  if (!group.ok()) return Fail(rank, group.status().ToString());
  NcclCommunicatorOptions o;
  o.device = rank;
  o.timeout = absl::Seconds(60);
  auto comm = NcclCommunicator::Create(group->get(), o);
  o.custom_all_reduce_max_bytes = 0;
  auto nccl = NcclCommunicator::Create(group->get(), o);
  if (!comm.ok() || !nccl.ok()) return Fail(rank, "communicator creation failed");
  if ((*comm)->backend() != "nccl+custom-ar") {
    return Fail(rank, "custom all-reduce off: " + (*comm)->custom_all_reduce_off_reason());
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  int failures = 0, salt = 0;
  for (int64_t bytes = 2048; bytes <= (int64_t{8} << 20); bytes *= 2) {
    for (int64_t size : {bytes, bytes + 16 * (1 + 2 * (bytes % 7)), bytes * 3 / 2 + 48}) {
      if (size > (int64_t{8} << 20)) continue;
      failures += CheckSize(**comm, **nccl, stream, rank, world, size, CommDtype::kBf16, ++salt);
    }
    failures += CheckSize(**comm, **nccl, stream, rank, world, bytes, CommDtype::kF32, ++salt);
  }
  failures += CheckGraph(**comm, stream, rank, world);
  return failures == 0 ? 0 : 1;
}

void RunWorld(int world) {
  TANDEM_SKIP_WITHOUT_GPU();
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < world) GTEST_SKIP() << "needs " << world << " GPUs";
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) pids.push_back(SpawnRank(r, world, (*server)->port(), {}));
  for (int r = 0; r < world; ++r) {
    ASSERT_GT(pids[r], 0);
    EXPECT_EQ(WaitRank(pids[r], absl::Seconds(300)), 0) << "rank " << r << " of " << world;
  }
}

TEST(CustomAllReduceGpuTest, TwoRanksMatchTheReferenceAndNccl) { RunWorld(2); }
TEST(CustomAllReduceGpuTest, FourRanksMatchTheReferenceAndNccl) { RunWorld(4); }

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  if (tandem::comm::SpawnedRank() >= 0) return tandem::comm::RankMain();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
