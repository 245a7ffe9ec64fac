#include "router/core/prefix_index.h"

#include <deque>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

// Reference: a plain FIFO over a std::deque with linear searches.
class ReferenceIndex {
 public:
  explicit ReferenceIndex(size_t cap) : cap_(cap) {}
  void Add(uint64_t h) {
    Remove(h);
    order_.push_back(h);
    if (order_.size() > cap_) order_.pop_front();
  }
  void Remove(uint64_t h) {
    for (auto it = order_.begin(); it != order_.end(); ++it) {
      if (*it == h) {
        order_.erase(it);
        return;
      }
    }
  }
  bool Contains(uint64_t h) const {
    for (uint64_t x : order_) {
      if (x == h) return true;
    }
    return false;
  }
  size_t size() const { return order_.size(); }

 private:
  size_t cap_;
  std::deque<uint64_t> order_;
};

TEST(PrefixIndexTest, MatchesLeadingHashesOnly) {
  PrefixIndex index(100);
  index.Add(std::vector<uint64_t>{11, 12, 14});
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{11, 12, 13, 14}), 2u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{12, 11}), 2u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{13, 11}), 0u);
  EXPECT_EQ(index.MatchPrefix({}), 0u);
  index.Remove(std::vector<uint64_t>{12, 99});
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{11, 12}), 1u);
  index.Clear();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{11}), 0u);
}

TEST(PrefixIndexTest, EvictsTheOldestBeyondTheCap) {
  PrefixIndex index(3);
  index.Add(std::vector<uint64_t>{1, 2, 3});
  index.Add(std::vector<uint64_t>{1});  // refreshes 1: 2 is now the oldest
  index.Add(std::vector<uint64_t>{4});
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{2}), 0u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{1}), 1u);
  EXPECT_EQ(index.MatchPrefix(std::vector<uint64_t>{3, 4}), 2u);
}

TEST(PrefixIndexTest, RandomOperationsAgreeWithAReference) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (size_t cap : {1u, 7u, 64u}) {
    PrefixIndex index(cap);
    ReferenceIndex ref(cap);
    for (int step = 0; step < 5000; ++step) {
      std::vector<uint64_t> batch(1 + rng() % 8);
      for (uint64_t& h : batch) h = 1 + rng() % 100;  // small universe: many repeats
      if (rng() % 3 == 0) {
        index.Remove(batch);
        for (uint64_t h : batch) ref.Remove(h);
      } else {
        index.Add(batch);
        for (uint64_t h : batch) ref.Add(h);
      }
      ASSERT_EQ(index.size(), ref.size()) << "step " << step;
      const uint64_t probe = 1 + rng() % 100;
      ASSERT_EQ(index.MatchPrefix(std::vector<uint64_t>{probe}) == 1, ref.Contains(probe))
          << "step " << step << " probe " << probe;
    }
  }
}

}  // namespace
}  // namespace tandem::router
