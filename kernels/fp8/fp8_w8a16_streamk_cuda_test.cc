// Fp8W16Math::kTensorCoreStreamK (fp8_w8a16_gemv_cuda.h, fp8_w8a16_streamk_cuda.cu): the deep
// tensor-core tiles on min(tiles, 2 SMs) CTAs sharing the tiles' 128-column units in equal
// contiguous ranges, a tile cut between two CTAs added in the split-k workspace by the second.
// Against the CPU reference cpu::Fp8Linear (kNone) on fresh random codes, scales and activations:
// n = 77 / 130 / 4112 (tiles <= 2 SMs on an H200: one whole tile a CTA), 9000 (563 tiles: cut
// tiles), 28672 / 2 (Llama-3-8B's gate_up, SiLU-and-mul), k = 272 (3 units, the last one chunk) /
// 4096 / 14336, per-channel / per-tensor / grouped scales, bias, bf16 and fp32 out; every call
// twice (early loads off / on) with the same bits; the folds bit for bit against the stream-K
// plain form through RmsNorm / SiluAndMul / the residual add; every tile wholly inside one CTA's
// range bit for bit kTensorCoreDeep's rows, at grids of tiles = C, tiles = 2 C (every tile whole:
// the whole output) and tiles = 2 C + 5; the counters back to 0; a CUDA-graph replay; no
// workspace -> kTensorCoreDeep (GPU; skips without one).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_cuda_test_util.h"
#include "kernels/fp8/fp8_linear.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/layers/cuda/layers_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using cuda_test::DeviceBuffer;
using fp8_test::RandomBf16;
using fp8_test::RandomE4m3Codes;

constexpr float kEps = 1e-5f;
constexpr Fp8W16Math kStreamK = Fp8W16Math::kTensorCoreStreamK;
constexpr Fp8W16Math kDeep = Fp8W16Math::kTensorCoreDeep;

enum class Scales { kPerChannel, kPerTensor, kGrouped };

int Sms() {
  int device = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  return sms;
}

// The stream-K plan's whole tiles (fp8_w8a16_streamk_cuda.cu): C = min(tiles, 2 SMs) ranges of
// the tiles x U units (U = ceil(k / 128)), CTA b's from unit b W / C; a tile is whole unless a
// range starts strictly inside it.
std::vector<bool> WholeTiles(int64_t n, int64_t k) {
  const int64_t tiles = (n + 15) / 16, units = (k / 16 + 7) / 8, w = tiles * units;
  const int64_t c = std::min<int64_t>(tiles, int64_t{2} * Sms());
  std::vector<bool> whole(tiles, true);
  for (int64_t b = 1; b < c; ++b) {
    const int64_t u = b * w / c;
    if (u % units != 0) whole[u / units] = false;
  }
  return whole;
}

int64_t CutTiles(int64_t n, int64_t k) {
  const std::vector<bool> whole = WholeTiles(n, k);
  return std::count(whole.begin(), whole.end(), false);
}

