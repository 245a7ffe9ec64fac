// PullKvConnector: the pull-mode connector over one TransferAgent: the engine's KvConnector, the
// source side's KvLeaseTable (lease_table.h) and KvConnectorMetrics, over one table of leases and
// loads (connector.h says who calls which).
//
// Source side (P): RequestFinished(hold_for_remote=true) grants a lease; the blocks come back in
// GetFinished().sending_done when the reader releases the lease (ReleaseLease, from the
// KvTransferService RPC thread) or when its deadline passes (counted as expired).
// Destination side (D): each request's missing blocks are read with ONE batched READ (contiguous
// runs of (source, local) blocks coalesced into one CopyOp); a load that has not ended by its
// deadline is cancelled and reported as DEADLINE_EXCEEDED once the agent says it ended.
//
// Lease renewal (D side): a load's effective deadline is the earlier of RemoteKvSpec::deadline
// and the source's lease deadline minus lease_safety_margin (reading blocks the source may
// already reuse would be garbage). When a load has been in flight for half of the lease it had
// when it started, GetFinished asks the spec's LeaseClient to extend the lease by that length
// again (asynchronously; never under the connector's lock) and keeps doing so at half of each
// new lease, so a long transfer outlives the original lease. A source that no longer knows the
// lease fails the load (FAILED_PRECONDITION: its blocks may be reused); a failed attempt
// (network) is retried after an eighth of the lease while the old deadline still stands.
//
// Lease binding (source side): a granted lease is bound (BindLease) to what it was issued for,
// the request, its blocks and the one reader, before its handle leaves the worker;
// AuthorizeLeaseUse checks every use against that (kvtransfer/README.md, "Lease binding").
//
// Thread safety: thread-safe (one mutex). The engine thread drives both halves; lease control
// may come from any thread.
#ifndef TANDEM_KVTRANSFER_PULL_CONNECTOR_H_
#define TANDEM_KVTRANSFER_PULL_CONNECTOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/block_transport.h"
#include "kvtransfer/connector.h"
#include "kvtransfer/lease_table.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

struct PullKvConnectorOptions {
  int64_t block_size = 16;     // tokens per block
  uint64_t block_bytes = 0;    // bytes of one block (all layers' K and V, scales included)
  uint32_t local_region = 0;   // agent region index of the local KV pool
  uint32_t remote_region = 0;  // the peer's region index of its KV pool
  // Lease ids are random 64-bit values (OpenSSL's RAND_bytes), so a peer cannot guess another
  // reader's lease to release or renew it.
  // D side: stop reading this long before the source's lease deadline.
  absl::Duration lease_safety_margin = absl::Milliseconds(200);
};

class PullKvConnector final : public KvConnector, public KvLeaseTable, public KvConnectorMetrics {
 public:
  // `agent` must outlive the connector and have the local pool registered; blocks move whole
  // (AgentBlockTransport: the source splits its KV as this worker does).
  PullKvConnector(TransferAgent* agent, const PullKvConnectorOptions& options);
  // Blocks move through `transport` (must outlive the connector): e.g. a RankKvReader
  // (rank_reader.h) that re-shards heads, or a worker group's fan-out to its ranks.
  // options.local_region / remote_region are the transport's business then.
  PullKvConnector(BlockTransport* transport, const PullKvConnectorOptions& options);
  ~PullKvConnector() override;

  // KvConnector
  int64_t GetNumNewMatchedTokens(int64_t request_id, const RemoteKvSpec& remote,
                                 int64_t num_local_computed_tokens) override;
  void UpdateStateAfterAlloc(int64_t request_id, const RemoteKvSpec& remote,
                             absl::Span<const int32_t> block_table,
                             int64_t num_local_computed_tokens) override;
  ConnectorStepMeta BuildStepMeta() override;
  std::optional<KvLease> RequestFinished(int64_t request_id, const std::string& external_id,
                                         bool hold_for_remote, int64_t num_blocks,
                                         absl::Duration lease_duration) override;
  void DropRemote(const RemoteKvSpec& remote) override;
  void CancelLoad(int64_t request_id) override;

  absl::Status StartLoad(const ConnectorStepMeta& meta) override;
  FinishedTransfers GetFinished(absl::Time now) override;
  std::vector<LoadError> GetLoadErrors() override;

  bool HasPendingLoads() const override;

  // KvLeaseTable
  absl::Status PrepareForRemoteRead(absl::Span<const int32_t> block_ids) override;
  absl::Status BindLease(uint64_t lease_id, LeaseBinding binding) override;
  absl::Status ReassignLease(const std::string& request_id, uint64_t lease_id,
                             const std::string& reader) override;
  bool ReleaseLease(uint64_t lease_id) override;
  bool ReleaseLeaseOf(const std::string& external_id) override;
  std::optional<absl::Time> RenewLease(uint64_t lease_id, absl::Duration extend) override;
  absl::Status AuthorizeLeaseUse(const LeaseUse& use) const override;
  bool HasLeaseFor(const std::string& reader) const override;

