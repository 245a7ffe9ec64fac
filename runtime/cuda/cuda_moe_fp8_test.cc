// CudaFp8MoeExperts (cuda_moe_fp8.h) on its paths for the same 300-token step: the prefill paths
// (TANDEM_MOE_FP8_PREFILL's: per-expert — the offsets read back, one CudaFp8Linear per expert:
// cuBLASLt's block-scaled or outer-vector FP8 GEMM on each expert's rows, the last m % 4 rows on
// the GEMV —, mma, and cutlass — kernels/moe/cutlass's grouped GEMM on sm_90, for every scheme
// here: its weight scales per row (TANDEM_MOE_FP8_CUTLASS_SCALES=row; per-token and static scales
// broadcast over its 128-column groups) and by default per block for the 128 x 128 blocks, in the
// epilogue (the scaled form) for per-channel weights) and the FP8 expert GEMVs and the grouped
// FP8 MMA
// (kernels/moe/moe_fp8_cuda.h), for DeepSeek-V3's form (128 x 128 blocks as per-row 128-column
// groups, 1 x 128 activations, widths with 4 groups: the block GEMM's), compressed-tensors' and
// online FP8's (per-channel, per-token) and modelopt's (per-tensor weights, held per channel, and a
// static activation scale); the e4m3 shared experts too. A 96-token sync-free step (a CUDA graph
// size) on the CUTLASS grouped GEMM (TANDEM_MOE_FP8_DECODE's default) eager and captured in a
// CUDA graph, vs the CPU. Uploads from the loader's stacked form
// (UploadFp8MoeWeights), including expert parallelism's zero expert.
//
// Every stage is checked against the CPU reference (cpu::Fp8Linear per expert, SiLU * up rounded
// as the kernels round) fed the GPU's OWN input of that stage: the same bf16 values quantize to
// the same e4m3 codes and scales on both sides (the same per-token / 1 x 128 rule, an IEEE
// division), so what is left is one bf16 rounding of the output and the accumulation: tight
// tolerances (on an H200, 8 seeds: at most 0.68 of them). The two paths' outputs are NOT held to a
// fixed tolerance of each other: Hopper's FP8 MMA (13-bit aligned partial sums) and the GEMV's
// fp32 sums end on different sides of a bf16 rounding often enough that ~10% of the act values
// differ by a step; quantizing two such rows per token moves e4m3 codes (~1.2% of them; a row's
// scale too when its largest element moved), each by a step of up to ~7% of the row's amax times
// a weight. That part is computed on the CPU (down of each path's act), and the outputs must agree
// up to it within the stage tolerances. On an H200 it exceeded the earlier fixed 1.6% |x| + 2% max
// tolerance in 5 of 8 seeds (up to 1.32x; the shared experts against a CPU chain from x: 4 of 16
// runs, up to 1.80x; kernels/moe/BENCHMARKS.md): that tolerance's failure, no kernel error.
// The helpers (random weights, the CPU reference, the tolerances): cuda_moe_fp8_test_util.h.
#include "runtime/cuda/cuda_moe_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_gemm_cuda.h"
#include "runtime/cuda/cuda_moe_fp8_test_util.h"
#include "runtime/model/expert_placement.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;
template <typename T>
using TestBuffer = kernels::cuda_test::DeviceBuffer<T>;
using moe_fp8_test::Bf16Rows;
using moe_fp8_test::Compare;
using moe_fp8_test::kAccum;
using moe_fp8_test::kActRel;
using moe_fp8_test::kOneStep;
using moe_fp8_test::kRound;
using moe_fp8_test::kStaticAct;
using moe_fp8_test::kStaticInput;
using moe_fp8_test::MaxAbs;
using moe_fp8_test::Minus;
using moe_fp8_test::PerExpert;
using moe_fp8_test::PrintActDifference;
using moe_fp8_test::RandomFp8;
using moe_fp8_test::SchemeName;
using moe_fp8_test::SiluMul;

