// The cuBLASLt FP8 GEMM (fp8_gemm_cuda.h) against the CPU reference cpu::Fp8Linear on fresh
// random inputs with random scales: per-tensor, per-token x per-channel (epilogue path, chunked
// and not; outer-vector mode where it exists), DeepSeek's 1x128 x 128x128 blocks, bias on and
// off, odd shapes; the epilogue kernel and the block-scale layouts on their own (GPU; the host
// layout test runs without one).
//
// Tolerance: the CPU reference is fp32 on exactly the GPU's codes (error ~1e-7 of the terms),
// so what remains is the GPU's accumulation: Hopper's FP8 MMA adds each instruction's products
// (32 along k for e4m3) and the running sum aligned to the largest of them with ~13 fraction
// bits (truncating: fp8_cuda_bench --probe_accumulation shows 448 + 31 * 2^-6 summing to 448),
// and cuBLASLt promotes to fp32 between instructions or k-tiles. The error of an output is
// therefore a few 2^-13 of its per-instruction largest magnitudes (Sigma_g max(|p in g|, |partial
// sum|)), which with heavy-tailed products (random e4m3 codes span 2^18) is far more than 2^-13
// of Sigma |p| at small k: the k = 272 failures of the earlier Sigma |p| tolerance.
#include "kernels/fp8/fp8_gemm_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_block_gemm_cuda.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_kernels.h"
#include "kernels/fp8/fp8_gemm_test_util.h"
#include "kernels/fp8/fp8_linear.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;

using fp8_gemm_test::CheckGemm;
using fp8_gemm_test::Name;
using fp8_gemm_test::RandomBf16;
using fp8_gemm_test::RandomCodes;
using fp8_gemm_test::Scaling;

constexpr std::tuple<int64_t, int64_t, int64_t> kGemmShapes[] = {
    {64, 256, 512}, {200, 384, 4096}, {17, 96, 1024}, {333, 80, 272}};

// Per-tensor scales through cuBLASLt's scale pointers, the bias in its BIAS epilogue.
TEST(Fp8GemmCudaTest, PerTensorMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  double worst = 0;
  for (auto [m, n, k] : kGemmShapes) {
    worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kTensor, m, n, k, m % 2 == 1));
    worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kTensor, m, n, k, m % 2 == 0));
  }
  std::printf("per-tensor: largest error / (2^-13 x per-MMA magnitude) %.3f\n", worst);
}

// Per-token x per-channel on the epilogue path (unit-scaled fp32 product + ScaleFp8Accumulator),
// what sm_90 runs: forced with try_outer_vector = false, once with the default accumulator and
// once with one of 64 rows of n = 384 (and fewer than 128 rows of the others), so m is cut into
// several cuBLASLt calls, the last one partial.
TEST(Fp8GemmCudaTest, TokenChannelEpilogueMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  double worst = 0;
  for (int64_t acc_bytes : {CublasLtFp8Gemm::kDefaultAccumulatorBytes, int64_t{64 * 384 * 4}}) {
    auto gemm = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes, acc_bytes,
                                        /*try_outer_vector=*/false);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    ASSERT_FALSE((*gemm)->outer_vector_scales());
    SCOPED_TRACE(::testing::Message() << "accumulator " << acc_bytes << " bytes, "
                                      << (*gemm)->EpilogueChunkRows(384) << " rows of n=384");
    for (auto [m, n, k] : kGemmShapes) {
      worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kTokenChannel, m, n, k, m % 2 == 0));
      worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kTokenChannel, m, n, k, m % 2 == 1));
    }
  }
  std::printf("token x channel: largest error / (2^-13 x per-MMA magnitude) %.3f\n", worst);
  auto tiny = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes, 16, false);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ((*tiny)->EpilogueChunkRows(384), 0);
  DeviceBuffer<uint8_t> codes(64 * 64);
  DeviceBuffer<float> scales(64);
  DeviceBuffer<bf16> out(64 * 64);
  EXPECT_EQ((*tiny)
                ->Linear(codes.get(), scales.get(), codes.get(), scales.get(),
                         Fp8GemmScaling::kTokenChannel, 64, 64, 64, out.get(), nullptr)
                .code(),
            absl::StatusCode::kResourceExhausted);  // no accumulator row fits
}