// A random e4m3 weight [n, k] (large ones: a random block of 2^20 - 3 codes repeated) with
// per-channel, per-tensor (n copies) or grouped (per row and 128 columns) scales, host and device.
struct Weight {
  Weight(std::mt19937& rng, int64_t n, int64_t k, Scales s)
      : grid{n, k, 1, s == Scales::kGrouped ? kFp8W16ScaleGroupCols : k},
        codes(Codes(rng, n * k)),
        scales(RandomScales(rng, grid.NumScales(), s == Scales::kPerTensor)),
        d_codes(codes),
        d_scales(scales) {}
  static std::vector<uint8_t> Codes(std::mt19937& rng, int64_t count) {
    if (count <= (int64_t{1} << 22)) return RandomE4m3Codes(rng, count);
    const std::vector<uint8_t> block = RandomE4m3Codes(rng, (int64_t{1} << 20) - 3);
    const int64_t size = static_cast<int64_t>(block.size());
    std::vector<uint8_t> codes(count);
    for (int64_t i = 0; i < count; i += size) {
      std::memcpy(codes.data() + i, block.data(), std::min(size, count - i));
    }
    return codes;
  }
  static std::vector<float> RandomScales(std::mt19937& rng, int64_t count, bool per_tensor) {
    std::uniform_real_distribution<float> log_scale(-10.0f, -4.0f);
    std::vector<float> s(count);
    for (float& v : s) v = std::exp2(log_scale(rng));
    if (per_tensor) std::fill(s.begin(), s.end(), s[0]);
    return s;
  }
  Fp8DeviceWeight device() const { return {d_codes.get(), d_scales.get(), grid}; }
  // Rows [begin, begin + rows) as a weight of their own.
  Fp8DeviceWeight rows(int64_t begin, int64_t rows) const {
    return {d_codes.get() + begin * grid.cols,
            d_scales.get() + begin * grid.GridCols(),
            {rows, grid.cols, 1, grid.block_cols}};
  }

  Fp8ScaleGrid grid;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  DeviceBuffer<uint8_t> d_codes;
  DeviceBuffer<float> d_scales;
};

