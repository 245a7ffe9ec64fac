// cuda::PagedAttention against the fp64 reference of attention_test_util on random paged
// batches (shuffled physical blocks, NaN in every slot no sequence owns), with inputs rounded
// to the kernel's dtype first so only the kernel's own arithmetic is measured.
//
// Tolerances: out within 1e-2 x max|ref| (bf16/fp16 output rounding is 2^-9 relative, fp32
// accumulation adds far less); lse within 2e-3 x max(1, |ref|). fp8 (out 2e-2) and int8 (out
// 1e-2: the tensor-core path rounds the V-scaled weights to fp16, 2^-11 relative) are checked
// against the reference on the dequantized pool, so quantization error is not measured, only
// the fused dequantization.
#include "kernels/attention/cuda/paged_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/attention_cuda_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/pdl_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using attention_test::CaseOptions;
using attention_test::LseClose;
using attention_test::MakePagedCase;
using attention_test::OutClose;
using attention_test::PagedCase;
using attention_test::ReferenceAttention;
using attention_test::SeqSpec;
using attention_test::TestSeed;
using cuda_test::DeviceBuffer;

constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 2e-3;

// The pool's element type in a test case: the activation type's own, fp8 e4m3 (per-kv-head
// scales) or int8 (per-token-per-head scales).
enum class Kv { kOwn, kFp8, kInt8 };

const char* KvName(Kv kv) { return kv == Kv::kOwn ? "own" : kv == Kv::kFp8 ? "fp8" : "int8"; }

double OutTol(Kv kv) { return kv == Kv::kFp8 ? 2 * kOutTol : kOutTol; }

// Multiplies every head_dim row of x by 2^e, e in [-5, 5] picked from the row's first value, so
// the same row gets the same factor in the pool and in the per-sequence copies: int8 per-token
// scales then vary by 2^10 between neighbouring keys.
void VaryRowMagnitudes(std::vector<float>& x, int64_t head_dim) {
  for (size_t r = 0; r + head_dim <= x.size(); r += head_dim) {
    if (std::isnan(x[r])) continue;
    uint32_t bits;
    std::memcpy(&bits, &x[r], 4);
    const float f = std::ldexp(1.0f, static_cast<int>((bits >> 7) % 11) - 5);
    for (int64_t i = 0; i < head_dim; ++i) x[r + i] *= f;
  }
}

using RunResult = cuda_test::AttentionOutput;

// How a run merges its KV splits: in the decode kernel (a zeroed workspace; the default), by the
// PDL-launched merge kernel, or by the planner and merge from before issue 35.
enum class Merge { kInKernel, kSeparate, kLegacy };

// The in-kernel merge's counters (the workspace's first 16 KB) are zero again after a call.
void ExpectMergeCountersZero(const DeviceBuffer<uint8_t>& ws, const PagedAttentionPlan& plan) {
  if (!plan.merge_in_kernel) return;
  std::vector<uint32_t> counters(kPagedAttentionCounterBytes / 4);
  TANDEM_CUDA_CHECK(
      cudaMemcpy(counters.data(), ws.get(), counters.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u),
            static_cast<std::ptrdiff_t>(counters.size()));
}

