// Rejection sampling of speculative drafts on the device (kernels/sampling/rejection.cc's twin).
//
// One CTA per verify pass. Thread 0 runs the acceptance tests in order (one Philox draw and two
// loads each); then the whole CTA draws the residual (or bonus) token: every thread sums a
// contiguous run of ids in index order, a block scan gives each run's starting sum and the total,
// and the thread whose run crosses u * total walks it again to find the id, the CPU's inverse CDF
// with the sum split at fixed points.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/sampling/cuda/rejection_cuda.h"
#include "kernels/sampling/philox.h"
#include "kernels/sampling/rejection.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNone = std::numeric_limits<int32_t>::max();

// The weight of id v for the pick: the residual max(0, p - q) (d zeroed), p with d zeroed
// (`fallback`), or p itself (the bonus token: q null).
struct Weights {
  const double* p;
  const double* q;
  int32_t d;
  bool fallback;
  __device__ double operator()(int64_t v) const {
    if (v == d) return 0.0;
    const double w = q == nullptr || fallback ? p[v] : p[v] - q[v];
    return w > 0.0 ? w : 0.0;
  }
};

struct Smem {
  double warp_sum[kWarps];
  double total;
  int32_t accepted;
  int32_t token;
  int32_t last_positive[kWarps];
};

// Exclusive prefix sum of v over the CTA in threadIdx order (a fixed tree: deterministic);
// *total: the sum of all.
__device__ double BlockExclusiveSum(double v, double* total, Smem& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double incl = v;
  for (int o = 1; o < 32; o *= 2) {
    const double x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) s.warp_sum[warp] = incl;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += s.warp_sum[w];
    all += s.warp_sum[w];
  }
  *total = all;
  __syncthreads();
  return before + incl - v;
}

// SampleFromWeights(weights, vocab, u) of kernels/sampling/sampling.cc. Block-uniform result.
__device__ int32_t InverseCdf(const Weights& weight, int64_t vocab, double u, Smem& s) {
  const int64_t run = (vocab + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * run < vocab ? threadIdx.x * run : vocab;
  const int64_t end = begin + run < vocab ? begin + run : vocab;
  double mine = 0.0;
  int32_t last = -1;
  for (int64_t v = begin; v < end; ++v) {
    const double w = weight(v);
    mine += w;
    if (w > 0.0) last = static_cast<int32_t>(v);
  }
  double total = 0.0;
  const double before = BlockExclusiveSum(mine, &total, s);
  const int32_t last_positive = __reduce_max_sync(0xffffffffu, last);
  if (threadIdx.x % 32 == 0) s.last_positive[threadIdx.x / 32] = last_positive;
  if (threadIdx.x == 0) s.token = kNone;
  __syncthreads();
  const double target = u * total;
  // The CPU's running sum crosses target inside this run (its start is below or at target).
  if (mine > 0.0 && !(target < before) && target < before + mine) {
    double cum = before;
    for (int64_t v = begin; v < end; ++v) {
      const double w = weight(v);
      if (!(w > 0.0)) continue;
      cum += w;
      if (target < cum) {
        // Rounding may let two neighbouring runs both claim the crossing: the lower id wins.
        atomicMin(&s.token, static_cast<int32_t>(v));
        break;
      }
    }
  }
  __syncthreads();
  int32_t token = s.token;
  if (token == kNone) {  // rounding ran past the end (or nothing positive: 0)
    token = 0;
    for (int w = 0; w < kWarps; ++w)
      token = s.last_positive[w] > token ? s.last_positive[w] : token;
  }
  __syncthreads();
  return token;
}

// Whether the residual of p and q (d zeroed) has mass: the CPU's `total > 0` check.
__device__ bool HasMass(const Weights& weight, int64_t vocab, Smem& s) {
  double mine = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) mine += weight(v);
  double total = 0.0;
  BlockExclusiveSum(mine, &total, s);
  return total > 0.0;
}

__global__ void __launch_bounds__(kThreads)
    RejectionKernel(const double* __restrict__ target_probs, const double* __restrict__ draft_probs,
                    const int32_t* __restrict__ drafts,
                    const DeviceRejectionPass* __restrict__ passes, int64_t vocab,
                    DeviceRejectionResult* __restrict__ out) {
  __shared__ Smem s;
  const DeviceRejectionPass pass = passes[blockIdx.x];
  const int32_t k = pass.num_drafts;
  if (threadIdx.x == 0) {
    int32_t a = 0;
    for (; a < k; ++a) {
      const int32_t d = drafts[pass.first_draft + a];
      const double p = target_probs[(pass.target_row + a) * vocab + d];
      const double q = draft_probs[(pass.draft_row + a) * vocab + d];
      // Accept iff u < p / q, i.e. u * q < p.
      if (!(SeededUniform(pass.seed, pass.first_step + a, kAcceptStream) * q < p)) break;
    }
    s.accepted = a;
  }
  __syncthreads();
  const int32_t a = s.accepted;
  Weights weight{target_probs + (pass.target_row + a) * vocab, nullptr, -1, false};
  if (a < k) {
    weight.q = draft_probs + (pass.draft_row + a) * vocab;
    weight.d = drafts[pass.first_draft + a];
    weight.fallback = !HasMass(weight, vocab, s);
  }
  const int32_t token =
      InverseCdf(weight, vocab, SeededUniform(pass.seed, pass.first_step + a, kResidualStream), s);
  if (threadIdx.x == 0) out[blockIdx.x] = {a, token};
}

}  // namespace

absl::Status RejectionSampleDrafts(const double* target_probs, const double* draft_probs,
                                   const int32_t* drafts, const DeviceRejectionPass* passes,
                                   int64_t num_passes, int64_t vocab, DeviceRejectionResult* out,
                                   cudaStream_t stream) {
  if (num_passes < 0 || num_passes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda::RejectionSampleDrafts: num_passes must be in [0, 2^31), got ", num_passes));
  }
  if (vocab < 1 || vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::RejectionSampleDrafts: vocab must be in [1, 2^31), got ", vocab));
  }
  if (num_passes == 0) return absl::OkStatus();
  if (target_probs == nullptr || passes == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        "cuda::RejectionSampleDrafts: null target_probs, passes or out");
  }
  RejectionKernel<<<static_cast<unsigned>(num_passes), kThreads, 0, stream>>>(
      target_probs, draft_probs, drafts, passes, vocab, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
