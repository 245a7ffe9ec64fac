// The W_UK / W_UV absorption steps (mla_cuda.h MlaAbsorbQuery, MlaUnabsorbOutput) against an fp64
// CPU reference on the same bf16/fp16-rounded random inputs, on each path (MlaAbsorbOptions): the
// decode GEMVs of mla_absorb_gemv_cuda.cu (the model runs them at one token; forced, at 2, 3, 5,
// 8 and 11 tokens too: a CTA row per token), with and without PDL, and cuBLAS's strided-batched
// GEMM; at DeepSeek-V2-Lite's and DeepSeek-V3's widths (64- and 128-column W_UK tiles; 1 and 4
// W_UV rows a warp) and the tiny test models' (latent 32, 16 / 12-wide heads; a latent of 1000;
// an odd v_head_dim). Tolerance: within 1e-2 of max|ref| (one rounding of the output to T; fp32
// sums in another order). q_cat's rope part is a copy: exact. The one-token rows also equal the
// first row of the four-token run within the same bound, and the PDL launch changes no bit.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/pdl_test_util.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

// Uniform in [-1, 1), rounded to T.
template <typename T>
std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  cuda_test::RoundTo<T>(x);
  return x;
}

// max|got - want| <= 1e-2 max|want| (and want not all zero).
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const char* what,
                 int64_t tokens) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(want[i]));
    max_err = std::max(max_err, std::abs(got[i] - want[i]));
  }
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_err, 1e-2 * max_ref) << what << ", " << tokens << " tokens";
  std::cout << what << " (" << tokens << " tokens): max|err| " << max_err << " of max|ref| "
            << max_ref << "\n";
}

// Both steps over `tokens` tokens of the device inputs: q_cat and out, as floats.
struct Absorbed {
  std::vector<float> q_cat, out;
};
template <typename T>
Absorbed RunSteps(cublasHandle_t cublas, const MlaDims& d, int64_t tokens, const T* q,
                  const T* kv_b, const T* o_lat, const MlaAbsorbOptions& options = {}) {
  const int64_t rows = tokens * d.num_heads;
  DeviceBuffer<T> q_cat(rows * d.LatentDim()), out(rows * d.v_head_dim);
  const absl::Status a =
      MlaAbsorbQuery<T>(cublas, q, kv_b, d, tokens, q_cat.get(), nullptr, options);
  const absl::Status b =
      MlaUnabsorbOutput<T>(cublas, o_lat, kv_b, d, tokens, out.get(), nullptr, options);
  EXPECT_TRUE(a.ok()) << a;
  EXPECT_TRUE(b.ok()) << b;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {cuda_test::ToFloat(q_cat.ToHost()), cuda_test::ToFloat(out.ToHost())};
}

// Random bf16/fp16-rounded inputs of `tokens` tokens on the host and the device.
template <typename T>
struct Inputs {
  Inputs(const MlaDims& d, int64_t tokens, std::mt19937& rng)
      : q(Random<T>(tokens * d.num_heads * (d.qk_nope_head_dim + d.qk_rope_head_dim), rng)),
        kv_b(Random<T>(d.num_heads * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank, rng)),
        o_lat(Random<T>(tokens * d.num_heads * d.kv_lora_rank, rng)),
        q_d(cuda_test::Convert<T>(q)),
        kv_b_d(cuda_test::Convert<T>(kv_b)),
        o_lat_d(cuda_test::Convert<T>(o_lat)) {}
  std::vector<float> q, kv_b, o_lat;
  DeviceBuffer<T> q_d, kv_b_d, o_lat_d;
};

// The three paths: the model's default, the GEMVs for any token count under PDL, cuBLAS only.
constexpr MlaAbsorbOptions kPaths[] = {
    {}, {.gemv_max_tokens = 1 << 20, .pdl = true}, {.gemv_max_tokens = 0}};
constexpr const char* kPathNames[] = {"default", "GEMV+PDL", "cuBLAS"};

