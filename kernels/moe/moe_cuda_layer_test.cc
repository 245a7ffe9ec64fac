// The CUDA MoE expert and combine kernels against the CPU reference (moe.h) on fresh random
// inputs (routing and permutation: moe_cuda_test.cc):
//   * The whole routed layer (route, permute, experts, combine) on the decode GEMVs and on the
//     padded strided-batched GEMM and on the grouped GEMM (grouped and per-expert cuBLAS calls)
//     against FusedMoe in fp32 on the same rounded inputs, with and without a (sigmoid-gated)
//     shared expert; widths that are and are not multiples of 8 (vector and element loads);
//     also on MoeGroupedMma and (sm_90) MoeGroupedWgmma (widths multiples of 8), every path
//     combined by MoeCombine and by MoeCombineSplit.
//   * MoeGroupedMma and MoeGroupedWgmma alone against an fp64 per-row product: uneven and empty
//     experts, one expert taking every row (several m-tiles), n / k not multiples of the tiles,
//     both tile shapes of each, with and without the row gather; bf16 and fp16; for the wgmma
//     kernel also more tiles than SMs (persistent CTAs walking several) and a long k.
//   * MoeCombineSplit equal to MoeCombine bit for bit (no gated shared expert), within the
//     gate's rounding with one (out aliasing x), odd widths (element loads), top-k 1 to 20.
//   * The decode layer with MoeRouteAndPermute, the PDL-launched GEMVs and split combine, eager
//     and as a replayed CUDA graph, against FusedMoe.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_test_util.h"
#include "kernels/moe/moe_gemm_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using cuda_test::DeviceBuffer;
using moe_cuda_test::DevicePerm;
using moe_cuda_test::DeviceRouting;
using moe_cuda_test::MakePerm;
using moe_cuda_test::Normal;
using moe_cuda_test::Poison;
using moe_cuda_test::RouteOnDevice;
using moe_cuda_test::SpreadLogits;

// kWgmmaGlu: MoeGroupedWgmmaGateUpSilu (SiLU * up in gate_up's epilogue), then MoeGroupedWgmma.
enum class Path { kGemv, kPadded, kGrouped, kPerExpert, kMma, kWgmma, kWgmmaGlu };

// MoeGroupedMma's signature (MoeGroupedWgmma has the same).
template <typename T>
using GroupedFn = absl::Status (*)(const T*, const int32_t*, const T*, const int32_t*, int64_t,
                                   int64_t, int64_t, int64_t, T*, cudaStream_t);

// MoeGroupedWgmma with a named producer (MoeWgmmaProducer) and schedule, as a GroupedFn.
template <typename T, MoeWgmmaProducer kProducer,
          MoeWgmmaSchedule kSchedule = MoeWgmmaSchedule::kCooperative>
absl::Status WgmmaWith(const T* a, const int32_t* a_row_index, const T* w, const int32_t* offsets,
                       int64_t num_experts, int64_t rows, int64_t n, int64_t k, T* out,
                       cudaStream_t stream) {
  return MoeGroupedWgmmaWith<T>(kProducer, kSchedule, a, a_row_index, w, offsets, num_experts, rows,
                                n, k, out, stream);
}

// MoeCombineSplit launched plainly, with MoeCombine's signature.
template <typename T>
absl::Status SplitCombine(const T* expert_out, const float* weights, const int32_t* row_of_pair,
                          int64_t tokens, int64_t k, int64_t hidden, const T* shared,
                          const T* shared_gate, const T* x, T* out, cudaStream_t stream) {
  return MoeCombineSplit<T>(expert_out, weights, row_of_pair, tokens, k, hidden, shared,
                            shared_gate, x, out, stream);
}

