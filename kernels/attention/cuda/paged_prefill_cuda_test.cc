// cuda::PagedPrefillAttention against the fp64 reference of attention_test_util on random paged
// batches (shuffled physical blocks, NaN in every slot no sequence owns), with inputs rounded
// to the kernel's dtype first so only the kernel's own arithmetic is measured. Every case runs
// both kernels where both exist (Hopper wgmma and mma.sync), each into a NaN-poisoned output.
//
// Tolerances (as paged_attention_cuda_test): out within 1e-2 x max|ref| (bf16/fp16 output
// rounding is 2^-9 relative, P rounded to bf16 adds about as much), lse within 2e-3 x max(1,
// |ref|). fp8 e4m3 pools: the reference reads what the kernel reads, the dequantized codes (code *
// scale; the mma.sync kernel's exact inputs) or, for the wgmma kernel, the pool widened into the
// workspace (code * scale rounded once to 16 bits); out within 2e-2 as the fp8 decode test.
#include "kernels/attention/cuda/paged_prefill_cuda.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/attention_cuda_test_util.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using attention_test::CaseOptions;
using attention_test::LseClose;
using attention_test::MakePagedCase;
using attention_test::OutClose;
using attention_test::PagedCase;
using attention_test::Reference;
using attention_test::ReferenceAttentionSeq;
using attention_test::SeqSpec;
using attention_test::TestSeed;
using cuda_test::DeviceBuffer;

constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 2e-3;

// ReferenceAttention, spread over the host's cores: each job is a run of query rows of one
// sequence (rows [j0, j1) of a request are the request truncated to seq_len - q_len + j1).
Reference ParallelReference(const PagedCase& c, const AttentionParams& params) {
  const int64_t hq = c.options.num_q_heads, hkv = c.options.num_kv_heads, d = c.options.head_dim;
  Reference ref;
  ref.out.assign(c.num_tokens * hq * d, 0.0);
  ref.lse.assign(c.num_tokens * hq, 0.0);
  struct Job {
    size_t seq;
    int64_t j0, j1;
  };
  std::vector<Job> jobs;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const int64_t q_len = c.seqs[s].q_len;
    const int64_t chunk = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, c.seqs[s].seq_len));
    for (int64_t j0 = 0; j0 < q_len; j0 += chunk)
      jobs.push_back({s, j0, std::min(q_len, j0 + chunk)});
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const Job& job = jobs[i];
      const SeqSpec& spec = c.seqs[job.seq];
      const int64_t token = c.query_start_loc[job.seq] + job.j0;
      ReferenceAttentionSeq(c.q.data() + token * hq * d, c.k[job.seq].data(), c.v[job.seq].data(),
                            job.j1 - job.j0, spec.seq_len - spec.q_len + job.j1, hq, hkv, d, params,
                            0, std::numeric_limits<int64_t>::max(), ref.out.data() + token * hq * d,
                            ref.lse.data() + token * hq);
    }
  };
  const unsigned n = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  return ref;
}

using cuda_test::RoundCase;
using RunResult = cuda_test::AttentionOutput;

// How a case's pool is stored: in the activations' dtype, or as fp8 e4m3 codes with one scale
// per tensor (k and v each) or per kv head.
enum class Pool { kOwn, kFp8PerTensor, kFp8PerHead };

const char* PoolName(Pool pool) {
  return pool == Pool::kOwn          ? "own-dtype pool"
         : pool == Pool::kFp8PerHead ? "fp8 pool, per-head scales"
                                     : "fp8 pool, per-tensor scales";
}

// A case's pool as fp8 codes and their dequantization scales ([num_kv_heads] or [1]).
struct Fp8Pool {
  std::vector<__nv_fp8_e4m3> codes;
  std::vector<float> k_scale, v_scale;
  bool per_head = false;
};

