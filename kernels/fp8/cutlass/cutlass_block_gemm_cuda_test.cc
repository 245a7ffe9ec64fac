// CutlassFp8BlockGemm (cutlass_block_gemm.h) against the CPU reference of the block path: both
// operands dequantized by cpu::DequantizeFp8Weight (activations as a {m, k, 1, 128} grid, the
// weight as DeepSeek's {n, k, 128, 128}) and multiplied in fp64, on random e4m3 codes over the
// whole range and random non-zero scales (2^-10 .. 2^-4). m = 1 / 7 / 128 / 300 / 1024 (7 and
// 1: the padded activation-scale copy; 300 and 1024: partial and whole 128-row tiles) at
// Llama-3-8B and DeepSeek-V3 projections, including V3's fused q_a + kv_a (n = 2112: a partial
// last 128-row weight block) and k = 7168; every configuration forced (kCutlassBlockTiles);
// refusals.
//
// Tolerance (fp8_gemm_cuda_test.cc's model of Hopper's FP8 MMA): each instruction's 32
// products are summed with ~13 fraction bits of the largest magnitude, promoted to fp32 every
// 128, so |error| <= 4 x 2^-13 x Sigma over instructions of their largest magnitude + one bf16
// rounding (2^-9, x2 margin) + fp32 summation. Large shapes check a sample of rows (all columns).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/cutlass/cutlass_block_gemm.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

constexpr int kSampledRows = 12;  // rows checked beyond m <= kSampledRows

int64_t Groups(int64_t k) { return (k + 127) / 128; }

std::vector<float> RandomScales(std::mt19937& rng, int64_t count) {
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  std::vector<float> s(count);
  for (float& x : s) x = std::exp2(log_scale(rng));
  return s;
}

// The rows checked: all of them for small m, else the first, the last, the last full 128-row
// tile's last and random ones.
std::vector<int64_t> RowsToCheck(std::mt19937& rng, int64_t m) {
  std::vector<int64_t> rows;
  if (m <= kSampledRows) {
    for (int64_t r = 0; r < m; ++r) rows.push_back(r);
    return rows;
  }
  rows = {0, m - 1, std::max<int64_t>(0, m / 128 * 128 - 1)};
  std::uniform_int_distribution<int64_t> pick(0, m - 1);
  while (static_cast<int>(rows.size()) < kSampledRows) rows.push_back(pick(rng));
  return rows;
}

struct Case {
  int64_t m, n, k;
  CutlassBlockTile tile = CutlassBlockTile::kAuto;
  bool pad_w_scale_rows = true;  // w_scale_ld = groups rounded up to 4 (cuBLASLt's), else groups
  int swizzle = 0;               // the tile scheduler's order (no effect on the result)
  int raster = 0;
};

