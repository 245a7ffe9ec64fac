// MlaWriteLatentNormed (mla_cuda.h: kv_a_layernorm fused into the latent write) against the two
// kernels it replaces, kernels/layers/cuda's RmsNorm of the c_kv rows then MlaWriteLatent: the
// pools bit for bit (the same NaN bytes where nothing is written) on random inputs, bf16 / fp16,
// 1 / 7 / 300 tokens, kv_lora_rank 512 / 16 / 2048, page sizes 16 / 64 / 5, c_kv rows dense or
// L + Dr apart (the one-token GEMV's layout), skipped slots; with the k_pe RoPE fused in too
// (MlaLatentRope) against RmsNorm + MlaRope + MlaWriteLatent, interleaved and rotate-half. Against
// a CPU RMSNorm (fp64 sum of the T-rounded inputs) within T's rounding; k_pe copied exactly, or
// rotated (fp64 on the CPU) within T's rounding. Bad arguments refused.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/layers/cuda/layers_cuda.h"
#include "kernels/mla/mla_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

constexpr float kEps = 1e-6f;  // transformers' kv_a_layernorm eps (cuda_mla_model_proj.cc)

struct Case {
  int64_t lora, rope, tokens, block_size;
  bool gemv_layout;  // c_kv rows L + Dr apart, k_pe right after each c_kv row
};