// A workspace for weights of up to `rows` rows, counters zeroed.
struct Workspace {
  explicit Workspace(int64_t rows) : mem(Fp8W16SplitKWorkspaceBytes(rows)) {
    EXPECT_EQ(cudaMemset(mem.get(), 0, mem.size()), cudaSuccess);
    ws = Fp8W16SplitKWorkspaceAt(mem.get(), rows);
  }
  bool CountersZero() const {
    std::vector<unsigned int> c(ws.tiles);
    EXPECT_EQ(cudaMemcpy(c.data(), ws.counters, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return std::all_of(c.begin(), c.end(), [](unsigned int v) { return v == 0; });
  }
  DeviceBuffer<uint8_t> mem;
  Fp8W16SplitKWorkspace ws;
};

// got (n outputs) against cpu::Fp8Linear (weight-only) on x [k]: the tensor-core forms' bound
// (fp8_w8a16_gemv_cuda_test.cc): fp32 summation, the output rounding (bf16_out), the activations'
// f16 rounding below 2^-14.
void ExpectNearReference(const Weight& w, int64_t row0, int64_t n, const std::vector<float>& x,
                         const bf16* bias, const std::vector<float>& got, bool bf16_out) {
  const int64_t k = w.grid.cols;
  const Fp8ScaleGrid grid{n, k, 1, w.grid.block_cols};
  const Fp8WeightView view{w.codes.data() + row0 * k, w.scales.data() + row0 * grid.GridCols(),
                           grid, Fp8ActivationScheme::kNone, 0.0f};
  std::vector<float> bias_f(n, 0.0f), want(n), w_deq(k);
  if (bias != nullptr) {
    for (int64_t j = 0; j < n; ++j) bias_f[j] = __bfloat162float(bias[j]);
  }
  ASSERT_TRUE(cpu::Fp8Linear(x.data(), view, bias != nullptr ? bias_f.data() : nullptr, 1,
                             want.data(), nullptr)
                  .ok());
  for (int64_t j = 0; j < n; ++j) {
    cpu::DequantizeFp8Weight(view, j, 1, w_deq.data());
    double mag = std::fabs(bias_f[j]), wsum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      mag += std::fabs(x[i] * w_deq[i]);
      wsum += std::fabs(w_deq[i]);
    }
    const double tol = 4e-6 * std::sqrt(double(k)) * mag +
                       (bf16_out ? 0x1p-8 * std::fabs(want[j]) : 0.0) + 0x1p-25 * wsum + 1e-30;
    ASSERT_NEAR(got[j], want[j], tol) << "col " << j;
  }
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Every row of a tile wholly inside one CTA's range (n rows, k columns) equals the deep kernel's.
template <typename T>
void ExpectWholeTilesAsDeep(const std::vector<T>& got, const std::vector<T>& deep, int64_t k,
                            const char* what) {
  const int64_t n = static_cast<int64_t>(got.size());
  ASSERT_EQ(deep.size(), got.size());
  const std::vector<bool> whole = WholeTiles(n, k);
  for (int64_t j = 0; j < n; ++j) {
    if (!whole[j / 16]) continue;
    ASSERT_EQ(std::memcmp(&got[j], &deep[j], sizeof(T)), 0)
        << what << ": row " << j << " of a whole tile differs from kTensorCoreDeep";
  }
}

template <typename TOut>
std::vector<TOut> RunPlain(const bf16* x, const Fp8DeviceWeight& w, const bf16* bias, bool early,
                           Fp8W16Math math, const Fp8W16SplitKWorkspace* ws) {
  DeviceBuffer<TOut> out(w.grid.rows);
  cudaMemset(out.get(), 0xFF, out.size() * sizeof(TOut));  // NaN: an unwritten element fails
  const absl::Status st =
      Fp8W16Gemv<TOut>(x, w, bias, 1, out.get(), nullptr, true, early, math, ws);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.ToHost();
}

// The plain form, fp32 and bf16 out: against the reference, twice the same bits (early loads off
// / on), whole tiles as kTensorCoreDeep.
void CheckPlain(std::mt19937& rng, int64_t n, int64_t k, Scales scales, bool with_bias,
                const Fp8W16SplitKWorkspace* ws) {
  SCOPED_TRACE(::testing::Message()
               << "plain n=" << n << " k=" << k << " scales=" << static_cast<int>(scales)
               << (with_bias ? " bias" : "") << " cut tiles=" << CutTiles(n, k));
  const Weight w(rng, n, k, scales);
  const std::vector<bf16> x = RandomBf16(rng, k, 2.0f), bias = RandomBf16(rng, n, 1.0f);
  DeviceBuffer<bf16> dx(x), dbias(bias);
  const bf16* b = with_bias ? dbias.get() : nullptr;
  const std::vector<float> f32 = RunPlain<float>(dx.get(), w.device(), b, false, kStreamK, ws);
  EXPECT_TRUE(SameBits(f32, RunPlain<float>(dx.get(), w.device(), b, true, kStreamK, ws)))
      << "a second run (early loads) changes bits";
  const std::vector<bf16> b16 = RunPlain<bf16>(dx.get(), w.device(), b, true, kStreamK, ws);
  ExpectWholeTilesAsDeep(f32, RunPlain<float>(dx.get(), w.device(), b, true, kDeep, nullptr), k,
                         "plain fp32");
  ExpectWholeTilesAsDeep(b16, RunPlain<bf16>(dx.get(), w.device(), b, true, kDeep, nullptr), k,
                         "plain bf16");
  const std::vector<float> xf = cuda_test::ToFloat(x);
  const bf16* hb = with_bias ? bias.data() : nullptr;
  ExpectNearReference(w, 0, n, xf, hb, f32, false);
  ExpectNearReference(w, 0, n, xf, hb, cuda_test::ToFloat(b16), true);
}

// The folds with the stream-K form (math kStreamK) or the deep one (kDeep: the bits the whole
// tiles must have).
struct FoldOutputs {
  std::vector<bf16> norm_in, silu, add_to;
};
FoldOutputs RunFolds(const bf16* x, const bf16* norm_w, const Weight& w, const Weight& gu,
                     const bf16* bias, const std::vector<bf16>& res0, Fp8W16Math math,
                     const Fp8W16SplitKWorkspace* ws) {
  const int64_t n = w.grid.rows;
  DeviceBuffer<bf16> norm_in(n), silu(n), residual(res0);
  EXPECT_TRUE(Fp8W16GemvNormIn(x, norm_w, kEps, w.device(), bias, 1, norm_in.get(), nullptr, true,
                               true, math, ws)
                  .ok());
  EXPECT_TRUE(Fp8W16GemvNormInSiluMul(x, norm_w, kEps, gu.device(), bias, 1, silu.get(), nullptr,
                                      true, true, math, ws)
                  .ok());
  // AddTo on the activations x (the residual stream's update needs no norm).
  EXPECT_TRUE(
      Fp8W16GemvAddTo(x, w.device(), bias, 1, residual.get(), nullptr, true, true, math, ws).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {norm_in.ToHost(), silu.ToHost(), residual.ToHost()};
}

// NormIn = RmsNorm<bf16> + the plain stream-K form, NormInSiluMul = RmsNorm + the gate and up
// halves as weights of their own (each row in the same tile slot and piece as in the fold) +
// SiluAndMul, AddTo = round(residual + round(plain)), bit for bit; the unfolded products against
// the reference; every fold run twice with the same bits; whole tiles as the deep folds.
void CheckFolds(std::mt19937& rng, int64_t n, int64_t k, Scales scales,
                const Fp8W16SplitKWorkspace* ws) {
  SCOPED_TRACE(::testing::Message() << "folds n=" << n << " k=" << k << " scales="
                                    << static_cast<int>(scales) << " cut tiles=" << CutTiles(n, k));
  const std::vector<bf16> x = RandomBf16(rng, k, 1.5f), norm_w = RandomBf16(rng, k, 1.0f);
  const std::vector<bf16> bias = RandomBf16(rng, 2 * n, 1.0f), res0 = RandomBf16(rng, n, 3.0f);
  DeviceBuffer<bf16> dx(x), dnorm(norm_w), normed(k), dbias(bias);
  ASSERT_TRUE(RmsNorm<bf16>(dx.get(), dnorm.get(), 1, k, kEps, normed.get(), nullptr).ok());
  const Weight w(rng, n, k, scales), gu(rng, 2 * n, k, scales);
  const FoldOutputs got = RunFolds(dx.get(), dnorm.get(), w, gu, dbias.get(), res0, kStreamK, ws);
  const FoldOutputs again = RunFolds(dx.get(), dnorm.get(), w, gu, dbias.get(), res0, kStreamK, ws);
  EXPECT_TRUE(SameBits(got.norm_in, again.norm_in) && SameBits(got.silu, again.silu) &&
              SameBits(got.add_to, again.add_to))
      << "a second run changes bits";
  const FoldOutputs deep =
      RunFolds(dx.get(), dnorm.get(), w, gu, dbias.get(), res0, kDeep, nullptr);
  ExpectWholeTilesAsDeep(got.norm_in, deep.norm_in, k, "NormIn");
  ExpectWholeTilesAsDeep(got.silu, deep.silu, k, "NormInSiluMul");
  ExpectWholeTilesAsDeep(got.add_to, deep.add_to, k, "AddTo");

  const std::vector<bf16> unfolded =
      RunPlain<bf16>(normed.get(), w.device(), dbias.get(), true, kStreamK, ws);
  EXPECT_TRUE(SameBits(got.norm_in, unfolded)) << "NormIn != RmsNorm + the plain form";
  const std::vector<float> normed_f = cuda_test::ToFloat(normed.ToHost());
  ExpectNearReference(w, 0, n, normed_f, bias.data(), cuda_test::ToFloat(unfolded), true);

  const int64_t n8 = (n + 7) / 8 * 8;  // SiluAndMul takes inter a multiple of 8: zero padding
  std::vector<bf16> padded(2 * n8, __float2bfloat16_rn(0.0f));
  for (int half = 0; half < 2; ++half) {
    const std::vector<bf16> part = RunPlain<bf16>(normed.get(), gu.rows(half * n, n),
                                                  dbias.get() + half * n, true, kStreamK, ws);
    std::copy(part.begin(), part.end(), padded.begin() + half * n8);
    ExpectNearReference(gu, half * n, n, normed_f, bias.data() + half * n, cuda_test::ToFloat(part),
                        true);
  }
  DeviceBuffer<bf16> d_padded(padded), act_ref(n8);
  ASSERT_TRUE(SiluAndMul<bf16>(d_padded.get(), 1, n8, act_ref.get(), nullptr).ok());
  std::vector<bf16> want_act = act_ref.ToHost();
  want_act.resize(n);
  EXPECT_TRUE(SameBits(got.silu, want_act)) << "NormInSiluMul != RmsNorm + halves + SiluAndMul";

  const std::vector<bf16> product =
      RunPlain<bf16>(dx.get(), w.device(), dbias.get(), true, kStreamK, ws);
  for (int64_t j = 0; j < n; ++j) {
    const bf16 want = __float2bfloat16_rn(__bfloat162float(res0[j]) + __bfloat162float(product[j]));
    ASSERT_EQ(std::memcmp(&got.add_to[j], &want, sizeof(bf16)), 0) << "AddTo col " << j;
  }
}

constexpr int64_t kGateUpInter = 28672 / 2;  // Llama-3-8B's gate_up: 2 x 14336 rows

TEST(Fp8W16StreamKCudaTest, MatchesTheCpuReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 41);
  Workspace buf(9000);
  bool some_cut = false;
  for (const int64_t n : {int64_t{77}, int64_t{130}, int64_t{4096 + 16}, int64_t{9000}}) {
    for (const int64_t k : {int64_t{272}, int64_t{4096}, int64_t{14336}}) {
      CheckPlain(rng, n, k, Scales::kPerChannel, (n + k) % 2 == 0, &buf.ws);
      CheckPlain(rng, n, k, Scales::kGrouped, true, &buf.ws);
      some_cut = some_cut || CutTiles(n, k) > 0;
    }
  }
  CheckPlain(rng, 9000, 4096, Scales::kPerTensor, false, &buf.ws);
  EXPECT_TRUE(some_cut) << "no shape cut a tile between CTAs";
  EXPECT_TRUE(buf.CountersZero());
}

TEST(Fp8W16StreamKCudaTest, FoldsEqualTheUnfoldedForm) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 42);
  Workspace buf(2 * kGateUpInter);
  for (const int64_t n : {int64_t{77}, int64_t{130}, int64_t{4096 + 16}, int64_t{9000}}) {
    for (const int64_t k : {int64_t{272}, int64_t{4096}}) {  // NormIn: k <= 12280
      CheckFolds(rng, n, k, Scales::kPerChannel, &buf.ws);
    }
    CheckFolds(rng, n, 4096, Scales::kGrouped, &buf.ws);
  }
  CheckFolds(rng, kGateUpInter, 4096, Scales::kPerChannel, &buf.ws);  // 896 tiles on 2 x SMs
  CheckFolds(rng, kGateUpInter, 4096, Scales::kGrouped, &buf.ws);
  CheckFolds(rng, kGateUpInter, 272, Scales::kPerChannel, &buf.ws);
  EXPECT_TRUE(buf.CountersZero());
}

