// Fp8W16GemvNormInRopeKv (fp8_w8a16_gemv_cuda.h: the batch-1 W8A16 qkv GEMV with the input
// RMSNorm in its prologue and RoPE + the paged KV write in its epilogue) on fresh random codes,
// per-row or per-128-column-group scales, activations, norm weights, biases and pools:
// (a) bit for bit against the unfused chain it replaces, Fp8W16GemvNormIn (kTensorCore) into a
//     qkv buffer + RopeQkvToCache (q, and the whole pool: written slots and untouched ones), for
//     kTensorCore and kAuto, early weight loads on and off;
// (b) against a CPU fp64 reference (RMSNorm, the dequantized e4m3 weight times the normalised
//     row, bias, rotation at the kernel's fp32 angle, the slot's pool address);
// at Llama-3-8B's qkv (32 q / 8 kv heads of 128, k = 4096), Llama-3-70B's at TP = 1 / 2 (64 / 8,
// 32 / 4 heads, k = 8192) and small odd shapes (head_dim 32 / 64, k = 272 / 1040 with a partial
// scale group), several positions (0, 1, 8191, random) and slots (random, -1, past the pool);
// refusals (GPU; skips without one). The pool holds bf16, and again fp8 e4m3 codes with one scale
// per tensor (GemvRopeKv::k_scale / v_scale): (c) the codes RopeQkvToCache writes into an fp8
// pool from the unfused chain's qkv, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/attention/cuda/rope_cache_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/layers/rope.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_test::RandomE4m3Codes;

constexpr float kEps = 1e-5f;
constexpr int64_t kLayer = 2;

struct Shape {
  const char* name;
  int64_t hq, hk, d, k;
  bool bias, grouped;
};

float F(bf16 x) { return __bfloat162float(x); }

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<float> RandomScales(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> scales(n);
  for (float& v : scales) v = std::exp2(log_scale(rng));
  return scales;
}

std::vector<uint8_t> RandomBytes(std::mt19937& rng, int64_t n) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

KvCacheLayout PoolLayout(const Shape& s) {
  KvCacheLayout l;
  l.num_blocks = 13;
  l.num_layers = 3;
  l.block_size = 16;
  l.num_kv_heads = s.hk;
  l.head_dim = s.d;
  return l;
}

std::vector<float> InvFreq(int64_t d) {
  auto inv_freq = ComputeRopeInvFreq(500000.0, d, RopeScaling{});
  EXPECT_TRUE(inv_freq.ok()) << inv_freq.status();
  return inv_freq.ok() ? *inv_freq : std::vector<float>(d / 2, 0.0f);
}

// One shape's random weight, inputs and pool (host and device); Run checks one token at
// (position, slot).
class RopeCase {
 public:
  RopeCase(std::mt19937& rng, const Shape& s)
      : s_(s),
        width_((s.hq + 2 * s.hk) * s.d),
        grid_{width_, s.k, 1, s.grouped ? kFp8W16ScaleGroupCols : s.k},
        layout_(PoolLayout(s)),
        codes_(RandomE4m3Codes(rng, width_ * s.k)),
        scales_(RandomScales(rng, grid_.NumScales())),
        inv_freq_(InvFreq(s.d)),
        x_(RandomBf16(rng, s.k, 2.0f)),
        norm_w_(RandomBf16(rng, s.k, 1.0f)),
        bias_(RandomBf16(rng, width_, 0.5f)),
        pool_init_(RandomBf16(rng, layout_.TotalElems(), 1.0f)),
        pool8_init_(RandomBytes(rng, layout_.TotalElems())),
        d_codes_(codes_),
        d_scales_(scales_),
        dfreq_(inv_freq_),
        dx_(x_),
        dnorm_(norm_w_),
        dbias_(bias_) {
    w_deq_.resize(width_ * s.k);
    const Fp8WeightView view{codes_.data(), scales_.data(), grid_, Fp8ActivationScheme::kNone,
                             0.0f};
    cpu::DequantizeFp8Weight(view, 0, width_, w_deq_.data());
    // The normalised row the kernel stages is RmsNorm<bf16>'s, bit for bit (gemv_norm_stage.cuh):
    // taken from it, after a check against fp64 (one bf16 ulp: rsqrtf and fp32 sums may round
    // an element the other way), so the products' bound below needs no RMSNorm term.
    DeviceBuffer<bf16> normed(s.k);
    EXPECT_TRUE(RmsNorm<bf16>(dx_.get(), dnorm_.get(), 1, s.k, kEps, normed.get(), nullptr).ok());
    const std::vector<bf16> staged = normed.ToHost();
    double ss = 0.0;
    for (const bf16 v : x_) ss += double{F(v)} * F(v);
    const double inv_rms = 1.0 / std::sqrt(ss / s.k + kEps);
    normed_.resize(s.k);
    for (int64_t p = 0; p < s.k; ++p) {
      const double want = F(x_[p]) * inv_rms * F(norm_w_[p]);
      normed_[p] = F(staged[p]);
      EXPECT_NEAR(normed_[p], want, 0x1p-7 * std::fabs(want) + 1e-30) << "RmsNorm element " << p;
    }
  }

