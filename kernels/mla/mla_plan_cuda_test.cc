// CUDA MLA's split planner PlanMla (mla_cuda.h; host only: runs without a GPU): split counts
// that fill a wave, forced counts, the workspace cap, DCP's local bound, the in-kernel merge's
// plans, and MlaPlanInput::rows16_small_batches' choice of kRows16.
#include <cstdint>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using mla_cuda_test::kLite;
using mla_cuda_test::kV3;

// The split planner (host only: runs without a GPU). Batches of 1-8 stay within one wave of one
// CTA per SM, every planned split >= 512 latents at the bound (kSplitMinLatents; 128 for full
// 64-row tiles merged by the separate kernel); a plan for a
// long bound gives many splits (short requests then use fewer, mla_cuda_internal.cuh's
// SplitChunk); forced counts (64-latent minimum), the workspace cap and DCP's local bound.
// MlaPlanInput::rows16_small_batches (host planner only): kRows16 with 16-row tiles for <= 16
// heads at <= rows16_max_requests (128) requests and q_len <= kMlaAbsorbMaxQueryLen (4: a verify
// pass's tokens as one-token steps' rows); kSerial for more requests, longer queries (a prefill
// chunk in the step), more heads, forced splits, or without the switch; another schedule asked
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
    EXPECT_EQ(planned(kLite, 16, ctx, 1, true).tma_schedule, MlaTmaSchedule::kRows16);
    EXPECT_EQ(planned(kLite, 128, ctx, 4, true).tma_schedule, MlaTmaSchedule::kRows16);
    EXPECT_EQ(planned(kLite, 129, ctx, 1, true).tma_schedule, MlaTmaSchedule::kSerial);  // > 128
    EXPECT_EQ(planned(kLite, 1, ctx, 5, true).tma_schedule, MlaTmaSchedule::kSerial);    // prefill
    EXPECT_EQ(planned(kLite, 64, ctx, 512, true).tma_schedule, MlaTmaSchedule::kSerial);
    EXPECT_EQ(planned(kV3, 1, ctx, 1, true).tma_schedule, MlaTmaSchedule::kSerial);  // 128 heads
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
          // Full 64-row tiles (128 heads) merged by the separate kernel: >= 128 latents.
          const int min_split = d.num_heads * q >= 64 ? 128 : 512;
          EXPECT_EQ(p.split_min_latents, min_split);
          EXPECT_LT((p.num_splits - 1) * min_split, ctx);  // >= min_split a split at the bound
        }
      }
    }
  }
  EXPECT_EQ(plan(kLite, 1, 1024).num_splits, 2);  // 2 CTAs of 512 latents
  EXPECT_EQ(plan(kLite, 1, 4096).num_splits, 8);
  EXPECT_EQ(plan(kLite, 1, 32768).num_splits, 64);  // a 1k request then runs 2 CTAs of 512
  EXPECT_EQ(plan(kV3, 64, 32768).num_splits, 1);
  // 128 heads (2 row tiles of 64, the separate merge): about one wave of >= 128-latent splits,
  // fewer where the partials cost more than the shorter chunks save (measured optima at batch 1:
  // BENCHMARKS.md, twenty-third session): batch 1 at 4k -> 22, 8k -> 32, 16k -> 43, 32k -> 64,
  // batch 2 at 16k -> 32, batch 4 -> 16, batch 16 -> 4.
  EXPECT_EQ(plan(kV3, 1, 4096).num_splits, 22);
  EXPECT_EQ(plan(kV3, 1, 8192).num_splits, 32);
  EXPECT_EQ(plan(kV3, 1, 16384).num_splits, 43);
  EXPECT_EQ(plan(kV3, 1, 131072).num_splits, 64);
  EXPECT_EQ(plan(kV3, 2, 16384).num_splits, 32);
  EXPECT_EQ(plan(kV3, 4, 16384).num_splits, 16);
  EXPECT_EQ(plan(kV3, 16, 16384).num_splits, 4);
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
  EXPECT_EQ(v3.split_min_latents, 128);
  EXPECT_EQ(v3.num_splits, plan(kV3, 1, 4096).num_splits);
  EXPECT_TRUE(zeroed(4096, 4, MlaTmaSchedule::kSerial, 1, kV3).merge_in_kernel);  // forced
}

}  // namespace
}  // namespace tandem::kernels::cuda