template <typename T>
void RunCase(const MlaDims& d, int64_t tokens, std::mt19937& rng, cublasHandle_t cublas) {
  const int64_t H = d.num_heads, Dn = d.qk_nope_head_dim, Dr = d.qk_rope_head_dim;
  const int64_t L = d.kv_lora_rank, Dv = d.v_head_dim, D = d.LatentDim();
  const Inputs<T> in(d, tokens, rng);
  std::vector<double> want_q(tokens * H * D, 0.0), want_o(tokens * H * Dv, 0.0);
  for (int64_t th = 0; th < tokens * H; ++th) {  // (token, head) rows
    const float* qn = in.q.data() + th * (Dn + Dr);
    const float* w = in.kv_b.data() + (th % H) * (Dn + Dv) * L;
    double* qc = want_q.data() + th * D;
    for (int64_t dn = 0; dn < Dn; ++dn) {
      for (int64_t l = 0; l < L; ++l) qc[l] += double{w[dn * L + l]} * qn[dn];
    }
    for (int64_t r = 0; r < Dr; ++r) qc[L + r] = qn[Dn + r];
    const float* ol = in.o_lat.data() + th * L;
    for (int64_t v = 0; v < Dv; ++v) {
      double s = 0.0;
      for (int64_t l = 0; l < L; ++l) s += double{w[(Dn + v) * L + l]} * ol[l];
      want_o[th * Dv + v] = s;
    }
  }
  for (int p = 0; p < 3; ++p) {
    SCOPED_TRACE(kPathNames[p]);
    const Absorbed got =
        RunSteps<T>(cublas, d, tokens, in.q_d.get(), in.kv_b_d.get(), in.o_lat_d.get(), kPaths[p]);
    ExpectClose(got.q_cat, want_q, "MlaAbsorbQuery", tokens);
    for (int64_t th = 0; th < tokens * H; ++th) {
      for (int64_t r = 0; r < Dr; ++r) {
        ASSERT_EQ(got.q_cat[th * D + L + r], want_q[th * D + L + r]) << "q_pe copy, row " << th;
      }
    }
    ExpectClose(got.out, want_o, "MlaUnabsorbOutput", tokens);
  }
}

TEST(MlaAbsorbCudaTest, OneTokenGemvAndCublasMatchTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  const MlaDims tiny{.num_heads = 4,
                     .qk_nope_head_dim = 16,
                     .qk_rope_head_dim = 8,
                     .kv_lora_rank = 32,
                     .v_head_dim = 12};
  // kV3Dims and long_latent (>= 8192 rows of W_UV a token): the W_UV GEMV's 4 rows a warp, the
  // latter over a latent of 125 chunks (a lane's second chunk partly idle); kLiteDims, tiny and
  // odd_v (a v_head_dim that is no multiple of 4): a row a warp.
  const MlaDims long_latent{.num_heads = 64,
                            .qk_nope_head_dim = 16,
                            .qk_rope_head_dim = 8,
                            .kv_lora_rank = 1000,
                            .v_head_dim = 128};
  const MlaDims odd_v{.num_heads = 2,
                      .qk_nope_head_dim = 16,
                      .qk_rope_head_dim = 8,
                      .kv_lora_rank = 64,
                      .v_head_dim = 6};
  for (int64_t tokens : {1, 2, 3, 5, 8, 11}) {
    for (const MlaDims& d : {mla_test::kLiteDims, mla_test::kV3Dims, tiny, long_latent, odd_v}) {
      RunCase<__nv_bfloat16>(d, tokens, rng, cublas);
      RunCase<__half>(d, tokens, rng, cublas);
    }
  }
  cublasDestroy(cublas);
}