// The routed layer (+ optional shared expert) on the device along `path`, as T values.
template <typename T>
std::vector<float> LayerOnDevice(Path path, const std::vector<float>& x,
                                 const std::vector<float>& logits, const MoeExpertWeights& w,
                                 int64_t tokens, int64_t k, const std::vector<float>& shared,
                                 const std::vector<float>& shared_gate, bool split_combine) {
  const int64_t E = w.num_experts, H = w.hidden, I = w.intermediate, rows = tokens * k;
  DeviceBuffer<T> dx(cuda_test::Convert<T>(x));
  DeviceBuffer<T> gate_up(
      cuda_test::Convert<T>(std::vector<float>(w.gate_up, w.gate_up + E * 2 * I * H)));
  DeviceBuffer<T> down(cuda_test::Convert<T>(std::vector<float>(w.down, w.down + E * H * I)));
  GroupedRoutingParams p;
  p.num_experts = E;
  p.top_k = k;
  p.renormalize = true;
  const DeviceRouting routing = RouteOnDevice(logits, tokens, p, {});
  DevicePerm perm = MakePerm(E, rows);
  EXPECT_TRUE(MoePermute(routing.ids.get(), tokens, k, E, perm.view(), nullptr, nullptr).ok());
  // Row buffers for the permuted batch or the E x T padded one, whichever is larger.
  const int64_t most = std::max(rows, E * tokens);
  DeviceBuffer<T> xs(most * H), gu(most * 2 * I), act(most * I), eout(most * H), out(tokens * H);
  DeviceBuffer<int32_t> padded_rows(rows);
  const int32_t* row_map = perm.row_of_pair.get();
  auto gemm = MoeGroupedGemm::Create(E);
  EXPECT_TRUE(gemm.ok());
  const auto dt =
      std::is_same_v<T, __half> ? MoeGroupedGemm::Dtype::kFp16 : MoeGroupedGemm::Dtype::kBf16;
  if (path == Path::kGemv) {
    EXPECT_TRUE(MoeExpertGemvGateUp<T>(dx.get(), gate_up.get(), H, I, perm.view(), E, rows,
                                       act.get(), nullptr)
                    .ok());
    EXPECT_TRUE(
        MoeExpertGemvDown<T>(act.get(), down.get(), H, I, perm.view(), E, rows, eout.get(), nullptr)
            .ok());
  } else if (path == Path::kPadded) {  // one strided-batched GEMM per projection, cap = T
    EXPECT_TRUE(MoePadRows<T>(dx.get(), H, routing.ids.get(), perm.view(), E, rows, tokens,
                              xs.get(), padded_rows.get(), nullptr)
                    .ok());
    EXPECT_TRUE((*gemm)
                    ->RunPadded(xs.get(), gate_up.get(), E, tokens, 2 * I, H, gu.get(), dt, nullptr)
                    .ok());
    EXPECT_TRUE(MoeSiluAndMul<T>(gu.get(), E * tokens, I, act.get(), nullptr).ok());
    EXPECT_TRUE(
        (*gemm)->RunPadded(act.get(), down.get(), E, tokens, H, I, eout.get(), dt, nullptr).ok());
    row_map = padded_rows.get();
  } else if (path == Path::kMma || path == Path::kWgmma) {  // gather folded into gate_up
    const GroupedFn<T> grouped = path == Path::kMma ? MoeGroupedMma<T> : MoeGroupedWgmma<T>;
    EXPECT_TRUE(grouped(dx.get(), perm.token_of_row.get(), gate_up.get(), perm.offsets.get(), E,
                        rows, 2 * I, H, gu.get(), nullptr)
                    .ok());
    EXPECT_TRUE(MoeSiluAndMul<T>(gu.get(), rows, I, act.get(), nullptr).ok());
    EXPECT_TRUE(grouped(act.get(), nullptr, down.get(), perm.offsets.get(), E, rows, H, I,
                        eout.get(), nullptr)
                    .ok());
  } else if (path == Path::kWgmmaGlu) {
    EXPECT_TRUE(MoeGroupedWgmmaGateUpSilu<T>(dx.get(), perm.token_of_row.get(), gate_up.get(),
                                             perm.offsets.get(), E, rows, I, H, act.get(), nullptr)
                    .ok());
    EXPECT_TRUE(MoeGroupedWgmma<T>(act.get(), nullptr, down.get(), perm.offsets.get(), E, rows, H,
                                   I, eout.get(), nullptr)
                    .ok());
  } else {
    const auto mode =
        path == Path::kGrouped ? MoeGroupedGemm::Mode::kGrouped : MoeGroupedGemm::Mode::kPerExpert;
    EXPECT_TRUE(
        MoeGatherRows<T>(dx.get(), H, perm.token_of_row.get(), rows, xs.get(), nullptr).ok());
    EXPECT_TRUE((*gemm)->ReadOffsets(perm.offsets.get(), E, nullptr).ok());
    EXPECT_TRUE(
        (*gemm)->Run(xs.get(), gate_up.get(), 2 * I, H, gu.get(), dt, 0, mode, nullptr).ok());
    EXPECT_TRUE(MoeSiluAndMul<T>(gu.get(), rows, I, act.get(), nullptr).ok());
    EXPECT_TRUE((*gemm)->Run(act.get(), down.get(), H, I, eout.get(), dt, 1, mode, nullptr).ok());
  }
  DeviceBuffer<T> dshared(cuda_test::Convert<T>(shared)), dgate(cuda_test::Convert<T>(shared_gate));
  const auto combine = split_combine ? SplitCombine<T> : MoeCombine<T>;
  EXPECT_TRUE(combine(eout.get(), routing.weights.get(), row_map, tokens, k, H,
                      shared.empty() ? nullptr : dshared.get(),
                      shared_gate.empty() ? nullptr : dgate.get(), dx.get(), out.get(), nullptr)
                  .ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return cuda_test::ToFloat(out.ToHost());
}

template <typename T>
void CheckLayer(int64_t tokens, int64_t E, int64_t k, int64_t H, int64_t I, bool with_shared,
                std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "T " << tokens << " E " << E << " k " << k << " H " << H
                                    << " I " << I << " shared " << with_shared);
  std::vector<float> x = Normal(tokens * H, 1.0f, rng);
  std::vector<float> gate_up = Normal(E * 2 * I * H, 0.2f, rng);
  std::vector<float> down = Normal(E * H * I, 0.2f, rng);
  cuda_test::RoundTo<T>(x);
  cuda_test::RoundTo<T>(gate_up);
  cuda_test::RoundTo<T>(down);
  const std::vector<float> logits = SpreadLogits(tokens, E, rng);
  std::vector<float> shared, shared_gate;
  if (with_shared) {
    shared = Normal(tokens * H, 1.0f, rng);
    shared_gate = Normal(H, 0.1f, rng);
    cuda_test::RoundTo<T>(shared);
    cuda_test::RoundTo<T>(shared_gate);
  }
  const MoeExpertWeights w{gate_up.data(), down.data(), E, H, I};
  MoeRouting routing;
  ASSERT_TRUE(cpu::SoftmaxTopK(logits.data(), tokens, {E, k, true}, &routing).ok());
  std::vector<float> want(tokens * H);
  MoeScratch scratch;
  ASSERT_TRUE(cpu::FusedMoe(x.data(), routing, w, want.data(), nullptr, &scratch).ok());
  if (with_shared) {
    cpu::AddSigmoidGated(x.data(), shared_gate.data(), shared.data(), tokens, H, want.data());
  }
  double max_want = 0.0;
  for (float v : want) max_want = std::max(max_want, double{std::abs(v)});
  // Gate, up, SiLU*up and each expert's output are rounded to T once each on the device.
  const double tol = (std::is_same_v<T, __half> ? 4e-3 : 3e-2) * max_want;
  std::vector<Path> paths = {Path::kGemv, Path::kPadded, Path::kGrouped, Path::kPerExpert};
  if (H % 8 == 0 && I % 8 == 0) paths.push_back(Path::kMma);
  if (MoeGroupedWgmmaSupported(nullptr, nullptr, 2 * I, H) &&
      MoeGroupedWgmmaSupported(nullptr, nullptr, H, I)) {
    paths.push_back(Path::kWgmma);
    if (I % 8 == 0) paths.push_back(Path::kWgmmaGlu);
  }
  for (Path path : paths) {
    for (bool split : {false, true}) {
      const std::vector<float> got =
          LayerOnDevice<T>(path, x, logits, w, tokens, k, shared, shared_gate, split);
      for (int64_t i = 0; i < tokens * H; ++i) {
        ASSERT_LE(std::abs(double{got[i]} - want[i]), tol)
            << "path " << static_cast<int>(path) << " split " << split << " element " << i
            << " of max " << max_want;
      }
    }
  }
}

