// Decode context parallelism on CUDA: cuda::PagedAttention on one KV shard (global query
// positions, local keys) against the fp64 reference restricted to the shard's keys, the N-way
// merge against cpu::MergeAttnStatesN, the exchange pack against the documented byte layout, and
// the whole per-layer path (shard attention on every rank -> pack -> all-to-all by device copies
// -> unpack + merge) against fp64 unsharded attention. Inputs are rounded to the kernel's dtype
// first, so only the kernels' own arithmetic is measured; tolerances as paged_attention_cuda_test
// (out 1e-2 x max|ref|: bf16/fp16 output rounding; lse 2e-3 x max(1, |ref|)).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/attention_cuda_test_util.h"
#include "kernels/attention/cuda/dcp_exchange_cuda.h"
#include "kernels/attention/cuda/merge_attn_states_cuda.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/attention/cuda/paged_prefill_cuda.h"
#include "kernels/attention/dcp_exchange.h"
#include "kernels/attention/merge_attn_states.h"
#include "kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using attention_test::CaseOptions;
using attention_test::LseClose;
using attention_test::MakeDcpShardCase;
using attention_test::MakePagedCase;
using attention_test::OutClose;
using attention_test::PagedCase;
using attention_test::RandomNormal;
using attention_test::Reference;
using attention_test::ReferenceAttention;
using attention_test::SeqSpec;
using attention_test::TestSeed;
using cuda_test::DeviceBuffer;

constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 2e-3;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

AttentionParams WithDcp(AttentionParams params, int64_t size, int64_t rank, int64_t interleave) {
  params.dcp_size = size;
  params.dcp_rank = rank;
  params.dcp_interleave = interleave;
  return params;
}

// RoundCase: shard cases made from a rounded case, and the reference, see exactly the kernel's
// inputs.
using cuda_test::RoundCase;

// cuda::PagedAttention's result on the device, and its host copy as float.
template <typename T>
struct AttnOutput {
  AttnOutput(int64_t rows, int64_t head_dim)
      : out(std::max<int64_t>(1, rows * head_dim)), lse(std::max<int64_t>(1, rows)) {}
  DeviceBuffer<T> out;
  DeviceBuffer<float> lse;
  std::vector<float> out_host, lse_host;
};

// Runs cuda::PagedAttention on c (a DCP shard case when params.dcp_size > 1).
template <typename T>
void RunAttention(const PagedCase& c, const AttentionParams& params, int forced_splits,
                  bool tensor_cores, AttnOutput<T>* r) {
  DeviceBuffer<T> pool(cuda_test::Convert<T>(c.pool)), q(cuda_test::Convert<T>(c.q));
  const cuda_test::DeviceBatch batch(c);
  PagedAttentionPlanInput in;
  cuda_test::SetPlanShape(c, in);  // only the keys this rank reads size the splits
  in.kv_dtype = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  in.forced_splits = forced_splits;
  in.allow_tensor_cores = tensor_cores;
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<uint8_t> ws(std::max<int64_t>(1, plan->workspace_bytes));
  DeviceKvCache cache;
  cache.data = pool.get();
  cache.layout = c.layout;
  cache.dtype = in.kv_dtype;
  const absl::Status status =
      PagedAttention<T>(q.get(), cache, c.options.layer, batch.batch, params, *plan, r->out.get(),
                        r->lse.get(), ws.get(), nullptr);
  ASSERT_TRUE(status.ok()) << status;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  cuda_test::AttentionOutput host = cuda_test::ReadBack(c, r->out, r->lse);
  r->out_host = std::move(host.out);
  r->lse_host = std::move(host.lse);
}

