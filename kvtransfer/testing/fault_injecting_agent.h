// FaultInjectingAgent: wraps any TransferAgent and injects transport faults, so connector,
// lease and deadline logic can be tested without a real network failure (the idea of LevelDB's
// EnvWrapper / ErrorEnv).
//
//   InProcessAgent real(fabric, "d0");
//   FaultInjectingAgent agent(&real);
//   agent.SetFaults({.drop = true});        // transfers hang until cancelled
//   agent.SetPeerFaults("p1", {.fail_after_bytes = 4096});
//   agent.KillPeer("p0");                   // transfers to p0 end UNAVAILABLE
//
// Faults (struct Faults) are sampled when a transfer is posted; per-peer faults override the
// default ones; `count` limits how many transfers a fault set applies to:
//  * post_error: PostRead returns this error and posts nothing.
//  * drop: a lost completion. The base agent may move the bytes, but the transfer stays in
//    flight until Cancel (-> CANCELLED), RemovePeer (-> CANCELLED) or KillPeer (-> UNAVAILABLE).
//  * delay: a successful end is reported no earlier than `delay` after PostRead (Cancel ends it
//    without waiting).
//  * fail_after_bytes: only the first N bytes of the batch (in op order) are read; the transfer
//    then ends with `failure` (UNAVAILABLE when OK), even when N covers the whole batch. Only
//    those N bytes reach the base agent, so only they are validated.
// Batches go through the base agent, so validation errors (NOT_FOUND, OUT_OF_RANGE, ...) are the
// base's own.
// KillPeer(name): every outstanding transfer to `name` ends UNAVAILABLE and new ones do too,
// until RevivePeer(name) or AddPeer(name, ...); batches to a dead peer are not handed to the
// base agent at all (nothing is written; only the empty-batch check applies). A killed transfer
// still in flight in the base agent is cancelled there and reported only once the base transfer
// ended, so the contract "nothing is written after the end" holds for every injected fault.
//
// Thread safety: all methods are thread-safe. `base` must be thread-safe (every TransferAgent
// is) and outlive this object.
#ifndef TANDEM_KVTRANSFER_FAULT_INJECTING_AGENT_H_
#define TANDEM_KVTRANSFER_FAULT_INJECTING_AGENT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

// Strided reads are not forwarded (CanReadStrided stays false): a RankKvReader behind this
// wrapper takes its staged path.
class FaultInjectingAgent final : public TransferAgent {
 public:
  struct Faults {
    absl::Status post_error = absl::OkStatus();  // OK = none
    bool drop = false;
    absl::Duration delay = absl::ZeroDuration();
    std::optional<uint64_t> fail_after_bytes = std::nullopt;
    absl::Status failure = absl::UnavailableError("injected transfer failure");
    int count = -1;  // transfers this set applies to; -1 = all
  };

  explicit FaultInjectingAgent(TransferAgent* base) : base_(base) {}
  FaultInjectingAgent(const FaultInjectingAgent&) = delete;
  FaultInjectingAgent& operator=(const FaultInjectingAgent&) = delete;

  // Faults for transfers posted from now on (to peers without SetPeerFaults).
  void SetFaults(Faults faults);
  // Faults for transfers to `peer` posted from now on; overrides SetFaults.
  void SetPeerFaults(const std::string& peer, Faults faults);
  // Back to no faults (does not revive killed peers).
  void ClearFaults();
  void KillPeer(const std::string& peer);
  void RevivePeer(const std::string& peer);

  TransferAgent& base() { return *base_; }

  std::string transport() const override { return base_->transport(); }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override {
    return base_->RegisterMemory(base, length, kind);
  }
  absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) override {
    return base_->FillLocalDescriptor(handshake);
  }
  // Also revives `peer_name` (a reconnect).
  absl::Status AddPeer(const std::string& peer_name,
                       const tandem::v1::TransferHandshake& peer) override;
  void RemovePeer(const std::string& peer_name) override;
  absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                      absl::Span<const CopyOp> ops) override;
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  // Counters as seen through this wrapper (injected failures count as failed); peers from base.
  TransferAgentStats Stats() const override;

 private:
  struct Transfer {
    std::string peer;
    std::optional<TransferId> base_id;  // nullopt: dropped or nothing to read
    bool base_ended = false;
    absl::Status base_result;
    absl::Status forced_end;        // not OK: report this once the base transfer ended
    absl::Status injected_failure;  // not OK: fail_after_bytes
    absl::Time not_before = absl::InfinitePast();
    bool dropped = false;
    bool cancelled = false;
    uint64_t bytes = 0;
  };

  // Picks (and consumes one use of) the faults for a transfer to `peer`.
  Faults TakeFaultsLocked(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends every outstanding transfer to `peer` with `reason` (cancelling it in the base agent).
  void ForceEndLocked(const std::string& peer, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TransferAgent* const base_;
  mutable absl::Mutex mu_;
  Faults default_faults_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Faults> peer_faults_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> dead_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferId, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_FAULT_INJECTING_AGENT_H_
