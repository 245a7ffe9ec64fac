// WorkerRegistry: every worker the router knows, its health, load and approximate prefix cache.
//
// Lifecycle of an entry (keyed by worker_id):
//   Register(info)     adds it, or replaces it when the epoch grew (a restarted worker: fresh
//                      channel, empty prefix index); an epoch that is not newer, or that is
//                      ahead of the router's clock by more than max_epoch_ahead, is refused.
//   Heartbeat(...)     refreshes status/load, applies the prefix-index delta (removals first,
//                      then additions: a hash in both lists was evicted and cached again, so it
//                      ends up present); returns false
//                      ("register again") for an unknown worker or a different epoch.
//   CheckTimeouts()    (the router's health thread) marks workers whose last heartbeat is older
//                      than worker_timeout unhealthy, and forgets those silent for forget_after.
//   EndCall(failed)    a call that found the worker dead marks it unhealthy for a backoff
//                      (heartbeat_interval * 2^(consecutive failures - 1), capped); the first
//                      heartbeat after the backoff re-admits it, so a worker whose process lives
//                      but whose calls keep failing is retried ever more rarely, not on every beat.
//   ReadmitReconnected() re-admits the workers held out after a call found their link down whose
//                      connection is up again (a request waiting for a route asks, every poll).
//   Answered(ref)      a worker that answers a call begun after its failure (a reply, a stream's
//                      first message) is re-admitted at once: it is reachable again (a link that
//                      came back), so requests need not wait out the rest of its backoff.
// A worker is healthy iff it is neither timed out nor in failure backoff. Routing sees only
// healthy workers whose status is SERVING (or not yet reported).
//
// Identity (the one place the router decides who may speak for a worker id). Register and
// Heartbeat take the caller as the transport authenticated it (RegistryCaller). With TLS a
// worker id is claimed only by a certificate that NAMES it (make_certs.sh --worker=ID:ROLE, URI
// spiffe://tandem/role/ROLE/worker/ID) and is of the registered role; role-only worker
// certificates (prefill.pem, decode.pem, mixed.pem) register and heartbeat for no id at all.
// An entry remembers the identity that registered it: while it is live (not timed out) only
// that identity replaces it, and only that identity heartbeats for it. All refusals are
// PERMISSION_DENIED with the generic message (the reason is logged, common/security/auth_status.h).
// Without TLS (--insecure) there are no identities: only the epoch rules hold.
//
// Epochs: a worker daemon's epoch is its start time in Unix microseconds
// (runtime/worker/worker_daemon.cc); any increasing number works (fake workers use 1, 2, ...).
// The router refuses one more than max_epoch_ahead ahead of its own clock, so no registration
// can push the id's epoch far into the future and lock the next incarnation out.
//
// Thread safety: all methods are thread-safe (one mutex). Prompt hashing for routing happens
// outside the lock.
#ifndef TANDEM_ROUTER_CORE_WORKER_REGISTRY_H_
#define TANDEM_ROUTER_CORE_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security/roles.h"
#include "router/core/prefix_index.h"
#include "router/core/routing_policy.h"
#include "router/core/worker_client.h"
#include "tandem/v1/router.pb.h"

namespace tandem::router {

struct RegistryOptions {
  // Told to workers at registration; also the unit of the failure backoff.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // No heartbeat for this long -> unhealthy (re-admitted by the next heartbeat).
  absl::Duration worker_timeout = absl::Seconds(5);
  // Silent for this long -> removed from the registry (it must register again).
  absl::Duration forget_after = absl::Minutes(10);
  absl::Duration max_failure_backoff = absl::Seconds(30);
  size_t prefix_index_max_blocks = size_t{1} << 20;  // per worker
  // The most a registration's epoch (Unix microseconds) may be ahead of the router's clock:
  // room for clocks of different hosts that disagree a little (NTP keeps them within ms).
  absl::Duration max_epoch_ahead = absl::Minutes(1);
};

// Who sends a registration or heartbeat, as the transport authenticated it.
struct RegistryCaller {
  // The caller's certificate; nullopt only when the router runs without TLS (--insecure).
  std::optional<security::PeerIdentity> peer;
};

// One worker as a request uses it. The client is shared: it stays valid for the call even if
// the worker re-registers meanwhile (a new incarnation gets a new client).
struct WorkerRef {
  v1::WorkerInfo info;
  std::shared_ptr<WorkerClient> client;
  absl::Time begun;  // when BeginCall made it (the registry's clock)
};

// Candidates for one prompt plus the prompt's hash chains (one per block size in use), so the
// chosen worker's index can be updated without hashing again.
struct RoutingSnapshot {
  std::vector<RouteCandidate> candidates;
  absl::flat_hash_map<uint32_t, std::vector<uint64_t>> chains;  // block_size -> h_0.Short(), ...
  int registered = 0;                                           // all workers, healthy or not
  // Workers out of routing only for their short failure backoff (heartbeating, not timed out,
  // serving): one may be back in a moment (see OrchestratorOptions::route_wait).
  int in_backoff = 0;
};

class WorkerRegistry {
 public:
  using Clock = std::function<absl::Time()>;

