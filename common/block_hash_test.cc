#include "common/block_hash.h"

#include <openssl/sha.h>

#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Fresh random inputs per run; the seed is printed with every failure (SCOPED_TRACE).
class BlockHashTest : public ::testing::Test {
 protected:
  BlockHashTest() : seed_(std::random_device{}()), rng_(seed_) {
    std::printf("seed %u\n", seed_);  // every test's log
  }

  std::vector<int32_t> RandomTokens(size_t n) {
    // Full int32 range, negatives included: the encoding must not care.
    std::uniform_int_distribution<int32_t> dist(std::numeric_limits<int32_t>::min(),
                                                std::numeric_limits<int32_t>::max());
    std::vector<int32_t> tokens(n);
    for (int32_t& token : tokens) token = dist(rng_);
    return tokens;
  }

  const uint32_t seed_;
  std::mt19937 rng_;
};

// Independent reference: builds the documented byte string by hand and hashes it with OpenSSL's
// one-shot SHA256() (a different code path from the EVP streaming used by the library).
std::vector<BlockHash> ReferenceHashes(const std::vector<int32_t>& tokens, int64_t block_size,
                                       const std::string& salt) {
  std::vector<BlockHash> hashes;
  for (size_t block = 0; block + 1 <= tokens.size() / block_size; ++block) {
    std::string bytes;
    if (block == 0) {
      bytes = "tandem-kvhash-v1";
      for (int i = 0; i < 8; ++i)
        bytes.push_back(static_cast<char>(uint64_t{salt.size()} >> (8 * i)));
      bytes += salt;
    } else {
      bytes.assign(hashes.back().bytes.begin(), hashes.back().bytes.end());
    }
    for (int64_t j = 0; j < block_size; ++j) {
      const uint32_t bits = static_cast<uint32_t>(tokens[block * block_size + j]);
      for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(bits >> (8 * i)));
    }
    BlockHash hash;
    SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), hash.bytes.data());
    hashes.push_back(hash);
  }
  return hashes;
}

TEST_F(BlockHashTest, GoldenVectors) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, -1};
  const std::vector<BlockHash> plain = ComputeBlockHashes(tokens, 4, "");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].ToHex(), "950fe33ef5adca6ddb00a7ed9ea70ed56a2e739b9fc5cf5ec5e3439e3da4df08");
  EXPECT_EQ(plain[1].ToHex(), "0b04f9f7546b7923151553854ab26d1680b761bc2411b447c473c478eb260fda");
  const std::vector<BlockHash> salted = ComputeBlockHashes(tokens, 4, "tenant-a");
  ASSERT_EQ(salted.size(), 2u);
  EXPECT_EQ(salted[0].ToHex(), "4f4c38a5208450688c3913ead289251f4642fd3f1df4a7fac35038fe9e3d2c42");
  // Short() = first 8 bytes little-endian: 95 0f e3 3e f5 ad ca 6d.
  EXPECT_EQ(plain[0].Short(), 0x6dcaadf53ee30f95ull);
}

TEST_F(BlockHashTest, MatchesReferenceEncoding) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  for (const int64_t block_size : {1, 3, 16, 64}) {
    const std::vector<int32_t> tokens =
        RandomTokens(5 * block_size + (block_size - 1));  // partial tail
    for (const std::string& salt : {std::string(), std::string("tenant"), std::string("a\0b", 3)}) {
      const std::vector<BlockHash> got = ComputeBlockHashes(tokens, block_size, salt);
      const std::vector<BlockHash> want = ReferenceHashes(tokens, block_size, salt);
      ASSERT_EQ(got.size(), 5u);
      EXPECT_EQ(got, want) << "block_size " << block_size << " salt size " << salt.size();
    }
  }
}

TEST_F(BlockHashTest, Deterministic) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const std::vector<int32_t> tokens = RandomTokens(100);
  EXPECT_EQ(ComputeBlockHashes(tokens, 16, "s"), ComputeBlockHashes(tokens, 16, "s"));
  std::vector<int32_t> other = tokens;
  other[5] ^= 1;
  EXPECT_NE(ComputeBlockHashes(tokens, 16, "s")[0], ComputeBlockHashes(other, 16, "s")[0]);
}

TEST_F(BlockHashTest, SaltChangesEveryHash) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const std::vector<int32_t> tokens = RandomTokens(8 * 16);
  const std::vector<BlockHash> none = ComputeBlockHashes(tokens, 16, "");
  const std::vector<BlockHash> a = ComputeBlockHashes(tokens, 16, "tenant-a");
  const std::vector<BlockHash> b = ComputeBlockHashes(tokens, 16, "tenant-b");
  // The length prefix separates "a" + tokens from "a\0..." style ambiguities.
  const std::vector<BlockHash> nul = ComputeBlockHashes(tokens, 16, absl::string_view("\0", 1));
  ASSERT_EQ(none.size(), 8u);
  for (size_t i = 0; i < none.size(); ++i) {
    EXPECT_NE(none[i], a[i]) << i;
    EXPECT_NE(a[i], b[i]) << i;
    EXPECT_NE(none[i], nul[i]) << i;
  }
}

