// The MoE layer's routing on one GPU, as CudaMoeMlp (runtime/cuda/cuda_moe_mlp.cc) runs it: the
// router logits (SmallMLinear<bf16, float> up to kGemvMaxM tokens, else cublasGemmEx with fp32
// output) then MoeRouteAndPermute (one launch, PDL) where it applies (T <= 16, E <= 128), else
// MoeRoute + MoePermute. Per (H, E, T), microseconds:
//   gemv_us   the router logits alone (eager launches, CUDA events around `iters` runs);
//   route_us  the routing alone (route + permute), the same way;
//   graph_us  kGraphLayers x (logits -> routing) captured back to back in one CUDA graph with PDL,
//             per layer (the decode step's view: the routing's latency after the GEMV);
//   ids_hash  a hash of the routing's outputs (ids, weights' bits, offsets, active list, rows):
//             equal between two builds when their routing is bit-identical.
// Routings: E = 64 DeepSeek-V2-Lite (softmax top-6, greedy, not renormalised), 128 Qwen3-MoE
// (softmax top-8, renormalised), 256 DeepSeek-V3 (sigmoid + bias, 8 groups, top-4 groups by top-2
// sums, top-8, renormalised, scale 2.5). Random bf16 inputs (x ~ N(0, 1), router ~ N(0, 0.02)).
//
// Usage: moe_route_cuda_bench [--iters=200] [--tokens=1,8,64]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/gemm/cuda/gemv_cuda.h"
#include "kernels/moe/moe_bench_check.h"
#include "kernels/moe/moe_cuda.h"

namespace tandem::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kGraphLayers = 48;
constexpr int64_t kFusedMaxTokens = 16;  // CudaMoeMlp::kFusedRouteMaxTokens

struct Buffers {
  bf16 *x = nullptr, *w = nullptr;
  float *logits = nullptr, *weights = nullptr, *bias = nullptr;
  int32_t *ids = nullptr, *offsets = nullptr, *active = nullptr, *token_of_row = nullptr,
          *row_of_pair = nullptr;
  int64_t* load = nullptr;
  DeviceMoePermutation perm() const { return {offsets, active, token_of_row, row_of_pair}; }
};

template <typename T>
T* Alloc(int64_t n) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<int64_t>(n * sizeof(T), 16)));
  CHECK_CUDA(cudaMemset(p, 0, std::max<int64_t>(n * sizeof(T), 16)));
  return static_cast<T*>(p);
}

void Upload(bf16* dst, int64_t n, float sd, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<bf16> h(n);
  for (bf16& v : h) v = __float2bfloat16(normal(rng));
  CHECK_CUDA(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice));
}

GroupedRoutingParams ParamsFor(int64_t E, const float* bias) {
  GroupedRoutingParams p;
  p.num_experts = E;
  if (E <= 64) {
    p.top_k = 6;
    p.routed_scaling_factor = 1.0f;
  } else if (E <= 128) {
    p.top_k = 8;
    p.renormalize = true;
  } else {
    p.top_k = 8;
    p.renormalize = true;
    p.scoring = MoeScoring::kSigmoid;
    p.group_score = MoeGroupScore::kTopTwoSum;
    p.num_groups = 8;
    p.topk_groups = 4;
    p.routed_scaling_factor = 2.5f;
    p.correction_bias = bias;
  }
  return p;
}

double TimeUs(const std::function<void()>& fn, int iters, cudaStream_t st) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, st));
  for (int i = 0; i < iters; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b, st));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return 1e3 * ms / iters;
}

