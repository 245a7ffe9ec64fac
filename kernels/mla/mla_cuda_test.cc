// CUDA MLA (mla_cuda.h) against the CPU reference cpu::MlaPagedAttention (kAbsorbed) on the same
// bf16/fp16-rounded random inputs: latents written by MlaWriteLatent into shuffled pages (the pool
// must equal the CPU write exactly), then the whole absorbed step (W_UK GEMM, latent attention,
// W_UV GEMM). DeepSeek-V3's latent 512 + 64 runs the tensor-core kernel, the tiny test models'
// widths the plain one; decode and q_len 2-4 (causal), page sizes 16 / 64 / 5 / 8 / 32 / 128, odd
// lengths, split-KV forced on and off. Tolerance: out within 2.5e-2 of max|ref| (bf16 roundings of
// q_lat, the P weights and o_lat), LSE within 2e-2. FP8 latent pools (mla_fp8_latent.h):
// MlaWriteLatentFp8's codes and per-row scales must equal cpu::WriteLatentCacheFp8's exactly, and
// attention over them cpu::MlaPagedAttentionFp8 by the same tolerance; the same for the
// block-interleaved form (DeviceKvCache::latent_block_bytes: each block its codes then its scales,
// byte for byte the CPU's).
#include "kernels/mla/mla_cuda.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_fp8_latent.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;

struct Case {
  MlaDims dims;
  std::vector<int32_t> q_lens, seq_lens;
  int64_t block_size = 16;
  int num_splits = 0;  // 0: the plan's choice
  bool fp8 = false;    // an FP8 latent pool (e4m3 codes + per-row scales)
  // The tensor-core kernel for latent 512 + 64: 0 mma.sync, 1 the Hopper wgmma kernel with
  // cp.async loads (allow_tma false), 2 its TMA variant (pages of 8, 16, 32, 64k; the page of 5
  // runs the cp.async one), 3 and 4 the TMA variant's other warpgroup schedules
  // (MlaTmaSchedule::kSeesaw, kHandOff; the same pages), 5 its kRows16 kernel (16-row tiles, <= 16
  // heads, else the plan runs kSerial). Off sm_90 all of them run mma.sync.
  int kernel = 0;
  // Decode context parallelism: the pool holds this shard's latents at local indices, the
  // reference is cpu::MlaPagedAttention over the same shard (its partial and LSE).
  DcpShard dcp = {};
  bool fp8_blocks = false;  // with fp8: block-interleaved (each block its codes then its scales)
  // > 0: plan for max_seq_len max(this (its DCP local count), the real longest), as a CUDA
  // graph's plan for max_model_len; the requests keep their lengths.
  int64_t plan_len = 0;
  // MlaPlanInput::workspace_zeroed (the tickets zeroed once): the TMA kernel merges its splits.
  bool merge = false;
  bool graph = false;  // also one call captured in a CUDA graph, replayed twice, each checked
  int prefetch = 0;    // MlaPlanInput::tma_l2_prefetch_tiles (the TMA kernel's L2 prefetch)
};

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

constexpr MlaDims kV3 = mla_test::kV3Dims;
constexpr MlaDims kLite = mla_test::kLiteDims;
const MlaDims kTiny{.num_heads = 4,
                    .qk_nope_head_dim = 16,
                    .qk_rope_head_dim = 8,
                    .kv_lora_rank = 32,
                    .v_head_dim = 12};

// The tensor-core kernels: mma.sync, and wgmma with cp.async or TMA loads, the latter in its three
// warpgroup schedules (where the device is sm_90; elsewhere the plan's wgmma falls back to
// mma.sync and the case runs it five times).
TEST(MlaCudaTest, TensorCoreKernelDecodeAndVerify) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int kernel : {0, 1, 2, 3, 4}) {
    const Case lite{kLite, {1, 4, 3, 1, 2}, {1, 77, 130, 301, 65}, 16, 1, false, kernel};
    for (int splits : {1, 3, 0}) {
      Case c = lite;
      c.num_splits = splits;
      RunCase<__nv_bfloat16>(c, rng);
    }
    RunCase<__nv_bfloat16>({kV3, {1, 3}, {200, 97}, 64, 0, false, kernel}, rng);
    RunCase<__half>({kLite, {2, 1}, {33, 129}, 5, 2, false, kernel}, rng);
  }
}

