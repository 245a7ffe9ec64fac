// RopeQkvToCache against the unfused ops it replaces (ApplyRope on the fused qkv rows,
// ReshapeAndCache of the strided k/v, a strided q copy): bit-exact q and pool on fresh random
// inputs (GPU; skips without one). QkNormRopeQkvToCache against QkHeadRmsNorm + RopeQkvToCache
// (bit-exact) and against the CPU RmsNorm + ApplyRope (within T's rounding). Both into fp8 e4m3
// pools against the same kernel into a T pool + ReshapeAndCache<T> of its rows (bit-exact).
#include "kernels/attention/cuda/rope_cache_cuda.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/cuda/reshape_and_cache_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/pdl_test_util.h"
#include "kernels/layers/cuda/head_norm_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/norm.h"
#include "kernels/layers/rope.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::TestSeed;

// pdl: RopeQkvToCache PDL-launched behind pdl_test::LaunchDelayedWriter, which lets it start at
// once and writes qkv (NaN bytes until then) ~1 ms later: the kernel must read qkv only after its
// griddepcontrol.wait.
// Distinct slots of `layout` in random order for num_tokens tokens, every 5th -1 (skipped) and
// token 3 out of the pool; random positions below 70000.
void RandomSlotsAndPositions(std::mt19937& rng, const KvCacheLayout& layout, int64_t num_tokens,
                             std::vector<int64_t>* slots, std::vector<int64_t>* positions) {
  slots->resize(layout.NumSlots());
  std::iota(slots->begin(), slots->end(), 0);
  std::shuffle(slots->begin(), slots->end(), rng);
  slots->resize(num_tokens);
  for (int64_t t = 0; t < num_tokens; t += 5) (*slots)[t] = -1;
  if (num_tokens > 3) (*slots)[3] = layout.NumSlots() + 7;
  positions->resize(num_tokens);
  for (int64_t& p : *positions) p = static_cast<int64_t>(rng() % 70000);
}

template <typename T>
void RunCase(std::mt19937& rng, int64_t num_tokens, int64_t hq, int64_t hk, int64_t d,
             bool pdl = false) {
  SCOPED_TRACE(::testing::Message() << "T=" << num_tokens << " hq=" << hq << " hk=" << hk
                                    << " d=" << d << " pdl=" << pdl);
  KvCacheLayout layout;
  layout.num_blocks = 37;
  layout.num_layers = 3;
  layout.block_size = 16;
  layout.num_kv_heads = hk;
  layout.head_dim = d;
  const int64_t layer = 1;
  const int64_t stride = (hq + 2 * hk) * d + 8;  // padded rows, like a view
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<T> qkv(num_tokens * stride);
  for (T& x : qkv) x = cuda_test::FromF<T>(dist(rng));
  std::vector<int64_t> slots, positions;
  RandomSlotsAndPositions(rng, layout, num_tokens, &slots, &positions);
  auto inv_freq = ComputeRopeInvFreq(500000.0, d, RopeScaling{});
  ASSERT_TRUE(inv_freq.ok()) << inv_freq.status();

  const KvDtype dtype = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  std::vector<T> pool_init(layout.TotalElems());
  for (T& x : pool_init) x = cuda_test::FromF<T>(dist(rng));
  DeviceBuffer<T> d_qkv(qkv), d_qkv_ref(qkv), pool(pool_init), pool_ref(pool_init);
  DeviceBuffer<int64_t> d_pos(positions), d_slots(slots);
  DeviceBuffer<float> d_freq(*inv_freq);
  DeviceBuffer<T> q_out(num_tokens * hq * d), q_ref(num_tokens * hq * d);
  DeviceKvCache cache{pool.get(), layout, dtype}, cache_ref{pool_ref.get(), layout, dtype};

  cudaStream_t stream = nullptr;
  DeviceBuffer<T> qkv_stage(qkv);
  if (pdl) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaMemset(d_qkv.get(), 0xff, qkv.size() * sizeof(T)));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(pdl_test::LaunchDelayedWriter(
        {d_qkv.get(), qkv_stage.get(), qkv.size() * sizeof(T)}, {}, 2'000'000, stream));
  }
  ASSERT_TRUE(RopeQkvToCache<T>(d_qkv.get(), stride, d_pos.get(), d_slots.get(), num_tokens,
                                d_freq.get(), hq, q_out.get(), cache, layer, stream, pdl)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  if (stream != nullptr) {
    TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  T* r = d_qkv_ref.get();
  ASSERT_TRUE(ApplyRope<T>(d_pos.get(), num_tokens, d_freq.get(), d, r, hq, r + hq * d, hk, nullptr,
                           stride, stride)
                  .ok());
  ASSERT_TRUE(ReshapeAndCache<T>(r + hq * d, r + (hq + hk) * d, d_slots.get(), num_tokens, layer,
                                 cache_ref, nullptr, stride, stride)
                  .ok());
  TANDEM_CUDA_CHECK(cudaMemcpy2D(q_ref.get(), hq * d * sizeof(T), r, stride * sizeof(T),
                                 hq * d * sizeof(T), num_tokens, cudaMemcpyDeviceToDevice));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got_q = q_out.ToHost(), want_q = q_ref.ToHost();
  const std::vector<T> got_pool = pool.ToHost(), want_pool = pool_ref.ToHost();
  EXPECT_EQ(std::memcmp(got_q.data(), want_q.data(), got_q.size() * sizeof(T)), 0) << "q differs";
  EXPECT_EQ(std::memcmp(got_pool.data(), want_pool.data(), got_pool.size() * sizeof(T)), 0)
      << "pool differs";
  // The input rows are not modified (the unfused path rotates in place).
  EXPECT_EQ(std::memcmp(d_qkv.ToHost().data(), qkv.data(), qkv.size() * sizeof(T)), 0);
}

TEST(RopeCacheCudaTest, MatchesUnfusedOpsBitForBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t tokens : {1, 7, 300}) {
    RunCase<__nv_bfloat16>(rng, tokens, 4, 2, 16);
    RunCase<__nv_bfloat16>(rng, tokens, 32, 8, 128);
    RunCase<__half>(rng, tokens, 8, 1, 64);
    RunCase<__half>(rng, tokens, 4, 4, 32);
  }
}

