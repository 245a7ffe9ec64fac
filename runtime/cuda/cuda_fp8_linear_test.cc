// CudaFp8Linear (cuda_fp8_linear.h) against the CPU reference cpu::Fp8Linear on fresh random FP8
// weights with random per-row scales: per-channel, 128-column blocks and 128 x 128 blocks x the
// four activation schemes x m on both sides of the GEMV bound (1, 16, 17, 40, 100: the decode
// GEMV, the cuBLASLt FP8 GEMM -- on sm_90 its fp32 product + scaling epilogue --, the
// block-scaled cuBLASLt GEMM and the chunked-GEMV slow path),
// bias on and off, each call checked to take the path PathFor names; m = 1 with 128-column
// blocks on the weight-only W8A16 GEMV (against the reference with scheme kNone: no activation
// quantization) and, w8a16_gemv off, on the W8A8 GEMV; per-token and 1 x 128-group weights also
// on codes written into token_codes(w) by a producer (codes_ready: the same bits on every path),
// other schemes (and groups where batch 1 runs the W8A16 GEMV) refusing codes_ready; and the device
// dummy FP8 rows (FillFp8Dummy) against kernels::QuantizeWeight of the host draw; the CUTLASS row
// GEMM at DeepSeek-V2-Lite's dense shapes (k = 10,944); the swapped CUTLASS GEMM of whole-row
// scales at decode-sized m, and every forced Fp8DecodeGemm on its shapes. GPU test; skips without
// one.
#include "runtime/cuda/cuda_fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;
template <typename T>
using TestBuffer = kernels::cuda_test::DeviceBuffer<T>;

std::vector<bf16> RandomBf16(std::mt19937& rng, int64_t count, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<bf16> v(count);
  for (bf16& x : v) x = __float2bfloat16_rn(dist(rng));
  return v;
}

