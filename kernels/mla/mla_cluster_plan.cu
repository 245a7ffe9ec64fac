// PlanMla's choice of kRows16's cluster merge (MlaPlanInput::cluster_merge, one level, and
// cluster_merge_two_level): host code; the device queries are mla_decode_rows16.cu's
// MlaRows16MaxActiveClusters.
#include "kernels/attention/cuda/cluster_merge.cuh"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda::mla_internal {
namespace {

// The two-level cluster merge (MlaPlanInput::cluster_merge_two_level) where the one-level cluster
// does not fit in one wave: the largest C whose clusters all fit at once (MlaTwoLevelClusterSize),
// or the tests' forced C wherever valid; it needs the in-kernel merge's tickets and partials.
// Sets plan.cluster_merge and plan.cluster_size, else leaves the one-level fallback's reason.
void TakeTwoLevelClusterMerge(MlaPlan& plan) {
  const MlaPlanInput& in = plan.input;
  if (!in.cluster_merge_two_level && in.cluster_merge_force_size == 0) return;
  if (!plan.merge_in_kernel) {
    plan.cluster_merge_fallback = "two-level: no in-kernel merge tickets (workspace_zeroed)";
    return;
  }
  const auto fits = [](int c) { return MlaRows16MaxActiveClusters(c); };
  int c = 0;
  if (const int f = in.cluster_merge_force_size; f != 0) {
    const bool valid = (f == 2 || f == 4 || f == 8) && f < plan.num_splits &&
                       plan.num_splits % f == 0 && fits(f) > 0;
    if (!valid) {
      plan.cluster_merge_fallback = "two-level: the forced cluster size is invalid here";
      return;
    }
    c = f;
  } else {
    c = MlaTwoLevelClusterSize(plan.num_splits, in.num_seqs * plan.row_tiles, fits);
    if (c == 0) {
      plan.cluster_merge_fallback = "more clusters than fit at once (one and two levels)";
      return;
    }
  }
  plan.cluster_merge = true;
  plan.cluster_size = c;
  plan.cluster_merge_fallback = nullptr;
}

}  // namespace

// MlaPlanInput::cluster_merge where it is valid: kRows16 (its TMA kernel), one cluster of
// num_splits CTAs a group (2 .. internal::kMaxClusterMergeSplits: 8 is the portable cluster size,
// 16 needs the non-portable attribute), room on the device for one such cluster (a device query,
// only when asked). Short requests' CTAs past their filled splits hold empty splits in the cluster.
// Sets plan.cluster_merge and plan.cluster_size, or plan.cluster_merge_fallback (why not) where it
// was asked; where the one-level cluster does not fit (in one wave), the two-level merge if asked.
void TakeClusterMerge(MlaPlan& plan) {
  if (!plan.input.cluster_merge) return;
  if (!plan.use_tma || plan.tma_schedule != MlaTmaSchedule::kRows16) {
    plan.cluster_merge_fallback = "not the kRows16 kernel";
    return;
  }
  if (plan.num_splits < 2 || plan.num_splits > internal::kMaxClusterMergeSplits) {
    plan.cluster_merge_fallback = "splits not in 2..16";
    return;
  }
  if (plan.input.cluster_merge_force_size == 0) {
    const int fit = MlaRows16MaxActiveClusters(plan.num_splits);
    if (fit <= 0) {
      plan.cluster_merge_fallback = "no room for the cluster (cudaOccupancyMaxActiveClusters)";
    } else if (plan.input.cluster_merge_one_wave && plan.input.num_seqs * plan.row_tiles > fit) {
      // More clusters than fit at once run in a second wave (measured: 16 x 4k, 8-CTA clusters,
      // 33.5 -> 50.0 us; BENCHMARKS.md, sixteenth session): the ticket merge is faster there.
      plan.cluster_merge_fallback = "more clusters than fit at once (one wave only)";
    } else {
      plan.cluster_merge = true;
      plan.cluster_size = plan.num_splits;
      return;
    }
  }
  TakeTwoLevelClusterMerge(plan);
}

}  // namespace tandem::kernels::cuda::mla_internal
