// The dispatch kernels (moe_dispatch_cuda.h) against the host reference (moe_dispatch.h) on fresh
// random routings: the plan (two chunks of the plan block, any rank table, an idle rank with no
// tokens), the packed rows bit for bit, the unpacked routing, and the combine (with and without
// a gated shared expert, out aliasing x) against an fp32 host sum; the fixed-capacity layout of
// graph steps (padding rows, an idle rank) against MoeDispatchFixedRows.
#include "kernels/moe/moe_dispatch_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_dispatch.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::FromF;
using cuda_test::ToF;
using bf16 = __nv_bfloat16;

std::vector<float> Random(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Any expert -> rank table (some ranks may hold none) and each expert's slot on its rank.
void RandomPlacement(std::mt19937& rng, int64_t E, int n, std::vector<int32_t>* rank_of,
                     std::vector<int32_t>* slot) {
  std::vector<int32_t> held(n, 0);
  rank_of->resize(E);
  slot->resize(E);
  for (int64_t e = 0; e < E; ++e) {
    (*rank_of)[e] = static_cast<int32_t>(rng() % n);
    (*slot)[e] = held[(*rank_of)[e]]++;
  }
}

struct Case {
  int64_t T, E, k, H;
  int n;
};

class MoeDispatchCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoeDispatchCudaTest, PlanPackUnpackCombineMatchTheHost) {
  TANDEM_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int64_t T = c.T, E = c.E, k = c.k, H = c.H, W = MoeDispatchRowWidth(H, k);
  const int n = c.n;
  std::mt19937 rng(cuda_test::TestSeed());
  std::vector<int32_t> rank_of, slot;
  RandomPlacement(rng, E, n, &rank_of, &slot);
  MoeRouting routing;
  const std::vector<float> logits = Random(rng, T * E, 3.0f);
  ASSERT_TRUE(kernels::cpu::SoftmaxTopK(logits.data(), T, {E, k, true}, &routing).ok());
  absl::StatusOr<kernels::MoeDispatchPlan> want =
      PlanMoeDispatch(routing.expert_ids, k, rank_of, n);
  ASSERT_TRUE(want.ok()) << want.status();

