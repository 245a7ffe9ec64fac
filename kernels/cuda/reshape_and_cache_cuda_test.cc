// cuda::ReshapeAndCache against cpu::ReshapeAndCache (bf16/fp16: bit-exact copies) and against
// host fp8 quantization (bit-exact: both round to nearest even and saturate).
#include "kernels/cuda/reshape_and_cache_cuda.h"

#include <algorithm>
#include <cstring>
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
  for (int64_t d : {64, 128, 256}) {
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
  for (bool per_head : {false, true}) {
    KvCacheLayout layout{
        .num_blocks = 20, .num_layers = 2, .block_size = 16, .num_kv_heads = 4, .head_dim = 128};
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
    EXPECT_EQ(mismatches, 0) << "per_head=" << per_head;
  }
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
}

}  // namespace
}  // namespace tandem::kernels::cuda
