// SmallMLinearRopeKv (the qkv GEMV with RoPE and the KV write in its epilogue) against (a) a CPU
// reference: the fp64 product rounded to T, rotated in fp64, and (b) the unfused path it replaces,
// SmallMLinear into a qkv buffer + RopeQkvToCache, on fresh random inputs (GPU; skips without one).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/cuda/rope_cache_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/layers/rope.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::TestSeed;

template <typename T>
double Eps() {
  return std::is_same_v<T, __nv_bfloat16> ? 0x1p-8 : 0x1p-11;
}

struct Shape {
  int64_t m, hq, hk, d, k;
  bool bias;
  GemvTuning tuning;
};

template <typename T>
void RunCase(std::mt19937& rng, const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << s.m << " hq=" << s.hq << " hk=" << s.hk << " d=" << s.d << " k=" << s.k
               << " bias=" << s.bias
               << " split=" << GemvSplit((s.hq + 2 * s.hk) * s.d / 2, s.k, s.tuning));
  KvCacheLayout layout;
  layout.num_blocks = 11;
  layout.num_layers = 3;
  layout.block_size = 16;
  layout.num_kv_heads = s.hk;
  layout.head_dim = s.d;
  const int64_t layer = 2, width = (s.hq + 2 * s.hk) * s.d;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&](int64_t n, float scale) {
    std::vector<T> v(n);
    for (T& x : v) x = cuda_test::FromF<T>(scale * dist(rng));
    return v;
  };
  const std::vector<T> a = random(s.m * s.k, 1.0f), w = random(width * s.k, 1.0f / std::sqrt(s.k)),
                       bias = random(width, 0.5f), pool_init = random(layout.TotalElems(), 1.0f);
  // Distinct random slots; token 1 skipped (-1), token 2 outside the pool.
  std::vector<int64_t> slots(layout.NumSlots());
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(s.m);
  if (s.m > 1) slots[1] = -1;
  if (s.m > 2) slots[2] = layout.NumSlots() + 3;
  std::vector<int64_t> positions(s.m);
  for (int64_t& p : positions) p = static_cast<int64_t>(rng() % 9000);
  auto inv_freq = ComputeRopeInvFreq(500000.0, s.d, RopeScaling{});
  ASSERT_TRUE(inv_freq.ok()) << inv_freq.status();

  DeviceBuffer<T> da(a), dw(w), db(bias), pool(pool_init), pool_ref(pool_init);
  DeviceBuffer<T> q(s.m * s.hq * s.d), q_ref(s.m * s.hq * s.d), qkv(s.m * width);
  DeviceBuffer<int64_t> dpos(positions), dslots(slots);
  DeviceBuffer<float> dfreq(*inv_freq);
  const T* b = s.bias ? db.get() : nullptr;
  GemvRopeKv dst;
  dst.positions = dpos.get();
  dst.slot_mapping = dslots.get();
  dst.inv_freq = dfreq.get();
  dst.head_dim = s.d;
  dst.num_q_heads = s.hq;
  dst.num_kv_heads = s.hk;
  dst.q_out = q.get();
  dst.pool = pool.get();
  dst.num_slots = layout.NumSlots();
  dst.block_size = layout.block_size;
  dst.layer_tile_offset = layout.TileOffset(0, layer, 0);
  dst.block_stride = layout.BlockElems();
  dst.kv_stride = layout.TileElems();
  absl::Status st =
      SmallMLinearRopeKv<T>(da.get(), dw.get(), b, s.m, s.k, dst, nullptr, true, s.tuning);
  ASSERT_TRUE(st.ok()) << st;
  // The unfused path with the same tuning (the same split of the width's rows as the pairs').
  GemvTuning plain = s.tuning;
  plain.split_min_warps = s.tuning.split_min_warps == 0 ? 0 : int64_t{1} << 40;
  st = SmallMLinear<T, T>(da.get(), dw.get(), b, s.m, width, s.k, qkv.get(), nullptr, false, plain);
  ASSERT_TRUE(st.ok()) << st;
  const KvDtype dtype = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
  st = RopeQkvToCache<T>(qkv.get(), width, dpos.get(), dslots.get(), s.m, dfreq.get(), s.hq,
                         q_ref.get(), DeviceKvCache{pool_ref.get(), layout, dtype}, layer, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got_q = q.ToHost(), ref_q = q_ref.ToHost();
  const std::vector<T> got_pool = pool.ToHost(), ref_pool = pool_ref.ToHost();

  // (b) the unfused path: the same values, up to one unit in the last place of T where the
  // compiler contracts the rotation's fp32 products differently.
  auto close = [&](T x, T y) {
    const double u = cuda_test::ToF(x), v = cuda_test::ToF(y);
    return std::fabs(u - v) <= 2 * Eps<T>() * std::max(std::fabs(u), std::fabs(v)) + 1e-30;
  };
  int64_t differ = 0;
  for (size_t i = 0; i < got_q.size(); ++i) {
    ASSERT_TRUE(close(got_q[i], ref_q[i])) << "q[" << i << "]";
    differ += cuda_test::ToF(got_q[i]) != cuda_test::ToF(ref_q[i]);
  }
  for (size_t i = 0; i < got_pool.size(); ++i) {
    ASSERT_TRUE(close(got_pool[i], ref_pool[i])) << "pool[" << i << "]";
    differ += cuda_test::ToF(got_pool[i]) != cuda_test::ToF(ref_pool[i]);
  }
  ::testing::Test::RecordProperty("values_differing_from_unfused", static_cast<int>(differ));

  // (a) the CPU reference.
  const int64_t half = s.d / 2;
  for (int64_t t = 0; t < s.m; ++t) {
    auto product = [&](int64_t row, double* mag) {
      double sum = s.bias ? cuda_test::ToF(bias[row]) : 0.0;
      *mag = std::fabs(sum);
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = double{cuda_test::ToF(a[t * s.k + p])} * cuda_test::ToF(w[row * s.k + p]);
        sum += x;
        *mag += std::fabs(x);
      }
      return sum;
    };
    for (int64_t h = 0; h < s.hq + 2 * s.hk; ++h) {
      const bool is_v = h >= s.hq + s.hk;
      const int64_t slot = slots[t];
      if (h >= s.hq && (slot < 0 || slot >= layout.NumSlots())) continue;
      for (int64_t i = 0; i < half; ++i) {
        double m1, m2;
        const double x1 = product(h * s.d + i, &m1), x2 = product(h * s.d + i + half, &m2);
        // The kernel's fp32 angle (one fp32 product), then sin / cos in fp64.
        const float angle_f = static_cast<float>(positions[t]) * (*inv_freq)[i];
        const double angle = angle_f;
        const double c = is_v ? 1.0 : std::cos(angle), sn = is_v ? 0.0 : std::sin(angle);
        const double want1 = x1 * c - x2 * sn, want2 = x2 * c + x1 * sn;
        // x1 / x2 summed in fp32 and rounded to T, then the rotation's own rounding; sincosf
        // within a few fp32 ulp of the exact sin / cos of the fp32 angle.
        const double e1 = Eps<T>() * std::fabs(x1) + (s.k + 2) * 0x1p-24 * m1;
        const double e2 = Eps<T>() * std::fabs(x2) + (s.k + 2) * 0x1p-24 * m2;
        const double tol_rot = e1 + e2 + 1e-5 * (std::fabs(x1) + std::fabs(x2));
        const T* at;
        if (h < s.hq) {
          at = &got_q[(t * s.hq + h) * s.d];
        } else {
          const int64_t kv = is_v ? 1 : 0, kv_head = h - s.hq - kv * s.hk;
          at = &got_pool[(slot / layout.block_size) * layout.BlockElems() +
                         layout.TileOffset(0, layer, 0) + kv * layout.TileElems() +
                         ((slot % layout.block_size) * s.hk + kv_head) * s.d];
        }
        const double g1 = cuda_test::ToF(at[i]), g2 = cuda_test::ToF(at[i + half]);
        ASSERT_LE(std::fabs(g1 - want1), tol_rot + Eps<T>() * std::fabs(want1))
            << "token " << t << " head " << h << " i " << i;
        ASSERT_LE(std::fabs(g2 - want2), tol_rot + Eps<T>() * std::fabs(want2))
            << "token " << t << " head " << h << " i " << i + half;
      }
    }
  }
  // Slots that no token owns keep their values.
  std::vector<bool> owned(layout.TotalElems(), false);
  for (int64_t t = 0; t < s.m; ++t) {
    if (slots[t] < 0 || slots[t] >= layout.NumSlots()) continue;
    for (int64_t kv = 0; kv < 2; ++kv) {
      const int64_t at = (slots[t] / layout.block_size) * layout.BlockElems() +
                         layout.TileOffset(0, layer, 0) + kv * layout.TileElems() +
                         (slots[t] % layout.block_size) * s.hk * s.d;
      std::fill(owned.begin() + at, owned.begin() + at + s.hk * s.d, true);
    }
  }
  for (size_t i = 0; i < got_pool.size(); ++i) {
    if (!owned[i]) {
      ASSERT_EQ(cuda_test::ToF(got_pool[i]), cuda_test::ToF(pool_init[i])) << i;
    }
  }
}