// Rounds the case's q and pool (and the reference's K/V copies) to T, or quantizes the pool to
// fp8 with per-kv-head scales or to int8 with per-row scales (the reference's copies then hold
// the dequantized values); runs the kernel; returns out and lse.
// pdl_behind_writer: the decode kernel is PDL-launched (PagedAttentionPlanInput::
// programmatic_launch) behind a kernel that allows it to start at once and writes q and the whole
// pool only ~1 ms later (pdl_test::LaunchDelayedWriter; q and the pool hold NaN bytes until then):
// the result is right only if the decode kernel reads neither before its griddepcontrol.wait.
template <typename T>
void RunCase(PagedCase& c, const AttentionParams& params, int forced_splits, Kv kv,
             bool tensor_cores, RunResult* result, Merge merge = Merge::kInKernel,
             bool pdl_behind_writer = false) {
  const KvCacheLayout& layout = c.layout;
  const bool fp8 = kv == Kv::kFp8;
  cuda_test::RoundTo<T>(c.q);
  std::vector<float> k_scale(layout.num_kv_heads, 1.0f), v_scale(layout.num_kv_heads, 1.0f);
  std::vector<float> token_scales(1, 1.0f);
  DeviceBuffer<uint8_t> pool_dev(layout.TotalElems() * (kv == Kv::kOwn ? sizeof(T) : 1));
  const int64_t hd = layout.head_dim;
  if (kv == Kv::kInt8) {
    // Rows of the pool (scale index = element offset / head_dim) and of the reference's copies
    // quantize identically: they hold the same values.
    std::vector<int8_t> pool(c.pool.size());
    token_scales.resize(c.pool.size() / hd);
    for (size_t r = 0; r < token_scales.size(); ++r) {
      token_scales[r] = Int8QuantizeRow(&c.pool[r * hd], hd, &pool[r * hd]);
    }
    auto dequant = [&](std::vector<float>& x) {
      std::vector<int8_t> q(hd);
      for (size_t r = 0; r * hd < x.size(); ++r) {
        const float scale = Int8QuantizeRow(&x[r * hd], hd, q.data());
        for (int64_t i = 0; i < hd; ++i) x[r * hd + i] = static_cast<float>(q[i]) * scale;
      }
    };
    for (auto& k : c.k) dequant(k);
    for (auto& v : c.v) dequant(v);
    TANDEM_CUDA_CHECK(cudaMemcpy(pool_dev.get(), pool.data(), pool.size(), cudaMemcpyHostToDevice));
  } else if (!fp8) {
    cuda_test::RoundTo<T>(c.pool);
    for (auto& k : c.k) cuda_test::RoundTo<T>(k);
    for (auto& v : c.v) cuda_test::RoundTo<T>(v);
    const std::vector<T> pool = cuda_test::Convert<T>(c.pool);
    TANDEM_CUDA_CHECK(
        cudaMemcpy(pool_dev.get(), pool.data(), pool.size() * sizeof(T), cudaMemcpyHostToDevice));
  } else {
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      k_scale[h] = 0.01f * (1 + h);  // values ~N(0,1): |x| / scale stays well under 448
      v_scale[h] = 0.012f * (1 + h);
    }
    std::vector<__nv_fp8_e4m3> pool(c.pool.size());
    const int64_t row = layout.num_kv_heads * layout.head_dim;
    for (size_t i = 0; i < pool.size(); ++i) {
      const int64_t h = (static_cast<int64_t>(i) % row) / layout.head_dim;
      const bool is_v = (static_cast<int64_t>(i) / layout.TileElems()) % 2 == 1;
      pool[i] = __nv_fp8_e4m3(c.pool[i] / (is_v ? v_scale[h] : k_scale[h]));
    }
    auto dequant = [&](std::vector<float>& x, const std::vector<float>& scale) {
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t h = (static_cast<int64_t>(i) % row) / layout.head_dim;
        x[i] = static_cast<float>(__nv_fp8_e4m3(x[i] / scale[h])) * scale[h];
      }
    };
    for (auto& k : c.k) dequant(k, k_scale);
    for (auto& v : c.v) dequant(v, v_scale);
    TANDEM_CUDA_CHECK(cudaMemcpy(pool_dev.get(), pool.data(), pool.size(), cudaMemcpyHostToDevice));
  }
  DeviceBuffer<float> k_scale_dev(k_scale), v_scale_dev(v_scale), token_scales_dev(token_scales);
  DeviceBuffer<T> q_dev(cuda_test::Convert<T>(c.q));
  const cuda_test::DeviceBatch batch(c);
  const int64_t hq = c.options.num_q_heads, d = c.options.head_dim;
  DeviceBuffer<T> out_dev(std::max<int64_t>(1, c.num_tokens * hq * d));
  DeviceBuffer<float> lse_dev(std::max<int64_t>(1, c.num_tokens * hq));

  PagedAttentionPlanInput in;
  cuda_test::SetPlanShape(c, in);
  in.kv_dtype = kv == Kv::kFp8    ? KvDtype::kFp8E4m3
                : kv == Kv::kInt8 ? KvDtype::kInt8
                                  : (std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16);
  in.forced_splits = forced_splits;
  in.allow_tensor_cores = tensor_cores;
  in.legacy_split_merge = merge == Merge::kLegacy;
  in.workspace_zeroed = merge == Merge::kInKernel;
  in.programmatic_launch = pdl_behind_writer;
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->merge_in_kernel, plan->num_splits > 1 && merge == Merge::kInKernel);
  DeviceBuffer<uint8_t> ws(std::max<int64_t>(1, plan->workspace_bytes));
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.size()));

  DeviceKvCache cache;
  cache.data = pool_dev.get();
  cache.layout = layout;
  cache.dtype = in.kv_dtype;
  cache.k_scale = k_scale_dev.get();
  cache.v_scale = v_scale_dev.get();
  cache.per_head_scale = true;
  cache.token_scales = token_scales_dev.get();
  cudaStream_t stream = nullptr;
  DeviceBuffer<uint8_t> pool_stage(pdl_behind_writer ? pool_dev.size() : 1);
  DeviceBuffer<T> q_stage(pdl_behind_writer ? q_dev.size() : 1);
  if (pdl_behind_writer) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(pool_stage.get(), pool_dev.get(), pool_dev.size(), cudaMemcpyDeviceToDevice));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(q_stage.get(), q_dev.get(), q_dev.size() * sizeof(T), cudaMemcpyDeviceToDevice));
    TANDEM_CUDA_CHECK(cudaMemset(pool_dev.get(), 0xff, pool_dev.size()));
    TANDEM_CUDA_CHECK(cudaMemset(q_dev.get(), 0xff, q_dev.size() * sizeof(T)));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(pdl_test::LaunchDelayedWriter(
        {q_dev.get(), q_stage.get(), q_dev.size() * sizeof(T)},
        {pool_dev.get(), pool_stage.get(), pool_dev.size()}, /*spin_cycles=*/2'000'000, stream));
  }
  const absl::Status status =
      PagedAttention<T>(q_dev.get(), cache, c.options.layer, batch.batch, params, *plan,
                        out_dev.get(), lse_dev.get(), ws.get(), stream);
  ASSERT_TRUE(status.ok()) << status;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  if (stream != nullptr) {
    TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  *result = cuda_test::ReadBack(c, out_dev, lse_dev);
  ExpectMergeCountersZero(ws, *plan);
}

