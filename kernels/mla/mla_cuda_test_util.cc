// The absorbed-MLA GPU tests' shared harness (mla_cuda_test_util.h).
#include "kernels/mla/mla_cuda_test_util.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_fp8_latent.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda::mla_cuda_test {

using cuda_test::DeviceBuffer;

template <typename T>
void RunCase(const Case& c, std::mt19937& rng) {
  const MlaDims& d = c.dims;
  const int64_t S = static_cast<int64_t>(c.seq_lens.size()), bs = c.block_size;
  const int64_t D = d.LatentDim(), L = d.kv_lora_rank, H = d.num_heads;
  int64_t max_q = 1;
  std::vector<int32_t> local_lens(S), qsl = {0};  // the shard's latents (all without DCP)
  for (int64_t s = 0; s < S; ++s) {
    local_lens[s] = static_cast<int32_t>(DcpLocalCount(c.seq_lens[s], c.dcp));
    max_q = std::max<int64_t>(max_q, c.q_lens[s]);
    qsl.push_back(qsl.back() + c.q_lens[s]);
  }
  mla_test::ShuffledPages pages = mla_test::ShufflePages(local_lens, bs, rng);
  const int64_t max_blocks = pages.max_blocks, max_len = pages.max_len;
  const std::vector<int32_t>& tables = pages.tables;
  const std::vector<int64_t>& slots = pages.slots;
  const KvCacheLayout layout = pages.Layout(bs, D);
  const int64_t n_lat = static_cast<int64_t>(slots.size()), T_tok = qsl.back();
  // Latents as the model produces them: c_kv rows and k_pe rows in separate strided buffers.
  std::vector<float> ckv = attention_test::RandomNormal(rng, n_lat * (L + 3), 1.0f);
  std::vector<float> kpe = attention_test::RandomNormal(rng, n_lat * d.qk_rope_head_dim, 1.0f);
  std::vector<float> q = attention_test::RandomNormal(rng, T_tok * H * d.QkHeadDim(), 1.0f);
  std::vector<float> kv_b =
      attention_test::RandomNormal(rng, H * (d.qk_nope_head_dim + d.v_head_dim) * L,
                                   0.5f / std::sqrt(float(d.qk_nope_head_dim)));
  for (auto* v : {&ckv, &kpe, &q, &kv_b}) cuda_test::RoundTo<T>(*v);
  // The bf16 / fp16 pool starts all NaN (bytes 0xff, on the device too): slots no request owns,
  // rows past a context's end inside its last page, must never reach a result (the kernels read
  // whole pages, tiles and boxes; masked scores are selected away and V rows past the end zeroed).
  std::vector<float> latent(n_lat * D), pool(layout.TotalElems(), std::nanf(""));
  for (int64_t j = 0; j < n_lat; ++j) {
    std::copy_n(ckv.data() + j * (L + 3), L, latent.data() + j * D);
    std::copy_n(kpe.data() + j * d.qk_rope_head_dim, d.qk_rope_head_dim, latent.data() + j * D + L);
  }
  std::vector<uint8_t> codes(c.fp8 ? layout.TotalElems() : 0);
  std::vector<float> row_scales(c.fp8 ? layout.TotalElems() / D : 0, 0.0f);
  cpu::Fp8LatentCacheView fp8_view{codes.data(), row_scales.data(), layout};
  // The block-interleaved form: one buffer of num_blocks blocks, each its codes then its scales.
  const int64_t block_bytes = layout.BlockElems() + layout.BlockElems() / D * 4;
  std::vector<float> blocks_words(c.fp8_blocks ? layout.num_blocks * block_bytes / 4 : 0, 0.0f);
  auto* blocks8 = reinterpret_cast<uint8_t*>(blocks_words.data());
  if (c.fp8_blocks) {
    fp8_view = {blocks8, reinterpret_cast<float*>(blocks8 + layout.BlockElems()), layout,
                block_bytes};
  }
  if (c.fp8) {
    ASSERT_TRUE(cpu::WriteLatentCacheFp8(latent.data(), slots.data(), n_lat, 1, fp8_view).ok());
  } else {
    ASSERT_TRUE(
        cpu::WriteLatentCache(latent.data(), slots.data(), n_lat, 1, {pool.data(), layout}).ok());
  }
  AttentionBatch hb{qsl.data(), c.seq_lens.data(), tables.data(), S, max_blocks, local_lens.data()};
  const float scale = 1.0f / std::sqrt(float(d.QkHeadDim()));
  std::vector<float> want(T_tok * H * d.v_head_dim), want_lse(T_tok * H);
  if (c.fp8) {
    ASSERT_TRUE(cpu::MlaPagedAttentionFp8(q.data(), kv_b.data(), d, fp8_view, 1, hb, scale,
                                          MlaMode::kAbsorbed, want.data(), want_lse.data(), nullptr,
                                          c.dcp)
                    .ok());
  } else {
    ASSERT_TRUE(cpu::MlaPagedAttention(q.data(), kv_b.data(), d, {pool.data(), layout}, 1, hb,
                                       scale, MlaMode::kAbsorbed, want.data(), want_lse.data(),
                                       nullptr, c.dcp)
                    .ok());
  }

  DeviceBuffer<T> pool_d(layout.TotalElems()), ckv_d(cuda_test::Convert<T>(ckv)),
      kpe_d(cuda_test::Convert<T>(kpe)), q_d(cuda_test::Convert<T>(q)),
      kv_b_d(cuda_test::Convert<T>(kv_b)), out_d(T_tok * H * d.v_head_dim);
  DeviceBuffer<int64_t> slots_d(slots);
  DeviceBuffer<int32_t> qsl_d(qsl), lens_d(c.seq_lens), tables_d(tables), local_d(local_lens);
  DeviceBuffer<float> lse_d(T_tok * H);
  TANDEM_CUDA_CHECK(cudaMemset(pool_d.get(), 0xff, layout.TotalElems() * sizeof(T)));
  const KvDtype dt = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  DeviceKvCache cache{pool_d.get(), layout, dt};
  DeviceBuffer<uint8_t> codes_d(c.fp8 ? layout.TotalElems() : 1);
  DeviceBuffer<float> scales_d(c.fp8 ? layout.TotalElems() / D : 1);
  DeviceBuffer<uint8_t> blocks_d(c.fp8_blocks ? layout.num_blocks * block_bytes : 1);
  if (c.fp8_blocks) {
    TANDEM_CUDA_CHECK(cudaMemset(blocks_d.get(), 0, layout.num_blocks * block_bytes));
    cache = DeviceKvCache{blocks_d.get(), layout, KvDtype::kFp8E4m3};
    cache.token_scales = reinterpret_cast<float*>(blocks_d.get() + layout.BlockElems());
    cache.latent_block_bytes = block_bytes;
    ASSERT_TRUE(MlaWriteLatentFp8<T>(ckv_d.get(), L + 3, kpe_d.get(), d.qk_rope_head_dim,
                                     slots_d.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    const std::vector<uint8_t> got = blocks_d.ToHost();
    ASSERT_TRUE(std::equal(got.begin(), got.end(), blocks8))
        << "MlaWriteLatentFp8 (blocks form) differs from the CPU's bytes";
  } else if (c.fp8) {
    TANDEM_CUDA_CHECK(cudaMemset(codes_d.get(), 0, layout.TotalElems()));
    TANDEM_CUDA_CHECK(cudaMemset(scales_d.get(), 0, layout.TotalElems() / D * sizeof(float)));
    cache = DeviceKvCache{codes_d.get(), layout, KvDtype::kFp8E4m3};
    cache.token_scales = scales_d.get();
    ASSERT_TRUE(MlaWriteLatentFp8<T>(ckv_d.get(), L + 3, kpe_d.get(), d.qk_rope_head_dim,
                                     slots_d.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    ASSERT_EQ(codes_d.ToHost(), codes) << "MlaWriteLatentFp8 codes differ from the CPU's";
    ASSERT_EQ(scales_d.ToHost(), row_scales) << "MlaWriteLatentFp8 scales differ from the CPU's";
  } else {
    ASSERT_TRUE(MlaWriteLatent<T>(ckv_d.get(), L + 3, kpe_d.get(), d.qk_rope_head_dim,
                                  slots_d.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    const std::vector<float> pool_got = cuda_test::ToFloat(pool_d.ToHost());
    ASSERT_EQ(pool_got.size(), pool.size());
    for (size_t i = 0; i < pool.size(); ++i) {
      ASSERT_TRUE(pool_got[i] == pool[i] || (std::isnan(pool_got[i]) && std::isnan(pool[i])))
          << "MlaWriteLatent differs from cpu::WriteLatentCache at element " << i;
    }
  }

  MlaPlanInput in{.dims = d,
                  .num_seqs = S,
                  .num_tokens = T_tok,
                  .max_q_len = max_q,
                  .max_seq_len = std::max(max_len, DcpLocalCount(c.plan_len, c.dcp)),
                  .num_splits = c.num_splits,
                  .allow_wgmma = c.kernel >= 1,
                  .allow_tma = c.kernel >= 2,
                  .tma_schedule = c.kernel == 3   ? MlaTmaSchedule::kSeesaw
                                  : c.kernel == 4 ? MlaTmaSchedule::kHandOff
                                  : c.kernel == 5 ? MlaTmaSchedule::kRows16
                                                  : MlaTmaSchedule::kSerial,
                  .dcp = c.dcp,
                  .workspace_zeroed = c.merge,
                  .tma_l2_prefetch_tiles = c.prefetch};
  absl::StatusOr<MlaPlan> plan = PlanMla(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->use_mma, L == 512 && d.qk_rope_head_dim == 64);
  EXPECT_EQ(plan->use_wgmma, plan->use_mma && c.kernel >= 1);
  EXPECT_EQ(plan->use_tma, plan->use_mma && c.kernel >= 2);
  if (plan->use_tma) {  // kRows16 only for models of <= 16 heads (16-row tiles)
    EXPECT_EQ(plan->tma_schedule,
              c.kernel == 5 && H > 16 ? MlaTmaSchedule::kSerial : in.tma_schedule);
  }
  if (c.num_splits > 0) {
    EXPECT_LE(plan->num_splits, c.num_splits);
    EXPECT_EQ(plan->num_splits > 1, c.num_splits > 1);
  } else if (c.plan_len >= 4096) {
    EXPECT_GT(plan->num_splits, 1);  // the case is about splits past the requests' contexts
  }
  if (c.merge) {  // the TMA kernel in its serial / hand-off schedule merges its own splits
    // (planned split counts: row tiles of <= 16 rows only)
    const int64_t tile_rows = plan->tma_schedule == MlaTmaSchedule::kRows16 ? 16 : 64;
    const bool small_tiles = std::min<int64_t>(in.max_q_len * d.num_heads, tile_rows) <= 16;
    EXPECT_EQ(plan->merge_in_kernel, plan->use_tma && plan->num_splits > 1 &&
                                         plan->tma_schedule != MlaTmaSchedule::kSeesaw &&
                                         (c.num_splits > 0 || small_tiles));
  } else {
    EXPECT_FALSE(plan->merge_in_kernel);
  }
  DeviceBuffer<unsigned char> ws(plan->workspace_bytes);
  // NaN everywhere: a split partial the merge reads without its CTA having written it (an empty
  // split's out rows stay unwritten) turns the result NaN. The merge tickets zeroed once.
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0xff, plan->workspace_bytes));
  if (c.merge) {
    TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0, kMlaMergeCounterBytes));
  }
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  AttentionBatch db{qsl_d.get(), lens_d.get(), tables_d.get(), S, max_blocks, local_d.get()};
  auto call = [&](cudaStream_t stream) {
    return MlaAbsorbedAttention<T>(cublas, q_d.get(), kv_b_d.get(), cache, 1, db, scale, *plan,
                                   ws.get(), out_d.get(), lse_d.get(), stream);
  };
  const char* kernel = !plan->use_wgmma                                 ? ""
                       : c.fp8                                          ? " wgmma-fp8"
                       : !plan->use_tma                                 ? " wgmma"
                       : plan->tma_schedule == MlaTmaSchedule::kSeesaw  ? " wgmma-tma-seesaw"
                       : plan->tma_schedule == MlaTmaSchedule::kHandOff ? " wgmma-tma-handoff"
                       : plan->tma_schedule == MlaTmaSchedule::kRows16  ? " tma-rows16"
                                                                        : " wgmma-tma";
  // The result against the reference; the merge tickets zero again after the call.
  auto check = [&](const char* what) {
    const std::vector<float> got = cuda_test::ToFloat(out_d.ToHost());
    const std::vector<float> got_lse = lse_d.ToHost();
    float max_ref = 0.0f, max_err = 0.0f, max_lse_err = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      max_ref = std::max(max_ref, std::abs(want[i]));
      max_err = std::max(max_err, std::abs(got[i] - want[i]));  // NaN never passes below
    }
    int64_t empty_rows = 0;  // rows that see none of the shard's latents: lse -inf, out 0
    for (size_t i = 0; i < want_lse.size(); ++i) {
      if (std::isinf(want_lse[i])) {
        ++empty_rows;
        EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << "row " << i << ": " << got_lse[i];
        continue;
      }
      max_lse_err = std::max(max_lse_err, std::abs(got_lse[i] - want_lse[i]));
    }
    EXPECT_GT(max_ref, 0.0f);
    EXPECT_LE(max_err, 2.5e-2f * max_ref) << what << ", splits " << plan->num_splits;
    EXPECT_LE(max_lse_err, 2e-2f) << what << ", splits " << plan->num_splits;
    if (c.merge) {
      std::vector<uint32_t> counters(kMlaMergeCounterBytes / 4, 1);
      TANDEM_CUDA_CHECK(
          cudaMemcpy(counters.data(), ws.get(), kMlaMergeCounterBytes, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u),
                static_cast<std::ptrdiff_t>(counters.size()))
          << what << ": merge tickets not reset";
    }
    std::cout << "H " << H << " L " << L << kernel << (c.fp8 ? " fp8" : "") << " splits "
              << plan->num_splits << (plan->merge_in_kernel ? " merged in kernel" : "")
              << " (plan len " << in.max_seq_len << ", " << what << "): max|err| " << max_err
              << " of max|ref| " << max_ref << ", max|lse err| " << max_lse_err;
    if (c.dcp.size > 1) {
      std::cout << " (DCP shard " << c.dcp.rank << "/" << c.dcp.size << " interleave "
                << c.dcp.interleave << ", " << empty_rows << " empty rows)";
    }
    std::cout << "\n";
  };
  const absl::Status st = call(nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  check("eager");
  if (c.graph) {  // one call captured, replayed twice: each replay finds the tickets zero
    cudaStream_t stream = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
    DeviceBuffer<unsigned char> cublas_ws(int64_t{32} << 20);
    ASSERT_EQ(cublasSetWorkspace(cublas, cublas_ws.get(), int64_t{32} << 20),
              CUBLAS_STATUS_SUCCESS);
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    const absl::Status cst = call(stream);
    cudaGraph_t graph = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(cst.ok()) << cst;
    cudaGraphExec_t exec = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (const char* what : {"graph replay 1", "graph replay 2"}) {
      TANDEM_CUDA_CHECK(cudaMemset(out_d.get(), 0xff, want.size() * sizeof(T)));
      TANDEM_CUDA_CHECK(cudaMemset(lse_d.get(), 0xff, want_lse.size() * sizeof(float)));
      TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      check(what);
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
    TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  cublasDestroy(cublas);
}

template void RunCase<__nv_bfloat16>(const Case& c, std::mt19937& rng);
template void RunCase<__half>(const Case& c, std::mt19937& rng);

}  // namespace tandem::kernels::cuda::mla_cuda_test
