// The FP8 expert GEMVs (moe_fp8_cuda.h) against the CPU reference on fresh random inputs: each
// permuted row's gate_up (kernels/fp8's cpu::Fp8Linear on that expert's rows of the stacked
// weight: activations quantized as the scheme says and dequantized, the weight dequantized, fp32)
// rounded as the kernel rounds (gate and up to bf16, SiLU(g) * u to bf16), then down on the
// kernel's own act rows. Every scale form the loader holds: per-channel (one scale per row),
// per-tensor written per row, DeepSeek's 128 x 128 blocks as per-row 128-column groups (hidden
// 272: a partial last group); x every activation scheme (bf16 weight-only, static per-tensor,
// dynamic per-token, 1 x 128 groups, the codes from kernels/fp8's cuda::QuantizeActivations);
// 1 to 40 tokens (1, 2, 4 and 8 rows per weight read; one expert taking every token; experts
// with no rows); PDL-launched; and the refusals. The same on the tensor-core MoeFp8GroupedMma
// (gate_up rows, then MoeSiluAndMul) for the FP8 activation schemes.
#include "kernels/moe/moe_fp8_cuda.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using Scheme = Fp8ActivationScheme;

enum class WeightForm { kPerChannel, kPerTensor, kBlock128 };

// One projection of E experts, stacked [E * rows, k] with per-row scales [E * rows, groups], and
// the same on the device: one allocation per expert, device pointer tables.
struct Fp8Projection {
  int64_t rows = 0, k = 0, groups = 1;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<DeviceBuffer<uint8_t>> d_codes;
  std::vector<DeviceBuffer<float>> d_scales;
  std::unique_ptr<DeviceBuffer<const uint8_t*>> code_table;
  std::unique_ptr<DeviceBuffer<const float*>> scale_table;
  MoeFp8Experts Device() const { return {code_table->get(), scale_table->get(), groups}; }
  Fp8WeightView Expert(int64_t e, Scheme scheme, float input_scale) const {
    Fp8WeightView v;
    v.codes = codes.data() + e * rows * k;
    v.scales = scales.data() + e * rows * groups;
    v.grid = {rows, k, 1, groups == 1 ? k : 128};
    v.activation = scheme;
    v.input_scale = input_scale;
    return v;
  }
};

Fp8Projection MakeProjection(int64_t E, int64_t rows, int64_t k, WeightForm form,
                             std::mt19937& rng) {
  Fp8Projection p;
  p.rows = rows;
  p.k = k;
  p.groups = form == WeightForm::kBlock128 ? (k + 127) / 128 : 1;
  p.codes.resize(E * rows * k);
  p.scales.resize(E * rows * p.groups);
  std::vector<const uint8_t*> code_ptrs;
  std::vector<const float*> scale_ptrs;
  for (int64_t e = 0; e < E; ++e) {
    // Experts of different magnitudes, so the scales matter.
    std::normal_distribution<float> d(0.0f, 0.02f * (1.0f + static_cast<float>(e % 3)));
    std::vector<float> w(rows * k);
    for (float& x : w) x = d(rng);
    Fp8ScaleGrid grid{rows, k, 1, k};
    if (form == WeightForm::kPerTensor) grid = {rows, k, rows, k};
    if (form == WeightForm::kBlock128) grid = {rows, k, 128, 128};
    std::vector<float> block_scales(grid.NumScales());
    uint8_t* codes = p.codes.data() + e * rows * k;
    QuantizeWeight(w.data(), grid, codes, block_scales.data());
    float* scales = p.scales.data() + e * rows * p.groups;
    for (int64_t r = 0; r < rows; ++r) {  // the loader's per-row form
      for (int64_t g = 0; g < p.groups; ++g) {
        scales[r * p.groups + g] = block_scales[(r / grid.block_rows) * grid.GridCols() + g];
      }
    }
    p.d_codes.emplace_back(std::vector<uint8_t>(codes, codes + rows * k));
    p.d_scales.emplace_back(std::vector<float>(scales, scales + rows * p.groups));
    code_ptrs.push_back(p.d_codes.back().get());
    scale_ptrs.push_back(p.d_scales.back().get());
  }
  p.code_table = std::make_unique<DeviceBuffer<const uint8_t*>>(code_ptrs);
  p.scale_table = std::make_unique<DeviceBuffer<const float*>>(scale_ptrs);
  return p;
}