TEST_F(BlockHashTest, ChainPropagatesChanges) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const int64_t block_size = 16;
  const std::vector<int32_t> tokens = RandomTokens(6 * block_size);
  const std::vector<BlockHash> base = ComputeBlockHashes(tokens, block_size, "");
  for (int64_t changed_block = 0; changed_block < 6; ++changed_block) {
    std::vector<int32_t> other = tokens;
    other[changed_block * block_size + rng_() % block_size] += 1;
    const std::vector<BlockHash> hashes = ComputeBlockHashes(other, block_size, "");
    for (int64_t i = 0; i < 6; ++i) {
      if (i < changed_block) {
        EXPECT_EQ(hashes[i], base[i]) << "changed " << changed_block << " block " << i;
      } else {
        EXPECT_NE(hashes[i], base[i]) << "changed " << changed_block << " block " << i;
      }
    }
  }
  // Identical blocks at different positions hash differently: the hash names the prefix.
  const std::vector<int32_t> repeated(3 * block_size, 7);
  const std::vector<BlockHash> rep = ComputeBlockHashes(repeated, block_size, "");
  EXPECT_NE(rep[0], rep[1]);
  EXPECT_NE(rep[1], rep[2]);
}

TEST_F(BlockHashTest, OnlyFullBlocksAreHashed) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  std::vector<int32_t> tokens = RandomTokens(3 * 16 + 15);
  const std::vector<BlockHash> hashes = ComputeBlockHashes(tokens, 16, "");
  EXPECT_EQ(hashes.size(), 3u);
  // The partial tail does not influence anything.
  tokens.back() += 1;
  EXPECT_EQ(ComputeBlockHashes(tokens, 16, ""), hashes);
  EXPECT_TRUE(ComputeBlockHashes(RandomTokens(15), 16, "").empty());
  EXPECT_TRUE(ComputeBlockHashes({}, 16, "").empty());
  EXPECT_TRUE(ComputeBlockHashes(tokens, 0, "").empty());
  EXPECT_TRUE(ComputeBlockHashes(tokens, -4, "").empty());
  EXPECT_EQ(ComputeBlockHashes(RandomTokens(7), 1, "").size(), 7u);
}

TEST_F(BlockHashTest, IncrementalEqualsBatch) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const int64_t block_size = 16;
  const std::vector<int32_t> tokens = RandomTokens(10 * block_size + 3);
  const absl::Span<const int32_t> span(tokens);
  for (const std::string salt : {"", "x", "tenant-42"}) {
    const std::vector<BlockHash> batch = ComputeBlockHashes(tokens, block_size, salt);
    ASSERT_EQ(batch.size(), 10u);
    BlockHash prev;
    for (size_t i = 0; i < batch.size(); ++i) {
      const BlockHash next =
          HashNextBlock(i == 0 ? nullptr : &prev, span.subspan(i * block_size, block_size), salt);
      EXPECT_EQ(next, batch[i]) << "block " << i << " salt " << salt;
      prev = next;
    }
  }
}

TEST_F(BlockHashTest, SaltIgnoredAfterFirstBlock) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const std::vector<int32_t> block = RandomTokens(16);
  const BlockHash first = HashNextBlock(nullptr, block, "a");
  EXPECT_EQ(HashNextBlock(&first, block, "a"), HashNextBlock(&first, block, "b"));
  EXPECT_NE(HashNextBlock(&first, block, "a"), first);
}

TEST_F(BlockHashTest, ShortIsLittleEndianPrefix) {
  BlockHash hash;
  for (size_t i = 0; i < hash.bytes.size(); ++i) hash.bytes[i] = static_cast<uint8_t>(i + 1);
  EXPECT_EQ(hash.Short(), 0x0807060504030201ull);
  EXPECT_EQ(hash.ToHex().size(), 64u);
  EXPECT_EQ(hash.ToHex().substr(0, 6), "010203");
}

TEST_F(BlockHashTest, WorksAsHashMapKey) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  const std::vector<int32_t> tokens = RandomTokens(4096);
  const std::vector<BlockHash> hashes = ComputeBlockHashes(tokens, 4, "");
  absl::flat_hash_set<BlockHash> set(hashes.begin(), hashes.end());
  EXPECT_EQ(set.size(), hashes.size());
  for (const BlockHash& hash : hashes) EXPECT_TRUE(set.contains(hash));
  EXPECT_FALSE(set.contains(BlockHash{}));
}

}  // namespace
}  // namespace tandem