template <typename T>
void CheckCase(std::mt19937& rng, const CaseOptions& options, const std::vector<SeqSpec>& seqs,
               const AttentionParams& params, int forced_splits, Kv kv, const std::string& label,
               bool vary_rows = false) {
  SCOPED_TRACE(label + " kv=" + KvName(kv));
  PagedCase c = MakePagedCase(rng, options, seqs);
  if (vary_rows) {
    VaryRowMagnitudes(c.pool, options.head_dim);
    for (auto& k : c.k) VaryRowMagnitudes(k, options.head_dim);
    for (auto& v : c.v) VaryRowMagnitudes(v, options.head_dim);
  }
  RunResult r;
  RunCase<T>(c, params, forced_splits, kv, /*tensor_cores=*/true, &r);
  if (::testing::Test::HasFatalFailure()) return;
  // RunCase rounded c's inputs (bf16/fp16 rounding is idempotent, so a second run sees the same
  // values); the reference uses the rounded values.
  const attention_test::Reference ref = ReferenceAttention(c, params);
  EXPECT_TRUE(OutClose(r.out, ref.out, OutTol(kv)));
  EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
  // Only head_dim 64/128 have a tensor-core kernel; the others ran on the CUDA-core one already.
  // (fp8/int8: the pool is quantized from c.pool again, which RunCase left unchanged.)
  if (options.head_dim != 64 && options.head_dim != 128) return;
  SCOPED_TRACE("CUDA-core kernel");
  RunCase<T>(c, params, forced_splits, kv, /*tensor_cores=*/false, &r);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(OutClose(r.out, ref.out, OutTol(kv)));
  EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
}

std::vector<SeqSpec> RandomDecodeSeqs(std::mt19937& rng, int n, int64_t max_len, int64_t q_len) {
  std::uniform_int_distribution<int64_t> len(q_len, max_len);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back({len(rng), q_len});
  return seqs;
}