// One CutlassFp8BlockGemm call against the reference; returns the largest
// (|error| - rounding) / (2^-13 x per-MMA magnitude) seen.
double CheckGemm(std::mt19937& rng, const Case& c) {
  const auto [m, n, k, tile, pad, swizzle, raster] = c;
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " tile=" << CutlassBlockTileName(tile)
               << " pad=" << pad << " swizzle=" << swizzle << " raster=" << raster);
  const int64_t groups = Groups(k), n_blocks = (n + 127) / 128;
  const int64_t ld = pad ? (groups + 3) / 4 * 4 : groups;
  const std::vector<uint8_t> a = fp8_test::RandomE4m3Codes(rng, m * k);
  const std::vector<uint8_t> w = fp8_test::RandomE4m3Codes(rng, n * k);
  const std::vector<float> a_scales = RandomScales(rng, m * groups);         // [m, groups]
  const std::vector<float> w_scales = RandomScales(rng, n_blocks * groups);  // [n_blocks, groups]
  // The device layouts: activation scales group-major, weight scales in rows of ld.
  std::vector<float> a_scales_t(m * groups), w_scales_ld(n_blocks * ld, 1.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) a_scales_t[g * m + r] = a_scales[r * groups + g];
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    std::copy_n(&w_scales[b * groups], groups, &w_scales_ld[b * ld]);
  }
  DeviceBuffer<uint8_t> da(a), dw(w);
  DeviceBuffer<float> das(a_scales_t), dws(w_scales_ld);
  DeviceBuffer<bf16> out(m * n);
  CutlassFp8BlockGemmArgs args{da.get(), das.get(), dw.get(), dws.get(), ld,
                               m,        n,         k,        out.get(), tile};
  args.swizzle = swizzle;
  args.raster = raster;
  const absl::StatusOr<size_t> bytes = CutlassFp8BlockGemmWorkspaceBytes(args);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return 0;
  DeviceBuffer<char> workspace(std::max<size_t>(*bytes, 1));
  const absl::Status st = CutlassFp8BlockGemm(args, workspace.get(), *bytes, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok() || cudaDeviceSynchronize() != cudaSuccess) return 0;
  const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
  // A second call writes the same bits (no atomics; Stream-K's reduction is deterministic).
  EXPECT_TRUE(CutlassFp8BlockGemm(args, workspace.get(), *bytes, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(cuda_test::ToFloat(out.ToHost()) == got) << "a second run differs";

  std::vector<float> w_deq(n * k), a_row(k);
  cpu::DequantizeFp8Weight(
      {w.data(), w_scales.data(), {n, k, 128, 128}, Fp8ActivationScheme::kNone}, 0, n,
      w_deq.data());
  const Fp8WeightView a_view{a.data(), a_scales.data(), {m, k, 1, 128}, Fp8ActivationScheme::kNone};
  double worst = 0;
  int reported = 0;
  for (int64_t r : RowsToCheck(rng, m)) {
    cpu::DequantizeFp8Weight(a_view, r, 1, a_row.data());
    for (int64_t j = 0; j < n; ++j) {
      const fp8_test::Fp8MmaDot d =
          fp8_test::CheckFp8MmaDot(a_row.data(), &w_deq[j * k], k, got[r * n + j]);
      worst = std::max(worst, d.ratio);
      if (!d.ok && reported++ < 5) {
        ADD_FAILURE() << "row " << r << " col " << j << ": got " << got[r * n + j] << " want "
                      << d.want << " (tol " << d.tol << ")";
      }
    }
  }
  return worst;
}

// Llama-3-8B qkv / down, DeepSeek-V3 fused q_a + kv_a (n = 2112), q_b, o, an expert's down.
constexpr std::tuple<int64_t, int64_t> kShapes[] = {{6144, 4096},  {4096, 14336}, {2112, 7168},
                                                    {24576, 1536}, {7168, 16384}, {7168, 2048}};

TEST(CutlassBlockGemmCudaTest, MatchesTheCpuReferenceAtModelShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CutlassFp8BlockGemmSupported()) GTEST_SKIP() << "the CUTLASS kernels need an sm_90 device";
  ASSERT_TRUE(CutlassFp8BlockGemmInit().ok());
  std::mt19937 rng(cuda_test::TestSeed());
  double worst = 0;
  for (int64_t m : {1, 7, 128, 300, 1024}) {
    for (auto [n, k] : kShapes) worst = std::max(worst, CheckGemm(rng, {m, n, k}));
  }
  std::printf("CUTLASS block: largest error / (2^-13 x per-MMA magnitude) %.3f\n", worst);
}

