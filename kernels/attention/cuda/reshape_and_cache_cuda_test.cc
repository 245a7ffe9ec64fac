// cuda::ReshapeAndCache against cpu::ReshapeAndCache (bf16/fp16: bit-exact copies), against
// host fp8 quantization (bit-exact: both round to nearest even and saturate) and against the
// host int8 row quantization Int8QuantizeRow (bit-exact: the same fp32 operations), pool bytes
// and scale bits alike.
#include "kernels/attention/cuda/reshape_and_cache_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/reshape_and_cache.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

struct WriteCase {
  KvCacheLayout layout;
  int64_t num_tokens;
  int64_t layer;
  std::vector<float> k, v;     // [num_tokens, heads, dim], already representable in T
  std::vector<int64_t> slots;  // distinct, shuffled, some -1
};

template <typename T>
WriteCase MakeWriteCase(std::mt19937& rng, KvCacheLayout layout, int64_t num_tokens) {
  WriteCase c{layout, num_tokens, layout.num_layers - 1, {}, {}, {}};
  const int64_t row = layout.num_kv_heads * layout.head_dim;
  c.k = attention_test::RandomNormal(rng, num_tokens * row, 1.0f);
  c.v = attention_test::RandomNormal(rng, num_tokens * row, 1.0f);
  cuda_test::RoundTo<T>(c.k);
  cuda_test::RoundTo<T>(c.v);
  std::vector<int64_t> all(layout.NumSlots());
  for (int64_t i = 0; i < layout.NumSlots(); ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  for (int64_t t = 0; t < num_tokens; ++t) c.slots.push_back(t % 5 == 3 ? -1 : all[t]);
  return c;
}

template <typename T>
void CheckExactCopy(std::mt19937& rng, KvCacheLayout layout, int64_t num_tokens) {
  WriteCase c = MakeWriteCase<T>(rng, layout, num_tokens);
  // Expected: the CPU op on an fp32 pool pre-filled with a sentinel.
  std::vector<float> expected(layout.TotalElems(), -7.0f);
  ASSERT_TRUE(cpu::ReshapeAndCache(c.k.data(), c.v.data(), c.slots.data(), num_tokens, c.layer,
                                   {expected.data(), layout})
                  .ok());
  DeviceBuffer<T> pool(cuda_test::Convert<T>(std::vector<float>(layout.TotalElems(), -7.0f)));
  DeviceBuffer<T> k(cuda_test::Convert<T>(c.k)), v(cuda_test::Convert<T>(c.v));
  DeviceBuffer<int64_t> slots(c.slots);
  DeviceKvCache cache{.data = pool.get(),
                      .layout = layout,
                      .dtype = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16};
  const absl::Status s =
      ReshapeAndCache<T>(k.get(), v.get(), slots.get(), num_tokens, c.layer, cache, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda_test::ToFloat(pool.ToHost());
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != expected[i];
  EXPECT_EQ(mismatches, 0);
}

TEST(ReshapeAndCacheCudaTest, Bf16AndFp16MatchCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int64_t d : {16, 32, 64, 128, 256}) {
    for (int64_t bs : {16, 32, 64}) {
      KvCacheLayout layout{
          .num_blocks = 37, .num_layers = 3, .block_size = bs, .num_kv_heads = 3, .head_dim = d};
      CheckExactCopy<__nv_bfloat16>(rng, layout, 301);
      CheckExactCopy<__half>(rng, layout, 1);
    }
  }
}

TEST(ReshapeAndCacheCudaTest, Fp8PerTensorAndPerHead) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int variant = 0; variant < 4; ++variant) {
    const bool per_head = variant % 2 == 1;
    const int64_t d = variant < 2 ? 128 : 16;  // 16: one 16-byte fp8 row per head
    KvCacheLayout layout{
        .num_blocks = 20, .num_layers = 2, .block_size = 16, .num_kv_heads = 4, .head_dim = d};
    WriteCase c = MakeWriteCase<__nv_bfloat16>(rng, layout, 200);
    c.k[5] = 1e6f;  // saturates to 448 * scale
    std::vector<float> ks = {0.02f, 0.03f, 0.05f, 0.07f}, vs = {0.04f, 0.01f, 0.02f, 0.03f};
    if (!per_head) ks.resize(1), vs.resize(1);
    DeviceBuffer<uint8_t> pool(std::vector<uint8_t>(layout.TotalElems(), 0x5a));
    DeviceBuffer<__nv_bfloat16> k(cuda_test::Convert<__nv_bfloat16>(c.k));
    DeviceBuffer<__nv_bfloat16> v(cuda_test::Convert<__nv_bfloat16>(c.v));
    DeviceBuffer<int64_t> slots(c.slots);
    DeviceBuffer<float> ks_dev(ks), vs_dev(vs);
    DeviceKvCache cache{.data = pool.get(),
                        .layout = layout,
                        .dtype = KvDtype::kFp8E4m3,
                        .k_scale = ks_dev.get(),
                        .v_scale = vs_dev.get(),
                        .per_head_scale = per_head};
    const absl::Status s =
        ReshapeAndCache<__nv_bfloat16>(k.get(), v.get(), slots.get(), 200, c.layer, cache, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> expected(layout.TotalElems(), 0x5a);
    const int64_t row = layout.num_kv_heads * layout.head_dim;
    for (int64_t t = 0; t < 200; ++t) {
      if (c.slots[t] < 0) continue;
      const int64_t blk = c.slots[t] / 16, off = c.slots[t] % 16;
      for (int64_t i = 0; i < row; ++i) {
        const int64_t h = per_head ? i / layout.head_dim : 0;
        const __nv_fp8_e4m3 kq(c.k[t * row + i] / ks[h]);
        const __nv_fp8_e4m3 vq(c.v[t * row + i] / vs[h]);
        std::memcpy(&expected[layout.TileOffset(blk, c.layer, 0) + off * row + i], &kq, 1);
        std::memcpy(&expected[layout.TileOffset(blk, c.layer, 1) + off * row + i], &vq, 1);
      }
    }
    const std::vector<uint8_t> got = pool.ToHost();
    int64_t mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != expected[i];
    EXPECT_EQ(mismatches, 0) << "per_head=" << per_head << " d=" << d;
  }
}