// MlaTmaSchedule::kRows16 (mla_decode_rows16.cu: mma.sync over row tiles of 16 rows, TMA
// tiles): 16 heads q_len 1 and 8 heads q_len 1 / 2, contexts at the tile edges (1, 63, 64, 65)
// and longer (700, 4096), pages 16 / 64, splits 1 / 2 / planned, separate and in-kernel merge;
// q_len 2-4 at 16 heads and 3-4 at 8 heads (several 16-row tiles a request: verify passes); a
// long plan (empty splits) replayed in a CUDA graph, a DCP shard, and 128 heads (the plan falls
// back to kSerial).
template <typename T>
void RunRows16Cases(std::mt19937& rng) {
  MlaDims h8 = kV3;
  h8.num_heads = 8;
  const std::vector<int32_t> ctx = {1, 63, 64, 65, 700, 4096};
  for (int64_t page : {16, 64}) {
    for (int splits : {1, 2, 0}) {
      for (bool merge : {false, true}) {
        if (merge && splits == 1) continue;
        Case lite{kLite, std::vector<int32_t>(6, 1), ctx, page, splits, false, 5};
        Case v3{h8, {1, 2, 2, 1, 2, 1}, ctx, page, splits, false, 5};
        lite.merge = v3.merge = merge;
        RunCase<T>(lite, rng);
        RunCase<T>(v3, rng);
      }
    }
  }
  for (int splits : {1, 0}) {  // several 16-row tiles a request
    Case multi{kLite, {1, 4, 3, 2, 4, 2}, ctx, 64, splits, false, 5};
    Case multi8{h8, {1, 4, 4, 3, 3, 4}, ctx, 16, splits, false, 5};
    multi.merge = multi8.merge = splits == 0;
    RunCase<T>(multi, rng);
    RunCase<T>(multi8, rng);
  }
  Case graph{kLite, {1, 1, 1}, {4096, 65, 1}, 64, 0, false, 5};
  graph.plan_len = 32768;
  graph.merge = graph.graph = true;
  RunCase<T>(graph, rng);
  RunCase<T>({h8, {2, 1}, {700, 65}, 16, 0, false, 5, DcpShard{2, 1, 16}}, rng);
  RunCase<T>({kV3, {1}, {700}, 64, 2, false, 5}, rng);
}

TEST(MlaCudaTest, TmaRows16MatchesTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  RunRows16Cases<__nv_bfloat16>(rng);
  RunRows16Cases<__half>(rng);
}

// The tiling edges of the tensor-core kernels: contexts not a multiple of the 64-latent tile or
// of the page (1, 63, 65, 127, 129, 191, 257, 515, 700, 1000, 1500), 16 / 32 / 128 heads, q_len 1-4
// (row tiles of 64 that straddle query tokens at 16 and 32 heads), splits forced 1 / 2 / 3 and the
// planner's choice.
TEST(MlaCudaTest, TensorCoreKernelTilingEdges) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  MlaDims h32 = kV3;
  h32.num_heads = 32;
  for (int kernel : {0, 1, 2, 3, 4}) {
    RunCase<__nv_bfloat16>({kV3, {1, 2, 1}, {63, 65, 1000}, 64, 0, false, kernel}, rng);
    RunCase<__nv_bfloat16>({kV3, {4}, {515}, 16, 3, false, kernel}, rng);
    RunCase<__nv_bfloat16>({h32, {3, 1, 4}, {127, 1, 130}, 16, 2, false, kernel}, rng);
    RunCase<__half>({h32, {2, 1}, {257, 1500}, 64, 1, false, kernel}, rng);
    RunCase<__nv_bfloat16>({kLite, {4, 2, 1, 3}, {64, 129, 700, 191}, 5, 3, false, kernel}, rng);
    RunCase<__nv_bfloat16>(
        {kLite, {1, 1, 1, 1, 1, 1}, {4096, 1, 65, 2000, 64, 1}, 64, 0, false, kernel}, rng);
    // Pages of 8, 32 and 128 latents: the TMA kernel's boxes of 8 and 32 rows, and 64-row boxes
    // inside a page.
    RunCase<__nv_bfloat16>({kLite, {1, 3}, {77, 260}, 8, 2, false, kernel}, rng);
    RunCase<__half>({kV3, {2, 1}, {300, 129}, 32, 0, false, kernel}, rng);
    RunCase<__nv_bfloat16>({kV3, {1, 1}, {1000, 200}, 128, 0, false, kernel}, rng);
  }
}

