// SmallMLinearNormInRopeKv (the batch-1 qkv GEMV with the input RMSNorm in its prologue and RoPE +
// the KV write in its epilogue) against (a) the unfused path it replaces, SmallMLinearNormIn into
// a qkv buffer + RopeQkvToCache, and (b) a CPU fp64 reference (RMSNorm, product, rotation), on
// fresh random inputs (GPU; skips without one).
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
};

// Where RopeQkvToCache puts (token's slot, kv plane, kv head) in the pool.
int64_t PoolRow(const KvCacheLayout& l, int64_t layer, int64_t slot, int64_t kv, int64_t head) {
  return (slot / l.block_size) * l.BlockElems() + l.TileOffset(0, layer, kv) +
         ((slot % l.block_size) * l.num_kv_heads + head) * l.head_dim;
}

// The CPU reference of token t's output pair (head h, element i): x1 / x2 = the fp64 products of
// the fp64-normalised row with weight rows h * d + i and h * d + i + d / 2, rotated in fp64 at the
// kernel's fp32 angle (v: not rotated); `tol` bounds the kernel's roundings.
struct RefPair {
  double y1, y2, tol;
};

template <typename T>
class RopeCase {
 public:
  RopeCase(std::mt19937& rng, const Shape& s) : s_(s), width_((s.hq + 2 * s.hk) * s.d) {
    layout_.num_blocks = 11;
    layout_.num_layers = 3;
    layout_.block_size = 16;
    layout_.num_kv_heads = s.hk;
    layout_.head_dim = s.d;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    auto random = [&](int64_t n, float scale, float offset = 0.0f) {
      std::vector<T> v(n);
      for (T& x : v) x = cuda_test::FromF<T>(offset + scale * dist(rng));
      return v;
    };
    x_ = random(s.m * s.k, 2.0f);
    norm_w_ = random(s.k, 0.2f, 1.0f);
    w_ = random(width_ * s.k, 1.0f / std::sqrt(static_cast<float>(s.k)));
    bias_ = random(width_, 0.5f);
    pool_init_ = random(layout_.TotalElems(), 1.0f);
    // Distinct random slots; token 1 skipped (-1), token 2 outside the pool.
    slots_.resize(layout_.NumSlots());
    std::iota(slots_.begin(), slots_.end(), 0);
    std::shuffle(slots_.begin(), slots_.end(), rng);
    slots_.resize(s.m);
    if (s.m > 1) slots_[1] = -1;
    if (s.m > 2) slots_[2] = layout_.NumSlots() + 3;
    positions_.resize(s.m);
    for (int64_t& p : positions_) p = static_cast<int64_t>(rng() % 9000);
    auto inv_freq = ComputeRopeInvFreq(500000.0, s.d, RopeScaling{});
    EXPECT_TRUE(inv_freq.ok()) << inv_freq.status();
    if (inv_freq.ok()) inv_freq_ = *inv_freq;
  }

  RefPair Reference(int64_t t, int64_t h, int64_t i) const {
    double ss = 0.0;
    for (int64_t p = 0; p < s_.k; ++p) ss += std::pow(cuda_test::ToF(x_[t * s_.k + p]), 2);
    const double inv_rms = 1.0 / std::sqrt(ss / s_.k + kEps);
    double y[2], mag[2];
    for (int q = 0; q < 2; ++q) {
      const int64_t row = h * s_.d + i + q * (s_.d / 2);
      y[q] = s_.bias ? cuda_test::ToF(bias_[row]) : 0.0;
      mag[q] = std::fabs(y[q]);
      for (int64_t p = 0; p < s_.k; ++p) {
        const double a = cuda_test::ToF(x_[t * s_.k + p]) * inv_rms * cuda_test::ToF(norm_w_[p]);
        const double prod = a * cuda_test::ToF(w_[row * s_.k + p]);
        y[q] += prod;
        mag[q] += std::fabs(prod);
      }
    }
    const bool is_v = h >= s_.hq + s_.hk;
    const double angle = static_cast<float>(positions_[t]) * inv_freq_[i];  // the fp32 angle
    const double c = is_v ? 1.0 : std::cos(angle), sn = is_v ? 0.0 : std::sin(angle);
    // Each product: the staged row rounded to T (Eps * mag), fp32 sums, rounded to T; then the
    // rotation's fp32 arithmetic and its rounding to T (sincosf within a few fp32 ulp).
    const double e0 =
        Eps<T>() * mag[0] + Eps<T>() * std::fabs(y[0]) + (s_.k + 2) * 0x1p-24 * mag[0];
    const double e1 =
        Eps<T>() * mag[1] + Eps<T>() * std::fabs(y[1]) + (s_.k + 2) * 0x1p-24 * mag[1];
    const double y1 = y[0] * c - y[1] * sn, y2 = y[1] * c + y[0] * sn;
    const double tol = e0 + e1 + 1e-5 * (std::fabs(y[0]) + std::fabs(y[1]));
    return {y1, y2, tol};
  }