// The shared experts on the T tokens, each stage against the CPU on the GPU's input of the stage;
// the chained CPU reference from x alone is printed for comparison.
void SharedMatchesCpu(CudaFp8MoeExperts& experts, const CudaFp8MoeWeights& w,
                      const Fp8LinearWeight& gu_w, const Fp8LinearWeight& dn_w,
                      const std::vector<float>& x, const bf16* dx, int64_t T, int64_t H,
                      int64_t Is) {
  TestBuffer<bf16> gu_buf(T * 2 * Is), act_buf(T * Is), out_buf(T * H);
  ASSERT_TRUE(experts.Shared(w, dx, T, gu_buf.get(), act_buf.get(), out_buf.get(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> gu = kernels::cuda_test::ToFloat(gu_buf.ToHost());
  const std::vector<float> act = kernels::cuda_test::ToFloat(act_buf.ToHost());
  const std::vector<float> out = kernels::cuda_test::ToFloat(out_buf.ToHost());
  const std::vector<int32_t> all_rows = {0, static_cast<int32_t>(T)};
  const std::vector<float> gu_want = PerExpert(x, H, gu_w, 2 * Is, all_rows);
  Compare(gu, gu_want, kRound, kAccum, "shared gate_up vs CPU");
  Compare(act, SiluMul(gu, T, Is), kOneStep, 1e-6f, "shared act vs CPU on its gate_up");
  Compare(out, PerExpert(act, Is, dn_w, H, all_rows), kRound, kAccum,
          "shared down vs CPU on its act");
  const std::vector<float> chained = PerExpert(SiluMul(gu_want, T, Is), Is, dn_w, H, all_rows);
  Compare(out, chained, 1.6e-2f, 2e-2f, "shared out vs CPU chained from x", /*check=*/false);
}

void PrefillMatchesGemvs(Scheme scheme, std::mt19937& rng) {
  SCOPED_TRACE(SchemeName(scheme));
  std::printf("%s\n", SchemeName(scheme));
  const bool blocks = scheme == Scheme::kDynamicGroup128;
  ModelConfig c;
  c.hidden_size = 512;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 256;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.quantization.activation = scheme;  // Create sizes the CUTLASS prefill's scratch by it
  const int64_t T = 300, E = 8, k = 2, H = 512, I = 512, Is = 256, rows = T * k;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(E * 2 * I, H, blocks, scheme, rng, kStaticInput);
  layer.experts_down_fp8 = RandomFp8(E * H, I, blocks, scheme, rng, kStaticAct);
  layer.shared_gate_up_fp8 = RandomFp8(2 * Is, H, blocks, scheme, rng, kStaticInput);
  layer.shared_down_fp8 = RandomFp8(H, Is, blocks, scheme, rng, kStaticAct);
  const Fp8LinearWeight gu_w = layer.experts_gate_up_fp8, dn_w = layer.experts_down_fp8;
  const Fp8LinearWeight shared_gu = layer.shared_gate_up_fp8, shared_dn = layer.shared_down_fp8;
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, T);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(layer.experts_gate_up_fp8.empty());  // host copies freed
  absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> experts = CudaFp8MoeExperts::Create(c, T);
  ASSERT_TRUE(experts.ok()) << experts.status();
  absl::StatusOr<std::unique_ptr<kernels::cuda::MoeGroupedGemm>> grouped =
      kernels::cuda::MoeGroupedGemm::Create(E);
  ASSERT_TRUE(grouped.ok()) << grouped.status();

  const std::vector<float> x = Bf16Rows(T * H, rng);
  std::vector<int32_t> ids(rows);
  for (int64_t t = 0; t < T; ++t) {  // two distinct experts, skewed towards expert 0
    ids[t * k] = t % 3 == 0 ? 0 : static_cast<int32_t>(rng() % E);
    ids[t * k + 1] = static_cast<int32_t>((ids[t * k] + 1 + rng() % (E - 1)) % E);
  }
  TestBuffer<bf16> dx(kernels::cuda_test::Convert<bf16>(x)), rows_in(rows * H),
      gate_up(rows * 2 * I), act(rows * I), out(rows * H);
  TestBuffer<int32_t> d_ids(ids), offsets(E + 1), active(E), token_of_row(rows), row_of_pair(rows);
  const kernels::cuda::DeviceMoePermutation perm{offsets.get(), active.get(), token_of_row.get(),
                                                 row_of_pair.get()};
  ASSERT_TRUE(kernels::cuda::MoePermute(d_ids.get(), T, k, E, perm, nullptr, nullptr).ok());
  auto run = [&](kernels::cuda::MoeGroupedGemm* g) {
    EXPECT_TRUE((*experts)
                    ->Routed(**w, dx.get(), T, perm, E, rows_in.get(), gate_up.get(), act.get(),
                             out.get(), g, nullptr, false)
                    .ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::make_pair(kernels::cuda_test::ToFloat(act.ToHost()),
                          kernels::cuda_test::ToFloat(out.ToHost()));
  };
  EXPECT_TRUE((*experts)->grouped_mma());  // the default (TANDEM_MOE_FP8 unset)
  using Prefill = CudaFp8MoeExperts::Prefill;
  EXPECT_EQ((*experts)->prefill(), Prefill::kCutlass);  // TANDEM_MOE_FP8_PREFILL unset
  (*experts)->set_grouped_mma(false);
  const auto [act_gemv, out_gemv] = run(nullptr);
  EXPECT_STREQ((*experts)->last_path(), "fp8-expert-gemv");
  (*experts)->set_prefill(Prefill::kPerExpert);
  const auto [act_gemm, out_gemm] = run(grouped->get());
  EXPECT_STREQ((*experts)->last_path(), "fp8-per-expert-gemm");
  const std::vector<float> gu_gemm = kernels::cuda_test::ToFloat(gate_up.ToHost());
  (*experts)->set_grouped_mma(true);
  EXPECT_EQ((*experts)->decode(), CudaFp8MoeExperts::Decode::kCutlass);  // env unset
  (*experts)->set_decode(CudaFp8MoeExperts::Decode::kMma);  // TANDEM_MOE_FP8_DECODE=mma
  const auto [act_mma, out_mma] = run(nullptr);
  EXPECT_STREQ((*experts)->last_path(), "fp8-grouped-mma");
  const std::vector<float> gu_mma = kernels::cuda_test::ToFloat(gate_up.ToHost());
  // Prefill on MoeFp8GroupedMma (TANDEM_MOE_FP8_PREFILL=mma): the sync-free run's bits.
  (*experts)->set_prefill(Prefill::kMma);
  const auto [act_pmma, out_pmma] = run(grouped->get());
  EXPECT_STREQ((*experts)->last_path(), "fp8-grouped-mma");
  EXPECT_TRUE(out_pmma == out_mma) << "prefill on the MMA differs from the sync-free MMA";
  // Prefill on the CUTLASS grouped GEMM (the default where it serves: sm_90, CUTLASS built; every
  // scheme here, per-channel weights and per-token / static activations through its broadcast
  // scales); elsewhere the per-expert loop.
  (*experts)->set_prefill(Prefill::kCutlass);
  const bool cutlass = (*experts)->CutlassPrefillServes(**w, rows);
  using Scales = CudaFp8MoeExperts::CutlassScales;
  EXPECT_EQ((*experts)->cutlass_scales(), Scales::kBlock);  // the default, env unset
  (*experts)->set_cutlass_scales(Scales::kRow);             // TANDEM_MOE_FP8_CUTLASS_SCALES=row
  const auto [act_cut, out_cut] = run(grouped->get());
  EXPECT_STREQ((*experts)->last_path(), cutlass ? "fp8-cutlass-grouped" : "fp8-per-expert-gemm");
  const std::vector<float> gu_cut = kernels::cuda_test::ToFloat(gate_up.ToHost());
  std::printf("  prefill fp8-cutlass-grouped %s\n", cutlass ? "ran" : "not served here");
  // The block form (the default): the experts' 128 x 128 block scales (uploaded where every
  // expert's 128-row blocks share their scales: the blocks case).
  (*experts)->set_cutlass_scales(Scales::kBlock);
  const bool block = cutlass && (*experts)->CutlassBlockScalesServe(**w);
  if (cutlass) {
    EXPECT_EQ(block, blocks) << "block tables where the experts are 128 x 128 blocks";
  }
  // Per-channel weights with per-token / static activations: the scaled form under kBlock.
  const bool scaled = cutlass && (*experts)->CutlassScaledFormServes(**w);
  EXPECT_EQ(scaled, cutlass && scheme != Scheme::kDynamicGroup128);
  const auto [act_blk, out_blk] = run(grouped->get());
  EXPECT_STREQ((*experts)->last_path(), block     ? "fp8-cutlass-grouped-block"
                                        : scaled  ? "fp8-cutlass-grouped-scaled"
                                        : cutlass ? "fp8-cutlass-grouped"
                                                  : "fp8-per-expert-gemm");
  const std::vector<float> gu_blk = kernels::cuda_test::ToFloat(gate_up.ToHost());
  std::printf("  prefill %s %s\n", (*experts)->last_path(),
              block || scaled ? "ran" : "(no block or scaled form here)");

  // The CPU on the permuted rows: x gathered by token_of_row, each expert's rows through it.
  const std::vector<int32_t> o = offsets.ToHost(), tor = token_of_row.ToHost();
  ASSERT_EQ(o[E], rows);
  std::vector<float> x_rows(rows * H);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + tor[r] * H, H, x_rows.begin() + r * H);
  }
  const std::vector<float> gu_want = PerExpert(x_rows, H, gu_w, 2 * I, o);
  Compare(act_gemv, SiluMul(gu_want, rows, I), kActRel, kAccum, "GEMV act vs CPU");
  Compare(out_gemv, PerExpert(act_gemv, I, dn_w, H, o), kRound, kAccum,
          "GEMV down vs CPU on its act");
  Compare(gu_gemm, gu_want, kRound, kAccum, "GEMM gate_up vs CPU");
  Compare(act_gemm, SiluMul(gu_gemm, rows, I), kOneStep, 1e-6f, "GEMM act vs CPU on its gate_up");
  const std::vector<float> down_of_gemm_act = PerExpert(act_gemm, I, dn_w, H, o);
  Compare(out_gemm, down_of_gemm_act, kRound, kAccum, "GEMM down vs CPU on its act");
  Compare(gu_mma, gu_want, kRound, kAccum, "grouped MMA gate_up vs CPU");
  Compare(act_mma, SiluMul(gu_mma, rows, I), kOneStep, 1e-6f, "MMA act vs CPU on its gate_up");
  Compare(out_mma, PerExpert(act_mma, I, dn_w, H, o), kRound, kAccum,
          "grouped MMA down vs CPU on its act");
  Compare(gu_cut, gu_want, kRound, kAccum, "CUTLASS grouped gate_up vs CPU");
  Compare(act_cut, SiluMul(gu_cut, rows, I), kOneStep, 1e-6f, "CUTLASS act vs CPU on its gate_up");
  Compare(out_cut, PerExpert(act_cut, I, dn_w, H, o), kRound, kAccum,
          "CUTLASS grouped down vs CPU on its act");
  Compare(gu_blk, gu_want, kRound, kAccum, "CUTLASS block / scaled form gate_up vs CPU");
  Compare(act_blk, SiluMul(gu_blk, rows, I), kOneStep, 1e-6f, "CUTLASS block / scaled act vs CPU");
  Compare(out_blk, PerExpert(act_blk, I, dn_w, H, o), kRound, kAccum,
          "CUTLASS block / scaled form down vs CPU on its act");
  if (cutlass) {  // Hopper's FP8 MMA as cuBLASLt's block GEMM: the same bits are not promised
    (*experts)->set_cutlass_scales(Scales::kRow);  // out_cut's form again
    const auto [act_cut2, out_cut2] = run(grouped->get());
    EXPECT_TRUE(out_cut2 == out_cut) << "two CUTLASS prefill runs differ";
  }

  // GEMM against GEMV: act within the roundings of gate / up; the outputs differ by what the
  // down projection makes of the two act versions (computed on the CPU), and by nothing else.
  Compare(act_gemm, act_gemv, kActRel, kAccum, "act GEMM vs GEMV");
  PrintActDifference(act_gemm, act_gemv, rows, I, scheme);
  Compare(out_gemm, out_gemv, 1.6e-2f, 2e-2f, "out GEMM vs GEMV (old fixed tolerance)",
          /*check=*/false);
  const std::vector<float> quantized_difference =
      Minus(down_of_gemm_act, PerExpert(act_gemv, I, dn_w, H, o));
  std::printf("  CPU down(act GEMM) - down(act GEMV): up to %.3g = %.2e of max |out|\n",
              MaxAbs(quantized_difference), MaxAbs(quantized_difference) / MaxAbs(out_gemv));
  Compare(Minus(out_gemm, quantized_difference), out_gemv, 2 * kRound, 2 * kAccum,
          "out GEMM - that difference vs out GEMV");

  SharedMatchesCpu(**experts, **w, shared_gu, shared_dn, x, dx.get(), T, H, Is);
}

// `step` (enqueueing on s) captured in a CUDA graph (global capture mode: an illegal call fails
// the capture) and replayed twice over a poisoned `out`: each replay's bits are `eager`.
void CapturedReplaysMatch(const std::function<absl::Status()>& step, TestBuffer<bf16>& out,
                          const std::vector<bf16>& eager, cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status captured = step();
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaMemsetAsync(out.get(), 0xff, eager.size() * 2, s), cudaSuccess);  // NaNs
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<bf16> got = out.ToHost();
    EXPECT_EQ(std::memcmp(got.data(), eager.data(), got.size() * 2), 0) << "replay " << replay;
  }
  std::printf("  captured in a CUDA graph, replayed twice: bits vs eager checked\n");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A graph-size step (96 tokens, sync-free: no `grouped`) on TANDEM_MOE_FP8_DECODE's default
