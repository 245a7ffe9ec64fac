#include "kvtransfer/transfer_table.h"

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

struct FakeTransfer {
  TransferId id = 0;
  bool ended = false;
  absl::Status result;
};

TEST(TransferTableTest, EveryTransferEndsOnceAndIsReportedOnce) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  TransferTable<FakeTransfer> table;
  TransferAgentStats stats;
  std::vector<TransferId> ids;
  for (int i = 0; i < 50; ++i) {
    FakeTransfer* t = table.Add(std::make_unique<FakeTransfer>());
    if (!ids.empty()) {
      EXPECT_GT(t->id, ids.back());
    }
    ids.push_back(t->id);
  }
  uint64_t ok = 0, failed = 0;
  for (TransferId id : ids) {
    EXPECT_EQ(table.Check(id).value(), false) << "running";
    FakeTransfer* t = table.Find(id);
    ASSERT_NE(t, nullptr);
    const bool succeed = rng() % 2 == 0;
    absl::Status result = succeed ? absl::OkStatus() : absl::UnavailableError("peer died");
    EXPECT_TRUE(table.End(*t, result, 100, &stats));
    // A second end (a late cancel, a race with the progress thread) changes nothing.
    EXPECT_FALSE(table.End(*t, absl::CancelledError("late"), 7, &stats));
    (succeed ? ok : failed)++;
    absl::StatusOr<bool> checked = table.Check(id);
    if (succeed) {
      EXPECT_EQ(checked.value(), true);
    } else {
      EXPECT_EQ(checked.status().code(), absl::StatusCode::kUnavailable);
    }
    EXPECT_EQ(table.Check(id).status().code(), absl::StatusCode::kNotFound) << "reported once";
    EXPECT_EQ(table.Find(id), nullptr);
  }
  EXPECT_EQ(stats.transfers_completed, ok);
  EXPECT_EQ(stats.transfers_failed, failed);
  EXPECT_EQ(stats.bytes_read, ok * 100);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.Check(12345).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::kvtransfer
