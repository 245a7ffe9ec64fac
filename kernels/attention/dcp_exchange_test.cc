// The DCP exchange buffer: its documented byte layout, the CPU pack, the receive-side view and
// unpack + merge.
#include "kernels/attention/dcp_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/merge_attn_states.h"

namespace tandem::kernels::cpu {
namespace {

using ::tandem::kernels::attention_test::RandomNormal;
using ::tandem::kernels::attention_test::TestSeed;

TEST(DcpExchangeLayoutTest, ByteOffsetsAsDocumented) {
  // 3 tokens, 8 heads, head_dim 5, 4 ranks: 2 heads per rank.
  DcpExchangeLayout fp32{
      .num_tokens = 3, .num_heads = 8, .head_dim = 5, .dcp_size = 4, .elem_bytes = 4};
  ASSERT_TRUE(fp32.Validate().ok());
  EXPECT_EQ(fp32.HeadsPerRank(), 2);
  EXPECT_EQ(fp32.OutBytes(), 3 * 2 * 5 * 4);  // 120
  EXPECT_EQ(fp32.LseOffset(), 128);           // 120 up to 16
  EXPECT_EQ(fp32.RegionBytes(), 160);         // 128 + 3 * 2 * 4 = 152, up to 16
  EXPECT_EQ(fp32.BufferBytes(), 4 * 160);
  DcpExchangeLayout bf16 = fp32;
  bf16.elem_bytes = 2;
  EXPECT_EQ(bf16.OutBytes(), 60);
  EXPECT_EQ(bf16.LseOffset(), 64);
  EXPECT_EQ(bf16.RegionBytes(), 96);  // 64 + 24 = 88, up to 16
  // Llama-3-8B decode, 32 heads over 4 ranks, bf16: aligned sizes need no padding.
  const DcpExchangeLayout llama{
      .num_tokens = 8, .num_heads = 32, .head_dim = 128, .dcp_size = 4, .elem_bytes = 2};
  EXPECT_EQ(llama.LseOffset(), 8 * 8 * 128 * 2);
  EXPECT_EQ(llama.RegionBytes(), 8 * 8 * 128 * 2 + 8 * 8 * 4);
  const DcpExchangeLayout empty{
      .num_tokens = 0, .num_heads = 4, .head_dim = 8, .dcp_size = 2, .elem_bytes = 2};
  EXPECT_TRUE(empty.Validate().ok());
  EXPECT_EQ(empty.BufferBytes(), 0);
}

TEST(DcpExchangeLayoutTest, RejectsBadLayouts) {
  const DcpExchangeLayout good{
      .num_tokens = 2, .num_heads = 8, .head_dim = 4, .dcp_size = 4, .elem_bytes = 4};
  ASSERT_TRUE(good.Validate().ok());
  DcpExchangeLayout bad = good;
  bad.num_heads = 6;  // not a multiple of dcp_size
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.dcp_size = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.elem_bytes = 1;
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.num_tokens = -1;
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.head_dim = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = good;
  bad.num_tokens = int64_t{1} << 40;
  EXPECT_FALSE(bad.Validate().ok());
  // The CPU pack carries fp32 only.
  bad = good;
  bad.elem_bytes = 2;
  std::vector<float> out(2 * 8 * 4), lse(2 * 8), buf(1024);
  EXPECT_EQ(DcpPackForExchange(out.data(), lse.data(), bad, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DcpPackForExchange(out.data(), nullptr, good, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DcpMergeReceived(nullptr, good, out.data(), lse.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Every packed value sits at the byte offset the layout comment gives; padding is untouched.
TEST(DcpExchangeTest, PackPlacesEveryValueAtItsDocumentedOffset) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  for (int64_t dcp_size : {1, 2, 3, 4}) {
    const DcpExchangeLayout layout{.num_tokens = 5,
                                   .num_heads = 6 * dcp_size,
                                   .head_dim = 3,
                                   .dcp_size = dcp_size,
                                   .elem_bytes = 4};
    const int64_t h = layout.num_heads, d = layout.head_dim, hpr = layout.HeadsPerRank();
    const std::vector<float> out = RandomNormal(rng, 5 * h * d, 1.0f);
    const std::vector<float> lse = RandomNormal(rng, 5 * h, 4.0f);
    std::vector<unsigned char> send(layout.BufferBytes() + 16, 0xAB);
    unsigned char* base = send.data() + (16 - reinterpret_cast<uintptr_t>(send.data()) % 16) % 16;
    ASSERT_TRUE(DcpPackForExchange(out.data(), lse.data(), layout, base).ok());
    std::vector<bool> written(layout.BufferBytes(), false);
    auto at = [&](int64_t byte) {
      float x;
      std::memcpy(&x, base + byte, 4);
      for (int i = 0; i < 4; ++i) written[byte + i] = true;
      return x;
    };
    for (int64_t j = 0; j < dcp_size; ++j) {
      const int64_t region = j * layout.RegionBytes();
      for (int64_t t = 0; t < 5; ++t) {
        for (int64_t hh = 0; hh < hpr; ++hh) {
          const int64_t src = t * h + j * hpr + hh;
          for (int64_t i = 0; i < d; ++i) {
            ASSERT_EQ(at(region + ((t * hpr + hh) * d + i) * 4), out[src * d + i]);
          }
          ASSERT_EQ(at(region + layout.LseOffset() + (t * hpr + hh) * 4), lse[src]);
        }
      }
    }
    for (int64_t b = 0; b < layout.BufferBytes(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(base[b], 0xAB) << "padding byte " << b << " written";
      }
    }
  }
}

TEST(DcpExchangeTest, ReceivedPartialsViewTheRegions) {
  const DcpExchangeLayout layout{
      .num_tokens = 3, .num_heads = 8, .head_dim = 5, .dcp_size = 4, .elem_bytes = 2};
  alignas(16) unsigned char buf[4 * 96];
  const AttnPartials<uint16_t> parts = DcpReceivedPartials<uint16_t>(buf, layout);
  EXPECT_EQ(parts.num_parts, 4);
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(parts.out), buf);
  EXPECT_EQ(parts.out_stride * 2, layout.RegionBytes());
  EXPECT_EQ(reinterpret_cast<const unsigned char*>(parts.lse), buf + 64);
  EXPECT_EQ(parts.lse_stride * 4, layout.RegionBytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(parts.lse) % 4, 0u);
}

// Unpack + merge of a hand-built receive buffer: rank 1 of 2 with two sources, one of them
// empty for some rows (lse -inf, garbage out) -> the other copied exactly; both empty -> 0/-inf.
TEST(DcpExchangeTest, MergeReceivedCombinesSourcesByLse) {
  const uint32_t seed = TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const DcpExchangeLayout layout{
      .num_tokens = 4, .num_heads = 4, .head_dim = 6, .dcp_size = 2, .elem_bytes = 4};
  const int64_t rows = 4 * 2, d = 6;
  std::vector<float> recv(layout.BufferBytes() / 4, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::vector<float>> o(2), l(2);
  for (int k = 0; k < 2; ++k) {
    o[k] = RandomNormal(rng, rows * d, 1.0f);
    l[k] = RandomNormal(rng, rows, 3.0f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  l[1][0] = -inf;  // source 1 empty: source 0 copied
  l[0][1] = -inf;  // source 0 empty
  l[0][2] = l[1][2] = -inf;
  for (int k = 0; k < 2; ++k) {
    float* region = recv.data() + k * layout.RegionBytes() / 4;
    for (int64_t r = 0; r < rows; ++r) {
      if (std::isinf(l[k][r])) continue;  // an empty source's out stays NaN
      std::copy_n(o[k].begin() + r * d, d, region + r * d);
    }
    for (int64_t r = 0; r < rows; ++r) region[layout.LseOffset() / 4 + r] = l[k][r];
  }
  std::vector<float> out(rows * d), lse(rows);
  ASSERT_TRUE(DcpMergeReceived(recv.data(), layout, out.data(), lse.data()).ok());
  for (int64_t r = 0; r < rows; ++r) {
    const double la = l[0][r], lb = l[1][r];
    const bool ea = std::isinf(la), eb = std::isinf(lb);
    const double m = ea ? lb : eb ? la : std::max(la, lb);
    const double wa = ea ? 0 : std::exp(la - m), wb = eb ? 0 : std::exp(lb - m);
    if (ea && eb) {
      EXPECT_EQ(lse[r], -inf);
    } else {
      EXPECT_NEAR(lse[r], m + std::log(wa + wb), 1e-5 * std::max(1.0, std::abs(m)));
    }
    for (int64_t i = 0; i < d; ++i) {
      const double want =
          ea && eb
              ? 0.0
              : ((ea ? 0.0 : wa * o[0][r * d + i]) + (eb ? 0.0 : wb * o[1][r * d + i])) / (wa + wb);
      if (ea != eb) {
        EXPECT_EQ(out[r * d + i], static_cast<float>(want)) << "row " << r << ": not a copy";
      } else {
        EXPECT_NEAR(out[r * d + i], want, 1e-6) << "row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