// int8: every written row's bytes and scale bits match Int8QuantizeRow; skipped slots and the
// other layer keep their sentinels. Rows include all-zero, NaN, inf and huge rows, and k/v are
// read with token strides (slices of a fused qkv buffer).
template <typename T>
void CheckInt8(std::mt19937& rng, int64_t d, int64_t num_tokens) {
  SCOPED_TRACE(::testing::Message() << "int8 d=" << d << " tokens=" << num_tokens
                                    << (std::is_same_v<T, __half> ? " fp16" : " bf16"));
  KvCacheLayout layout{
      .num_blocks = 23, .num_layers = 2, .block_size = 16, .num_kv_heads = 3, .head_dim = d};
  WriteCase c = MakeWriteCase<T>(rng, layout, num_tokens);
  const int64_t row = layout.num_kv_heads * d;
  // Special rows (token t, head h): zeros, a NaN, an inf, huge values.
  auto fill_row = [&](std::vector<float>& x, int64_t t, int64_t h, float value) {
    if (t < num_tokens) std::fill_n(x.begin() + t * row + h * d, d, value);
  };
  fill_row(c.k, 0, 0, 0.0f);
  fill_row(c.v, 1, 2, 0.0f);
  if (num_tokens > 2) c.k[2 * row + d + 3] = std::numeric_limits<float>::quiet_NaN();
  if (num_tokens > 4) c.v[4 * row + 5] = std::numeric_limits<float>::infinity();
  if (num_tokens > 6) c.k[6 * row + 2 * d + 1] = 3.0e4f;
  cuda_test::RoundTo<T>(c.k);  // what the device reads
  cuda_test::RoundTo<T>(c.v);
  // Fused-qkv style strides: k and v are column slices of [num_tokens, 3 * row].
  const int64_t stride = 3 * row;
  std::vector<float> qkv(num_tokens * stride, 99.0f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::copy_n(c.k.begin() + t * row, row, qkv.begin() + t * stride + row);
    std::copy_n(c.v.begin() + t * row, row, qkv.begin() + t * stride + 2 * row);
  }
  DeviceBuffer<T> qkv_dev(cuda_test::Convert<T>(qkv));
  DeviceBuffer<int8_t> pool(std::vector<int8_t>(layout.TotalElems(), int8_t{0x5a}));
  const int64_t num_scales = layout.num_blocks * KvScaleBlockElems(layout);
  DeviceBuffer<float> scales(std::vector<float>(num_scales, -3.0f));
  DeviceBuffer<int64_t> slots(c.slots);
  DeviceKvCache cache{
      .data = pool.get(), .layout = layout, .dtype = KvDtype::kInt8, .token_scales = scales.get()};
  const absl::Status s =
      ReshapeAndCache<T>(qkv_dev.get() + row, qkv_dev.get() + 2 * row, slots.get(), num_tokens,
                         c.layer, cache, nullptr, stride, stride);
  ASSERT_TRUE(s.ok()) << s;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<int8_t> expected(layout.TotalElems(), int8_t{0x5a});
  std::vector<float> expected_scales(num_scales, -3.0f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (c.slots[t] < 0) continue;
    const int64_t blk = c.slots[t] / 16, off = c.slots[t] % 16;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<float>& src = kv == 0 ? c.k : c.v;
      for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
        const int64_t dst = layout.TileOffset(blk, c.layer, kv) + off * row + h * d;
        expected_scales[dst / d] = Int8QuantizeRow(&src[t * row + h * d], d, &expected[dst]);
      }
    }
  }
  const std::vector<int8_t> got = pool.ToHost();
  const std::vector<float> got_scales = scales.ToHost();
  int64_t mismatches = 0, scale_mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != expected[i];
  for (size_t i = 0; i < got_scales.size(); ++i) {
    scale_mismatches += std::memcmp(&got_scales[i], &expected_scales[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(scale_mismatches, 0);
  // The special rows came out as documented.
  EXPECT_EQ(expected_scales[layout.TileOffset(c.slots[0] / 16, c.layer, 0) / d +
                            (c.slots[0] % 16) * layout.num_kv_heads],
            1.0f);  // zero row of token 0 (its slot is never -1: t % 5 != 3)
  if (num_tokens > 2) {
    EXPECT_TRUE(std::isnan(expected_scales[layout.TileOffset(c.slots[2] / 16, c.layer, 0) / d +
                                           (c.slots[2] % 16) * layout.num_kv_heads + 1]));
  }
}

TEST(ReshapeAndCacheCudaTest, Int8PerTokenPerHeadScales) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  for (int64_t d : {16, 32, 64, 128, 256}) {
    CheckInt8<__nv_bfloat16>(rng, d, 211);
    CheckInt8<__half>(rng, d, 7);
  }
}

// Int8QuantizeRow's documented rules on hand-picked rows (host only).
TEST(ReshapeAndCacheCudaTest, Int8QuantizeRowRules) {
  int8_t q[4];
  const float a[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  EXPECT_EQ(Int8QuantizeRow(a, 4, q), 1.0f);
  EXPECT_EQ(q[0] | q[1] | q[2] | q[3], 0);
  const float b[4] = {127.0f, -63.5f, 0.5f, 1.5f};  // scale 1: ties go to even
  EXPECT_EQ(Int8QuantizeRow(b, 4, q), 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 2);
  const float c[4] = {-254.0f, 2.0f, 3.0f, 1.0f};  // scale 2: -254 -> -127, 3 -> 1.5 -> 2
  EXPECT_EQ(Int8QuantizeRow(c, 4, q), 2.0f);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], 1);
  EXPECT_EQ(q[2], 2);
  EXPECT_EQ(q[3], 0);  // 0.5 -> 0
  const float e[4] = {1.0f, std::numeric_limits<float>::infinity(), 2.0f, 3.0f};
  EXPECT_TRUE(std::isnan(Int8QuantizeRow(e, 4, q)));
  EXPECT_EQ(q[0] | q[1] | q[2] | q[3], 0);
}

TEST(ReshapeAndCacheCudaTest, RejectsBadArguments) {
  KvCacheLayout layout{
      .num_blocks = 4, .num_layers = 2, .block_size = 16, .num_kv_heads = 2, .head_dim = 64};
  alignas(16) static __nv_bfloat16 dummy[8];
  DeviceKvCache cache{.data = dummy, .layout = layout, .dtype = KvDtype::kBf16};
  const int64_t slot = 0;
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 2, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // layer out of range
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, -1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  cache.dtype = KvDtype::kFp16;
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // type mismatch
  cache.dtype = KvDtype::kFp8E4m3;
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // fp8 without scales
  cache.dtype = KvDtype::kInt8;
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // int8 without token_scales
  alignas(16) static float scales[8];
  cache.token_scales = scales + 1;
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // unaligned token_scales
  cache.token_scales = scales;
  cache.layout.head_dim = 8;  // 8 int8 bytes per row: not a multiple of 16
  EXPECT_EQ(ReshapeAndCache<__nv_bfloat16>(dummy, dummy, &slot, 1, 0, cache, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kernels::cuda