// Every rank's shard of `global` (already rounded to T) against the reference over that shard,
// on the tensor-core kernel (head_dim 64/128) and the CUDA-core one, for each split count.
template <typename T>
void CheckShards(std::mt19937& rng, const PagedCase& global, int64_t dcp_size, int64_t interleave,
                 const AttentionParams& base, const std::vector<int>& splits,
                 const std::string& label) {
  const int64_t rows = global.num_tokens * global.options.num_q_heads;
  for (int64_t rank = 0; rank < dcp_size; ++rank) {
    SCOPED_TRACE(label + " dcp=" + std::to_string(dcp_size) + " rank=" + std::to_string(rank) +
                 " interleave=" + std::to_string(interleave));
    const PagedCase shard = MakeDcpShardCase(rng, global, {dcp_size, rank, interleave});
    const AttentionParams params = WithDcp(base, dcp_size, rank, interleave);
    const Reference ref = ReferenceAttention(shard, params);
    const int64_t d = global.options.head_dim;
    for (bool tc : {true, false}) {
      if (!tc && d != 64 && d != 128) continue;  // d16/32/256 have only the CUDA-core kernel
      for (int s : splits) {
        SCOPED_TRACE(std::string(tc ? "tensor cores" : "CUDA cores") +
                     " splits=" + std::to_string(s));
        AttnOutput<T> r(rows, d);
        RunAttention<T>(shard, params, s, tc, &r);
        if (::testing::Test::HasFatalFailure()) return;
        EXPECT_TRUE(OutClose(r.out_host, ref.out, kOutTol));
        EXPECT_TRUE(LseClose(r.lse_host, ref.lse, kLseTol));
      }
    }
  }
}

std::vector<SeqSpec> DecodeSeqs(std::mt19937& rng, int64_t block_size) {
  std::uniform_int_distribution<int64_t> len(1, 700);
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back({len(rng), 1});
  seqs.push_back({1, 1});           // one token: every other shard empty
  seqs.push_back({3, 1});           // shorter than a block
  seqs.push_back({block_size, 1});  // exactly one block
  seqs.push_back({0, 0});           // padding request
  return seqs;
}

TEST(DcpAttentionCudaTest, DecodeShardsBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    for (int64_t bs : {16, 32}) {
      // Block size 32 with a window: then even decode depends on the local <-> global mapping.
      const AttentionParams params{.scale = 0.09f, .window_left = bs == 32 ? 100 : -1};
      for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {32, 8}, {8, 1}}) {
        CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = bs};
        PagedCase global = MakePagedCase(rng, o, DecodeSeqs(rng, bs));
        RoundCase<__nv_bfloat16>(global);
        for (int64_t dcp_size : {2, 4}) {
          for (int64_t interleave : {int64_t{1}, bs}) {
            CheckShards<__nv_bfloat16>(rng, global, dcp_size, interleave, params, {1, 3, 0},
                                       "d=" + std::to_string(d) + " bs=" + std::to_string(bs) +
                                           " hq=" + std::to_string(hq) +
                                           " hkv=" + std::to_string(hkv));
          }
        }
      }
    }
  }
}

// Speculative verification and a prefill chunk run on a DCP group: q_len > 1, causal by global
// position, with windows and soft-cap.
TEST(DcpAttentionCudaTest, MultiTokenShardsBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t d : {64, 128, 256}) {
    for (int64_t q_len : {2, 5, 40}) {
      for (int variant = 0; variant < 3; ++variant) {
        AttentionParams params{.scale = 0.1f};
        if (variant == 1) params.window_left = 37;
        if (variant == 2) params.softcap = 5.0f;
        CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = d, .block_size = 16};
        std::uniform_int_distribution<int64_t> len(q_len, 400);
        std::vector<SeqSpec> seqs = {{len(rng), q_len}, {len(rng), q_len}, {q_len, q_len}};
        PagedCase global = MakePagedCase(rng, o, seqs);
        RoundCase<__nv_bfloat16>(global);
        for (int64_t dcp_size : {2, 4}) {
          CheckShards<__nv_bfloat16>(rng, global, dcp_size, dcp_size == 2 ? 1 : 16, params, {1, 4},
                                     "d=" + std::to_string(d) + " q_len=" + std::to_string(q_len) +
                                         " variant=" + std::to_string(variant));
        }
      }
    }
  }
}

TEST(DcpAttentionCudaTest, DecodeShardsFp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  PagedCase global = MakePagedCase(rng, o, DecodeSeqs(rng, 16));
  RoundCase<__half>(global);
  CheckShards<__half>(rng, global, 4, 16, {.scale = 0.09f}, {1, 0}, "fp16");
}