// Decode context parallelism: every shard of DCP 2 and 4 (interleave 1 token, a page, 2 pages)
// on the five kernels (plain at the tiny widths, mma.sync, wgmma cp.async / TMA in three schedules)
// against the CPU shard's partial and LSE, decode and q_len 2-4 (the causal bound becomes
// DcpLocalCount(position + 1) on the shard), splits forced and planned; contexts of 1-3 tokens
// leave shards empty (lse -inf). The CPU shards merge by LSE to the unsharded fp64 result
// (mla_attention_test).
TEST(MlaCudaTest, DcpShardsMatchTheCpuShards) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int64_t size : {2, 4}) {
    for (int64_t rank = 0; rank < size; ++rank) {
      const DcpShard one{size, rank, 1}, page{size, rank, 16}, pages{size, rank, 32};
      RunCase<__nv_bfloat16>({kTiny, {1, 3, 1, 2}, {1, 40, 77, 3}, 16, 0, false, 0, one}, rng);
      for (int kernel : {0, 1, 2, 3, 4}) {
        RunCase<__nv_bfloat16>(
            {kLite, {1, 4, 2, 1}, {2, 300, 131, 1000}, 16, 0, false, kernel, page}, rng);
        RunCase<__nv_bfloat16>({kV3, {1, 3}, {700, 97}, 16, 2, false, kernel, one}, rng);
        RunCase<__half>({kLite, {2, 1, 1}, {65, 1, 513}, 16, 1, false, kernel, pages}, rng);
      }
    }
  }
}

// A plan for a long bound (32768: a CUDA graph's plan for max_model_len) run on short and uneven
// real contexts: every CTA splits its own request's context (chunks of >= 64 latents), CTAs past
// its end leave empty partials (LSE -inf, out unwritten) that the merge must skip. Lengths at the
// tile edges (1, 63, 64, 65) and longer (1000, 4097), batch 1 / 3 / 8, q_len 1 and 2, 16 and 128
// heads, on every kernel: mma.sync, wgmma cp.async, TMA in three schedules, FP8 on the Hopper and
// the plain kernel, the plain kernel at the tiny widths; DCP shards (the plan bounds the local
// lengths, 16384 of 32768).
TEST(MlaCudaTest, LongPlanShortContexts) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto long_plan = [](Case c) {
    c.plan_len = 32768;
    return c;
  };
  const std::vector<int32_t> edges = {1, 63, 64, 65, 1000, 4097, 2, 130},
                             q12 = {1, 2, 1, 1, 2, 1, 1, 2};
  for (int kernel : {0, 1, 2, 3, 4}) {
    RunCase<__nv_bfloat16>(long_plan({kLite, {1}, {1000}, 16, 0, false, kernel}), rng);
    RunCase<__nv_bfloat16>(long_plan({kLite, {2, 1, 2}, {4097, 1, 63}, 64, 0, false, kernel}), rng);
    RunCase<__half>(long_plan({kLite, q12, edges, 16, 0, false, kernel}), rng);
    RunCase<__nv_bfloat16>(long_plan({kV3, {2}, {4097}, 64, 0, false, kernel}), rng);
    RunCase<__nv_bfloat16>(long_plan({kV3, {1, 2, 1}, {65, 1000, 64}, 32, 0, false, kernel}), rng);
    RunCase<__nv_bfloat16>(
        long_plan({kV3, std::vector<int32_t>(8, 1), edges, 16, 0, false, kernel}), rng);
  }
  for (int kernel : {0, 1}) {  // FP8 pools: the plain kernel (0), the Hopper FP8 one (1)
    RunCase<__nv_bfloat16>(long_plan({kLite, q12, edges, 16, 0, true, kernel}), rng);
    RunCase<__half>(long_plan({kV3, {2, 1, 1}, {4097, 65, 1}, 64, 0, true, kernel}), rng);
  }
  RunCase<__nv_bfloat16>(long_plan({kTiny, {1, 2, 1}, {1000, 65, 1}, 16}), rng);
  for (int64_t rank = 0; rank < 2; ++rank) {
    for (int kernel : {0, 2}) {
      RunCase<__nv_bfloat16>(
          long_plan({kLite, {1, 2, 1}, {65, 1000, 4097}, 16, 0, false, kernel, {2, rank, 16}}),
          rng);
    }
    RunCase<__nv_bfloat16>(long_plan({kV3, {2, 1}, {4097, 63}, 16, 0, true, 1, {2, rank, 1}}), rng);
  }
}