TEST(MoeCudaTest, LayerMatchesCpuFusedMoe) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckLayer<__nv_bfloat16>(1, 8, 2, 128, 64, false, rng);     // decode, M = 1 rows
  CheckLayer<__nv_bfloat16>(5, 16, 4, 64, 12, true, rng);      // element loads on down
  CheckLayer<__half>(37, 6, 2, 40, 24, true, rng);             // uneven experts
  CheckLayer<__nv_bfloat16>(300, 32, 8, 128, 32, false, rng);  // 8-row chunks
  CheckLayer<__half>(3, 64, 8, 72, 20, false, rng);            // most experts empty
}

// A grouped GEMM's inputs over explicit expert row counts, random and rounded to T: a [src rows,
// k] (37 rows, read through `index`, when gathered), w [E, n, k], and their device copies.
template <typename T>
struct GroupedInputs {
  int64_t rows;
  std::vector<int32_t> offsets, index;
  std::vector<float> a, w;
  DeviceBuffer<T> da, dw;
  DeviceBuffer<int32_t> doffsets, dindex;
};

template <typename T>
GroupedInputs<T> MakeGroupedInputs(const std::vector<int32_t>& counts, int64_t n, int64_t k,
                                   bool gather, std::mt19937& rng) {
  const int64_t E = static_cast<int64_t>(counts.size());
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int64_t rows = offsets[E], src_rows = gather ? 37 : rows;
  std::vector<float> a = Normal(std::max<int64_t>(src_rows, 1) * k, 1.0f, rng);
  std::vector<float> w = Normal(E * n * k, 0.1f, rng);
  cuda_test::RoundTo<T>(a);
  cuda_test::RoundTo<T>(w);
  std::vector<int32_t> index(std::max<int64_t>(rows, 1));
  for (int32_t& i : index) i = std::uniform_int_distribution<int32_t>(0, 36)(rng);
  DeviceBuffer<T> da(cuda_test::Convert<T>(a)), dw(cuda_test::Convert<T>(w));
  DeviceBuffer<int32_t> doffsets(offsets), dindex(index);
  return {rows,
          offsets,
          index,
          std::move(a),
          std::move(w),
          std::move(da),
          std::move(dw),
          std::move(doffsets),
          std::move(dindex)};
}

