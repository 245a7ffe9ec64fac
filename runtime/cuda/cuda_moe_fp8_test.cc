// CudaFp8MoeExperts (cuda_moe_fp8.h) on its paths for the same 300-token step: the prefill paths
// (TANDEM_MOE_FP8_PREFILL's: per-expert — the offsets read back, one CudaFp8Linear per expert:
// cuBLASLt's block-scaled or outer-vector FP8 GEMM on each expert's rows, the last m % 4 rows on
// the GEMV —, mma, and cutlass — kernels/moe/cutlass's grouped GEMM on sm_90, for every scheme
// here: per-token and static scales broadcast over its 128-column groups —, its weight scales
// per row and, for the 128 x 128 blocks, per block:
// TANDEM_MOE_FP8_CUTLASS_SCALES=block) and the FP8 expert GEMVs and the grouped FP8 MMA
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
#include "runtime/model/expert_placement.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;
template <typename T>
using TestBuffer = kernels::cuda_test::DeviceBuffer<T>;

// A stacked host FP8 weight [rows, cols] as the loader holds it: quantized in 128 x 128 blocks
// (DeepSeek; each block's scale written on its rows' 128-column groups) or per row.
// A static scheme's input scale: kStaticInput for the experts' inputs (x ~ N(0, 1), bf16),
// kStaticAct for their act rows; a value past 448 x it saturates (the CPU's and GPU's alike).
constexpr float kStaticInput = 5.0f / 448, kStaticAct = 16.0f / 448;

Fp8LinearWeight RandomFp8(int64_t rows, int64_t cols, bool blocks, Scheme scheme, std::mt19937& rng,
                          float input_scale = 0.0f) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = d(rng);
  Fp8LinearWeight f;
  f.grid = {rows, cols, 1, blocks ? 128 : cols};
  f.codes.resize(rows * cols);
  f.scales.resize(f.grid.NumScales());
  const kernels::Fp8ScaleGrid q = blocks ? kernels::Fp8ScaleGrid{rows, cols, 128, 128} : f.grid;
  std::vector<float> block_scales(q.NumScales());
  kernels::QuantizeWeight(w.data(), q, f.codes.data(), block_scales.data());
  const int64_t gc = f.grid.GridCols();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < gc; ++g) f.scales[r * gc + g] = block_scales[r / q.block_rows * gc + g];
  }
  f.activation = scheme;
  if (scheme == Scheme::kStaticTensor) f.input_scale = input_scale;
  return f;
}

const char* SchemeName(Scheme scheme) {
  switch (scheme) {
    case Scheme::kDynamicGroup128:
      return "128 x 128 blocks, 1 x 128 activations";
    case Scheme::kDynamicToken:
      return "per-channel, per-token";
    case Scheme::kStaticTensor:
      return "per-channel, static per-tensor activations";
    default:
      return "weight-only";
  }
}

std::vector<float> Bf16Rows(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(d(rng)));
  return v;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

float Bf16(float x) { return kernels::cuda_test::ToF(kernels::cuda_test::FromF<bf16>(x)); }

// Tolerances of a stage against the CPU fed the GPU's own input (fractions of |want| and of the
// tensor's max |want|):
// one bf16 rounding of the GPU's output (at most 2^-9 of it), with a factor 2 of margin;
constexpr float kRound = 0x1p-8f;
// SiLU(g) * u on the same bf16 g, u: expf against std::exp can move the result by one bf16 step;
constexpr float kOneStep = 0x1p-7f;
// act from fp32 gate / up sums of another order (GPU vs CPU, or GEMM vs GEMV): their bf16
// roundings can differ by a step, and SiLU(g) * u moves by up to ~|g| steps (moe_fp8_cuda_test's);
constexpr float kActRel = 1.6e-2f;
// accumulation: Hopper's FP8 MMA adds 32 products aligned to the largest with 13 fraction bits
// (fp8_gemm_cuda.h), at k = 512 at most 16 x 2^-11 of per-instruction magnitudes that stay far
// below the output's max for these Gaussian inputs; fp32 order noise on the CPU side.
constexpr float kAccum = 2e-3f;

// |got - want| <= rel * |want| + of_max * max |want| everywhere; prints the largest deviation (as
// a fraction of max |want| and of the tolerance) and how many elements exceed it. `check`: fail
// on an excess (else the line is a diagnostic only).
void Compare(const std::vector<float>& got, const std::vector<float>& want, float rel, float of_max,
             const std::string& what, bool check = true) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const float max_abs = MaxAbs(want);
  ASSERT_GT(max_abs, 0.0f) << what;
  double worst_dev = 0, worst_ratio = 0;
  size_t at = 0;
  int64_t over = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double dev = std::abs(double(got[i]) - want[i]);
    const double ratio = dev / (rel * std::abs(want[i]) + of_max * max_abs);
    worst_dev = std::max(worst_dev, dev);
    if (ratio > worst_ratio) worst_ratio = ratio, at = i;
    over += ratio > 1.0 ? 1 : 0;
  }
  std::printf("  %-44s max|dev| %.3g = %.2e of max %.3g; worst dev/tol %.3f; %lld of %zu over%s\n",
              what.c_str(), worst_dev, worst_dev / max_abs, max_abs, worst_ratio,
              static_cast<long long>(over), want.size(), check ? "" : " (diagnostic)");
  if (check) {
    EXPECT_EQ(over, 0) << what << ": worst element " << at << " got " << got[at] << " want "
                       << want[at] << " (tolerance " << rel << " |want| + " << of_max << " max)";
  }
}