// The in-kernel split merge (MlaPlanInput::workspace_zeroed): the TMA kernel's last split CTA of
// each (request, row tile) merges the partials and writes o_lat / LSE, a group with one filled
// split writes them directly, CTAs past a request's end take no ticket. Forced 2 / 3 / 16 splits
// (16 x 64: one tile a CTA), uneven lengths with empty splits (1 .. 4097 under 16 forced splits
// and under a 32768-latent plan), batch 1 and 8, q_len 1-2, 16 and 128 heads (two row tiles),
// pages 64 / 16 / 8 / 32, fp16, DCP shards (the merged LSE is the shard's, lse -inf rows
// included); every call leaves the tickets zero, and the graph cases replay one captured call
// twice. The serial and hand-off schedules merge in the kernel; the seesaw and cp.async kernels
// (1, 3) keep the separate merge in the same workspace layout. Also the TMA kernel's L2 prefetch
// variant (MlaPlanInput::tma_l2_prefetch_tiles).
TEST(MlaCudaTest, InKernelMergeMatchesTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  auto merged = [](Case c, bool graph = false, int64_t plan_len = 0) {
    c.merge = true;
    c.graph = graph;
    c.plan_len = plan_len;
    return c;
  };
  const std::vector<int32_t> edges = {1, 63, 64, 65, 1000, 4097, 2, 130}, ones(8, 1),
                             q12 = {1, 2, 1, 1, 2, 1, 1, 2};
  for (int kernel : {2, 4}) {
    RunCase<__nv_bfloat16>(merged({kLite, {1}, {1000}, 64, 2, false, kernel}, true), rng);
    RunCase<__nv_bfloat16>(merged({kLite, {1}, {1000}, 64, 3, false, kernel}), rng);
    RunCase<__nv_bfloat16>(merged({kLite, {1}, {1024}, 64, 16, false, kernel}, true), rng);
    RunCase<__nv_bfloat16>(merged({kLite, ones, edges, 16, 16, false, kernel}, true), rng);
    RunCase<__half>(merged({kLite, q12, edges, 8, 3, false, kernel}), rng);
    RunCase<__nv_bfloat16>(merged({kV3, {1, 2, 1}, {65, 1000, 4097}, 32, 3, false, kernel}), rng);
    RunCase<__nv_bfloat16>(merged({kLite, q12, edges, 16, 0, false, kernel}, false, 32768), rng);
    RunCase<__nv_bfloat16>(merged({kV3, ones, edges, 64, 0, false, kernel}, true, 32768), rng);
    for (int64_t rank = 0; rank < 2; ++rank) {
      RunCase<__nv_bfloat16>(
          merged({kLite, {1, 4, 2, 1}, {2, 300, 131, 1000}, 16, 3, false, kernel, {2, rank, 16}}),
          rng);
      RunCase<__nv_bfloat16>(
          merged({kLite, {1, 2, 1}, {65, 1000, 4097}, 16, 0, false, kernel, {2, rank, 16}}, true,
                 32768),
          rng);
    }
  }
  // The L2 prefetch variant (results unchanged): 2 and 5 tiles ahead, pages of 64 and 8 (8
  // boxes a tile: the prologue's 32 lanes cover 4 tiles), with and without the merge.
  for (int pf : {2, 5}) {
    Case a = merged({kLite, ones, edges, 64, 2, false, 2}, pf == 2);
    Case b = merged({kV3, {1, 2}, {4097, 1000}, 8, 3, false, 4});
    Case d = {kLite, {1, 2, 1}, {700, 1000, 65}, 8, 2, false, 2};
    for (Case* x : {&a, &b, &d}) {
      x->prefetch = pf;
      RunCase<__nv_bfloat16>(*x, rng);
    }
  }
  for (int kernel : {1, 3}) {  // no in-kernel merge: the separate one in the zeroed layout
    RunCase<__nv_bfloat16>(merged({kLite, ones, edges, 16, 16, false, kernel}, true), rng);
  }
}