TEST(PagedAttentionCudaTest, DecodeShapesBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const AttentionParams params{.scale = 0.09f};
  for (int64_t d : {64, 128, 256}) {
    for (int64_t bs : {16, 32, 64}) {
      // {q heads, kv heads}: GQA groups 1, 2, 4, 8 and MQA.
      for (auto [hq, hkv] :
           std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {4, 2}, {8, 2}, {16, 2}, {8, 1}}) {
        CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = bs};
        std::vector<SeqSpec> seqs = RandomDecodeSeqs(rng, 4, 700, 1);
        seqs.push_back({1, 1});   // one token of context
        seqs.push_back({bs, 1});  // exactly one block
        seqs.push_back({0, 0});   // padding request
        for (int splits : {1, 3, 0}) {
          CheckCase<__nv_bfloat16>(rng, o, seqs, params, splits, Kv::kOwn,
                                   "d=" + std::to_string(d) + " bs=" + std::to_string(bs) +
                                       " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
                                       " splits=" + std::to_string(splits));
        }
      }
    }
  }
}

TEST(PagedAttentionCudaTest, SpecDecodeWindowSoftcap) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    for (int64_t q_len : {2, 3, 5, 8}) {
      for (int variant = 0; variant < 4; ++variant) {
        AttentionParams params{.scale = 0.1f};
        if (variant & 1) params.window_left = 37;
        if (variant & 2) params.softcap = 5.0f;
        CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
        std::vector<SeqSpec> seqs = RandomDecodeSeqs(rng, 3, 400, q_len);
        seqs.push_back({q_len, q_len});  // no prefix: prefill-like
        for (int splits : {1, 4}) {
          CheckCase<__nv_bfloat16>(rng, o, seqs, params, splits, Kv::kOwn,
                                   "d=" + std::to_string(d) + " q_len=" + std::to_string(q_len) +
                                       " variant=" + std::to_string(variant) +
                                       " splits=" + std::to_string(splits));
        }
      }
    }
  }
}

TEST(PagedAttentionCudaTest, Fp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 32};
    CheckCase<__half>(rng, o, RandomDecodeSeqs(rng, 5, 900, 1), {.scale = 0.088f}, 0, Kv::kOwn,
                      "fp16 d=" + std::to_string(d));
    CheckCase<__half>(rng, o, RandomDecodeSeqs(rng, 3, 300, 4), {.scale = 0.088f}, 2, Kv::kOwn,
                      "fp16 spec d=" + std::to_string(d));
  }
}

TEST(PagedAttentionCudaTest, Fp8PerHeadScale) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    CheckCase<__nv_bfloat16>(rng, o, RandomDecodeSeqs(rng, 5, 900, 1), {.scale = 0.088f}, 0,
                             Kv::kFp8, "fp8 d=" + std::to_string(d));
    CheckCase<__nv_bfloat16>(rng, o, RandomDecodeSeqs(rng, 3, 300, 3), {.scale = 0.088f}, 3,
                             Kv::kFp8, "fp8 spec d=" + std::to_string(d));
  }
  // fp16 activations over an fp8 pool.
  CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  CheckCase<__half>(rng, o, RandomDecodeSeqs(rng, 4, 700, 1), {.scale = 0.088f}, 0, Kv::kFp8,
                    "fp8 fp16-q d=128");
  o.head_dim = 64;
  CheckCase<__half>(rng, o, RandomDecodeSeqs(rng, 3, 300, 3), {.scale = 0.088f}, 2, Kv::kFp8,
                    "fp8 fp16-q spec d=64");
}