uint64_t Hash(const void* device, int64_t bytes, uint64_t h) {
  std::vector<unsigned char> host(bytes);
  CHECK_CUDA(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  return h;
}

void Row(cublasHandle_t blas, const Buffers& b, int64_t H, int64_t E, int64_t T, int iters,
         cudaStream_t st) {
  const GroupedRoutingParams p = ParamsFor(E, b.bias);
  const int64_t k = p.top_k, rows = T * k;
  const bool fused = T <= kFusedMaxTokens && MoeRouteAndPermuteSupported(p, T);
  auto logits = [&](bool pdl) {
    if (T <= kGemvMaxM) {
      CHECK_OK((SmallMLinear<bf16, float>(b.x, b.w, nullptr, T, E, H, b.logits, st, pdl)));
      return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(E), static_cast<int>(T),
                     static_cast<int>(H), &one, b.w, CUDA_R_16BF, static_cast<int>(H), b.x,
                     CUDA_R_16BF, static_cast<int>(H), &zero, b.logits, CUDA_R_32F,
                     static_cast<int>(E), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
  };
  auto route = [&](bool pdl) {
    if (fused) {
      CHECK_OK(MoeRouteAndPermute(b.logits, T, p, b.ids, b.weights, b.perm(), b.load, st, pdl));
      return;
    }
    CHECK_OK(MoeRoute(b.logits, T, p, b.ids, b.weights, st));
    CHECK_OK(MoePermute(b.ids, T, k, E, b.perm(), b.load, st));
  };
  const double gemv_us = TimeUs([&] { logits(false); }, iters, st);
  const double route_us = TimeUs([&] { route(false); }, iters, st);
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kGraphLayers; ++l) {
    logits(true);
    route(true);
  }
  CHECK_CUDA(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double graph_us =
      TimeUs([&] { CHECK_CUDA(cudaGraphLaunch(exec, st)); }, std::max(iters / 10, 5), st) /
      kGraphLayers;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamSynchronize(st));
  uint64_t h = 1469598103934665603ull;
  h = Hash(b.ids, rows * 4, h);
  h = Hash(b.weights, rows * 4, h);
  h = Hash(b.offsets, (E + 1) * 4, h);
  h = Hash(b.active, E * 4, h);
  h = Hash(b.token_of_row, rows * 4, h);
  h = Hash(b.row_of_pair, rows * 4, h);
  std::printf("| %lld | %lld | %lld | %s | %.2f | %.2f | %.2f | %016llx |\n",
              static_cast<long long>(H), static_cast<long long>(E), static_cast<long long>(T),
              fused ? "fused" : "route+perm", gemv_us, route_us, graph_us,
              static_cast<unsigned long long>(h));
}

int Main(int argc, char** argv) {
  std::vector<int64_t> tokens = {1, 8, 64};
  int iters = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokens=", 9) == 0) {
      tokens.clear();
      for (const char* q = argv[i] + 9; *q != '\0';) {
        tokens.push_back(std::atoll(q));
        const char* comma = std::strchr(q, ',');
        if (comma == nullptr) break;
        q = comma + 1;
      }
    }
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::max(1, std::atoi(argv[i] + 8));
  }
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  if (cublasSetStream(blas, st) != CUBLAS_STATUS_SUCCESS) return 1;
  int64_t max_t = 1;
  for (int64_t t : tokens) max_t = std::max(max_t, t);
  constexpr int64_t kMaxE = 256, kMaxH = 7168, kMaxK = 8;
  Buffers b;
  b.x = Alloc<bf16>(max_t * kMaxH);
  b.w = Alloc<bf16>(kMaxE * kMaxH);
  b.logits = Alloc<float>(max_t * kMaxE);
  b.weights = Alloc<float>(max_t * kMaxK);
  b.bias = Alloc<float>(kMaxE);
  b.ids = Alloc<int32_t>(max_t * kMaxK);
  b.offsets = Alloc<int32_t>(kMaxE + 1);
  b.active = Alloc<int32_t>(kMaxE);
  b.token_of_row = Alloc<int32_t>(max_t * kMaxK);
  b.row_of_pair = Alloc<int32_t>(max_t * kMaxK);
  b.load = Alloc<int64_t>(kMaxE);
  std::printf("| H | E | T | path | gemv_us | route_us | graph_us | ids_hash |\n");
  std::printf("| ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |\n");
  for (int64_t H : {2048, 7168}) {
    for (int64_t E : {64, 128, 256}) {
      for (int64_t T : tokens) {
        std::mt19937 rng(static_cast<uint32_t>(H * 1000 + E * 10 + T));
        Upload(b.x, T * H, 1.0f, rng);
        Upload(b.w, E * H, 0.02f, rng);
        std::vector<float> bias(E);
        for (int64_t e = 0; e < E; ++e) bias[e] = 0.001f * static_cast<float>((e * 37) % E);
        CHECK_CUDA(cudaMemcpy(b.bias, bias.data(), E * 4, cudaMemcpyHostToDevice));
        Row(blas, b, H, E, T, iters, st);
      }
    }
  }
  CHECK_CUDA(cudaStreamDestroy(st));
  cublasDestroy(blas);
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cuda

int main(int argc, char** argv) { return tandem::kernels::cuda::Main(argc, argv); }