// The split planner (host only: runs without a GPU). Batches of 1-8 stay within one wave of one
// CTA per SM, every planned split >= 512 latents at the bound (kSplitMinLatents); a plan for a
// long bound gives many splits (short requests then use fewer, mla_cuda_internal.cuh's
// SplitChunk); forced counts (64-latent minimum), the workspace cap and DCP's local bound.
// MlaPlanInput::rows16_small_batches (host planner only): kRows16 with 16-row tiles for <= 16
// heads at <= 8 requests and any q_len (a verify pass's tokens as one-token steps' rows); kSerial
// for more requests, more heads, forced splits, or without the switch; another schedule asked
// for is kept.
TEST(MlaCudaTest, PlanTakesRows16ForSmallBatches) {
  auto planned = [](const MlaDims& d, int64_t seqs, int64_t ctx, int64_t q, bool rows16,
                    MlaTmaSchedule asked = MlaTmaSchedule::kSerial, int splits = 0) {
    absl::StatusOr<MlaPlan> p = PlanMla({.dims = d,
                                         .num_seqs = seqs,
                                         .num_tokens = seqs * q,
                                         .max_q_len = q,
                                         .max_seq_len = ctx,
                                         .num_sms = 132,
                                         .num_splits = splits,
                                         .tma_schedule = asked,
                                         .workspace_zeroed = true,
                                         .rows16_small_batches = rows16});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : MlaPlan{};
  };
  for (int64_t ctx : {1024, 4096, 65536}) {
    for (int64_t seqs : {1, 8}) {
      for (int64_t q : {1, 2, 4}) {
        const MlaPlan p = planned(kLite, seqs, ctx, q, true);
        EXPECT_EQ(p.tma_schedule, MlaTmaSchedule::kRows16) << seqs << " x " << ctx << " q " << q;
        EXPECT_EQ(p.row_tiles, q);  // 16 heads: a token's rows a tile
        EXPECT_EQ(planned(kLite, seqs, ctx, q, false).tma_schedule, MlaTmaSchedule::kSerial);
        EXPECT_EQ(planned(kLite, seqs, ctx, q, false).row_tiles, (16 * q + 63) / 64);
      }
    }
    EXPECT_EQ(planned(kLite, 16, ctx, 1, true).tma_schedule, MlaTmaSchedule::kSerial);  // > 8
    EXPECT_EQ(planned(kV3, 1, ctx, 1, true).tma_schedule, MlaTmaSchedule::kSerial);     // 128 heads
    EXPECT_EQ(planned(kV3, 1, ctx, 1, false, MlaTmaSchedule::kRows16).tma_schedule,
              MlaTmaSchedule::kSerial);  // asked for, but more than 16 heads
    EXPECT_EQ(planned(kLite, 1, ctx, 1, true, MlaTmaSchedule::kHandOff).tma_schedule,
              MlaTmaSchedule::kHandOff);
    EXPECT_EQ(planned(kLite, 1, ctx, 1, true, MlaTmaSchedule::kSerial, 4).tma_schedule,
              MlaTmaSchedule::kSerial);  // forced splits
  }
  absl::StatusOr<MlaPlan> prefetch = PlanMla({.dims = kLite,
                                              .num_seqs = 1,
                                              .num_tokens = 1,
                                              .max_seq_len = 4096,
                                              .num_sms = 132,
                                              .tma_schedule = MlaTmaSchedule::kRows16,
                                              .workspace_zeroed = true,
                                              .rows16_small_batches = true,
                                              .tma_l2_prefetch_tiles = 4});
  ASSERT_TRUE(prefetch.ok()) << prefetch.status();
  EXPECT_EQ(prefetch->tma_schedule, MlaTmaSchedule::kSerial);  // no L2-prefetch kRows16
}