// int8 KV (per-token-per-head scales) on both kernels, bf16 and fp16 activations, with row
// magnitudes spread over 2^10 so neighbouring keys have very different scales.
TEST(PagedAttentionCudaTest, Int8PerTokenScales) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {16, 32, 64, 128, 256}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    const std::string ds = " d=" + std::to_string(d);
    std::vector<SeqSpec> seqs = RandomDecodeSeqs(rng, 5, 900, 1);
    seqs.push_back({1, 1});
    seqs.push_back({0, 0});
    CheckCase<__nv_bfloat16>(rng, o, seqs, {.scale = 0.088f}, 0, Kv::kInt8, "bf16" + ds);
    CheckCase<__nv_bfloat16>(rng, o, seqs, {.scale = 0.088f}, 1, Kv::kInt8, "bf16 varied" + ds,
                             /*vary_rows=*/true);
    CheckCase<__half>(rng, o, RandomDecodeSeqs(rng, 3, 500, 1), {.scale = 0.088f}, 3, Kv::kInt8,
                      "fp16 varied" + ds, /*vary_rows=*/true);
    CheckCase<__nv_bfloat16>(rng, o, RandomDecodeSeqs(rng, 3, 300, 4),
                             {.scale = 0.1f, .window_left = 37, .softcap = 5.0f}, 2, Kv::kInt8,
                             "bf16 spec window softcap" + ds);
    o.num_q_heads = 4;
    o.num_kv_heads = 1;  // MQA, prefill-like q_len 64
    CheckCase<__half>(rng, o, {{64, 64}, {200, 64}}, {.scale = 0.2f}, 0, Kv::kInt8,
                      "fp16 MQA q_len 64" + ds);
  }
}

// The golden test models' shapes: head_dim 16 and 32, 4 query heads over 4 / 2 / 1 kv heads,
// block 16, decode, speculative and prefill-like q_len up to 64, bf16 and fp16.
// The tensor-core kernel's two copy paths: page-shuffled copies (block size a power of two and
// at most 32 pages per key tile: 4 / 8 / 16 with 2-byte KV, 8 / 16 with 1-byte KV, and pages
// larger than a tile: 128 / 256) and per-copy table lookups (1, 2, 3, 12, and 4 with 1-byte
// KV), over contexts that end on, before and after page and tile boundaries, split starts that
// are not page-aligned (3 splits; windows of 37 / 100 keys) and q_len 1 and 3.
TEST(PagedAttentionCudaTest, BlockSizesBothCopyPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t bs : {1, 2, 3, 4, 8, 12, 128, 256}) {
    for (Kv kv : {Kv::kOwn, Kv::kFp8, Kv::kInt8}) {
      for (int64_t d : {64, 128}) {
        CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = bs};
        const int64_t q_len = d == 64 ? 3 : 1;
        std::vector<SeqSpec> seqs = RandomDecodeSeqs(rng, 2, 600, q_len);
        for (int64_t len : {bs, bs + 1, 64 * bs - 1, int64_t{129}, int64_t{255}}) {
          seqs.push_back({std::max(len, q_len), q_len});
        }
        AttentionParams params{.scale = 0.09f};
        if (bs == 3 || bs == 8) params.window_left = bs == 3 ? 37 : 100;
        CheckCase<__nv_bfloat16>(rng, o, seqs, params, 3, kv,
                                 "bs=" + std::to_string(bs) + " d=" + std::to_string(d),
                                 /*vary_rows=*/kv == Kv::kInt8);
      }
    }
  }
}

TEST(PagedAttentionCudaTest, SmallHeadDims) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {16, 32}) {
    for (auto [hq, hkv] :
         std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {4, 2}, {4, 1}, {16, 2}}) {
      CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = 16};
      const std::string label =
          "d=" + std::to_string(d) + " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv);
      std::vector<SeqSpec> decode = RandomDecodeSeqs(rng, 4, 600, 1);
      decode.push_back({1, 1});
      decode.push_back({16, 1});
      decode.push_back({0, 0});
      for (int splits : {1, 3, 0}) {
        CheckCase<__nv_bfloat16>(rng, o, decode, {.scale = 0.25f}, splits, Kv::kOwn,
                                 label + " decode splits=" + std::to_string(splits));
      }
      CheckCase<__half>(rng, o, decode, {.scale = 0.25f}, 0, Kv::kOwn, label + " fp16 decode");
      // Prefill-like (no prefix) and extend-like q_len 64, plus speculative q_len 5.
      const std::vector<SeqSpec> multi = {{64, 64}, {100, 64}, {37, 5}, {5, 5}, {300, 17}};
      for (int splits : {1, 2}) {
        CheckCase<__nv_bfloat16>(rng, o, multi, {.scale = 0.25f}, splits, Kv::kOwn,
                                 label + " q_len<=64 splits=" + std::to_string(splits));
        CheckCase<__half>(rng, o, multi, {.scale = 0.25f}, splits, Kv::kOwn,
                          label + " fp16 q_len<=64 splits=" + std::to_string(splits));
      }
      CheckCase<__nv_bfloat16>(rng, o, multi, {.scale = 0.25f, .window_left = 20, .softcap = 8.0f},
                               0, Kv::kOwn, label + " window softcap");
    }
  }
}

