// MoeFp8CutlassGroupedGemm (moe_fp8_cutlass_grouped.h) against the per-expert CPU reference: each
// expert's rows and weight dequantized by cpu::DequantizeFp8Weight (activations as a {rows, k, 1,
// 128} grid, the weight with its per-row 128-column-group scales as the loader holds them, {n, k,
// 1, 128}) and multiplied in fp64, on random e4m3 codes over the whole range and random non-zero
// scales (2^-10 .. 2^-4). Uneven counts, empty experts (first, last, between), one expert of
// several 128-row tiles, 128 experts; n / k of Qwen3-30B-A3B-FP8 (gate_up 1536 x 2048, down 2048 x
// 768) and DeepSeek-V3 (gate_up 4096 x 7168, down 7168 x 2048); weight scales per 128 x 128 block
// (DeepSeek's) and per row; two calls bit-identical; refusals (also without a GPU).
//
// Tolerance: kernels/fp8/cutlass/cutlass_block_gemm_cuda_test.cc's model of Hopper's FP8 MMA
// (each instruction's 32 products summed with ~13 fraction bits of the largest magnitude,
// promoted to fp32 every 128) plus one bf16 rounding. A sample of each expert's rows is checked
// (all columns); rows past offsets[E] must stay untouched.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

constexpr int64_t kMmaK = 32;            // e4m3 products per Hopper MMA instruction
constexpr int64_t kPromoteK = 128;       // fp32 promotion interval
constexpr double kMmaRel = 0x1p-11;      // 4 x 2^-13 per instruction's largest magnitude
constexpr double kRoundRel = 0x1p-8;     // one bf16 rounding (2^-9) with a factor 2 of margin
constexpr int kRowsPerExpert = 3;        // rows checked per expert (first, last, one random)
constexpr uint16_t kUntouched = 0x7FBF;  // a bf16 NaN the kernel never writes

bf16 UntouchedValue() {
  __nv_bfloat16_raw raw;
  raw.x = kUntouched;
  return bf16(raw);
}

std::vector<float> RandomScales(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> s(count);
  for (float& x : s) x = std::exp2(log_scale(rng));
  return s;
}

// `distinct` expert weights [n, k] with per-row scales [n, k / 128] (the same scale on each 128
// rows when `blocks`), on the host and the device; the tables map expert e to weight e % distinct.
struct Weights {
  int64_t n = 0, k = 0, groups = 0, distinct = 0;
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::vector<float>> scales;
  std::vector<DeviceBuffer<uint8_t>> d_codes;
  std::vector<DeviceBuffer<float>> d_scales;
  std::unique_ptr<DeviceBuffer<const uint8_t*>> code_table;
  std::unique_ptr<DeviceBuffer<const float*>> scale_table;
};

Weights MakeWeights(std::mt19937& rng, int64_t E, int64_t distinct, int64_t n, int64_t k,
                    bool blocks) {
  Weights w;
  w.n = n;
  w.k = k;
  w.groups = k / 128;
  w.distinct = distinct;
  for (int64_t d = 0; d < distinct; ++d) {
    w.codes.push_back(fp8_test::RandomE4m3Codes(rng, n * k));
    std::vector<float> s = RandomScales(rng, n * w.groups);
    if (blocks) {
      for (int64_t r = 0; r < n; ++r) {
        std::copy_n(&s[(r / 128 * 128) * w.groups], w.groups, &s[r * w.groups]);
      }
    }
    w.scales.push_back(s);
    w.d_codes.emplace_back(w.codes.back());
    w.d_scales.emplace_back(w.scales.back());
  }
  std::vector<const uint8_t*> c;
  std::vector<const float*> s;
  for (int64_t e = 0; e < E; ++e) {
    c.push_back(w.d_codes[e % distinct].get());
    s.push_back(w.d_scales[e % distinct].get());
  }
  w.code_table = std::make_unique<DeviceBuffer<const uint8_t*>>(c);
  w.scale_table = std::make_unique<DeviceBuffer<const float*>>(s);
  return w;
}

struct Case {
  std::vector<int32_t> counts;  // rows per expert
  int64_t n, k;
  int64_t distinct = 4;    // distinct weights (tables repeat them)
  bool blocks = true;      // 128 x 128-block weight scales, else per row
  int64_t extra_rows = 5;  // rows past offsets[E] (must stay untouched)
};

