#include "runtime/kv_cache/free_block_queue.h"

#include <algorithm>
#include <list>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::runtime {
namespace {

std::vector<BlockId> Iota(BlockId n) {
  std::vector<BlockId> ids(n);
  for (BlockId i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

TEST(FreeBlockQueueTest, StartsWithAllBlocksInIdOrder) {
  FreeBlockQueue queue(5);
  EXPECT_EQ(queue.size(), 5);
  EXPECT_EQ(queue.ToVector(), Iota(5));
  EXPECT_EQ(queue.Front(), 0);
  for (BlockId id = 0; id < 5; ++id) EXPECT_TRUE(queue.Contains(id));
  EXPECT_TRUE(queue.CheckInvariants().ok());
}

TEST(FreeBlockQueueTest, EmptyQueue) {
  FreeBlockQueue queue(0);
  EXPECT_TRUE(queue.empty());
  EXPECT_TRUE(queue.ToVector().empty());
  EXPECT_TRUE(queue.CheckInvariants().ok());
}

TEST(FreeBlockQueueTest, PopRemovePush) {
  FreeBlockQueue queue(4);
  EXPECT_EQ(queue.PopFront(), 0);
  EXPECT_FALSE(queue.Contains(0));
  queue.Remove(2);  // middle
  EXPECT_EQ(queue.ToVector(), (std::vector<BlockId>{1, 3}));
  queue.Remove(3);  // tail
  queue.Remove(1);  // head, now empty
  EXPECT_TRUE(queue.empty());
  EXPECT_TRUE(queue.CheckInvariants().ok());
  queue.PushBack(2);
  queue.PushBack(0);
  queue.PushBack(3);
  EXPECT_EQ(queue.ToVector(), (std::vector<BlockId>{2, 0, 3}));
  EXPECT_EQ(queue.Front(), 2);
  EXPECT_EQ(queue.size(), 3);
  EXPECT_TRUE(queue.CheckInvariants().ok());
}

// Random operations against std::list as the reference.
TEST(FreeBlockQueueTest, MatchesReferenceListUnderRandomOps) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr BlockId kNumBlocks = 64;
  FreeBlockQueue queue(kNumBlocks);
  std::vector<BlockId> ids = Iota(kNumBlocks);
  std::list<BlockId> reference(ids.begin(), ids.end());
  std::vector<BlockId> outside;
  for (int step = 0; step < 20000; ++step) {
    const int op = rng() % 3;
    if (op == 0 && !reference.empty()) {
      ASSERT_EQ(queue.PopFront(), reference.front());
      outside.push_back(reference.front());
      reference.pop_front();
    } else if (op == 1 && !reference.empty()) {
      auto it = reference.begin();
      std::advance(it, rng() % reference.size());
      queue.Remove(*it);
      outside.push_back(*it);
      reference.erase(it);
    } else if (!outside.empty()) {
      const size_t pick = rng() % outside.size();
      const BlockId id = outside[pick];
      outside[pick] = outside.back();
      outside.pop_back();
      ASSERT_FALSE(queue.Contains(id));
      queue.PushBack(id);
      reference.push_back(id);
    }
    ASSERT_EQ(queue.size(), static_cast<int64_t>(reference.size())) << "step " << step;
    if (step % 97 == 0) {
      ASSERT_TRUE(queue.CheckInvariants().ok()) << queue.CheckInvariants();
      ASSERT_EQ(queue.ToVector(), std::vector<BlockId>(reference.begin(), reference.end()));
    }
  }
  ASSERT_TRUE(queue.CheckInvariants().ok());
  ASSERT_EQ(queue.ToVector(), std::vector<BlockId>(reference.begin(), reference.end()));
}

}  // namespace
}  // namespace tandem::runtime