// MoeGroupedMma on explicit expert row counts against an fp64 product of the same rounded
// inputs: out[r] = a[src(r)] . w[e]^T for r in expert e's rows.
template <typename T>
void CheckGroupedMma(const std::vector<int32_t>& counts, int64_t n, int64_t k, bool gather,
                     std::mt19937& rng, GroupedFn<T> grouped = MoeGroupedMma<T>) {
  const int64_t E = static_cast<int64_t>(counts.size());
  const GroupedInputs<T> in = MakeGroupedInputs<T>(counts, n, k, gather, rng);
  const int64_t rows = in.rows;
  const std::vector<int32_t>& offsets = in.offsets;
  const std::vector<int32_t>& index = in.index;
  const std::vector<float>&a = in.a, &w = in.w;
  SCOPED_TRACE(::testing::Message() << "E " << E << " rows " << rows << " n " << n << " k " << k
                                    << " gather " << gather);
  DeviceBuffer<T> out(std::max<int64_t>(rows, 1) * n);
  TANDEM_CUDA_CHECK(cudaMemset(out.get(), 0xff, std::max<int64_t>(rows, 1) * n * sizeof(T)));
  // `rows` + 5 as the host bound: a bound above the routed rows is allowed.
  ASSERT_TRUE(grouped(in.da.get(), gather ? in.dindex.get() : nullptr, in.dw.get(),
                      in.doffsets.get(), E, rows + 5, n, k, out.get(), nullptr)
                  .ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda_test::ToFloat(out.ToHost());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const float* ar = a.data() + (gather ? index[r] : r) * k;
      for (int64_t c = 0; c < n; ++c) {
        const float* wr = w.data() + (e * n + c) * k;
        double want = 0.0, mag = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          want += double{ar[i]} * wr[i];
          mag += std::abs(double{ar[i]} * wr[i]);
        }
        // One rounding to T of the fp32 sum (bf16: 2^-8 relative) plus fp32 accumulation.
        const double tol = (std::is_same_v<T, __half> ? 1e-3 : 8e-3) * std::abs(want) + 1e-4 * mag;
        ASSERT_NEAR(got[r * n + c], want, tol) << "expert " << e << " row " << r << " col " << c;
      }
    }
  }
}

TEST(MoeCudaTest, GroupedMmaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  // Uneven with empty experts (64-row tiles: rows <= 64 * E), odd n / k.
  CheckGroupedMma<__nv_bfloat16>({3, 0, 70, 1, 0, 0, 129, 5}, 72, 200, true, rng);
  CheckGroupedMma<__half>({3, 0, 70, 1, 0, 0, 129, 5}, 136, 64, false, rng);
  // One expert taking every row (128-row tiles, several m-tiles), the others empty.
  CheckGroupedMma<__nv_bfloat16>({0, 0, 300, 0}, 256, 136, true, rng);
  CheckGroupedMma<__half>({300, 0, 0, 0}, 8, 8, false, rng);
  // Many experts (more than one 32-expert scan chunk), most empty, the last one used.
  std::vector<int32_t> many(160, 0);
  for (int e : {0, 31, 32, 33, 95, 159}) many[e] = 1 + e % 7;
  CheckGroupedMma<__nv_bfloat16>(many, 40, 96, true, rng);
  CheckGroupedMma<__nv_bfloat16>(std::vector<int32_t>(5, 0), 16, 16, false, rng);  // no rows
  // Unsupported widths refused.
  DeviceBuffer<__nv_bfloat16> buf(64);
  DeviceBuffer<int32_t> offs(std::vector<int32_t>{0, 1});
  EXPECT_FALSE(MoeGroupedMma<__nv_bfloat16>(buf.get(), nullptr, buf.get(), offs.get(), 1, 1, 12, 8,
                                            buf.get(), nullptr)
                   .ok());
}

