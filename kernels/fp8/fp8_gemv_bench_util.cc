// fp8_gemv_bench_util.h's definitions.
#include "kernels/fp8/fp8_gemv_bench_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "absl/status/statusor.h"
#include "kernels/cuda/graph_timing.h"

namespace tandem::kernels::cuda::fp8_bench {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<void*> RandomCopies(int64_t bytes, int copies, const std::function<uint8_t()>& make) {
  std::vector<uint8_t> host(bytes);
  for (uint8_t& b : host) b = make();
  std::vector<void*> out(copies);
  for (void*& p : out) {
    Check(cudaMalloc(&p, bytes), "cudaMalloc");
    Check(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
  }
  return out;
}

double TimeGraphUs(cudaStream_t s, int reps, int iters, const std::function<bool(int)>& fn) {
  cudaGraph_t graph;
  Check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  bool ok = true;
  for (int i = 0; i < reps; ++i) ok = fn(i) && ok;
  Check(cudaStreamEndCapture(s, &graph), "end capture");
  if (!ok) {
    cudaGraphDestroy(graph);
    return -1.0;
  }
  const absl::StatusOr<float> ms = ReplayGraphMs(graph, s, iters);
  if (!ms.ok()) {
    std::fprintf(stderr, "graph replays: %s\n", ms.status().ToString().c_str());
    std::exit(1);
  }
  return 1000.0 * *ms / (static_cast<double>(reps) * iters);
}

ShapeBuffers::ShapeBuffers(int64_t n, int64_t k) {
  const int64_t groups = (k + 127) / 128;
  Check(cudaMalloc(reinterpret_cast<void**>(&w_scales), n * groups * 4), "scales");
  Check(cudaMalloc(reinterpret_cast<void**>(&a_scales), 16 * groups * 4), "scales");
  Check(cudaMalloc(reinterpret_cast<void**>(&a_codes), 16 * k), "codes");
  Check(cudaMalloc(reinterpret_cast<void**>(&out), 2 * 16 * n), "out");
  const std::vector<float> ones(n * groups, 1e-3f);
  Check(cudaMemcpy(w_scales, ones.data(), n * groups * 4, cudaMemcpyHostToDevice), "scales");
}

ShapeBuffers::~ShapeBuffers() {
  for (void* p : {static_cast<void*>(w_scales), static_cast<void*>(a_scales),
                  static_cast<void*>(a_codes), static_cast<void*>(out)}) {
    cudaFree(p);
  }
}

std::vector<void*> PatternCopies(int64_t bytes, int copies, uint8_t mask) {
  std::mt19937 rng(77);
  std::vector<uint8_t> pattern(std::min<int64_t>(bytes, int64_t{16} << 20));
  for (uint8_t& b : pattern) b = static_cast<uint8_t>(rng() & mask);
  std::vector<void*> out(copies);
  for (int c = 0; c < copies; ++c) {
    Check(cudaMalloc(&out[c], bytes), "cudaMalloc");
    if (c > 0) {
      Check(cudaMemcpy(out[c], out[0], bytes, cudaMemcpyDeviceToDevice), "copy");
      continue;
    }
    for (int64_t at = 0; at < bytes; at += static_cast<int64_t>(pattern.size())) {
      const int64_t len = std::min<int64_t>(bytes - at, static_cast<int64_t>(pattern.size()));
      Check(cudaMemcpy(static_cast<uint8_t*>(out[c]) + at, pattern.data(), len,
                       cudaMemcpyHostToDevice),
            "upload");
    }
  }
  return out;
}

int CopiesFor(int64_t bytes) { return static_cast<int>((kRotateBytes + bytes - 1) / bytes); }

}  // namespace tandem::kernels::cuda::fp8_bench
