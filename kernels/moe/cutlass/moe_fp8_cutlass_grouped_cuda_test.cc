// MoeFp8CutlassGroupedGemm (moe_fp8_cutlass_grouped.h) against the per-expert CPU reference: each
// expert's rows and weight dequantized by cpu::DequantizeFp8Weight (activations as a {rows, k, 1,
// 128} grid, the weight with its per-row 128-column-group scales as the loader holds them, {n, k,
// 1, 128}) and multiplied in fp64, on random e4m3 codes over the whole range and random non-zero
// scales (2^-10 .. 2^-4). Uneven counts, empty experts (first, last, between), one expert of
// several 128-row tiles, 128 experts; n / k of Qwen3-30B-A3B-FP8 (gate_up 1536 x 2048, down 2048 x
// 768) and DeepSeek-V3 (gate_up 4096 x 7168, down 7168 x 2048); weight scales per 128 x 128 block
// (DeepSeek's) and per row; per-channel weight scales and per-token / per-tensor activation scales
// (broadcast by the call) bit for bit the same scales given per group, and in the scaled form
// (scales in the epilogue) against the CPU reference; two calls bit-identical. (The refusals:
// moe_fp8_cutlass_grouped_refusals_test.cc.)
//
// The block form (args.block_scales: ScaleGranularityN 128) on every case of 128 x 128-block
// weights, from the block scales [ceil(n / 128), ld] as the runtime uploads them (ld = k / 128
// rounded up to 4: the compact copy where that differs, e.g. k = 768 or 384; ld = k / 128 read in
// place; the padding entries NaN, so a read of one would show): against the same CPU reference,
// and against the row form: bit-identical where every scale is a power of two (the two forms
// then multiply exactly: (p * sa) * sb = p * (sa * sb)); with other scales both only within the
// reference's tolerance (they round the scale products differently), the count of differing
// outputs printed.
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

constexpr int kRowsPerExpert = 3;        // rows checked per expert (first, last, one random)
constexpr uint16_t kUntouched = 0x7FBF;  // a bf16 NaN the kernel never writes

bf16 UntouchedValue() {
  __nv_bfloat16_raw raw;
  raw.x = kUntouched;
  return bf16(raw);
}

// Random scales 2^-10 .. 2^-4 (powers of two only when pow2).
std::vector<float> RandomScales(std::mt19937& rng, int64_t count, bool pow2 = false) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> s(count);
  for (float& x : s) x = std::exp2(pow2 ? std::round(log_scale(rng)) : log_scale(rng));
  return s;
}

// The runtime's block-scale row length (kernels/fp8 Block128WeightScaleLd): ceil(k / 128)
// rounded up to 4.
int64_t UploadLd(int64_t k) { return (MoeFp8CutlassGroups(k) + 3) / 4 * 4; }

// `distinct` expert weights [n, k] with per-row scales [n, k / 128] (the same scale on each 128
// rows when `blocks`, then also as block scales [ceil(n / 128), ld], padding NaN), on the host
// and the device; the tables map expert e to weight e % distinct.
struct Weights {
  int64_t n = 0, k = 0, groups = 0, distinct = 0, ld = 0;
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::vector<float>> scales;
  std::vector<DeviceBuffer<uint8_t>> d_codes;
  std::vector<DeviceBuffer<float>> d_scales;
  std::vector<DeviceBuffer<float>> d_blocks;
  std::unique_ptr<DeviceBuffer<const uint8_t*>> code_table;
  std::unique_ptr<DeviceBuffer<const float*>> scale_table;
  std::unique_ptr<DeviceBuffer<const float*>> block_table;  // null unless blocks
};