// Quantizes the case's pool to fp8 e4m3 with random positive scales (values ~N(0, 1): |x| /
// scale stays well under 448 for scales >= 0.012; the NaN slots stay NaN codes) and replaces the
// reference's K/V copies by the dequantized values code * scale, so the reference sees exactly
// what the kernel reads.
Fp8Pool QuantizeFp8(std::mt19937& rng, PagedCase& c, bool per_head) {
  const KvCacheLayout& layout = c.layout;
  const int64_t d = layout.head_dim, row = layout.num_kv_heads * d;
  Fp8Pool f;
  f.per_head = per_head;
  std::uniform_real_distribution<float> scale(0.012f, 0.04f);
  for (int64_t h = 0; h < (per_head ? layout.num_kv_heads : 1); ++h) {
    f.k_scale.push_back(scale(rng));
    f.v_scale.push_back(scale(rng));
  }
  // Element i of the pool or of a [seq_len, kv heads, d] copy belongs to kv head (i % row) / d.
  auto scale_of = [&](size_t i, const std::vector<float>& s) {
    return s[per_head ? (static_cast<int64_t>(i) % row) / d : 0];
  };
  f.codes.resize(c.pool.size());
  for (size_t i = 0; i < c.pool.size(); ++i) {
    const bool is_v = (static_cast<int64_t>(i) / layout.TileElems()) % 2 == 1;
    f.codes[i] = __nv_fp8_e4m3(c.pool[i] / scale_of(i, is_v ? f.v_scale : f.k_scale));
  }
  auto dequant = [&](std::vector<float>& x, const std::vector<float>& s) {
    for (size_t i = 0; i < x.size(); ++i) {
      const float sc = scale_of(i, s);
      x[i] = static_cast<float>(__nv_fp8_e4m3(x[i] / sc)) * sc;
    }
  };
  for (auto& k : c.k) dequant(k, f.k_scale);
  for (auto& v : c.v) dequant(v, f.v_scale);
  return f;
}

// What the wgmma kernel reads of an fp8 case (QuantizeFp8 done): the pool widened into the
// workspace, code * scale rounded once to T (the same fp32 product, rounded to nearest even).
template <typename T>
PagedCase WidenedCase(const PagedCase& c) {
  PagedCase w = c;
  for (auto& k : w.k) cuda_test::RoundTo<T>(k);
  for (auto& v : w.v) cuda_test::RoundTo<T>(v);
  return w;
}

// Blocks the case's requests reach: sum of ceil(seq_len / block_size).
int64_t TotalKvBlocks(const PagedCase& c) {
  int64_t blocks = 0;
  for (const SeqSpec& seq : c.seqs) {
    blocks += (seq.seq_len + c.layout.block_size - 1) / c.layout.block_size;
  }
  return blocks;
}