// dcp_size 1 is the ordinary path: bitwise the same output whatever rank/interleave hold.
TEST(DcpAttentionCudaTest, SizeOneIsTheOrdinaryPath) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  PagedCase c = MakePagedCase(rng, o, DecodeSeqs(rng, 16));
  RoundCase<__nv_bfloat16>(c);
  const int64_t rows = c.num_tokens * 8;
  AttnOutput<__nv_bfloat16> a(rows, 128), b(rows, 128);
  RunAttention<__nv_bfloat16>(c, {.scale = 0.09f}, 0, true, &a);
  RunAttention<__nv_bfloat16>(c, WithDcp({.scale = 0.09f}, 1, 0, 7), 0, true, &b);
  EXPECT_TRUE(a.out_host == b.out_host);
  EXPECT_TRUE(a.lse_host == b.lse_host);
}

// cuda::MergeAttnStatesN (TOut = T) or MergeF32AttnStatesN (T = float, TOut 16-bit) vs
// cpu::MergeAttnStatesN on the same (rounded) partials, strided, with empty partials (lse -inf /
// NaN / +inf over NaN out) and all-empty rows.
template <typename T, typename TOut = T>
void CheckMergeN(std::mt19937& rng, int64_t parts, int64_t tokens, int64_t heads, int64_t dim) {
  SCOPED_TRACE(::testing::Message()
               << parts << " partials, " << tokens << "x" << heads << "x" << dim);
  const int64_t rows = tokens * heads;
  const int64_t out_stride = rows * dim + 16 / sizeof(T) * 3, lse_stride = rows + 7;
  std::vector<float> outs(parts * out_stride, kNaN), lses(parts * lse_stride, kNaN);
  for (int64_t i = 0; i < parts; ++i) {
    std::vector<float> o = RandomNormal(rng, rows * dim, 1.0f);
    cuda_test::RoundTo<T>(o);
    const std::vector<float> l = RandomNormal(rng, rows, 4.0f);
    std::copy(o.begin(), o.end(), outs.begin() + i * out_stride);
    std::copy(l.begin(), l.end(), lses.begin() + i * lse_stride);
  }
  const float empties[] = {-kInf, kNaN, kInf};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < parts; ++i) {
      if (r % 5 != 0 && rng() % 3 != 0) continue;  // every 5th row: all empty
      lses[i * lse_stride + r] = empties[rng() % 3];
      outs[i * out_stride + r * dim] = kNaN;
    }
  }
  std::vector<float> want_o(rows * dim), want_l(rows);
  cpu::MergeAttnStatesN({outs.data(), out_stride, lses.data(), lse_stride, parts}, tokens, heads,
                        dim, want_o.data(), want_l.data());
  DeviceBuffer<T> outs_d(cuda_test::Convert<T>(outs));
  DeviceBuffer<TOut> o_d(rows * dim);
  DeviceBuffer<float> lses_d(lses), l_d(rows);
  const AttnPartials<T> view{outs_d.get(), out_stride, lses_d.get(), lse_stride, parts};
  absl::Status s;
  if constexpr (std::is_same_v<T, TOut>) {
    s = MergeAttnStatesN<T>(view, tokens, heads, dim, o_d.get(), l_d.get(), nullptr);
  } else {
    s = MergeF32AttnStatesN<TOut>(view, tokens, heads, dim, o_d.get(), l_d.get(), nullptr);
  }
  ASSERT_TRUE(s.ok()) << s;
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got_o = cuda_test::ToFloat(o_d.ToHost());
  const std::vector<float> got_l = l_d.ToHost();
  EXPECT_TRUE(LseClose(got_l, std::vector<double>(want_l.begin(), want_l.end()), 1e-5));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) {
      const float w = want_o[r * dim + j], g = got_o[r * dim + j];
      // fp32 math on both sides, then one rounding to TOut: within 2^-8 relative (+ a floor).
      ASSERT_LE(std::abs(g - w), std::abs(w) * 0x1p-8f + 1e-6f) << "row " << r << " dim " << j;
    }
  }
}

