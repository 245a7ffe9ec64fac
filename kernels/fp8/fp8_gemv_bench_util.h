// Shared pieces of fp8_gemv_cuda_bench (its GEMV / producer benches, fp8_gemv_cuda_bench.cc, and
// its weight-only ones, fp8_w8a16_gemv_bench.cc): device copies of weights rotated past L2, graph
// timing, the per-shape small buffers. Bench code only (exits on a CUDA error).
#ifndef TANDEM_KERNELS_FP8_FP8_GEMV_BENCH_UTIL_H_
#define TANDEM_KERNELS_FP8_FP8_GEMV_BENCH_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cuda::fp8_bench {

using Scheme = Fp8ActivationScheme;
// Bytes of weight copies a timed graph cycles through, so no call finds its weight in L2.
inline constexpr int64_t kRotateBytes = int64_t{512} << 20;

// Prints the error and exits unless e is cudaSuccess.
void Check(cudaError_t e, const char* what);

// `copies` device copies of `bytes` random bytes (from `make`, one host draw).
std::vector<void*> RandomCopies(int64_t bytes, int copies, const std::function<uint8_t()>& make);

// Microseconds per call: `reps` calls of fn(i) captured in one graph, replayed `iters` times;
// -1 when a call failed.
double TimeGraphUs(cudaStream_t s, int reps, int iters, const std::function<bool(int)>& fn);

// Device copies of `bytes` filled with a repeated random pattern (fast for GB of weights; the
// content does not matter to the timing as long as no code is NaN).
std::vector<void*> PatternCopies(int64_t bytes, int copies, uint8_t mask);

// Copies of `bytes` that add up to at least kRotateBytes.
int CopiesFor(int64_t bytes);

struct Shape {
  const char* name;
  int64_t n, k;
};

// The small buffers of one n x k shape: weight scales (1e-3 each, one per row and 128-column
// group), activation codes and scales for up to 16 rows, the bf16 output.
struct ShapeBuffers {
  float* w_scales = nullptr;
  float* a_scales = nullptr;
  uint8_t* a_codes = nullptr;
  __nv_bfloat16* out = nullptr;
  ShapeBuffers(int64_t n, int64_t k);
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;
  ~ShapeBuffers();
};

// The weight-only benches (fp8_w8a16_gemv_bench.cc): --only=w8a16 (maths: the --w8a16_math list,
// references: --w8a16_ref), --only=w8a16-grouped, --only=w8a16-tokens.
int BenchW8a16(cudaStream_t s, int reps, int iters, const std::string& maths, bool references);
int BenchW8a16Grouped(cudaStream_t s, int reps, int iters);
int BenchW8a16Tokens(cudaStream_t s, int reps, int iters);

}  // namespace tandem::kernels::cuda::fp8_bench

#endif  // TANDEM_KERNELS_FP8_FP8_GEMV_BENCH_UTIL_H_
