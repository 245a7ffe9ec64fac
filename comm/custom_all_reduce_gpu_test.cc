// The custom all-reduce (custom_all_reduce.h) on 2 and 4 GPUs, one process per GPU, through
// NcclCommunicator (which routes small all-reduces to it): for every size from 2 KiB to 8 MiB
// (powers of two and odd multiples of 16 bytes; one-shot and two-shot) on random bf16 / fp32
// inputs, every rank's result equals the host reference (fp32 in rank order, rounded once) bit
// for bit and NCCL's within the dtype's tolerance; then the same inside a captured CUDA graph
// replayed with fresh inputs. The fused all-reduce + add + RMSNorm against the host reference,
// the custom all-reduce + kernels/layers/cuda's norm and NCCL + that norm, at the 8B and 70B
// widths, and interleaved with plain all-reduces in a replayed graph. Skipped with fewer GPUs than
// ranks.
#include <cuda_bf16.h>
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
#include "kernels/layers/cuda/layers_cuda.h"

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

// Bf16 values one apart in the last bit are 1 apart (signs handled; +0 and -0 are 0 apart).
int Ulps(uint16_t a, uint16_t b) {
  auto key = [](uint16_t u) { return (u & 0x8000) ? -static_cast<int>(u & 0x7fff) : int{u}; };
  return std::abs(key(a) - key(b));
}