// fp8: the pool is `fp8`'s codes (c.pool is not read); with wgmma the plan widens it into the
// workspace (PagedPrefillPlanInput::total_kv_blocks) unless widen_budget is too small for it,
// when the plan must fall back to the mma.sync kernel.
template <typename T>
void RunCase(const PagedCase& c, const AttentionParams& params, bool wgmma, bool with_lse,
             RunResult* result, const Fp8Pool* fp8 = nullptr,
             int64_t widen_budget = int64_t{256} << 20) {
  const KvCacheLayout& layout = c.layout;
  const int64_t hq = c.options.num_q_heads, d = c.options.head_dim;
  DeviceBuffer<T> pool_dev(fp8 == nullptr ? cuda_test::Convert<T>(c.pool) : std::vector<T>());
  DeviceBuffer<__nv_fp8_e4m3> codes_dev(fp8 == nullptr ? std::vector<__nv_fp8_e4m3>() : fp8->codes);
  DeviceBuffer<float> k_scale_dev(fp8 == nullptr ? std::vector<float>(1, 1.0f) : fp8->k_scale);
  DeviceBuffer<float> v_scale_dev(fp8 == nullptr ? std::vector<float>(1, 1.0f) : fp8->v_scale);
  DeviceBuffer<T> q_dev(cuda_test::Convert<T>(c.q));
  const cuda_test::DeviceBatch batch(c);
  DeviceBuffer<T> out_dev(std::max<int64_t>(1, c.num_tokens * hq * d));
  DeviceBuffer<float> lse_dev(std::max<int64_t>(1, c.num_tokens * hq));
  // Poison: a row the kernel forgets to write reads back as NaN (0xffff is NaN in bf16/fp16).
  TANDEM_CUDA_CHECK(cudaMemset(out_dev.get(), 0xff, out_dev.size() * sizeof(T)));
  TANDEM_CUDA_CHECK(cudaMemset(lse_dev.get(), 0xff, lse_dev.size() * sizeof(float)));

  PagedPrefillPlanInput in;
  cuda_test::SetPlanShape(c, in);
  in.kv_dtype = fp8 != nullptr              ? KvDtype::kFp8E4m3
                : std::is_same_v<T, __half> ? KvDtype::kFp16
                                            : KvDtype::kBf16;
  in.allow_wgmma = wgmma;
  in.kv_block_size = layout.block_size;
  in.total_kv_blocks = TotalKvBlocks(c);
  in.fp8_widen_max_bytes = widen_budget;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&in.num_sms, cudaDevAttrMultiProcessorCount, 0));
  absl::StatusOr<PagedPrefillPlan> plan = PlanPagedPrefill(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // fp8 widened: the layer's K and V of every reached block in 16 bits, plus the table.
  const int64_t widened = 2 * in.total_kv_blocks * layout.TileElems() * 2;
  const bool widen = fp8 != nullptr && wgmma && d <= 128 && widened < widen_budget;
  ASSERT_EQ(plan->widen_fp8, widen);
  ASSERT_EQ(plan->use_wgmma, wgmma && d <= 128 && (fp8 == nullptr || widen));
  if (widen) {
    ASSERT_GE(plan->workspace_bytes, widened);
    ASSERT_LE(plan->workspace_bytes, widen_budget);
  } else {
    ASSERT_EQ(plan->workspace_bytes, 0);
  }
  DeviceBuffer<char> workspace(std::max<int64_t>(1, plan->workspace_bytes));
  // Stale bytes in the workspace must not matter: NaN everywhere (0xff) before the widening.
  TANDEM_CUDA_CHECK(cudaMemset(workspace.get(), 0xff, workspace.size()));

  const DeviceKvCache cache{
      .data = fp8 == nullptr ? static_cast<void*>(pool_dev.get()) : codes_dev.get(),
      .layout = layout,
      .dtype = in.kv_dtype,
      .k_scale = fp8 == nullptr ? nullptr : k_scale_dev.get(),
      .v_scale = fp8 == nullptr ? nullptr : v_scale_dev.get(),
      .per_head_scale = fp8 != nullptr && fp8->per_head};
  const absl::Status status =
      PagedPrefillAttention<T>(q_dev.get(), cache, c.options.layer, batch.batch, params, *plan,
                               out_dev.get(), with_lse ? lse_dev.get() : nullptr,
                               plan->workspace_bytes > 0 ? workspace.get() : nullptr, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  *result = cuda_test::ReadBack(c, out_dev, lse_dev);
}

template <typename T>
void CheckCase(std::mt19937& rng, const CaseOptions& options, const std::vector<SeqSpec>& seqs,
               const std::vector<AttentionParams>& param_sets, const std::string& label,
               Pool pool = Pool::kOwn) {
  SCOPED_TRACE(label);
  SCOPED_TRACE(PoolName(pool));
  PagedCase c = MakePagedCase(rng, options, seqs);
  std::optional<Fp8Pool> fp8;
  if (pool == Pool::kOwn) {
    RoundCase<T>(c);
  } else {
    cuda_test::RoundTo<T>(c.q);
    fp8 = QuantizeFp8(rng, c, pool == Pool::kFp8PerHead);
  }
  const double out_tol = fp8 ? 2 * kOutTol : kOutTol;
  const bool widens = fp8 && options.head_dim <= 128;  // fp8 on the wgmma kernel
  const PagedCase widened = widens ? WidenedCase<T>(c) : PagedCase{};
  for (const AttentionParams& params : param_sets) {
    SCOPED_TRACE("window_left=" + std::to_string(params.window_left) +
                 " softcap=" + std::to_string(params.softcap));
    const Reference ref = ParallelReference(c, params);
    const Reference ref_widened = widens ? ParallelReference(widened, params) : Reference{};
    for (bool wgmma : {true, false}) {
      if (wgmma && options.head_dim > 128) continue;
      SCOPED_TRACE(wgmma ? "wgmma kernel" : "mma.sync kernel");
      RunResult r;
      RunCase<T>(c, params, wgmma, /*with_lse=*/true, &r, fp8 ? &*fp8 : nullptr);
      if (::testing::Test::HasFatalFailure()) return;
      const Reference& want = fp8 && wgmma ? ref_widened : ref;
      EXPECT_TRUE(OutClose(r.out, want.out, out_tol));
      EXPECT_TRUE(LseClose(r.lse, want.lse, kLseTol));
    }
  }
}

std::string Label(int64_t d, int64_t bs, int64_t hq, int64_t hkv) {
  return "d=" + std::to_string(d) + " bs=" + std::to_string(bs) + " hq=" + std::to_string(hq) +
         " hkv=" + std::to_string(hkv);
}

// A mix the engine produces: decode-like 1-token requests, pure prefill (q_len == seq_len),
// extends over a paged prefix, a padding request, lengths around the tile sizes and not
// multiples of the block size, plus two random requests.
std::vector<SeqSpec> MixedSeqs(std::mt19937& rng, int64_t bs) {
  std::vector<SeqSpec> seqs = {{300, 1},    {200, 200}, {700, 133}, {129, 129}, {0, 0},
                               {bs * 3, 5}, {64, 64},   {257, 31},  {1, 1}};
  std::uniform_int_distribution<int64_t> len(1, 900);
  for (int i = 0; i < 2; ++i) {
    const int64_t seq_len = len(rng);
    seqs.push_back({seq_len, std::uniform_int_distribution<int64_t>(1, seq_len)(rng)});
  }
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

TEST(PagedPrefillCudaTest, VarlenBatchesBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const AttentionParams params{.scale = 0.09f};
  for (int64_t d : {64, 128}) {
    for (int64_t bs : {16, 32, 64}) {
      // {q heads, kv heads}: GQA groups 1, 4, 8 and MQA.
      for (auto [hq, hkv] :
           std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {16, 2}, {8, 1}}) {
        CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = bs};
        CheckCase<__nv_bfloat16>(rng, o, MixedSeqs(rng, bs), {params}, Label(d, bs, hq, hkv));
      }
    }
  }
}

