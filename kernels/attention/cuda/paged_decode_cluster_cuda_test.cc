// PagedAttentionPlanInput::cluster_merge: the tensor-core decode kernel's splits merged through a
// thread-block cluster (cluster_merge.cuh). Its out and LSE must be bit-identical to the same
// plan's separate (PDL) merge kernel and in-kernel merge (the arithmetic is MergeSplitsKernel's
// in its order) and close to the fp64 reference, on random inputs: bf16 / fp16, head_dim 64 / 128,
// GQA 1 / 4 / 8, 2..16 splits forced or planned, contexts that leave splits empty or short
// (1, 65, 1000, 4097 keys), batch 1 and 3, decode and q_len 2; behind a PDL writer and chained;
// replayed from a CUDA graph. The planner falls back (and says why) where a cluster is invalid.
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/attention/cuda/attention_cuda_test_util.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"
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
using RunResult = cuda_test::AttentionOutput;

constexpr double kOutTol = 1e-2;
constexpr double kLseTol = 2e-3;
const AttentionParams kParams{.scale = 0.09f};

enum class Merge { kCluster, kInKernel, kSeparate };

bool SameBits(const RunResult& a, const RunResult& b) {
  return a.out.size() == b.out.size() && a.lse.size() == b.lse.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

// A case (inputs already rounded to T) on the device, run under any plan.
template <typename T>
struct DeviceCase {
  explicit DeviceCase(const PagedCase& c)
      : c(c),
        pool(cuda_test::Convert<T>(c.pool)),
        q(cuda_test::Convert<T>(c.q)),
        batch(c),
        out(std::max<int64_t>(1, c.num_tokens * c.options.num_q_heads * c.options.head_dim)),
        lse(std::max<int64_t>(1, c.num_tokens * c.options.num_q_heads)) {
    cache.data = pool.get();
    cache.layout = c.layout;
    cache.dtype = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  }

  PagedAttentionPlanInput Input(int forced_splits, Merge merge, bool pdl = false) const {
    PagedAttentionPlanInput in;
    cuda_test::SetPlanShape(c, in);
    in.kv_dtype = cache.dtype;
    in.forced_splits = forced_splits;
    in.workspace_zeroed = merge == Merge::kInKernel;
    in.cluster_merge = merge == Merge::kCluster;
    in.cluster_merge_one_wave = false;  // every valid case checked, in as many waves as it takes
    in.programmatic_launch = pdl;
    return in;
  }

  // Enqueues one call into out / lse (out and lse poisoned first when `poison`).
  void Enqueue(const PagedAttentionPlan& plan, DeviceBuffer<uint8_t>& ws, cudaStream_t stream,
               bool poison = true) {
    if (poison) {
      TANDEM_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.size() * sizeof(T), stream));
      TANDEM_CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xff, lse.size() * 4, stream));
    }
    const absl::Status status =
        PagedAttention<T>(q.get(), cache, c.options.layer, batch.batch, kParams, plan, out.get(),
                          lse.get(), ws.get(), stream);
    ASSERT_TRUE(status.ok()) << status;
  }

  RunResult Run(const PagedAttentionPlan& plan) {
    DeviceBuffer<uint8_t> ws(std::max<int64_t>(1, plan.workspace_bytes));
    EXPECT_EQ(cudaMemset(ws.get(), 0, ws.size()), cudaSuccess);
    Enqueue(plan, ws, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return cuda_test::ReadBack(c, out, lse);
  }

  const PagedCase& c;
  DeviceBuffer<T> pool, q;
  cuda_test::DeviceBatch batch;
  DeviceBuffer<T> out;
  DeviceBuffer<float> lse;
  DeviceKvCache cache;
};

PagedAttentionPlan MustPlan(const PagedAttentionPlanInput& in) {
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PagedAttentionPlan{};
}

template <typename T>
PagedCase RoundedCase(std::mt19937& rng, const CaseOptions& o, const std::vector<SeqSpec>& seqs) {
  PagedCase c = MakePagedCase(rng, o, seqs);
  cuda_test::RoundCase<T>(c);
  return c;
}

