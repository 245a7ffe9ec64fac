#include "common/http/body_budget.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

namespace tandem::http {
namespace {

TEST(BodyBudgetTest, ReservesUpToTheLimitAndNoFurther) {
  BodyBudget budget(100);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_FALSE(budget.TryReserve(41));
  EXPECT_TRUE(budget.TryReserve(40));
  EXPECT_EQ(budget.reserved(), 100u);
  EXPECT_TRUE(budget.TryReserve(0));
  EXPECT_FALSE(budget.TryReserve(1));
  budget.Release(60);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_FALSE(budget.TryReserve(UINT64_MAX));  // no wrap past the limit
}

TEST(BodyBudgetTest, AReservationGivesItsBytesBack) {
  BodyBudget budget(100);
  {
    BodyReservation a(&budget), b(&budget);
    EXPECT_TRUE(a.Reserve(70));
    EXPECT_FALSE(b.Reserve(31));
    EXPECT_EQ(b.bytes(), 0u);
    EXPECT_TRUE(a.Reserve(10));  // replaces its 70
    EXPECT_TRUE(b.Reserve(90));
    EXPECT_EQ(budget.reserved(), 100u);
    a.Release();
    EXPECT_EQ(budget.reserved(), 90u);
  }
  EXPECT_EQ(budget.reserved(), 0u);
}

// Threads reserving and releasing random sizes never see more than the limit taken, and leave
// nothing behind.
TEST(BodyBudgetTest, ConcurrentReservationsStayUnderTheLimit) {
  constexpr uint64_t kLimit = 1000;
  BodyBudget budget(kLimit);
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      BodyReservation r(&budget);
      for (int i = 0; i < 20000; ++i) {
        if (r.Reserve(rng() % 400) && budget.reserved() > kLimit) over = true;
        if (rng() % 2) r.Release();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(budget.reserved(), 0u);
}

}  // namespace
}  // namespace tandem::http