TEST(PagedPrefillCudaTest, HeadDim256) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {8, 1}}) {
    CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = 256, .block_size = 16};
    CheckCase<__nv_bfloat16>(rng, o, MixedSeqs(rng, 16), {{.scale = 0.06f}},
                             Label(256, 16, hq, hkv));
  }
}

TEST(PagedPrefillCudaTest, WindowAndSoftcap) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const std::vector<AttentionParams> params = {
      {.scale = 0.1f, .window_left = 37},
      {.scale = 0.1f, .window_left = 200},
      {.scale = 0.1f, .window_left = 0},
      {.scale = 0.1f, .softcap = 5.0f},
      {.scale = 0.1f, .window_left = 150, .softcap = 3.0f},
  };
  for (int64_t d : {64, 128, 256}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    CheckCase<__nv_bfloat16>(rng, o, MixedSeqs(rng, 16), params, Label(d, 16, 8, 2));
  }
}

TEST(PagedPrefillCudaTest, Fp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 32};
    CheckCase<__half>(rng, o, MixedSeqs(rng, 32),
                      {{.scale = 0.088f}, {.scale = 0.088f, .window_left = 100, .softcap = 4.0f}},
                      "fp16 " + Label(d, 32, 8, 2));
  }
}

// fp8 e4m3 pools (the mma.sync kernel): bf16 q, head_dim 64 / 128, GQA groups 1, 4, 8, a power-
// of-two and a non-power-of-two block size, per-tensor and per-head scales, the engine's mix.
TEST(PagedPrefillCudaTest, Fp8VarlenBatches) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const AttentionParams params{.scale = 0.09f};
  for (int64_t d : {64, 128}) {
    for (int64_t bs : {16, 24}) {
      for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {16, 4}, {16, 2}}) {
        for (Pool pool : {Pool::kFp8PerTensor, Pool::kFp8PerHead}) {
          CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = bs};
          CheckCase<__nv_bfloat16>(rng, o, MixedSeqs(rng, bs), {params}, Label(d, bs, hq, hkv),
                                   pool);
        }
      }
    }
  }
}

// fp8 pools with a window and soft-cap (the K scale then enters tanh's argument), bf16 and fp16 q.
TEST(PagedPrefillCudaTest, Fp8WindowSoftcapAndFp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const std::vector<AttentionParams> params = {
      {.scale = 0.1f, .window_left = 37},
      {.scale = 0.1f, .softcap = 5.0f},
      {.scale = 0.1f, .window_left = 150, .softcap = 3.0f},
  };
  for (int64_t d : {64, 128}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    CheckCase<__nv_bfloat16>(rng, o, MixedSeqs(rng, 16), params, Label(d, 16, 8, 2),
                             Pool::kFp8PerHead);
    o.block_size = 24;
    CheckCase<__half>(rng, o, MixedSeqs(rng, 24), params, "fp16 " + Label(d, 24, 8, 2),
                      Pool::kFp8PerTensor);
    o.num_q_heads = 16;
    CheckCase<__half>(rng, o, MixedSeqs(rng, 24), {{.scale = 0.088f}},
                      "fp16 " + Label(d, 24, 16, 2), Pool::kFp8PerHead);
  }
}