TEST(DcpMergeCudaTest, MergeNMatchesCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t parts : {1, 2, 3, 4, 8}) {
    CheckMergeN<__nv_bfloat16>(rng, parts, 5, 8, 128);
    CheckMergeN<__half>(rng, parts, 3, 4, 64);
    CheckMergeN<float>(rng, parts, 2, 3, 4);
  }
  CheckMergeN<__nv_bfloat16>(rng, 4, 300, 8, 256);  // more rows than one block
}

// More than 8 partials (split-KV's merges), or partials x ceil(row vectors / 32) > 8 over <= 256
// rows, take the CTA-per-row-slice kernel: interleaved thread groups (float rows of 512 = 4
// slices of 32 vectors: 8 groups; bf16 rows of 128 = 16 vectors: 16 groups; fp16 rows of 768 =
// 3 slices), a short last slice (float rows of 2056 = 514 vectors: 16 slices + 2 vectors), a
// slice of 1 vector, and hundreds of partials; and fp32 partials merged straight into bf16 /
// fp16 (MergeF32AttnStatesN, the MLA split merge) on both kernels (2 partials of 512 over 16
// rows: 8 loads a lane, and 4 over 300 rows: the warp kernel; 3 over 16 rows: CTAs).
TEST(DcpMergeCudaTest, ManyPartialsMatchCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t parts : {9, 16, 64, 200}) {
    CheckMergeN<float>(rng, parts, 1, 8, 512);
    CheckMergeN<__nv_bfloat16>(rng, parts, 2, 5, 128);
    CheckMergeN<__half>(rng, parts, 1, 3, 768);
  }
  CheckMergeN<float>(rng, 33, 1, 2, 2056);
  CheckMergeN<float>(rng, 256, 3, 4, 4);
  CheckMergeN<float>(rng, 12, 1100, 1, 8);
  for (int64_t parts : {2, 3, 9, 64}) {
    CheckMergeN<float, __nv_bfloat16>(rng, parts, 1, 16, 512);
    CheckMergeN<float, __half>(rng, parts, 2, 3, 64);
  }
  CheckMergeN<float, __nv_bfloat16>(rng, 4, 3, 100, 512);
}

// The CUDA pack writes every value where the layout comment says and nothing else.
TEST(DcpExchangeCudaTest, PackMatchesDocumentedLayout) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (int64_t dcp_size : {1, 2, 4, 8}) {
    const DcpExchangeLayout layout{.num_tokens = 7,
                                   .num_heads = 4 * dcp_size,
                                   .head_dim = 24,
                                   .dcp_size = dcp_size,
                                   .elem_bytes = 2};
    const int64_t h = layout.num_heads, d = layout.head_dim, hpr = layout.HeadsPerRank();
    const std::vector<__nv_bfloat16> out =
        cuda_test::Convert<__nv_bfloat16>(RandomNormal(rng, 7 * h * d, 1.0f));
    const std::vector<float> lse = RandomNormal(rng, 7 * h, 4.0f);
    DeviceBuffer<__nv_bfloat16> out_d(out);
    DeviceBuffer<float> lse_d(lse);
    DeviceBuffer<uint8_t> send_d(layout.BufferBytes());
    TANDEM_CUDA_CHECK(cudaMemset(send_d.get(), 0xAB, layout.BufferBytes()));
    const absl::Status s =
        DcpPackForExchange<__nv_bfloat16>(out_d.get(), lse_d.get(), layout, send_d.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> send = send_d.ToHost();
    std::vector<bool> written(send.size(), false);
    for (int64_t j = 0; j < dcp_size; ++j) {
      const int64_t region = j * layout.RegionBytes();
      for (int64_t t = 0; t < 7; ++t) {
        for (int64_t hh = 0; hh < hpr; ++hh) {
          const int64_t src = t * h + j * hpr + hh;
          const int64_t o = region + (t * hpr + hh) * d * 2;
          ASSERT_EQ(std::memcmp(&send[o], &out[src * d], d * 2), 0) << j << " " << t << " " << hh;
          const int64_t l = region + layout.LseOffset() + (t * hpr + hh) * 4;
          ASSERT_EQ(std::memcmp(&send[l], &lse[src], 4), 0) << j << " " << t << " " << hh;
          std::fill(written.begin() + o, written.begin() + o + d * 2, true);
          std::fill(written.begin() + l, written.begin() + l + 4, true);
        }
      }
    }
    for (size_t b = 0; b < send.size(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(send[b], 0xAB) << "padding byte " << b << " written";
      }
    }
  }
}