// MoeGroupedWgmma (sm_90 only) on MoeGroupedMma's cases, and on grids of more tiles than SMs
// (each persistent CTA walking several tiles, the ring wrapping across tiles) in both tile shapes,
// with every producer under the cooperative schedule and the TMA producers under ping-pong (its
// warpgroups taking turns: several tiles a warpgroup with k of 1 to 17 ring stages; 128-row tiles
// of <= 64 rows, whose second half's MMAs are skipped) and on 128 x 256 tiles (n off the tile,
// tiles whose second warpgroup has no rows).
TEST(MoeCudaTest, GroupedWgmmaMatchesCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!MoeGroupedWgmmaSupported(nullptr, nullptr, 8, 8)) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 rng(cuda_test::TestSeed());
  // Every producer (the results are the same, the stage loading and publishing differ), then the
  // ping-pong schedule.
  using P = MoeWgmmaProducer;
  constexpr MoeWgmmaSchedule kPp = MoeWgmmaSchedule::kPingPong;
  constexpr MoeWgmmaSchedule kWide = MoeWgmmaSchedule::kCooperative128x256;
  using bf16 = __nv_bfloat16;
  const std::pair<GroupedFn<bf16>, GroupedFn<__half>> producers[] = {
      {WgmmaWith<bf16, P::kWaitGroup>, WgmmaWith<__half, P::kWaitGroup>},
      {WgmmaWith<bf16, P::kArriveNoinc>, WgmmaWith<__half, P::kArriveNoinc>},
      {WgmmaWith<bf16, P::kTmaWeights>, WgmmaWith<__half, P::kTmaWeights>},
      {WgmmaWith<bf16, P::kTmaOperands>, WgmmaWith<__half, P::kTmaOperands>},
      {WgmmaWith<bf16, P::kTmaWeights, kPp>, WgmmaWith<__half, P::kTmaWeights, kPp>},
      {WgmmaWith<bf16, P::kTmaOperands, kPp>, WgmmaWith<__half, P::kTmaOperands, kPp>},
      {WgmmaWith<bf16, P::kTmaWeights, kWide>, WgmmaWith<__half, P::kTmaWeights, kWide>},
      {WgmmaWith<bf16, P::kTmaOperands, kWide>, WgmmaWith<__half, P::kTmaOperands, kWide>}};
  for (size_t i = 0; i < std::size(producers); ++i) {
    SCOPED_TRACE(::testing::Message() << "producer / schedule " << i);
    const auto [bf, fp] = producers[i];
    // Uneven with empty experts (64 x 256 tiles: rows <= 64 * E), odd n / k.
    CheckGroupedMma<__nv_bfloat16>({3, 0, 70, 1, 0, 0, 129, 5}, 72, 200, true, rng, bf);
    CheckGroupedMma<__half>({3, 0, 70, 1, 0, 0, 129, 5}, 136, 64, false, rng, fp);
    // One expert taking every row (128 x 128 tiles, several m-tiles), the others empty.
    CheckGroupedMma<__nv_bfloat16>({0, 0, 300, 0}, 256, 136, true, rng, bf);
    CheckGroupedMma<__half>({300, 0, 0, 0}, 8, 8, false, rng, fp);
    // Many experts, most empty; long k (the ring wraps inside one tile); no rows at all.
    std::vector<int32_t> many(160, 0);
    for (int e : {0, 31, 32, 33, 95, 159}) many[e] = 1 + e % 7;
    CheckGroupedMma<__nv_bfloat16>(many, 40, 96, true, rng, bf);
    CheckGroupedMma<__nv_bfloat16>({40, 0, 17}, 128, 1032, true, rng, bf);
    CheckGroupedMma<__nv_bfloat16>(std::vector<int32_t>(5, 0), 16, 16, false, rng, bf);
    // More tiles than SMs: 64 experts of 0-60 rows (64 x 256 tiles), 8 of 100-400 (128 x 128).
    std::vector<int32_t> small(64), large(8);
    for (int32_t& c : small) c = std::uniform_int_distribution<int32_t>(0, 60)(rng);
    for (int32_t& c : large) c = std::uniform_int_distribution<int32_t>(100, 400)(rng);
    CheckGroupedMma<__nv_bfloat16>(small, 1024, 128, true, rng, bf);
    CheckGroupedMma<__half>(large, 1152, 192, false, rng, fp);
    // ~3 tiles a CTA (~400 on 132 SMs) with one ring stage each (k = 64; under ping-pong the ring's
    // stages change hands every tile), expert ends at every offset inside a 128-row tile.
    std::vector<int32_t> mixed(13);
    for (int32_t& c : mixed) c = std::uniform_int_distribution<int32_t>(129, 255)(rng);
    CheckGroupedMma<__nv_bfloat16>(mixed, 2048, 64, true, rng, bf);
  }
  // The ping-pong and 128 x 256 schedules are built with the TMA producers only.
  DeviceBuffer<bf16> buf(64);
  DeviceBuffer<int32_t> offs(std::vector<int32_t>{0, 1});
  for (const MoeWgmmaSchedule schedule : {kPp, kWide}) {
    EXPECT_FALSE(MoeGroupedWgmmaWith<bf16>(P::kArriveNoinc, schedule, buf.get(), nullptr, buf.get(),
                                           offs.get(), 1, 1, 8, 8, buf.get(), nullptr)
                     .ok());
  }
}