// kCutlass: the CUTLASS grouped GEMM where it serves (1 x 128 activations, both weight-scale
// forms; per-token or static activations on the scaled form), else (their kRow) MoeFp8GroupedMma.
// Eager on a non-default stream,
// then captured in a CUDA graph (global capture mode: an illegal call fails the capture) and
// replayed twice over poisoned outputs: the replays' bits are the eager run's; gate_up, act and
// down against the CPU on the GPU's own input of each stage. Below kCutlassDecodeMinTokens, and
// with kMma, MoeFp8GroupedMma.
void SyncFreeStepCaptured(Scheme scheme, CudaFp8MoeExperts::CutlassScales form, std::mt19937& rng,
                          int64_t swap_rows = CudaFp8MoeExperts::kCutlassSwapRows) {
  SCOPED_TRACE(SchemeName(scheme));
  const bool blocks = scheme == Scheme::kDynamicGroup128;
  ModelConfig c;
  c.hidden_size = 512;
  c.moe_intermediate_size = 384;  // k = 384 for down: ld 4 != 3, the block form's compact copy
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.quantization.activation = scheme;
  const int64_t T = 96, E = 16, k = 4, H = 512, I = 384, rows = T * k;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(E * 2 * I, H, blocks, scheme, rng, kStaticInput);
  layer.experts_down_fp8 = RandomFp8(E * H, I, blocks, scheme, rng, kStaticAct);
  const Fp8LinearWeight gu_w = layer.experts_gate_up_fp8, dn_w = layer.experts_down_fp8;
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, T);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> experts = CudaFp8MoeExperts::Create(c, T);
  ASSERT_TRUE(experts.ok()) << experts.status();
  (*experts)->set_cutlass_scales(form);
  (*experts)->set_cutlass_swap_rows(swap_rows);
  const std::vector<float> x = Bf16Rows(T * H, rng);
  std::vector<int32_t> ids(rows), pool;
  for (int32_t e = 0; e < E; ++e) {
    if (e != 5) pool.push_back(e);  // expert 5 gets no rows
  }
  for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token
    std::shuffle(pool.begin(), pool.end(), rng);
    std::copy_n(pool.begin(), k, ids.begin() + t * k);
  }
  TestBuffer<bf16> dx(kernels::cuda_test::Convert<bf16>(x)), rows_in(rows * H),
      gate_up(rows * 2 * I), act(rows * I), out(rows * H);
  TestBuffer<int32_t> d_ids(ids), offsets(E + 1), active(E), token_of_row(rows), row_of_pair(rows);
  const kernels::cuda::DeviceMoePermutation perm{offsets.get(), active.get(), token_of_row.get(),
                                                 row_of_pair.get()};
  ASSERT_TRUE(kernels::cuda::MoePermute(d_ids.get(), T, k, E, perm, nullptr, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto routed = [&](int64_t tokens) {
    return (*experts)->Routed(**w, dx.get(), tokens, perm, E, rows_in.get(), gate_up.get(),
                              act.get(), out.get(), nullptr, s, false);
  };
  const bool served = (*experts)->CutlassDecodeServes(**w, rows);
  const bool scaled = (*experts)->CutlassScaledFormServes(**w);
  EXPECT_EQ(scaled, !blocks && form == CudaFp8MoeExperts::CutlassScales::kBlock);
  EXPECT_EQ(served, (blocks || scaled) && (*experts)->CutlassPrefillServes(**w, rows))
      << "sync-free steps take CUTLASS with 1 x 128 activations or on the scaled form";
  const bool block = served && (*experts)->CutlassBlockScalesServe(**w);
  // 384 rows over 16 experts: 24 an expert, past kCutlassSwapRows (16) but within 32: swapped
  // where the test's bound is 32.
  const bool swapped = served && (*experts)->CutlassSwapServes(**w, rows, E);
  EXPECT_EQ(swapped, served && (scaled || block) && rows <= swap_rows * E);
  const char* want_path = block && swapped   ? "fp8-cutlass-grouped-block-swapped"
                          : block            ? "fp8-cutlass-grouped-block"
                          : swapped          ? "fp8-cutlass-grouped-swapped"
                          : served && scaled ? "fp8-cutlass-grouped-scaled"
                          : served           ? "fp8-cutlass-grouped"
                                             : "fp8-grouped-mma";
  std::printf("  %s, %d-token sync-free step: %s\n", SchemeName(scheme), static_cast<int>(T),
              want_path);
  if (blocks) {
    EXPECT_EQ(block, served && form == CudaFp8MoeExperts::CutlassScales::kBlock);
  }
  ASSERT_TRUE(routed(T).ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_STREQ((*experts)->last_path(), want_path);
  const std::vector<bf16> eager = out.ToHost();
  const std::vector<float> gu = kernels::cuda_test::ToFloat(gate_up.ToHost());
  const std::vector<float> a = kernels::cuda_test::ToFloat(act.ToHost());

  CapturedReplaysMatch([&] { return routed(T); }, out, eager, s);
  EXPECT_STREQ((*experts)->last_path(), want_path);

  const std::vector<int32_t> o = offsets.ToHost(), tor = token_of_row.ToHost();
  ASSERT_EQ(o[E], rows);
  std::vector<float> x_rows(rows * H);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + tor[r] * H, H, x_rows.begin() + r * H);
  }
  Compare(gu, PerExpert(x_rows, H, gu_w, 2 * I, o), kRound, kAccum, "sync-free gate_up vs CPU");
  Compare(a, SiluMul(gu, rows, I), kOneStep, 1e-6f, "sync-free act vs CPU on its gate_up");
  Compare(kernels::cuda_test::ToFloat(eager), PerExpert(a, I, dn_w, H, o), kRound, kAccum,
          "sync-free down vs CPU on its act");
  // With TANDEM_MOE_FP8_DECODE=mma, and below the bound: MoeFp8GroupedMma.
  (*experts)->set_decode(CudaFp8MoeExperts::Decode::kMma);
  ASSERT_TRUE(routed(T).ok());
  EXPECT_STREQ((*experts)->last_path(), "fp8-grouped-mma");
  (*experts)->set_decode(CudaFp8MoeExperts::Decode::kCutlass);
  const int64_t fewer = CudaFp8MoeExperts::kCutlassDecodeMinTokens - 1;
  ASSERT_TRUE(kernels::cuda::MoePermute(d_ids.get(), fewer, k, E, perm, nullptr, s).ok());
  ASSERT_TRUE(routed(fewer).ok());
  EXPECT_STREQ((*experts)->last_path(), fewer > E / k ? "fp8-grouped-mma" : "fp8-expert-gemv");
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

TEST(CudaMoeFp8Test, SyncFreeCutlassStepCapturedMatchesEagerAndTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed() + 3);
  using Scales = CudaFp8MoeExperts::CutlassScales;
  SyncFreeStepCaptured(Scheme::kDynamicGroup128, Scales::kBlock, rng);
  SyncFreeStepCaptured(Scheme::kDynamicGroup128, Scales::kRow, rng);
  // Per-token / static activations: the scaled form by default, MoeFp8GroupedMma under kRow.
  SyncFreeStepCaptured(Scheme::kDynamicToken, Scales::kBlock, rng);
  SyncFreeStepCaptured(Scheme::kStaticTensor, Scales::kBlock, rng);
  SyncFreeStepCaptured(Scheme::kDynamicToken, Scales::kRow, rng);
  SyncFreeStepCaptured(Scheme::kStaticTensor, Scales::kRow, rng);
  // The scaled and the block forms with their operands swapped (a bound of 32 rows an expert: this
  // step's 24).
  SyncFreeStepCaptured(Scheme::kDynamicToken, Scales::kBlock, rng, 32);
  SyncFreeStepCaptured(Scheme::kStaticTensor, Scales::kBlock, rng, 32);
  SyncFreeStepCaptured(Scheme::kDynamicGroup128, Scales::kBlock, rng, 32);
}

