// Token sampling on the device, matching cpu::SampleToken (kernels/sampling/sampling.cc).
//
// A row's vocab_limit (> 0) cuts it short: both kernels see only its first vocab_limit logits,
// so a padding id past the tokenizer can never be picked.
//
// Two kernels. RowMaxKernel: (row, split) CTAs reduce a slice of the row to its max / argmax
// (lowest index on ties, NaN skipped) and counts of eligible and +inf logits. SampleRowKernel:
// one CTA per row combines the slices; greedy rows stop there; sampled rows then
//   1. top-k: radix-select the k-th largest key among eligible tokens (count per bin);
//   2. top-p: radix-select the key where the descending cumulative probability reaches
//      top_p * total (probability mass per bin), among the top-k survivors;
//   3. inverse CDF in index order over the survivors, u from Philox on the device.
// A threshold key keeps every token above it and, of the tokens equal to it, the first ones in
// index order: exactly the CPU's (logit desc, id asc) prefix, so ties resolve the same way.
//
// Probability mass is fixed point: weight exp((l - max) / T) in [0, 1], computed in fp64 like
// the CPU, times 2^62, truncated to an integer; sums are 128-bit integers. Integer sums are exact
// and independent of summation order, so the kernel is deterministic, and the truncation
// (< 2^-62 per token, total >= 1) is far below the CPU's own fp64 rounding.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "kernels/sampling/cuda/sampling_device.cuh"
#include "kernels/sampling/philox.h"

namespace tandem::kernels::cuda {
namespace {

using sampling_internal::Better;
using sampling_internal::CeilToU128;
using sampling_internal::Cut;
using sampling_internal::CutAt;
using sampling_internal::InverseCdf;
using sampling_internal::KeyToFloat;
using sampling_internal::kInf;
using sampling_internal::kRowThreads;
using sampling_internal::kSplitThreads;
using sampling_internal::NumSplits;
using sampling_internal::OrderKey;
using sampling_internal::Partial;
using sampling_internal::RadixSelect;
using sampling_internal::RowCtx;
using sampling_internal::SampledVocab;
using sampling_internal::SampleSmem;
using sampling_internal::Selection;
using sampling_internal::ToDouble;
using sampling_internal::U128;
using sampling_internal::u64;
using sampling_internal::WriteProbabilities;

// ---- Max pass ------------------------------------------------------------------------------

__global__ void __launch_bounds__(kSplitThreads)
    RowMaxKernel(const float* __restrict__ logits, int64_t vocab,
                 const DeviceSamplingRow* __restrict__ rows, int splits,
                 Partial* __restrict__ partials) {
  const int64_t row = blockIdx.x / splits;
  const int split = blockIdx.x % splits;
  // Slices split the whole row (the grid is fixed for a graph); a limit only shortens the last.
  const int64_t chunk = (vocab + splits - 1) / splits;
  const int64_t sampled = SampledVocab(vocab, rows[row].vocab_limit);
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < sampled ? begin + chunk : sampled;
  const float* x = logits + row * vocab;
  float best = 0.0f;
  int32_t arg = -1;
  int32_t eligible = 0, pos_inf = 0;
#pragma unroll 4
  for (int64_t i = begin + threadIdx.x; i < end; i += kSplitThreads) {
    const float l = x[i];
    if (isnan(l)) continue;
    eligible += l != -kInf;
    pos_inf += l == kInf;
    if (arg < 0 || l > best) {  // strict: the first (lowest) index of this thread wins ties
      best = l;
      arg = static_cast<int32_t>(i);
    }
  }
  __shared__ Partial warp_best[kSplitThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oa = __shfl_xor_sync(0xffffffffu, arg, o);
    eligible += __shfl_xor_sync(0xffffffffu, eligible, o);
    pos_inf += __shfl_xor_sync(0xffffffffu, pos_inf, o);
    if (Better(ob, oa, best, arg)) {
      best = ob;
      arg = oa;
    }
  }
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = {best, arg, eligible, pos_inf};
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial p = warp_best[0];
    for (int w = 1; w < kSplitThreads / 32; ++w) {
      const Partial& q = warp_best[w];
      if (Better(q.max, q.argmax, p.max, p.argmax)) {
        p.max = q.max;
        p.argmax = q.argmax;
      }
      p.num_eligible += q.num_eligible;
      p.num_pos_inf += q.num_pos_inf;
    }
    partials[blockIdx.x] = p;
  }
}

// Samples row blockIdx.x into out (probs null), or writes its distribution into probs ([rows,
// vocab]: cpu::TokenProbabilities; ids past the row's vocab_limit get 0).
__global__ void __launch_bounds__(kRowThreads)
    SampleRowKernel(const float* __restrict__ logits, int64_t vocab,
                    const DeviceSamplingRow* __restrict__ rows,
                    const Partial* __restrict__ partials, int splits, int32_t* __restrict__ out,
                    double* __restrict__ probs) {
  __shared__ SampleSmem s;
  const int64_t row = blockIdx.x;
  if (threadIdx.x == 0) {
    // Slices are in index order, so a strict > keeps the lowest index on ties.
    float best = 0.0f;
    int32_t arg = -1;
    int64_t eligible = 0, pos_inf = 0;
    for (int sp = 0; sp < splits; ++sp) {
      const Partial p = partials[row * splits + sp];
      eligible += p.num_eligible;
      pos_inf += p.num_pos_inf;
      if (p.argmax >= 0 && (arg < 0 || p.max > best)) {
        best = p.max;
        arg = p.argmax;
      }
    }
    s.row_max = best;
    s.row_argmax = arg;
    s.num_eligible = eligible;
    s.num_pos_inf = pos_inf;
  }
  __syncthreads();
  const DeviceSamplingRow p = rows[row];
  const int64_t sampled = SampledVocab(vocab, p.vocab_limit);  // RowCtx.vocab: the cut row
  const float max_logit = s.row_max;
  if (probs != nullptr) {
    probs += row * vocab;
    for (int64_t i = sampled + threadIdx.x; i < vocab; i += kRowThreads) probs[i] = 0.0;
  }
  // Greedy also when nothing has positive probability (all NaN / -inf): argmax, 0 if all NaN.
  if (!(p.temperature > 0.0f) || sampled == 1 || s.row_argmax < 0 || max_logit == -kInf) {
    const int32_t greedy = s.row_argmax < 0 ? 0 : s.row_argmax;
    if (probs != nullptr) {  // one-hot at the greedy choice
      for (int64_t i = threadIdx.x; i < sampled; i += kRowThreads) probs[i] = i == greedy;
    } else if (threadIdx.x == 0) {
      out[row] = greedy;
    }
    return;
  }
  const RowCtx c{logits + row * vocab, sampled, max_logit, max_logit == kInf,
                 1.0 / static_cast<double>(p.temperature)};
  const int64_t num_eligible = c.inf_max ? s.num_pos_inf : s.num_eligible;

  Cut top_k_cut, top_p_cut;  // keep everything until set
  int64_t num_kept = num_eligible;
  if (p.top_k > 0 && p.top_k < num_eligible) {
    auto eligible = [&](int64_t, float l, uint32_t) { return c.Eligible(l); };
    const Selection sel = RadixSelect(
        c, eligible, [](float) -> u64 { return 1; },
        [&](U128) { return static_cast<U128>(p.top_k); }, s);
    top_k_cut = CutAt(c, sel, 1, eligible, s);
    num_kept = p.top_k;
  }
  auto after_top_k = [&](int64_t i, float l, uint32_t key) {
    return c.Eligible(l) && top_k_cut.Keeps(i, key);
  };
  if (p.top_p < 1.0f && num_kept > 1) {
    const double top_p = p.top_p;
    const Selection sel = RadixSelect(
        c, after_top_k, [&](float l) { return c.Mass(l); },
        [&](U128 total) { return CeilToU128(top_p * ToDouble(total)); }, s);
    top_p_cut = CutAt(c, sel, c.Mass(KeyToFloat(sel.key)), after_top_k, s);
  }
  auto kept = [&](int64_t i, float l) {
    const uint32_t key = OrderKey(l);
    return after_top_k(i, l, key) && top_p_cut.Keeps(i, key);
  };
  if (probs != nullptr) {
    WriteProbabilities(c, kept, probs, s);
    return;
  }
  const int32_t token = InverseCdf(c, kept, SeededUniform(p.seed, p.step, 0), s);
  if (threadIdx.x == 0) out[row] = token;
}

}  // namespace

