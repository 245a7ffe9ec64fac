#include "kernels/threading/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

TEST(ThreadPoolTest, CoversRangeExactlyOnce) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int trial = 0; trial < 50; ++trial) {
      const int64_t n = rng() % 1000;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, GrainAlignsChunks) {
  ThreadPool pool(4);
  std::atomic<int> misaligned{0};
  std::atomic<int64_t> total{0};
  pool.ParallelForGrain(1003, 16, [&](int64_t b, int64_t e) {
    if (b % 16 != 0) misaligned.fetch_add(1);
    total.fetch_add(e - b);
  });
  EXPECT_EQ(misaligned.load(), 0);
  EXPECT_EQ(total.load(), 1003);
}

TEST(ThreadPoolTest, NestedCallsRunInlineAndSumsMatch) {
  ThreadPool pool(3);
  std::vector<int64_t> data(10000);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  int64_t expected = 0;
  for (auto& x : data) expected += (x = rng() % 100);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(4, [&](int64_t b, int64_t e) {
    for (int64_t part = b; part < e; ++part) {
      pool.ParallelFor(2500, [&](int64_t ib, int64_t ie) {
        int64_t local = 0;
        for (int64_t i = ib; i < ie; ++i) local += data[part * 2500 + i];
        sum.fetch_add(local);
      });
    }
  });
  EXPECT_EQ(sum.load(), expected);
}

TEST(ThreadPoolTest, ManySmallJobs) {
  ThreadPool pool(4);
  int64_t acc = 0;
  for (int job = 0; job < 2000; ++job) {
    std::atomic<int64_t> s{0};
    pool.ParallelFor(7, [&](int64_t b, int64_t e) { s.fetch_add(e - b); });
    acc += s.load();
  }
  EXPECT_EQ(acc, 2000 * 7);
}

}  // namespace
}  // namespace tandem::kernels