// MoeGroupedWgmmaGateUpSilu on explicit expert row counts: bit for bit the unfused pair (the same
// producer's kCooperative128x256 gate_up, then MoeSiluAndMul) and, against an fp64 product of the
// same rounded inputs, act[r, j] = silu(g) * u with g / u = a[src(r)] . gate_up[e, j] / [e, I + j].
template <typename T>
void CheckGateUpSilu(const std::vector<int32_t>& counts, int64_t inter, int64_t k, bool gather,
                     MoeWgmmaProducer producer, std::mt19937& rng) {
  const int64_t E = static_cast<int64_t>(counts.size()), n = 2 * inter;
  const GroupedInputs<T> in = MakeGroupedInputs<T>(counts, n, k, gather, rng);
  const int64_t rows = in.rows;
  const std::vector<int32_t>& offsets = in.offsets;
  const std::vector<float>&a = in.a, &w = in.w;
  SCOPED_TRACE(::testing::Message()
               << "E " << E << " rows " << rows << " inter " << inter << " k " << k << " gather "
               << gather << " producer " << static_cast<int>(producer));
  DeviceBuffer<T> act(std::max<int64_t>(rows, 1) * inter), gu(std::max<int64_t>(rows, 1) * n),
      act_ref(std::max<int64_t>(rows, 1) * inter);
  Poison(act);
  const int32_t* src = gather ? in.dindex.get() : nullptr;
  ASSERT_TRUE(MoeGroupedWgmmaGateUpSilu<T>(in.da.get(), src, in.dw.get(), in.doffsets.get(), E,
                                           rows + 5, inter, k, act.get(), nullptr, producer)
                  .ok());
  ASSERT_TRUE(MoeGroupedWgmmaWith<T>(producer, MoeWgmmaSchedule::kCooperative128x256, in.da.get(),
                                     src, in.dw.get(), in.doffsets.get(), E, rows + 5, n, k,
                                     gu.get(), nullptr)
                  .ok());
  ASSERT_TRUE(MoeSiluAndMul<T>(gu.get(), rows, inter, act_ref.get(), nullptr).ok());
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = cuda_test::ToFloat(act.ToHost());
  const std::vector<float> unfused = cuda_test::ToFloat(act_ref.ToHost());
  // One rounding of g and u to T each (bf16: 2^-8 relative), of the product, fp32 accumulation.
  const double eps = std::is_same_v<T, __half> ? 1e-3 : 8e-3;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const float* ar = a.data() + (gather ? in.index[r] : r) * k;
      for (int64_t j = 0; j < inter; ++j) {
        ASSERT_EQ(got[r * inter + j], unfused[r * inter + j]) << "row " << r << " col " << j;
        const float* wg = w.data() + (e * n + j) * k;
        const float* wu = wg + inter * k;
        double g = 0.0, u = 0.0, mag_g = 0.0, mag_u = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          g += double{ar[i]} * wg[i];
          u += double{ar[i]} * wu[i];
          mag_g += std::abs(double{ar[i]} * wg[i]);
          mag_u += std::abs(double{ar[i]} * wu[i]);
        }
        const double want = g / (1.0 + std::exp(-g)) * u;
        const double tol =
            eps * 3.0 * std::abs(g * u) + 2e-4 * (std::abs(u) * mag_g + std::abs(g) * mag_u) + 1e-6;
        ASSERT_NEAR(got[r * inter + j], want, tol)
            << "expert " << e << " row " << r << " col " << j;
      }
    }
  }
}