int64_t SampleTokensWorkspaceBytes(int64_t num_rows, int64_t vocab) {
  if (num_rows <= 0 || vocab <= 0) return 0;
  return num_rows * NumSplits(num_rows, vocab) * static_cast<int64_t>(sizeof(Partial));
}

namespace {

// SampleTokens / TokenProbabilities: the arguments checked, then the two kernels (exactly one of
// out and probs set).
absl::Status LaunchRows(const char* what, const float* logits, int64_t num_rows, int64_t vocab,
                        const DeviceSamplingRow* rows, int32_t* out, double* probs, void* workspace,
                        int64_t workspace_bytes, cudaStream_t stream) {
  if (num_rows < 0 || num_rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": num_rows must be in [0, 2^31), got ", num_rows));
  }
  if (vocab < 1 || vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": vocab must be in [1, 2^31), got ", vocab));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (logits == nullptr || rows == nullptr || (out == nullptr && probs == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::", what, ": null logits, rows or out"));
  }
  const int64_t needed = SampleTokensWorkspaceBytes(num_rows, vocab);
  if (workspace == nullptr || workspace_bytes < needed ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda::", what, ": workspace must be 16-byte aligned with >= ", needed,
                     " bytes for ", num_rows, " rows x ", vocab, ", got ", workspace_bytes,
                     " bytes at ", reinterpret_cast<uintptr_t>(workspace)));
  }
  const int splits = static_cast<int>(NumSplits(num_rows, vocab));
  auto* partials = static_cast<Partial*>(workspace);
  RowMaxKernel<<<static_cast<unsigned>(num_rows * splits), kSplitThreads, 0, stream>>>(
      logits, vocab, rows, splits, partials);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  SampleRowKernel<<<static_cast<unsigned>(num_rows), kRowThreads, 0, stream>>>(
      logits, vocab, rows, partials, splits, out, probs);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status SampleTokens(const float* logits, int64_t num_rows, int64_t vocab,
                          const DeviceSamplingRow* rows, int32_t* out, void* workspace,
                          int64_t workspace_bytes, cudaStream_t stream) {
  return LaunchRows("SampleTokens", logits, num_rows, vocab, rows, out, nullptr, workspace,
                    workspace_bytes, stream);
}

absl::Status TokenProbabilities(const float* logits, int64_t num_rows, int64_t vocab,
                                const DeviceSamplingRow* rows, double* probs, void* workspace,
                                int64_t workspace_bytes, cudaStream_t stream) {
  return LaunchRows("TokenProbabilities", logits, num_rows, vocab, rows, nullptr, probs, workspace,
                    workspace_bytes, stream);
}

}  // namespace tandem::kernels::cuda
