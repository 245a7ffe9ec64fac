// CudaFp8Linear (cuda_fp8_linear.h) at decode-sized m, each Fp8DecodeGemm forced in turn, next to
// the bf16 product the model runs there (DenseLinear: the GEMV at m = 1, cuBLASLt above): the
// per-channel FP8 weights of online `--quantization=fp8` and compressed-tensors / modelopt
// checkpoints (whole-row scales, dynamic per-token activations, quantization included in the
// FP8 times). Weights are random codes and scales; each shape keeps enough copies to exceed the
// L2 cache (>= 256 MiB in all), a CUDA graph of `reps` calls walks them in turn, and the time is
// the graph's mean over `iters` replays divided by reps. TB/s counts the weight bytes a call reads.
//
//   fp8_linear_bench [--shapes=8b,70b_tp2,70b] [--ms=1,2,4,8,16,32,64,128,256]
//                    [--modes=gemv,cublaslt,swap,swap64,auto32,auto] [--reps=20] [--iters=10]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/graph_timing.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/gemm/cuda/gemm_cuda.h"
#include "runtime/cuda/cuda_fp8_linear.h"
#include "runtime/cuda/dense_linear.h"
#include "runtime/cuda/device_buffer.h"

namespace tandem::runtime::cuda {
namespace {

using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;

struct Shape {
  const char* name;
  int64_t n, k;
};

// The Llama-3 projections of one rank: 8B, 70B at TP = 2, 70B at TP = 1.
std::vector<Shape> ShapesOf(absl::string_view set) {
  if (set == "8b") {
    return {{"8b.qkv", 6144, 4096},
            {"8b.o", 4096, 4096},
            {"8b.gate_up", 28672, 4096},
            {"8b.down", 4096, 14336}};
  }
  if (set == "70b_tp2") {
    return {{"70b/2.qkv", 5120, 8192},
            {"70b/2.o", 8192, 4096},
            {"70b/2.gate_up", 28672, 8192},
            {"70b/2.down", 8192, 14336}};
  }
  if (set == "70b") {
    return {{"70b.qkv", 10240, 8192},
            {"70b.o", 8192, 8192},
            {"70b.gate_up", 57344, 8192},
            {"70b.down", 8192, 28672}};
  }
  std::fprintf(stderr, "unknown shape set %.*s (8b, 70b_tp2, 70b)\n", static_cast<int>(set.size()),
               set.data());
  std::exit(2);
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Mean microseconds of one call: a graph of `reps` calls of fn(i) replayed `iters` times.
template <typename Fn>
double GraphUs(cudaStream_t stream, int reps, int iters, Fn fn) {
  for (int i = 0; i < reps; ++i) fn(i);  // warm-up (plans, cuBLASLt heuristics) before capture
  CheckCuda(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  CheckCuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < reps; ++i) fn(i);
  CheckCuda(cudaStreamEndCapture(stream, &graph), "end capture");
  const absl::StatusOr<float> ms = kernels::cuda::ReplayGraphMs(graph, stream, iters);
  Check(ms.status(), "graph replays");
  return 1000.0 * *ms / (static_cast<double>(iters) * reps);
}

struct Mode {
  std::string name;
  Fp8DecodeGemm gemm;
  int swap_token_tile = 0;  // 0: SwapTokenTile's choice
};

Mode ParseMode(absl::string_view s) {
  if (s == "gemv") return {"gemv", Fp8DecodeGemm::kGemv};
  if (s == "cublaslt") return {"cublaslt", Fp8DecodeGemm::kCublasLt};
  if (s == "swap") return {"swap", Fp8DecodeGemm::kCutlassSwap, 32};
  if (s == "auto32") return {"auto32", Fp8DecodeGemm::kAutoNarrow};
  if (s == "swap64") return {"swap64", Fp8DecodeGemm::kCutlassSwap, 64};
  if (s == "auto") return {"auto", Fp8DecodeGemm::kAuto};
  std::fprintf(stderr, "unknown mode %.*s (gemv, cublaslt, swap, swap64, auto32, auto)\n",
               static_cast<int>(s.size()), s.data());
  std::exit(2);
}

// "swap/S" (32-row token tiles, S slices) or "swap64" for the swapped GEMM's call.
std::string SwapName(const CudaFp8Linear& linear, int64_t m, const Shape& s) {
  const int tile = linear.SwapTokenTile(m, s.n, s.k);
  return tile == 32 ? "swap/" + std::to_string(linear.SwapSplits(m, s.n, s.k))
                    : "swap" + std::to_string(tile);
}

// FP8 weight copies of one shape: random non-NaN codes, per-row scales around 2^-7.
std::vector<CudaFp8Weight> Fp8Copies(const Shape& s, int copies, int64_t max_tokens) {
  std::vector<CudaFp8Weight> out;
  std::mt19937 rng(38);
  std::vector<uint8_t> chunk(int64_t{1} << 22);
  for (uint8_t& c : chunk) {
    do {
      c = static_cast<uint8_t>(rng() & 0xFF);
    } while ((c & 0x7F) == 0x7F);
  }
  std::vector<float> scales(s.n);
  std::uniform_real_distribution<float> scale(0.004f, 0.012f);
  for (float& x : scales) x = scale(rng);
  for (int i = 0; i < copies; ++i) {
    absl::StatusOr<CudaFp8Weight> w =
        AllocateFp8Weight({s.n, s.k, 1, s.k}, Scheme::kDynamicToken, 0.0f, max_tokens);
    Check(w.status(), "AllocateFp8Weight");
    Check(kernels::cuda::FillReplicated(w->codes.data(), s.n * s.k, chunk.data(),
                                        static_cast<int64_t>(chunk.size())),
          "fill codes");
    CheckCuda(cudaMemcpy(w->scales.data(), scales.data(), scales.size() * 4, cudaMemcpyDefault),
              "scales");
    out.push_back(*std::move(w));
  }
  return out;
}

int CopiesFor(int64_t bytes) {
  const int64_t want = int64_t{256} << 20;
  return static_cast<int>(std::max<int64_t>(1, (want + bytes - 1) / bytes));
}

int Main(int argc, char** argv) {
  std::vector<std::string> sets = {"8b", "70b_tp2", "70b"};
  std::vector<int64_t> ms = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<Mode> modes = {ParseMode("gemv"), ParseMode("cublaslt"), ParseMode("swap")};
  int reps = 20, iters = 10;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a.rfind("--shapes=", 0) == 0) sets = absl::StrSplit(a.substr(9), ',');
    if (a.rfind("--modes=", 0) == 0) {
      modes.clear();
      for (absl::string_view m : absl::StrSplit(a.substr(8), ',')) modes.push_back(ParseMode(m));
    }
    if (a.rfind("--ms=", 0) == 0) {
      ms.clear();
      for (absl::string_view m : absl::StrSplit(a.substr(5), ',')) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(m, &v) || v < 1 || v > 256) {
          std::fprintf(stderr, "--ms: integers in [1, 256]\n");
          return 2;
        }
        ms.push_back(v);
      }
    }
    if (a.rfind("--reps=", 0) == 0) reps = std::atoi(argv[i] + 7);
    if (a.rfind("--iters=", 0) == 0) iters = std::atoi(argv[i] + 8);
  }
  constexpr int64_t kMaxTokens = 256, kMaxK = 28672;
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  absl::StatusOr<std::unique_ptr<CudaFp8Linear>> linear = CudaFp8Linear::Create(kMaxTokens, kMaxK);
  Check(linear.status(), "CudaFp8Linear::Create");
  absl::StatusOr<std::unique_ptr<kernels::cuda::CublasLtGemm>> gemm =
      kernels::cuda::CublasLtGemm::Create();
  Check(gemm.status(), "CublasLtGemm::Create");
  absl::StatusOr<DeviceBuffer> x = DeviceBuffer::Allocate(kMaxTokens * kMaxK * 2, "activations");
  Check(x.status(), "activations");
  Check(kernels::cuda::FillRandomBf16(x->data(), x->bytes()), "fill activations");
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(kMaxTokens * 57344 * 2, "outputs");
  Check(y.status(), "outputs");

  std::printf(
      "us a call (weight TB/s); FP8 includes the activation quantization; "
      "CUTLASS row GEMM available: %d\n",
      CudaFp8Linear::RowGemmAvailable() ? 1 : 0);
  std::printf("%-16s %5s %16s", "shape", "m", "bf16");
  for (const Mode& mode : modes) std::printf(" %16s %-22s", mode.name.c_str(), "(path)");
  std::printf("\n");
  for (const std::string& set : sets) {
    for (const Shape& s : ShapesOf(set)) {
      const int64_t fp8_bytes = s.n * s.k, bf16_bytes = 2 * s.n * s.k;
      const std::vector<CudaFp8Weight> w8 = Fp8Copies(s, CopiesFor(fp8_bytes), kMaxTokens);
      std::vector<DeviceBuffer> w16;
      for (int i = 0, c = CopiesFor(bf16_bytes); i < c; ++i) {
        absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bf16_bytes, "bf16 weight");
        Check(b.status(), "bf16 weight");
        Check(kernels::cuda::FillRandomBf16(b->data(), b->bytes()), "fill bf16 weight");
        w16.push_back(*std::move(b));
      }
      const auto* a = x->get<bf16>();
      bf16* out = y->get<bf16>();
      for (int64_t m : ms) {
        const double us16 = GraphUs(stream, reps, iters, [&](int i) {
          const bf16* w = w16[i % w16.size()].get<bf16>();
          Check(DenseLinear<bf16, bf16>(**gemm, a, w, nullptr, m, s.n, s.k, out, stream, false),
                "bf16");
        });
        std::printf("%-16s %5lld %8.2f (%5.2f)", s.name, static_cast<long long>(m), us16,
                    bf16_bytes / us16 * 1e-6);
        for (const Mode& mode : modes) {
          (*linear)->set_decode_gemm(mode.gemm);
          (*linear)->set_swap_token_tile(mode.swap_token_tile);
          const double us = GraphUs(stream, reps, iters, [&](int i) {
            Check((*linear)->Linear(a, w8[i % w8.size()], nullptr, m, out, stream), "fp8");
          });
          const std::string path = std::string((*linear)->last_path()) == "fp8-cutlass-swap-gemm"
                                       ? SwapName(**linear, m, s)
                                       : (*linear)->last_path();
          std::printf(" %8.2f (%5.2f) %-22s", us, fp8_bytes / us * 1e-6, path.c_str());
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::runtime::cuda

int main(int argc, char** argv) { return tandem::runtime::cuda::Main(argc, argv); }