Weights MakeWeights(std::mt19937& rng, int64_t E, int64_t distinct, int64_t n, int64_t k,
                    bool blocks, bool pow2, int64_t ld) {
  Weights w;
  w.n = n;
  w.k = k;
  w.groups = MoeFp8CutlassGroups(k);
  w.distinct = distinct;
  w.ld = ld;
  const int64_t n_blocks = (n + 127) / 128;
  for (int64_t d = 0; d < distinct; ++d) {
    w.codes.push_back(fp8_test::RandomE4m3Codes(rng, n * k));
    std::vector<float> s = RandomScales(rng, n * w.groups, pow2);
    std::vector<float> b(n_blocks * ld, std::nanf(""));
    if (blocks) {
      for (int64_t r = 0; r < n; ++r) {
        std::copy_n(&s[(r / 128 * 128) * w.groups], w.groups, &s[r * w.groups]);
        if (r % 128 == 0) std::copy_n(&s[r * w.groups], w.groups, &b[r / 128 * ld]);
      }
      w.d_blocks.emplace_back(b);
    }
    w.scales.push_back(s);
    w.d_codes.emplace_back(w.codes.back());
    w.d_scales.emplace_back(w.scales.back());
  }
  std::vector<const uint8_t*> c;
  std::vector<const float*> s, b;
  for (int64_t e = 0; e < E; ++e) {
    c.push_back(w.d_codes[e % distinct].get());
    s.push_back(w.d_scales[e % distinct].get());
    if (blocks) b.push_back(w.d_blocks[e % distinct].get());
  }
  w.code_table = std::make_unique<DeviceBuffer<const uint8_t*>>(c);
  w.scale_table = std::make_unique<DeviceBuffer<const float*>>(s);
  if (blocks) w.block_table = std::make_unique<DeviceBuffer<const float*>>(b);
  return w;
}

struct Case {
  std::vector<int32_t> counts;  // rows per expert
  int64_t n, k;
  int64_t distinct = 4;    // distinct weights (tables repeat them)
  bool blocks = true;      // 128 x 128-block weight scales (both forms run), else per row
  int64_t extra_rows = 5;  // rows past offsets[E] (must stay untouched)
  bool pow2 = false;       // every scale a power of two: the two forms bit-identical
  int64_t ld = 0;          // block scale row length (0: the upload's, UploadLd(k))
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
      const fp8_test::Fp8MmaDot d =
          fp8_test::CheckFp8MmaDot(a_row.data(), &w_deq[j * k], k, got[r * n + j]);
      worst = std::max(worst, d.ratio);
      if (!d.ok && (*reported)++ < 5) {
        ADD_FAILURE() << "expert " << e << " row " << r << " col " << j << ": got "
                      << got[r * n + j] << " want " << d.want << " (tol " << d.tol << ")";
      }
    }
  }
  return worst;
}