// A long extend over a 16k paged prefix and a long pure prefill in one batch.
TEST(PagedPrefillCudaTest, LongContext) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 8,
                .num_kv_heads = 2,
                .head_dim = 128,
                .block_size = 16,
                .num_layers = 1,
                .layer = 0};
  CheckCase<__nv_bfloat16>(rng, o, {{16384, 300}, {3001, 3001}, {17, 2}},
                           {{.scale = 0.088f}, {.scale = 0.088f, .window_left = 4095}},
                           "16k extend + 3k prefill");
  // The same over fp8 codes: the widened copy holds 1,214 blocks (4.7 MiB at 2 kv heads).
  CheckCase<__nv_bfloat16>(rng, o, {{16384, 300}, {3001, 3001}, {17, 2}}, {{.scale = 0.088f}},
                           "fp8 16k extend + 3k prefill", Pool::kFp8PerTensor);
}

// An fp8 pool whose widened copy does not fit the plan's budget runs the mma.sync kernel over
// the codes (and needs no workspace), with the same results as the widened wgmma run.
TEST(PagedPrefillCudaTest, Fp8WidenOverBudgetReadsTheCodes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 16, .num_kv_heads = 4, .head_dim = 128, .block_size = 16};
  PagedCase c = MakePagedCase(rng, o, MixedSeqs(rng, 16));
  cuda_test::RoundTo<__nv_bfloat16>(c.q);
  const Fp8Pool fp8 = QuantizeFp8(rng, c, /*per_head=*/true);
  const AttentionParams params{.scale = 0.09f};
  const Reference ref = ParallelReference(c, params);
  const Reference ref_widened = ParallelReference(WidenedCase<__nv_bfloat16>(c), params);
  RunResult widened, codes;
  RunCase<__nv_bfloat16>(c, params, /*wgmma=*/true, /*with_lse=*/true, &widened, &fp8);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  RunCase<__nv_bfloat16>(c, params, /*wgmma=*/true, /*with_lse=*/true, &codes, &fp8,
                         /*widen_budget=*/4096);  // RunCase asserts the plan's fallback
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_TRUE(OutClose(widened.out, ref_widened.out, 2 * kOutTol));
  EXPECT_TRUE(LseClose(widened.lse, ref_widened.lse, kLseTol));
  EXPECT_TRUE(OutClose(codes.out, ref.out, 2 * kOutTol));
  EXPECT_TRUE(LseClose(codes.lse, ref.lse, kLseTol));
  EXPECT_TRUE(
      OutClose(widened.out, std::vector<double>(codes.out.begin(), codes.out.end()), 2 * kOutTol));
}

// Many requests: the work-item search over query_start_loc, inside and beyond the kernel's
// shared-memory cache of it (1024 requests).
TEST(PagedPrefillCudaTest, ManySmallRequests) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int n : {300, 1100}) {
    std::vector<SeqSpec> seqs;
    std::uniform_int_distribution<int64_t> len(1, 40);
    for (int i = 0; i < n; ++i) {
      const int64_t seq_len = len(rng);
      seqs.push_back({seq_len, std::min<int64_t>(seq_len, 1 + i % 3)});
    }
    CaseOptions o{.num_q_heads = 8,
                  .num_kv_heads = 2,
                  .head_dim = 128,
                  .block_size = 16,
                  .spare_table_columns = 0};
    CheckCase<__nv_bfloat16>(rng, o, seqs, {{.scale = 0.088f}}, std::to_string(n) + " requests");
  }
}

