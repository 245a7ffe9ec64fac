#include "router/core/request_table.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

// A registered call that records whether it was cancelled.
class RecordingCall final : public WorkerCall {
 public:
  void Cancel() override { cancelled = true; }
  std::atomic<bool> cancelled{false};
};

TEST(RequestTableTest, AdmissionLimitAndIds) {
  RequestTable table(2);
  absl::StatusOr<Admission> a = table.Admit("mine");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->request().id(), "mine");
  EXPECT_EQ(table.Admit("mine").status().code(), absl::StatusCode::kAlreadyExists);
  {
    absl::StatusOr<Admission> b = table.Admit("");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->request().id().rfind("rtr-", 0), 0u) << b->request().id();
    EXPECT_EQ(table.size(), 2u);
    absl::StatusOr<Admission> c = table.Admit("");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(table.size(), 1u);  // b released its slot
  EXPECT_TRUE(table.Admit("").ok());
}

TEST(RequestTableTest, GeneratedIdsAreUnique) {
  RequestTable table(100000);
  absl::flat_hash_set<std::string> ids;
  std::vector<Admission> held;
  for (int i = 0; i < 10000; ++i) {
    absl::StatusOr<Admission> a = table.Admit("");
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(ids.insert(a->request().id()).second);
    held.push_back(*std::move(a));
  }
}

TEST(RequestTableTest, CancelInterruptsRegisteredCallsAndRefusesNewOnes) {
  RequestTable table(4);
  absl::StatusOr<Admission> a = table.Admit("a");
  absl::StatusOr<Admission> b = table.Admit("b");
  RecordingCall ctx_a, ctx_b;
  ASSERT_TRUE(a->request().AddCall("w1", &ctx_a));
  ASSERT_TRUE(b->request().AddCall("w2", &ctx_b));
  EXPECT_EQ(table.CancelUsingWorker("w1", absl::UnavailableError("w1 lost")), 1);
  EXPECT_EQ(a->request().cancel_reason().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(b->request().cancel_reason().ok());
  EXPECT_TRUE(ctx_a.cancelled);  // the open call was interrupted
  EXPECT_FALSE(ctx_b.cancelled);
  // The first reason wins; a cancelled request starts no new call.
  EXPECT_TRUE(table.Cancel("a", absl::AbortedError("abort")));
  EXPECT_EQ(a->request().cancel_reason().code(), absl::StatusCode::kUnavailable);
  RecordingCall ctx_a2;
  EXPECT_FALSE(a->request().AddCall("w3", &ctx_a2));
  EXPECT_FALSE(table.Cancel("zzz", absl::AbortedError("abort")));
  b->request().RemoveCall(&ctx_b);
  EXPECT_EQ(table.CancelUsingWorker("w2", absl::UnavailableError("w2 lost")), 0);
  table.CancelAll(absl::UnavailableError("shutdown"));
  EXPECT_EQ(b->request().cancel_reason().code(), absl::StatusCode::kUnavailable);
}

TEST(RequestTableTest, ConcurrentAdmitAndRelease) {
  RequestTable table(8);
  std::vector<std::thread> threads;
  std::atomic<int> admitted{0}, refused{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<Admission> a = table.Admit("");
        if (a.ok()) {
          ++admitted;
          table.CancelUsingWorker("none", absl::UnavailableError("x"));
        } else {
          EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
          ++refused;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted + refused, 16000);
  EXPECT_EQ(table.size(), 0u);
}

TEST(RequestTableTest, IdsAndAbortsAreScopedToTheirOwner) {
  RequestTable table(8);
  absl::StatusOr<Admission> alice = table.Admit("job-1", "alice");
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->request().id(), "job-1");  // first user of the id: kept on the workers too
  EXPECT_EQ(alice->request().client_id(), "job-1");
  // Bob may use the same id; on the workers his request gets another one.
  absl::StatusOr<Admission> bob = table.Admit("job-1", "bob");
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->request().client_id(), "job-1");
  EXPECT_NE(bob->request().id(), "job-1");
  EXPECT_EQ(table.Admit("job-1", "alice").status().code(), absl::StatusCode::kAlreadyExists);
  // Mallory cannot abort either; Bob aborts only his own.
  EXPECT_FALSE(table.Cancel("job-1", absl::AbortedError("x"), "mallory"));
  EXPECT_FALSE(table.Cancel("job-1", absl::AbortedError("x")));
  EXPECT_TRUE(table.Cancel("job-1", absl::AbortedError("x"), "bob"));
  EXPECT_FALSE(bob->request().cancel_reason().ok());
  EXPECT_TRUE(alice->request().cancel_reason().ok());
  // An anonymous request cannot take a worker id in use either.
  absl::StatusOr<Admission> anon = table.Admit(bob->request().id());
  ASSERT_TRUE(anon.ok());
  EXPECT_NE(anon->request().id(), bob->request().id());
  EXPECT_EQ(table.size(), 3u);
}

}  // namespace
}  // namespace tandem::router
