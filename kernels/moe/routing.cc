// GroupedTopK (moe.h): DeepSeek-V2 / V3 routing on the CPU, as transformers computes it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/moe/moe.h"

namespace tandem::kernels::cpu {
namespace {

absl::Status CheckParams(const GroupedRoutingParams& p) {
  const int64_t e = p.num_experts, g = p.num_groups;
  if (e < 1 || p.top_k < 1 || p.top_k > e || g < 1 || e % g != 0 || p.topk_groups < 1 ||
      p.topk_groups > g || (p.group_score == MoeGroupScore::kTopTwoSum && g > 1 && e / g < 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe grouped routing: ", e, " experts, top_k ", p.top_k, ", ", g,
                     " groups, topk_group ", p.topk_groups,
                     " (need 1 <= top_k <= experts, groups dividing the experts, 1 <= "
                     "topk_group <= groups, and two experts per group for a top-2 group score)"));
  }
  return absl::OkStatus();
}

// Indices of the k largest of v[0, n) (ties: the lower index first), into out[0, k).
void TopIndices(const float* v, int64_t n, int64_t k, std::vector<int32_t>* order, int32_t* out) {
  order->resize(n);
  std::iota(order->begin(), order->end(), 0);
  std::partial_sort(order->begin(), order->begin() + k, order->end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy_n(order->begin(), k, out);
}

}  // namespace

absl::Status GroupedTopK(const float* router_logits, int64_t num_tokens,
                         const GroupedRoutingParams& p, MoeRouting* routing) {
  absl::Status status = CheckParams(p);
  if (!status.ok()) return status;
  const int64_t E = p.num_experts, k = p.top_k, G = p.num_groups, per_group = E / G;
  routing->num_tokens = num_tokens;
  routing->top_k = k;
  routing->expert_ids.resize(num_tokens * k);
  routing->weights.resize(num_tokens * k);
  std::vector<float> scores(E), choice(E), group_scores(G);
  std::vector<int32_t> order, kept(p.topk_groups), pair(2);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* logits = router_logits + t * E;
    if (p.scoring == MoeScoring::kSoftmax) {
      const float max = *std::max_element(logits, logits + E);
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) sum += scores[e] = std::exp(logits[e] - max);
      for (int64_t e = 0; e < E; ++e) scores[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    }
    for (int64_t e = 0; e < E; ++e) {
      choice[e] = scores[e] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
    }
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per_group;
        if (p.group_score == MoeGroupScore::kMax) {
          group_scores[g] = *std::max_element(c, c + per_group);
        } else {
          TopIndices(c, per_group, 2, &order, pair.data());
          group_scores[g] = c[pair[0]] + c[pair[1]];
        }
      }
      TopIndices(group_scores.data(), G, p.topk_groups, &order, kept.data());
      for (int64_t g = 0; g < G; ++g) {
        if (std::find(kept.begin(), kept.end(), g) != kept.end()) continue;
        // transformers 5.17: V3 (sigmoid) masks with -inf, V2 (softmax) with 0.
        std::fill_n(
            choice.data() + g * per_group, per_group,
            p.scoring == MoeScoring::kSigmoid ? -std::numeric_limits<float>::infinity() : 0.0f);
      }
    }
    int32_t* ids = routing->expert_ids.data() + t * k;
    float* weights = routing->weights.data() + t * k;
    TopIndices(choice.data(), E, k, &order, ids);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      // V3 gathers the unbiased sigmoid scores; V2 keeps the (masked) softmax values it chose.
      weights[j] = p.correction_bias != nullptr ? scores[ids[j]] : choice[ids[j]];
      sum += weights[j];
    }
    const float denominator = sum + (p.scoring == MoeScoring::kSigmoid ? 1e-20f : 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      if (p.renormalize) weights[j] /= denominator;
      weights[j] *= p.routed_scaling_factor;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