// cuBLASLt's outer-vector FP8 scale mode, only where Create found it (not on sm_90: CUDA 13's
// cuBLASLt has no kernel there); elsewhere this test says so and checks nothing else.
TEST(Fp8GemmCudaTest, OuterVectorMatchesTheCpuReferenceWhereItExists) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  if (!(*gemm)->outer_vector_scales()) {
    GTEST_SKIP() << "cuBLASLt has no outer-vector FP8 matmul on this GPU (sm_90 has none); "
                    "per-token x per-channel runs the epilogue path tested above";
  }
  std::mt19937 rng(cuda_test::TestSeed());
  for (auto [m, n, k] : kGemmShapes) {
    CheckGemm(rng, **gemm, Scaling::kTokenChannel, m, n, k, m % 2 == 1);
  }
}

// DeepSeek's block scaling through cuBLASLt's VEC128 / BLK128x128 modes: k with a partial last
// group (400), n with a partial last row block (200), m not a multiple of 8; m not a multiple
// of 4 (no cuBLASLt kernel on an H200) and k with padded weight-scale rows are refused. No bias:
// DeepSeek's projections have none, and the block + BIAS epilogue has not run on a GPU.
TEST(Fp8GemmCudaTest, Block128MatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE((*gemm)->set_block_kernel(Fp8BlockGemmKernel::kCublasLt).ok());  // not CUTLASS
  double worst = 0;
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 256, 512},
                         {200, 384, 4096},
                         {36, 256, 400},
                         {40, 200, 1024},
                         {100, 200, 1024}}) {
    worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kBlock, m, n, k, false));
  }
  std::printf("block: largest error / (2^-13 x per-MMA magnitude) %.3f\n", worst);
  DeviceBuffer<uint8_t> codes(20 * 512);
  DeviceBuffer<float> scales(64);
  DeviceBuffer<bf16> out(20 * 512);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{17, 512}, {20, 272}}) {
    EXPECT_EQ((*gemm)
                  ->Linear(codes.get(), scales.get(), codes.get(), scales.get(),
                           Fp8GemmScaling::kBlock128, m, 16, k, out.get(), nullptr)
                  .code(),
              absl::StatusCode::kUnimplemented)
        << "m=" << m << " k=" << k;
  }
}