// Every split count of one case: cluster == separate == in-kernel, bit for bit, and the
// reference's values.
template <typename T>
void CheckEverySplitCount(std::mt19937& rng, const CaseOptions& o, const std::vector<SeqSpec>& seqs,
                          const std::string& label) {
  const PagedCase c = RoundedCase<T>(rng, o, seqs);
  const attention_test::Reference ref = ReferenceAttention(c, kParams);
  DeviceCase<T> dc(c);
  for (int splits : {2, 3, 4, 8, 16, 0}) {
    SCOPED_TRACE(label + " splits=" + std::to_string(splits));
    const PagedAttentionPlan cluster = MustPlan(dc.Input(splits, Merge::kCluster));
    if (::testing::Test::HasFailure()) return;
    const bool valid = cluster.num_splits >= 2 && cluster.num_splits <= 16;
    EXPECT_EQ(cluster.cluster_merge, valid)
        << (cluster.cluster_merge_fallback ? cluster.cluster_merge_fallback : "");
    if (!cluster.cluster_merge) continue;
    EXPECT_EQ(cluster.workspace_bytes, 0);
    EXPECT_FALSE(cluster.merge_in_kernel);
    const int n = cluster.num_splits;  // the planned count for splits = 0
    const RunResult a = dc.Run(cluster);
    const RunResult b = dc.Run(MustPlan(dc.Input(n, Merge::kSeparate)));
    const RunResult k = dc.Run(MustPlan(dc.Input(n, Merge::kInKernel)));
    EXPECT_TRUE(SameBits(a, b)) << "cluster vs separate, " << n << " splits";
    EXPECT_TRUE(SameBits(a, k)) << "cluster vs in-kernel, " << n << " splits";
    EXPECT_TRUE(OutClose(a.out, ref.out, kOutTol));
    EXPECT_TRUE(LseClose(a.lse, ref.lse, kLseTol));
  }
}