// The PDL launch (the decode step's): qkv read only after the wait, the same bits.
TEST(RopeCacheCudaTest, PdlLaunchReadsQkvAfterTheWait) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t tokens : {1, 300}) {
    RunCase<__nv_bfloat16>(rng, tokens, 32, 8, 128, /*pdl=*/true);
    RunCase<__half>(rng, tokens, 8, 1, 64, /*pdl=*/true);
  }
}

// QkNormRopeQkvToCache vs QkHeadRmsNorm (in place on a copy) + RopeQkvToCache: q and pool bit for
// bit, qkv untouched; and vs the CPU RmsNorm per head (rounded to T) + cpu::ApplyRope within T's
// rounding, v copied exactly.
template <typename T>
void RunQkNormCase(std::mt19937& rng, int64_t num_tokens, int64_t hq, int64_t hk, int64_t d) {
  SCOPED_TRACE(::testing::Message()
               << "qk-norm T=" << num_tokens << " hq=" << hq << " hk=" << hk << " d=" << d);
  KvCacheLayout layout;
  layout.num_blocks = 37;
  layout.num_layers = 3;
  layout.block_size = 16;
  layout.num_kv_heads = hk;
  layout.head_dim = d;
  const int64_t layer = 2;
  const int64_t stride = (hq + 2 * hk) * d + 8;
  const float eps = 1e-6f;
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> qkv_f(num_tokens * stride), qw(d), kw(d);
  for (float& x : qkv_f) x = dist(rng);
  for (float& x : qw) x = 1.0f + 0.1f * dist(rng);
  for (float& x : kw) x = 1.0f + 0.1f * dist(rng);
  cuda_test::RoundTo<T>(qkv_f);
  cuda_test::RoundTo<T>(qw);
  cuda_test::RoundTo<T>(kw);
  const std::vector<T> qkv = cuda_test::Convert<T>(qkv_f);
  std::vector<int64_t> slots, positions;
  RandomSlotsAndPositions(rng, layout, num_tokens, &slots, &positions);
  auto inv_freq = ComputeRopeInvFreq(1000000.0, d, RopeScaling{});
  ASSERT_TRUE(inv_freq.ok()) << inv_freq.status();
  const KvDtype dtype = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  std::vector<T> pool_init(layout.TotalElems());
  for (T& x : pool_init) x = cuda_test::FromF<T>(dist(rng));
  DeviceBuffer<T> d_qkv(qkv), d_qkv_ref(qkv), pool(pool_init), pool_ref(pool_init);
  DeviceBuffer<T> d_qw(cuda_test::Convert<T>(qw)), d_kw(cuda_test::Convert<T>(kw));
  DeviceBuffer<int64_t> d_pos(positions), d_slots(slots);
  DeviceBuffer<float> d_freq(*inv_freq);
  DeviceBuffer<T> q_out(num_tokens * hq * d), q_ref(num_tokens * hq * d);
  DeviceKvCache cache{pool.get(), layout, dtype}, cache_ref{pool_ref.get(), layout, dtype};
  ASSERT_TRUE(QkNormRopeQkvToCache<T>(d_qkv.get(), stride, d_pos.get(), d_slots.get(), num_tokens,
                                      d_freq.get(), hq, d_qw.get(), d_kw.get(), eps, q_out.get(),
                                      cache, layer, nullptr)
                  .ok());
  ASSERT_TRUE(QkHeadRmsNorm<T>(d_qkv_ref.get(), stride, num_tokens, hq, hk, d, d_qw.get(),
                               d_kw.get(), eps, nullptr)
                  .ok());
  ASSERT_TRUE(RopeQkvToCache<T>(d_qkv_ref.get(), stride, d_pos.get(), d_slots.get(), num_tokens,
                                d_freq.get(), hq, q_ref.get(), cache_ref, layer, nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got_q = q_out.ToHost(), want_q = q_ref.ToHost();
  const std::vector<T> got_pool = pool.ToHost(), want_pool = pool_ref.ToHost();
  EXPECT_EQ(std::memcmp(got_q.data(), want_q.data(), got_q.size() * sizeof(T)), 0) << "q differs";
  EXPECT_EQ(std::memcmp(got_pool.data(), want_pool.data(), got_pool.size() * sizeof(T)), 0)
      << "pool differs";
  EXPECT_EQ(std::memcmp(d_qkv.ToHost().data(), qkv.data(), qkv.size() * sizeof(T)), 0);
  // CPU reference: RmsNorm per head rounded to T (the unfused path's qkv), then rotated.
  const double tol = std::is_same_v<T, __half> ? 1.0 / 512 : 1.0 / 64;
  const std::vector<float> q_f = cuda_test::ToFloat(got_q), pool_f = cuda_test::ToFloat(got_pool);
  std::vector<float> head(d), rot(d);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const bool cached = slots[t] >= 0 && slots[t] < layout.NumSlots();
    for (int64_t h = 0; h < hq + 2 * hk; ++h) {
      const float* x = qkv_f.data() + t * stride + h * d;
      const float* got;
      if (h < hq) {
        got = q_f.data() + (t * hq + h) * d;
      } else if (!cached) {
        continue;
      } else {
        const int64_t kv = h < hq + hk ? 0 : 1, kv_head = h - hq - kv * hk;
        got = pool_f.data() + (slots[t] / layout.block_size) * layout.BlockElems() +
              layout.TileOffset(0, layer, 0) + kv * layout.TileElems() +
              ((slots[t] % layout.block_size) * hk + kv_head) * d;
      }
      if (h >= hq + hk) {  // v: copied
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[i], x[i]) << "v head " << h << " dim " << i;
        continue;
      }
      cpu::RmsNorm(x, h < hq ? qw.data() : kw.data(), 1, d, eps, head.data());
      cuda_test::RoundTo<T>(head);
      rot = head;
      cpu::ApplyRope(&positions[t], 1, inv_freq->data(), d, rot.data(), 1, nullptr, 0);
      for (int64_t i = 0; i < d; ++i) {
        const int64_t j = i < d / 2 ? i + d / 2 : i - d / 2;
        const double limit = tol * (std::abs(head[i]) + std::abs(head[j]) + 1e-2);
        ASSERT_LE(std::abs(double{got[i]} - rot[i]), limit)
            << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

TEST(RopeCacheCudaTest, QkNormFusedMatchesHeadNormThenRopeBitForBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t tokens : {1, 7, 300}) {
    RunQkNormCase<__nv_bfloat16>(rng, tokens, 32, 4, 128);  // Qwen3-30B-A3B
    RunQkNormCase<__nv_bfloat16>(rng, tokens, 4, 2, 16);
    RunQkNormCase<__nv_bfloat16>(rng, tokens, 8, 2, 256);
    RunQkNormCase<__half>(rng, tokens, 8, 1, 64);
    RunQkNormCase<__half>(rng, tokens, 16, 8, 128);
  }
}

// FP8 e4m3 pools: the kernel (RopeQkvToCache, or QkNormRopeQkvToCache when qk_norm) writing an
// fp8 pool against the same kernel writing a T pool, whose written rows ReshapeAndCache<T> then
// stores into an fp8 pool with the same scales (the documented semantics): pool bytes and q_out
// bit for bit, the bytes of unwritten slots untouched. Random positive scales per tensor or per kv
// head, wide enough that some codes saturate and some are subnormal; inputs non-zero.
template <typename T>
void RunFp8Case(std::mt19937& rng, bool qk_norm, int64_t num_tokens, int64_t hq, int64_t hk,
                int64_t d, bool per_head_scale) {
  SCOPED_TRACE(::testing::Message()
               << "fp8 qk_norm=" << qk_norm << " T=" << num_tokens << " hq=" << hq << " hk=" << hk
               << " d=" << d << " per_head_scale=" << per_head_scale);
  KvCacheLayout layout;
  layout.num_blocks = 37;
  layout.num_layers = 3;
  layout.block_size = 16;
  layout.num_kv_heads = hk;
  layout.head_dim = d;
  const int64_t layer = 1;
  const int64_t stride = (hq + 2 * hk) * d + 8;
  const int64_t row = hk * d;
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<T> qkv(num_tokens * stride);
  for (T& x : qkv) {
    do {
      x = cuda_test::FromF<T>(dist(rng));
    } while (cuda_test::ToF(x) == 0.0f);
  }
  std::vector<float> qw(d), kw(d);
  for (float& x : qw) x = 1.0f + 0.1f * dist(rng);
  for (float& x : kw) x = 1.0f + 0.1f * dist(rng);
  std::vector<int64_t> slots, positions;
  RandomSlotsAndPositions(rng, layout, num_tokens, &slots, &positions);
  auto inv_freq = ComputeRopeInvFreq(500000.0, d, RopeScaling{});
  ASSERT_TRUE(inv_freq.ok()) << inv_freq.status();
  std::uniform_real_distribution<float> scale_dist(0.005f, 0.03f);
  std::vector<float> k_scales(per_head_scale ? hk : 1), v_scales(k_scales.size());
  for (float& x : k_scales) x = scale_dist(rng);
  for (float& x : v_scales) x = scale_dist(rng);

  const KvDtype own = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  std::vector<T> pool_t_init(layout.TotalElems());
  for (T& x : pool_t_init) x = cuda_test::FromF<T>(dist(rng));
  std::vector<uint8_t> pool8_init(layout.TotalElems());
  for (uint8_t& x : pool8_init) x = static_cast<uint8_t>(rng());
  DeviceBuffer<T> d_qkv(qkv), pool_t(pool_t_init);
  DeviceBuffer<uint8_t> pool8(pool8_init), pool8_ref(pool8_init);
  DeviceBuffer<T> d_qw(cuda_test::Convert<T>(qw)), d_kw(cuda_test::Convert<T>(kw));
  DeviceBuffer<int64_t> d_pos(positions), d_slots(slots);
  DeviceBuffer<float> d_freq(*inv_freq), d_k_scales(k_scales), d_v_scales(v_scales);
  DeviceBuffer<T> q_t(num_tokens * hq * d), q8(num_tokens * hq * d);
  const DeviceKvCache cache_t{pool_t.get(), layout, own};
  DeviceKvCache cache8{pool8.get(),      layout,           KvDtype::kFp8E4m3,
                       d_k_scales.get(), d_v_scales.get(), per_head_scale};
  DeviceKvCache cache8_ref = cache8;
  cache8_ref.data = pool8_ref.get();
  auto run = [&](const DeviceKvCache& cache, T* q_out) {
    return qk_norm ? QkNormRopeQkvToCache<T>(d_qkv.get(), stride, d_pos.get(), d_slots.get(),
                                             num_tokens, d_freq.get(), hq, d_qw.get(), d_kw.get(),
                                             1e-6f, q_out, cache, layer, nullptr)
                   : RopeQkvToCache<T>(d_qkv.get(), stride, d_pos.get(), d_slots.get(), num_tokens,
                                       d_freq.get(), hq, q_out, cache, layer, nullptr);
  };
  ASSERT_TRUE(run(cache_t, q_t.get()).ok());
  ASSERT_TRUE(run(cache8, q8.get()).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());

  // The T pool's written k / v rows, dense per token (zeros where the slot is skipped: -1 or
  // outside the pool, which ReshapeAndCache skips too), into the reference fp8 pool.
  const std::vector<T> got_pool_t = pool_t.ToHost();
  std::vector<T> k_rows(num_tokens * row), v_rows(num_tokens * row);
  std::vector<bool> written(layout.TotalElems(), false);
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= layout.NumSlots()) continue;
    const int64_t k_at = (slots[t] / layout.block_size) * layout.BlockElems() +
                         layout.TileOffset(0, layer, 0) + (slots[t] % layout.block_size) * row;
    const int64_t v_at = k_at + layout.TileElems();
    std::copy_n(got_pool_t.begin() + k_at, row, k_rows.begin() + t * row);
    std::copy_n(got_pool_t.begin() + v_at, row, v_rows.begin() + t * row);
    std::fill_n(written.begin() + k_at, row, true);
    std::fill_n(written.begin() + v_at, row, true);
  }
  DeviceBuffer<T> d_k_rows(k_rows), d_v_rows(v_rows);
  ASSERT_TRUE(ReshapeAndCache<T>(d_k_rows.get(), d_v_rows.get(), d_slots.get(), num_tokens, layer,
                                 cache8_ref, nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got_q8 = q8.ToHost(), want_q = q_t.ToHost();
  const std::vector<uint8_t> got_pool8 = pool8.ToHost(), want_pool8 = pool8_ref.ToHost();
  EXPECT_EQ(std::memcmp(got_q8.data(), want_q.data(), got_q8.size() * sizeof(T)), 0) << "q differs";
  int64_t differing = 0, touched = 0, first = -1;
  for (int64_t i = 0; i < layout.TotalElems(); ++i) {
    if (got_pool8[i] != want_pool8[i] && differing++ == 0) first = i;
    touched += !written[i] && got_pool8[i] != pool8_init[i];
  }
  EXPECT_EQ(differing, 0) << "fp8 pool differs from ReshapeAndCache's, first at byte " << first
                          << ": " << int{got_pool8[std::max<int64_t>(first, 0)]} << " vs "
                          << int{want_pool8[std::max<int64_t>(first, 0)]};
  EXPECT_EQ(touched, 0) << "bytes of unwritten slots changed";
  EXPECT_EQ(std::memcmp(d_qkv.ToHost().data(), qkv.data(), qkv.size() * sizeof(T)), 0);
}

TEST(RopeCacheCudaTest, Fp8PoolMatchesTPoolThenReshapeAndCache) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (bool qk_norm : {false, true}) {
    for (bool per_head_scale : {false, true}) {
      for (int64_t tokens : {1, 7, 300}) {
        RunFp8Case<__nv_bfloat16>(rng, qk_norm, tokens, 32, 8, 128, per_head_scale);  // Llama-3
        RunFp8Case<__nv_bfloat16>(rng, qk_norm, tokens, 8, 2, 64, per_head_scale);
        RunFp8Case<__half>(rng, qk_norm, tokens, 16, 4, 128, per_head_scale);
        RunFp8Case<__half>(rng, qk_norm, tokens, 12, 2, 64, per_head_scale);
      }
    }
  }
}

// FP8 pools need both scales; int8 pools are refused (the dtype named); nothing launched.
TEST(RopeCacheCudaTest, Fp8PoolRefusals) {
  TANDEM_SKIP_WITHOUT_GPU();
  KvCacheLayout layout{4, 2, 16, 2, 64};
  DeviceBuffer<uint8_t> pool(layout.TotalElems());
  DeviceBuffer<__nv_bfloat16> qkv(64 * 8), q(64 * 8), w(64);
  DeviceBuffer<int64_t> pos(std::vector<int64_t>(8, 0)), slots(std::vector<int64_t>(8, 0));
  DeviceBuffer<float> freq(std::vector<float>(32, 0.0f)), scales(std::vector<float>(2, 1.0f));
  DeviceBuffer<float> token_scales(layout.num_blocks * KvScaleBlockElems(layout));
  TANDEM_CUDA_CHECK(cudaMemset(qkv.get(), 0, 64 * 8 * sizeof(__nv_bfloat16)));
  for (bool qk_norm : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "qk_norm=" << qk_norm);
    // (Refilled each round: the previous round's accepted call wrote its slot.)
    TANDEM_CUDA_CHECK(cudaMemset(pool.get(), 0x11, layout.TotalElems()));
    auto call = [&](const DeviceKvCache& c) {
      return qk_norm ? QkNormRopeQkvToCache<__nv_bfloat16>(qkv.get(), 8 * 64, pos.get(),
                                                           slots.get(), 1, freq.get(), 4, w.get(),
                                                           w.get(), 1e-6f, q.get(), c, 0, nullptr)
                     : RopeQkvToCache<__nv_bfloat16>(qkv.get(), 8 * 64, pos.get(), slots.get(), 1,
                                                     freq.get(), 4, q.get(), c, 0, nullptr);
    };
    DeviceKvCache fp8{pool.get(), layout, KvDtype::kFp8E4m3, scales.get(), scales.get()};
    DeviceKvCache no_k = fp8, no_v = fp8, int8 = fp8;
    no_k.k_scale = nullptr;
    no_v.v_scale = nullptr;
    int8.dtype = KvDtype::kInt8;
    int8.token_scales = token_scales.get();
    EXPECT_EQ(call(no_k).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(call(no_v).code(), absl::StatusCode::kInvalidArgument);
    const absl::Status refused = call(int8);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("int8"), std::string_view::npos) << refused;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> after = pool.ToHost();
    EXPECT_EQ(std::count(after.begin(), after.end(), uint8_t{0x11}),
              static_cast<int64_t>(after.size()))
        << "a refused call wrote the pool";
    EXPECT_TRUE(call(fp8).ok());
  }
}

TEST(RopeCacheCudaTest, QkNormFusedRejectsBadArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  KvCacheLayout layout{4, 2, 16, 2, 64};
  DeviceBuffer<__nv_bfloat16> pool(layout.TotalElems()), qkv(64 * 8), q(64 * 8), w(64);
  DeviceBuffer<int64_t> pos(8), slots(8);
  DeviceBuffer<float> freq(32);
  DeviceKvCache cache{pool.get(), layout, KvDtype::kBf16};
  auto call = [&](int64_t stride, int64_t layer, const __nv_bfloat16* norm) {
    return QkNormRopeQkvToCache<__nv_bfloat16>(qkv.get(), stride, pos.get(), slots.get(), 1,
                                               freq.get(), 4, norm, w.get(), 1e-6f, q.get(), cache,
                                               layer, nullptr);
  };
  EXPECT_EQ(call(8 * 64, 2, w.get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(100, 0, w.get()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(8 * 64, 0, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RopeCacheCudaTest, RejectsBadArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  KvCacheLayout layout{4, 2, 16, 2, 64};
  DeviceBuffer<__nv_bfloat16> pool(layout.TotalElems()), qkv(64 * 8), q(64 * 8);
  DeviceBuffer<int64_t> pos(8), slots(8);
  DeviceBuffer<float> freq(32);
  DeviceKvCache cache{pool.get(), layout, KvDtype::kBf16};
  auto call = [&](int64_t stride, int64_t layer, KvDtype dtype) {
    DeviceKvCache c = cache;
    c.dtype = dtype;
    return RopeQkvToCache<__nv_bfloat16>(qkv.get(), stride, pos.get(), slots.get(), 1, freq.get(),
                                         4, q.get(), c, layer, nullptr);
  };
  EXPECT_EQ(call(8 * 64, 2, KvDtype::kBf16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(100, 0, KvDtype::kBf16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(8 * 64, 0, KvDtype::kFp16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(call(8 * 64, 0, KvDtype::kBf16).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
