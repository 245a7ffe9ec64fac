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

// RunCase's steps stop the case as its ASSERT_*s always did: a step is a void function whose
// ASSERT_*s (TANDEM_CUDA_CHECK included) return from it early, so its last statement, *done =
// true, is not reached and RunCase returns. (Not ::testing::Test::HasFatalFailure(): it stays true
// after an earlier case's failure and would cut the TEST's later cases short.)

namespace {

// One case's host side: the shard's lengths, the shuffled pages, the inputs (rounded to T), the
// pool as the CPU writes it and the CPU reference. Not copied: fp8_view points into it.
struct HostBatch {
  HostBatch() = default;
  HostBatch(const HostBatch&) = delete;
  HostBatch& operator=(const HostBatch&) = delete;

  int64_t S = 0, max_q = 1, T_tok = 0, n_lat = 0;
  std::vector<int32_t> local_lens, qsl;  // the shard's latents (all without DCP); cu_seqlens
  mla_test::ShuffledPages pages;
  KvCacheLayout layout;
  // Latents as the model produces them: c_kv rows (stride L + 3) and k_pe rows.
  std::vector<float> ckv, kpe, q, kv_b;
  std::vector<float> pool;  // the bf16 / fp16 pool
  std::vector<uint8_t> codes;
  std::vector<float> row_scales;
  int64_t block_bytes = 0;  // the block-interleaved FP8 form: one block's codes then scales
  std::vector<float> blocks_words;
  cpu::Fp8LatentCacheView fp8_view;  // codes / row_scales, or blocks_words with fp8_blocks
  float scale = 0.0f;
  std::vector<float> want, want_lse;
};

// The lengths, the pages and the inputs, rounded to T. The draws from rng keep their order (pages,
// c_kv, k_pe, q, kv_b): a seed replays the same case.
template <typename T>
void DrawHostBatch(const Case& c, std::mt19937& rng, HostBatch& h) {
  const MlaDims& d = c.dims;
  const int64_t L = d.kv_lora_rank, H = d.num_heads;
  h.S = static_cast<int64_t>(c.seq_lens.size());
  h.local_lens.resize(h.S);
  h.qsl = {0};
  for (int64_t s = 0; s < h.S; ++s) {
    h.local_lens[s] = static_cast<int32_t>(DcpLocalCount(c.seq_lens[s], c.dcp));
    h.max_q = std::max<int64_t>(h.max_q, c.q_lens[s]);
    h.qsl.push_back(h.qsl.back() + c.q_lens[s]);
  }
  h.pages = mla_test::ShufflePages(h.local_lens, c.block_size, rng);
  h.layout = h.pages.Layout(c.block_size, d.LatentDim());
  h.n_lat = static_cast<int64_t>(h.pages.slots.size());
  h.T_tok = h.qsl.back();
  h.ckv = attention_test::RandomNormal(rng, h.n_lat * (L + 3), 1.0f);
  h.kpe = attention_test::RandomNormal(rng, h.n_lat * d.qk_rope_head_dim, 1.0f);
  h.q = attention_test::RandomNormal(rng, h.T_tok * H * d.QkHeadDim(), 1.0f);
  h.kv_b = attention_test::RandomNormal(rng, H * (d.qk_nope_head_dim + d.v_head_dim) * L,
                                        0.5f / std::sqrt(float(d.qk_nope_head_dim)));
  for (auto* v : {&h.ckv, &h.kpe, &h.q, &h.kv_b}) cuda_test::RoundTo<T>(*v);
}

// The pool as cpu::WriteLatentCache (cpu::WriteLatentCacheFp8) writes it.
void WriteHostPool(const Case& c, HostBatch& h, bool* done) {
  const MlaDims& d = c.dims;
  const int64_t D = d.LatentDim(), L = d.kv_lora_rank;
  const KvCacheLayout& layout = h.layout;
  // The bf16 / fp16 pool starts all NaN (bytes 0xff, on the device too): slots no request owns,
  // rows past a context's end inside its last page, must never reach a result (the kernels read
  // whole pages, tiles and boxes; masked scores are selected away and V rows past the end zeroed).
  std::vector<float> latent(h.n_lat * D);
  h.pool.assign(layout.TotalElems(), std::nanf(""));
  for (int64_t j = 0; j < h.n_lat; ++j) {
    std::copy_n(h.ckv.data() + j * (L + 3), L, latent.data() + j * D);
    std::copy_n(h.kpe.data() + j * d.qk_rope_head_dim, d.qk_rope_head_dim,
                latent.data() + j * D + L);
  }
  // FP8 pools: unwritten codes are 0xff (e4m3 NaN) too, and in the block-interleaved form their
  // scales NaN bytes: a kernel that lets them reach a result fails.
  h.codes.assign(c.fp8 ? layout.TotalElems() : 0, 0xff);
  h.row_scales.assign(c.fp8 ? layout.TotalElems() / D : 0, 0.0f);
  h.fp8_view = {h.codes.data(), h.row_scales.data(), layout};
  // The block-interleaved form: one buffer of num_blocks blocks, each its codes then its scales.
  h.block_bytes = layout.BlockElems() + layout.BlockElems() / D * 4;
  h.blocks_words.assign(c.fp8_blocks ? layout.num_blocks * h.block_bytes / 4 : 0, 0.0f);
  auto* blocks8 = reinterpret_cast<uint8_t*>(h.blocks_words.data());
  std::fill_n(blocks8, h.blocks_words.size() * 4, uint8_t{0xff});
  if (c.fp8_blocks) {
    h.fp8_view = {blocks8, reinterpret_cast<float*>(blocks8 + layout.BlockElems()), layout,
                  h.block_bytes};
  }
  const int64_t* slots = h.pages.slots.data();
  if (c.fp8) {
    ASSERT_TRUE(cpu::WriteLatentCacheFp8(latent.data(), slots, h.n_lat, 1, h.fp8_view).ok());
  } else {
    ASSERT_TRUE(
        cpu::WriteLatentCache(latent.data(), slots, h.n_lat, 1, {h.pool.data(), layout}).ok());
  }
  *done = true;
}

// The CPU reference (kAbsorbed; one DCP shard's partial and LSE) into want / want_lse.
void ComputeReference(const Case& c, HostBatch& h, bool* done) {
  const MlaDims& d = c.dims;
  const int64_t H = d.num_heads;
  AttentionBatch hb{h.qsl.data(), c.seq_lens.data(),  h.pages.tables.data(),
                    h.S,          h.pages.max_blocks, h.local_lens.data()};
  h.scale = 1.0f / std::sqrt(float(d.QkHeadDim()));
  h.want.assign(h.T_tok * H * d.v_head_dim, 0.0f);
  h.want_lse.assign(h.T_tok * H, 0.0f);
  if (c.fp8) {
    ASSERT_TRUE(cpu::MlaPagedAttentionFp8(h.q.data(), h.kv_b.data(), d, h.fp8_view, 1, hb, h.scale,
                                          MlaMode::kAbsorbed, h.want.data(), h.want_lse.data(),
                                          nullptr, c.dcp)
                    .ok());
  } else {
    ASSERT_TRUE(cpu::MlaPagedAttention(h.q.data(), h.kv_b.data(), d, {h.pool.data(), h.layout}, 1,
                                       hb, h.scale, MlaMode::kAbsorbed, h.want.data(),
                                       h.want_lse.data(), nullptr, c.dcp)
                    .ok());
  }
  *done = true;
}

// One case's device side: the inputs uploaded, the outputs, the pool's buffers (bf16 / fp16, FP8
// planar codes and scales, FP8 blocks) and the cache WriteDevicePool points at one of them.
template <typename T>
struct DeviceBatch {
  DeviceBatch(const Case& c, const HostBatch& h)
      : pool(h.layout.TotalElems()),
        ckv(cuda_test::Convert<T>(h.ckv)),
        kpe(cuda_test::Convert<T>(h.kpe)),
        q(cuda_test::Convert<T>(h.q)),
        kv_b(cuda_test::Convert<T>(h.kv_b)),
        out(h.want.size()),
        slots(h.pages.slots),
        qsl(h.qsl),
        lens(c.seq_lens),
        tables(h.pages.tables),
        local(h.local_lens),
        lse(h.want_lse.size()),
        codes(c.fp8 ? h.layout.TotalElems() : 1),
        scales(c.fp8 ? h.layout.TotalElems() / c.dims.LatentDim() : 1),
        blocks(c.fp8_blocks ? h.layout.num_blocks * h.block_bytes : 1) {}

