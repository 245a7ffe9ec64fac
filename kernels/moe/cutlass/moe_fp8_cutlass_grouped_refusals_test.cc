// MoeFp8CutlassGroupedGemm's refusals (moe_fp8_cutlass_grouped.h): every requirement it checks
// before any device work -- so they run in CI without a GPU -- and its workspace queries' bounds.
// The products themselves: moe_fp8_cutlass_grouped_cuda_test.cc.
#include <cuda_bf16.h>

#include <cstdint>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Refused before any device work (so also checked without a GPU).
TEST(MoeFp8CutlassGroupedRefusals, RefusesWhatItCannotTake) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[64];
  alignas(16) static bf16 out[64];
  alignas(16) static int32_t offsets[8];
  static const uint8_t* code_table[4];
  static const float* scale_table[4];
  alignas(128) static char workspace[128];
  const MoeFp8CutlassGroupedArgs ok{codes, scales, {code_table, scale_table, 4}, offsets, 2, 8,
                                    512,   out};
  auto code = [](const MoeFp8CutlassGroupedArgs& a) {
    return MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr).code();
  };
  for (int64_t k : {0, 100, 200, 8, -128}) {  // not a positive multiple of 16
    MoeFp8CutlassGroupedArgs a = ok;
    a.k = k;
    a.w.groups = MoeFp8CutlassGroups(k);
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "k=" << k;
  }
  for (int64_t n : {0, 12, 2100, 7, -8}) {
    MoeFp8CutlassGroupedArgs a = ok;
    a.n = n;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "n=" << n;
  }
  for (int64_t e : {int64_t{0}, int64_t{-1}, kMoeFp8CutlassMaxExperts + 1}) {
    MoeFp8CutlassGroupedArgs a = ok;
    a.num_experts = e;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "experts=" << e;
    EXPECT_FALSE(MoeFp8CutlassGroupedWorkspaceBytes(e).ok()) << "experts=" << e;
  }
  MoeFp8CutlassGroupedArgs a = ok;
  a.w.groups = 1;  // per-channel weight scales without w_scales_wide
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a.w.groups = 2;  // neither ceil(k / 128) nor 1
  a.w_scales_wide = scales;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.a_scheme = Fp8ActivationScheme::kDynamicToken;  // per-token scales without a_scales_wide
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a.a_scheme = Fp8ActivationScheme::kNone;
  a.a_scales_wide = scales;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.a_scheme = Fp8ActivationScheme::kStaticTensor;
  a.a_scales_wide = reinterpret_cast<float*>(reinterpret_cast<char*>(scales) + 2);  // misaligned
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.w.codes = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  // The scaled form: per-channel weights with per-token or static activations, no block scales,
  // unless broadcast_scales.
  a = ok;
  EXPECT_FALSE(MoeFp8CutlassScaledFormServes(a));  // 1 x 128 activations, grouped weights
  a.w.groups = 1;
  EXPECT_FALSE(MoeFp8CutlassScaledFormServes(a));  // 1 x 128 activations
  for (const Fp8ActivationScheme s :
       {Fp8ActivationScheme::kDynamicToken, Fp8ActivationScheme::kStaticTensor}) {
    a.a_scheme = s;
    EXPECT_TRUE(MoeFp8CutlassScaledFormServes(a));
    a.broadcast_scales = true;
    EXPECT_FALSE(MoeFp8CutlassScaledFormServes(a));
    a.broadcast_scales = false;
  }
  a.w.groups = 4;
  EXPECT_FALSE(MoeFp8CutlassScaledFormServes(a));  // grouped weight scales
  a.swap_ab = true;                                // the swapped order outside the scaled form
  a.a_scales_wide = scales;
  const absl::Status swap = MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr);
  EXPECT_EQ(swap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(swap.message().find("swap_ab"), absl::string_view::npos) << swap;
  a = ok;
  a.expert_offsets = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  // A single weight: only with one expert, both pointers, no tables, no block scales.
  MoeFp8CutlassGroupedArgs single = ok;
  single.num_experts = 1;
  single.w.codes = nullptr;
  single.w.scales = nullptr;
  single.single_codes = codes;
  single.single_scales = scales;
  for (int bad = 0; bad < 4; ++bad) {
    a = single;
    if (bad == 0) a.num_experts = 2;
    if (bad == 1) a.single_scales = nullptr;
    if (bad == 2) a.w.codes = code_table;
    if (bad == 3) a.block_scales = scale_table, a.block_scale_ld = 4;
    const absl::Status st = MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "case " << bad;
    EXPECT_NE(st.message().find("single weight"), absl::string_view::npos) << st;
  }
  // The split form: a single weight on the swapped scaled form, 2 .. kMoeFp8CutlassMaxSplits
  // slices, aligned scratch.
  single.w.groups = 1;
  single.a_scheme = Fp8ActivationScheme::kDynamicToken;
  single.swap_ab = true;
  single.k_splits = 2;
  alignas(16) static float partials[64];
  single.split_partials = partials;
  single.split_rows = 4;
  for (int bad = 0; bad < 7; ++bad) {
    a = single;
    if (bad == 0) a.k_splits = 0;
    if (bad == 1) a.k_splits = kMoeFp8CutlassMaxSplits + 1;
    if (bad == 2) a.swap_ab = false;
    if (bad == 3) a.split_partials = nullptr;
    if (bad == 4) a.split_partials = partials + 1;                     // 4-byte aligned only
    if (bad == 5) a.a_scheme = Fp8ActivationScheme::kDynamicGroup128;  // not the scaled form
    if (bad == 6) a.split_rows = -1;
    const absl::Status st = MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "split case " << bad;
    EXPECT_NE(st.message().find("k_splits"), absl::string_view::npos) << st;
  }
  // Token tiles: 32, or 64 on the swapped scaled form unsplit.
  single.k_splits = 1;
  for (int bad = 0; bad < 4; ++bad) {
    a = single;
    a.swap_token_tile = 64;
    if (bad == 0) a.swap_token_tile = 128;
    if (bad == 1) a.swap_ab = false;
    if (bad == 2) a.broadcast_scales = true, a.w_scales_wide = partials;  // not the scaled form
    if (bad == 3) a.k_splits = 2;
    const absl::Status st = MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "token tile case " << bad;
    EXPECT_NE(st.message().find("swap_token_tile"), absl::string_view::npos) << st;
  }
  // Slices: 128-column multiples where k allows, else 16; never an empty slice.
  EXPECT_EQ(MoeFp8CutlassSplitCols(4096, 4), 1024);
  EXPECT_EQ(MoeFp8CutlassSplitCols(1040, 2), 640);
  EXPECT_EQ(MoeFp8CutlassSplitCols(14336, 3), 4864);
  EXPECT_EQ(MoeFp8CutlassSplitCols(160, 4), 48);
  for (int64_t k : {16, 160, 1040, 4096, 10944, 28672}) {
    for (int64_t s = 1; s <= kMoeFp8CutlassMaxSplits; ++s) {
      const int64_t cols = MoeFp8CutlassSplitCols(k, s);
      EXPECT_EQ(cols % 16, 0) << k << " " << s;
      EXPECT_LE((k + cols - 1) / cols, s) << k << " " << s;
      EXPECT_GT(k - ((k + cols - 1) / cols - 1) * cols, 0) << k << " " << s;
    }
  }
  a = ok;
  a.a = codes + 8;  // 8-byte aligned only
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.out = out + 1;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  // A workspace too short (128 bytes cannot hold 2 groups' arrays), misaligned or null.
  EXPECT_EQ(code(ok), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeFp8CutlassGroupedGemm(ok, nullptr, 1 << 20, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MoeFp8CutlassGroupedGemm(ok, workspace + 16, 1 << 20, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<size_t> bytes = MoeFp8CutlassGroupedWorkspaceBytes(128);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, size_t{128} * 11 * 8);  // at least the per-group arrays
}

TEST(MoeFp8CutlassGroupedRefusals, RefusesBlockFormWhatItCannotTake) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[64];
  alignas(16) static bf16 out[64];
  alignas(16) static int32_t offsets[8];
  static const uint8_t* code_table[4];
  static const float* block_table[4];
  alignas(128) static char workspace[128];
  MoeFp8CutlassGroupedArgs ok{codes, scales, {code_table, nullptr, 0}, offsets, 2, 8, 768, out};
  ok.block_scales = block_table;
  ok.block_scale_ld = 8;
  auto code = [](const MoeFp8CutlassGroupedArgs& a) {
    return MoeFp8CutlassGroupedGemm(a, workspace, sizeof(workspace), nullptr).code();
  };
  for (int64_t ld : {0, 5, -6}) {  // rows shorter than k / 128 = 6
    MoeFp8CutlassGroupedArgs a = ok;
    a.block_scale_ld = ld;
    EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument) << "ld=" << ld;
    EXPECT_FALSE(MoeFp8CutlassGroupedBlockWorkspaceBytes(2, 8, 768, ld).ok()) << "ld=" << ld;
  }
  EXPECT_FALSE(MoeFp8CutlassGroupedBlockWorkspaceBytes(2, 8, 700, 8).ok());
  EXPECT_FALSE(MoeFp8CutlassGroupedBlockWorkspaceBytes(2, 12, 768, 8).ok());
  EXPECT_FALSE(MoeFp8CutlassGroupedBlockWorkspaceBytes(0, 8, 768, 8).ok());
  MoeFp8CutlassGroupedArgs a = ok;
  a.w.codes = nullptr;
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  a = ok;
  a.k = 640;  // ld 8 >= 5 groups, but the workspace is short
  EXPECT_EQ(code(a), absl::StatusCode::kInvalidArgument);
  // w.scales and w.groups are not read by the block form: refused here only for the workspace.
  EXPECT_EQ(code(ok), absl::StatusCode::kInvalidArgument);
  // The compact copy: ld != k / 128 needs E x ceil(n / 128) x k / 128 floats more than ld = 6.
  const absl::StatusOr<size_t> in_place =
      MoeFp8CutlassGroupedBlockWorkspaceBytes(128, 2048, 768, 6);
  const absl::StatusOr<size_t> compact = MoeFp8CutlassGroupedBlockWorkspaceBytes(128, 2048, 768, 8);
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  ASSERT_TRUE(compact.ok()) << compact.status();
  EXPECT_GE(*compact, *in_place + size_t{128} * 16 * 6 * 4);
}

}  // namespace
}  // namespace tandem::kernels::cuda