  int64_t NumSlots() const { return layout_.NumSlots(); }

  void Run(int64_t position, int64_t slot) {
    SCOPED_TRACE(::testing::Message() << "position " << position << " slot " << slot);
    const std::vector<int64_t> pos{position}, slots{slot};
    DeviceBuffer<int64_t> dpos(pos), dslot(slots);
    DeviceBuffer<bf16> qkv(width_), q_ref(s_.hq * s_.d), pool_ref(pool_init_);
    const bf16* b = s_.bias ? dbias_.get() : nullptr;
    // The unfused chain under each product math the fold takes: kTensorCore's, and the wide
    // mapping's (kTensorCoreWide; kAutoWaves takes it for scales constant along k).
    const auto unfused = [&](Fp8W16Math product, DeviceBuffer<bf16>& q_out,
                             DeviceBuffer<bf16>& pool_out) {
      ASSERT_TRUE(Fp8W16GemvNormIn(dx_.get(), dnorm_.get(), kEps, weight(), b, 1, qkv.get(),
                                   nullptr, true, true, product)
                      .ok());
      const absl::Status st = RopeQkvToCache<bf16>(
          qkv.get(), width_, dpos.get(), dslot.get(), 1, dfreq_.get(), s_.hq, q_out.get(),
          DeviceKvCache{pool_out.get(), layout_, KvDtype::kBf16}, kLayer, nullptr);
      ASSERT_TRUE(st.ok()) << st;
    };
    unfused(Fp8W16Math::kTensorCore, q_ref, pool_ref);
    DeviceBuffer<bf16> q_wide(s_.hq * s_.d), pool_wide(pool_init_);
    unfused(Fp8W16Math::kTensorCoreWide, q_wide, pool_wide);
    const std::vector<bf16> want_q = q_ref.ToHost(), want_pool = pool_ref.ToHost();
    const std::vector<bf16> wide_q = q_wide.ToHost(), wide_pool = pool_wide.ToHost();
    for (const Fp8W16Math math : {Fp8W16Math::kTensorCore, Fp8W16Math::kAuto,
                                  Fp8W16Math::kTensorCoreWide, Fp8W16Math::kAutoWaves}) {
      const bool wide =
          math == Fp8W16Math::kTensorCoreWide || (math == Fp8W16Math::kAutoWaves && !s_.grouped);
      for (const bool early : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "math=" << static_cast<int>(math) << " early=" << early);
        std::vector<bf16> q, pool;
        RunFused(dpos.get(), dslot.get(), math, early, &q, &pool);
        EXPECT_TRUE(SameBits(q, wide ? wide_q : want_q))
            << "q != Fp8W16GemvNormIn + RopeQkvToCache";
        EXPECT_TRUE(SameBits(pool, wide ? wide_pool : want_pool))
            << "pool != Fp8W16GemvNormIn + RopeQkvToCache";
        if (early) ExpectNearReference(position, slot, q, pool);
      }
    }
    // (c) an fp8 pool, one scale per tensor: the codes RopeQkvToCache stores from that qkv.
    const std::vector<float> kv_scales{0.0371f, 0.0113f};
    DeviceBuffer<float> dscales(kv_scales);
    DeviceBuffer<uint8_t> pool8_ref(pool8_init_);
    DeviceKvCache cache8{pool8_ref.get(), layout_, KvDtype::kFp8E4m3, dscales.get(),
                         dscales.get() + 1};
    const absl::Status st8 =
        RopeQkvToCache<bf16>(qkv.get(), width_, dpos.get(), dslot.get(), 1, dfreq_.get(), s_.hq,
                             q_ref.get(), cache8, kLayer, nullptr);
    ASSERT_TRUE(st8.ok()) << st8;
    const std::vector<uint8_t> want_pool8 = pool8_ref.ToHost();
    if (slot >= 0 && slot < NumSlots()) {
      EXPECT_NE(want_pool8, pool8_init_) << "the reference wrote nothing";
    }
    for (const Fp8W16Math math : {Fp8W16Math::kTensorCore, Fp8W16Math::kAuto}) {
      SCOPED_TRACE(::testing::Message() << "fp8 pool, math=" << static_cast<int>(math));
      DeviceBuffer<bf16> q(s_.hq * s_.d);
      DeviceBuffer<uint8_t> pool8(pool8_init_);
      GemvRopeKv rope = Rope(dpos.get(), dslot.get(), q.get(), pool8.get());
      rope.k_scale = dscales.get();
      rope.v_scale = dscales.get() + 1;
      const absl::Status st = Fp8W16GemvNormInRopeKv(dx_.get(), dnorm_.get(), kEps, weight(), b, 1,
                                                     rope, nullptr, true, true, math);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(SameBits(q.ToHost(), want_q)) << "q with an fp8 pool";
      EXPECT_TRUE(SameBits(pool8.ToHost(), want_pool8)) << "fp8 pool != RopeQkvToCache's codes";
    }
  }

 private:
  Fp8DeviceWeight weight() const { return {d_codes_.get(), d_scales_.get(), grid_}; }

  GemvRopeKv Rope(const int64_t* pos, const int64_t* slot, void* q, void* pool) const {
    GemvRopeKv rope;
    rope.positions = pos;
    rope.slot_mapping = slot;
    rope.inv_freq = dfreq_.get();
    rope.head_dim = static_cast<int>(s_.d);
    rope.num_q_heads = static_cast<int>(s_.hq);
    rope.num_kv_heads = static_cast<int>(s_.hk);
    rope.q_out = q;
    rope.pool = pool;
    rope.num_slots = layout_.NumSlots();
    rope.block_size = layout_.block_size;
    rope.layer_tile_offset = layout_.TileOffset(0, kLayer, 0);
    rope.block_stride = layout_.BlockElems();
    rope.kv_stride = layout_.TileElems();
    return rope;
  }

  void RunFused(const int64_t* pos, const int64_t* slot, Fp8W16Math math, bool early,
                std::vector<bf16>* q_host, std::vector<bf16>* pool_host) {
    DeviceBuffer<bf16> q(s_.hq * s_.d), pool(pool_init_);
    cudaMemset(q.get(), 0xFF, q.size() * sizeof(bf16));  // NaN: an unwritten element fails
    const GemvRopeKv rope = Rope(pos, slot, q.get(), pool.get());
    ASSERT_TRUE(Fp8W16GemvNormInRopeKvSupported(dx_.get(), dnorm_.get(), weight(), 1, rope, math));
    const absl::Status st = Fp8W16GemvNormInRopeKv(dx_.get(), dnorm_.get(), kEps, weight(),
                                                   s_.bias ? dbias_.get() : nullptr, 1, rope,
                                                   nullptr, true, early, math);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    *q_host = q.ToHost();
    *pool_host = pool.ToHost();
  }

  // Row `row`'s product in fp64 over the staged row and its error bound: fp32 summation (the
  // bound of fp8_w8a16_test_util.h), 2^-25 |w| per f16-subnormal activation, and the product's
  // bf16 rounding.
  void Product(int64_t row, double* y, double* tol) const {
    double v = s_.bias ? F(bias_[row]) : 0.0, mag = std::fabs(v), wsum = 0.0;
    for (int64_t p = 0; p < s_.k; ++p) {
      const double w = w_deq_[row * s_.k + p];
      v += normed_[p] * w;
      mag += std::fabs(normed_[p] * w);
      wsum += std::fabs(w);
    }
    *y = v;
    *tol = 4e-6 * std::sqrt(double(s_.k)) * mag + 0x1p-8 * std::fabs(v) + 0x1p-25 * wsum;
  }

  // q and the token's k / v pool rows against the fp64 reference; the pool's other rows as
  // initialised.
  void ExpectNearReference(int64_t position, int64_t slot, const std::vector<bf16>& q,
                           const std::vector<bf16>& pool) const {
    const bool writes_kv = slot >= 0 && slot < layout_.NumSlots();
    std::vector<bool> owned(pool.size(), false);
    const int64_t half = s_.d / 2;
    for (int64_t h = 0; h < s_.hq + 2 * s_.hk; ++h) {
      if (h >= s_.hq && !writes_kv) continue;
      const bool is_v = h >= s_.hq + s_.hk;
      const int64_t kv_head = h - s_.hq - (is_v ? s_.hk : 0);
      const int64_t at = h < s_.hq ? h * s_.d
                                   : (slot / layout_.block_size) * layout_.BlockElems() +
                                         layout_.TileOffset(0, kLayer, is_v ? 1 : 0) +
                                         ((slot % layout_.block_size) * s_.hk + kv_head) * s_.d;
      const bf16* got = h < s_.hq ? &q[at] : &pool[at];
      if (h >= s_.hq) std::fill(owned.begin() + at, owned.begin() + at + s_.d, true);
      for (int64_t i = 0; i < half; ++i) {
        double y1, y2, t1, t2;
        Product(h * s_.d + i, &y1, &t1);
        Product(h * s_.d + i + half, &y2, &t2);
        const double angle = static_cast<float>(position) * inv_freq_[i];  // the fp32 angle
        const double c = h >= s_.hq + s_.hk ? 1.0 : std::cos(angle);
        const double sn = h >= s_.hq + s_.hk ? 0.0 : std::sin(angle);
        const double o1 = y1 * c - y2 * sn, o2 = y2 * c + y1 * sn;
        const double tol = t1 + t2 + 1e-5 * (std::fabs(y1) + std::fabs(y2));
        ASSERT_NEAR(F(got[i]), o1, tol + 0x1p-8 * std::fabs(o1)) << "head " << h << " i " << i;
        ASSERT_NEAR(F(got[i + half]), o2, tol + 0x1p-8 * std::fabs(o2))
            << "head " << h << " i " << i + half;
      }
    }
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!owned[i]) {
        ASSERT_EQ(std::memcmp(&pool[i], &pool_init_[i], sizeof(bf16)), 0) << i;
      }
    }
  }

  const Shape s_;
  const int64_t width_;
  const Fp8ScaleGrid grid_;
  const KvCacheLayout layout_;
  const std::vector<uint8_t> codes_;
  const std::vector<float> scales_, inv_freq_;
  const std::vector<bf16> x_, norm_w_, bias_, pool_init_;
  const std::vector<uint8_t> pool8_init_;  // an fp8 pool's initial codes
  const DeviceBuffer<uint8_t> d_codes_;
  const DeviceBuffer<float> d_scales_, dfreq_;
  const DeviceBuffer<bf16> dx_, dnorm_, dbias_;
  std::vector<float> w_deq_;
  std::vector<double> normed_;  // RmsNorm<bf16>'s row, the kernel's staged activations
};