  void Run() {
    const int64_t layer = 2, m = s_.m;
    DeviceBuffer<T> dx(x_), dnw(norm_w_), dw(w_), db(bias_), pool(pool_init_), pool_ref(pool_init_);
    DeviceBuffer<T> q(m * s_.hq * s_.d), q_ref(m * s_.hq * s_.d), qkv(m * width_);
    DeviceBuffer<int64_t> dpos(positions_), dslots(slots_);
    DeviceBuffer<float> dfreq(inv_freq_);
    const T* b = s_.bias ? db.get() : nullptr;
    GemvRopeKv rope;
    rope.positions = dpos.get();
    rope.slot_mapping = dslots.get();
    rope.inv_freq = dfreq.get();
    rope.head_dim = static_cast<int>(s_.d);
    rope.num_q_heads = static_cast<int>(s_.hq);
    rope.num_kv_heads = static_cast<int>(s_.hk);
    rope.q_out = q.get();
    rope.pool = pool.get();
    rope.num_slots = layout_.NumSlots();
    rope.block_size = layout_.block_size;
    rope.layer_tile_offset = layout_.TileOffset(0, layer, 0);
    rope.block_stride = layout_.BlockElems();
    rope.kv_stride = layout_.TileElems();
    absl::Status st = SmallMLinearNormInRopeKv<T>(dx.get(), dnw.get(), kEps, dw.get(), b, m, s_.k,
                                                  rope, nullptr, /*programmatic_launch=*/true);
    ASSERT_TRUE(st.ok()) << st;
    st = SmallMLinearNormIn<T>(dx.get(), dnw.get(), kEps, dw.get(), b, m, width_, s_.k, qkv.get(),
                               nullptr);
    ASSERT_TRUE(st.ok()) << st;
    const KvDtype dtype = std::is_same_v<T, __nv_bfloat16> ? KvDtype::kBf16 : KvDtype::kFp16;
    st = RopeQkvToCache<T>(qkv.get(), width_, dpos.get(), dslots.get(), m, dfreq.get(), s_.hq,
                           q_ref.get(), DeviceKvCache{pool_ref.get(), layout_, dtype}, layer,
                           nullptr);
    ASSERT_TRUE(st.ok()) << st;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<T> got_q = q.ToHost(), got_pool = pool.ToHost();
    // (a) The unfused path, value for value (the same products and the same rotation code).
    const std::vector<T> ref_q = q_ref.ToHost(), ref_pool = pool_ref.ToHost();
    for (size_t i = 0; i < got_q.size(); ++i) {
      ASSERT_EQ(cuda_test::ToF(got_q[i]), cuda_test::ToF(ref_q[i])) << "q[" << i << "]";
    }
    for (size_t i = 0; i < got_pool.size(); ++i) {  // untouched slots included
      ASSERT_EQ(cuda_test::ToF(got_pool[i]), cuda_test::ToF(ref_pool[i])) << "pool[" << i << "]";
    }
    // (b) The CPU reference, and the pool rows no token owns unchanged.
    std::vector<bool> owned(layout_.TotalElems(), false);
    for (int64_t t = 0; t < m; ++t) {
      const int64_t slot = slots_[t];
      const bool writes_kv = slot >= 0 && slot < layout_.NumSlots();
      for (int64_t h = 0; h < s_.hq + 2 * s_.hk; ++h) {
        if (h >= s_.hq && !writes_kv) continue;
        const int64_t kv = h >= s_.hq + s_.hk ? 1 : 0, kv_head = h - s_.hq - kv * s_.hk;
        const int64_t at =
            h < s_.hq ? (t * s_.hq + h) * s_.d : PoolRow(layout_, layer, slot, kv, kv_head);
        const T* got = h < s_.hq ? &got_q[at] : &got_pool[at];
        if (h >= s_.hq) std::fill(owned.begin() + at, owned.begin() + at + s_.d, true);
        for (int64_t i = 0; i < s_.d / 2; ++i) {
          const RefPair r = Reference(t, h, i);
          ASSERT_NEAR(cuda_test::ToF(got[i]), r.y1, r.tol + Eps<T>() * std::fabs(r.y1))
              << "token " << t << " head " << h << " i " << i;
          ASSERT_NEAR(cuda_test::ToF(got[i + s_.d / 2]), r.y2, r.tol + Eps<T>() * std::fabs(r.y2))
              << "token " << t << " head " << h << " i " << i + s_.d / 2;
        }
      }
    }
    for (size_t i = 0; i < got_pool.size(); ++i) {
      if (!owned[i]) {
        ASSERT_EQ(cuda_test::ToF(got_pool[i]), cuda_test::ToF(pool_init_[i])) << i;
      }
    }
  }