TEST(PagedAttentionCudaTest, LongContexts) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 8,
                .num_kv_heads = 2,
                .head_dim = 128,
                .block_size = 16,
                .num_layers = 1,
                .layer = 0};
  // 64k, a long non-multiple of the block size, and short neighbours in one batch.
  const std::vector<SeqSpec> seqs = {{65536, 1}, {40001, 1}, {17, 1}, {16383, 4}};
  CheckCase<__nv_bfloat16>(rng, o, seqs, {.scale = 0.088f}, 0, Kv::kOwn, "long auto splits");
  CheckCase<__nv_bfloat16>(rng, o, seqs, {.scale = 0.088f, .window_left = 4095}, 1, Kv::kOwn,
                           "long window one split");
}

// More splits than a warp has lanes (the merge reads the LSEs 32 splits per step), splits past
// the keys (empty partials drop out), q_len 3 rows, and the pre-issue-35 planner and merge
// (legacy_split_merge, the benchmarks' baseline) on the same cases.
TEST(PagedAttentionCudaTest, ManySplitsAndLegacyMerge) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const AttentionParams params{.scale = 0.09f};
  for (int64_t d : {64, 128}) {
    const std::string label = "d=" + std::to_string(d);
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    const std::vector<SeqSpec> seqs = {{5000, 1}, {2900, 1}, {70, 1}, {0, 0}, {1500, 3}};
    for (int splits : {33, 70, 200}) {
      CheckCase<__nv_bfloat16>(rng, o, seqs, params, splits, Kv::kOwn,
                               label + " splits=" + std::to_string(splits));
    }
    for (int splits : {0, 40}) {
      SCOPED_TRACE(label + " legacy splits=" + std::to_string(splits));
      PagedCase c = MakePagedCase(rng, o, seqs);
      RunResult r;
      RunCase<__nv_bfloat16>(c, params, splits, Kv::kOwn, true, &r, Merge::kLegacy);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      const attention_test::Reference ref = ReferenceAttention(c, params);
      EXPECT_TRUE(OutClose(r.out, ref.out, kOutTol));
      EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
    }
  }
}

TEST(PagedAttentionCudaTest, NanInQueryStaysInItsRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  PagedCase c = MakePagedCase(rng, o, {{100, 1}, {200, 1}});
  c.q[0] = std::numeric_limits<float>::quiet_NaN();  // token 0, head 0 (kv head 0's group)
  for (Merge merge : {Merge::kInKernel, Merge::kSeparate}) {
    for (int splits : {2, 5}) {
      for (bool tc : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "merge " << static_cast<int>(merge) << " splits "
                                          << splits << " tensor cores " << tc);
        RunResult r;
        RunCase<__nv_bfloat16>(c, {.scale = 0.1f}, splits, Kv::kOwn, tc, &r, merge);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        EXPECT_TRUE(std::isnan(r.out[0]));
        EXPECT_TRUE(std::isnan(r.lse[0]));
        for (int64_t h = 1; h < 8; ++h) EXPECT_FALSE(std::isnan(r.lse[h])) << "head " << h;
        for (int64_t h = 0; h < 8; ++h) {
          EXPECT_FALSE(std::isnan(r.lse[8 + h])) << "token 1 head " << h;
        }
        for (size_t i = 128; i < r.out.size(); ++i) ASSERT_FALSE(std::isnan(r.out[i])) << i;
      }
    }
  }
}