TEST(MoeCudaTest, GroupedWgmmaGateUpSiluMatchesCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  if (!MoeGroupedWgmmaSupported(nullptr, nullptr, 8, 8)) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 rng(cuda_test::TestSeed());
  using P = MoeWgmmaProducer;
  for (const P producer : {P::kTmaWeights, P::kTmaOperands}) {
    // Uneven with empty experts (64 x 256 ping-pong tiles), inter off the 128-column half tile
    // (the second tile's gate and up boxes past inter: zero-filled, not stored), odd k.
    CheckGateUpSilu<__nv_bfloat16>({3, 0, 70, 1, 0, 0, 129, 5}, 200, 200, true, producer, rng);
    // One expert taking every row (128 x 256 tiles), A by TMA under kTmaOperands (no gather).
    CheckGateUpSilu<__half>({0, 0, 300, 0}, 136, 136, false, producer, rng);
    // More tiles than SMs in both tile shapes: 64 experts of 0-60 rows x 4 n-tiles, 10 of 129-255
    // rows (expert ends inside a tile's second 64 rows) x 8 n-tiles.
    std::vector<int32_t> small(64), large(10);
    for (int32_t& c : small) c = std::uniform_int_distribution<int32_t>(0, 60)(rng);
    for (int32_t& c : large) c = std::uniform_int_distribution<int32_t>(129, 255)(rng);
    CheckGateUpSilu<__nv_bfloat16>(small, 512, 64, true, producer, rng);
    CheckGateUpSilu<__nv_bfloat16>(large, 1024, 64, false, producer, rng);
    CheckGateUpSilu<__nv_bfloat16>(std::vector<int32_t>(5, 0), 16, 16, false, producer, rng);
  }
  // Refused: inter not a multiple of 8, a producer without TMA.
  DeviceBuffer<__nv_bfloat16> buf(64);
  DeviceBuffer<int32_t> offs(std::vector<int32_t>{0, 1});
  EXPECT_FALSE(MoeGroupedWgmmaGateUpSilu<__nv_bfloat16>(buf.get(), nullptr, buf.get(), offs.get(),
                                                        1, 1, 12, 8, buf.get(), nullptr)
                   .ok());
  EXPECT_FALSE(MoeGroupedWgmmaGateUpSilu<__nv_bfloat16>(buf.get(), nullptr, buf.get(), offs.get(),
                                                        1, 1, 8, 8, buf.get(), nullptr,
                                                        P::kArriveNoinc)
                   .ok());
}

// MoeCombineSplit against MoeCombine on the same inputs.
template <typename T>
void CheckCombineSplit(int64_t tokens, int64_t k, int64_t H, bool shared, bool gated, bool alias,
                       std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "T " << tokens << " k " << k << " H " << H << " shared "
                                    << shared << " gated " << gated << " alias " << alias);
  const int64_t rows = tokens * k + 3;
  DeviceBuffer<T> eout(cuda_test::Convert<T>(Normal(rows * H, 1.0f, rng)));
  DeviceBuffer<float> weights(Normal(tokens * k, 0.5f, rng));
  std::vector<int32_t> row_map(tokens * k);
  for (int32_t& r : row_map) {
    r = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(rows - 1))(rng);
  }
  DeviceBuffer<int32_t> drows(row_map);
  const std::vector<T> x = cuda_test::Convert<T>(Normal(tokens * H, 1.0f, rng));
  DeviceBuffer<T> dshared(cuda_test::Convert<T>(Normal(tokens * H, 1.0f, rng)));
  DeviceBuffer<T> dgate(cuda_test::Convert<T>(Normal(H, 0.1f, rng)));
  std::vector<std::vector<float>> results;
  for (bool split : {false, true}) {
    DeviceBuffer<T> dx(x), out(tokens * H);
    T* dst = alias ? dx.get() : out.get();
    const auto combine = split ? SplitCombine<T> : MoeCombine<T>;
    ASSERT_TRUE(combine(eout.get(), weights.get(), drows.get(), tokens, k, H,
                        shared ? dshared.get() : nullptr, gated ? dgate.get() : nullptr, dx.get(),
                        dst, nullptr)
                    .ok());
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    results.push_back(cuda_test::ToFloat(alias ? dx.ToHost() : out.ToHost()));
  }
  for (int64_t i = 0; i < tokens * H; ++i) {
    if (gated) {  // the gate's sum in another order: T's rounding of the result at most
      ASSERT_NEAR(results[1][i], results[0][i], 1e-2 * (1.0 + std::abs(results[0][i])))
          << "element " << i;
    } else {
      ASSERT_EQ(results[1][i], results[0][i]) << "element " << i;
    }
  }
}