  DeviceBuffer<int32_t> ids(routing.expert_ids.size() + 1), ranks(rank_of), slots(slot);
  DeviceBuffer<float> weights(routing.weights.size() + 1);
  cudaMemcpy(ids.get(), routing.expert_ids.data(), T * k * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(weights.get(), routing.weights.data(), T * k * 4, cudaMemcpyHostToDevice);
  DeviceBuffer<int32_t> pos(T * n + 1), counts(n);
  DeviceBuffer<int64_t> load(std::vector<int64_t>(E, 5));
  ASSERT_TRUE(
      MoePlanDispatch(ids.get(), T, k, ranks.get(), n, pos.get(), counts.get(), load.get(), nullptr)
          .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> got_pos = pos.ToHost();
  got_pos.resize(T * n);
  EXPECT_EQ(got_pos, want->pos);
  EXPECT_EQ(counts.ToHost(), want->counts);
  std::vector<int64_t> want_load(E, 5);
  for (int32_t e : routing.expert_ids) ++want_load[e];
  EXPECT_EQ(load.ToHost(), want_load);

  // Pack: every row bit for bit (x, slots, weights).
  int64_t rows = 0;
  std::vector<int64_t> offset(n);
  for (int d = 0; d < n; ++d) {
    offset[d] = rows;
    rows += want->counts[d];
  }
  const std::vector<float> xf = Random(rng, T * H, 1.0f);
  DeviceBuffer<bf16> x(cuda_test::Convert<bf16>(xf)), send(rows * W + 8);
  ASSERT_TRUE(MoeDispatchPack<bf16>(x.get(), T, H, ids.get(), weights.get(), k, ranks.get(),
                                    slots.get(), pos.get(), counts.get(), n, send.get(), nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> sent = send.ToHost();
  std::vector<int32_t> meta_slot(k);
  std::vector<float> meta_w(k);
  for (int64_t t = 0; t < T; ++t) {
    for (int d = 0; d < n; ++d) {
      const int32_t p = want->pos[t * n + d];
      if (p < 0) continue;
      const bf16* row = sent.data() + (offset[d] + p) * W;
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(ToF(row[h]), ToF(FromF<bf16>(xf[t * H + h]))) << "t " << t << " d " << d;
      }
      MoeDispatchRowMeta(routing.expert_ids, routing.weights, t, k, d, rank_of, slot,
                         meta_slot.data(), meta_w.data());
      std::vector<int32_t> s(k);
      std::vector<float> w(k);
      std::memcpy(s.data(), row + H, k * 4);
      std::memcpy(w.data(), reinterpret_cast<const char*>(row + H) + 4 * k, k * 4);
      EXPECT_EQ(s, meta_slot) << "t " << t << " d " << d;
      EXPECT_EQ(w, meta_w) << "t " << t << " d " << d;
    }
  }

  // Unpack the same rows as if received: -1 choices on the zero slot with weight 0.
  const int32_t zero = 1000;
  DeviceBuffer<bf16> ux(rows * H + 8);
  DeviceBuffer<int32_t> uids(rows * k + 1);
  DeviceBuffer<float> uw(rows * k + 1);
  ASSERT_TRUE(
      MoeDispatchUnpack<bf16>(send.get(), rows, H, k, zero, ux.get(), uids.get(), uw.get(), nullptr)
          .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> gx = ux.ToHost();
  const std::vector<int32_t> gids = uids.ToHost();
  const std::vector<float> gw = uw.ToHost();
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* row = sent.data() + r * W;
    for (int64_t h = 0; h < H; ++h) ASSERT_EQ(ToF(gx[r * H + h]), ToF(row[h])) << "row " << r;
    int32_t s[64];
    float w[64];
    std::memcpy(s, row + H, k * 4);
    std::memcpy(w, reinterpret_cast<const char*>(row + H) + 4 * k, k * 4);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(gids[r * k + j], s[j] >= 0 ? s[j] : zero) << "row " << r << " j " << j;
      EXPECT_EQ(gw[r * k + j], s[j] >= 0 ? w[j] : 0.0f) << "row " << r << " j " << j;
    }
  }

  // Combine: random returned rows, summed in rank order, + the shared expert (gated or not).
  std::vector<float> backf = Random(rng, rows * H, 1.0f), shf = Random(rng, T * H, 1.0f),
                     gatef = Random(rng, H, 0.2f);
  cuda_test::RoundTo<bf16>(backf);
  cuda_test::RoundTo<bf16>(shf);
  cuda_test::RoundTo<bf16>(gatef);
  DeviceBuffer<bf16> back(cuda_test::Convert<bf16>(backf)), sh(cuda_test::Convert<bf16>(shf)),
      gate(cuda_test::Convert<bf16>(gatef));
  for (int gated = 0; gated < 2; ++gated) {
    DeviceBuffer<bf16> io(cuda_test::Convert<bf16>(xf));  // x, overwritten by out
    ASSERT_TRUE(MoeDispatchCombine<bf16>(back.get(), pos.get(), counts.get(), n, T, H, sh.get(),
                                         gated ? gate.get() : nullptr, io.get(), io.get(), nullptr)
                    .ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> out = io.ToHost();
    for (int64_t t = 0; t < T; ++t) {
      float g = 1.0f;
      if (gated) {
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += ToF(FromF<bf16>(xf[t * H + h])) * gatef[h];
        g = static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
      }
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int d = 0; d < n; ++d) {
          const int32_t p = want->pos[t * n + d];
          if (p >= 0) acc += backf[(offset[d] + p) * H + h];
        }
        acc = std::fma(g, shf[t * H + h], acc);
        const float got = ToF(out[t * H + h]);
        ASSERT_NEAR(got, acc, 1e-2f * std::max(1.0f, std::fabs(acc)))
            << "gated " << gated << " t " << t << " h " << h;
      }
    }
  }
}

// The fixed layout of CUDA graph steps (capacity C >= T): each rank's rows at d * C in plan
// order, the rest padding (x zero, slots -1, weights 0) over a buffer of garbage, bit for bit
// against MoeDispatchFixedRows; the combine reading rank d's rows from d * C. T = 0 (an idle
// rank) still sends C padding rows to each rank.
TEST_P(MoeDispatchCudaTest, FixedCapacityPackAndCombineMatchTheHost) {
  TANDEM_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int64_t E = c.E, k = c.k, H = c.H, W = MoeDispatchRowWidth(H, k);
  const int n = c.n;
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  std::vector<int32_t> rank_of, slot;
  RandomPlacement(rng, E, n, &rank_of, &slot);
  for (const int64_t T : {c.T, int64_t{0}}) {
    const int64_t C = T + 3;
    MoeRouting routing;
    const std::vector<float> logits = Random(rng, T * E, 3.0f);
    if (T > 0) {
      ASSERT_TRUE(kernels::cpu::SoftmaxTopK(logits.data(), T, {E, k, true}, &routing).ok());
    }
    absl::StatusOr<kernels::MoeDispatchPlan> plan =
        PlanMoeDispatch(routing.expert_ids, k, rank_of, n);
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<std::vector<int32_t>> fixed = MoeDispatchFixedRows(*plan, C);
    ASSERT_TRUE(fixed.ok()) << fixed.status();
    DeviceBuffer<int32_t> ids(routing.expert_ids.size() + 1), ranks(rank_of), slots(slot);
    DeviceBuffer<float> weights(routing.weights.size() + 1);
    cudaMemcpy(ids.get(), routing.expert_ids.data(), T * k * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(weights.get(), routing.weights.data(), T * k * 4, cudaMemcpyHostToDevice);
    DeviceBuffer<int32_t> pos(T * n + 1), counts(n);
    ASSERT_TRUE(
        MoePlanDispatch(ids.get(), T, k, ranks.get(), n, pos.get(), counts.get(), nullptr, nullptr)
            .ok());
    const std::vector<float> xf = Random(rng, T * H, 1.0f);
    DeviceBuffer<bf16> x(cuda_test::Convert<bf16>(xf.empty() ? std::vector<float>(8) : xf)),
        send(n * C * W);
    TANDEM_CUDA_CHECK(cudaMemset(send.get(), 0xff, n * C * W * 2));  // NaN bits: padding rewrites
    ASSERT_TRUE(MoeDispatchPack<bf16>(x.get(), T, H, ids.get(), weights.get(), k, ranks.get(),
                                      slots.get(), pos.get(), counts.get(), n, send.get(), nullptr,
                                      C)
                    .ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> sent = send.ToHost();
    std::vector<int32_t> want_s(k), got_s(k);
    std::vector<float> want_w(k), got_w(k);
    for (int64_t r = 0; r < n * C; ++r) {
      const int64_t t = (*fixed)[r];
      const bf16* row = sent.data() + r * W;
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(ToF(row[h]), t >= 0 ? ToF(FromF<bf16>(xf[t * H + h])) : 0.0f) << "row " << r;
      }
      std::fill(want_s.begin(), want_s.end(), -1);
      std::fill(want_w.begin(), want_w.end(), 0.0f);
      if (t >= 0) {
        MoeDispatchRowMeta(routing.expert_ids, routing.weights, t, k, static_cast<int>(r / C),
                           rank_of, slot, want_s.data(), want_w.data());
      }
      std::memcpy(got_s.data(), row + H, k * 4);
      std::memcpy(got_w.data(), reinterpret_cast<const char*>(row + H) + 4 * k, k * 4);
      EXPECT_EQ(got_s, want_s) << "row " << r;
      EXPECT_EQ(got_w, want_w) << "row " << r;
    }
    if (T == 0) continue;
    std::vector<float> backf = Random(rng, n * C * H, 1.0f);
    cuda_test::RoundTo<bf16>(backf);
    DeviceBuffer<bf16> back(cuda_test::Convert<bf16>(backf)), out(T * H);
    ASSERT_TRUE(MoeDispatchCombine<bf16>(back.get(), pos.get(), counts.get(), n, T, H, nullptr,
                                         nullptr, x.get(), out.get(), nullptr, C)
                    .ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> got = out.ToHost();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int d = 0; d < n; ++d) {
          const int32_t p = plan->pos[t * n + d];
          if (p >= 0) acc += backf[(d * C + p) * H + h];
        }
        ASSERT_NEAR(ToF(got[t * H + h]), acc, 1e-2f * std::max(1.0f, std::fabs(acc)))
            << "t " << t << " h " << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeDispatchCudaTest,
                         ::testing::Values(Case{1500, 16, 4, 64, 3},  // two plan chunks
                                           Case{7, 128, 8, 2048, 2},  // Qwen3-30B-A3B decode
                                           Case{33, 8, 2, 128, 4},    // Mixtral-like
                                           Case{1, 8, 1, 16, 1}));

TEST(MoeDispatchCudaIdleTest, NoTokensWriteZeroCounts) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<int32_t> counts(std::vector<int32_t>{7, 7, 7}), ranks(std::vector<int32_t>{0, 1, 2});
  ASSERT_TRUE(
      MoePlanDispatch(nullptr, 0, 2, ranks.get(), 3, nullptr, counts.get(), nullptr, nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(counts.ToHost(), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_FALSE(
      MoePlanDispatch(nullptr, 0, 2, ranks.get(), 33, nullptr, counts.get(), nullptr, nullptr)
          .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
