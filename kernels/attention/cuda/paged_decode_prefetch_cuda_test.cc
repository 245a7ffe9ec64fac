// The tensor-core decode kernel's non-default modes (decode_phase_stamps.h): the L2 KV prefetch
// before griddepcontrol.wait (PagedAttentionPlanInput::l2_prefetch_kv), the actual split's
// block-table entries loaded before it (early_block_table) and the phase stamps (phase_stamps)
// must leave out and lse bit-identical to the default kernel, which matches the
// fp64 reference (attention_test_util). Llama-3-8B heads (32 q / 8 kv, head_dim 128), bf16 KV,
// block 16, batch 1, q_len 1; contexts ending mid-page and on a page boundary; 1 split and the
// planner's, planned for the context or (as the runtime's graphs) for 8192 keys. Each run is a PDL
// chain as in a decode step: a predecessor (pdl_test's delayed writer) lets the attention launch at
// once and writes the newest token's K and V rows (NaN bytes until then) only ~1 ms later, eagerly
// and captured in a CUDA graph.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/attention_cuda_test_util.h"
#include "kernels/attention/cuda/decode_phase_stamps.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/pdl_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using attention_test::CaseOptions;
using attention_test::PagedCase;
using cuda_test::DeviceBuffer;
using T = __nv_bfloat16;

// (Non-fatal: the harness below returns values and runs in a constructor.)
#define EXPECT_CUDA_OK(x) EXPECT_EQ((x), cudaSuccess) << #x

struct Output {
  std::vector<uint16_t> out;  // raw bf16 bits
  std::vector<float> lse;
};

bool BitEqual(const Output& a, const Output& b) {
  return a.out == b.out && a.lse.size() == b.lse.size() &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

// One PDL chain on the device: the pool with the newest token's K/V rows (every kv head) as NaN
// bytes, their right bytes staged, and the attention's buffers.
class Chain {
 public:
  explicit Chain(PagedCase& c) : c_(c), batch_(c) {
    cuda_test::RoundCase<T>(c);
    const std::vector<T> pool = cuda_test::Convert<T>(c.pool);
    pool_.emplace(pool);
    q_.emplace(cuda_test::Convert<T>(c.q));
    const KvCacheLayout& l = c.layout;
    const int64_t pos = c.seqs[0].seq_len - 1;  // the newest token
    const int64_t block = c.block_tables[pos / l.block_size];
    const int64_t row = (pos % l.block_size) * l.num_kv_heads * l.head_dim;
    row_elems_ = l.num_kv_heads * l.head_dim;
    k_off_ = l.TileOffset(block, c.options.layer, 0) + row;
    v_off_ = l.TileOffset(block, c.options.layer, 1) + row;
    k_stage_.emplace(std::vector<T>(pool.begin() + k_off_, pool.begin() + k_off_ + row_elems_));
    v_stage_.emplace(std::vector<T>(pool.begin() + v_off_, pool.begin() + v_off_ + row_elems_));
    const int64_t rows = c.num_tokens * c.options.num_q_heads;
    out_.emplace(rows * c.options.head_dim);
    lse_.emplace(rows);
    EXPECT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Chain() { cudaStreamDestroy(stream_); }

  // Runs writer -> attention (PDL) eagerly or as a graph; returns out / lse. stamps: a zeroed
  // buffer for phase stamps, or null.
  // mode: bit 1 l2_prefetch_kv, bit 2 early_block_table. plan_keys: the plan's max_seq_len
  // bound when larger than the context.
  Output Run(int forced_splits, int64_t plan_keys, int mode, unsigned long long* stamps, bool graph,
             PagedAttentionPlan* plan_out = nullptr) {
    PagedAttentionPlanInput in;
    cuda_test::SetPlanShape(c_, in);
    in.max_seq_len = std::max(in.max_seq_len, plan_keys);
    in.kv_dtype = KvDtype::kBf16;
    in.forced_splits = forced_splits;
    in.workspace_zeroed = true;
    in.programmatic_launch = true;
    in.l2_prefetch_kv = (mode & 1) != 0;
    in.early_block_table = (mode & 2) != 0;
    in.phase_stamps = stamps;
    absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return {};
    EXPECT_TRUE(plan->use_tensor_cores);
    if (plan_out != nullptr) *plan_out = *plan;
    DeviceBuffer<uint8_t> ws(std::max<int64_t>(1, plan->workspace_bytes));
    EXPECT_CUDA_OK(cudaMemset(ws.get(), 0, ws.size()));
    // The newest token's rows: NaN bytes until the writer lands them.
    EXPECT_CUDA_OK(cudaMemset(pool_->get() + k_off_, 0xff, row_elems_ * sizeof(T)));
    EXPECT_CUDA_OK(cudaMemset(pool_->get() + v_off_, 0xff, row_elems_ * sizeof(T)));
    EXPECT_CUDA_OK(cudaMemset(out_->get(), 0, out_->size() * sizeof(T)));
    EXPECT_CUDA_OK(cudaMemset(lse_->get(), 0, lse_->size() * 4));
    EXPECT_CUDA_OK(cudaDeviceSynchronize());
    DeviceKvCache cache;
    cache.data = pool_->get();
    cache.layout = c_.layout;
    cache.dtype = KvDtype::kBf16;
    const AttentionParams params{.scale = 0.0884f};
    auto enqueue = [&]() {
      EXPECT_CUDA_OK(pdl_test::LaunchDelayedWriter(
          {pool_->get() + k_off_, k_stage_->get(), row_elems_ * sizeof(T)},
          {pool_->get() + v_off_, v_stage_->get(), row_elems_ * sizeof(T)},
          /*spin_cycles=*/2'000'000, stream_));
      const absl::Status s =
          PagedAttention<T>(q_->get(), cache, c_.options.layer, batch_.batch, params, *plan,
                            out_->get(), lse_->get(), ws.get(), stream_);
      EXPECT_TRUE(s.ok()) << s;
    };
    if (graph) {
      cudaGraph_t g;
      cudaGraphExec_t exec;
      EXPECT_CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      enqueue();
      EXPECT_CUDA_OK(cudaStreamEndCapture(stream_, &g));
      EXPECT_CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
      EXPECT_CUDA_OK(cudaGraphLaunch(exec, stream_));
      EXPECT_CUDA_OK(cudaStreamSynchronize(stream_));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    } else {
      enqueue();
      EXPECT_CUDA_OK(cudaStreamSynchronize(stream_));
    }
    Output r;
    const std::vector<T> out = out_->ToHost();
    r.out.resize(out.size());
    std::memcpy(r.out.data(), out.data(), out.size() * sizeof(T));
    r.lse = lse_->ToHost();
    return r;
  }

 private:
  PagedCase& c_;
  cuda_test::DeviceBatch batch_;
  std::optional<DeviceBuffer<T>> pool_, q_, k_stage_, v_stage_, out_;
  std::optional<DeviceBuffer<float>> lse_;
  int64_t row_elems_ = 0, k_off_ = 0, v_off_ = 0;
  cudaStream_t stream_ = nullptr;
};

std::vector<float> ToFloatBits(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t w = uint32_t{bits[i]} << 16;
    std::memcpy(&f[i], &w, 4);
  }
  return f;
}

// Every CTA of the stamped grid reached entry and stored, in order, with its split geometry.
void CheckStamps(const std::vector<unsigned long long>& h, int64_t ctas, int splits) {
  int mergers = 0;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long* w = &h[c * kDecodeStampWords];
    SCOPED_TRACE("cta " + std::to_string(c));
    EXPECT_NE(w[kDecodePhaseEntry], 0u);
    EXPECT_GE(w[kDecodePhaseWait], w[kDecodePhaseBounds]);
    EXPECT_GE(w[kDecodePhaseStored], w[kDecodePhaseEntry]);
    EXPECT_EQ(w[kDecodeStampSplits], static_cast<unsigned long long>(splits));
    if (w[kDecodeStampTicket] == 2) ++mergers;
  }
  EXPECT_EQ(mergers, splits > 1 ? ctas / splits : 0);
}