// Grids against the plan: tiles = C (one whole tile a CTA), tiles = 2 C (two whole tiles a CTA:
// no cut, the whole output bit for bit kTensorCoreDeep's, every fold too), tiles = 2 C + 5 (cuts).
TEST(Fp8W16StreamKCudaTest, WholeTilesEqualTheDeepKernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 43);
  const int64_t c = 2 * Sms();
  Workspace buf(2 * (2 * c + 5) * 16);
  for (const int64_t k : {int64_t{272}, int64_t{4096}}) {
    for (const Scales scales : {Scales::kPerChannel, Scales::kGrouped}) {
      for (const int64_t tiles : {c, 2 * c}) {
        const int64_t n = tiles * 16;
        ASSERT_EQ(CutTiles(n, k), 0);
        const Weight w(rng, n, k, scales), gu(rng, 2 * n, k, scales);
        DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.5f)), dnorm(RandomBf16(rng, k, 1.0f));
        DeviceBuffer<bf16> dbias(RandomBf16(rng, 2 * n, 1.0f));
        EXPECT_TRUE(
            SameBits(RunPlain<float>(dx.get(), w.device(), dbias.get(), true, kStreamK, &buf.ws),
                     RunPlain<float>(dx.get(), w.device(), dbias.get(), true, kDeep, nullptr)))
            << "plain, tiles=" << tiles << " k=" << k;
        const std::vector<bf16> res0 = RandomBf16(rng, n, 3.0f);
        const FoldOutputs s =
            RunFolds(dx.get(), dnorm.get(), w, gu, dbias.get(), res0, kStreamK, &buf.ws);
        const FoldOutputs d =
            RunFolds(dx.get(), dnorm.get(), w, gu, dbias.get(), res0, kDeep, nullptr);
        EXPECT_TRUE(SameBits(s.norm_in, d.norm_in) && SameBits(s.silu, d.silu) &&
                    SameBits(s.add_to, d.add_to))
            << "folds, tiles=" << tiles << " k=" << k;
      }
      ASSERT_GT(CutTiles((2 * c + 5) * 16, k), 0);
      CheckPlain(rng, (2 * c + 5) * 16, k, scales, true, &buf.ws);
      CheckFolds(rng, (2 * c + 5) * 16, k, scales, &buf.ws);
    }
  }
  EXPECT_TRUE(buf.CountersZero());
}

