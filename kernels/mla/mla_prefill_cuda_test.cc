// The unabsorbed CUDA MLA prefill (mla_cuda.h, MlaUnabsorbedAttention) against the CPU reference
// cpu::MlaPagedAttention (kUnabsorbed) on the same bf16/fp16-rounded random inputs, latents in
// shuffled pages: pure prefill (no prefix), chunked prefill over a paged prefix, batches mixing
// decode rows with long query runs, odd lengths across page boundaries (pages of 5, 16, 64),
// DeepSeek's widths (Dn 128 + Dr 64, V 128: the prefill kernel's 192 / 128 variant) at 16 and
// 128 heads, and widths with V as wide as K (64, 128). The LSE (what chunked prefill merges by) is
// checked too, and the same step through the absorbed path (MlaAbsorbedAttention) must agree.
// Tolerance as mla_cuda_test_util.h: out within 2.5e-2 of max|ref|, LSE within 2e-2. Refusals: an
// FP8 pool, a DCP shard, widths the prefill kernel does not take.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_test_util.h"
#include "kernels/threading/thread_pool.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

struct Case {
  MlaDims dims;
  std::vector<int32_t> q_lens, seq_lens;
  int64_t block_size = 16;
};

struct Errors {
  float out = 0.0f, lse = 0.0f, max_ref = 0.0f;
};

Errors Compare(const std::vector<float>& want, const std::vector<float>& want_lse,
               const std::vector<float>& got, const std::vector<float>& got_lse) {
  Errors e;
  for (size_t i = 0; i < want.size(); ++i) {
    e.max_ref = std::max(e.max_ref, std::abs(want[i]));
    e.out = std::max(e.out, std::abs(got[i] - want[i]));
  }
  for (size_t i = 0; i < want_lse.size(); ++i) {
    e.lse = std::max(e.lse, std::abs(got_lse[i] - want_lse[i]));
  }
  return e;
}