template <typename T>
void CheckShapes(const char* dtype) {
  std::mt19937 rng(TestSeed());
  const std::vector<std::vector<SeqSpec>> batches = {
      {{1000, 1}},
      {{4097, 1}},
      {{1, 1}, {65, 1}, {1000, 1}},
      {{4097, 1}, {0, 0}, {300, 2}},  // a padding request; q_len 2 (2 x group rows)
  };
  for (int64_t d : {128, 64}) {
    // {q heads, kv heads}: GQA 4, 8, 1.
    for (auto [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{32, 8}, {32, 4}, {8, 8}}) {
      CaseOptions o{.num_q_heads = hq, .num_kv_heads = hkv, .head_dim = d, .block_size = 16};
      for (size_t b = 0; b < batches.size(); ++b) {
        CheckEverySplitCount<T>(rng, o, batches[b],
                                std::string(dtype) + " d=" + std::to_string(d) +
                                    " hq=" + std::to_string(hq) + " hkv=" + std::to_string(hkv) +
                                    " batch#" + std::to_string(b));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(PagedDecodeClusterCudaTest, BitIdenticalToOtherMergesBf16) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckShapes<__nv_bfloat16>("bf16");
}

TEST(PagedDecodeClusterCudaTest, BitIdenticalToOtherMergesFp16) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckShapes<__half>("fp16");
}

// Behind a PDL writer that fills q and the pool ~1 ms after the decode may start, then a second
// PDL-launched call chained behind the first: both give the plain separate merge's bits.
TEST(PagedDecodeClusterCudaTest, PdlChain) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  const PagedCase c = RoundedCase<__nv_bfloat16>(rng, o, {{1000, 1}, {37, 1}, {513, 2}});
  DeviceCase<__nv_bfloat16> dc(c);
  for (int splits : {16, 5, 0}) {
    SCOPED_TRACE(splits);
    const PagedAttentionPlan plan = MustPlan(dc.Input(splits, Merge::kCluster, /*pdl=*/true));
    if (!plan.cluster_merge) continue;  // planned count outside 2..16: nothing to check
    const RunResult want = dc.Run(MustPlan(dc.Input(plan.num_splits, Merge::kSeparate)));
    DeviceBuffer<__nv_bfloat16> pool_stage(dc.pool.size()), q_stage(dc.q.size());
    TANDEM_CUDA_CHECK(
        cudaMemcpy(pool_stage.get(), dc.pool.get(), dc.pool.size() * 2, cudaMemcpyDeviceToDevice));
    TANDEM_CUDA_CHECK(
        cudaMemcpy(q_stage.get(), dc.q.get(), dc.q.size() * 2, cudaMemcpyDeviceToDevice));
    TANDEM_CUDA_CHECK(cudaMemset(dc.pool.get(), 0xff, dc.pool.size() * 2));
    TANDEM_CUDA_CHECK(cudaMemset(dc.q.get(), 0xff, dc.q.size() * 2));
    TANDEM_CUDA_CHECK(cudaMemset(dc.out.get(), 0xff, dc.out.size() * 2));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    cudaStream_t stream;
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(
        pdl_test::LaunchDelayedWriter({dc.q.get(), q_stage.get(), dc.q.size() * 2},
                                      {dc.pool.get(), pool_stage.get(), dc.pool.size() * 2},
                                      /*spin_cycles=*/2'000'000, stream));
    DeviceBuffer<uint8_t> ws(1);
    dc.Enqueue(plan, ws, stream, /*poison=*/false);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const RunResult first = cuda_test::ReadBack(c, dc.out, dc.lse);
    TANDEM_CUDA_CHECK(cudaMemset(dc.out.get(), 0xff, dc.out.size() * 2));
    TANDEM_CUDA_CHECK(cudaMemset(dc.lse.get(), 0xff, dc.lse.size() * 4));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    dc.Enqueue(plan, ws, stream, /*poison=*/false);
    dc.Enqueue(plan, ws, stream, /*poison=*/false);  // PDL behind the previous decode
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
    EXPECT_TRUE(SameBits(first, want));
    EXPECT_TRUE(SameBits(cuda_test::ReadBack(c, dc.out, dc.lse), want));
  }
}

// A graph captured once (PDL attribute on) replays twice, over poisoned out / lse, with the same
// bits as a plain call of the separate merge.
TEST(PagedDecodeClusterCudaTest, GraphReplay) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  const PagedCase c = RoundedCase<__nv_bfloat16>(rng, o, {{1000, 1}, {37, 1}, {2048, 1}});
  DeviceCase<__nv_bfloat16> dc(c);
  const PagedAttentionPlan plan = MustPlan(dc.Input(8, Merge::kCluster, /*pdl=*/true));
  ASSERT_TRUE(plan.cluster_merge) << plan.cluster_merge_fallback;
  const RunResult want = dc.Run(MustPlan(dc.Input(8, Merge::kSeparate)));
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<uint8_t> ws(1);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  dc.Enqueue(plan, ws, stream, /*poison=*/false);
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(replay);
    TANDEM_CUDA_CHECK(cudaMemset(dc.out.get(), 0xff, dc.out.size() * 2));
    TANDEM_CUDA_CHECK(cudaMemset(dc.lse.get(), 0xff, dc.lse.size() * 4));
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(SameBits(cuda_test::ReadBack(c, dc.out, dc.lse), want));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Where a cluster is invalid the plan is today's, with the reason (no device needed: none of
// these asks the device).
TEST(PagedDecodeClusterCudaTest, PlanFallsBackWhereInvalid) {
  PagedAttentionPlanInput base{.num_seqs = 1,
                               .num_tokens = 1,
                               .max_seq_len = 4096,
                               .num_q_heads = 32,
                               .num_kv_heads = 8,
                               .head_dim = 128,
                               .cluster_merge = true};
  auto expect_fallback = [](PagedAttentionPlanInput in, const char* label) {
    SCOPED_TRACE(label);
    const PagedAttentionPlan plan = MustPlan(in);
    EXPECT_FALSE(plan.cluster_merge);
    EXPECT_NE(plan.cluster_merge_fallback, nullptr);
    in.cluster_merge = false;
    const PagedAttentionPlan today = MustPlan(in);
    EXPECT_EQ(plan.num_splits, today.num_splits);
    EXPECT_EQ(plan.workspace_bytes, today.workspace_bytes);
    EXPECT_EQ(plan.merge_in_kernel, today.merge_in_kernel);
  };
  for (int splits : {1, 17, 32}) {
    PagedAttentionPlanInput in = base;
    in.forced_splits = splits;
    expect_fallback(in, ("splits " + std::to_string(splits)).c_str());
  }
  PagedAttentionPlanInput in = base;
  in.forced_splits = 4;
  in.allow_tensor_cores = false;
  expect_fallback(in, "CUDA-core kernel");
  in = base;
  in.forced_splits = 4;
  in.head_dim = 256;
  expect_fallback(in, "head_dim 256");
  in = base;
  in.forced_splits = 4;
  in.legacy_split_merge = true;
  expect_fallback(in, "legacy merge");
  in = base;
  in.forced_splits = 4;
  in.workspace_zeroed = true;
  const PagedAttentionPlan plan = MustPlan(in);
  std::string why;
  if (::tandem::testing::GpuAvailable(&why)) {
    EXPECT_TRUE(plan.cluster_merge) << plan.cluster_merge_fallback;
    EXPECT_FALSE(plan.merge_in_kernel);  // the cluster merge replaces it
  } else {
    EXPECT_FALSE(plan.cluster_merge);  // the occupancy query failed: today's plan
    EXPECT_TRUE(plan.merge_in_kernel);
  }
  // More clusters than the device holds at once (1,024 of 16 CTAs): one wave only by default.
  if (::tandem::testing::GpuAvailable(&why)) {
    in = base;
    in.num_seqs = in.num_tokens = 128;
    in.forced_splits = 16;
    expect_fallback(in, "1024 clusters, one wave only");
    in.cluster_merge_one_wave = false;
    EXPECT_TRUE(MustPlan(in).cluster_merge);
  }
}

// A fallback plan (32 splits) still runs and matches the separate merge's bits.
TEST(PagedDecodeClusterCudaTest, FallbackPlanRuns) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(TestSeed());
  CaseOptions o{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128, .block_size = 16};
  const PagedCase c = RoundedCase<__nv_bfloat16>(rng, o, {{4097, 1}, {65, 1}});
  DeviceCase<__nv_bfloat16> dc(c);
  const PagedAttentionPlan plan = MustPlan(dc.Input(32, Merge::kCluster));
  EXPECT_FALSE(plan.cluster_merge);
  EXPECT_TRUE(SameBits(dc.Run(plan), dc.Run(MustPlan(dc.Input(32, Merge::kSeparate)))));
}

}  // namespace
}  // namespace tandem::kernels::cuda
