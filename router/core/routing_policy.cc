#include "router/core/routing_policy.h"

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::router {
namespace {

// Lower sorts first.
auto PrefillKey(const RouteCandidate& c) {
  return std::make_tuple(-c.cached_tokens, c.load, std::cref(c.worker_id));
}
auto DecodeKey(const RouteCandidate& c) {
  return std::make_tuple(-c.free_blocks, c.load, std::cref(c.worker_id));
}

std::vector<const RouteCandidate*> WithRole(absl::Span<const RouteCandidate> candidates,
                                            v1::WorkerRole role) {
  std::vector<const RouteCandidate*> out;
  for (const RouteCandidate& c : candidates) {
    if (c.role == role) out.push_back(&c);
  }
  return out;
}

// The distinct KV dtypes of `workers`, sorted: "{KV_DTYPE_BF16, KV_DTYPE_FP8_E4M3}" ("?" where a
// worker did not state one).
std::string KvDtypes(absl::Span<const RouteCandidate* const> workers) {
  std::set<std::string> names;
  for (const RouteCandidate* c : workers) names.insert(c->kv_dtype.empty() ? "?" : c->kv_dtype);
  return absl::StrCat("{", absl::StrJoin(names, ", "), "}");
}

}  // namespace

std::optional<std::string> ChooseDecode(absl::Span<const RouteCandidate> candidates,
                                        const std::string& model_id, uint64_t kv_layout_hash,
                                        const absl::flat_hash_set<std::string>& exclude) {
  const RouteCandidate* best = nullptr;
  for (const RouteCandidate& c : candidates) {
    if (c.role != v1::WORKER_ROLE_DECODE || c.model_id != model_id ||
        c.kv_layout_hash != kv_layout_hash || exclude.contains(c.worker_id)) {
      continue;
    }
    if (best == nullptr || DecodeKey(c) < DecodeKey(*best)) best = &c;
  }
  if (best == nullptr) return std::nullopt;
  return best->worker_id;
}

absl::StatusOr<RoutePlan> ChooseRoute(absl::Span<const RouteCandidate> candidates) {
  std::vector<const RouteCandidate*> prefill = WithRole(candidates, v1::WORKER_ROLE_PREFILL);
  std::sort(prefill.begin(), prefill.end(), [](const RouteCandidate* a, const RouteCandidate* b) {
    return PrefillKey(*a) < PrefillKey(*b);
  });
  for (const RouteCandidate* p : prefill) {
    std::optional<std::string> d = ChooseDecode(candidates, p->model_id, p->kv_layout_hash, {});
    if (d.has_value()) {
      RoutePlan plan;
      plan.prefill_worker = p->worker_id;
      plan.decode_worker = *d;
      return plan;
    }
  }
  std::vector<const RouteCandidate*> mixed = WithRole(candidates, v1::WORKER_ROLE_MIXED);
  if (!mixed.empty()) {
    const RouteCandidate* best = *std::min_element(
        mixed.begin(), mixed.end(), [](const RouteCandidate* a, const RouteCandidate* b) {
          return PrefillKey(*a) < PrefillKey(*b);
        });
    RoutePlan plan;
    plan.mixed_worker = best->worker_id;
    return plan;
  }
  const std::vector<const RouteCandidate*> decode = WithRole(candidates, v1::WORKER_ROLE_DECODE);
  const bool none_compatible = !prefill.empty() && !decode.empty();
  return absl::UnavailableError(absl::StrCat(
      "no healthy worker can serve the request: ", prefill.size(), " prefill and ", decode.size(),
      " decode workers healthy",
      none_compatible ? absl::StrCat(" (none compatible: prefill KV dtypes ", KvDtypes(prefill),
                                     ", decode KV dtypes ", KvDtypes(decode), ")")
                      : "",
      ", no mixed worker"));
}

}  // namespace tandem::router