// One layer on a simulated DCP group (TP_A = 1): shard attention on every rank, pack, the
// all-to-all as device copies (region j of rank k -> region k of rank j), unpack + merge; the
// heads put back together must equal fp64 unsharded attention.
template <typename T>
void CheckPipeline(std::mt19937& rng, PagedCase& global, int64_t dcp_size, int64_t interleave,
                   const AttentionParams& params) {
  SCOPED_TRACE(::testing::Message() << "dcp " << dcp_size << " interleave " << interleave
                                    << " window " << params.window_left);
  const int64_t hq = global.options.num_q_heads, d = global.options.head_dim;
  const int64_t tokens = global.num_tokens, hpr = hq / dcp_size;
  const DcpExchangeLayout layout{.num_tokens = tokens,
                                 .num_heads = hq,
                                 .head_dim = d,
                                 .dcp_size = dcp_size,
                                 .elem_bytes = sizeof(T)};
  std::vector<DeviceBuffer<uint8_t>> send, recv;
  for (int64_t k = 0; k < dcp_size; ++k) {
    send.emplace_back(layout.BufferBytes());
    recv.emplace_back(layout.BufferBytes());
    const PagedCase shard = MakeDcpShardCase(rng, global, {dcp_size, k, interleave});
    AttnOutput<T> r(tokens * hq, d);
    RunAttention<T>(shard, WithDcp(params, dcp_size, k, interleave), 0, true, &r);
    if (::testing::Test::HasFatalFailure()) return;
    const absl::Status s =
        DcpPackForExchange<T>(r.out.get(), r.lse.get(), layout, send[k].get(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());  // r is freed at the end of the iteration
  }
  for (int64_t j = 0; j < dcp_size; ++j) {
    for (int64_t k = 0; k < dcp_size; ++k) {
      TANDEM_CUDA_CHECK(cudaMemcpy(recv[j].get() + k * layout.RegionBytes(),
                                   send[k].get() + j * layout.RegionBytes(), layout.RegionBytes(),
                                   cudaMemcpyDeviceToDevice));
    }
  }
  std::vector<float> out(tokens * hq * d), lse(tokens * hq);
  for (int64_t j = 0; j < dcp_size; ++j) {
    DeviceBuffer<T> o_d(tokens * hpr * d);
    DeviceBuffer<float> l_d(tokens * hpr);
    const absl::Status s =
        DcpMergeReceived<T>(recv[j].get(), layout, o_d.get(), l_d.get(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> o = cuda_test::ToFloat(o_d.ToHost());
    const std::vector<float> l = l_d.ToHost();
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy_n(o.begin() + t * hpr * d, hpr * d, out.begin() + (t * hq + j * hpr) * d);
      std::copy_n(l.begin() + t * hpr, hpr, lse.begin() + t * hq + j * hpr);
    }
  }
  const Reference ref = ReferenceAttention(global, params);
  EXPECT_TRUE(OutClose(out, ref.out, kOutTol));
  EXPECT_TRUE(LseClose(lse, ref.lse, kLseTol));
}

TEST(DcpPipelineCudaTest, ShardedLayerEqualsUnshardedAttention) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  for (auto [hq, hkv, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 8, 128}, {8, 2, 64}, {16, 2, 256}}) {
    CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = 16};
    std::vector<SeqSpec> seqs = DecodeSeqs(rng, 16);
    seqs.push_back({300, 4});  // speculative verification
    seqs.push_back({48, 48});  // a prefill chunk
    PagedCase global = MakePagedCase(rng, o, seqs);
    RoundCase<__nv_bfloat16>(global);
    for (int64_t dcp_size : {2, 4}) {
      for (int64_t interleave : {1, 16}) {
        for (const AttentionParams& params : {AttentionParams{.scale = 0.09f},
                                              AttentionParams{.scale = 0.09f, .window_left = 50}}) {
          CheckPipeline<__nv_bfloat16>(rng, global, dcp_size, interleave, params);
        }
      }
    }
  }
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  PagedCase global = MakePagedCase(rng, o, DecodeSeqs(rng, 16));
  RoundCase<__half>(global);
  CheckPipeline<__half>(rng, global, 8, 16, {.scale = 0.09f});
}