// The activations of one call on the device: bf16 values, or their codes and scales.
struct DeviceActivations {
  std::unique_ptr<DeviceBuffer<__nv_bfloat16>> values;
  std::unique_ptr<DeviceBuffer<uint8_t>> codes;
  std::unique_ptr<DeviceBuffer<float>> scales;
  MoeFp8Activations view;
};

DeviceActivations Activations(const std::vector<float>& x, int64_t m, int64_t k, Scheme scheme,
                              float static_scale) {
  DeviceActivations a;
  a.values = std::make_unique<DeviceBuffer<__nv_bfloat16>>(cuda_test::Convert<__nv_bfloat16>(x));
  a.view.scheme = scheme;
  a.view.values = a.values->get();
  if (scheme == Scheme::kNone) return a;
  a.codes = std::make_unique<DeviceBuffer<uint8_t>>(m * k);
  a.scales = std::make_unique<DeviceBuffer<float>>(NumActivationScales(scheme, m, k));
  EXPECT_TRUE(QuantizeActivations(a.values->get(), m, k, scheme, static_scale, a.codes->get(),
                                  a.scales->get(), nullptr)
                  .ok());
  a.view.codes = a.codes->get();
  a.view.scales = a.scales->get();
  return a;
}

float Bf16(float x) { return cuda_test::ToF(cuda_test::FromF<__nv_bfloat16>(x)); }

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  float max_abs = 0.0f;
  for (float w : want) max_abs = std::max(max_abs, std::abs(w));
  ASSERT_GT(max_abs, 0.0f) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    // A bf16 rounding step of the value (or of the gate feeding it), plus fp32 order noise.
    ASSERT_NEAR(got[i], want[i], 1.6e-2f * std::abs(want[i]) + 2e-3f * max_abs)
        << what << " element " << i;
  }
}

struct Case {
  int64_t T, E, k, H, I;
  WeightForm form;
  Scheme scheme;
  bool skew = false;  // every token's first choice is expert 0
  bool mma = false;   // MoeFp8GroupedMma (+ MoeSiluAndMul) instead of the GEMVs
};