TEST(CudaMoeFp8Test, PerExpertGemmPrefillMatchesTheGemvs) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed());
  PrefillMatchesGemvs(Scheme::kDynamicGroup128, rng);
  PrefillMatchesGemvs(Scheme::kDynamicToken, rng);
  PrefillMatchesGemvs(Scheme::kStaticTensor, rng);
}

// Each (value, want) of `env`: Create reads it and `get` of the result returns want (a GPU:
// Create allocates); `env` unset after.
template <typename T, typename Get>
void ExpectEnvSelects(const ModelConfig& c, const char* env,
                      std::initializer_list<std::pair<const char*, T>> cases, Get get) {
  std::string why;
  if (::tandem::testing::GpuAvailable(&why)) {
    for (const auto& [name, want] : cases) {
      setenv(env, name, 1);
      absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> e = CudaFp8MoeExperts::Create(c, 16);
      ASSERT_TRUE(e.ok()) << env << "=" << name << ": " << e.status();
      EXPECT_EQ(get(**e), want) << env << "=" << name;
    }
  }
  unsetenv(env);
}

// TANDEM_MOE_FP8_PREFILL, _CUTLASS_SCALES, _DECODE, _CUTLASS_MIN_TOKENS and _CUTLASS_SWAP_ROWS:
// read at Create, unknown values refused (before any device work, so also without a GPU); each
// known value sets prefill(), cutlass_scales(), decode(), cutlass_decode_min_tokens(),
// cutlass_swap_rows().
TEST(CudaMoeFp8Test, PrefillSwitchFromTheEnvironment) {
  ModelConfig c;
  c.hidden_size = 256;
  c.moe_intermediate_size = 256;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  for (const auto& [env, bad] : {std::make_pair("TANDEM_MOE_FP8_PREFILL", "cublas"),
                                 std::make_pair("TANDEM_MOE_FP8_CUTLASS_SCALES", "blocks"),
                                 std::make_pair("TANDEM_MOE_FP8_DECODE", "gemv"),
                                 std::make_pair("TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS", "0"),
                                 std::make_pair("TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS", "-1")}) {
    setenv(env, bad, 1);
    EXPECT_EQ(CudaFp8MoeExperts::Create(c, 16).status().code(), absl::StatusCode::kInvalidArgument)
        << env << "=" << bad;
    unsetenv(env);
  }
  using E = CudaFp8MoeExperts;
  ExpectEnvSelects<E::CutlassScales>(
      c, "TANDEM_MOE_FP8_CUTLASS_SCALES",
      {{"row", E::CutlassScales::kRow}, {"block", E::CutlassScales::kBlock}},
      [](const E& e) { return e.cutlass_scales(); });
  ExpectEnvSelects<E::Prefill>(c, "TANDEM_MOE_FP8_PREFILL",
                               {{"cutlass", E::Prefill::kCutlass},
                                {"mma", E::Prefill::kMma},
                                {"per-expert", E::Prefill::kPerExpert}},
                               [](const E& e) { return e.prefill(); });
  ExpectEnvSelects<E::Decode>(c, "TANDEM_MOE_FP8_DECODE",
                              {{"cutlass", E::Decode::kCutlass}, {"mma", E::Decode::kMma}},
                              [](const E& e) { return e.decode(); });
  ExpectEnvSelects<int64_t>(c, "TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS", {{"32", 32}},
                            [](const E& e) { return e.cutlass_decode_min_tokens(); });
  ExpectEnvSelects<int64_t>(c, "TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS", {{"0", 0}, {"64", 64}},
                            [](const E& e) { return e.cutlass_swap_rows(); });
}