TEST(GemvRopeCudaTest, MatchesCpuReferenceAndTheUnfusedPath) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const GemvTuning base{}, tuned{true, int64_t{1} << 40};
  for (const GemvTuning& t : {base, tuned}) {
    // Llama-3-8B at TP=4 (8 q heads, 2 kv heads of 128, k = 4096), odd-ish small shapes.
    RunCase<__nv_bfloat16>(rng, {1, 8, 2, 128, 4096, false, t});
    RunCase<__nv_bfloat16>(rng, {3, 4, 1, 64, 1032, true, t});
    RunCase<__half>(rng, {8, 2, 2, 16, 264, true, t});
    RunCase<__half>(rng, {1, 6, 3, 32, 72, false, t});
  }
}

TEST(GemvRopeCudaTest, RejectsUnusableArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<__nv_bfloat16> a(64), w(64 * 64), q(64), pool(64);
  DeviceBuffer<int64_t> pos(1), slots(1);
  DeviceBuffer<float> freq(8);
  GemvRopeKv d;
  d.positions = pos.get();
  d.slot_mapping = slots.get();
  d.inv_freq = freq.get();
  d.head_dim = 16;
  d.num_q_heads = 2;
  d.num_kv_heads = 1;
  d.q_out = q.get();
  d.pool = pool.get();
  d.num_slots = 1;
  d.block_size = 1;
  EXPECT_TRUE(SmallMLinearRopeKv<__nv_bfloat16>(a.get(), w.get(), nullptr, 1, 16, d, nullptr).ok());
  GemvRopeKv odd = d;
  odd.head_dim = 15;
  EXPECT_FALSE(
      SmallMLinearRopeKv<__nv_bfloat16>(a.get(), w.get(), nullptr, 1, 16, odd, nullptr).ok());
  GemvRopeKv no_pool = d;
  no_pool.pool = nullptr;
  EXPECT_FALSE(
      SmallMLinearRopeKv<__nv_bfloat16>(a.get(), w.get(), nullptr, 1, 16, no_pool, nullptr).ok());
  EXPECT_FALSE(
      SmallMLinearRopeKv<__nv_bfloat16>(a.get(), w.get(), nullptr, 9, 16, d, nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tandem::kernels::cuda