// The permuted rows [o[e], o[e + 1]) of in [rows, k] through expert e's n rows of the stacked
// weight `all`: cpu::Fp8Linear (the activations quantized as the weight's scheme says), [rows, n].
std::vector<float> PerExpert(const std::vector<float>& in, int64_t k, const Fp8LinearWeight& all,
                             int64_t n, const std::vector<int32_t>& o) {
  std::vector<float> out(static_cast<size_t>(o.back()) * n);
  for (size_t e = 0; e + 1 < o.size(); ++e) {
    if (o[e + 1] == o[e]) continue;
    const Fp8LinearWeight w = Fp8Rows(all, static_cast<int64_t>(e) * n, n);
    EXPECT_TRUE(kernels::cpu::Fp8Linear(in.data() + o[e] * k, w.View(), nullptr, o[e + 1] - o[e],
                                        out.data() + o[e] * n, nullptr)
                    .ok());
  }
  return out;
}

// SiLU(gate) * up of gu [rows, 2 * I] (per row gate, then up) as the kernels round: gate and up to
// bf16 first (a no-op on the GEMM's bf16 output; the GEMV rounds its fp32 sums), the result too.
std::vector<float> SiluMul(const std::vector<float>& gu, int64_t rows, int64_t I) {
  std::vector<float> a(rows * I);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < I; ++j) {
      const float g = Bf16(gu[r * 2 * I + j]), u = Bf16(gu[r * 2 * I + I + j]);
      a[r * I + j] = Bf16(g / (1.0f + std::exp(-g)) * u);
    }
  }
  return a;
}

std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// How the two paths' act rows differ: elements, and activation scales (per row or 1 x 128 group)
// that the down projection's quantization gives them (kernels::QuantizeActivations, the GPU's
// rule).
void PrintActDifference(const std::vector<float>& a, const std::vector<float>& b, int64_t rows,
                        int64_t I, Scheme scheme) {
  const int64_t n_scales = kernels::NumActivationScales(scheme, rows, I);
  std::vector<uint8_t> ca(rows * I), cb(rows * I);
  std::vector<float> sa(n_scales), sb(n_scales);
  kernels::QuantizeActivations(a.data(), rows, I, scheme, 0.0f, ca.data(), sa.data());
  kernels::QuantizeActivations(b.data(), rows, I, scheme, 0.0f, cb.data(), sb.data());
  int64_t values = 0, scales = 0, codes = 0;
  for (size_t i = 0; i < a.size(); ++i) values += a[i] != b[i] ? 1 : 0;
  for (int64_t i = 0; i < n_scales; ++i) scales += sa[i] != sb[i] ? 1 : 0;
  for (size_t i = 0; i < ca.size(); ++i) codes += ca[i] != cb[i] ? 1 : 0;
  std::printf(
      "  act GEMM vs GEMV: %lld of %zu bf16 values differ; down's activation scales: "
      "%lld of %lld differ; e4m3 codes: %lld differ\n",
      static_cast<long long>(values), a.size(), static_cast<long long>(scales),
      static_cast<long long>(n_scales), static_cast<long long>(codes));
}

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
// kCutlass: the CUTLASS grouped GEMM where it serves (1 x 128 activations; both weight-scale
// forms), else (per-token or static activations) MoeFp8GroupedMma. Eager on a non-default stream,
// then captured in a CUDA graph (global capture mode: an illegal call fails the capture) and
// replayed twice over poisoned outputs: the replays' bits are the eager run's; gate_up, act and
// down against the CPU on the GPU's own input of each stage. Below kCutlassDecodeMinTokens, and
// with kMma, MoeFp8GroupedMma.
void SyncFreeStepCaptured(Scheme scheme, CudaFp8MoeExperts::CutlassScales form, std::mt19937& rng) {
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
  EXPECT_EQ(served, blocks && (*experts)->CutlassPrefillServes(**w, rows))
      << "sync-free steps take CUTLASS with 1 x 128 activations only";
  const bool block = served && (*experts)->CutlassBlockScalesServe(**w);
  const char* want_path = block    ? "fp8-cutlass-grouped-block"
                          : served ? "fp8-cutlass-grouped"
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
  SyncFreeStepCaptured(Scheme::kDynamicToken, Scales::kBlock, rng);
  SyncFreeStepCaptured(Scheme::kStaticTensor, Scales::kBlock, rng);
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

// TANDEM_MOE_FP8_PREFILL, _CUTLASS_SCALES, _DECODE and _CUTLASS_MIN_TOKENS: read at Create,
// unknown values refused (before any device work, so also without a GPU); each known value sets
// prefill(), cutlass_scales(), decode(), cutlass_decode_min_tokens().
TEST(CudaMoeFp8Test, PrefillSwitchFromTheEnvironment) {
  ModelConfig c;
  c.hidden_size = 256;
  c.moe_intermediate_size = 256;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  for (const auto& [env, bad] : {std::make_pair("TANDEM_MOE_FP8_PREFILL", "cublas"),
                                 std::make_pair("TANDEM_MOE_FP8_CUTLASS_SCALES", "blocks"),
                                 std::make_pair("TANDEM_MOE_FP8_DECODE", "gemv"),
                                 std::make_pair("TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS", "0")}) {
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
