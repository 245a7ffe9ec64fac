// mla_test_util.h's page layout (what the GPU tests and benchmarks build their pools from).
#include "kernels/mla/mla_test_util.h"

#include <set>

#include "gtest/gtest.h"

namespace tandem::kernels::mla_test {
namespace {

TEST(MlaTestUtilTest, ShuffledPagesHoldEveryLatentOnce) {
  std::mt19937 rng(3);
  const std::vector<int32_t> lens = {1, 77, 0, 16, 33};
  for (int64_t bs : {1, 5, 16}) {
    const ShuffledPages p = ShufflePages(lens, bs, rng);
    EXPECT_EQ(p.max_len, 77);
    EXPECT_EQ(p.max_blocks, (77 + bs - 1) / bs);
    EXPECT_EQ(p.num_blocks, 5 * p.max_blocks + 2);
    ASSERT_EQ(p.tables.size(), static_cast<size_t>(5 * p.max_blocks));
    ASSERT_EQ(p.slots.size(), 127u);
    std::set<int64_t> slots(p.slots.begin(), p.slots.end()), blocks;
    EXPECT_EQ(slots.size(), p.slots.size());  // no slot twice
    int64_t k = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int32_t j = 0; j < lens[s]; ++j, ++k) {
        const int64_t block = p.tables[s * p.max_blocks + j / bs];
        EXPECT_EQ(p.slots[k], block * bs + j % bs);
        EXPECT_LT(block, p.num_blocks);
        if (j % bs == 0) {
          EXPECT_TRUE(blocks.insert(block).second);  // a page for one request
        }
      }
    }
  }
}

TEST(MlaTestUtilTest, ParsesIntegerLists) {
  EXPECT_EQ(ParseInt64List("1,16,x,4096", {}), (std::vector<int64_t>{1, 16, 4096}));
  EXPECT_EQ(ParseInt64List(nullptr, {7}), (std::vector<int64_t>{7}));
}

}  // namespace
}  // namespace tandem::kernels::mla_test
