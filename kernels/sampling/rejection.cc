#include "kernels/sampling/rejection.h"

#include <algorithm>
#include <vector>

#include "kernels/sampling/sampling.h"

namespace tandem::kernels::cpu {

RejectionOutcome RejectionSampleDrafts(absl::Span<const double> target_probs,
                                       absl::Span<const double> draft_probs,
                                       absl::Span<const int32_t> drafts, int64_t vocab,
                                       uint64_t seed, uint64_t first_step) {
  const int64_t k = static_cast<int64_t>(drafts.size());
  RejectionOutcome out;
  for (int64_t i = 0; i < k; ++i) {
    const double* p = target_probs.data() + i * vocab;
    const double* q = draft_probs.data() + i * vocab;
    const int32_t d = drafts[i];
    const double u = SamplingUniform(seed, first_step + i, kAcceptStream);
    // Accept iff u < p / q, i.e. u * q < p (q(d) > 0: d was drawn from q).
    if (u * q[d] < p[d]) {
      ++out.accepted;
      continue;
    }
    // Rejected, so p(d) < q(d): the residual is 0 at d.
    std::vector<double> residual(static_cast<size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) residual[v] = std::max(0.0, p[v] - q[v]);
    residual[d] = 0.0;
    double total = 0.0;
    for (double r : residual) total += r;
    // p == q up to rounding leaves no residual mass: p itself is then the residual's limit.
    if (!(total > 0.0)) {
      residual.assign(p, p + vocab);
      residual[d] = 0.0;
    }
    out.next_token = SampleFromWeights(residual.data(), vocab,
                                       SamplingUniform(seed, first_step + i, kResidualStream));
    return out;
  }
  out.next_token = SampleFromWeights(target_probs.data() + k * vocab, vocab,
                                     SamplingUniform(seed, first_step + k, kResidualStream));
  return out;
}

}  // namespace tandem::kernels::cpu