  // `clients` makes the client of each registered worker incarnation (the gRPC one in the
  // router, fakes in tests); empty: entries have no client (tests of the bookkeeping alone).
  explicit WorkerRegistry(RegistryOptions options, Clock clock = absl::Now,
                          WorkerClientFactory clients = {});

  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // INVALID_ARGUMENT for a malformed WorkerInfo; PERMISSION_DENIED when `caller` may not claim
  // the id (see "Identity" above); FAILED_PRECONDITION for an epoch that is not newer than the
  // registered one (the same epoch from the same address is a retry: OK) or too far ahead.
  absl::Status Register(const v1::WorkerInfo& info, const RegistryCaller& caller);
  // Returns `known`. INVALID_ARGUMENT for a malformed request; PERMISSION_DENIED when `caller`
  // may not speak for the worker (a DRAINING beat would take it out of routing).
  absl::StatusOr<bool> Heartbeat(const v1::HeartbeatRequest& request, const RegistryCaller& caller);

  // Healthy serving workers with their cached-prefix length for this prompt (tokens hashed with
  // each worker's block_size and `cache_salt`).
  RoutingSnapshot Snapshot(absl::Span<const uint32_t> prompt, const std::string& cache_salt) const;

  // Starts a call on `worker_id`: counts it in the worker's load and, for a P or mixed worker,
  // inserts the prompt's chain into its prefix index right away (the worker will cache it; the
  // heartbeat that confirms it comes later). NOT_FOUND if the worker is gone.
  absl::StatusOr<WorkerRef> BeginCall(const std::string& worker_id,
                                      const RoutingSnapshot* snapshot = nullptr);
  // Ends a call begun by BeginCall. `worker_failed`: the worker is dead or broken (UNAVAILABLE,
  // broken stream): mark it unhealthy with backoff; `link_down`: its connection was down then
  // (see ReadmitReconnected). Ignored when the worker re-registered since.
  void EndCall(const WorkerRef& worker, bool worker_failed, absl::string_view error = "",
               bool link_down = false);
  // Re-admits the workers in failure backoff (not timed out) whose failing call found their
  // connection down and whose connection is up again (WorkerClient::Connected, which also asks
  // an idle one to connect); returns how many. Clients are asked outside the lock.
  int ReadmitReconnected();
  // The worker answered the call `worker` was begun for: out of its failure backoff at once when
  // the call began after the failure (an answer to an older call proves nothing new).
  void Answered(const WorkerRef& worker);

  // Marks silent workers unhealthy; returns the ids that just became so.
  std::vector<std::string> CheckTimeouts();

  v1::ListWorkersResponse List() const;

  // The smallest vocabulary and max_model_len among healthy serving workers (0, 0 when there is
  // none): what any client needs to form valid prompts, without the workers' addresses.
  struct ModelLimits {
    uint32_t vocab_size = 0;
    uint32_t max_model_len = 0;
  };
  ModelLimits Limits() const;

 private:
  struct Entry {
    explicit Entry(size_t index_blocks) : index(index_blocks) {}
    v1::WorkerInfo info;
    std::string owner;  // the identity that registered it ("" without TLS)
    std::shared_ptr<WorkerClient> client;
    v1::ServingStatus status = v1::SERVING_STATUS_UNSPECIFIED;
    v1::WorkerLoad load;
    absl::Time last_heartbeat;  // registration counts as the first heartbeat
    bool timed_out = false;
    bool failed = false;     // in failure backoff
    bool link_down = false;  // ... after a call that found its connection down
    int consecutive_failures = 0;
    absl::Time failed_at, failed_until;
    int64_t in_flight = 0;  // calls this router has open on the worker
    PrefixIndex index;
    bool healthy() const { return !timed_out && !failed; }
  };

  const RegistryOptions options_;
  const Clock clock_;
  const WorkerClientFactory clients_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> workers_ ABSL_GUARDED_BY(mu_);
};

// One worker's part in a request, from BeginCall until destroyed (EndCall): counted in the
// worker's load meanwhile; MarkFailed makes the registry mark the worker unhealthy at the end.
class WorkerSlot {
 public:
  WorkerSlot(WorkerRegistry* registry, WorkerRef ref) : registry_(registry), ref_(std::move(ref)) {}
  ~WorkerSlot() { registry_->EndCall(ref_, failed_, error_, link_down_); }
  WorkerSlot(const WorkerSlot&) = delete;
  WorkerSlot& operator=(const WorkerSlot&) = delete;

  const WorkerRef& ref() const { return ref_; }
  const std::string& id() const { return ref_.info.worker_id(); }
  // `link_down`: the worker's connection was down (WorkerClient::Connected) when the call failed.
  void MarkFailed(std::string error, bool link_down = false) {
    failed_ = true;
    link_down_ = link_down;
    error_ = std::move(error);
  }

 private:
  WorkerRegistry* const registry_;
  const WorkerRef ref_;
  bool failed_ = false, link_down_ = false;
  std::string error_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_WORKER_REGISTRY_H_