// The in-kernel merge against the PDL merge kernel at every split count from 1 to 34 and a few
// beyond (64, 100, 256: more splits than keys, empty partials), on both decode kernels, head_dim
// 16 / 64 / 128, GQA 4 with q_len 1 and 3 (12-row groups) and a padding request: the two merges
// run the same arithmetic in the same order, so out and lse must be bit-identical, and both
// within tolerance of the fp64 reference; the counters are zero after every call (RunCase).
TEST(PagedAttentionCudaTest, InKernelMergeEverySplitCount) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  const AttentionParams params{.scale = 0.09f};
  std::vector<int> split_counts(34);
  std::iota(split_counts.begin(), split_counts.end(), 1);
  for (int s : {64, 100, 256}) split_counts.push_back(s);
  for (auto [d, tc] :
       std::vector<std::pair<int64_t, bool>>{{128, true}, {64, true}, {128, false}, {16, false}}) {
    CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
    PagedCase c = MakePagedCase(rng, o, {{1000, 1}, {37, 1}, {0, 0}, {300, 3}, {129, 1}});
    RunResult first;
    RunCase<__nv_bfloat16>(c, params, 1, Kv::kOwn, tc, &first);  // rounds c's inputs
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    const attention_test::Reference ref = ReferenceAttention(c, params);
    for (int splits : split_counts) {
      SCOPED_TRACE(::testing::Message()
                   << "d=" << d << " tensor cores " << tc << " splits " << splits);
      RunResult in_kernel, separate;
      RunCase<__nv_bfloat16>(c, params, splits, Kv::kOwn, tc, &in_kernel, Merge::kInKernel);
      RunCase<__nv_bfloat16>(c, params, splits, Kv::kOwn, tc, &separate, Merge::kSeparate);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ASSERT_EQ(in_kernel.out.size(), separate.out.size());
      EXPECT_EQ(std::memcmp(in_kernel.out.data(), separate.out.data(), in_kernel.out.size() * 4),
                0);
      EXPECT_EQ(std::memcmp(in_kernel.lse.data(), separate.lse.data(), in_kernel.lse.size() * 4),
                0);
      EXPECT_TRUE(OutClose(in_kernel.out, ref.out, kOutTol));
      EXPECT_TRUE(LseClose(in_kernel.lse, ref.lse, kLseTol));
    }
  }
}

// The grid depends only on the plan: a graph captured once replays correctly after the batch
// metadata, q and the pool change in place (new lengths within the plan's bounds), with either
// merge (in-kernel: the replays find the counters the previous one reset).
// PagedAttentionPlanInput::programmatic_launch: the decode kernel may start while its
// predecessor runs and must read q and the pool only after griddepcontrol.wait. Behind a writer
// that lets it start at once and fills q and the pool ~1 ms later, every split count and merge,
// both kernels and every KV dtype still give the reference's result (a read before the wait
// would see NaN bytes).
TEST(PagedAttentionCudaTest, PdlLaunchReadsQAndPoolAfterTheWait) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions options;
  options.num_q_heads = 32;
  options.num_kv_heads = 8;
  options.head_dim = 128;
  options.block_size = 16;
  const AttentionParams params{.scale = 0.09f};
  for (const Kv kv : {Kv::kOwn, Kv::kFp8, Kv::kInt8}) {
    for (const bool tc : {true, false}) {
      for (const auto& [splits, merge] :
           {std::pair{0, Merge::kInKernel}, std::pair{5, Merge::kInKernel},
            std::pair{5, Merge::kSeparate}, std::pair{1, Merge::kSeparate}}) {
        SCOPED_TRACE(std::string("kv=") + KvName(kv) + " tc=" + (tc ? "1" : "0") +
                     " splits=" + std::to_string(splits) +
                     " merge=" + (merge == Merge::kInKernel ? "kernel" : "separate"));
        PagedCase c = MakePagedCase(rng, options, {{1000, 1}, {37, 1}, {513, 2}});
        RunResult r;
        RunCase<__nv_bfloat16>(c, params, splits, kv, tc, &r, merge, /*pdl_behind_writer=*/true);
        if (::testing::Test::HasFatalFailure()) return;
        const attention_test::Reference ref = ReferenceAttention(c, params);
        EXPECT_TRUE(OutClose(r.out, ref.out, OutTol(kv)));
        EXPECT_TRUE(LseClose(r.lse, ref.lse, kLseTol));
      }
    }
  }
}