// The batches the engine's first step builds (runtime/cuda cuda_engine_test, MidConfig): 4 or
// 13 prompts of 1..70 tokens, all pure prefill, 8 q / 2 kv heads, head_dim 128, block 16, a
// block-table row of 64 entries (max_model_len 1024), two layers attended one after the other.
TEST(PagedPrefillCudaTest, EngineFirstStepShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  std::uniform_int_distribution<int64_t> len(1, 70);
  for (int trial = 0; trial < 24; ++trial) {
    const int n = trial % 2 == 0 ? 4 : 13;
    std::vector<SeqSpec> seqs;
    int64_t blocks = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t l = len(rng);
      seqs.push_back({l, l});
      blocks = std::max<int64_t>(blocks, (l + 15) / 16);
    }
    for (int64_t layer : {0, 1}) {
      CaseOptions o{.num_q_heads = 8,
                    .num_kv_heads = 2,
                    .head_dim = 128,
                    .block_size = 16,
                    .num_layers = 2,
                    .layer = layer,
                    .spare_table_columns = 64 - blocks};
      CheckCase<__nv_bfloat16>(
          rng, o, seqs, {{.scale = 0.088f}},
          "trial " + std::to_string(trial) + " layer " + std::to_string(layer));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(PagedPrefillCudaTest, NanInQueryStaysInItsRowAndNullLse) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  PagedCase c = MakePagedCase(rng, o, {{100, 40}, {200, 3}});
  RoundCase<__nv_bfloat16>(c);
  c.q[0] = std::numeric_limits<float>::quiet_NaN();  // token 0, head 0
  for (bool wgmma : {true, false}) {
    RunResult r;
    RunCase<__nv_bfloat16>(c, {.scale = 0.1f}, wgmma, /*with_lse=*/true, &r);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_TRUE(std::isnan(r.out[0]));
    EXPECT_TRUE(std::isnan(r.lse[0]));
    for (size_t i = 1; i < r.lse.size(); ++i) EXPECT_FALSE(std::isnan(r.lse[i])) << "row " << i;
    // Without lse: same output.
    RunResult r2;
    RunCase<__nv_bfloat16>(c, {.scale = 0.1f}, wgmma, /*with_lse=*/false, &r2);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    for (size_t i = 0; i < r.out.size(); ++i) {
      ASSERT_TRUE(r.out[i] == r2.out[i] || (std::isnan(r.out[i]) && std::isnan(r2.out[i])))
          << "element " << i;
    }
  }
}

TEST(PagedPrefillCudaTest, PlanRejectsBadShapes) {
  PagedPrefillPlanInput in{
      .num_seqs = 2, .num_tokens = 8, .num_q_heads = 8, .num_kv_heads = 3, .head_dim = 128};
  EXPECT_EQ(PlanPagedPrefill(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.num_kv_heads = 2;
  in.head_dim = 96;
  EXPECT_EQ(PlanPagedPrefill(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.kv_dtype = KvDtype::kInt8;
  for (int64_t d : {64, 128, 256}) {
    in.head_dim = d;
    EXPECT_EQ(PlanPagedPrefill(in).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // fp8 e4m3: the mma.sync kernel at head_dim 64 / 128, refused at 192 / 256.
  in.kv_dtype = KvDtype::kFp8E4m3;
  for (int64_t d : {64, 128}) {
    in.head_dim = d;
    absl::StatusOr<PagedPrefillPlan> fp8_plan = PlanPagedPrefill(in);
    ASSERT_TRUE(fp8_plan.ok()) << fp8_plan.status();
    EXPECT_FALSE(fp8_plan->use_wgmma);
    EXPECT_EQ(fp8_plan->rows_per_tile, 64);
    EXPECT_GE(fp8_plan->grid, 1);
  }
  for (int64_t d : {192, 256}) {
    in.head_dim = d;
    const absl::Status status = PlanPagedPrefill(in).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("fp8"), std::string::npos) << status;
  }
  in.head_dim = 128;
  in.kv_dtype = KvDtype::kBf16;
  in.num_tokens = -1;
  EXPECT_EQ(PlanPagedPrefill(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.num_tokens = 8;
  absl::StatusOr<PagedPrefillPlan> plan = PlanPagedPrefill(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->use_wgmma);
  EXPECT_EQ(plan->workspace_bytes, 0);
  EXPECT_GE(plan->grid, 1);
  in.head_dim = 256;
  plan = PlanPagedPrefill(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->use_wgmma);
}

// Argument errors come back before anything touches the device (the pointers here are fake).
TEST(PagedPrefillCudaTest, RejectsBadArguments) {
  PagedPrefillPlanInput in{.num_seqs = 1,
                           .num_tokens = 4,
                           .max_q_len = 4,
                           .max_seq_len = 4,
                           .num_q_heads = 8,
                           .num_kv_heads = 2,
                           .head_dim = 64};
  absl::StatusOr<PagedPrefillPlan> plan = PlanPagedPrefill(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto* fake = reinterpret_cast<__nv_bfloat16*>(uintptr_t{1} << 20);
  const int32_t* fake_i = reinterpret_cast<const int32_t*>(uintptr_t{1} << 20);
  DeviceKvCache cache{
      .data = fake,
      .layout = {
          .num_blocks = 4, .num_layers = 2, .block_size = 16, .num_kv_heads = 2, .head_dim = 64}};
  const AttentionBatch batch{.query_start_loc = fake_i,
                             .seq_lens = fake_i,
                             .block_tables = fake_i,
                             .num_seqs = 1,
                             .max_blocks_per_seq = 1};
  auto call = [&](const DeviceKvCache& kv, int64_t layer, const AttentionParams& params,
                  const __nv_bfloat16* q) {
    return PagedPrefillAttention<__nv_bfloat16>(q, kv, layer, batch, params, *plan, fake, nullptr,
                                                nullptr, nullptr)
        .code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(call(cache, 2, {.scale = 0.1f}, fake), kInvalid);  // layer out of range
  EXPECT_EQ(call(cache, 0, {.scale = 0.0f}, fake), kInvalid);
  EXPECT_EQ(call(cache, 0, {.scale = std::nanf("")}, fake), kInvalid);
  EXPECT_EQ(call(cache, 0, {.scale = 0.1f, .softcap = -1.0f}, fake), kInvalid);
  EXPECT_EQ(call(cache, 0, {.scale = 0.1f, .window_left = -2}, fake), kInvalid);
  EXPECT_EQ(call(cache, 0, {.scale = 0.1f}, nullptr), kInvalid);
  EXPECT_EQ(call(cache, 0, {.scale = 0.1f}, fake + 1), kInvalid);  // unaligned q
  DeviceKvCache wrong = cache;
  wrong.dtype = KvDtype::kFp16;  // pool dtype differs from the plan's and from T
  EXPECT_EQ(call(wrong, 0, {.scale = 0.1f}, fake), kInvalid);
  wrong = cache;
  wrong.layout.head_dim = 128;  // plan mismatch
  EXPECT_EQ(call(wrong, 0, {.scale = 0.1f}, fake), kInvalid);
  wrong = cache;
  wrong.data = nullptr;
  EXPECT_EQ(call(wrong, 0, {.scale = 0.1f}, fake), kInvalid);

  // fp8 pools need both scales, and a plan of the same kv_dtype.
  PagedPrefillPlanInput fp8_in = in;
  fp8_in.kv_dtype = KvDtype::kFp8E4m3;
  absl::StatusOr<PagedPrefillPlan> fp8_plan = PlanPagedPrefill(fp8_in);
  ASSERT_TRUE(fp8_plan.ok()) << fp8_plan.status();
  const float* fake_f = reinterpret_cast<const float*>(uintptr_t{1} << 20);
  DeviceKvCache fp8_cache = cache;
  fp8_cache.dtype = KvDtype::kFp8E4m3;
  fp8_cache.k_scale = fake_f;
  for (const float* v_scale : {static_cast<const float*>(nullptr), fake_f}) {
    fp8_cache.v_scale = v_scale;
    fp8_cache.k_scale = v_scale == nullptr ? fake_f : nullptr;
    EXPECT_EQ(PagedPrefillAttention<__nv_bfloat16>(fake, fp8_cache, 0, batch, {.scale = 0.1f},
                                                   *fp8_plan, fake, nullptr, nullptr, nullptr)
                  .code(),
              kInvalid);
  }
  fp8_cache.k_scale = fake_f;
  fp8_cache.v_scale = fake_f;
  EXPECT_EQ(call(fp8_cache, 0, {.scale = 0.1f}, fake), kInvalid);  // a bf16 plan
  wrong = cache;
  wrong.dtype = KvDtype::kInt8;
  EXPECT_EQ(call(wrong, 0, {.scale = 0.1f}, fake), kInvalid);
}

}  // namespace
}  // namespace tandem::kernels::cuda