  // KvConnectorMetrics
  KvConnectorStats Stats() const override;
  std::optional<KvLoadRecord> TakeLoadRecord(int64_t request_id) override;

  // Coalesces (source, local) block pairs into CopyOps: consecutive pairs whose source and local
  // ids both increase by one become one op. Exposed for tests.
  static std::vector<CopyOp> BlocksToCopyOps(absl::Span<const std::pair<int32_t, int32_t>> blocks,
                                             const PullKvConnectorOptions& options);
  // Byte ranges of whole blocks (`block_bytes` each), runs of consecutive ids coalesced.
  static std::vector<ByteRange> BlocksToByteRanges(absl::Span<const int32_t> block_ids,
                                                   uint64_t block_bytes);

 private:
  struct Lease {
    int64_t request_id = 0;
    std::string external_id;
    absl::Time deadline;
    int64_t num_blocks = 0;
    std::optional<LeaseBinding> binding;  // BindLease; unbound leases serve no one
  };
  // A source lease to release once mu_ is released (GetFinished sends them).
  struct SourceRelease {
    std::shared_ptr<LeaseClient> client;
    std::string peer;
    uint64_t epoch = 0;
    uint64_t lease_id = 0;
  };
  struct Load {
    std::string peer;
    absl::Time deadline;  // RemoteKvSpec::deadline (the load's own timeout)
    // Lease renewal (see the header comment); lease_id 0 or no renewer: none.
    uint64_t epoch = 0;
    uint64_t lease_id = 0;
    absl::Time lease_deadline = absl::InfiniteFuture();
    std::shared_ptr<LeaseClient> renewer;
    absl::Duration lease_length;  // the lease left when the load started; each extension
    absl::Time next_renewal = absl::InfiniteFuture();
    bool renewal_in_flight = false;
    std::vector<int32_t> local_blocks;
    std::vector<std::pair<int32_t, int32_t>> blocks;
    std::optional<TransferId> transfer;  // set once posted
    absl::Time posted;                   // when it was posted
    uint64_t bytes = 0;
    // Why we cancelled (CANCELLED for CancelLoad, DEADLINE_EXCEEDED for the deadline); OK if not.
    absl::Status cancel_reason;
  };

  // A renewal GetFinished decided on, sent after it released mu_.
  struct Renewal {
    int64_t request_id;
    TransferId transfer;
    std::string peer;
    uint64_t epoch;
    uint64_t lease_id;
    absl::Duration extend;
    std::shared_ptr<LeaseClient> renewer;
  };
  // Outlives the connector in renewal callbacks: they reach the connector only while it lives
  // (the destructor clears `connector` under `mu`, waiting for a running callback).
  struct RenewalSink {
    absl::Mutex mu;
    PullKvConnector* connector ABSL_GUARDED_BY(mu) = nullptr;
  };

  void FailLoadLocked(int64_t request_id, Load& load, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A load ended (either way): its source lease is no longer needed.
  void QueueSourceReleaseLocked(const Load& load) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a lease (released or expired) and its external-id entry.
  void EraseLeaseLocked(absl::flat_hash_map<uint64_t, Lease>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time EffectiveDeadline(const Load& load) const;
  // GetFinished's work under the lock: lease expiry, ended loads.
  void CollectFinishedLocked(absl::Time now, FinishedTransfers& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the renewals due at `now` (marking them in flight).
  void CollectRenewalsLocked(absl::Time now, std::vector<Renewal>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendRenewals(std::vector<Renewal> renewals) ABSL_LOCKS_EXCLUDED(mu_);
  void OnLeaseRenewed(int64_t request_id, TransferId transfer,
                      const absl::StatusOr<absl::Time>& result) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<BlockTransport> owned_transport_;  // the agent's, or null
  BlockTransport* const transport_;
  const PullKvConnectorOptions options_;
  const std::shared_ptr<RenewalSink> sink_;

  mutable absl::Mutex mu_;
  // A fresh lease id: random, non-zero, not in use.
  uint64_t NewLeaseIdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> lease_of_ ABSL_GUARDED_BY(mu_);  // external id ->
  std::vector<SourceRelease> source_releases_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> released_ ABSL_GUARDED_BY(mu_);  // request ids of released leases
  absl::flat_hash_map<int64_t, Load> loads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> unstarted_ ABSL_GUARDED_BY(mu_);  // registered, not yet in a step meta
  std::vector<LoadError> errors_ ABSL_GUARDED_BY(mu_);
  KvConnectorStats stats_ ABSL_GUARDED_BY(mu_);
  // Completed loads not yet taken (TakeLoadRecord), oldest first; at most kMaxLoadRecords.
  static constexpr size_t kMaxLoadRecords = 4096;
  absl::flat_hash_map<int64_t, KvLoadRecord> load_records_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> load_record_order_ ABSL_GUARDED_BY(mu_);
  http::Histogram load_seconds_{http::LatencyBuckets()};  // completed loads (thread-safe)
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_PULL_CONNECTOR_H_
