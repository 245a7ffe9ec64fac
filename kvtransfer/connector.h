// KvConnector: the engine's view of remote KV (ARCHITECTURE.md, "Connector API"; modelled on
// vLLM's v1 KV connector, which splits its connector by role the same way). The connector is
// cut by caller:
//
//  * KvConnector (here), the engine thread's:
//      scheduler half (bookkeeping only): GetNumNewMatchedTokens, UpdateStateAfterAlloc,
//        BuildStepMeta, RequestFinished (free now, or hold under a lease), DropRemote, CancelLoad
//      around the model run: StartLoad, GetFinished, GetLoadErrors, HasPendingLoads
//  * KvLeaseTable (lease_table.h), the source side's leases: the worker core binds and releases
//    them, the KvTransferService's RPC threads authorize, renew and release them.
//  * KvConnectorMetrics (here): counters and per-request load records, for the worker's status,
//    metrics and traces.
//
// Pull mode (PullKvConnector implements all three): P keeps a finished request's blocks under a
// lease and hands out their ids; D allocates blocks, reads P's blocks with one batched READ per
// request, and only schedules the request once the READ has ended. There is no layer-wise
// work (a push connector, P writing into D's blocks layer by layer, would need per-layer hooks
// around the model run: they come back with its design).
//
// Block safety: a request's blocks are reported back (GetFinished / GetLoadErrors) only after
// the transfer writing into them has ENDED (transfer_agent.h), so the scheduler never frees a
// block that a READ may still write.
#ifndef TANDEM_KVTRANSFER_CONNECTOR_H_
#define TANDEM_KVTRANSFER_CONNECTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/http/prometheus.h"