TEST(PagedDecodePrefetchCudaTest, PrefetchAndStampsBitIdenticalInPdlChain) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(attention_test::TestSeed());
  CaseOptions opt;
  opt.num_q_heads = 32;
  opt.num_kv_heads = 8;
  opt.head_dim = 128;
  opt.block_size = 16;
  for (const int64_t ctx : {1000, 1024, 4096 + 7}) {
    PagedCase c = attention_test::MakePagedCase(rng, opt, {{ctx, 1}});
    Chain chain(c);
    const attention_test::Reference ref = attention_test::ReferenceAttention(c, {.scale = 0.0884f});
    for (const auto& [splits, plan_keys] : {std::pair{1, 0}, {0, 0}, {0, 8192}}) {
      SCOPED_TRACE("context " + std::to_string(ctx) + " forced_splits " + std::to_string(splits) +
                   " plan_keys " + std::to_string(plan_keys));
      PagedAttentionPlan plan;
      const Output base = chain.Run(splits, plan_keys, 0, nullptr, false, &plan);
      if (::testing::Test::HasFailure()) return;
      EXPECT_TRUE(attention_test::OutClose(ToFloatBits(base.out), ref.out, 1e-2));
      EXPECT_TRUE(attention_test::LseClose(base.lse, ref.lse, 2e-3));
      const int64_t ctas = int64_t{plan.num_splits} * 8 * plan.row_tiles;
      for (const bool graph : {false, true}) {
        for (const int mode : {0, 1, 2, 3}) {
          for (const bool stamps : {false, true}) {
            SCOPED_TRACE(std::string(graph ? "graph" : "eager") + " mode " + std::to_string(mode) +
                         " stamps " + std::to_string(stamps));
            DeviceBuffer<unsigned long long> buf(ctas * kDecodeStampWords);
            EXPECT_CUDA_OK(cudaMemset(buf.get(), 0, buf.size() * 8));
            const Output r =
                chain.Run(splits, plan_keys, mode, stamps ? buf.get() : nullptr, graph);
            EXPECT_TRUE(BitEqual(r, base));
            if (stamps) CheckStamps(buf.ToHost(), ctas, plan.num_splits);
          }
        }
      }
    }
  }
}

// The stamps are refused where there is no stamped kernel (the CUDA-core kernel, head_dim 64,
// 1-byte KV).
TEST(PagedDecodePrefetchCudaTest, StampsOnlyOnTheTensorCoreD128Kernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  unsigned long long dummy = 0;
  PagedAttentionPlanInput in{.num_seqs = 1,
                             .num_tokens = 1,
                             .max_seq_len = 64,
                             .num_q_heads = 32,
                             .num_kv_heads = 8,
                             .head_dim = 64};
  in.phase_stamps = &dummy;
  EXPECT_FALSE(PlanPagedAttention(in).ok());
  in.head_dim = 128;
  in.allow_tensor_cores = false;
  EXPECT_FALSE(PlanPagedAttention(in).ok());
  in.allow_tensor_cores = true;
  EXPECT_TRUE(PlanPagedAttention(in).ok());
  in.kv_dtype = KvDtype::kFp8E4m3;
  EXPECT_FALSE(PlanPagedAttention(in).ok());
}

#undef EXPECT_CUDA_OK

}  // namespace
}  // namespace tandem::kernels::cuda
