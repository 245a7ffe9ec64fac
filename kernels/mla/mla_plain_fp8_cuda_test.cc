// CUDA MLA (mla_cuda.h) against the CPU reference through the shared harness
// (mla_cuda_test_util.h): the plain kernel at a tiny model's widths; FP8 latent pools
// (mla_fp8_latent.h): MlaWriteLatentFp8's codes and per-row scales must equal
// cpu::WriteLatentCacheFp8's exactly, and attention over them cpu::MlaPagedAttentionFp8 on the
// plain and the Hopper FP8 kernel, planar and block-interleaved (DeviceKvCache::latent_block_bytes:
// each block its codes then its scales, byte for byte the CPU's); MlaRope against
// cpu::ApplyMlaRope; refusals (GPU; skips without one).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_test_util.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using mla_cuda_test::kLite;
using mla_cuda_test::kTiny;
using mla_cuda_test::kV3;
using mla_cuda_test::RunCase;

TEST(MlaCudaTest, PlainKernelTinyDims) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  for (int splits : {1, 4}) {
    RunCase<__nv_bfloat16>({kTiny, {1, 4, 2, 3}, {1, 9, 70, 33}, 4, splits}, rng);
  }
}

// FP8 latent pools (e4m3 + per-row scale): the write bit-exact, attention over the codes on the
// plain kernel (every width, DeepSeek-V3's 512 + 64 included: kernel 0 keeps the Hopper FP8
// kernel off) vs the CPU reference.
TEST(MlaCudaTest, Fp8LatentPools) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  RunCase<__nv_bfloat16>({kTiny, {1, 4, 2}, {1, 70, 33}, 4, 1, /*fp8=*/true}, rng);
  RunCase<__nv_bfloat16>({kTiny, {1, 3}, {9, 301}, 16, 4, /*fp8=*/true}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 2, 1}, {77, 130, 5}, 16, 0, /*fp8=*/true}, rng);
  RunCase<__half>({kV3, {1}, {200}, 64, 3, /*fp8=*/true}, rng);
  // The block-interleaved pool (DeviceKvCache::latent_block_bytes; the CPU backend's, what moves
  // P -> D): the same bytes as the CPU's blocks form, attention as over the planar pool.
  RunCase<__nv_bfloat16>({kTiny, {1, 4, 2}, {1, 70, 33}, 4, 1, true, 0, {}, true}, rng);
  RunCase<__half>({kV3, {1, 2}, {200, 77}, 16, 0, true, 0, {}, true}, rng);
}

// FP8 latent pools on the Hopper kernel (mla_decode_fp8.cu: codes dequantized into bf16 / fp16
// tiles in shared memory; mma.sync off sm_90 has no FP8 form, so there the plain kernel runs)
// against cpu::MlaPagedAttentionFp8 (fp32 over the dequantized latents): decode and q_len 2-4,
// splits 1 / 3 / planned, 16 / 32 / 128 heads, pages 16 / 64 / 5, contexts off the tile and the
// page, planar and block-interleaved pools, DCP shards (empty ones included).
TEST(MlaCudaTest, Fp8LatentPoolsOnTheWgmmaKernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  MlaDims h32 = kV3;
  h32.num_heads = 32;
  for (int splits : {1, 3, 0}) {
    RunCase<__nv_bfloat16>({kLite, {1, 4, 3, 1, 2}, {1, 77, 130, 301, 65}, 16, splits, true, 1},
                           rng);
  }
  RunCase<__nv_bfloat16>({kV3, {1, 3}, {200, 97}, 64, 0, true, 1}, rng);
  RunCase<__half>({kLite, {2, 1}, {33, 129}, 5, 2, true, 1}, rng);
  RunCase<__nv_bfloat16>({kV3, {1, 2, 1}, {63, 65, 1000}, 64, 0, true, 1}, rng);
  RunCase<__half>({h32, {3, 1, 4}, {127, 1, 130}, 16, 2, true, 1}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 1, 1, 1, 1, 1}, {4096, 1, 65, 2000, 64, 1}, 64, 0, true, 1},
                         rng);
  RunCase<__half>({kV3, {1, 2}, {200, 77}, 16, 0, true, 1, {}, true}, rng);
  RunCase<__nv_bfloat16>({kLite, {1, 3}, {300, 1000}, 64, 3, true, 1, {}, true}, rng);
  for (int64_t rank = 0; rank < 2; ++rank) {
    RunCase<__nv_bfloat16>(
        {kLite, {1, 4, 2, 1}, {2, 300, 131, 1000}, 16, 0, true, 1, {2, rank, 16}}, rng);
  }
  RunCase<__nv_bfloat16>({kV3, {1, 2}, {700, 2}, 16, 2, true, 1, {4, 3, 1}}, rng);
}

