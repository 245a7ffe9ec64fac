#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/sampling/philox.h"

namespace tandem::kernels {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: temperature must be finite and >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_k must be >= 0 (0 = off), got ", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: top_p must be in (0, 1] (1 = off), got ", p.top_p));
  }
  if (p.vocab_limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: vocab_limit must be >= 0 (0 = off), got ", p.vocab_limit));
  }
  return absl::OkStatus();
}

double SamplingUniform(uint64_t seed, uint64_t step) { return SamplingUniform(seed, step, 0); }

double SamplingUniform(uint64_t seed, uint64_t step, uint32_t stream) {
  return SeededUniform(seed, step, stream);
}

namespace cpu {
namespace {

struct Candidate {
  int32_t id;
  float logit;
  double weight;  // unnormalized probability, exp((logit - max) / temperature)
};

// Descending logit, then ascending id: a strict total order on non-NaN logits, so top-k and
// top-p cut ties deterministically (lower id kept).
bool HigherRanked(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

int32_t Greedy(const float* logits, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;  // strict: first index wins ties
  }
  return best < 0 ? 0 : static_cast<int32_t>(best);
}

// Keeps the shortest prefix (in HigherRanked order) whose weight reaches top_p of the total.
// The nucleus is usually a tiny part of the vocabulary, so sort in growing chunks instead of
// sorting everything.
void KeepNucleus(float top_p, std::vector<Candidate>& kept) {
  double total = 0.0;
  for (const Candidate& c : kept) total += c.weight;
  const double target = static_cast<double>(top_p) * total;
  double cum = 0.0;
  size_t sorted = 0;
  size_t chunk = 64;
  while (sorted < kept.size()) {
    const size_t upto = std::min(kept.size(), sorted + chunk);
    std::partial_sort(kept.begin() + sorted, kept.begin() + upto, kept.end(), HigherRanked);
    for (size_t i = sorted; i < upto; ++i) {
      cum += kept[i].weight;
      if (cum >= target) {
        kept.resize(i + 1);
        return;
      }
    }
    sorted = upto;
    chunk *= 4;
  }
  // Rounding kept cum just under target: everything stays.
}

}  // namespace

namespace {

// Steps 1-3 of SampleToken (temperature, top-k, top-p): the kept tokens in index order with their
// unnormalized weights. Empty when no logit has positive probability (all NaN / -inf).
// REQUIRES: temperature > 0 and vocab >= 2.
std::vector<Candidate> KeptCandidates(const float* logits, int64_t vocab,
                                      const SamplingParams& params) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float max_logit = -kInf;
  for (int64_t i = 0; i < vocab; ++i) {
    if (logits[i] > max_logit) max_logit = logits[i];  // NaN compares false: skipped
  }
  std::vector<Candidate> kept;
  if (max_logit == -kInf) return kept;  // nothing has positive probability
  // In the limit, +inf logits take all the mass, split evenly; exp(inf - inf) would be NaN.
  const bool inf_max = max_logit == kInf;

  kept.reserve(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == -kInf || (inf_max && l != kInf)) continue;
    kept.push_back({static_cast<int32_t>(i), l, 0.0});
  }

  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < kept.size()) {
    std::nth_element(kept.begin(), kept.begin() + (params.top_k - 1), kept.end(), HigherRanked);
    kept.resize(static_cast<size_t>(params.top_k));
  }

  const double inv_temperature = 1.0 / static_cast<double>(params.temperature);
  for (Candidate& c : kept) {
    c.weight =
        inf_max ? 1.0 : std::exp((static_cast<double>(c.logit) - max_logit) * inv_temperature);
  }
  // The max logit is always kept (weight 1), so the total is >= 1 and never underflows.

  if (params.top_p < 1.0f && kept.size() > 1) KeepNucleus(params.top_p, kept);

  // Index order (what a GPU prefix-sum scan would do).
  std::sort(kept.begin(), kept.end(),
            [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  return kept;
}

}  // namespace

int32_t SampleToken(const float* logits, int64_t vocab_in_row, const SamplingParams& params,
                    uint64_t step) {
  // Ids past the limit are masked by never being looked at: everything below sees a shorter row.
  const int64_t vocab = SampledVocab(vocab_in_row, params);
  if (params.temperature == 0.0f || vocab == 1) return Greedy(logits, vocab);
  const std::vector<Candidate> kept = KeptCandidates(logits, vocab, params);
  if (kept.empty()) return Greedy(logits, vocab);

  // Inverse CDF over the kept tokens in index order.
  double total = 0.0;
  for (const Candidate& c : kept) total += c.weight;
  const double target = SamplingUniform(params.seed, step) * total;
  double cum = 0.0;
  int32_t last_positive = kept.front().id;
  for (const Candidate& c : kept) {
    if (c.weight <= 0.0) continue;  // underflowed exp: probability 0, never picked
    cum += c.weight;
    last_positive = c.id;
    if (target < cum) return c.id;
  }
  return last_positive;  // target == total after rounding
}

void TokenProbabilities(const float* logits, int64_t vocab_in_row, const SamplingParams& params,
                        double* probs) {
  std::fill(probs, probs + vocab_in_row, 0.0);
  const int64_t vocab = SampledVocab(vocab_in_row, params);
  const std::vector<Candidate> kept = params.temperature == 0.0f || vocab == 1
                                          ? std::vector<Candidate>()
                                          : KeptCandidates(logits, vocab, params);
  if (kept.empty()) {
    probs[Greedy(logits, vocab)] = 1.0;
    return;
  }
  double total = 0.0;
  for (const Candidate& c : kept) total += c.weight;
  for (const Candidate& c : kept) probs[c.id] = c.weight / total;
}

int32_t SampleFromWeights(const double* weights, int64_t vocab, double u) {
  double total = 0.0;
  for (int64_t v = 0; v < vocab; ++v) total += weights[v] > 0.0 ? weights[v] : 0.0;
  const double target = u * total;
  double cum = 0.0;
  int32_t last_positive = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (!(weights[v] > 0.0)) continue;
    cum += weights[v];
    last_positive = static_cast<int32_t>(v);
    if (target < cum) return last_positive;
  }
  return last_positive;
}

}  // namespace cpu
}  // namespace tandem::kernels