  DeviceBuffer<T> pool, ckv, kpe, q, kv_b, out;
  DeviceBuffer<int64_t> slots;
  DeviceBuffer<int32_t> qsl, lens, tables, local;
  DeviceBuffer<float> lse;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  DeviceBuffer<uint8_t> blocks;
  DeviceKvCache cache;
};

// The pool written by MlaWriteLatent (MlaWriteLatentFp8) from the strided c_kv / k_pe rows, checked
// byte for byte against the CPU's.
template <typename T>
void WriteDevicePool(const Case& c, const HostBatch& h, DeviceBatch<T>& dev, bool* done) {
  const MlaDims& d = c.dims;
  const int64_t D = d.LatentDim(), L = d.kv_lora_rank, n_lat = h.n_lat;
  const KvCacheLayout& layout = h.layout;
  TANDEM_CUDA_CHECK(cudaMemset(dev.pool.get(), 0xff, layout.TotalElems() * sizeof(T)));
  const KvDtype dt = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  DeviceKvCache& cache = dev.cache;
  cache = DeviceKvCache{dev.pool.get(), layout, dt};
  if (c.fp8_blocks) {
    TANDEM_CUDA_CHECK(cudaMemset(dev.blocks.get(), 0xff, layout.num_blocks * h.block_bytes));
    cache = DeviceKvCache{dev.blocks.get(), layout, KvDtype::kFp8E4m3};
    cache.token_scales = reinterpret_cast<float*>(dev.blocks.get() + layout.BlockElems());
    cache.latent_block_bytes = h.block_bytes;
    ASSERT_TRUE(MlaWriteLatentFp8<T>(dev.ckv.get(), L + 3, dev.kpe.get(), d.qk_rope_head_dim,
                                     dev.slots.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    const std::vector<uint8_t> got = dev.blocks.ToHost();
    ASSERT_TRUE(
        std::equal(got.begin(), got.end(), reinterpret_cast<const uint8_t*>(h.blocks_words.data())))
        << "MlaWriteLatentFp8 (blocks form) differs from the CPU's bytes";
  } else if (c.fp8) {
    TANDEM_CUDA_CHECK(cudaMemset(dev.codes.get(), 0xff, layout.TotalElems()));
    TANDEM_CUDA_CHECK(cudaMemset(dev.scales.get(), 0, layout.TotalElems() / D * sizeof(float)));
    cache = DeviceKvCache{dev.codes.get(), layout, KvDtype::kFp8E4m3};
    cache.token_scales = dev.scales.get();
    ASSERT_TRUE(MlaWriteLatentFp8<T>(dev.ckv.get(), L + 3, dev.kpe.get(), d.qk_rope_head_dim,
                                     dev.slots.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    ASSERT_EQ(dev.codes.ToHost(), h.codes) << "MlaWriteLatentFp8 codes differ from the CPU's";
    ASSERT_EQ(dev.scales.ToHost(), h.row_scales)
        << "MlaWriteLatentFp8 scales differ from the CPU's";
  } else {
    ASSERT_TRUE(MlaWriteLatent<T>(dev.ckv.get(), L + 3, dev.kpe.get(), d.qk_rope_head_dim,
                                  dev.slots.get(), n_lat, d, cache, 1, nullptr)
                    .ok());
    const std::vector<float> pool_got = cuda_test::ToFloat(dev.pool.ToHost());
    ASSERT_EQ(pool_got.size(), h.pool.size());
    for (size_t i = 0; i < h.pool.size(); ++i) {
      ASSERT_TRUE(pool_got[i] == h.pool[i] || (std::isnan(pool_got[i]) && std::isnan(h.pool[i])))
          << "MlaWriteLatent differs from cpu::WriteLatentCache at element " << i;
    }
  }
  *done = true;
}

// What c asks the planner for (the kernel, the splits, the plan length, the merge, the prefetch).
MlaPlanInput PlanInputFor(const Case& c, const HostBatch& h) {
  return MlaPlanInput{.dims = c.dims,
                      .num_seqs = h.S,
                      .num_tokens = h.T_tok,
                      .max_q_len = h.max_q,
                      .max_seq_len = std::max(h.pages.max_len, DcpLocalCount(c.plan_len, c.dcp)),
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
}

// The plan's kernel, splits and merge are those c asked for (where the model allows them).
void CheckPlan(const Case& c, const MlaPlanInput& in, const MlaPlan& plan) {
  const MlaDims& d = c.dims;
  const int64_t L = d.kv_lora_rank, H = d.num_heads;
  EXPECT_EQ(plan.use_mma, L == 512 && d.qk_rope_head_dim == 64);
  EXPECT_EQ(plan.use_wgmma, plan.use_mma && c.kernel >= 1);
  EXPECT_EQ(plan.use_tma, plan.use_mma && c.kernel >= 2);
  if (plan.use_tma) {  // kRows16 only for models of <= 16 heads (16-row tiles)
    EXPECT_EQ(plan.tma_schedule,
              c.kernel == 5 && H > 16 ? MlaTmaSchedule::kSerial : in.tma_schedule);
  }
  if (c.num_splits > 0) {
    EXPECT_LE(plan.num_splits, c.num_splits);
    EXPECT_EQ(plan.num_splits > 1, c.num_splits > 1);
  } else if (c.plan_len >= 4096) {
    EXPECT_GT(plan.num_splits, 1);  // the case is about splits past the requests' contexts
  }
  if (c.merge) {  // the TMA kernel in its serial / hand-off schedule merges its own splits
    // (planned split counts: row tiles of <= 16 rows only)
    const int64_t tile_rows = plan.tma_schedule == MlaTmaSchedule::kRows16 ? 16 : 64;
    const bool small_tiles = std::min<int64_t>(in.max_q_len * d.num_heads, tile_rows) <= 16;
    EXPECT_EQ(plan.merge_in_kernel, plan.use_tma && plan.num_splits > 1 &&
                                        plan.tma_schedule != MlaTmaSchedule::kSeesaw &&
                                        (c.num_splits > 0 || small_tiles));
  } else {
    EXPECT_FALSE(plan.merge_in_kernel);
  }
}

// The kernel's name in the printed line.
const char* KernelName(const Case& c, const MlaPlan& plan) {
  return !plan.use_wgmma                                                         ? ""
         : c.fp8 && plan.use_tma && plan.tma_schedule == MlaTmaSchedule::kRows16 ? " tma-rows16-fp8"
         : c.fp8                                                                 ? " wgmma-fp8"
         : !plan.use_tma                                                         ? " wgmma"
         : plan.tma_schedule == MlaTmaSchedule::kSeesaw  ? " wgmma-tma-seesaw"
         : plan.tma_schedule == MlaTmaSchedule::kHandOff ? " wgmma-tma-handoff"
         : plan.tma_schedule == MlaTmaSchedule::kRows16  ? " tma-rows16"
                                                         : " wgmma-tma";
}

// One planned MlaAbsorbedAttention call of the case, into dev.out / dev.lse.
template <typename T>
struct GpuCall {
  const Case& c;
  const HostBatch& h;
  DeviceBatch<T>& dev;
  const MlaPlanInput& in;
  const MlaPlan& plan;
  cublasHandle_t cublas;
  unsigned char* ws;

  absl::Status operator()(cudaStream_t stream) const {
    AttentionBatch db{dev.qsl.get(), dev.lens.get(),     dev.tables.get(),
                      h.S,           h.pages.max_blocks, dev.local.get()};
    return MlaAbsorbedAttention<T>(cublas, dev.q.get(), dev.kv_b.get(), dev.cache, 1, db, h.scale,
                                   plan, ws, dev.out.get(), dev.lse.get(), stream);
  }
};

// The result against the reference (out within 2.5e-2 of max|ref|, LSE within 2e-2, rows with no
// latent -inf); the merge tickets zero again after the call. Prints one line.
template <typename T>
void CheckResult(const GpuCall<T>& g, const char* what) {
  const Case& c = g.c;
  const std::vector<float>& want = g.h.want;
  const std::vector<float>& want_lse = g.h.want_lse;
  const std::vector<float> got = cuda_test::ToFloat(g.dev.out.ToHost());
  const std::vector<float> got_lse = g.dev.lse.ToHost();
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
  EXPECT_LE(max_err, 2.5e-2f * max_ref) << what << ", splits " << g.plan.num_splits;
  EXPECT_LE(max_lse_err, 2e-2f) << what << ", splits " << g.plan.num_splits;
  if (c.merge) {
    std::vector<uint32_t> counters(kMlaMergeCounterBytes / 4, 1);
    TANDEM_CUDA_CHECK(
        cudaMemcpy(counters.data(), g.ws, kMlaMergeCounterBytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u),
              static_cast<std::ptrdiff_t>(counters.size()))
        << what << ": merge tickets not reset";
  }
  std::cout << "H " << c.dims.num_heads << " L " << c.dims.kv_lora_rank << KernelName(c, g.plan)
            << (c.fp8 ? " fp8" : "") << " splits " << g.plan.num_splits
            << (g.plan.merge_in_kernel ? " merged in kernel" : "") << " (plan len "
            << g.in.max_seq_len << ", " << what << "): max|err| " << max_err << " of max|ref| "
            << max_ref << ", max|lse err| " << max_lse_err;
  if (c.dcp.size > 1) {
    std::cout << " (DCP shard " << c.dcp.rank << "/" << c.dcp.size << " interleave "
              << c.dcp.interleave << ", " << empty_rows << " empty rows)";
  }
  std::cout << "\n";
}

// One call captured in a CUDA graph, replayed twice (out and LSE set to NaN before each), each
// replay checked: each finds the merge tickets zero.
template <typename T>
void CheckGraphReplays(const GpuCall<T>& g, bool* done) {
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer<unsigned char> cublas_ws(int64_t{32} << 20);
  ASSERT_EQ(cublasSetWorkspace(g.cublas, cublas_ws.get(), int64_t{32} << 20),
            CUBLAS_STATUS_SUCCESS);
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  const absl::Status cst = g(stream);
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(cst.ok()) << cst;
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const char* what : {"graph replay 1", "graph replay 2"}) {
    TANDEM_CUDA_CHECK(cudaMemset(g.dev.out.get(), 0xff, g.h.want.size() * sizeof(T)));
    TANDEM_CUDA_CHECK(cudaMemset(g.dev.lse.get(), 0xff, g.h.want_lse.size() * sizeof(float)));
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    CheckResult(g, what);
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  *done = true;
}

// Plans c, checks the plan, runs MlaAbsorbedAttention eagerly (and replayed in a CUDA graph with
// c.graph) and checks each result.
template <typename T>
void PlanRunAndCheck(const Case& c, const HostBatch& h, DeviceBatch<T>& dev) {
  const MlaPlanInput in = PlanInputFor(c, h);
  absl::StatusOr<MlaPlan> plan = PlanMla(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(c, in, *plan);
  DeviceBuffer<unsigned char> ws(plan->workspace_bytes);
  // NaN everywhere: a split partial the merge reads without its CTA having written it (an empty
  // split's out rows stay unwritten) turns the result NaN. The merge tickets zeroed once.
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0xff, plan->workspace_bytes));
  if (c.merge) {
    TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0, kMlaMergeCounterBytes));
  }
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  const GpuCall<T> call{c, h, dev, in, *plan, cublas, ws.get()};
  const absl::Status st = call(nullptr);
  ASSERT_TRUE(st.ok()) << st;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  CheckResult(call, "eager");
  if (c.graph) {
    bool replayed = false;
    CheckGraphReplays(call, &replayed);
    if (!replayed) return;
  }
  cublasDestroy(cublas);
}

}  // namespace

template <typename T>
void RunCase(const Case& c, std::mt19937& rng) {
  HostBatch h;
  DrawHostBatch<T>(c, rng, h);
  bool host_written = false, referenced = false, device_written = false;
  WriteHostPool(c, h, &host_written);
  if (!host_written) return;
  ComputeReference(c, h, &referenced);
  if (!referenced) return;
  DeviceBatch<T> dev(c, h);
  WriteDevicePool(c, h, dev, &device_written);
  if (!device_written) return;
  PlanRunAndCheck(c, h, dev);
}

template void RunCase<__nv_bfloat16>(const Case& c, std::mt19937& rng);
template void RunCase<__half>(const Case& c, std::mt19937& rng);

}  // namespace tandem::kernels::cuda::mla_cuda_test