template <typename T>
void RunCase(const Case& c, std::mt19937& rng, ThreadPool* pool) {
  const MlaDims& d = c.dims;
  const int64_t S = static_cast<int64_t>(c.seq_lens.size()), bs = c.block_size;
  const int64_t D = d.LatentDim(), H = d.num_heads;
  int64_t max_q = 1, total_ctx = 0;
  std::vector<int32_t> qsl = {0};
  for (int64_t s = 0; s < S; ++s) {
    max_q = std::max<int64_t>(max_q, c.q_lens[s]);
    total_ctx += c.seq_lens[s];
    qsl.push_back(qsl.back() + c.q_lens[s]);
  }
  mla_test::ShuffledPages pages = mla_test::ShufflePages(c.seq_lens, bs, rng);
  const int64_t max_blocks = pages.max_blocks, max_len = pages.max_len;
  const std::vector<int32_t>& tables = pages.tables;
  const std::vector<int64_t>& slots = pages.slots;
  const KvCacheLayout layout = pages.Layout(bs, D);
  const int64_t n_lat = static_cast<int64_t>(slots.size()), T_tok = qsl.back();
  std::vector<float> latent = attention_test::RandomNormal(rng, n_lat * D, 1.0f);
  std::vector<float> q = attention_test::RandomNormal(rng, T_tok * H * d.QkHeadDim(), 1.0f);
  std::vector<float> kv_b =
      attention_test::RandomNormal(rng, H * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank,
                                   0.5f / std::sqrt(float(d.qk_nope_head_dim)));
  for (auto* v : {&latent, &q, &kv_b}) cuda_test::RoundTo<T>(*v);
  std::vector<float> pool_h(layout.TotalElems(), 0.0f);
  ASSERT_TRUE(
      cpu::WriteLatentCache(latent.data(), slots.data(), n_lat, 1, {pool_h.data(), layout}).ok());
  AttentionBatch hb{qsl.data(), c.seq_lens.data(), tables.data(), S, max_blocks, nullptr};
  const float scale = 1.0f / std::sqrt(float(d.QkHeadDim()));
  std::vector<float> want(T_tok * H * d.v_head_dim), want_lse(T_tok * H);
  ASSERT_TRUE(cpu::MlaPagedAttention(q.data(), kv_b.data(), d, {pool_h.data(), layout}, 1, hb,
                                     scale, MlaMode::kUnabsorbed, want.data(), want_lse.data(),
                                     pool)
                  .ok());

  DeviceBuffer<T> pool_d(cuda_test::Convert<T>(pool_h)), q_d(cuda_test::Convert<T>(q)),
      kv_b_d(cuda_test::Convert<T>(kv_b)), out_d(T_tok * H * d.v_head_dim),
      abs_out_d(T_tok * H * d.v_head_dim);
  DeviceBuffer<int32_t> qsl_d(qsl), lens_d(c.seq_lens), tables_d(tables);
  DeviceBuffer<float> lse_d(T_tok * H), abs_lse_d(T_tok * H);
  const KvDtype dt = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  const DeviceKvCache cache{.data = pool_d.get(), .layout = layout, .dtype = dt};
  const MlaPlanInput in{
      .dims = d, .num_seqs = S, .num_tokens = T_tok, .max_q_len = max_q, .max_seq_len = max_len};
  // A loose context bound (the model's num_seqs x max_seq_len) for one case in two.
  const int64_t bound = (rng() % 2 == 0) ? total_ctx : S * max_len;
  absl::StatusOr<MlaUnabsorbedPlan> plan = PlanMlaUnabsorbed(in, bound);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<MlaPlan> abs_plan = PlanMla(in);
  ASSERT_TRUE(abs_plan.ok()) << abs_plan.status();
  DeviceBuffer<unsigned char> ws(plan->workspace_bytes), abs_ws(abs_plan->workspace_bytes);
  // Garbage in the workspace: nothing may read what the step did not write.
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0xff, plan->workspace_bytes));
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  const AttentionBatch db{qsl_d.get(), lens_d.get(), tables_d.get(), S, max_blocks, nullptr};
  absl::Status st = MlaUnabsorbedAttention<T>(cublas, q_d.get(), kv_b_d.get(), cache, 1, db, scale,
                                              *plan, ws.get(), out_d.get(), lse_d.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  st = MlaAbsorbedAttention<T>(cublas, q_d.get(), kv_b_d.get(), cache, 1, db, scale, *abs_plan,
                               abs_ws.get(), abs_out_d.get(), abs_lse_d.get(), nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  cublasDestroy(cublas);
  const Errors e = Compare(want, want_lse, cuda_test::ToFloat(out_d.ToHost()), lse_d.ToHost());
  const Errors ea =
      Compare(want, want_lse, cuda_test::ToFloat(abs_out_d.ToHost()), abs_lse_d.ToHost());
  EXPECT_GT(e.max_ref, 0.0f);
  EXPECT_LE(e.out, 2.5e-2f * e.max_ref);
  EXPECT_LE(e.lse, 2e-2f);
  EXPECT_LE(ea.out, 2.5e-2f * e.max_ref);
  EXPECT_LE(ea.lse, 2e-2f);
  std::cout << "H " << H << " Dqk " << d.QkHeadDim() << " Dv " << d.v_head_dim << " page " << bs
            << " ctx bound " << bound << "/" << total_ctx << ": unabsorbed max|err| " << e.out
            << " of max|ref| " << e.max_ref << ", lse " << e.lse << "; absorbed " << ea.out
            << ", lse " << ea.lse << "\n";
}

constexpr MlaDims kLite = mla_test::kLiteDims;
constexpr MlaDims kV3 = mla_test::kV3Dims;

TEST(MlaPrefillCudaTest, UnabsorbedMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  ThreadPool pool(8);
  // Pure prefill, no prefix; odd lengths across pages of 16.
  RunCase<__nv_bfloat16>({kLite, {77}, {77}, 16}, rng, &pool);
  // Chunked prefill: a chunk of 129 over a prefix of 871 (pages of 64), and the chunk before it.
  RunCase<__nv_bfloat16>({kLite, {129}, {1000}, 64}, rng, &pool);
  RunCase<__nv_bfloat16>({kLite, {500}, {871}, 64}, rng, &pool);
  // A batch: a decode row, a pure prefill, a chunk over a prefix, pages of 5.
  RunCase<__nv_bfloat16>({kLite, {1, 200, 65, 3}, {5, 200, 333, 64}, 5}, rng, &pool);
  RunCase<__half>({kLite, {31, 2}, {95, 130}, 16}, rng, &pool);
  // DeepSeek-V3's 128 heads.
  RunCase<__nv_bfloat16>({kV3, {40, 17}, {150, 17}, 64}, rng, &pool);
  // V as wide as K: 64 and 128.
  RunCase<__nv_bfloat16>({{.num_heads = 8,
                           .qk_nope_head_dim = 48,
                           .qk_rope_head_dim = 16,
                           .kv_lora_rank = 64,
                           .v_head_dim = 64},
                          {33, 70},
                          {100, 70},
                          16},
                         rng, &pool);
  RunCase<__half>({{.num_heads = 4,
                    .qk_nope_head_dim = 96,
                    .qk_rope_head_dim = 32,
                    .kv_lora_rank = 256,
                    .v_head_dim = 128},
                   {90},
                   {257},
                   32},
                  rng, &pool);
}

TEST(MlaPrefillCudaTest, RefusesWhatItDoesNotTake) {
  TANDEM_SKIP_WITHOUT_GPU();
  const MlaPlanInput in{
      .dims = kLite, .num_seqs = 1, .num_tokens = 8, .max_q_len = 8, .max_seq_len = 8};
  ASSERT_TRUE(PlanMlaUnabsorbed(in, 8).ok());
  EXPECT_FALSE(PlanMlaUnabsorbed(in, 7).ok());  // bound below max_seq_len
  MlaPlanInput dcp = in;
  dcp.dcp = {2, 0, 1};
  EXPECT_FALSE(PlanMlaUnabsorbed(dcp, 8).ok());
  MlaPlanInput tiny = in;  // the tiny test models' widths: Dn + Dr = 24
  tiny.dims = {.num_heads = 4,
               .qk_nope_head_dim = 16,
               .qk_rope_head_dim = 8,
               .kv_lora_rank = 32,
               .v_head_dim = 16};
  EXPECT_FALSE(PlanMlaUnabsorbed(tiny, 8).ok());
  tiny.dims = kLite;  // V of 64 with K of 192: no kernel variant
  tiny.dims.v_head_dim = 64;
  EXPECT_FALSE(PlanMlaUnabsorbed(tiny, 8).ok());
  // An FP8 latent pool: refused by the call, nothing launched.
  absl::StatusOr<MlaUnabsorbedPlan> plan = PlanMlaUnabsorbed(in, 8);
  const KvCacheLayout layout{.num_blocks = 1,
                             .num_layers = 1,
                             .block_size = 16,
                             .num_kv_heads = 1,
                             .head_dim = kLite.LatentDim(),
                             .num_planes = 1};
  DeviceBuffer<uint8_t> codes(layout.TotalElems());
  DeviceBuffer<float> scales(16);
  DeviceKvCache fp8{.data = codes.get(), .layout = layout, .dtype = KvDtype::kFp8E4m3};
  fp8.token_scales = scales.get();
  DeviceBuffer<__nv_bfloat16> q(8 * 16 * 192), out(8 * 16 * 128);
  DeviceBuffer<unsigned char> ws(plan->workspace_bytes);
  DeviceBuffer<int32_t> meta(16);
  const AttentionBatch b{meta.get(), meta.get(), meta.get(), 1, 1, nullptr};
  EXPECT_FALSE(MlaUnabsorbedAttention<__nv_bfloat16>(reinterpret_cast<cublasHandle_t>(1), q.get(),
                                                     q.get(), fp8, 0, b, 0.1f, *plan, ws.get(),
                                                     out.get(), nullptr, nullptr)
                   .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