// square_blocks: the per-row scales of 128 x 128 blocks (a DeepSeek checkpoint as the loader
// holds it), which UploadFp8Weight recognizes for the block-scaled GEMM.
void CheckLinear(std::mt19937& rng, CudaFp8Linear& linear, int64_t m, int64_t n, int64_t k,
                 int64_t block_cols, Scheme scheme, bool with_bias, bool square_blocks = false) {
  const kernels::Fp8ScaleGrid grid{n, k, 1, block_cols};
  Fp8LinearWeight host;
  host.grid = grid;
  host.activation = scheme;
  host.input_scale = 0.04f;
  host.codes.resize(n * k);
  for (uint8_t& c : host.codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
  host.scales.resize(grid.NumScales());
  for (float& s : host.scales) s = std::exp2(log_scale(rng));
  if (square_blocks) {
    const int64_t g = grid.GridCols();
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(host.scales.begin() + r / 128 * 128 * g, g, host.scales.begin() + r * g);
    }
  }
  const std::vector<bf16> x = RandomBf16(rng, m * k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
  const std::vector<float> xf = kernels::cuda_test::ToFloat(x);
  const std::vector<float> bias_f = kernels::cuda_test::ToFloat(bias);
  std::vector<float> want(m * n), w_deq(n * k);
  kernels::Fp8WeightView view = host.View();
  CudaFp8Weight shape;  // PathFor's question before the upload frees the host codes
  shape.grid = grid;
  shape.activation = scheme;
  const bool w8a16 =
      std::string(CudaFp8Linear::PathFor(shape, m, linear.w8a16_gemv(), linear.row_gemm(),
                                         linear.decode_gemm())) == "fp8-w8a16-gemv";
  // The W8A16 GEMV multiplies the bf16 activations as they are: the weight-only reference.
  if (w8a16) view.activation = Scheme::kNone;
  ASSERT_TRUE(kernels::cpu::Fp8Linear(xf.data(), view, with_bias ? bias_f.data() : nullptr, m,
                                      want.data(), nullptr)
                  .ok());
  kernels::cpu::DequantizeFp8Weight(view, 0, n, w_deq.data());
  absl::StatusOr<CudaFp8Weight> w = UploadFp8Weight(&host, n, k, 128, "test");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(host.codes.empty());  // the host copy is freed
  const std::string path =
      CudaFp8Linear::PathFor(*w, m, linear.w8a16_gemv(), linear.row_gemm(), linear.decode_gemm());
  EXPECT_EQ(path == "fp8-w8a16-gemv", w8a16);
  SCOPED_TRACE(::testing::Message()
               << "m=" << m << " n=" << n << " k=" << k << " blocks " << block_cols << " scheme "
               << static_cast<int>(scheme) << " path " << path);
  TestBuffer<bf16> dx(x), dbias(bias), out(m * n);
  ASSERT_TRUE(
      linear.Linear(dx.get(), *w, with_bias ? dbias.get() : nullptr, m, out.get(), nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  // The path PathFor names is the one that ran: the per-token x per-channel GEMM does not fall
  // back to the chunked GEMV on the device (on sm_90 it is the fp32-product + epilogue path).
  // The block GEMM with a bias over a group count cuBLASLt has no kernel for (CUTLASS takes no
  // bias) does: last_path's contract, the row GEMM or the chunks.
  const bool block_fallback =
      path == "fp8-block-gemm" && with_bias && kernels::cuda::Block128Groups(k) % 4 != 0;
  EXPECT_EQ(std::string(linear.last_path()), !block_fallback     ? path
                                             : linear.row_gemm() ? "fp8-cutlass-row-gemm"
                                                                 : "fp8-gemv-chunks");
  const std::vector<float> got = kernels::cuda_test::ToFloat(out.ToHost());
  // The GEMMs sum on Hopper's FP8 tensor cores: each 32-product MMA may lose a few 2^-13 of its
  // largest product (kernels/fp8/fp8_cuda_test_util.h's CheckFp8MmaDot), which the fp32 GEMVs do
  // not.
  const bool mma = path.find("gemm") != std::string::npos;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = with_bias ? std::fabs(bias_f[j]) : 0.0, mma_mag = 0.0, largest = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = std::fabs(xf[r * k + c] * w_deq[j * k + c]) * 1.07;
        mag += p;
        largest = std::max(largest, p);
        if (c % 32 == 31 || c == k - 1) mma_mag += largest, largest = 0.0;
      }
      // bf16 output (one rounding; two where a cuBLASLt-scaled GEMM's bias is added after it)
      // + fp32 sums (+ the MMAs' partial sums).
      const double tol = 2.0 * std::fabs(want[r * n + j]) / 256.0 +
                         1e-5 * std::sqrt(static_cast<double>(k)) * mag +
                         (mma ? 0x1p-11 * mma_mag : 0.0) + 1e-30;
      ASSERT_NEAR(got[r * n + j], want[r * n + j], tol) << "row " << r << " col " << j;
    }
  }
  // Codes written by a producer into token_codes() (as the model's fused RMSNorm / SiLU-and-mul
  // do): the same bits as quantizing inside Linear; refused for other schemes.
  TestBuffer<bf16> out2(m * n);
  if (!linear.TakesTokenCodes(*w, m)) {
    EXPECT_TRUE(absl::IsInvalidArgument(
        linear.Linear(nullptr, *w, nullptr, m, out2.get(), nullptr, false, /*codes_ready=*/true)));
    return;
  }
  if (w8a16) {  // codes_ready runs the W8A8 GEMV: its bits with w8a16_gemv off
    linear.set_w8a16_gemv(false);
    ASSERT_TRUE(
        linear.Linear(dx.get(), *w, with_bias ? dbias.get() : nullptr, m, out.get(), nullptr).ok());
    EXPECT_STREQ(linear.last_path(), "fp8-gemv");
    linear.set_w8a16_gemv(true);
  }
  // The layout token_codes asks for (group-major where the block GEMM takes every row).
  const kernels::cuda::Fp8TokenCodes q = linear.token_codes(*w, m);
  EXPECT_EQ(q.group_major_ld, linear.GroupMajorScales(*w, m) ? m : 0);
  ASSERT_TRUE(kernels::cuda::QuantizeActivations(dx.get(), m, k, scheme, 0.0f, q.codes, q.scales,
                                                 nullptr, false, q.group_major_ld)
                  .ok());
  ASSERT_TRUE(linear
                  .Linear(nullptr, *w, with_bias ? dbias.get() : nullptr, m, out2.get(), nullptr,
                          false, /*codes_ready=*/true)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> a1 = out.ToHost(), a2 = out2.ToHost();
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_EQ(__bfloat16_as_ushort(a1[i]), __bfloat16_as_ushort(a2[i])) << "codes_ready, " << i;
  }
}