// One form's output bits for `args` (rows x n, NaN-filled first; empty on failure), run twice:
// the second run must write the same bits (persistent scheduler, no split k, no atomics), and
// rows past offsets[E] must keep their NaN.
std::vector<bf16> RunForm(const MoeFp8CutlassGroupedArgs& args, int64_t rows, int64_t written_rows,
                          size_t bytes) {
  const int64_t n = args.n;
  DeviceBuffer<bf16> out(std::vector<bf16>(rows * n, UntouchedValue()));
  MoeFp8CutlassGroupedArgs a = args;
  a.out = out.get();
  DeviceBuffer<char> workspace(bytes);
  const absl::Status st = MoeFp8CutlassGroupedGemm(a, workspace.get(), bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) return {};
  const std::vector<bf16> got = out.ToHost();
  EXPECT_TRUE(MoeFp8CutlassGroupedGemm(a, workspace.get(), bytes, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> again = out.ToHost();
  EXPECT_EQ(std::memcmp(again.data(), got.data(), again.size() * sizeof(bf16)), 0)
      << "a second run differs";
  int64_t past = 0;
  for (int64_t i = written_rows * n; i < rows * n; ++i) {
    past += __nv_bfloat16_raw(got[i]).x != kUntouched;
  }
  EXPECT_EQ(past, 0) << "values past offsets[E] written";
  return got;
}

double CheckCase(std::mt19937& rng, const Case& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size()), n = c.n, k = c.k;
  const int64_t groups = MoeFp8CutlassGroups(k);
  const int64_t ld = c.ld > 0 ? c.ld : UploadLd(k);
  SCOPED_TRACE(::testing::Message() << "E=" << E << " n=" << n << " k=" << k << " blocks="
                                    << c.blocks << " pow2=" << c.pow2 << " ld=" << ld);
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
  const int64_t rows = offsets[E] + c.extra_rows;
  const Weights w = MakeWeights(rng, E, std::min(c.distinct, E), n, k, c.blocks, c.pow2, ld);
  const std::vector<uint8_t> a = fp8_test::RandomE4m3Codes(rng, rows * k);
  const std::vector<float> a_scales = RandomScales(rng, rows * groups, c.pow2);
  DeviceBuffer<uint8_t> da(a);
  DeviceBuffer<float> das(a_scales);
  DeviceBuffer<int32_t> doff(offsets);
  MoeFp8CutlassGroupedArgs args{
      da.get(), das.get(), {w.code_table->get(), w.scale_table->get(), groups}, doff.get(), E, n,
      k,        nullptr};
  const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(E);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return 0;
  std::vector<std::vector<bf16>> outs = {RunForm(args, rows, offsets[E], *bytes)};
  if (c.blocks) {  // the block form: its scales only (w.scales not read); then swapped
    args.w.scales = nullptr;
    args.block_scales = w.block_table->get();
    args.block_scale_ld = ld;
    const absl::StatusOr<size_t> block_bytes = MoeFp8CutlassGroupedBlockWorkspaceBytes(E, n, k, ld);
    EXPECT_TRUE(block_bytes.ok()) << block_bytes.status();
    if (!block_bytes.ok()) return 0;
    outs.push_back(RunForm(args, rows, offsets[E], *block_bytes));
    args.swap_ab = true;
    outs.push_back(RunForm(args, rows, offsets[E], *block_bytes));
  }
  double worst = 0;
  for (size_t f = 0; f < outs.size(); ++f) {
    SCOPED_TRACE(f == 0 ? "row form" : f == 1 ? "block form" : "block form, swapped");
    if (outs[f].empty()) return 0;
    const std::vector<float> got = cuda_test::ToFloat(outs[f]);
    int reported = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (c.counts[e] == 0) continue;
      worst = std::max(
          worst, CheckExpert(rng, w, e, offsets[e], c.counts[e], a, a_scales, got, &reported));
    }
  }
  if (outs.size() == 3) {
    int64_t differ = 0, swap_differ = 0;
    for (int64_t i = 0; i < offsets[E] * n; ++i) {
      differ += __nv_bfloat16_raw(outs[0][i]).x != __nv_bfloat16_raw(outs[1][i]).x;
      swap_differ += __nv_bfloat16_raw(outs[1][i]).x != __nv_bfloat16_raw(outs[2][i]).x;
    }
    if (c.pow2) {
      EXPECT_EQ(differ, 0) << "row and block forms differ on power-of-two scales";
      EXPECT_EQ(swap_differ, 0) << "the block form and its swapped order differ";
    }
    std::printf(
        "E=%lld n=%lld k=%lld ld=%lld pow2=%d: row / block forms differ in %lld of %lld, block / "
        "swapped in %lld\n",
        static_cast<long long>(E), static_cast<long long>(n), static_cast<long long>(k),
        static_cast<long long>(ld), c.pow2 ? 1 : 0, static_cast<long long>(differ),
        static_cast<long long>(offsets[E] * n), static_cast<long long>(swap_differ));
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
  worst = std::max(worst, CheckCase(rng, {{5, 130, 0, 1}, 136, 256}));  // a partial 128-row block
  // k not a multiple of 128: a last partial 128-column group (16 or 64 columns), row and block
  // forms (k = 400: 4 groups, ld 4 read in place; k = 1344: 11 groups, ld 12, the compact copy).
  worst = std::max(worst, CheckCase(rng, {{0, 9, 300, 2}, 256, 400, 3, true}));
  worst = std::max(worst, CheckCase(rng, {{40, 170}, 136, 1344, 2, false}));
  worst = std::max(worst, CheckCase(rng, {{33, 0, 260}, 264, 1344, 2, true}));
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
  worst = std::max(worst, CheckCase(rng, {qwen, 2048, 768, 8, true}));  // block form: ld 8 != 6
  const std::vector<int32_t> v3 = RandomCounts(rng, 16, 1500);
  worst = std::max(worst, CheckCase(rng, {v3, 4096, 7168, 3, true}));
  worst = std::max(worst, CheckCase(rng, {v3, 7168, 2048, 3, true}));
  std::printf("CUTLASS grouped (model shapes): largest error / (2^-13 x per-MMA magnitude) %.3f\n",
              worst);
}

// The block form bit-identical to the row form where every scale is a power of two: Qwen3's
// gate_up (ld = k / 128 = 16: the block scales read in place) and down (k = 768: ld 8, the
// compact copy), DeepSeek-V3's shapes (ld 56 and 16), a partial last block (n = 136), rows of
// more than 4 padding floats (ld = 19 for k = 2048), one expert of many tiles.
TEST_F(MoeFp8CutlassGroupedTest, BlockFormMatchesRowForm) {
  std::mt19937 rng(cuda_test::TestSeed() + 2);
  double worst = 0;
  const std::vector<int32_t> qwen = RandomCounts(rng, 128, 3000);
  const std::vector<int32_t> v3 = RandomCounts(rng, 8, 700);
  const Case cases[] = {
      {qwen, 1536, 2048, 8, true, 5, true},
      {qwen, 2048, 768, 8, true, 5, true},
      {v3, 4096, 7168, 2, true, 5, true},
      {v3, 7168, 2048, 2, true, 5, true},
      {{0, 17, 300, 0, 2}, 136, 384, 3, true, 5, true},
      {{40, 0, 9}, 256, 2048, 3, true, 5, true, 19},
      {{1000}, 512, 1024, 1, true, 0, true},
  };
  for (const Case& c : cases) worst = std::max(worst, CheckCase(rng, c));
  std::printf(
      "CUTLASS grouped (power-of-two scales): largest error / (2^-13 x per-MMA magnitude) "
      "%.3f\n",
      worst);
}

// Per-channel weight scales (w.groups 1) and per-token / static per-tensor activation scales,
// broadcast by the call into its wide scratch (broadcast_scales): bit for bit the row form given
// the same scales spread over the 128-column groups by the host (which the CPU reference checks
// as above); and in the scaled form (the default for them, no scratch: NaN scratch would show),
// rows first and swapped (swap_ab), against the same CPU reference, its differing outputs from the
// group form counted. Qwen3's
// shapes with empty experts, an odd k = 384, a k = 128 weight (one group: in place).
TEST_F(MoeFp8CutlassGroupedTest, BroadcastScalesMatchTheGroupForm) {
  std::mt19937 rng(cuda_test::TestSeed() + 3);
  struct Broadcast {
    std::vector<int32_t> counts;
    int64_t n, k;
    Fp8ActivationScheme a_scheme;
  };
  const std::vector<int32_t> qwen = RandomCounts(rng, 128, 3000);
  const Broadcast cases[] = {
      {qwen, 1536, 2048, Fp8ActivationScheme::kDynamicToken},
      {qwen, 2048, 768, Fp8ActivationScheme::kDynamicToken},
      {qwen, 1536, 2048, Fp8ActivationScheme::kStaticTensor},
      {{0, 17, 300, 0, 2}, 136, 384, Fp8ActivationScheme::kStaticTensor},
      {{40, 0, 9}, 256, 128, Fp8ActivationScheme::kDynamicToken},
      {{0, 17, 300, 0, 2}, 136, 400, Fp8ActivationScheme::kDynamicToken},  // a partial group
  };
  double worst = 0, worst_scaled = 0;
  for (const Broadcast& c : cases) {
    const int64_t E = static_cast<int64_t>(c.counts.size()), n = c.n, k = c.k;
    const int64_t groups = MoeFp8CutlassGroups(k);
    SCOPED_TRACE(::testing::Message() << "E=" << E << " n=" << n << " k=" << k
                                      << " scheme=" << static_cast<int>(c.a_scheme));
    std::vector<int32_t> offsets(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
    const int64_t rows = offsets[E] + 5, distinct = std::min<int64_t>(4, E);
    Weights w = MakeWeights(rng, E, distinct, n, k, false, false, UploadLd(k));
    // One scale per weight row: the group form's rows get it on every group.
    std::vector<DeviceBuffer<float>> per_channel;
    std::vector<const float*> channel_table;
    for (int64_t d = 0; d < distinct; ++d) {
      std::vector<float> ch(n);
      for (int64_t r = 0; r < n; ++r) {
        ch[r] = w.scales[d][r * groups];
        std::fill_n(&w.scales[d][r * groups], groups, ch[r]);
      }
      ASSERT_EQ(cudaMemcpy(w.d_scales[d].get(), w.scales[d].data(), n * groups * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      per_channel.emplace_back(ch);
    }
    std::vector<const float*> wide_table;
    for (int64_t e = 0; e < E; ++e) {
      wide_table.push_back(w.d_scales[e % distinct].get());
      channel_table.push_back(per_channel[e % distinct].get());
    }
    DeviceBuffer<const float*> d_wide_table(wide_table), d_channel_table(channel_table);
    const std::vector<uint8_t> a = fp8_test::RandomE4m3Codes(rng, rows * k);
    const bool per_row = c.a_scheme == Fp8ActivationScheme::kDynamicToken;
    const std::vector<float> a_own = RandomScales(rng, per_row ? rows : 1);
    std::vector<float> a_scales(rows * groups);
    for (int64_t i = 0; i < rows * groups; ++i) a_scales[i] = a_own[per_row ? i / groups : 0];
    DeviceBuffer<uint8_t> da(a);
    DeviceBuffer<float> das(a_scales), das_own(a_own);
    DeviceBuffer<int32_t> doff(offsets);
    const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(E);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    MoeFp8CutlassGroupedArgs args{
        da.get(), das.get(), {w.code_table->get(), d_wide_table.get(), groups}, doff.get(), E, n,
        k,        nullptr};
    const std::vector<bf16> grouped = RunForm(args, rows, offsets[E], *bytes);
    // The wide scratch NaN-filled: a broadcast that missed an entry CUTLASS reads would show.
    DeviceBuffer<float> a_wide(std::vector<float>(rows * groups, std::nanf("")));
    DeviceBuffer<float> w_wide(
        std::vector<float>(MoeFp8CutlassWideWeightScales(E, n, k), std::nanf("")));
    args.a_scales = das_own.get();
    args.a_scheme = c.a_scheme;
    args.a_scales_wide = a_wide.get();
    args.w = {w.code_table->get(), d_channel_table.get(), 1};
    args.w_scales_wide = w_wide.get();
    args.broadcast_scales = true;
    ASSERT_FALSE(MoeFp8CutlassScaledFormServes(args));
    const std::vector<bf16> broadcast = RunForm(args, rows, offsets[E], *bytes);
    // The scaled form (the default for these scales): no scratch at all.
    args.broadcast_scales = false;
    args.a_scales_wide = nullptr;
    args.w_scales_wide = nullptr;
    ASSERT_TRUE(MoeFp8CutlassScaledFormServes(args));
    const std::vector<bf16> scaled = RunForm(args, rows, offsets[E], *bytes);
    args.swap_ab = true;  // the weight first, the rows in 32-wide tiles
    const std::vector<bf16> swapped = RunForm(args, rows, offsets[E], *bytes);
    ASSERT_FALSE(grouped.empty());
    ASSERT_FALSE(broadcast.empty());
    ASSERT_FALSE(scaled.empty());
    ASSERT_FALSE(swapped.empty());
    EXPECT_EQ(std::memcmp(grouped.data(), broadcast.data(), grouped.size() * sizeof(bf16)), 0)
        << "broadcast scales differ from the same scales given per group";
    for (const std::vector<bf16>* out : {&broadcast, &scaled, &swapped}) {
      SCOPED_TRACE(out == &scaled    ? "scaled form"
                   : out == &swapped ? "scaled form, swapped"
                                     : "broadcast row form");
      const std::vector<float> got = cuda_test::ToFloat(*out);
      int reported = 0;
      double& worst_form = out == &broadcast ? worst : worst_scaled;
      for (int64_t e = 0; e < E; ++e) {
        if (c.counts[e] == 0) continue;
        worst_form = std::max(worst_form, CheckExpert(rng, w, e, offsets[e], c.counts[e], a,
                                                      a_scales, got, &reported));
      }
    }
    int64_t differ = 0;
    for (int64_t i = 0; i < offsets[E] * n; ++i) {
      differ += __nv_bfloat16_raw(scaled[i]).x != __nv_bfloat16_raw(grouped[i]).x;
    }
    int64_t swap_differ = 0;
    for (int64_t i = 0; i < offsets[E] * n; ++i) {
      swap_differ += __nv_bfloat16_raw(scaled[i]).x != __nv_bfloat16_raw(swapped[i]).x;
    }
    std::printf(
        "E=%lld n=%lld k=%lld: scaled / group forms differ in %lld of %lld outputs, swapped / "
        "scaled in %lld\n",
        static_cast<long long>(E), static_cast<long long>(n), static_cast<long long>(k),
        static_cast<long long>(differ), static_cast<long long>(offsets[E] * n),
        static_cast<long long>(swap_differ));
  }
  std::printf(
      "CUTLASS grouped: largest error / (2^-13 x per-MMA magnitude), broadcast scales %.3f, "
      "scaled form %.3f\n",
      worst, worst_scaled);
}

// A dense projection as one group (args.single_codes / single_scales, no device tables): bit for
// bit the same call through one-entry tables, in the row form (per-row group scales, 1 x 128 and
// per-token activations) and the scaled form (per-channel), at DeepSeek-V2-Lite's dense shapes
// (gate_up 21,888 x 2,048; down 2,048 x 10,944: 85.5 groups) cut to fewer rows, and checked
// against the CPU reference.
TEST_F(MoeFp8CutlassGroupedTest, SingleWeightEqualsTheTables) {
  std::mt19937 rng(cuda_test::TestSeed() + 4);
  struct Single {
    int64_t m, n, k;
    Fp8ActivationScheme a_scheme;
    bool per_channel;
  };
  const Single cases[] = {
      {300, 1088, 2048, Fp8ActivationScheme::kDynamicGroup128, false},
      {129, 2048, 10944, Fp8ActivationScheme::kDynamicGroup128, false},
      {40, 264, 10944, Fp8ActivationScheme::kDynamicToken, false},
      {77, 512, 400, Fp8ActivationScheme::kDynamicToken, true},
  };
  double worst = 0;
  for (const Single& c : cases) {
    const int64_t groups = MoeFp8CutlassGroups(c.k), n = c.n, k = c.k, m = c.m;
    SCOPED_TRACE(::testing::Message()
                 << "m=" << m << " n=" << n << " k=" << k
                 << " scheme=" << static_cast<int>(c.a_scheme) << " per_channel=" << c.per_channel);
    Weights w = MakeWeights(rng, 1, 1, n, k, false, false, UploadLd(k));
    std::vector<float> channel(n);
    if (c.per_channel) {  // one scale a row, spread over its groups for the reference
      for (int64_t r = 0; r < n; ++r) {
        channel[r] = w.scales[0][r * groups];
        std::fill_n(&w.scales[0][r * groups], groups, channel[r]);
      }
    }
    DeviceBuffer<float> d_channel(channel);
    const float* weight_scales = c.per_channel ? d_channel.get() : w.d_scales[0].get();
    DeviceBuffer<const float*> scale_table(std::vector<const float*>{weight_scales});
    const bool per_token = c.a_scheme == Fp8ActivationScheme::kDynamicToken;
    const std::vector<uint8_t> a = fp8_test::RandomE4m3Codes(rng, (m + 3) * k);
    const std::vector<float> a_own = RandomScales(rng, (m + 3) * (per_token ? 1 : groups));
    std::vector<float> a_scales((m + 3) * groups);  // per group, for the reference
    for (int64_t i = 0; i < (m + 3) * groups; ++i) a_scales[i] = a_own[per_token ? i / groups : i];
    DeviceBuffer<uint8_t> da(a);
    DeviceBuffer<float> das(a_own);
    DeviceBuffer<float> a_wide(std::vector<float>((m + 3) * groups, std::nanf("")));
    DeviceBuffer<int32_t> doff(std::vector<int32_t>{0, static_cast<int32_t>(m)});
    const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(1);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    MoeFp8CutlassGroupedArgs args{
        da.get(),   das.get(), {w.code_table->get(), scale_table.get(), c.per_channel ? 1 : groups},
        doff.get(), 1,         n,
        k,          nullptr};
    args.a_scheme = c.a_scheme;
    if (per_token && !c.per_channel) args.a_scales_wide = a_wide.get();
    ASSERT_EQ(MoeFp8CutlassScaledFormServes(args), c.per_channel);
    const std::vector<bf16> tables = RunForm(args, m + 3, m, *bytes);
    args.w.codes = nullptr;
    args.w.scales = nullptr;
    args.single_codes = w.d_codes[0].get();
    args.single_scales = weight_scales;
    const std::vector<bf16> single = RunForm(args, m + 3, m, *bytes);
    ASSERT_FALSE(tables.empty());
    ASSERT_FALSE(single.empty());
    EXPECT_EQ(std::memcmp(tables.data(), single.data(), tables.size() * sizeof(bf16)), 0)
        << "the single weight differs from the same weight through tables";
    int reported = 0;
    worst = std::max(
        worst, CheckExpert(rng, w, 0, 0, m, a, a_scales, cuda_test::ToFloat(single), &reported));
  }
  std::printf(
      "CUTLASS grouped (single weights): largest error / (2^-13 x per-MMA magnitude) %.3f\n",
      worst);
}

}  // namespace
}  // namespace tandem::kernels::cuda