std::vector<float> Normal(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

template <typename T>
void RunCase(const Case& c, uint32_t seed, bool with_rope) {
  const bool interleave = c.tokens % 2 == 1;
  SCOPED_TRACE(::testing::Message() << "L " << c.lora << " Dr " << c.rope << " tokens " << c.tokens
                                    << " page " << c.block_size << " gemv layout " << c.gemv_layout
                                    << " rope " << with_rope << " interleave " << interleave);
  std::mt19937 rng(seed);
  const int64_t L = c.lora, Dr = c.rope, Tn = c.tokens, D = L + Dr;
  const MlaDims dims{.num_heads = 4,
                     .qk_nope_head_dim = 16,
                     .qk_rope_head_dim = Dr,
                     .kv_lora_rank = L,
                     .v_head_dim = 16};
  const int64_t num_layers = 2, layer = 1;
  const int64_t num_blocks = (Tn + 3 + c.block_size - 1) / c.block_size + 1;
  const KvCacheLayout layout{.num_blocks = num_blocks,
                             .num_layers = num_layers,
                             .block_size = c.block_size,
                             .num_kv_heads = 1,
                             .head_dim = D,
                             .num_planes = 1};
  // Slots: a shuffled subset of the pool; every 5th token skipped (-1).
  std::vector<int64_t> all(num_blocks * c.block_size);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(all.begin(), all.begin() + Tn);
  for (int64_t t = 3; t < Tn; t += 5) slots[t] = -1;
  // c_kv with an offset and a per-row scale (so rows' RMS differ); the weight around 1.
  const int64_t stride = c.gemv_layout ? D : L;
  std::vector<float> ckv = Normal(rng, Tn * stride, 1.0f);
  for (int64_t t = 0; t < Tn; ++t) {
    const float s = 0.05f + 3.0f * static_cast<float>(t % 7);
    for (int64_t e = 0; e < stride; ++e) ckv[t * stride + e] = ckv[t * stride + e] * s + 0.1f;
  }
  std::vector<float> weight = Normal(rng, L, 0.3f);
  for (float& w : weight) w += 1.0f;
  std::vector<float> kpe_sep = Normal(rng, Tn * Dr, 1.0f);
  cuda_test::RoundTo<T>(ckv);
  cuda_test::RoundTo<T>(weight);
  cuda_test::RoundTo<T>(kpe_sep);
  std::vector<float> dense(Tn * L);  // the norm kernel's input: rows L apart
  for (int64_t t = 0; t < Tn; ++t) {
    std::copy_n(ckv.begin() + t * stride, L, dense.begin() + t * L);
  }

  DeviceBuffer<T> ckv_d(cuda_test::Convert<T>(ckv)), dense_d(cuda_test::Convert<T>(dense)),
      weight_d(cuda_test::Convert<T>(weight)), kpe_sep_d(cuda_test::Convert<T>(kpe_sep)),
      normed_d(Tn * L), pool_fused(layout.TotalElems()), pool_ref(layout.TotalElems());
  DeviceBuffer<int64_t> slots_d(slots);
  // RoPE: positions up to 4095, transformers' inv_freq, a YaRN-like attention factor.
  std::vector<int64_t> positions(Tn);
  for (int64_t& p : positions) p = static_cast<int64_t>(rng() % 4096);
  std::vector<float> inv_freq(Dr / 2);
  for (int64_t p = 0; p < Dr / 2; ++p) {
    inv_freq[p] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * p / Dr));
  }
  const float factor = 1.25f;
  DeviceBuffer<int64_t> positions_d(positions);
  DeviceBuffer<float> inv_freq_d(inv_freq);
  const MlaLatentRope rope{positions_d.get(), inv_freq_d.get(), factor, interleave};
  T* kpe = c.gemv_layout ? ckv_d.get() + L : kpe_sep_d.get();
  const int64_t kpe_stride = c.gemv_layout ? D : Dr;
  TANDEM_CUDA_CHECK(cudaMemset(pool_fused.get(), 0xff, layout.TotalElems() * sizeof(T)));
  TANDEM_CUDA_CHECK(cudaMemset(pool_ref.get(), 0xff, layout.TotalElems() * sizeof(T)));
  const KvDtype dt = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  const DeviceKvCache fused{pool_fused.get(), layout, dt}, ref{pool_ref.get(), layout, dt};

  // The fused kernel first: the reference's MlaRope rotates k_pe in place.
  const absl::Status s = MlaWriteLatentNormed<T>(ckv_d.get(), stride, weight_d.get(), kEps, kpe,
                                                 kpe_stride, slots_d.get(), Tn, dims, fused, layer,
                                                 nullptr, with_rope ? &rope : nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(RmsNorm<T>(dense_d.get(), weight_d.get(), Tn, L, kEps, normed_d.get(), nullptr).ok());
  if (with_rope) {
    ASSERT_TRUE(MlaRope<T>(positions_d.get(), Tn, inv_freq_d.get(), Dr, factor, interleave, kpe, 1,
                           kpe_stride, 0, nullptr)
                    .ok());
  }
  ASSERT_TRUE(MlaWriteLatent<T>(normed_d.get(), L, kpe, kpe_stride, slots_d.get(), Tn, dims, ref,
                                layer, nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<T> got = pool_fused.ToHost(), want = pool_ref.ToHost();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << "pool element " << i
        << " differs from RmsNorm + MlaWriteLatent: " << cuda_test::ToF(got[i]) << " vs "
        << cuda_test::ToF(want[i]);
  }

  // The CPU: RMSNorm in fp64 of the T-valued inputs, within T's rounding; k_pe exactly (or
  // rotated in fp64, within T's rounding).
  const double tol = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;
  for (int64_t t = 0; t < Tn; ++t) {
    if (slots[t] < 0) continue;
    const int64_t block = slots[t] / c.block_size, r = slots[t] % c.block_size;
    const size_t row = block * layout.BlockElems() + layout.TileOffset(0, layer, 0) + r * D;
    double ss = 0;
    for (int64_t e = 0; e < L; ++e) ss += double{dense[t * L + e]} * dense[t * L + e];
    const double inv = 1.0 / std::sqrt(ss / L + kEps);
    for (int64_t e = 0; e < L; ++e) {
      const double w = dense[t * L + e] * inv * weight[e];
      ASSERT_NEAR(cuda_test::ToF(got[row + e]), w, tol * std::fabs(w) + 1e-6)
          << "token " << t << " element " << e;
    }
    auto k_in = [&](int64_t e) {
      return double{c.gemv_layout ? ckv[t * stride + L + e] : kpe_sep[t * Dr + e]};
    };
    for (int64_t p = 0; p < Dr / 2; ++p) {
      const int64_t a = interleave ? 2 * p : p, b = interleave ? 2 * p + 1 : p + Dr / 2;
      double want_a = k_in(a), want_b = k_in(b), k_tol = 0.0;
      if (with_rope) {
        const double angle = static_cast<float>(positions[t]) * inv_freq[p];
        const double cs = std::cos(angle) * factor, sn = std::sin(angle) * factor;
        want_a = k_in(a) * cs - k_in(b) * sn;
        want_b = k_in(b) * cs + k_in(a) * sn;
        k_tol = tol * 2 * factor * (std::fabs(k_in(a)) + std::fabs(k_in(b)));
      }
      ASSERT_NEAR(cuda_test::ToF(got[row + L + a]), want_a, k_tol) << "token " << t << " k " << a;
      ASSERT_NEAR(cuda_test::ToF(got[row + L + b]), want_b, k_tol) << "token " << t << " k " << b;
    }
  }
}

TEST(MlaWriteNormCudaTest, FusedNormAndRopeMatchTheSeparateKernelsBitForBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  const uint32_t seed = cuda_test::TestSeed();
  const Case cases[] = {
      {512, 64, 1, 64, true},     // DeepSeek's batch-1 decode: the GEMV's [c_kv | k_pe] row
      {512, 64, 1, 16, false},    // dense rows
      {512, 64, 7, 16, false},    // a small batch
      {512, 64, 300, 64, false},  // a prefill chunk
      {512, 64, 7, 5, true},      // odd page size
      {16, 8, 7, 16, false},      // a tiny model's latent
      {2048, 64, 7, 16, false},   // the widest row the fused kernel takes
  };
  for (const Case& c : cases) {
    for (const bool rope : {false, true}) {
      RunCase<__nv_bfloat16>(c, seed, rope);
      RunCase<__half>(c, seed + 1, rope);
    }
  }
}

TEST(MlaWriteNormCudaTest, RefusesBadArguments) {
  const MlaDims dims{.num_heads = 4,
                     .qk_nope_head_dim = 16,
                     .qk_rope_head_dim = 64,
                     .kv_lora_rank = 512,
                     .v_head_dim = 16};
  // The host predicate the model checks (CudaMlaModel::Attention), GPU or not.
  MlaDims wide = dims, odd = dims;
  wide.kv_lora_rank = 4096;  // past the one-vector-per-thread row
  odd.kv_lora_rank = 500;    // not a multiple of 8
  EXPECT_TRUE(MlaWriteLatentNormedSupported(dims));
  EXPECT_FALSE(MlaWriteLatentNormedSupported(wide));
  EXPECT_FALSE(MlaWriteLatentNormedSupported(odd));
  TANDEM_SKIP_WITHOUT_GPU();
  const KvCacheLayout layout{.num_blocks = 2,
                             .num_layers = 1,
                             .block_size = 16,
                             .num_kv_heads = 1,
                             .head_dim = 576,
                             .num_planes = 1};
  DeviceBuffer<__nv_bfloat16> pool(layout.TotalElems()), x(2 * 576), w(512);
  DeviceBuffer<int64_t> slots(std::vector<int64_t>{0, 1});
  const DeviceKvCache cache{pool.get(), layout, KvDtype::kBf16};
  auto call = [&](const MlaDims& d, int64_t stride, const __nv_bfloat16* c, const DeviceKvCache& k,
                  float eps = kEps) {
    return MlaWriteLatentNormed<__nv_bfloat16>(c, stride, w.get(), eps, x.get(), 576, slots.get(),
                                               2, d, k, 0, nullptr);
  };
  EXPECT_TRUE(call(dims, 512, x.get(), cache).ok());
  EXPECT_FALSE(call(dims, 516, x.get(), cache).ok());      // stride not a multiple of 8
  EXPECT_FALSE(call(dims, 256, x.get(), cache).ok());      // stride < L
  EXPECT_FALSE(call(dims, 512, x.get() + 4, cache).ok());  // c_kv not 16-byte aligned
  EXPECT_FALSE(call(dims, 512, x.get(), cache, -1.0f).ok());
  EXPECT_FALSE(call(dims, 512, nullptr, cache).ok());
  const MlaLatentRope no_positions{nullptr, nullptr, 1.0f, false};
  EXPECT_FALSE(MlaWriteLatentNormed<__nv_bfloat16>(x.get(), 512, w.get(), kEps, x.get(), 576,
                                                   slots.get(), 2, dims, cache, 0, nullptr,
                                                   &no_positions)
                   .ok());
  // An fp16 pool for bf16 rows, and an FP8 pool (RmsNorm then MlaWriteLatentFp8 instead).
  EXPECT_FALSE(call(dims, 512, x.get(), DeviceKvCache{pool.get(), layout, KvDtype::kFp16}).ok());
  EXPECT_FALSE(call(dims, 512, x.get(), DeviceKvCache{pool.get(), layout, KvDtype::kFp8E4m3}).ok());
  // kv_lora_rank past the one-vector-per-thread row (the pool sized to match).
  KvCacheLayout wide_layout = layout;
  wide_layout.head_dim = 4096 + 64;
  DeviceBuffer<__nv_bfloat16> wide_pool(wide_layout.TotalElems()), wide_x(4096);
  EXPECT_FALSE(
      call(wide, 4096, wide_x.get(), DeviceKvCache{wide_pool.get(), wide_layout, KvDtype::kBf16})
          .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