// A one-token step's rows are the first rows of a four-token cuBLAS step's (the GEMV and the
// GEMM differ only in the fp32 summation order).
TEST(MlaAbsorbCudaTest, OneTokenRowsEqualALongerStepsFirstRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  using T = __nv_bfloat16;
  const MlaDims d = mla_test::kLiteDims;
  const Inputs<T> in(d, 4, rng);
  const Absorbed one = RunSteps<T>(cublas, d, 1, in.q_d.get(), in.kv_b_d.get(), in.o_lat_d.get());
  const Absorbed four = RunSteps<T>(cublas, d, 4, in.q_d.get(), in.kv_b_d.get(), in.o_lat_d.get(),
                                    {.gemv_max_tokens = 0});
  // The PDL launch of the GEMVs: the same arithmetic, so the same bits.
  const Absorbed one_pdl =
      RunSteps<T>(cublas, d, 1, in.q_d.get(), in.kv_b_d.get(), in.o_lat_d.get(), {.pdl = true});
  cublasDestroy(cublas);
  EXPECT_EQ(one_pdl.q_cat, one.q_cat);
  EXPECT_EQ(one_pdl.out, one.out);
  for (int i = 0; i < 2; ++i) {
    const std::vector<float>& a = i == 0 ? one.q_cat : one.out;
    const std::vector<float>& b = i == 0 ? four.q_cat : four.out;
    float max_ref = 0.0f, max_diff = 0.0f;
    for (size_t j = 0; j < a.size(); ++j) {  // the one-token rows, b's first
      max_ref = std::max(max_ref, std::abs(b[j]));
      max_diff = std::max(max_diff, std::abs(a[j] - b[j]));
    }
    EXPECT_GT(max_ref, 0.0f);
    EXPECT_LE(max_diff, 1e-2f * max_ref) << (i == 0 ? "MlaAbsorbQuery" : "MlaUnabsorbOutput");
  }
}

// Under PDL the GEMVs issue weight loads before griddepcontrol.wait and must read q / o_lat only
// after it: both PDL-launched (W_UK, then W_UV behind it) behind pdl_test::LaunchDelayedWriter,
// which lets them start at once and writes q and o_lat (NaN bytes until then) ~1 ms later. The
// results equal a plain launch's bit for bit.
TEST(MlaAbsorbCudaTest, PdlLaunchReadsTheActivationsAfterTheWait) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  using T = __nv_bfloat16;
  for (const MlaDims& d : {mla_test::kLiteDims, mla_test::kV3Dims}) {
    for (int64_t tokens : {1, 4}) {
      const Inputs<T> in(d, tokens, rng);
      const Absorbed want = RunSteps<T>(cublas, d, tokens, in.q_d.get(), in.kv_b_d.get(),
                                        in.o_lat_d.get(), {.gemv_max_tokens = 1 << 20});
      const int64_t rows = tokens * d.num_heads;
      DeviceBuffer<T> q(in.q.size()), o_lat(in.o_lat.size());
      DeviceBuffer<T> q_cat(rows * d.LatentDim()), out(rows * d.v_head_dim);
      TANDEM_CUDA_CHECK(cudaMemset(q.get(), 0xff, in.q.size() * sizeof(T)));
      TANDEM_CUDA_CHECK(cudaMemset(o_lat.get(), 0xff, in.o_lat.size() * sizeof(T)));
      TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
      cudaStream_t stream = nullptr;
      TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      TANDEM_CUDA_CHECK(pdl_test::LaunchDelayedWriter(
          {q.get(), in.q_d.get(), in.q.size() * sizeof(T)},
          {o_lat.get(), in.o_lat_d.get(), in.o_lat.size() * sizeof(T)}, 2'000'000, stream));
      const MlaAbsorbOptions pdl{.gemv_max_tokens = 1 << 20, .pdl = true};
      ASSERT_TRUE(
          MlaAbsorbQuery<T>(cublas, q.get(), in.kv_b_d.get(), d, tokens, q_cat.get(), stream, pdl)
              .ok());
      ASSERT_TRUE(MlaUnabsorbOutput<T>(cublas, o_lat.get(), in.kv_b_d.get(), d, tokens, out.get(),
                                       stream, pdl)
                      .ok());
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
      EXPECT_EQ(cuda_test::ToFloat(q_cat.ToHost()), want.q_cat)
          << d.num_heads << " heads, " << tokens << " tokens";
      EXPECT_EQ(cuda_test::ToFloat(out.ToHost()), want.out)
          << d.num_heads << " heads, " << tokens << " tokens";
    }
  }
  cublasDestroy(cublas);
}

}  // namespace
}  // namespace tandem::kernels::cuda
