// Routing policy: which workers serve one request. Pure functions over a snapshot of candidates,
// so the policy is tested without a network (routing_policy_test.cc).
//
//   prefill (P):  most cached prompt tokens (prefix index), then least load, then worker_id
//   decode  (D):  same model_id and kv_layout_hash as the chosen P; most free KV blocks, then
//                 least load, then worker_id
//   mixed:        only when no healthy P/D pair exists; most cached tokens, then least load
//
// P candidates are tried in order and the first one with a compatible D wins, so a P whose model
// has no decode worker never blocks a pair of another model. Load is running + waiting as the
// worker last reported it, or the router's own count of calls in flight to it when that is
// higher (heartbeats lag; the router's count does not). Ties break on worker_id so the choice is
// deterministic.
//
// Thread safety: pure functions.
#ifndef TANDEM_ROUTER_CORE_ROUTING_POLICY_H_
#define TANDEM_ROUTER_CORE_ROUTING_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tandem/v1/router.pb.h"

namespace tandem::router {

// What the policy needs to know about one healthy, serving worker.
struct RouteCandidate {
  std::string worker_id;
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  std::string model_id;
  uint64_t kv_layout_hash = 0;
  std::string kv_dtype;       // WorkerInfo.kv_dtype (for messages; empty: not stated)
  int64_t cached_tokens = 0;  // prompt tokens found in this worker's prefix index
  int64_t load = 0;           // running + waiting (see above)
  int64_t free_blocks = 0;    // kv_blocks_free
};

struct RoutePlan {
  // Disaggregated: prefill_worker and decode_worker set. Mixed: mixed_worker set.
  std::string prefill_worker;
  std::string decode_worker;
  std::string mixed_worker;
  bool disaggregated() const { return !prefill_worker.empty(); }
};

// UNAVAILABLE (with counts by role) when neither a compatible P/D pair nor a mixed worker exists;
// where P and D workers exist but none pair, the message names the KV dtypes on each side.
absl::StatusOr<RoutePlan> ChooseRoute(absl::Span<const RouteCandidate> candidates);

// The best decode worker compatible with `model_id`/`kv_layout_hash`, skipping `exclude`
// (workers that already failed this request); nullopt when there is none.
std::optional<std::string> ChooseDecode(absl::Span<const RouteCandidate> candidates,
                                        const std::string& model_id, uint64_t kv_layout_hash,
                                        const absl::flat_hash_set<std::string>& exclude);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_ROUTING_POLICY_H_