// The kBlock128 dispatch where CUTLASS is built and the device is sm_90: by default CUTLASS for
// calls of >= kCutlassBlockMinRows rows and cuBLASLt below; TANDEM_FP8_BLOCK_GEMM=cublaslt (read
// by Create): cuBLASLt; =cutlass: CUTLASS at any m (here 17 and 7); cuBLASLt wherever CUTLASS
// does not take a call (k = 400: not a multiple of 128; a bias); each against the CPU reference,
// last_block_kernel() saying which ran. The CUTLASS call captured into a graph (m = 7: its
// padded scale copy too) replays bit for bit.
TEST(Fp8GemmCudaTest, Block128DispatchTakesCutlassForLargeCalls) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const bool cutlass = Fp8BlockGemmCutlassAvailable();
  EXPECT_EQ(DefaultFp8BlockGemmKernel(),
            cutlass ? Fp8BlockGemmKernel::kCutlass : Fp8BlockGemmKernel::kCublasLt);
  std::printf("CUTLASS block GEMM: %s\n", cutlass                      ? "the default, large calls"
                                          : Fp8BlockGemmCutlassBuilt() ? "built, device not sm_90"
                                                                       : "not built");
  const char* saved = std::getenv("TANDEM_FP8_BLOCK_GEMM");
  for (const char* env : {static_cast<const char*>(nullptr), "cublaslt", "cutlass"}) {
    SCOPED_TRACE(env == nullptr ? "TANDEM_FP8_BLOCK_GEMM unset" : env);
    if (env == nullptr) unsetenv("TANDEM_FP8_BLOCK_GEMM");
    if (env != nullptr) setenv("TANDEM_FP8_BLOCK_GEMM", env, 1);
    auto gemm = CublasLtFp8Gemm::Create();
    if (saved != nullptr) setenv("TANDEM_FP8_BLOCK_GEMM", saved, 1);
    if (saved == nullptr) unsetenv("TANDEM_FP8_BLOCK_GEMM");
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    const bool on_cutlass = cutlass && (env == nullptr || std::string_view(env) == "cutlass");
    const int64_t min_rows = env == nullptr ? kCutlassBlockMinRows : 0;
    const auto want = on_cutlass ? Fp8BlockGemmKernel::kCutlass : Fp8BlockGemmKernel::kCublasLt;
    EXPECT_EQ((*gemm)->block_kernel(), want);
    if (on_cutlass) {
      EXPECT_EQ((*gemm)->cutlass_min_rows(), min_rows);
    }
    for (auto [m, n, k, bias] : {std::tuple<int64_t, int64_t, int64_t, bool>{256, 384, 4096, false},
                                 {200, 200, 1024, false},
                                 {36, 256, 400, false},
                                 {64, 256, 512, true},
                                 {17, 256, 512, false},
                                 {kCutlassBlockMinRows, 256, 512, false},
                                 // 6 and 22 groups: no cuBLASLt kernel, CUTLASS at any m
                                 {256, 256, 768, false},
                                 {36, 256, 2816, false}}) {
      const bool cublaslt_takes = m % kBlock128RowMultiple == 0 && (k + 127) / 128 % 4 == 0;
      const bool cutlass_takes =
          on_cutlass && (m >= min_rows || !cublaslt_takes) && k % 128 == 0 && !bias;
      if (!cutlass_takes && !cublaslt_takes) continue;  // neither has a kernel
      CheckGemm(rng, **gemm, Scaling::kBlock, m, n, k, bias);
      EXPECT_EQ((*gemm)->last_block_kernel(),
                cutlass_takes ? Fp8BlockGemmKernel::kCutlass : Fp8BlockGemmKernel::kCublasLt)
          << "m=" << m << " n=" << n << " k=" << k << " bias=" << bias;
    }
  }
  if (!cutlass) return;
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok() && (*gemm)->set_block_kernel(Fp8BlockGemmKernel::kCutlass).ok());
  constexpr int64_t m = 7, n = 256, k = 1024;
  DeviceBuffer<uint8_t> a(RandomCodes(rng, m * k)), w(RandomCodes(rng, n * k));
  DeviceBuffer<float> a_scales(std::vector<float>(m * 8, 0x1p-6f)),
      w_scales(std::vector<float>(2 * 8, 0x1p-7f));
  DeviceBuffer<bf16> eager(m * n), replay(m * n);
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto run = [&](bf16* out) {
    return (*gemm)->Linear(a.get(), a_scales.get(), w.get(), w_scales.get(),
                           Fp8GemmScaling::kBlock128, m, n, k, out, stream);
  };
  ASSERT_TRUE(run(eager.get()).ok());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = run(replay.get());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  EXPECT_EQ((*gemm)->last_block_kernel(), Fp8BlockGemmKernel::kCutlass);
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<bf16> want = eager.ToHost(), got = replay.ToHost();
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(bf16)), 0);
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Our wgmma kernel (fp8_block_gemm_cuda.h), both ways of loading the scales and the multicast
// form, on the same layouts and the same reference: odd m (1, 17, 333), n not a multiple of its
// 128-column tile (8, 200, 1416), k not a multiple of 128 (16: less than one group; 144, 272 with
// padded weight-scale rows, 400), bias; 1500 x 1416 is 144 tiles, more than an H200's 132 SMs,
// so a persistent CTA runs two; with multicast, 3 m-tiles (333 rows) leave the second CTA of a
// cluster a tile past m, n = 8 a weight half past n and n = 200 a partial one. Refused: odd n,
// k not a multiple of 16, multicast with direct scales.
TEST(Fp8GemmCudaTest, Block128WgmmaMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!Fp8BlockGemmWgmmaSupported()) GTEST_SKIP() << "the wgmma kernel needs an sm_90 device";
  std::mt19937 rng(cuda_test::TestSeed());
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (Fp8BlockGemmKernel kernel :
       {Fp8BlockGemmKernel::kWgmma, Fp8BlockGemmKernel::kWgmmaDirectScales,
        Fp8BlockGemmKernel::kWgmmaMulticast}) {
    const char* name = kernel == Fp8BlockGemmKernel::kWgmma               ? "staged"
                       : kernel == Fp8BlockGemmKernel::kWgmmaDirectScales ? "direct"
                                                                          : "multicast, staged";
    SCOPED_TRACE(name);
    ASSERT_TRUE((*gemm)->set_block_kernel(kernel).ok());
    double worst = 0;
    for (auto [m, n, k, bias] : {std::tuple<int64_t, int64_t, int64_t, bool>{17, 256, 512, false},
                                 {333, 200, 272, true},
                                 {1, 8, 16, false},
                                 {64, 256, 400, true},
                                 {200, 384, 4096, false},
                                 {1500, 1416, 144, true}}) {
      worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kBlock, m, n, k, bias));
    }
    std::printf("block on wgmma (%s scales): largest error / (2^-13 x per-MMA magnitude) %.3f\n",
                name, worst);
  }
  DeviceBuffer<uint8_t> codes(32 * 512);
  DeviceBuffer<float> scales(64);
  DeviceBuffer<bf16> out(32 * 512);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{15, 512}, {16, 100}}) {
    EXPECT_EQ(Fp8BlockGemmWgmma(codes.get(), scales.get(), codes.get(), scales.get(), 17, n, k,
                                out.get(), nullptr, nullptr)
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << "n=" << n << " k=" << k;
  }
  EXPECT_EQ(Fp8BlockGemmWgmma(codes.get(), scales.get(), codes.get(), scales.get(), 17, 16, 512,
                              out.get(), nullptr, nullptr, {Fp8BlockScaleLoad::kDirect, true})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The overlapped forms of the wgmma kernel (Fp8BlockOverlap: 128 x 128 tiles with two partial
// register sets, 128 x 192 tiles in n96 halves, kAuto, and k192Serial), called directly, on the
// same reference: odd m (1, 17, 333), n not a multiple of either tile (8, 200, 392, 1416: 192-wide
// tiles straddling two weight blocks, the last one's second block past n), k with a partial last
// group and an odd number of groups (16, 272: the 128 form's tail), 144 with padded scale rows,
// 4096; bias; 2200 x 1416 is 18 x 8 = 144 tiles of 128 x 192 (and 18 x 12 of 128 x 128), more
// than an H200's 132 SMs. Refused: direct scales, multicast.
TEST(Fp8GemmCudaTest, Block128WgmmaOverlapMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!Fp8BlockGemmWgmmaSupported()) GTEST_SKIP() << "the wgmma kernel needs an sm_90 device";
  std::mt19937 rng(cuda_test::TestSeed());
  auto gemm = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE(Fp8BlockGemmWgmmaInit().ok());
  for (Fp8BlockOverlap overlap : {Fp8BlockOverlap::k128, Fp8BlockOverlap::k192,
                                  Fp8BlockOverlap::kAuto, Fp8BlockOverlap::k192Serial}) {
    const char* name = overlap == Fp8BlockOverlap::k128    ? "128 x 128"
                       : overlap == Fp8BlockOverlap::k192  ? "128 x 192"
                       : overlap == Fp8BlockOverlap::kAuto ? "auto"
                                                           : "128 x 192 serial";
    SCOPED_TRACE(name);
    const Fp8BlockWgmmaForm form{Fp8BlockScaleLoad::kStaged, false, overlap};
    double worst = 0;
    for (auto [m, n, k, bias] : {std::tuple<int64_t, int64_t, int64_t, bool>{17, 256, 512, false},
                                 {333, 200, 272, true},
                                 {1, 8, 16, false},
                                 {64, 384, 400, true},
                                 {200, 392, 4096, false},
                                 {2200, 1416, 144, true}}) {
      worst = std::max(worst, CheckGemm(rng, **gemm, Scaling::kBlock, m, n, k, bias, &form));
    }
    std::printf("block on wgmma, overlapped %s: largest error / (2^-13 x per-MMA magnitude) %.3f\n",
                name, worst);
  }
  DeviceBuffer<uint8_t> codes(32 * 512);
  DeviceBuffer<float> scales(64);
  DeviceBuffer<bf16> out(32 * 512);
  for (Fp8BlockWgmmaForm bad :
       {Fp8BlockWgmmaForm{Fp8BlockScaleLoad::kDirect, false, Fp8BlockOverlap::k128},
        Fp8BlockWgmmaForm{Fp8BlockScaleLoad::kStaged, true, Fp8BlockOverlap::k192}}) {
    EXPECT_EQ(Fp8BlockGemmWgmma(codes.get(), scales.get(), codes.get(), scales.get(), 17, 16, 512,
                                out.get(), nullptr, nullptr, bad)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  // kAuto's choice: 128 x 192 unless it takes over 1/16 more column-waves.
  EXPECT_EQ(Fp8BlockOverlapAutoTileN(2048, 4096, 132), 128);   // 4 x 128 vs 3 x 192
  EXPECT_EQ(Fp8BlockOverlapAutoTileN(8192, 36864, 132), 192);  // 140 x 128 vs 94 x 192
  EXPECT_EQ(Fp8BlockOverlapAutoTileN(2048, 6144, 132), 192);   // 6 x 128 vs 4 x 192
}

// The host layout helper: per-row scales of 128 x 128 blocks to cuBLASLt's padded block rows;
// rows of a block that differ are refused (no GPU needed).
TEST(Fp8GemmCudaTest, Block128WeightScalesLayout) {
  std::mt19937 rng(38);
  std::uniform_real_distribution<float> dist(0.01f, 2.0f);
  const int64_t n = 300, k = 700, groups = Block128Groups(k), ld = Block128WeightScaleLd(k);
  ASSERT_EQ(groups, 6);
  ASSERT_EQ(ld, 8);
  std::vector<float> blocks(3 * groups), rows(n * groups);
  for (float& s : blocks) s = dist(rng);
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(blocks.begin() + r / 128 * groups, groups, rows.begin() + r * groups);
  }
  absl::StatusOr<std::vector<float>> got = Block128WeightScales(rows.data(), {n, k, 1, 128});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u * ld);
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t g = 0; g < ld; ++g) {
      EXPECT_EQ((*got)[b * ld + g], g < groups ? blocks[b * groups + g] : 1.0f) << b << " " << g;
    }
  }
  rows[200 * groups + 5] *= 2.0f;  // row 200 of block 1 differs from row 128
  EXPECT_EQ(Block128WeightScales(rows.data(), {n, k, 1, 128}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Block128WeightScales(rows.data(), {n, k, 1, k}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// TransposeGroupScales against the host transpose: m and groups on and off the 32 x 32 tile
// (partial tiles in both directions, one group, more groups than a tile), the output buffer
// starting as NaN so an element left unwritten fails.
TEST(Fp8GemmCudaTest, TransposeGroupScales) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (auto [m, groups] : {std::pair<int64_t, int64_t>{333, 3},
                           {1, 56},
                           {4097, 7},
                           {32, 32},
                           {31, 1},
                           {65, 33},
                           {2048, 128},
                           {8195, 112},
                           {100, 257}}) {
    std::vector<float> scales(m * groups);
    for (float& s : scales) s = dist(rng);
    DeviceBuffer<float> in(scales), out(std::vector<float>(m * groups, std::nanf("")));
    ASSERT_TRUE(TransposeGroupScales(in.get(), m, groups, out.get(), nullptr).ok());
    const std::vector<float> got = out.ToHost();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        ASSERT_EQ(got[g * m + i], scales[i * groups + g]) << "m=" << m << " i=" << i;
      }
    }
  }
  EXPECT_FALSE(TransposeGroupScales(nullptr, 1, 1, nullptr, nullptr).ok());
}

// The epilogue kernel alone, both its vector (n % 4 == 0) and scalar forms, against fp64.
TEST(Fp8GemmCudaTest, ScaleFp8AccumulatorMatchesFp64) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::uniform_real_distribution<float> log_scale(-10.0f, 0.0f);
  for (auto [m, n] : {std::pair<int64_t, int64_t>{37, 4096}, {5, 131}, {3, 6}}) {
    for (bool with_bias : {false, true}) {
      std::vector<float> acc(m * n), as(m), ws(n);
      for (float& v : acc) v = dist(rng);
      for (float& v : as) v = std::exp2(log_scale(rng));
      for (float& v : ws) v = std::exp2(log_scale(rng));
      const std::vector<bf16> bias = RandomBf16(rng, n, 1.0f);
      DeviceBuffer<float> dacc(acc), das(as), dws(ws);
      DeviceBuffer<bf16> dbias(bias), out(m * n);
      ASSERT_TRUE(ScaleFp8Accumulator(dacc.get(), das.get(), dws.get(),
                                      with_bias ? dbias.get() : nullptr, m, n, out.get(), nullptr)
                      .ok());
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double product = double(acc[i * n + j]) * as[i] * ws[j];
          const double b = with_bias ? __bfloat162float(bias[j]) : 0.0;
          const double want = product + b;
          // One bf16 rounding of the fp32 result, plus fp32's own rounding of its terms.
          const double tol = 0x1p-8 * std::fabs(want) + 1e-6 * (std::fabs(product) + std::fabs(b));
          ASSERT_NEAR(got[i * n + j], want, tol + 1e-30)
              << "m=" << m << " n=" << n << " (" << i << ", " << j << ")";
        }
      }
    }
  }
  DeviceBuffer<float> f(4);
  DeviceBuffer<bf16> o(4);
  EXPECT_FALSE(
      ScaleFp8Accumulator(nullptr, f.get(), f.get(), nullptr, 1, 4, o.get(), nullptr).ok());
  EXPECT_FALSE(
      ScaleFp8Accumulator(f.get(), f.get(), f.get(), nullptr, 1, 0, o.get(), nullptr).ok());
}