TEST(MlaCudaTest, PlanSplitsFillAWave) {
  auto plan = [](const MlaDims& d, int64_t seqs, int64_t max_seq_len, int64_t max_q = 1,
                 int splits = 0, int64_t max_ws = 0, DcpShard dcp = {}) {
    absl::StatusOr<MlaPlan> p = PlanMla({.dims = d,
                                         .num_seqs = seqs,
                                         .num_tokens = seqs * max_q,
                                         .max_q_len = max_q,
                                         .max_seq_len = max_seq_len,
                                         .num_sms = 132,
                                         .num_splits = splits,
                                         .max_workspace_bytes = max_ws,
                                         .dcp = dcp});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : MlaPlan{};
  };
  for (const MlaDims& d : {kLite, kV3}) {
    for (int64_t seqs : {1, 2, 3, 8}) {
      for (int64_t ctx : {64, 1000, 1024, 4096, 32768, 163840}) {
        for (int64_t q : {1, 2}) {
          const MlaPlan p = plan(d, seqs, ctx, q);
          const int64_t ctas = seqs * p.row_tiles * p.num_splits;
          SCOPED_TRACE(::testing::Message() << d.num_heads << " heads, " << seqs << " x " << ctx
                                            << " q_len " << q << ": " << p.num_splits << " splits");
          EXPECT_LE(ctas, 132);
          EXPECT_EQ(p.split_min_latents, 512);
          EXPECT_LT((p.num_splits - 1) * 512, ctx);  // >= 512 latents a split at the bound
        }
      }
    }
  }
  EXPECT_EQ(plan(kLite, 1, 1024).num_splits, 2);  // 2 CTAs of 512 latents
  EXPECT_EQ(plan(kLite, 1, 4096).num_splits, 8);
  EXPECT_EQ(plan(kLite, 1, 32768).num_splits, 64);  // a 1k request then runs 2 CTAs of 512
  EXPECT_EQ(plan(kV3, 64, 32768).num_splits, 1);
  EXPECT_EQ(plan(kLite, 1, 1).num_splits, 1);
  // Forced: at most that many, chunks of >= 64 latents, at most 256.
  EXPECT_EQ(plan(kLite, 1, 1000, 1, 3).split_min_latents, 64);
  EXPECT_EQ(plan(kLite, 1, 1000, 1, 3).num_splits, 3);
  EXPECT_EQ(plan(kLite, 1, 1000, 1, 100).num_splits, 16);
  EXPECT_EQ(plan(kLite, 1, 1 << 20, 1, 1000).num_splits, 256);
  // The workspace cap: fewer splits until the partials fit.
  const MlaPlan wide = plan(kV3, 1, 32768);
  const MlaPlan one = plan(kV3, 1, 32768, 1, 1);
  const int64_t cap = one.workspace_bytes + (wide.workspace_bytes - one.workspace_bytes) / 4;
  const MlaPlan capped = plan(kV3, 1, 32768, 1, 0, cap);
  EXPECT_LT(capped.num_splits, wide.num_splits);
  EXPECT_GT(capped.num_splits, 1);
  EXPECT_LE(capped.workspace_bytes, cap);
  // DCP: max_seq_len bounds the shard's local lengths; the same splits as an unsharded plan of
  // that length.
  EXPECT_EQ(plan(kLite, 1, 16384, 1, 0, 0, {2, 1, 16}).num_splits,
            plan(kLite, 1, 16384).num_splits);
  // workspace_zeroed: the tickets first (every plan), the in-kernel merge for split TMA plans.
  auto zeroed = [](int64_t ctx, int splits, MlaTmaSchedule schedule, int64_t seqs = 1,
                   const MlaDims& dims = kLite) {
    absl::StatusOr<MlaPlan> p = PlanMla({.dims = dims,
                                         .num_seqs = seqs,
                                         .num_tokens = seqs,
                                         .max_seq_len = ctx,
                                         .num_splits = splits,
                                         .tma_schedule = schedule,
                                         .workspace_zeroed = true});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : MlaPlan{};
  };
  EXPECT_TRUE(zeroed(1024, 0, MlaTmaSchedule::kSerial).merge_in_kernel);
  EXPECT_TRUE(zeroed(1024, 0, MlaTmaSchedule::kHandOff).merge_in_kernel);
  EXPECT_FALSE(zeroed(1024, 0, MlaTmaSchedule::kSeesaw).merge_in_kernel);
  EXPECT_FALSE(zeroed(1024, 1, MlaTmaSchedule::kSerial).merge_in_kernel);
  EXPECT_FALSE(zeroed(4096, 2, MlaTmaSchedule::kSerial, 4097).merge_in_kernel);  // > 4096 groups
  EXPECT_EQ(zeroed(1024, 1, MlaTmaSchedule::kSerial).workspace_bytes,
            plan(kLite, 1, 1024, 1, 1).workspace_bytes + kMlaMergeCounterBytes);
  EXPECT_EQ(zeroed(1024, 0, MlaTmaSchedule::kSerial).workspace_bytes,
            plan(kLite, 1, 1024, 1, 8).workspace_bytes + kMlaMergeCounterBytes);
  // With the in-kernel merge (16-row tiles) and <= 8 (request, row tile) groups, planned splits
  // take >= 128 latents, at most 16 and 64 CTAs in all: batch 1 at 1k -> 8, at 4k and under a
  // 32k graph bound -> 16; batch 8 at 1k and 4k -> 8. Larger batches keep the 512-latent
  // planner (batch 64 at 4k -> 2, the same as without the tickets), merged in the kernel.
  EXPECT_EQ(zeroed(1024, 0, MlaTmaSchedule::kSerial).split_min_latents, 128);
  EXPECT_EQ(zeroed(1024, 0, MlaTmaSchedule::kSerial).num_splits, 8);
  EXPECT_EQ(zeroed(4096, 0, MlaTmaSchedule::kSerial).num_splits, 16);
  EXPECT_EQ(zeroed(32768, 0, MlaTmaSchedule::kSerial).num_splits, 16);
  EXPECT_EQ(zeroed(1024, 0, MlaTmaSchedule::kSerial, 8).num_splits, 8);
  EXPECT_EQ(zeroed(4096, 0, MlaTmaSchedule::kSerial, 8).num_splits, 8);
  for (int64_t seqs : {16, 32, 64}) {
    for (int64_t ctx : {1024, 4096, 32768}) {
      const MlaPlan z = zeroed(ctx, 0, MlaTmaSchedule::kSerial, seqs);
      EXPECT_EQ(z.split_min_latents, 512);
      EXPECT_EQ(z.num_splits, plan(kLite, seqs, ctx).num_splits) << seqs << " x " << ctx;
      EXPECT_EQ(z.merge_in_kernel, z.num_splits > 1);
    }
  }
  const MlaPlan v3 = zeroed(4096, 0, MlaTmaSchedule::kSerial, 1, kV3);
  EXPECT_FALSE(v3.merge_in_kernel);
  EXPECT_EQ(v3.split_min_latents, 512);
  EXPECT_EQ(v3.num_splits, plan(kV3, 1, 4096).num_splits);
  EXPECT_TRUE(zeroed(4096, 4, MlaTmaSchedule::kSerial, 1, kV3).merge_in_kernel);  // forced
}