// Device copies of host bf16 vectors.
struct Rows {
  std::vector<void*> bufs;
  ~Rows() {
    for (void* p : bufs) cudaFree(p);
  }
  void* Put(const std::vector<uint16_t>& host) {
    void* d = nullptr;
    cudaMalloc(&d, host.size() * 2);
    cudaMemcpy(d, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    bufs.push_back(d);
    return d;
  }
  static std::vector<uint16_t> Get(const void* d, int64_t n) {
    std::vector<uint16_t> host(n);
    cudaMemcpy(host.data(), d, n * 2, cudaMemcpyDeviceToHost);
    return host;
  }
};

// Rank inputs, the residual (alike on every rank) and weights around 1 of one fused case.
struct FusedCase {
  std::vector<std::vector<uint16_t>> inputs;
  std::vector<uint16_t> residual, weight;
  FusedCase(int world, int64_t rows, int64_t hidden, int salt) {
    for (int r = 0; r < world; ++r) inputs.push_back(Bf16Inputs(r, rows * hidden, salt));
    residual = Bf16Inputs(world + 11, rows * hidden, salt);
    weight = Bf16Inputs(world + 12, hidden, salt);
    for (uint16_t& w : weight) w = ArFloatToBf16(1.0f + 0.1f * ArBf16ToFloat(w));
  }
};

// The unfused add + norm after an all-reduce of `in` (the model's path without fusion).
absl::Status Unfused(DeviceCommunicator& c, const AddRmsNormArgs& a, cudaStream_t stream) {
  namespace kc = kernels::cuda;
  auto* in = static_cast<__nv_bfloat16*>(const_cast<void*>(a.in));
  auto* res = static_cast<__nv_bfloat16*>(a.residual);
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const auto* w = static_cast<const __nv_bfloat16*>(a.weight);
  absl::Status s = c.AllReduceSum(in, a.rows * a.hidden, CommDtype::kBf16, stream);
  if (!s.ok()) return s;
  if (a.add_residual) return kc::FusedAddRmsNorm(out, res, w, a.rows, a.hidden, a.eps, stream);
  return kc::RmsNorm(res, w, a.rows, a.hidden, a.eps, out, stream);
}

// Args of a case on the device: with the add, in = out (the layer's hidden); without, in =
// residual (the embedding's partial rows).
AddRmsNormArgs Place(Rows& d, const FusedCase& c, int rank, int64_t rows, int64_t hidden,
                     bool add) {
  AddRmsNormArgs a;
  a.rows = rows;
  a.hidden = hidden;
  a.eps = 1e-5f;
  a.add_residual = add;
  a.weight = d.Put(c.weight);
  if (add) {
    a.out = d.Put(c.inputs[rank]);
    a.in = a.out;
    a.residual = d.Put(c.residual);
  } else {
    a.residual = d.Put(c.inputs[rank]);
    a.in = a.residual;
    a.out = d.Put(std::vector<uint16_t>(rows * hidden));
  }
  return a;
}

// The fused kernel vs (a) the host reference: residual exact, out within 2 bf16 ulps (the host
// uses an exact square root); (b) the custom all-reduce + kernels/layers/cuda's norm: bit for bit
// (the same sums, squares and row sum in the same order, whether a row spans one block or a
// cluster of them); (c) NCCL + the same norm: within bf16 tolerance.
int CheckFused(NcclCommunicator& comm, NcclCommunicator& nccl, cudaStream_t stream, int rank,
               int world, int64_t rows, int64_t hidden, bool add, int salt) {
  const FusedCase c(world, rows, hidden, salt);
  const std::string what = absl::StrCat("fused rows ", rows, " hidden ", hidden, " add ", add);
  Rows d;
  const AddRmsNormArgs fused = Place(d, c, rank, rows, hidden, add);
  const AddRmsNormArgs plain = Place(d, c, rank, rows, hidden, add);
  const AddRmsNormArgs theirs = Place(d, c, rank, rows, hidden, add);
  absl::StatusOr<bool> done = comm.AllReduceAddRmsNorm(fused, CommDtype::kBf16, stream);
  if (!done.ok() || !*done) return Fail(rank, what + ": not fused");
  absl::Status s = comm.Synchronize(stream);
  if (s.ok()) s = Unfused(comm, plain, stream);
  if (s.ok()) s = comm.Synchronize(stream);
  if (s.ok()) s = Unfused(nccl, theirs, stream);
  if (s.ok()) s = nccl.Synchronize(stream);
  if (!s.ok()) return Fail(rank, absl::StrCat(what, ": ", s.ToString()));
  const int64_t n = rows * hidden;
  const AddRmsNormBf16 want =
      AllReduceAddRmsNormReferenceBf16(c.inputs, c.residual, c.weight, hidden, 1e-5f, add);
  const auto res = Rows::Get(fused.residual, n), out = Rows::Get(fused.out, n);
  const auto plain_out = Rows::Get(plain.out, n), nccl_out = Rows::Get(theirs.out, n);
  int64_t ref_far = 0, plain_far = 0, plain_differ = 0, nccl_far = 0;
  for (int64_t i = 0; i < n; ++i) {
    ref_far += Ulps(out[i], want.out[i]) > 2;
    plain_far += Ulps(out[i], plain_out[i]) > 1;
    plain_differ += out[i] != plain_out[i];
    const float a = ArBf16ToFloat(out[i]), b = ArBf16ToFloat(nccl_out[i]);
    nccl_far += std::fabs(a - b) > 0.02f * std::fabs(b) + 0.02f;
  }
  if (rank == 0) {
    std::printf("%s: %lld of %lld outputs not bit-identical to custom all-reduce + norm\n",
                what.c_str(), static_cast<long long>(plain_differ), static_cast<long long>(n));
  }
  if (res != want.residual) return Fail(rank, what + ": residual differs from the reference");
  if (plain_differ > 0) return Fail(rank, what + ": not bit-identical to custom + norm");
  if (ref_far + plain_far + nccl_far > 0) {
    return Fail(rank, absl::StrCat(what, ": ", ref_far, " far from the reference, ", plain_far,
                                   " from custom + norm, ", nccl_far, " from NCCL + norm"));
  }
  return 0;
}

// Plain all-reduces and fused calls of other shapes interleaved (the model's embedding, layer
// and step boundaries; consecutive decode-shape calls, each launched with PDL behind the one
// before), captured once and replayed three times with fresh inputs (weights included).
int CheckFusedGraph(NcclCommunicator& comm, cudaStream_t stream, int rank, int world) {
  struct Call {
    int64_t rows, hidden;
    bool fused, add;
  };
  const std::vector<Call> calls = {{1, 4096, true, false}, {1, 4096, false, false},
                                   {24, 8192, true, true}, {64, 8192, false, false},
                                   {7, 4096, true, true},  {1, 8192, true, true},
                                   {3, 4096, true, true},  {13, 8192, true, true},
                                   {1, 4096, true, true},  {1, 4096, true, true}};
  std::vector<FusedCase> cases;
  Rows d;
  std::vector<AddRmsNormArgs> args;
  for (size_t k = 0; k < calls.size(); ++k) {
    cases.emplace_back(world, calls[k].rows, calls[k].hidden, 70 + static_cast<int>(k));
    args.push_back(Place(d, cases[k], rank, calls[k].rows, calls[k].hidden, calls[k].add));
  }
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  absl::Status s;
  for (size_t k = 0; k < calls.size() && s.ok(); ++k) {
    if (!calls[k].fused) {
      s = comm.AllReduceSum(args[k].residual, calls[k].rows * calls[k].hidden, CommDtype::kBf16,
                            stream);
      continue;
    }
    absl::StatusOr<bool> done = comm.AllReduceAddRmsNorm(args[k], CommDtype::kBf16, stream);
    s = !done.ok() ? done.status() : (*done ? absl::OkStatus() : absl::InternalError("unfused"));
  }
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !s.ok()) {
    return Fail(rank, absl::StrCat("fused capture: ", s.ToString()));
  }
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return Fail(rank, "instantiate");
  int failures = 0;
  for (int replay = 0; replay < 3 && failures == 0; ++replay) {
    for (size_t k = 0; k < calls.size(); ++k) {
      cases[k] = FusedCase(world, calls[k].rows, calls[k].hidden, 90 + replay * 10 + k);
      const int64_t bytes = calls[k].rows * calls[k].hidden * 2;
      void* in = calls[k].add ? args[k].out : args[k].residual;
      cudaMemcpy(in, cases[k].inputs[rank].data(), bytes, cudaMemcpyHostToDevice);
      if (calls[k].add) {
        cudaMemcpy(args[k].residual, cases[k].residual.data(), bytes, cudaMemcpyHostToDevice);
      }
      if (calls[k].fused) {  // the replay's weights too (the reference uses them)
        cudaMemcpy(const_cast<void*>(args[k].weight), cases[k].weight.data(), calls[k].hidden * 2,
                   cudaMemcpyHostToDevice);
      }
    }
    cudaGraphLaunch(exec, stream);
    if (absl::Status sync = comm.Synchronize(stream); !sync.ok()) {
      return Fail(rank, absl::StrCat("fused replay ", replay, ": ", sync.ToString()));
    }
    for (size_t k = 0; k < calls.size(); ++k) {
      const int64_t n = calls[k].rows * calls[k].hidden;
      const std::string what = absl::StrCat("fused graph replay ", replay, " call ", k);
      if (!calls[k].fused) {
        if (Rows::Get(args[k].residual, n) != AllReduceReferenceBf16(cases[k].inputs)) {
          failures += Fail(rank, what);
        }
        continue;
      }
      const AddRmsNormBf16 want =
          AllReduceAddRmsNormReferenceBf16(cases[k].inputs, cases[k].residual, cases[k].weight,
                                           calls[k].hidden, 1e-5f, calls[k].add);
      const auto out = Rows::Get(args[k].out, n);
      int64_t far = 0;
      for (int64_t i = 0; i < n; ++i) far += Ulps(out[i], want.out[i]) > 2;
      const bool residual_ok = Rows::Get(args[k].residual, n) == want.residual;
      if (!residual_ok || far > 0) {
        failures += Fail(rank, absl::StrCat(what, ": residual ", residual_ok ? "equal" : "differs",
                                            ", ", far, " outputs far"));
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
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
  // The fused all-reduce + add + RMSNorm at the real models' widths (8B: 4096, 70B: 8192), for
  // decode and small prefill row counts (world 4: one-shot sizes only).
  for (int64_t hidden : {4096, 8192}) {
    // Every blocks-per-row regime of PlanAllReduceNorm (8: 1-4 rows, 4: 5-9, 2: 10-18, 1),
    // odd row counts, more rows than blocks.
    for (int64_t rows : {1, 3, 4, 5, 8, 9, 13, 19, 31, 37, 64}) {
      if (world == 4 && rows * hidden * 2 >= (512 << 10)) continue;
      for (bool add : {true, false}) {
        failures += CheckFused(**comm, **nccl, stream, rank, world, rows, hidden, add, ++salt);
      }
    }
  }
  failures += CheckFusedGraph(**comm, stream, rank, world);
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