// MlaRope vs cpu::ApplyMlaRope on the q layout ([T, Hq, Dn + Dr], RoPE at offset Dn) for both
// pair orders and a YaRN cos/sin factor: within one bf16 rounding of the rotated value.
TEST(MlaCudaTest, RopeMatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  const int64_t T = 7, rows = 3, Dn = 16, Dr = 8, stride = Dn + Dr;
  std::vector<int64_t> pos = {0, 1, 5, 17, 63, 200, 4095};
  std::vector<float> inv_freq(Dr / 2);
  for (int64_t i = 0; i < Dr / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / Dr);
  for (bool interleave : {true, false}) {
    std::vector<float> x = attention_test::RandomNormal(rng, T * rows * stride, 1.0f);
    cuda_test::RoundTo<__nv_bfloat16>(x);
    std::vector<float> want = x;
    cpu::ApplyMlaRope(pos.data(), T, inv_freq.data(), Dr, 1.12f, interleave,
                      {want.data(), rows, stride, Dn});
    DeviceBuffer<__nv_bfloat16> x_d(cuda_test::Convert<__nv_bfloat16>(x));
    DeviceBuffer<int64_t> pos_d(pos);
    DeviceBuffer<float> freq_d(inv_freq);
    ASSERT_TRUE(MlaRope<__nv_bfloat16>(pos_d.get(), T, freq_d.get(), Dr, 1.12f, interleave,
                                       x_d.get(), rows, stride, Dn, nullptr)
                    .ok());
    const std::vector<float> got = cuda_test::ToFloat(x_d.ToHost());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-2f * std::abs(want[i]) + 1e-6f) << "element " << i;
    }
  }
}

TEST(MlaCudaTest, RefusesAKvCacheAndBadPlans) {
  TANDEM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(PlanMla({.dims = kTiny, .num_seqs = -1}).ok());
  MlaDims odd = kTiny;
  odd.kv_lora_rank = 30;  // L + Dr not a multiple of 8
  EXPECT_FALSE(PlanMla({.dims = odd, .num_seqs = 1, .num_tokens = 1, .max_seq_len = 4}).ok());
  // A DCP shard out of range (rank >= size, interleave 0).
  for (const DcpShard& bad : {DcpShard{2, 2, 16}, DcpShard{2, 0, 0}}) {
    EXPECT_FALSE(
        PlanMla({.dims = kTiny, .num_seqs = 1, .num_tokens = 1, .max_seq_len = 4, .dcp = bad})
            .ok());
  }
  DeviceBuffer<__nv_bfloat16> pool(1024);
  DeviceKvCache kv{pool.get(),
                   {.num_blocks = 1,
                    .num_layers = 1,
                    .block_size = 4,
                    .num_kv_heads = 2,
                    .head_dim = 40,
                    .num_planes = 2}};
  DeviceBuffer<int64_t> slots(std::vector<int64_t>{0});
  EXPECT_FALSE(MlaWriteLatent<__nv_bfloat16>(pool.get(), 32, pool.get(), 8, slots.get(), 1, kTiny,
                                             kv, 0, nullptr)
                   .ok());
}

}  // namespace
}  // namespace tandem::kernels::cuda