TEST(Fp8W16RopeCudaTest, EqualsTheUnfusedChainAndMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const Shape shapes[] = {
      {"8B qkv", 32, 8, 128, 4096, false, false},
      {"70B qkv TP=1", 64, 8, 128, 8192, false, false},
      {"70B qkv TP=2", 32, 4, 128, 8192, true, false},
      {"8B qkv grouped", 32, 8, 128, 4096, true, true},
      {"small d=64", 4, 1, 64, 1040, true, false},
      {"small d=32 grouped", 3, 2, 32, 272, true, true},  // a 16-column last scale group
  };
  for (const Shape& s : shapes) {
    SCOPED_TRACE(s.name);
    RopeCase c(rng, s);
    const int64_t random_slot = static_cast<int64_t>(rng() % c.NumSlots());
    const int64_t random_pos = static_cast<int64_t>(rng() % 8192);
    c.Run(0, random_slot);
    c.Run(1, static_cast<int64_t>(rng() % c.NumSlots()));
    c.Run(8191, c.NumSlots() - 1);    // the pool's last slot
    c.Run(random_pos, -1);            // no KV write: q only
    c.Run(random_pos, c.NumSlots());  // past the pool: q only
  }
}

TEST(Fp8W16RopeCudaTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  constexpr int64_t kHq = 2, kHk = 1, kD = 32, kK = 64, kWidth = (kHq + 2 * kHk) * kD;
  DeviceBuffer<uint8_t> codes(kWidth * kK);
  DeviceBuffer<float> scales(kWidth);
  DeviceBuffer<bf16> x(kK), nw(kK), q(kHq * kD), pool(64 * kD);
  DeviceBuffer<int64_t> pos(1), slots(1);
  DeviceBuffer<float> freq(kD / 2);
  const Fp8DeviceWeight w{codes.get(), scales.get(), {kWidth, kK, 1, kK}};
  GemvRopeKv d;
  d.positions = pos.get();
  d.slot_mapping = slots.get();
  d.inv_freq = freq.get();
  d.head_dim = kD;
  d.num_q_heads = kHq;
  d.num_kv_heads = kHk;
  d.q_out = q.get();
  d.pool = pool.get();
  d.num_slots = 0;  // no slot: k / v not written
  d.block_size = 1;
  auto launch = [&](const GemvRopeKv& r, const Fp8DeviceWeight& wt, int64_t m, Fp8W16Math math) {
    const bool supported = Fp8W16GemvNormInRopeKvSupported(x.get(), nw.get(), wt, m, r, math);
    const absl::Status st = Fp8W16GemvNormInRopeKv(x.get(), nw.get(), kEps, wt, nullptr, m, r,
                                                   nullptr, false, false, math);
    EXPECT_EQ(supported, st.ok()) << st;
    return st.ok();
  };
  EXPECT_TRUE(launch(d, w, 1, Fp8W16Math::kAuto));
  EXPECT_TRUE(launch(d, w, 1, Fp8W16Math::kTensorCore));
  for (const Fp8W16Math math :
       {Fp8W16Math::kFp32Fma, Fp8W16Math::kRing, Fp8W16Math::kRing2, Fp8W16Math::kRingHalf}) {
    EXPECT_FALSE(launch(d, w, 1, math)) << "math=" << static_cast<int>(math);
  }
  EXPECT_FALSE(launch(d, w, 2, Fp8W16Math::kAuto));  // m
  GemvRopeKv d16 = d;                                // head_dim 16: a tile needs 16 pairs
  d16.head_dim = 16;
  EXPECT_FALSE(launch(d16, {codes.get(), scales.get(), {(kHq + 2 * kHk) * 16, kK, 1, kK}}, 1,
                      Fp8W16Math::kAuto));
  GemvRopeKv more_heads = d;  // the weight's rows are not the heads'
  more_heads.num_q_heads = 3;
  EXPECT_FALSE(launch(more_heads, w, 1, Fp8W16Math::kAuto));
  GemvRopeKv no_pool = d;
  no_pool.pool = nullptr;
  EXPECT_FALSE(launch(no_pool, w, 1, Fp8W16Math::kAuto));
  GemvRopeKv no_freq = d;
  no_freq.inv_freq = nullptr;
  EXPECT_FALSE(launch(no_freq, w, 1, Fp8W16Math::kAuto));
  EXPECT_FALSE(Fp8W16GemvNormInRopeKv(x.get(), nullptr, kEps, w, nullptr, 1, d, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem::kernels::cuda