TEST(CudaFp8LinearTest, MatchesTheCpuReferenceOnEveryPath) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed());
  absl::StatusOr<std::unique_ptr<CudaFp8Linear>> linear = CudaFp8Linear::Create(128, 1024);
  ASSERT_TRUE(linear.ok()) << linear.status();
  for (Scheme scheme :
       {Scheme::kNone, Scheme::kStaticTensor, Scheme::kDynamicToken, Scheme::kDynamicGroup128}) {
    for (int64_t m : {1, 16, 17, 40, 100}) {
      CheckLinear(rng, **linear, m, 96, 1024, 1024, scheme, m % 2 == 1);  // per-channel
      CheckLinear(rng, **linear, m, 80, 384, 128, scheme, m % 2 == 0);    // 128-column blocks
      CheckLinear(rng, **linear, m, 48, 272, 128, scheme, false);         // k % 128 != 0
      // 128 x 128 blocks: the block-scaled GEMM beyond 16 rows with 1x128 activations (m = 17:
      // 16 rows on it, the 17th on the GEMV). No bias, as DeepSeek's projections.
      CheckLinear(rng, **linear, m, 200, 1024, 128, scheme, false, /*square_blocks=*/true);
      // 3 groups and a bias: CUTLASS does not take the bias, cuBLASLt has no 3-group kernel, so
      // the block GEMM answers UNIMPLEMENTED after the scales went group-major (m = 40 / 100,
      // where CUTLASS is built) and the row GEMM / the chunks read them transposed back.
      CheckLinear(rng, **linear, m, 200, 384, 128, scheme, true, /*square_blocks=*/true);
    }
  }
  // m = 1 with 128-column groups, w8a16_gemv off: QuantizeActivations + the W8A8 GEMV (and the
  // reference with the weight's activation scheme), as before the W8A16 GEMV.
  (*linear)->set_w8a16_gemv(false);
  for (Scheme scheme : {Scheme::kDynamicToken, Scheme::kDynamicGroup128}) {
    CheckLinear(rng, **linear, 1, 80, 384, 128, scheme, true);
    CheckLinear(rng, **linear, 1, 200, 1024, 128, scheme, false, /*square_blocks=*/true);
  }
  (*linear)->set_w8a16_gemv(true);
  // Which path: decode GEMV up to 16 rows; the GEMM for whole-row scales and per-token / static
  // activations; per-row 128-column groups on the CUTLASS row GEMM where built (sm_90), else the
  // chunked GEMV, as weight-only layers.
  const char* row_or_chunks =
      CudaFp8Linear::RowGemmAvailable() ? "fp8-cutlass-row-gemm" : "fp8-gemv-chunks";
  // (A block narrower than the row: 128 of 256 columns; a 128-wide block of a 64-wide row is a
  // whole-row scale, which the GEMM serves.)
  CudaFp8Weight w;
  w.grid = {64, 256, 1, 256};
  w.activation = Scheme::kDynamicToken;
  // Whole-row scales at decode-sized m: a small weight on the GEMV up to 16 rows and cuBLASLt
  // beyond; a large one (>= kFp8SwapGemmMinElements) on the swapped CUTLASS GEMM from 9 to 64
  // rows where built (row_gemm); forced modes as they say.
  CudaFp8Weight big;
  big.grid = {8192, 4096, 1, 4096};
  big.activation = Scheme::kDynamicToken;
  for (int64_t m : {2, 8, 9, 16, 17, 64, 65, 256}) {
    EXPECT_STREQ(CudaFp8Linear::PathFor(w, m, true, true),
                 m <= 16 ? "fp8-gemv" : "cublaslt-fp8-gemm")
        << m;
    EXPECT_STREQ(CudaFp8Linear::PathFor(big, m, true, true), m <= 8    ? "fp8-gemv"
                                                             : m <= 64 ? "fp8-cutlass-swap-gemm"
                                                                       : "cublaslt-fp8-gemm")
        << m;
    EXPECT_STREQ(CudaFp8Linear::PathFor(big, m, true, /*row_gemm=*/false),
                 m <= 16 ? "fp8-gemv" : "cublaslt-fp8-gemm")
        << m;
    EXPECT_STREQ(CudaFp8Linear::PathFor(w, m, true, true, Fp8DecodeGemm::kCutlassSwap),
                 "fp8-cutlass-swap-gemm");
    EXPECT_STREQ(CudaFp8Linear::PathFor(w, m, true, true, Fp8DecodeGemm::kCublasLt),
                 "cublaslt-fp8-gemm");
  }
  // A weight of >= kFp8WideSwapMinN rows: the swapped GEMM also from 129 to 192 rows (64-row
  // token tiles), not under kAutoNarrow.
  CudaFp8Weight wide;
  wide.grid = {28672, 4096, 1, 4096};
  wide.activation = Scheme::kDynamicToken;
  for (int64_t m : {65, 128, 129, 160, 192, 193, 256}) {
    const bool swap = m >= 129 && m <= 192;
    EXPECT_STREQ(CudaFp8Linear::PathFor(wide, m, true, true),
                 swap ? "fp8-cutlass-swap-gemm" : "cublaslt-fp8-gemm")
        << m;
    EXPECT_STREQ(CudaFp8Linear::PathFor(wide, m, true, true, Fp8DecodeGemm::kAutoNarrow),
                 "cublaslt-fp8-gemm")
        << m;
  }
  EXPECT_STREQ(CudaFp8Linear::PathFor(wide, 40, true, true, Fp8DecodeGemm::kAutoNarrow),
               "fp8-cutlass-swap-gemm");
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 1, true, true, Fp8DecodeGemm::kCutlassSwap), "fp8-gemv");
  w.grid.rows = 68;  // not a multiple of 8: no swapped GEMM
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17, true, true, Fp8DecodeGemm::kCutlassSwap),
               "cublaslt-fp8-gemm");
  w.grid.rows = 64;
  w.activation = Scheme::kNone;  // weight-only: neither GEMM
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17, true, true, Fp8DecodeGemm::kCutlassSwap),
               "fp8-gemv-chunks");
  w.activation = Scheme::kDynamicToken;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 16, true, /*row_gemm=*/false), "fp8-gemv");
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17, true, /*row_gemm=*/false), "cublaslt-fp8-gemm");
  w.grid.block_cols = 128;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17), row_or_chunks);
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17, true, /*row_gemm=*/false), "fp8-gemv-chunks");
  w.activation = Scheme::kDynamicGroup128;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17), row_or_chunks);  // per-row blocks
  w.activation = Scheme::kNone;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17), "fp8-gemv-chunks");  // weight-only
  w.activation = Scheme::kDynamicGroup128;
  absl::StatusOr<DeviceBuffer> blocks = DeviceBuffer::Allocate(16, "test");
  ASSERT_TRUE(blocks.ok());
  w.block_scales = *std::move(blocks);
  // 2 groups, not 4n: no cuBLASLt kernel; CUTLASS's (where built and sm_90) takes any k / 128.
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17),
               kernels::cuda::Fp8BlockGemmCutlassAvailable() ? "fp8-block-gemm" : row_or_chunks);
  w.grid.cols = 512;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 16), "fp8-gemv");
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 17), "fp8-block-gemm");
  // Batch 1 of 128-column groups: the W8A16 GEMV unless switched off; whole-row scales keep the
  // W8A8 GEMV (and 128 of 128 columns is a whole row).
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 1), "fp8-w8a16-gemv");
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 1, /*w8a16_gemv=*/false), "fp8-gemv");
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 2), "fp8-gemv");
  w.grid.block_cols = 512;
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 1), "fp8-gemv");
  w.grid = {64, 128, 1, 128};
  EXPECT_STREQ(CudaFp8Linear::PathFor(w, 1), "fp8-gemv");
}