 private:
  static constexpr float kEps = 1e-5f;
  const Shape s_;
  const int64_t width_;
  KvCacheLayout layout_;
  std::vector<T> x_, norm_w_, w_, bias_, pool_init_;
  std::vector<int64_t> slots_, positions_;
  std::vector<float> inv_freq_;
};

TEST(GemvRopeCudaTest, MatchesTheUnfusedPathAndCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  // Llama-3-8B (32 q / 8 kv heads of 128, k = 4096), then odd small shapes: several tokens, bias,
  // head_dim 64 / 16, fp16.
  const Shape bf16_shapes[] = {
      {1, 32, 8, 128, 4096, false}, {3, 4, 1, 64, 1032, true}, {5, 3, 1, 16, 264, true}};
  const Shape fp16_shapes[] = {{8, 2, 2, 16, 264, true}, {1, 6, 3, 32, 72, false}};
  for (const Shape& s : bf16_shapes) {
    SCOPED_TRACE(::testing::Message() << "bf16 m=" << s.m << " hq=" << s.hq << " hk=" << s.hk
                                      << " d=" << s.d << " k=" << s.k << " bias=" << s.bias);
    RopeCase<__nv_bfloat16>(rng, s).Run();
  }
  for (const Shape& s : fp16_shapes) {
    SCOPED_TRACE(::testing::Message() << "fp16 m=" << s.m << " hq=" << s.hq << " hk=" << s.hk
                                      << " d=" << s.d << " k=" << s.k << " bias=" << s.bias);
    RopeCase<__half>(rng, s).Run();
  }
}

TEST(GemvRopeCudaTest, RejectsUnusableArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<__nv_bfloat16> x(64), nw(64), w(64 * 64), q(64), pool(64);
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
  d.num_slots = 0;  // no slot: k / v not written
  d.block_size = 1;
  auto launch = [&](const GemvRopeKv& r, int64_t m) {
    return SmallMLinearNormInRopeKv<__nv_bfloat16>(x.get(), nw.get(), 1e-5f, w.get(), nullptr, m,
                                                   16, r, nullptr);
  };
  EXPECT_TRUE(launch(d, 1).ok());
  GemvRopeKv odd = d;
  odd.head_dim = 15;
  EXPECT_FALSE(launch(odd, 1).ok());
  GemvRopeKv no_pool = d;
  no_pool.pool = nullptr;
  EXPECT_FALSE(launch(no_pool, 1).ok());
  GemvRopeKv no_freq = d;
  no_freq.inv_freq = nullptr;
  EXPECT_FALSE(launch(no_freq, 1).ok());
  EXPECT_FALSE(launch(d, 9).ok());  // m > kGemvMaxM
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tandem::kernels::cuda