// Timed algorithm choice (set_autotune_max_m) for every scaling path: whichever candidate wins
// still matches the CPU reference; a shape's second call finds its plan (no new plan, no second
// timing: num_cached_plans / num_tuned_plans unchanged).
TEST(Fp8GemmCudaTest, TunedChoiceMatchesTheCpuReferenceAndIsCached) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  int64_t tuned = 0;
  for (bool outer_vector : {true, false}) {
    auto gemm = CublasLtFp8Gemm::Create(CublasLtFp8Gemm::kDefaultWorkspaceBytes,
                                        CublasLtFp8Gemm::kDefaultAccumulatorBytes, outer_vector);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    ASSERT_TRUE((*gemm)->set_block_kernel(Fp8BlockGemmKernel::kCublasLt).ok());
    (*gemm)->set_autotune_max_m(kAutotuneAllM);
    for (Scaling scaling : {Scaling::kTensor, Scaling::kTokenChannel, Scaling::kBlock}) {
      if (!outer_vector && scaling != Scaling::kTokenChannel) continue;
      for (auto [m, n, k] :
           {std::tuple<int64_t, int64_t, int64_t>{64, 256, 512}, {200, 384, 4096}}) {
        SCOPED_TRACE(::testing::Message() << Name(scaling) << " m=" << m);
        CheckGemm(rng, **gemm, scaling, m, n, k, /*with_bias=*/false);
        const size_t plans = (*gemm)->num_cached_plans();
        const int64_t timed = (*gemm)->num_tuned_plans();
        CheckGemm(rng, **gemm, scaling, m, n, k, /*with_bias=*/false);  // fresh data, same shape
        EXPECT_EQ((*gemm)->num_cached_plans(), plans);
        EXPECT_EQ((*gemm)->num_tuned_plans(), timed);
      }
    }
    tuned += (*gemm)->num_tuned_plans();
  }
  // cuBLASLt offers several FP8 algorithms for these shapes on an H200; 0 would mean the
  // timing never ran.
  EXPECT_GT(tuned, 0);
  std::printf("tuned FP8 GEMM: %ld plans timed\n", static_cast<long>(tuned));
}