void RunCase(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "T=" << c.T << " E=" << c.E << " k=" << c.k << " H=" << c.H << " I=" << c.I
               << " form=" << static_cast<int>(c.form) << " scheme=" << static_cast<int>(c.scheme));
  const int64_t rows = c.T * c.k;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(c.T * c.H);
  for (float& v : x) v = Bf16(nd(rng));
  std::vector<int32_t> ids(rows);
  for (int64_t t = 0; t < c.T; ++t) {  // k distinct experts per token
    std::vector<int32_t> all(c.E);
    for (int32_t e = 0; e < c.E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    if (c.skew) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 0));
    for (int64_t j = 0; j < c.k; ++j) ids[t * c.k + j] = all[j];
  }
  const Fp8Projection gate_up = MakeProjection(c.E, 2 * c.I, c.H, c.form, rng);
  const Fp8Projection down = MakeProjection(c.E, c.H, c.I, c.form, rng);
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::abs(v));
  const float static_scale = 1.25f * amax / kFp8E4m3Max;

  DeviceBuffer<int32_t> d_ids(ids), offsets(c.E + 1), active(c.E), token_of_row(rows),
      row_of_pair(rows);
  const DeviceMoePermutation perm{offsets.get(), active.get(), token_of_row.get(),
                                  row_of_pair.get()};
  ASSERT_TRUE(MoePermute(d_ids.get(), c.T, c.k, c.E, perm, nullptr, nullptr).ok());
  const DeviceActivations dx = Activations(x, c.T, c.H, c.scheme, static_scale);
  DeviceBuffer<__nv_bfloat16> act(rows * c.I), out(rows * c.H), gu_rows(rows * 2 * c.I);
  if (c.mma) {
    ASSERT_TRUE(MoeFp8GroupedMma(dx.view, token_of_row.get(), gate_up.Device(), offsets.get(), c.E,
                                 rows, 2 * c.I, c.H, gu_rows.get(), nullptr)
                    .ok());
    ASSERT_TRUE(MoeSiluAndMul<__nv_bfloat16>(gu_rows.get(), rows, c.I, act.get(), nullptr).ok());
  } else {
    ASSERT_TRUE(MoeFp8ExpertGemvGateUp(dx.view, gate_up.Device(), c.H, c.I, perm, c.E, rows,
                                       act.get(), nullptr, /*programmatic_launch=*/c.T % 2 == 1)
                    .ok());
  }
  const std::vector<float> act_got = cuda_test::ToFloat(act.ToHost());
  // The down input is the kernel's act, quantized per row (static: the act's own scale).
  float act_amax = 0.0f;
  for (float v : act_got) act_amax = std::max(act_amax, std::abs(v));
  const float act_static = 1.25f * std::max(act_amax, 1e-6f) / kFp8E4m3Max;
  const DeviceActivations da = Activations(act_got, rows, c.I, c.scheme, act_static);
  ASSERT_TRUE((c.mma ? MoeFp8GroupedMma(da.view, nullptr, down.Device(), offsets.get(), c.E, rows,
                                        c.H, c.I, out.get(), nullptr)
                     : MoeFp8ExpertGemvDown(da.view, down.Device(), c.H, c.I, perm, c.E, rows,
                                            out.get(), nullptr, c.T % 2 == 0))
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out_got = cuda_test::ToFloat(out.ToHost());

  const std::vector<int32_t> off = offsets.ToHost(), tor = token_of_row.ToHost();
  ASSERT_EQ(off[c.E], rows);
  std::vector<float> act_want(rows * c.I), out_want(rows * c.H), gu(2 * c.I);
  for (int64_t e = 0; e < c.E; ++e) {
    for (int32_t r = off[e]; r < off[e + 1]; ++r) {
      ASSERT_TRUE(cpu::Fp8Linear(x.data() + tor[r] * c.H, gate_up.Expert(e, c.scheme, static_scale),
                                 nullptr, 1, gu.data(), nullptr)
                      .ok());
      for (int64_t j = 0; j < c.I; ++j) {
        const float g = Bf16(gu[j]), u = Bf16(gu[c.I + j]);
        act_want[r * c.I + j] = Bf16(g / (1.0f + std::exp(-g)) * u);
      }
      ASSERT_TRUE(cpu::Fp8Linear(act_got.data() + r * c.I, down.Expert(e, c.scheme, act_static),
                                 nullptr, 1, out_want.data() + r * c.H, nullptr)
                      .ok());
    }
  }
  ExpectNear(act_got, act_want, "gate_up + SiLU");
  ExpectNear(out_got, out_want, "down");
}

TEST(MoeFp8CudaTest, ExpertGemvsMatchCpuFp8LinearEveryScaleForm) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (WeightForm form : {WeightForm::kPerChannel, WeightForm::kPerTensor, WeightForm::kBlock128}) {
    for (Scheme scheme :
         {Scheme::kNone, Scheme::kStaticTensor, Scheme::kDynamicToken, Scheme::kDynamicGroup128}) {
      RunCase({1, 8, 2, 272, 80, form, scheme}, rng);  // 1 row per expert read
      RunCase({3, 4, 2, 256, 144, form, scheme}, rng);
      RunCase({9, 8, 4, 272, 64, form, scheme, /*skew=*/true}, rng);
    }
  }
}

TEST(MoeFp8CudaTest, ManyRowsPerExpertAndEmptyExperts) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  // 40 tokens over 4 experts (8 rows per weight read, several reads), and 2 tokens over 16
  // experts (most experts empty).
  RunCase({40, 4, 2, 128, 48, WeightForm::kBlock128, Scheme::kDynamicGroup128}, rng);
  RunCase({40, 4, 2, 128, 48, WeightForm::kPerChannel, Scheme::kDynamicToken, true}, rng);
  RunCase({2, 16, 1, 384, 256, WeightForm::kBlock128, Scheme::kDynamicGroup128}, rng);
}