// One token (batch 1) with 128 x 128 blocks: weight_only (the default, set_w8a16_gemv) the
// routed experts' GEMVs and the shared experts read x and act as bf16 (no activation
// quantization), against the CPU with scheme kNone on the GPU's own input of each stage; off, the
// W8A8 GEMVs against the quantizing CPU reference, as before.
void OneTokenMatchesCpu(bool weight_only, std::mt19937& rng) {
  SCOPED_TRACE(weight_only ? "one token, W8A16" : "one token, W8A8");
  std::printf("%s\n", weight_only ? "one token, W8A16" : "one token, W8A8");
  ModelConfig c;
  c.hidden_size = 512;
  c.moe_intermediate_size = 384;            // 3 groups
  c.shared_expert_intermediate_size = 272;  // a partial last group
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  const int64_t T = 1, E = 8, k = 2, H = 512, I = 384, Is = 272, rows = T * k;
  const Scheme scheme = Scheme::kDynamicGroup128;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(E * 2 * I, H, true, scheme, rng);
  layer.experts_down_fp8 = RandomFp8(E * H, I, true, scheme, rng);
  layer.shared_gate_up_fp8 = RandomFp8(2 * Is, H, true, scheme, rng);
  layer.shared_down_fp8 = RandomFp8(H, Is, true, scheme, rng);
  Fp8LinearWeight gu_w = layer.experts_gate_up_fp8, dn_w = layer.experts_down_fp8;
  Fp8LinearWeight shared_gu = layer.shared_gate_up_fp8, shared_dn = layer.shared_down_fp8;
  for (Fp8LinearWeight* ref : {&gu_w, &dn_w, &shared_gu, &shared_dn}) {
    if (weight_only) ref->activation = Scheme::kNone;  // the reference of the W8A16 GEMVs
  }
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, T);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> experts = CudaFp8MoeExperts::Create(c, T);
  ASSERT_TRUE(experts.ok()) << experts.status();
  (*experts)->set_w8a16_gemv(weight_only);

  const std::vector<float> x = Bf16Rows(T * H, rng);
  const std::vector<int32_t> ids = {3, static_cast<int32_t>((4 + rng() % (E - 1)) % E)};
  TestBuffer<bf16> dx(kernels::cuda_test::Convert<bf16>(x)), act(rows * I), out(rows * H);
  TestBuffer<int32_t> d_ids(ids), offsets(E + 1), active(E), token_of_row(rows), row_of_pair(rows);
  const kernels::cuda::DeviceMoePermutation perm{offsets.get(), active.get(), token_of_row.get(),
                                                 row_of_pair.get()};
  ASSERT_TRUE(kernels::cuda::MoePermute(d_ids.get(), T, k, E, perm, nullptr, nullptr).ok());
  ASSERT_TRUE((*experts)
                  ->Routed(**w, dx.get(), T, perm, E, nullptr, nullptr, act.get(), out.get(),
                           nullptr, nullptr, true)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_STREQ((*experts)->last_path(), weight_only ? "fp8-expert-w8a16-gemv" : "fp8-expert-gemv");
  const std::vector<int32_t> o = offsets.ToHost(), tor = token_of_row.ToHost();
  ASSERT_EQ(o[E], rows);
  std::vector<float> x_rows(rows * H);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(x.begin() + tor[r] * H, H, x_rows.begin() + r * H);
  }
  const std::vector<float> got_act = kernels::cuda_test::ToFloat(act.ToHost());
  Compare(got_act, SiluMul(PerExpert(x_rows, H, gu_w, 2 * I, o), rows, I), kActRel, kAccum,
          "1-token act vs CPU");
  Compare(kernels::cuda_test::ToFloat(out.ToHost()), PerExpert(got_act, I, dn_w, H, o), kRound,
          kAccum, "1-token down vs CPU on its act");
  SharedMatchesCpu(**experts, **w, shared_gu, shared_dn, x, dx.get(), T, H, Is);
}