// Checks expert e's sampled rows; returns the largest (|error| - rounding) / (2^-13 x per-MMA
// magnitude).
double CheckExpert(std::mt19937& rng, const Weights& w, int64_t e, int64_t first, int64_t m,
                   const std::vector<uint8_t>& a, const std::vector<float>& a_scales,
                   const std::vector<float>& got, int* reported) {
  const int64_t n = w.n, k = w.k, d = e % w.distinct;
  std::vector<int64_t> rows = {first, first + m - 1};
  std::uniform_int_distribution<int64_t> pick(first, first + m - 1);
  while (static_cast<int>(rows.size()) < std::min<int64_t>(kRowsPerExpert, m)) {
    rows.push_back(pick(rng));
  }
  std::vector<float> w_deq(n * k), a_row(k);
  cpu::DequantizeFp8Weight(
      {w.codes[d].data(), w.scales[d].data(), {n, k, 1, 128}, Fp8ActivationScheme::kNone}, 0, n,
      w_deq.data());
  const int64_t total = static_cast<int64_t>(a.size()) / k;
  const Fp8WeightView a_view{
      a.data(), a_scales.data(), {total, k, 1, 128}, Fp8ActivationScheme::kNone};
  double worst = 0;
  for (int64_t r : rows) {
    cpu::DequantizeFp8Weight(a_view, r, 1, a_row.data());
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = &w_deq[j * k];
      double want = 0, mag = 0, mma_mag = 0, partial = 0;
      for (int64_t c0 = 0; c0 < k; c0 += kMmaK) {
        if (c0 % kPromoteK == 0) partial = 0;
        double largest = std::fabs(partial);
        for (int64_t i = c0; i < c0 + kMmaK; ++i) {
          const double p = double(a_row[i]) * wr[i];
          want += p;
          mag += std::fabs(p);
          largest = std::max(largest, std::fabs(p));
          partial += p;
        }
        mma_mag += largest;
      }
      const double err = std::fabs(double(got[r * n + j]) - want);
      const double tol = 4e-6 * std::sqrt(double(k)) * mag + kMmaRel * mma_mag +
                         kRoundRel * std::fabs(want) + 1e-30;
      worst = std::max(worst, (err - kRoundRel * std::fabs(want)) / (0x1p-13 * mma_mag + 1e-30));
      if (!(err <= tol) && (*reported)++ < 5) {
        ADD_FAILURE() << "expert " << e << " row " << r << " col " << j << ": got "
                      << got[r * n + j] << " want " << want << " (tol " << tol << ")";
      }
    }
  }
  return worst;
}

double CheckCase(std::mt19937& rng, const Case& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size()), n = c.n, k = c.k, groups = k / 128;
  SCOPED_TRACE(::testing::Message()
               << "E=" << E << " n=" << n << " k=" << k << " blocks=" << c.blocks);
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
  const int64_t rows = offsets[E] + c.extra_rows;
  const Weights w = MakeWeights(rng, E, std::min(c.distinct, E), n, k, c.blocks);
  const std::vector<uint8_t> a = fp8_test::RandomE4m3Codes(rng, rows * k);
  const std::vector<float> a_scales = RandomScales(rng, rows * groups);
  DeviceBuffer<uint8_t> da(a);
  DeviceBuffer<float> das(a_scales);
  DeviceBuffer<int32_t> doff(offsets);
  DeviceBuffer<bf16> out(std::vector<bf16>(rows * n, UntouchedValue()));
  const MoeFp8CutlassGroupedArgs args{
      da.get(), das.get(), {w.code_table->get(), w.scale_table->get(), groups}, doff.get(), E, n,
      k,        out.get()};
  const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(E);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return 0;
  DeviceBuffer<char> workspace(*bytes);
  const absl::Status st = MoeFp8CutlassGroupedGemm(args, workspace.get(), *bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) return 0;
  const std::vector<bf16> got_bits = out.ToHost();
  const std::vector<float> got = cuda_test::ToFloat(got_bits);
  // A second call writes the same bits (persistent scheduler, no split k, no atomics).
  EXPECT_TRUE(MoeFp8CutlassGroupedGemm(args, workspace.get(), *bytes, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> again = out.ToHost();
  EXPECT_EQ(std::memcmp(again.data(), got_bits.data(), again.size() * sizeof(bf16)), 0)
      << "a second run differs";
  int64_t written = 0;  // rows past offsets[E] must keep their NaN
  for (int64_t i = offsets[E] * n; i < rows * n; ++i) {
    written += __nv_bfloat16_raw(got_bits[i]).x != kUntouched;
  }
  EXPECT_EQ(written, 0) << "values past offsets[E] written";
  double worst = 0;
  int reported = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (c.counts[e] == 0) continue;
    worst = std::max(worst,
                     CheckExpert(rng, w, e, offsets[e], c.counts[e], a, a_scales, got, &reported));
  }
  return worst;
}

