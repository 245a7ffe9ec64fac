// L2Prefetch: argument refusals (no GPU needed), unaligned and multi-chunk ranges run and write
// nothing, and the PDL contract in a captured graph: writer A (lets its dependents launch at
// once, writes ~100 us later) -> L2Prefetch (PDL) -> reader B (PDL, reads A's output after its
// wait) sees A's writes on every replay. A control with a PDL kernel that skips its wait in the
// prefetch's place shows B would then read stale data.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/l2_prefetch.h"
#include "kernels/cuda/l2_prefetch_test_kernels.h"
#include "kernels/cuda/pdl_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::TestSeed;

TEST(L2PrefetchTest, RefusesBadArguments) {
  int dummy = 0;
  const L2PrefetchRange one[1] = {{&dummy, 4}};
  const L2PrefetchRange five[5] = {};
  EXPECT_EQ(L2Prefetch(five, 5, nullptr, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(L2Prefetch(one, -1, nullptr, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(L2Prefetch(nullptr, 1, nullptr, true).code(), absl::StatusCode::kInvalidArgument);
  const L2PrefetchRange null_ptr[2] = {{nullptr, 0}, {nullptr, 16}};
  EXPECT_EQ(L2Prefetch(null_ptr, 2, nullptr, true).code(), absl::StatusCode::kInvalidArgument);
  const L2PrefetchRange negative[1] = {{&dummy, -1}};
  EXPECT_EQ(L2Prefetch(negative, 1, nullptr, false).code(), absl::StatusCode::kInvalidArgument);
}

// Nothing to prefetch: OK without a launch (so without a GPU too: a launch would fail there).
TEST(L2PrefetchTest, LaunchesNothingForZeroBytes) {
  const L2PrefetchRange empty[2] = {{nullptr, 0}, {reinterpret_cast<const void*>(16), 0}};
  EXPECT_TRUE(L2Prefetch(empty, 2, nullptr, true).ok());
  EXPECT_TRUE(L2Prefetch(nullptr, 0, nullptr, true).ok());
  EXPECT_TRUE(L2Prefetch(empty, 0, nullptr, false).ok());
}

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kWeightBytes = 48 * kMiB;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t r = rng();
    std::memcpy(out.data() + i, &r, std::min<size_t>(4, n - i));
  }
  return out;
}

// Unaligned heads and tails, a range without an aligned 16 bytes, and more chunks than the
// grid's threads (the strided loop): each call runs (no fault) and leaves the bytes as they were.
std::vector<L2PrefetchRange> TestRanges(const uint8_t* w) {
  return {{w + 3, 5 * kMiB + 7},
          {w + 8 * kMiB, 30 * kMiB},
          {w + 40 * kMiB + 1, 9},
          {w + 41 * kMiB + 5, 20}};
}

TEST(L2PrefetchTest, UnalignedAndLargeRangesRunAndWriteNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<uint8_t> host = RandomBytes(kWeightBytes, TestSeed());
  DeviceBuffer<uint8_t> w(host);
  ASSERT_NE(w.get(), nullptr);
  const std::vector<L2PrefetchRange> ranges = TestRanges(w.get());
  for (const bool pdl : {false, true}) {
    for (const bool after_wait : {false, true}) {
      ASSERT_TRUE(L2Prefetch(ranges.data(), 4, nullptr, pdl, after_wait).ok());
      for (int n = 1; n <= 3; ++n) {  // single ranges: just the tiny ones too
        ASSERT_TRUE(L2Prefetch(ranges.data() + 4 - n, n, nullptr, pdl, after_wait).ok());
      }
    }
  }
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(w.ToHost() == host);
}

// One captured graph: writer A (copies src -> dst ~spin cycles after letting its dependents
// launch), `middle` (PDL), reader B (PDL: out = dst after its wait). Replayed `replays` times
// with fresh random src and a zeroed dst; returns how many replays B's out differed from src.
int StaleReplays(const std::function<void(cudaStream_t)>& middle, int replays, uint32_t seed) {
  constexpr size_t kBytes = 64 << 10;
  constexpr long long kSpin = 200000;  // ~100 us
  DeviceBuffer<uint8_t> src(kBytes), dst(kBytes), out(kBytes);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(pdl_test::LaunchDelayedWriter({dst.get(), src.get(), kBytes}, {}, kSpin, stream),
            cudaSuccess);
  middle(stream);
  EXPECT_EQ(l2_prefetch_test::LaunchPdlCopyAfterWait(out.get(), dst.get(), kBytes, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  int stale = 0;
  for (int r = 0; r < replays && exec != nullptr; ++r) {
    const std::vector<uint8_t> want = RandomBytes(kBytes, seed + static_cast<uint32_t>(r));
    std::vector<uint8_t> got(kBytes);
    EXPECT_EQ(cudaMemcpyAsync(src.get(), want.data(), kBytes, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(dst.get(), 0, kBytes, stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(out.get(), 0, kBytes, stream), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(got.data(), out.get(), kBytes, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    stale += got != want ? 1 : 0;
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return stale;
}

TEST(L2PrefetchTest, PdlReaderAfterThePrefetchSeesTheWritersOutputEveryReplay) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = TestSeed();
  const std::vector<uint8_t> host = RandomBytes(kWeightBytes, seed ^ 0x5eed);
  DeviceBuffer<uint8_t> w(host);
  ASSERT_NE(w.get(), nullptr);
  const std::vector<L2PrefetchRange> ranges = TestRanges(w.get());
  for (const bool pdl : {true, false}) {
    for (const bool after_wait : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "pdl " << pdl << " after_wait " << after_wait);
      const auto prefetch = [&](cudaStream_t s) {
        EXPECT_TRUE(L2Prefetch(ranges.data(), 4, s, pdl, after_wait).ok());
      };
      EXPECT_EQ(StaleReplays(prefetch, 100, seed), 0);
    }
  }
  EXPECT_TRUE(w.ToHost() == host);
  // The control: a PDL kernel that lets B launch and exits without waiting for A.
  const auto no_wait = [](cudaStream_t s) {
    EXPECT_EQ(l2_prefetch_test::LaunchPdlNoWait(s), cudaSuccess);
  };
  const int control = StaleReplays(no_wait, 20, seed);
  EXPECT_GT(control, 0) << "the reader never saw stale data behind a kernel that skips its wait: "
                           "this test cannot tell a correct prefetch from a broken one";
}

}  // namespace
}  // namespace tandem::kernels::cuda