namespace tandem::kvtransfer {

// D side: the connector's line to a KV source's leases (the source's RenewLease / ReleaseLease
// RPCs; PeerLinks implements it, tests inject fakes). The connector owns a remote lease's whole
// life on the reading side: it renews it while a long load runs and releases it once the load
// has ended (or the request no longer needs it). Implementations must not block: they send in
// the background. RenewLeaseAsync calls `done` exactly once, inline or later from any thread,
// with the lease's new deadline, NOT_FOUND when the source no longer holds the lease (released
// or expired: its blocks may be reused), or the error of the attempt (the lease may still be
// alive). ReleaseLeaseAsync is best effort (the source frees the blocks at expiry otherwise).
// Thread-safe.
class LeaseClient {
 public:
  virtual ~LeaseClient() = default;
  virtual void RenewLeaseAsync(const std::string& peer, uint64_t epoch, uint64_t lease_id,
                               absl::Duration extend,
                               std::function<void(absl::StatusOr<absl::Time>)> done) = 0;
  virtual void ReleaseLeaseAsync(const std::string& peer, uint64_t epoch, uint64_t lease_id) = 0;
};

// Where a request's KV lives on another worker (D side; from a KvHandle).
struct RemoteKvSpec {
  std::string peer;                // transfer-agent peer name (the source worker's id)
  uint64_t epoch = 0;              // the source's epoch when it granted the lease
  std::vector<int32_t> block_ids;  // source physical blocks, logical order
  int64_t num_tokens = 0;          // tokens whose KV the source holds (last block may be partial)
  uint64_t lease_id = 0;
  absl::Time deadline = absl::InfiniteFuture();  // give up loading (cancel) after this
  // The source's lease deadline: a load stops a safety margin before it unless the lease is
  // renewed (PullKvConnector: by `lease_client`, when the load runs longer than half the lease).
  absl::Time lease_deadline = absl::InfiniteFuture();
  // Renews and releases the source's lease; null: neither (the source frees at expiry).
  std::shared_ptr<LeaseClient> lease_client;
};

// A lease granted on the source side (P) for a finished request's blocks.
struct KvLease {
  uint64_t lease_id = 0;
  absl::Time deadline;
};

// One request's load, as BuildStepMeta hands it to StartLoad.
struct LoadSpec {
  int64_t request_id = 0;
  std::string peer;
  absl::Time deadline;
  // (source block, local block) pairs to read; the prefix-cache hits are already skipped.
  std::vector<std::pair<int32_t, int32_t>> blocks;
};

struct ConnectorStepMeta {
  std::vector<LoadSpec> loads;
};

struct FinishedTransfers {
  // Source side: requests whose lease ended (released, expired, or dropped): free their blocks.
  std::vector<int64_t> sending_done;
  // Destination side: requests whose KV arrived completely.
  std::vector<int64_t> receiving_done;
};

// A request whose load ended without the KV (transfer error, deadline, cancel, stale epoch).
// Its blocks are safe to free or reuse. block_ids = the local blocks that did not get valid KV.
struct LoadError {
  int64_t request_id = 0;
  absl::Status status;
  std::vector<int32_t> block_ids;
};

struct KvConnectorStats {
  uint64_t leases_granted = 0;
  uint64_t leases_released = 0;
  uint64_t leases_expired = 0;
  uint64_t lease_renewals = 0;  // D side: renewals of sources' leases that succeeded
  uint64_t leases_active = 0;
  uint64_t blocks_leased = 0;  // blocks currently held under leases
  uint64_t loads_started = 0;
  uint64_t loads_completed = 0;
  uint64_t load_failures = 0;
  uint64_t bytes_loaded = 0;
  // Completed loads, summed: from posting the read to the poll (GetFinished) that saw it end,
  // i.e. the wait a request had for its KV. Mean load time = load_micros / loads_completed.
  uint64_t load_micros = 0;
  // The same loads one by one (seconds, posting to end; http::LatencyBuckets): the workers'
  // tandem:kv_transfer_duration_seconds. Empty (no bounds) from a connector that keeps none.
  http::HistogramSnapshot load_seconds;
};

// One request's completed KV load: its bytes and its time from posting the read to its end.
struct KvLoadRecord {
  uint64_t bytes = 0;
  uint64_t micros = 0;
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // ---- Scheduler half ----
  // Tokens beyond num_local_computed_tokens (the local prefix-cache hit, block aligned) that
  // `remote` can supply; 0 when none. No side effects. Always loaded asynchronously.
  virtual int64_t GetNumNewMatchedTokens(int64_t request_id, const RemoteKvSpec& remote,
                                         int64_t num_local_computed_tokens) = 0;
  // The scheduler allocated `block_table` (logical -> local block) covering the local hit plus
  // the external tokens. Remembers the (source, local) block pairs to read.
  virtual void UpdateStateAfterAlloc(int64_t request_id, const RemoteKvSpec& remote,
                                     absl::Span<const int32_t> block_table,
                                     int64_t num_local_computed_tokens) = 0;
  // Loads registered since the last call.
  virtual ConnectorStepMeta BuildStepMeta() = 0;
  // A request finished. hold_for_remote: keep its `num_blocks` blocks for a remote reader under
  // a lease of `lease_duration` (returns it; the caller must not free the blocks until the
  // request shows up in GetFinished().sending_done). Otherwise nullopt: free now.
  // `external_id` (the router's request id, may be empty) lets KvLeaseTable::ReleaseLeaseOf find
  // the lease.
  virtual std::optional<KvLease> RequestFinished(int64_t request_id, const std::string& external_id,
                                                 bool hold_for_remote, int64_t num_blocks,
                                                 absl::Duration lease_duration) = 0;
  // D side: `remote` will not be loaded (its tokens were all in the local prefix cache, or the
  // request ended before its load started): release the source's lease now.
  virtual void DropRemote(const RemoteKvSpec& remote) = 0;
  // Stops a load; the request is reported in GetLoadErrors (CANCELLED) once the transfer ended.
  virtual void CancelLoad(int64_t request_id) = 0;

  // ---- Around the model run ----
  virtual absl::Status StartLoad(const ConnectorStepMeta& meta) = 0;
  // Polls transfers and lease deadlines at `now`.
  virtual FinishedTransfers GetFinished(absl::Time now) = 0;
  // Loads that ended in error since the last call.
  virtual std::vector<LoadError> GetLoadErrors() = 0;
  // True while loads are in flight (the engine keeps polling) or leases are held.
  virtual bool HasPendingLoads() const = 0;
};

// The connector's counters and per-request load records (the worker's status, metrics and
// traces). Thread-safe.
class KvConnectorMetrics {
 public:
  virtual ~KvConnectorMetrics() = default;
  virtual KvConnectorStats Stats() const = 0;
  // One completed load of `request_id` (engine id), taken once (a per-request trace); nullopt
  // when the load did not complete or its record was taken or dropped already.
  virtual std::optional<KvLoadRecord> TakeLoadRecord(int64_t request_id) = 0;
};

// Releases the source lease `remote` names (asynchronously, best effort; nothing when it names
// none or has no LeaseClient): KvConnector::DropRemote for a spec that never reached the engine.
inline void ReleaseSourceLease(const RemoteKvSpec& remote) {
  if (remote.lease_client != nullptr && remote.lease_id != 0) {
    remote.lease_client->ReleaseLeaseAsync(remote.peer, remote.epoch, remote.lease_id);
  }
}

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_CONNECTOR_H_