// Random counts for E experts summing to about rows (some experts empty).
std::vector<int32_t> RandomCounts(std::mt19937& rng, int64_t E, int64_t rows) {
  std::vector<int32_t> counts(E, 0);
  std::uniform_int_distribution<int64_t> pick(0, E - 1);
  for (int64_t r = 0; r < rows; ++r) ++counts[pick(rng) % std::max<int64_t>(1, E - E / 8)];
  return counts;  // the last E / 8 experts empty
}

class MoeFp8CutlassGroupedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_SKIP_WITHOUT_GPU();
    if (!MoeFp8CutlassGroupedSupported()) GTEST_SKIP() << "the CUTLASS kernel needs sm_90";
    ASSERT_TRUE(MoeFp8CutlassGroupedInit().ok());
  }
};

TEST_F(MoeFp8CutlassGroupedTest, UnevenAndEmptyExperts) {
  std::mt19937 rng(cuda_test::TestSeed());
  double worst = 0;
  // Empty first / middle / last experts, 1-row experts, one of 3 tiles + a partial one, small n/k.
  worst = std::max(worst, CheckCase(rng, {{0, 1, 7, 0, 300, 128, 129, 0}, 256, 384}));
  worst = std::max(worst, CheckCase(rng, {{5}, 136, 128, 1, false}));
  worst = std::max(worst, CheckCase(rng, {{0, 0, 0}, 256, 256}));  // no rows at all
  worst = std::max(worst, CheckCase(rng, {{3, 900, 0, 17}, 1536, 2048, 4, false}));
  std::printf("CUTLASS grouped: largest error / (2^-13 x per-MMA magnitude) %.3f\n", worst);
}

// Qwen3-30B-A3B-FP8 (128 experts, 4096 tokens x top-8 ~ 32768 rows: ~256 per expert; one hot
// expert of 1000 rows) and DeepSeek-V3's expert shapes (fewer experts: the reference's cost).
TEST_F(MoeFp8CutlassGroupedTest, ModelShapes) {
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  double worst = 0;
  std::vector<int32_t> qwen = RandomCounts(rng, 128, 8000);
  qwen[3] = 1000;
  worst = std::max(worst, CheckCase(rng, {qwen, 1536, 2048, 8, true}));
  worst = std::max(worst, CheckCase(rng, {qwen, 2048, 768, 8, false}));
  const std::vector<int32_t> v3 = RandomCounts(rng, 16, 1500);
  worst = std::max(worst, CheckCase(rng, {v3, 4096, 7168, 3, true}));
  worst = std::max(worst, CheckCase(rng, {v3, 7168, 2048, 3, true}));
  std::printf("CUTLASS grouped (model shapes): largest error / (2^-13 x per-MMA magnitude) %.3f\n",
              worst);
}

// Refused before any device work (so also checked without a GPU).
TEST(MoeFp8CutlassGroupedRefusals, RefusesWhatItCannotTake) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[64];
  alignas(16) static bf16 out[64];
  alignas(16) static int32_t offsets[8];
  static const uint8_t* code_table[4];
  static const float* scale_table[4];
  alignas(128) static char workspace[128];
  const MoeFp8CutlassGroupedArgs ok{codes, scales, {code_table, scale_table, 4}, offsets, 2, 8,
                                    512,   out};
  auto code = [](const MoeFp8CutlassGroupedArgs& a) {
    return MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr).code();
  };
  for (int64_t k : {0, 100, 200, 16, -128}) {
    MoeFp8CutlassGroupedArgs a = ok;
    a.k = k;
    a.w.groups = k / 128;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "k=" << k;
  }
  for (int64_t n : {0, 12, 2100, 7, -8}) {
    MoeFp8CutlassGroupedArgs a = ok;
    a.n = n;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "n=" << n;
  }
  for (int64_t e : {int64_t{0}, int64_t{-1}, kMoeFp8CutlassMaxExperts + 1}) {
    MoeFp8CutlassGroupedArgs a = ok;
    a.num_experts = e;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "experts=" << e;
    EXPECT_FALSE(MoeFp8CutlassGroupedWorkspaceBytes(e).ok()) << "experts=" << e;
  }
  MoeFp8CutlassGroupedArgs a = ok;
  a.w.groups = 1;  // per-channel weight scales: not this kernel's
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.w.codes = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.expert_offsets = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.a = codes + 8;  // 8-byte aligned only
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.out = out + 1;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  // A workspace too short (128 bytes cannot hold 2 groups' arrays), misaligned or null.
  EXPECT_EQ(code(ok), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeFp8CutlassGroupedGemm(ok, nullptr, 1 << 20, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeFp8CutlassGroupedGemm(ok, workspace + 16, 1 << 20, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(128);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, size_t{128} * 11 * 8);  // at least the per-group arrays
}

}  // namespace
}  // namespace tandem::kernels::cuda