// The CUTLASS row GEMM (per-row 128-column groups no block GEMM takes) at DeepSeek-V2-Lite's
// dense shapes cut to fewer rows: its down projection's k = 10,944 (85.5 groups), its fused
// gate_up (k = 2,048, per-row scales), every FP8 activation scheme, with and without a bias, m
// from 17 (one partial tile) to 300 (three tiles).
TEST(CudaFp8LinearTest, RowGemmMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CudaFp8Linear::RowGemmAvailable()) GTEST_SKIP() << "no CUTLASS row GEMM (build or device)";
  std::mt19937 rng(kernels::cuda_test::TestSeed() + 1);
  absl::StatusOr<std::unique_ptr<CudaFp8Linear>> linear = CudaFp8Linear::Create(300, 10944);
  ASSERT_TRUE(linear.ok()) << linear.status();
  ASSERT_TRUE((*linear)->row_gemm());
  CheckLinear(rng, **linear, 40, 64, 10944, 128, Scheme::kDynamicGroup128, false);
  CheckLinear(rng, **linear, 17, 136, 10944, 128, Scheme::kDynamicToken, true);
  CheckLinear(rng, **linear, 300, 272, 2048, 128, Scheme::kDynamicGroup128, true);
  CheckLinear(rng, **linear, 129, 200, 2048, 128, Scheme::kStaticTensor, false);
  EXPECT_STREQ((*linear)->last_path(), "fp8-cutlass-row-gemm");
}