// Argument checks happen before any launch, so fake device pointers suffice.
TEST(DcpAttentionCudaTest, RejectsBadArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto* fake = reinterpret_cast<__nv_bfloat16*>(uintptr_t{1} << 20);
  const int32_t* fake_i = reinterpret_cast<const int32_t*>(uintptr_t{1} << 20);
  const KvCacheLayout layout{
      .num_blocks = 4, .num_layers = 2, .block_size = 16, .num_kv_heads = 2, .head_dim = 64};
  const DeviceKvCache cache{.data = fake, .layout = layout};
  AttentionBatch batch{.query_start_loc = fake_i,
                       .seq_lens = fake_i,
                       .block_tables = fake_i,
                       .num_seqs = 1,
                       .max_blocks_per_seq = 1,
                       .local_seq_lens = fake_i};
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(
      {.num_seqs = 1, .num_tokens = 1, .num_q_heads = 8, .num_kv_heads = 2, .head_dim = 64});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto call = [&](const AttentionBatch& b, const AttentionParams& params) {
    return PagedAttention<__nv_bfloat16>(fake, cache, 0, b, params, *plan, fake, nullptr, nullptr,
                                         nullptr)
        .code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const AttentionParams base{.scale = 0.1f};
  EXPECT_EQ(call(batch, WithDcp(base, 0, 0, 16)), kInvalid);
  EXPECT_EQ(call(batch, WithDcp(base, 2, 2, 16)), kInvalid);
  EXPECT_EQ(call(batch, WithDcp(base, 2, -1, 16)), kInvalid);
  EXPECT_EQ(call(batch, WithDcp(base, 2, 0, 0)), kInvalid);
  AttentionBatch no_local = batch;
  no_local.local_seq_lens = nullptr;
  EXPECT_EQ(call(no_local, WithDcp(base, 2, 0, 16)), kInvalid);

  absl::StatusOr<PagedPrefillPlan> prefill = PlanPagedPrefill(
      {.num_seqs = 1, .num_tokens = 1, .num_q_heads = 8, .num_kv_heads = 2, .head_dim = 64});
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(PagedPrefillAttention<__nv_bfloat16>(fake, cache, 0, batch, WithDcp(base, 2, 0, 16),
                                                 *prefill, fake, nullptr, nullptr, nullptr)
                .code(),
            kInvalid);

  const DcpExchangeLayout xl{
      .num_tokens = 2, .num_heads = 8, .head_dim = 64, .dcp_size = 4, .elem_bytes = 2};
  auto* fake_f = reinterpret_cast<float*>(uintptr_t{1} << 20);
  void* fake_v = reinterpret_cast<void*>(uintptr_t{1} << 20);
  EXPECT_EQ(DcpPackForExchange<__half>(
                reinterpret_cast<const __half*>(fake), fake_f,
                {.num_tokens = 2, .num_heads = 8, .head_dim = 64, .dcp_size = 4, .elem_bytes = 4},
                fake_v, nullptr)
                .code(),
            kInvalid);  // elem_bytes != sizeof(T)
  EXPECT_EQ(DcpPackForExchange<__nv_bfloat16>(fake + 1, fake_f, xl, fake_v, nullptr).code(),
            kInvalid);  // unaligned out
  EXPECT_EQ(DcpPackForExchange<__nv_bfloat16>(fake, nullptr, xl, fake_v, nullptr).code(), kInvalid);
  DcpExchangeLayout odd = xl;
  odd.head_dim = 12;  // 24 bytes per row
  EXPECT_EQ(DcpMergeReceived<__nv_bfloat16>(fake_v, odd, fake, fake_f, nullptr).code(), kInvalid);
  EXPECT_EQ(
      MergeAttnStatesN<__nv_bfloat16>({fake, 68, fake_f, 2, 2}, 1, 2, 64, fake, fake_f, nullptr)
          .code(),
      kInvalid);  // out_stride not a multiple of 8 elements
}

}  // namespace
}  // namespace tandem::kernels::cuda
