// CUDA MLA's MlaTmaSchedule::kRows16 kernel (mla_decode_rows16.cu) against the CPU reference
// cpu::MlaPagedAttention (kAbsorbed) through the shared harness (mla_cuda_test_util.h), bf16 and
// fp16 (GPU; skips without one).
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
using mla_cuda_test::kV3;
using mla_cuda_test::RunCase;

// MlaTmaSchedule::kRows16 (mla_decode_rows16.cu: mma.sync over row tiles of 16 rows, TMA
// tiles): 16 heads q_len 1 and 8 heads q_len 1 / 2, contexts at the tile edges (1, 63, 64, 65)
// and longer (700, 4096), pages 16 / 64, splits 1 / 2 / planned, separate and in-kernel merge;
// q_len 2-4 at 16 heads and 3-4 at 8 heads (several 16-row tiles a request: verify passes); 40
// requests (q_len 1 and 2, one split and planned splits merged in the kernel); a
// long plan (empty splits) replayed in a CUDA graph, a DCP shard, and 128 heads (the plan falls
// back to kSerial).
// fp8: every case over an FP8 latent pool (mla_decode_rows16_fp8.cu), planar and
// block-interleaved by turns, unwritten codes NaN bytes, against cpu::MlaPagedAttentionFp8.
template <typename T>
void RunRows16Cases(std::mt19937& rng, bool fp8 = false) {
  int n = 0;
  const auto run = [&](Case c) {
    c.fp8 = fp8;
    c.fp8_blocks = fp8 && n++ % 2 == 0;
    RunCase<T>(c, rng);
  };
  MlaDims h8 = kV3;
  h8.num_heads = 8;
  const std::vector<int32_t> ctx = {1, 63, 64, 65, 700, 4096};
  for (int64_t page : {16, 64}) {
    for (int splits : {1, 2, 0}) {
      for (bool merge : {false, true}) {
        if (merge && splits == 1) continue;
        Case lite{kLite, std::vector<int32_t>(6, 1), ctx, page, splits, false, 5};
        Case v3{h8, {1, 2, 2, 1, 2, 1}, ctx, page, splits, false, 5};
        lite.merge = v3.merge = merge;
        run(lite);
        run(v3);
      }
    }
  }
  for (int splits : {1, 0}) {  // several 16-row tiles a request
    Case multi{kLite, {1, 4, 3, 2, 4, 2}, ctx, 64, splits, false, 5};
    Case multi8{h8, {1, 4, 4, 3, 3, 4}, ctx, 16, splits, false, 5};
    multi.merge = multi8.merge = splits == 0;
    run(multi);
    run(multi8);
  }
  {  // many requests (the runtime takes kRows16 up to MlaPlanInput::rows16_max_requests)
    std::vector<int32_t> q(40, 1), c(40);
    for (size_t i = 0; i < c.size(); ++i) {
      c[i] = ctx[i % ctx.size()] + static_cast<int32_t>(3 * i);
    }
    q[3] = q[17] = 2;
    for (int splits : {1, 0}) {
      Case many{kLite, q, c, 64, splits, false, 5};
      many.merge = splits == 0;
      run(many);
    }
  }
  Case graph{kLite, {1, 1, 1}, {4096, 65, 1}, 64, 0, false, 5};
  graph.plan_len = 32768;
  graph.merge = graph.graph = true;
  run(graph);
  run({h8, {2, 1}, {700, 65}, 16, 0, false, 5, DcpShard{2, 1, 16}});
  run({kV3, {1}, {700}, 64, 2, false, 5});
}

TEST(MlaCudaTest, TmaRows16MatchesTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  RunRows16Cases<__nv_bfloat16>(rng);
  RunRows16Cases<__half>(rng);
}

// The same cases over FP8 latent pools: kRows16's FP8 kernel (16 heads and 8), the 128-head case
// on the 64-row FP8 kernel (the plan falls back to kSerial).
TEST(MlaCudaTest, TmaRows16Fp8PoolsMatchTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 7);
  RunRows16Cases<__nv_bfloat16>(rng, /*fp8=*/true);
  RunRows16Cases<__half>(rng, /*fp8=*/true);
}

}  // namespace
}  // namespace tandem::kernels::cuda