// The tensor-core form: every weight scale form x every FP8 activation scheme; 32- and 64-row
// tiles (several tiles of one expert), experts with no rows, one expert taking every token, odd
// widths (k off the 128-column step, n off the 128-column tile), decode-like Qwen3 proportions.
TEST(MoeFp8CudaTest, GroupedMmaMatchesCpuFp8LinearEveryScaleForm) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (WeightForm form : {WeightForm::kPerChannel, WeightForm::kPerTensor, WeightForm::kBlock128}) {
    for (Scheme scheme : {Scheme::kStaticTensor, Scheme::kDynamicToken, Scheme::kDynamicGroup128}) {
      RunCase({1, 8, 2, 272, 80, form, scheme, false, true}, rng);
      RunCase({9, 8, 4, 272, 48, form, scheme, /*skew=*/true, true}, rng);
      RunCase({40, 2, 2, 400, 144, form, scheme, false, true}, rng);  // 64-row tiles
    }
  }
  RunCase({24, 64, 8, 256, 96, WeightForm::kBlock128, Scheme::kDynamicGroup128, false, true}, rng);
  RunCase({70, 4, 1, 128, 48, WeightForm::kPerChannel, Scheme::kDynamicToken, true, true}, rng);
  RunCase({2, 16, 1, 384, 256, WeightForm::kBlock128, Scheme::kDynamicGroup128, false, true}, rng);
}

TEST(MoeFp8CudaTest, GroupedMmaRefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<int32_t> i32(8);
  DeviceBuffer<const uint8_t*> codes(1);
  DeviceBuffer<const float*> scales(1);
  DeviceBuffer<uint8_t> a_codes(512);
  DeviceBuffer<float> a_scales(8);
  DeviceBuffer<__nv_bfloat16> x(512), out(512);
  MoeFp8Activations q;
  q.scheme = Scheme::kDynamicToken;
  q.codes = a_codes.get();
  q.scales = a_scales.get();
  const MoeFp8Experts w{codes.get(), scales.get(), 1};
  EXPECT_TRUE(MoeFp8GroupedMma(q, nullptr, w, i32.get(), 1, 0, 16, 128, out.get(), nullptr).ok());
  MoeFp8Activations v;  // weight-only: bf16 activations are the GEMVs' only
  v.values = x.get();
  EXPECT_FALSE(MoeFp8GroupedMma(v, nullptr, w, i32.get(), 1, 1, 16, 128, out.get(), nullptr).ok());
  // n odd; k not a multiple of 16; groups neither 1 nor ceil(k / 128); no experts.
  EXPECT_FALSE(MoeFp8GroupedMma(q, nullptr, w, i32.get(), 1, 1, 15, 128, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8GroupedMma(q, nullptr, w, i32.get(), 1, 1, 16, 120, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8GroupedMma(q, nullptr, {codes.get(), scales.get(), 3}, i32.get(), 1, 1, 16,
                                256, out.get(), nullptr)
                   .ok());
  EXPECT_FALSE(MoeFp8GroupedMma(q, nullptr, w, i32.get(), 0, 1, 16, 128, out.get(), nullptr).ok());
}

TEST(MoeFp8CudaTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer<int32_t> i32(8);
  const DeviceMoePermutation perm{i32.get(), i32.get(), i32.get(), i32.get()};
  DeviceBuffer<const uint8_t*> codes(1);
  DeviceBuffer<const float*> scales(1);
  DeviceBuffer<__nv_bfloat16> x(512), out(512);
  MoeFp8Activations a;
  a.values = x.get();
  MoeFp8Experts w{codes.get(), scales.get(), 1};
  EXPECT_TRUE(MoeFp8ExpertGemvGateUp(a, w, 128, 16, perm, 1, 0, out.get(), nullptr).ok());
  // hidden not a multiple of 16; groups neither 1 nor ceil(k / 128); codes without scales; no
  // experts; null weight tables.
  EXPECT_FALSE(MoeFp8ExpertGemvGateUp(a, w, 120, 16, perm, 1, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8ExpertGemvDown(a, w, 16, 40, perm, 1, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8ExpertGemvGateUp(a, {codes.get(), scales.get(), 3}, 256, 16, perm, 1, 1,
                                      out.get(), nullptr)
                   .ok());
  MoeFp8Activations q;
  q.scheme = Scheme::kDynamicToken;
  q.codes = reinterpret_cast<const uint8_t*>(x.get());
  EXPECT_FALSE(MoeFp8ExpertGemvGateUp(q, w, 128, 16, perm, 1, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8ExpertGemvGateUp(a, w, 128, 16, perm, 0, 1, out.get(), nullptr).ok());
  EXPECT_FALSE(MoeFp8ExpertGemvGateUp(a, {}, 128, 16, perm, 1, 1, out.get(), nullptr).ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