TEST(MlaCudaTest, PlainKernelTinyDims) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int splits : {1, 4}) {
    RunCase<__nv_bfloat16>({kTiny, {1, 4, 2, 3}, {1, 9, 70, 33}, 4, splits}, rng);
  }
}

// FP8 latent pools (e4m3 + per-row scale): the write bit-exact, attention over the codes on the
// plain kernel (every width, DeepSeek-V3's 512 + 64 included: kernel 0 keeps the Hopper FP8
// kernel off) vs the CPU reference.
TEST(MlaCudaTest, Fp8LatentPools) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  RunCase<__nv_bfloat16>({kTiny, {1, 4, 2}, {1, 70, 33}, 4, 1, /*fp8=*/true}, rng);
  RunCase<__nv_bfloat16>({kTiny, {1, 3}, {9, 301}, 16, 4, /*fp8=*/true}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 2, 1}, {77, 130, 5}, 16, 0, /*fp8=*/true}, rng);
  RunCase<__half>({kV3, {1}, {200}, 64, 3, /*fp8=*/true}, rng);
  // The block-interleaved pool (DeviceKvCache::latent_block_bytes; the CPU backend's, what moves
  // P -> D): the same bytes as the CPU's blocks form, attention as over the planar pool.
  RunCase<__nv_bfloat16>({kTiny, {1, 4, 2}, {1, 70, 33}, 4, 1, true, 0, {}, true}, rng);
  RunCase<__half>({kV3, {1, 2}, {200, 77}, 16, 0, true, 0, {}, true}, rng);
}

