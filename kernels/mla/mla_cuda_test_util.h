// The absorbed-MLA GPU tests' shared harness (testonly, CUDA builds): RunCase builds one batch
// (latents written by MlaWriteLatent / MlaWriteLatentFp8 into shuffled pages, the pool checked
// byte for byte against the CPU write), runs the CPU reference cpu::MlaPagedAttention
// (kAbsorbed; cpu::MlaPagedAttentionFp8 for FP8 pools; one DCP shard's partial and LSE), plans
// and runs MlaAbsorbedAttention on the device (eager, and replayed in a CUDA graph) and compares:
// out within 2.5e-2 of max|ref| (bf16 roundings of q_lat, the P weights and o_lat), LSE within
// 2e-2, the merge tickets back to zero. Used by mla_tensor_core_cuda_test, mla_rows16_cuda_test
// and mla_plain_fp8_cuda_test.
#ifndef TANDEM_KERNELS_MLA_MLA_CUDA_TEST_UTIL_H_
#define TANDEM_KERNELS_MLA_MLA_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention/dcp_shard.h"
#include "kernels/mla/mla_attention.h"
#include "kernels/mla/mla_test_util.h"

namespace tandem::kernels::cuda::mla_cuda_test {

// One batch of RunCase: the widths, each request's query tokens and context, the page size and
// what to ask the planner for.
struct Case {
  MlaDims dims;
  std::vector<int32_t> q_lens, seq_lens;
  int64_t block_size = 16;
  int num_splits = 0;  // 0: the plan's choice
  bool fp8 = false;    // an FP8 latent pool (e4m3 codes + per-row scales)
  // The tensor-core kernel for latent 512 + 64: 0 mma.sync, 1 the Hopper wgmma kernel with
  // cp.async loads (allow_tma false), 2 its TMA variant (pages of 8, 16, 32, 64k; the page of 5
  // runs the cp.async one), 3 and 4 the TMA variant's other warpgroup schedules
  // (MlaTmaSchedule::kSeesaw, kHandOff; the same pages), 5 its kRows16 kernel (16-row tiles, <= 16
  // heads, else the plan runs kSerial). Off sm_90 all of them run mma.sync.
  int kernel = 0;
  // Decode context parallelism: the pool holds this shard's latents at local indices, the
  // reference is cpu::MlaPagedAttention over the same shard (its partial and LSE).
  DcpShard dcp = {};
  bool fp8_blocks = false;  // with fp8: block-interleaved (each block its codes then its scales)
  // > 0: plan for max_seq_len max(this (its DCP local count), the real longest), as a CUDA
  // graph's plan for max_model_len; the requests keep their lengths.
  int64_t plan_len = 0;
  // MlaPlanInput::workspace_zeroed (the tickets zeroed once): the TMA kernel merges its splits.
  bool merge = false;
  bool graph = false;  // also one call captured in a CUDA graph, replayed twice, each checked
  int prefetch = 0;    // MlaPlanInput::tma_l2_prefetch_tiles (the TMA kernel's L2 prefetch)
};

// Runs case c (T: __nv_bfloat16 or __half, the pool's and activations' type) with inputs drawn
// from rng, the checks as gtest expectations.
template <typename T>
void RunCase(const Case& c, std::mt19937& rng);

// DeepSeek-V3 (128 heads), V2-Lite (16) and a tiny model's widths (the plain kernel).
inline constexpr MlaDims kV3 = mla_test::kV3Dims;
inline constexpr MlaDims kLite = mla_test::kLiteDims;
inline constexpr MlaDims kTiny{.num_heads = 4,
                               .qk_nope_head_dim = 16,
                               .qk_rope_head_dim = 8,
                               .kv_lora_rank = 32,
                               .v_head_dim = 12};

}  // namespace tandem::kernels::cuda::mla_cuda_test

#endif  // TANDEM_KERNELS_MLA_MLA_CUDA_TEST_UTIL_H_