// Every configuration on shapes kAuto would not give it, unpadded weight-scale rows, a grid of
// more tiles than SMs (2200 x 2112: 18 x 17 = 306 tiles of 128 x 128, a partial last wave that
// Stream-K splits), one of fewer tiles than SMs with a long k (8 x 8 tiles, k = 4096: split
// along k by Stream-K) and model shapes (DeepSeek-V3 q_b and expert down, Llama-3-8B qkv).
TEST(CutlassBlockGemmCudaTest, EveryTileMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CutlassFp8BlockGemmSupported()) GTEST_SKIP() << "the CUTLASS kernels need an sm_90 device";
  ASSERT_TRUE(CutlassFp8BlockGemmInit().ok());
  std::mt19937 rng(cuda_test::TestSeed() + 1);
  for (CutlassBlockTile tile : kCutlassBlockTiles) {
    double worst = 0;
    for (Case c : {Case{1, 256, 512}, Case{65, 136, 384}, Case{333, 2112, 1152},
                   Case{2200, 2112, 640}, Case{7, 8, 128}, Case{1024, 1024, 4096},
                   Case{300, 24576, 1536}, Case{1024, 7168, 2048}, Case{128, 6144, 4096}}) {
      c.tile = tile;
      c.pad_w_scale_rows = c.m % 2 == 0;
      worst = std::max(worst, CheckGemm(rng, c));
    }
    std::printf("CUTLASS block %s: largest error / (2^-13 x per-MMA magnitude) %.3f\n",
                CutlassBlockTileName(tile), worst);
  }
}

// The tile scheduler's orders (swizzle 2 / 4 / 8, raster along m / n) visit the tiles in another
// order; each must give the reference's result (no split k, so the default's bits too).
TEST(CutlassBlockGemmCudaTest, SchedulerOrdersMatchTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CutlassFp8BlockGemmSupported()) GTEST_SKIP() << "the CUTLASS kernels need an sm_90 device";
  ASSERT_TRUE(CutlassFp8BlockGemmInit().ok());
  std::mt19937 rng(cuda_test::TestSeed() + 2);
  double worst = 0;
  for (auto [swizzle, raster] : {std::pair{2, 0}, std::pair{4, 1}, std::pair{8, 2}}) {
    for (Case c : {Case{2200, 2112, 640}, Case{333, 24576, 1536}, Case{65, 136, 384}}) {
      c.swizzle = swizzle;
      c.raster = raster;
      c.pad_w_scale_rows = c.m % 2 == 0;
      worst = std::max(worst, CheckGemm(rng, c));
    }
  }
  std::printf("CUTLASS block scheduler orders: largest error / (2^-13 x magnitude) %.3f\n", worst);
}

// Refused before any device work (so also checked without a GPU): k not a positive multiple of
// 128, n not a multiple of 8, short weight-scale rows, negative sizes, null or misaligned
// pointers, a short workspace; m == 0 or n == 0 launches nothing.
TEST(CutlassBlockGemmCudaTest, RefusesWhatItCannotTake) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[64];
  alignas(16) static bf16 out[64];
  const CutlassFp8BlockGemmArgs ok{codes, scales, codes, scales, 4, 4, 8, 512, out};
  auto code = [](const CutlassFp8BlockGemmArgs& a) {
    return CutlassFp8BlockGemm(a, nullptr, 0, nullptr).code();
  };
  for (int64_t k : {0, 100, 200, 16, -128}) {
    CutlassFp8BlockGemmArgs a = ok;
    a.k = k;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "k=" << k;
    EXPECT_FALSE(CutlassFp8BlockGemmWorkspaceBytes(a).ok()) << "k=" << k;
  }
  for (int64_t n : {12, 2100, 7}) {
    CutlassFp8BlockGemmArgs a = ok;
    a.n = n;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "n=" << n;
  }
  CutlassFp8BlockGemmArgs a = ok;
  a.w_scale_ld = 3;  // k / 128 = 4
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.m = -1;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.w = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.a = codes + 8;  // 8-byte aligned only
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.a_scales = scales + 1;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.m = 7;  // needs the padded scale copy: a workspace
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  for (int swizzle : {-1, 3, 16}) {
    a = ok;
    a.swizzle = swizzle;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "swizzle=" << swizzle;
  }
  for (int raster : {-1, 3}) {
    a = ok;
    a.raster = raster;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "raster=" << raster;
  }
  for (int64_t m_or_n : {0}) {
    a = ok;
    a.m = m_or_n;
    EXPECT_TRUE(CutlassFp8BlockGemm(a, nullptr, 0, nullptr).ok());
    a = ok;
    a.n = m_or_n;
    EXPECT_TRUE(CutlassFp8BlockGemm(a, nullptr, 0, nullptr).ok());
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
