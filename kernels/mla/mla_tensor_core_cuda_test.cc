// CUDA MLA (mla_cuda.h) on its tensor-core kernels against the CPU reference
// cpu::MlaPagedAttention (kAbsorbed) through the shared harness (mla_cuda_test_util.h):
// DeepSeek-V3's latent 512 + 64 on mma.sync and on wgmma with cp.async or TMA loads (the TMA
// kernel in its kSerial / kSeesaw / kHandOff warpgroup schedules), decode and q_len 2-4 (causal),
// page sizes 16 / 64 / 5 / 8 / 32 / 128, odd lengths, split-KV forced on and off; DCP shards;
// plans for a long bound on short contexts; the in-kernel split merge and the TMA kernel's L2
// prefetch (GPU; skips without one). kRows16: mla_rows16_cuda_test; the planner:
// mla_plan_cuda_test; the plain kernel, FP8 pools, RoPE, refusals: mla_plain_fp8_cuda_test.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using mla_cuda_test::Case;
using mla_cuda_test::kLite;
using mla_cuda_test::kTiny;
using mla_cuda_test::kV3;
using mla_cuda_test::RunCase;

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

}  // namespace
}  // namespace tandem::kernels::cuda