// Replays of a captured stream-K launch (Llama-3-8B's gate_up + SiLU, cut tiles) give the eager
// bits; the counters wrap back to 0.
TEST(Fp8W16StreamKCudaTest, ReplaysInAGraph) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 44);
  const int64_t n = kGateUpInter, k = 4096;
  ASSERT_GT(CutTiles(n, k), 0);
  const Weight gu(rng, 2 * n, k, Scales::kPerChannel);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 1.5f)), dnorm(RandomBf16(rng, k, 1.0f)), out(n);
  Workspace buf(2 * n);
  const auto launch = [&](cudaStream_t stream) {
    return Fp8W16GemvNormInSiluMul(dx.get(), dnorm.get(), kEps, gu.device(), nullptr, 1, out.get(),
                                   stream, true, true, kStreamK, &buf.ws);
  };
  ASSERT_TRUE(launch(nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> eager = out.ToHost();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status st = launch(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    cudaMemsetAsync(out.get(), 0xFF, n * sizeof(bf16), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(SameBits(out.ToHost(), eager)) << "replay " << replay;
  }
  EXPECT_TRUE(buf.CountersZero());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Without a workspace, or one of too few tiles: kTensorCoreDeep (its bits, cut tiles or not).
TEST(Fp8W16StreamKCudaTest, WithoutAWorkspaceRunsDeep) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(cuda_test::TestSeed() + 45);
  const int64_t n = 9000, k = 4096;
  const Weight w(rng, n, k, Scales::kPerChannel);
  DeviceBuffer<bf16> dx(RandomBf16(rng, k, 2.0f));
  Workspace small(n - 16);
  const std::vector<float> deep =
      RunPlain<float>(dx.get(), w.device(), nullptr, true, kDeep, nullptr);
  EXPECT_TRUE(
      SameBits(RunPlain<float>(dx.get(), w.device(), nullptr, true, kStreamK, nullptr), deep));
  EXPECT_TRUE(
      SameBits(RunPlain<float>(dx.get(), w.device(), nullptr, true, kStreamK, &small.ws), deep));
  EXPECT_TRUE(small.CountersZero());
}

}  // namespace
}  // namespace tandem::kernels::cuda