class CudaGraphReplay : public ::testing::TestWithParam<bool> {};

TEST_P(CudaGraphReplay, WithNewBatch) {
  TANDEM_SKIP_WITHOUT_GPU();
  const bool in_kernel = GetParam();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  PagedCase cases[2] = {MakePagedCase(rng, o, {{1000, 1}, {37, 1}, {512, 1}, {1, 1}}),
                        MakePagedCase(rng, o, {{900, 1}, {600, 1}, {5, 1}, {2048, 1}})};
  int64_t width = 0, pool_elems = 0;
  for (PagedCase& c : cases) {
    cuda_test::RoundTo<__nv_bfloat16>(c.q);
    cuda_test::RoundTo<__nv_bfloat16>(c.pool);
    for (auto& k : c.k) cuda_test::RoundTo<__nv_bfloat16>(k);
    for (auto& v : c.v) cuda_test::RoundTo<__nv_bfloat16>(v);
    width = std::max(width, c.max_blocks_per_seq);
    pool_elems = std::max(pool_elems, c.layout.TotalElems());
  }
  DeviceBuffer<__nv_bfloat16> pool(pool_elems), q(4 * 32 * 128), out(4 * 32 * 128);
  DeviceBuffer<float> lse(4 * 32);
  DeviceBuffer<int32_t> qsl(5), lens(4), tables(4 * width);
  KvCacheLayout layout = cases[0].layout;
  layout.num_blocks = pool_elems / layout.BlockElems();
  auto upload = [&](const PagedCase& c) {
    std::vector<int32_t> t(4 * width, -1);
    for (int s = 0; s < 4; ++s) {
      std::copy_n(c.block_tables.begin() + s * c.max_blocks_per_seq, c.max_blocks_per_seq,
                  t.begin() + s * width);
    }
    const auto pool_h = cuda_test::Convert<__nv_bfloat16>(c.pool);
    const auto q_h = cuda_test::Convert<__nv_bfloat16>(c.q);
    cudaMemcpy(pool.get(), pool_h.data(), pool_h.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(q.get(), q_h.data(), q_h.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(qsl.get(), c.query_start_loc.data(), 5 * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(lens.get(), c.seq_lens.data(), 4 * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(tables.get(), t.data(), t.size() * 4, cudaMemcpyHostToDevice);
  };
  PagedAttentionPlanInput in{.num_seqs = 4,
                             .num_tokens = 4,
                             .max_q_len = 1,
                             .max_seq_len = 2048,
                             .num_q_heads = 32,
                             .num_kv_heads = 8,
                             .head_dim = 128,
                             .workspace_zeroed = in_kernel};
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->num_splits, 1);
  EXPECT_EQ(plan->merge_in_kernel, in_kernel);
  DeviceBuffer<uint8_t> ws(std::max<int64_t>(1, plan->workspace_bytes));
  TANDEM_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.size()));
  const DeviceKvCache cache{.data = pool.get(), .layout = layout, .dtype = KvDtype::kBf16};
  const AttentionBatch batch{.query_start_loc = qsl.get(),
                             .seq_lens = lens.get(),
                             .block_tables = tables.get(),
                             .num_seqs = 4,
                             .max_blocks_per_seq = width};
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreate(&stream));
  upload(cases[0]);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const absl::Status status =
      PagedAttention<__nv_bfloat16>(q.get(), cache, o.layer, batch, {.scale = 0.0884f}, *plan,
                                    out.get(), lse.get(), ws.get(), stream);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(status.ok()) << status;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const attention_test::Reference refs[2] = {ReferenceAttention(cases[0], {.scale = 0.0884f}),
                                             ReferenceAttention(cases[1], {.scale = 0.0884f})};
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    upload(cases[step % 2]);
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(OutClose(cuda_test::ToFloat(out.ToHost()), refs[step % 2].out, kOutTol));
    EXPECT_TRUE(LseClose(lse.ToHost(), refs[step % 2].lse, kLseTol));
    ExpectMergeCountersZero(ws, *plan);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(PagedAttentionCudaTest, CudaGraphReplay, ::testing::Bool());

}  // namespace
}  // namespace tandem::kernels::cuda