// FP8 latent pools on the Hopper kernel (mla_decode_fp8.cu: codes dequantized into bf16 / fp16
// tiles in shared memory; mma.sync off sm_90 has no FP8 form, so there the plain kernel runs)
// against cpu::MlaPagedAttentionFp8 (fp32 over the dequantized latents): decode and q_len 2-4,
// splits 1 / 3 / planned, 16 / 32 / 128 heads, pages 16 / 64 / 5, contexts off the tile and the
// page, planar and block-interleaved pools, DCP shards (empty ones included).
TEST(MlaCudaTest, Fp8LatentPoolsOnTheWgmmaKernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  MlaDims h32 = kV3;
  h32.num_heads = 32;
  for (int splits : {1, 3, 0}) {
    RunCase<__nv_bfloat16>({kLite, {1, 4, 3, 1, 2}, {1, 77, 130, 301, 65}, 16, splits, true, 1},
                           rng);
  }
  RunCase<__nv_bfloat16>({kV3, {1, 3}, {200, 97}, 64, 0, true, 1}, rng);
  RunCase<__half>({kLite, {2, 1}, {33, 129}, 5, 2, true, 1}, rng);
  RunCase<__nv_bfloat16>({kV3, {1, 2, 1}, {63, 65, 1000}, 64, 0, true, 1}, rng);
  RunCase<__half>({h32, {3, 1, 4}, {127, 1, 130}, 16, 2, true, 1}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 1, 1, 1, 1, 1}, {4096, 1, 65, 2000, 64, 1}, 64, 0, true, 1},
                         rng);
  RunCase<__half>({kV3, {1, 2}, {200, 77}, 16, 0, true, 1, {}, true}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 3}, {300, 1000}, 64, 3, true, 1, {}, true}, rng);
  for (int64_t rank = 0; rank < 2; ++rank) {
    RunCase<__nv_bfloat16>(
        {kLite, {1, 4, 2, 1}, {2, 300, 131, 1000}, 16, 0, true, 1, {2, rank, 16}}, rng);
  }
  RunCase<__nv_bfloat16>({kV3, {1, 2}, {700, 2}, 16, 2, true, 1, {4, 3, 1}}, rng);
}

// MlaRope vs cpu::ApplyMlaRope on the q layout ([T, Hq, Dn + Dr], RoPE at offset Dn) for both
// pair orders and a YaRN cos/sin factor: within one bf16 rounding of the rotated value.
TEST(MlaCudaTest, RopeMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const int64_t T = 7, rows = 3, Dn = 16, Dr = 8, stride = Dn + Dr;
  std::vector<int64_t> pos = {0, 1, 5, 17, 63, 200, 4095};
  std::vector<float> inv_freq(Dr / 2);
  for (int64_t i = 0; i < Dr / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / Dr);
  for (bool interleave : {true, false}) {
    std::vector<float> x = attention_test::RandomNormal(rng, T * rows * stride, 1.0f);
    cuda_test::RoundTo<__nv_bfloat16>(x);
    std::vector<float> want = x;
    cpu::ApplyMlaRope(pos.data(), T, inv_freq.data(), Dr, 1.12f, interleave,
                      {want.data(), rows, stride, Dn});
    DeviceBuffer<__nv_bfloat16> x_d(cuda_test::Convert<__nv_bfloat16>(x));
    DeviceBuffer<int64_t> pos_d(pos);
    DeviceBuffer<float> freq_d(inv_freq);
    ASSERT_TRUE(MlaRope<__nv_bfloat16>(pos_d.get(), T, freq_d.get(), Dr, 1.12f, interleave,
                                       x_d.get(), rows, stride, Dn, nullptr)
                    .ok());
    const std::vector<float> got = cuda_test::ToFloat(x_d.ToHost());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-2f * std::abs(want[i]) + 1e-6f) << "element " << i;
    }
  }
}

TEST(MlaCudaTest, RefusesAKvCacheAndBadPlans) {
  TANDEM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(PlanMla({.dims = kTiny, .num_seqs = -1}).ok());
  MlaDims odd = kTiny;
  odd.kv_lora_rank = 30;  // L + Dr not a multiple of 8
  EXPECT_FALSE(PlanMla({.dims = odd, .num_seqs = 1, .num_tokens = 1, .max_seq_len = 4}).ok());
  // A DCP shard out of range (rank >= size, interleave 0).
  for (const DcpShard& bad : {DcpShard{2, 2, 16}, DcpShard{2, 0, 0}}) {
    EXPECT_FALSE(
        PlanMla({.dims = kTiny, .num_seqs = 1, .num_tokens = 1, .max_seq_len = 4, .dcp = bad})
            .ok());
  }
  DeviceBuffer<__nv_bfloat16> pool(1024);
  DeviceKvCache kv{pool.get(),
                   {.num_blocks = 1,
                    .num_layers = 1,
                    .block_size = 4,
                    .num_kv_heads = 2,
                    .head_dim = 40,
                    .num_planes = 2}};
  DeviceBuffer<int64_t> slots(std::vector<int64_t>{0});
  EXPECT_FALSE(MlaWriteLatent<__nv_bfloat16>(pool.get(), 32, pool.get(), 8, slots.get(), 1, kTiny,
                                             kv, 0, nullptr)
                   .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
