#include "kernels/attention/merge_attn_states.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::kernels::cpu {
namespace {

// -inf is the lse of a partial that saw no keys. A NaN lse comes from 0/0 in such a kernel and
// +inf from overflow; neither carries a usable weight, so all three count as an empty partial.
// (A plain max() would carry the NaN or +inf into m and poison both sides.)
inline bool IsEmpty(float lse) { return !std::isfinite(lse); }

}  // namespace

void MergeAttnStates(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                     int64_t num_tokens, int64_t num_heads, int64_t head_dim, float* out,
                     float* lse) {
  const int64_t rows = num_tokens * num_heads;
  for (int64_t r = 0; r < rows; ++r) {
    const float la = lse_a[r];
    const float lb = lse_b[r];
    const bool empty_a = IsEmpty(la);
    const bool empty_b = IsEmpty(lb);
    const float* oa = out_a + r * head_dim;
    const float* ob = out_b + r * head_dim;
    float* o = out + r * head_dim;
    if (empty_a && empty_b) {
      std::fill(o, o + head_dim, 0.0f);
      lse[r] = -std::numeric_limits<float>::infinity();
    } else if (empty_b) {
      // Copy rather than weight by w_b = 0: an empty side's out may hold garbage (0 * NaN = NaN).
      if (o != oa) std::copy(oa, oa + head_dim, o);
      lse[r] = la;
    } else if (empty_a) {
      if (o != ob) std::copy(ob, ob + head_dim, o);
      lse[r] = lb;
    } else {
      const float m = std::max(la, lb);
      const float wa = std::exp(la - m);  // one of the two is exactly 1
      const float wb = std::exp(lb - m);
      const float sum = wa + wb;
      const float ca = wa / sum;
      const float cb = wb / sum;
      // Element d of out_a and out_b is read before out[d] is written, so aliasing is safe.
      for (int64_t d = 0; d < head_dim; ++d) o[d] = ca * oa[d] + cb * ob[d];
      lse[r] = m + std::log(sum);
    }
  }
}

void MergeAttnStatesN(const AttnPartials<float>& parts, int64_t num_tokens, int64_t num_heads,
                      int64_t head_dim, float* out, float* lse) {
  const int64_t rows = num_tokens * num_heads;
  for (int64_t r = 0; r < rows; ++r) {
    // max() over the finite lse only: NaN / +inf partials must not reach m (see IsEmpty).
    float m = -std::numeric_limits<float>::infinity();
    int64_t non_empty = 0;
    for (int64_t i = 0; i < parts.num_parts; ++i) {
      const float l = parts.lse[i * parts.lse_stride + r];
      if (IsEmpty(l)) continue;
      m = std::max(m, l);
      ++non_empty;
    }
    float* o = out + r * head_dim;
    if (non_empty == 0) {
      std::fill(o, o + head_dim, 0.0f);
      if (lse != nullptr) lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    std::fill(o, o + head_dim, 0.0f);
    float sum = 0.0f;
    for (int64_t i = 0; i < parts.num_parts; ++i) {
      const float l = parts.lse[i * parts.lse_stride + r];
      if (IsEmpty(l)) continue;         // never read: an empty partial's out may be garbage
      const float w = std::exp(l - m);  // 1 for the partial holding the max
      sum += w;
      const float* oi = parts.out + i * parts.out_stride + r * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += w * oi[d];
    }
    // sum >= 1, so the division is safe; one non-empty partial: w = sum = 1, an exact copy.
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
    if (lse != nullptr) lse[r] = m + std::log(sum);
  }
}

}  // namespace tandem::kernels::cpu