// The swapped CUTLASS GEMM (whole-row weight scales, per-token or static activations) at every
// decode-sized m it takes by default or forced: a partial 32-row token tile (2, 5, 33), full ones
// (32, 64, 256), rows 16 / 17 on both sides of the GEMV bound, n a multiple of 8 but not of 128,
// k not a multiple of 128, whole and split along k (SwapSplits > 1, a last slice not a multiple
// of 128, bias added in the split reduction); against the CPU reference, codes_ready bit for bit
// (CheckLinear), and the other forced modes on the same shapes.
TEST(CudaFp8LinearTest, SwapGemmMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CudaFp8Linear::RowGemmAvailable()) GTEST_SKIP() << "no CUTLASS GEMM (build or device)";
  std::mt19937 rng(kernels::cuda_test::TestSeed() + 2);
  absl::StatusOr<std::unique_ptr<CudaFp8Linear>> linear = CudaFp8Linear::Create(256, 4096);
  ASSERT_TRUE(linear.ok()) << linear.status();
  for (Fp8DecodeGemm g : {Fp8DecodeGemm::kAuto, Fp8DecodeGemm::kCutlassSwap,
                          Fp8DecodeGemm::kCublasLt, Fp8DecodeGemm::kGemv}) {
    (*linear)->set_decode_gemm(g);
    for (int64_t m : {2, 5, 16, 17, 32, 33, 64}) {
      CheckLinear(rng, **linear, m, 136, 1040, 1040, Scheme::kDynamicToken, m % 2 == 1);
      CheckLinear(rng, **linear, m, 264, 512, 512, Scheme::kStaticTensor, m % 2 == 0);
    }
  }
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kAuto);
  CheckLinear(rng, **linear, 256, 200, 4096, 4096, Scheme::kDynamicToken, true);
  CheckLinear(rng, **linear, 9, 8192, 4096, 4096, Scheme::kDynamicToken, true);  // 32 Mi codes
  EXPECT_STREQ((*linear)->last_path(), "fp8-cutlass-swap-gemm");
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kCutlassSwap);
  CheckLinear(rng, **linear, 9, 4096, 4096, 4096, Scheme::kDynamicToken, false);
  EXPECT_STREQ((*linear)->last_path(), "fp8-cutlass-swap-gemm");
  // Token tiles (kAuto): 64 rows for weights of >= kFp8WideSwapMinN rows from 33 rows, 32 below
  // and for narrower weights; forced where set; 32 under kAutoNarrow.
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kAuto);
  EXPECT_EQ((*linear)->SwapTokenTile(32, 28672, 4096), 32);
  EXPECT_EQ((*linear)->SwapTokenTile(48, 28672, 4096), 64);
  EXPECT_EQ((*linear)->SwapTokenTile(160, 28672, 4096), 64);
  EXPECT_EQ((*linear)->SwapTokenTile(48, 8192, 8192), 32);
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kAutoNarrow);
  EXPECT_EQ((*linear)->SwapTokenTile(48, 28672, 4096), 32);
  (*linear)->set_swap_token_tile(64);
  EXPECT_EQ((*linear)->SwapTokenTile(48, 8192, 8192), 64);
  (*linear)->set_swap_token_tile(0);
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kCutlassSwap);
  // Split along k (few weight tiles): 2 slices of 640 + 400 columns, 8 of 512, and a weight of
  // Llama-3-8B's o_proj shape; a shape with many tiles or short k stays whole.
  EXPECT_EQ((*linear)->SwapSplits(5, 136, 1040), 2);
  EXPECT_GT((*linear)->SwapSplits(40, 200, 4096), 2);
  EXPECT_GT((*linear)->SwapSplits(9, 4096, 4096), 1);
  EXPECT_EQ((*linear)->SwapSplits(32, 28672, 4096), 1);
  EXPECT_EQ((*linear)->SwapSplits(17, 264, 512), 1);
  for (int64_t m : {2, 5, 33, 100}) {
    CheckLinear(rng, **linear, m, 136, 1040, 1040, Scheme::kDynamicToken, true);
    CheckLinear(rng, **linear, m, 200, 4096, 4096, Scheme::kStaticTensor, m % 2 == 1);
  }
  CheckLinear(rng, **linear, 17, 4096, 4096, 4096, Scheme::kDynamicToken, true);
}