// A shape first met inside a stream capture is not timed (timing synchronizes): the capture
// succeeds, its graph replays the heuristic's first choice (equal to an untuned GEMM's output),
// and the next eager call times it, still correct.
TEST(Fp8GemmCudaTest, TuningIsDeferredOutOfGraphCapture) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto tuned = CublasLtFp8Gemm::Create();
  auto first = CublasLtFp8Gemm::Create();
  ASSERT_TRUE(tuned.ok() && first.ok());
  (*tuned)->set_autotune_max_m(kAutotuneAllM);
  constexpr int64_t m = 128, n = 256, k = 1024;
  std::vector<uint8_t> a_codes = RandomCodes(rng, m * k), w_codes = RandomCodes(rng, n * k);
  DeviceBuffer<uint8_t> da(a_codes), dw(w_codes);
  DeviceBuffer<float> scale(std::vector<float>{0x1p-8f});
  DeviceBuffer<bf16> want(m * n), got(m * n);
  ASSERT_TRUE((*first)
                  ->Linear(da.get(), scale.get(), dw.get(), scale.get(), Fp8GemmScaling::kTensor, m,
                           n, k, want.get(), nullptr)
                  .ok());
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured =
      (*tuned)->Linear(da.get(), scale.get(), dw.get(), scale.get(), Fp8GemmScaling::kTensor, m, n,
                       k, got.get(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  EXPECT_EQ((*tuned)->num_tuned_plans(), 0);
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> ref = cuda_test::ToFloat(want.ToHost());
  auto expect_close = [&](const char* what) {
    // Another algorithm sums in another order: a few bf16 ulps of the output's scale.
    const std::vector<float> out = cuda_test::ToFloat(got.ToHost());
    double scale_max = 0, worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale_max = std::max(scale_max, std::fabs(double(ref[i])));
      worst = std::max(worst, std::fabs(double(out[i]) - ref[i]));
    }
    EXPECT_LE(worst, 0x1p-6 * scale_max) << what;
  };
  expect_close("graph replay");
  ASSERT_TRUE((*tuned)
                  ->Linear(da.get(), scale.get(), dw.get(), scale.get(), Fp8GemmScaling::kTensor, m,
                           n, k, got.get(), stream)
                  .ok());
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_close("tuned eager call");
  EXPECT_EQ((*tuned)->num_cached_plans(), (*first)->num_cached_plans());
  std::printf("deferred tuning: %ld plans timed after the eager call\n",
              static_cast<long>((*tuned)->num_tuned_plans()));
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tandem::kernels::cuda
