// Executor and Strand: tasks run on the pool, a strand's tasks one at a time and in order even
// when posted from many threads, Dispatch runs inline only on an idle strand, timers run at (not
// before) their time and in time order, and the destructor runs what was queued.
#include "router/core/executor.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

TEST(ExecutorTest, RunsPostedTasksOnItsThreads) {
  Executor executor(3);
  EXPECT_EQ(executor.threads(), 3);
  absl::Mutex mu;
  int done = 0;
  for (int i = 0; i < 100; ++i) {
    executor.Post([&] {
      absl::MutexLock lock(&mu);
      ++done;
    });
  }
  absl::MutexLock lock(&mu);
  auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == 100; };
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(10)));
}

TEST(ExecutorTest, StrandRunsItsTasksOneAtATimeInOrder) {
  Executor executor(4);
  auto strand = std::make_shared<Strand>(&executor);
  std::atomic<int> inside{0};
  std::atomic<bool> overlap{false};
  std::vector<int> order;  // touched only by the strand's tasks
  absl::Notification done;
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::thread> posters;
  std::atomic<int> remaining{kThreads * kEach};
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        strand->Post([&, t, i] {
          if (inside.fetch_add(1) != 0) overlap = true;
          if (t == 0) order.push_back(i);
          inside.fetch_sub(1);
          if (remaining.fetch_sub(1) == 1) done.Notify();
        });
      }
    });
  }
  for (std::thread& t : posters) t.join();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(overlap) << "two tasks of one strand ran at once";
  ASSERT_EQ(order.size(), static_cast<size_t>(kEach));
  for (int i = 0; i < kEach; ++i) EXPECT_EQ(order[i], i) << "one poster's tasks out of order";
}

TEST(ExecutorTest, DispatchRunsInlineOnlyWhenTheStrandIsIdle) {
  Executor executor(2);
  auto strand = std::make_shared<Strand>(&executor);
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ran_on;
  strand->Dispatch([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, me) << "an idle strand runs the task at once, here";
  // Busy (a task holds it): a dispatched task waits its turn, in order, on the executor.
  absl::Notification release, done;
  std::vector<int> order;
  strand->Post([&] {
    release.WaitForNotification();
    order.push_back(1);
  });
  strand->Dispatch([&] {
    order.push_back(2);
    ran_on = std::this_thread::get_id();
    done.Notify();
  });
  release.Notify();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, me);
  // A task dispatched from inside the strand's own task is queued, not nested.
  absl::Notification nested;
  int depth = 0;
  strand->Dispatch([&] {
    ++depth;
    strand->Dispatch([&] {
      EXPECT_EQ(depth, 0) << "nested inside the running task";
      nested.Notify();
    });
    --depth;
  });
  EXPECT_TRUE(nested.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(ExecutorTest, TimersRunAtTheirTimeInTimeOrder) {
  Executor executor(2);
  auto strand = std::make_shared<Strand>(&executor);
  const absl::Time start = absl::Now();
  std::vector<int> order;
  std::vector<absl::Duration> at;
  absl::Notification done;
  for (int ms : {60, 20, 40}) {
    strand->PostAt(start + absl::Milliseconds(ms), [&, ms] {
      order.push_back(ms);
      at.push_back(absl::Now() - start);
      if (ms == 60) done.Notify();
    });
  }
  strand->Post([&] { order.push_back(0); });  // not held back by the timers
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{0, 20, 40, 60}));
  EXPECT_GE(at[0], absl::Milliseconds(20));
  EXPECT_GE(at[2], absl::Milliseconds(60));
}

TEST(ExecutorTest, DestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    Executor executor(1);
    absl::Notification release;
    executor.Post([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) executor.Post([&] { ++ran; });
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace tandem::router