// The swapped GEMM with 64-row token tiles (swap_token_tile): against the CPU reference at 2-256
// rows (partial and whole tiles, a bias, static scales), and bit for bit the 32-row tiles' output
// on the same operands. (A 128-row form passed the same checks on the H200 before it was dropped:
// kernels/fp8/BENCHMARKS.md, twenty-fifth session.)
TEST(CudaFp8LinearTest, WideSwapTokenTilesMatchTheNarrowOnes) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!CudaFp8Linear::RowGemmAvailable()) GTEST_SKIP() << "no CUTLASS GEMM (build or device)";
  std::mt19937 rng(kernels::cuda_test::TestSeed() + 3);
  absl::StatusOr<std::unique_ptr<CudaFp8Linear>> linear = CudaFp8Linear::Create(256, 4096);
  ASSERT_TRUE(linear.ok()) << linear.status();
  (*linear)->set_decode_gemm(Fp8DecodeGemm::kCutlassSwap);
  {
    (*linear)->set_swap_token_tile(64);
    for (int64_t m : {2, 65, 100, 128, 200, 256}) {
      CheckLinear(rng, **linear, m, 264, 1040, 1040, Scheme::kDynamicToken, m % 2 == 0);
      CheckLinear(rng, **linear, m, 136, 4096, 4096, Scheme::kStaticTensor, m % 2 == 1);
      EXPECT_STREQ((*linear)->last_path(), "fp8-cutlass-swap-gemm");
    }
  }
  // The same weight and rows through every tile width: the same bits.
  const int64_t m = 200, n = 1024, k = 2048;
  Fp8LinearWeight host;
  host.grid = {n, k, 1, k};
  host.activation = Scheme::kDynamicToken;
  host.codes.resize(n * k);
  for (uint8_t& c : host.codes) {
    do {
      c = static_cast<uint8_t>(rng());
    } while ((c & 0x7F) == 0x7F);
  }
  host.scales.assign(n, 0.0f);
  for (float& s : host.scales) s = std::exp2(std::uniform_real_distribution<float>(-9, -6)(rng));
  absl::StatusOr<CudaFp8Weight> w = UploadFp8Weight(&host, n, k, 256, "tiles");
  ASSERT_TRUE(w.ok()) << w.status();
  TestBuffer<bf16> x(RandomBf16(rng, m * k, 2.0f)), out(m * n);
  std::vector<bf16> first;
  for (int tile : {32, 64}) {
    (*linear)->set_swap_token_tile(tile);
    ASSERT_TRUE((*linear)->Linear(x.get(), *w, nullptr, m, out.get(), nullptr).ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> got = out.ToHost();
    if (first.empty()) {
      first = got;
      continue;
    }
    EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(bf16)), 0) << tile;
  }
}

