// PlanPagedAttention (host only: runs without a GPU, in CI too): shape refusals, when the decode
// kernel merges its own splits, and the split planner's choices on the Llama-3-8B decode shapes.
// The kernels themselves: paged_attention_cuda_test.cc.
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/attention/cuda/paged_attention_cuda.h"

namespace tandem::kernels::cuda {
namespace {

TEST(PagedAttentionCudaTest, PlanRejectsBadShapes) {
  PagedAttentionPlanInput in{
      .num_seqs = 2, .num_tokens = 2, .num_q_heads = 8, .num_kv_heads = 3, .head_dim = 128};
  EXPECT_EQ(PlanPagedAttention(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.num_kv_heads = 2;
  for (int64_t d : {8, 48, 96, 512}) {
    in.head_dim = d;
    EXPECT_EQ(PlanPagedAttention(in).status().code(), absl::StatusCode::kInvalidArgument) << d;
  }
  for (int64_t d : {16, 32}) {  // CUDA-core kernel only
    in.head_dim = d;
    absl::StatusOr<PagedAttentionPlan> small = PlanPagedAttention(in);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_FALSE(small->use_tensor_cores);
  }
  in.head_dim = 128;
  in.max_seq_len = 4096;
  absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(plan->num_splits, 1);
  EXPECT_EQ(plan->workspace_bytes > 0, plan->num_splits > 1);
}

// The in-kernel merge only when the caller keeps the counters zeroed, the plan splits, the
// groups fit the counter range (4096) and the legacy baseline is off.
TEST(PagedAttentionCudaTest, PlanInKernelMerge) {
  PagedAttentionPlanInput in{.num_seqs = 1,
                             .num_tokens = 1,
                             .max_seq_len = 4096,
                             .num_q_heads = 32,
                             .num_kv_heads = 8,
                             .head_dim = 128,
                             .workspace_zeroed = true};
  auto plan = [&] {
    absl::StatusOr<PagedAttentionPlan> p = PlanPagedAttention(in);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : PagedAttentionPlan{};
  };
  EXPECT_TRUE(plan().merge_in_kernel);
  EXPECT_EQ(plan().workspace_bytes,
            kPagedAttentionCounterBytes + int64_t{plan().num_splits} * 32 * 129 * 4);
  in.forced_splits = 1;
  EXPECT_FALSE(plan().merge_in_kernel);
  in.forced_splits = 2;
  in.num_seqs = in.num_tokens = 512;  // 4096 groups
  EXPECT_TRUE(plan().merge_in_kernel);
  in.num_seqs = in.num_tokens = 513;
  EXPECT_FALSE(plan().merge_in_kernel);
  EXPECT_GT(plan().workspace_bytes, 0);
  in.num_seqs = in.num_tokens = 1;
  in.legacy_split_merge = true;
  EXPECT_FALSE(plan().merge_in_kernel);
  in.legacy_split_merge = false;
  in.workspace_zeroed = false;
  EXPECT_FALSE(plan().merge_in_kernel);
}

// What the engine plans (CudaModelRunner with decode_merge_in_kernel): every padded decode and
// verify graph of the Llama-3-8B (TP 1) and -70B (TP 4: 16 q / 2 kv heads) shapes, planned for
// max_model_len keys, merges its splits in the decode kernel whenever it splits, with the
// counters ahead of the partials in its workspace.
TEST(PagedAttentionCudaTest, EngineGraphShapesMergeInKernel) {
  int in_kernel = 0;
  for (const auto& [q_heads, kv_heads] : {std::pair<int64_t, int64_t>{32, 8}, {16, 2}}) {
    for (int64_t batch : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256}) {
      for (int64_t width : {1, 2, 4}) {
        for (int64_t max_model_len : {2048, 8192, 131072}) {
          SCOPED_TRACE(::testing::Message() << q_heads << "/" << kv_heads << " batch " << batch
                                            << " width " << width << " len " << max_model_len);
          const PagedAttentionPlanInput in{.num_seqs = batch,
                                           .num_tokens = batch * width,
                                           .max_q_len = width,
                                           .max_seq_len = max_model_len,
                                           .num_q_heads = q_heads,
                                           .num_kv_heads = kv_heads,
                                           .head_dim = 128,
                                           .workspace_zeroed = true};
          absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
          ASSERT_TRUE(plan.ok()) << plan.status();
          EXPECT_EQ(plan->merge_in_kernel, plan->num_splits > 1);
          if (plan->num_splits == 1) continue;
          ++in_kernel;
          EXPECT_EQ(plan->workspace_bytes, kPagedAttentionCounterBytes + int64_t{plan->num_splits} *
                                                                             batch * width *
                                                                             q_heads * 129 * 4);
        }
      }
    }
  }
  EXPECT_GT(in_kernel, 20);  // the shapes that split (batch 1 at every length, ...)
}

// The planner's choices on the Llama-3-8B decode shapes (32 q / 8 kv heads, d128, bf16, 132
// SMs), as measured best on an H200 (BENCHMARKS.md): at batch 1 one CTA per SM (16 splits of
// 8 kv heads; >= 128 keys per split), no second CTA per SM for short splits, two splits at
// 16 x 16k; the legacy planner keeps its own choices.
TEST(PagedAttentionCudaTest, PlannerSplitsOnLlama8bShapes) {
  PagedAttentionPlanInput in{.num_q_heads = 32, .num_kv_heads = 8, .head_dim = 128};
  auto splits = [&](int64_t batch, int64_t ctx, bool legacy) {
    in.num_seqs = in.num_tokens = batch;
    in.max_seq_len = ctx;
    in.legacy_split_merge = legacy;
    absl::StatusOr<PagedAttentionPlan> plan = PlanPagedAttention(in);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->num_splits : -1;
  };
  EXPECT_EQ(splits(1, 1024, false), 8);
  EXPECT_EQ(splits(1, 4096, false), 16);
  EXPECT_EQ(splits(1, 16384, false), 16);
  EXPECT_EQ(splits(16, 1024, false), 1);
  EXPECT_EQ(splits(16, 16384, false), 2);
  EXPECT_EQ(splits(64, 4096, false), 1);
  EXPECT_EQ(splits(256, 65536, false), 1);
  EXPECT_EQ(splits(1, 4096, true), 16);
  EXPECT_EQ(splits(1, 16384, true), 32);
  EXPECT_EQ(splits(16, 1024, true), 2);
}

}  // namespace
}  // namespace tandem::kernels::cuda