TEST(MoeCudaTest, CombineSplitMatchesCombine) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckCombineSplit<__nv_bfloat16>(1, 8, 2048, false, false, true, rng);  // Qwen3 decode
  CheckCombineSplit<__nv_bfloat16>(33, 2, 4096, true, false, false, rng);
  CheckCombineSplit<__half>(5, 20, 520, true, true, true, rng);         // k > 16, gate, alias
  CheckCombineSplit<__half>(7, 4, 72, true, true, false, rng);          // gate, no alias
  CheckCombineSplit<__nv_bfloat16>(9, 1, 37, true, false, false, rng);  // element loads
  CheckCombineSplit<__nv_bfloat16>(3, 9, 100, false, false, true, rng);
}

// The decode layer as CudaMoeMlp runs it with fused_route and pdl (TANDEM_MOE_KERNELS): one
// MoeRouteAndPermute, the expert GEMVs and the split combine, all PDL-launched on a stream,
// eagerly and as a captured CUDA graph replayed twice (the output poisoned in between), against
// FusedMoe on the CPU; eager and graph equal bit for bit.
template <typename T>
void CheckFusedDecodeLayer(int64_t tokens, int64_t E, int64_t k, int64_t H, int64_t I,
                           std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "T " << tokens << " E " << E << " k " << k);
  std::vector<float> x = Normal(tokens * H, 1.0f, rng);
  std::vector<float> gate_up = Normal(E * 2 * I * H, 0.2f, rng);
  std::vector<float> down = Normal(E * H * I, 0.2f, rng);
  cuda_test::RoundTo<T>(x);
  cuda_test::RoundTo<T>(gate_up);
  cuda_test::RoundTo<T>(down);
  const std::vector<float> logits = SpreadLogits(tokens, E, rng);
  const MoeExpertWeights w{gate_up.data(), down.data(), E, H, I};
  MoeRouting routing;
  ASSERT_TRUE(cpu::SoftmaxTopK(logits.data(), tokens, {E, k, true}, &routing).ok());
  std::vector<float> want(tokens * H);
  MoeScratch scratch;
  ASSERT_TRUE(cpu::FusedMoe(x.data(), routing, w, want.data(), nullptr, &scratch).ok());
  double max_want = 0.0;
  for (float v : want) max_want = std::max(max_want, double{std::abs(v)});
  const double tol = (std::is_same_v<T, __half> ? 4e-3 : 3e-2) * max_want;

  const int64_t rows = tokens * k;
  DeviceBuffer<T> dx(cuda_test::Convert<T>(x)), dgu(cuda_test::Convert<T>(gate_up)),
      ddown(cuda_test::Convert<T>(down)), act(rows * I), eout(rows * H), out(tokens * H);
  DeviceBuffer<float> dlogits(logits), weights(rows);
  DeviceBuffer<int32_t> ids(rows);
  DevicePerm perm = MakePerm(E, rows);
  GroupedRoutingParams p;
  p.num_experts = E;
  p.top_k = k;
  p.renormalize = true;
  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto layer = [&]() {
    EXPECT_TRUE(MoeRouteAndPermute(dlogits.get(), tokens, p, ids.get(), weights.get(), perm.view(),
                                   nullptr, stream, true)
                    .ok());
    EXPECT_TRUE(MoeExpertGemvGateUp<T>(dx.get(), dgu.get(), H, I, perm.view(), E, rows, act.get(),
                                       stream, true)
                    .ok());
    EXPECT_TRUE(MoeExpertGemvDown<T>(act.get(), ddown.get(), H, I, perm.view(), E, rows, eout.get(),
                                     stream, true)
                    .ok());
    EXPECT_TRUE(MoeCombineSplit<T>(eout.get(), weights.get(), perm.row_of_pair.get(), tokens, k, H,
                                   nullptr, nullptr, dx.get(), out.get(), stream, true)
                    .ok());
  };
  Poison(out);
  layer();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> eager = cuda_test::ToFloat(out.ToHost());
  for (int64_t i = 0; i < tokens * H; ++i) {
    ASSERT_LE(std::abs(double{eager[i]} - want[i]), tol) << "element " << i << " of " << max_want;
  }
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer();
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    Poison(out);
    Poison(eout);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(cuda_test::ToFloat(out.ToHost()), eager) << "replay " << replay;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(MoeCudaTest, FusedRouteAndPdlDecodeLayerMatchesCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed());
  CheckFusedDecodeLayer<__nv_bfloat16>(1, 128, 8, 256, 96, rng);  // Qwen3-MoE-like, batch 1
  CheckFusedDecodeLayer<__nv_bfloat16>(16, 64, 6, 128, 40, rng);
  CheckFusedDecodeLayer<__half>(5, 8, 2, 72, 24, rng);
}

}  // namespace
}  // namespace tandem::kernels::cuda