TEST(CudaFp8LinearTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(AllocateFp8Weight({64, 60, 1, 60}, Scheme::kDynamicToken, 0.0f, 8).ok());  // k%16
  EXPECT_FALSE(AllocateFp8Weight({256, 256, 128, 128}, Scheme::kDynamicToken, 0.0f, 8).ok());
  EXPECT_FALSE(AllocateFp8Weight({64, 64, 1, 64}, Scheme::kStaticTensor, 0.0f, 8).ok());
  Fp8LinearWeight host;
  host.grid = {64, 64, 1, 64};
  host.codes.resize(64 * 64);
  host.scales.resize(64);
  EXPECT_FALSE(UploadFp8Weight(&host, 64, 128, 8, "wrong shape").ok());
}

// Device dummy FP8 weights: the fp32 draw quantized per row (or per 128 columns) on the device
// equals kernels::QuantizeWeight of the host's draw (what the CPU dummy path computes).
TEST(CudaFp8LinearTest, DummyRowsEqualTheHostQuantization) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int64_t block_cols : {int64_t{0}, int64_t{128}}) {
    const int64_t n = 48, k = 320, rows = 20, row0 = 12;
    const kernels::Fp8ScaleGrid grid{n, k, 1, block_cols > 0 ? 128 : k};
    absl::StatusOr<CudaFp8Weight> w = AllocateFp8Weight(grid, Scheme::kDynamicToken, 0.0f, 8);
    ASSERT_TRUE(w.ok()) << w.status();
    DummyTensorFill fill;
    fill.offset = row0 * k;
    fill.slice = DummySlice{k + 64, 3, rows, 64, k};  // columns 64.. of a wider tensor
    fill.stream_id = DummyStreamId("test.weight");
    TestBuffer<float> staging(rows * k);
    ASSERT_TRUE(FillFp8Dummy(fill, 7, staging.get(), &*w, nullptr).ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> draw(rows * k);
    for (int64_t i = 0; i < rows * k; ++i) {
      draw[i] = DummyValue(7, fill.stream_id, fill.slice.GlobalIndex(i), 0.0f);
    }
    const kernels::Fp8ScaleGrid part{rows, k, 1, grid.block_cols};
    std::vector<uint8_t> want_codes(rows * k);
    std::vector<float> want_scales(part.NumScales());
    kernels::QuantizeWeight(draw.data(), part, want_codes.data(), want_scales.data());
    std::vector<uint8_t> codes(n * k);
    std::vector<float> scales(grid.NumScales());
    TANDEM_CUDA_CHECK(cudaMemcpy(codes.data(), w->codes.data(), codes.size(), cudaMemcpyDefault));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(scales.data(), w->scales.data(), scales.size() * 4, cudaMemcpyDefault));
    // The device's double-precision log / cos may differ from glibc's in the last bit, which
    // can move a drawn fp32 value by one ulp: allow a rare code one step away, nothing more.
    int64_t differ = 0;
    for (int64_t i = 0; i < rows * k; ++i) {
      const int got = codes[row0 * k + i], want = want_codes[i];
      ASSERT_LE(std::abs(got - want), 1) << "element " << i;
      differ += got != want;
    }
    EXPECT_LE(differ, rows * k / 1000) << "codes off by one step";
    const int64_t g = grid.GridCols();
    for (int64_t i = 0; i < rows * g; ++i) {
      EXPECT_NEAR(scales[row0 * g + i], want_scales[i], 1e-6 * want_scales[i]) << "scale " << i;
    }
  }
  absl::StatusOr<CudaFp8Weight> w =
      AllocateFp8Weight({8, 64, 1, 64}, Scheme::kDynamicToken, 0.0f, 8);
  ASSERT_TRUE(w.ok()) << w.status();
  DummyTensorFill partial;
  partial.offset = 10;  // not a row start
  partial.slice = DummySlice{64, 0, 1, 0, 64};
  TestBuffer<float> staging(64);
  EXPECT_FALSE(FillFp8Dummy(partial, 1, staging.get(), &*w, nullptr).ok());
}

}  // namespace
}  // namespace tandem::runtime::cuda
