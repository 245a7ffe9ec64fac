// GPU smoke test: the reduction against an fp64 CPU reference on fresh random data.
// Skipped (not failed) without a GPU; fails under TANDEM_REQUIRE_GPU=1 when none is usable.
#include "tests/gpu/reduce_sum.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "common/cuda_status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"

namespace tandem::gpu_smoke {
namespace {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, CudaFree>;

DeviceBuffer Alloc(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes == 0 ? 1 : bytes), cudaSuccess);
  return DeviceBuffer(p);
}

class ReduceSumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_SKIP_WITHOUT_GPU();
    std::random_device rd;
    seed_ = rd();
    RecordProperty("seed", std::to_string(seed_));
  }
  uint32_t seed_ = 0;
};

// Sums host[offset, offset + n) on the GPU; returns {gpu, fp64 cpu, sum |x|}.
struct Result {
  double gpu, cpu, abs_sum;
};
Result RunOnce(const std::vector<float>& host, int64_t offset, int64_t n) {
  DeviceBuffer in = Alloc(host.size() * sizeof(float));
  DeviceBuffer out = Alloc(sizeof(double));
  DeviceBuffer ws = Alloc(ReduceSumWorkspaceBytes());
  EXPECT_EQ(cudaMemcpy(in.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  const float* d_in = static_cast<const float*>(in.get()) + offset;
  absl::Status s = ReduceSumF32(d_in, n, static_cast<double*>(out.get()), ws.get(), nullptr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Result r{0, 0, 0};
  EXPECT_EQ(cudaMemcpy(&r.gpu, out.get(), sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = offset; i < offset + n; ++i) {
    r.cpu += host[i];
    r.abs_sum += std::fabs(host[i]);
  }
  return r;
}

TEST_F(ReduceSumTest, MatchesFp64CpuReference) {
  std::mt19937 rng(seed_);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{(1 << 20) + 7},
                    int64_t{1} << 24, int64_t{(1 << 26) + 5}}) {
    std::vector<float> host(n + 1);
    for (float& x : host) x = dist(rng);
    for (int64_t offset : {int64_t{0}, int64_t{1}}) {  // offset 1 forces the unaligned path
      if (offset + n > static_cast<int64_t>(host.size())) continue;
      Result r = RunOnce(host, offset, n);
      // fp32 partials of <= ~64 terms each, combined in fp64: error well under 1e-6 of sum|x|.
      EXPECT_NEAR(r.gpu, r.cpu, 1e-6 * r.abs_sum + 1e-9)
          << "n=" << n << " offset=" << offset << " seed=" << seed_;
    }
  }
}

TEST_F(ReduceSumTest, RejectsBadArguments) {
  DeviceBuffer out = Alloc(sizeof(double));
  DeviceBuffer ws = Alloc(ReduceSumWorkspaceBytes());
  EXPECT_EQ(ReduceSumF32(nullptr, -1, static_cast<double*>(out.get()), ws.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReduceSumF32(nullptr, 10, static_cast<double*>(out.get()), ws.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::gpu_smoke