TEST(CudaMoeFp8Test, OneTokenWeightOnlyMatchesTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed() + 7);
  OneTokenMatchesCpu(/*weight_only=*/true, rng);
  OneTokenMatchesCpu(/*weight_only=*/false, rng);
}

// Expert parallelism: the rank's experts whole plus one all-zero expert (zero outputs).
TEST(CudaMoeFp8Test, ExpertParallelUploadAddsAZeroExpert) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(kernels::cuda_test::TestSeed());
  ModelConfig c;
  c.hidden_size = 128;
  c.moe_intermediate_size = 64;
  c.num_experts = 4;
  c.num_experts_per_tok = 1;
  absl::StatusOr<ExpertPlacement> placement = ExpertPlacement::Contiguous(4, 2);
  ASSERT_TRUE(placement.ok()) << placement.status();
  c.expert_placement = std::make_shared<const ExpertPlacement>(*placement);
  c.expert_rank = 1;
  LayerWeights layer;
  layer.experts_gate_up_fp8 = RandomFp8(2 * 2 * 64, 128, false, Scheme::kDynamicToken, rng);
  layer.experts_down_fp8 = RandomFp8(2 * 128, 64, false, Scheme::kDynamicToken, rng);
  absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> w = UploadFp8MoeWeights(c, &layer, 4);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ((*w)->gate_up.size(), 3u);
  ASSERT_EQ((*w)->down.size(), 3u);
  std::vector<uint8_t> host(2 * 64 * 128, 0xff);
  ASSERT_EQ(
      cudaMemcpy(host.data(), (*w)->gate_up[2].codes.data(), host.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<int64_t>(host.size()));
  // A stacked weight of the wrong size is refused, naming it.
  LayerWeights bad;
  bad.experts_gate_up_fp8 = RandomFp8(3 * 2 * 64, 128, false, Scheme::kDynamicToken, rng);
  bad.experts_down_fp8 = RandomFp8(2 * 128, 64, false, Scheme::kDynamicToken, rng);
  const absl::Status st = UploadFp8MoeWeights(c, &bad, 4).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("experts gate_up"), std::string::npos) << st;
}

}  // namespace
}  // namespace tandem::runtime::cuda
