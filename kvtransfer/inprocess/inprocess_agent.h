// InProcessAgent: a TransferAgent whose peers live in the same process, for tests of the
// connector, leases and the P/D handoff without a network.
//
//   auto fabric = std::make_shared<InProcessFabric>();
//   InProcessAgent p(fabric, "p0"), d(fabric, "d0");
//   p.RegisterMemory(p_pool, n, MEMORY_KIND_HOST);  d.RegisterMemory(d_pool, n, ...);
//   TransferHandshake hp;  p.FillLocalDescriptor(&hp);  d.AddPeer("p0", hp);
//   id = d.PostRead("p0", ops);  ... d.CheckTransfer(id) ...
//   fabric->Kill("p0");          // P "crashes": every read from it ends UNAVAILABLE
//
// Agents find each other through the InProcessFabric passed to their constructor (no globals):
// FillLocalDescriptor puts "<name>#<incarnation>" into worker_address, and AddPeer resolves it
// on the fabric. A new agent under an existing name replaces the old one on the fabric (a
// restarted worker): the old incarnation counts as dead.
//
// Copies run on one background thread per agent, `chunk_bytes` at a time, so callers observe
// in-flight transfers; between chunks the thread notices Cancel, RemovePeer and peer death.
// HoldTransfers(true) freezes all copying (transfers stay in flight, but still end on Cancel,
// RemovePeer or peer death) so tests can observe in-flight states deterministically.
//
// Memory safety: a source agent's memory is read only while the source is alive on the fabric
// (under its endpoint lock), so once ~InProcessAgent or Kill returns, nothing reads that memory
// again and the caller may free it. The destructor stops the copy thread before returning, so
// nothing writes into the destination's memory afterwards either.
//
// Thread safety: all methods are thread-safe; InProcessFabric is thread-safe.
#ifndef TANDEM_KVTRANSFER_INPROCESS_AGENT_H_
#define TANDEM_KVTRANSFER_INPROCESS_AGENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/transfer_agent.h"
#include "kvtransfer/transfer_table.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

namespace inprocess_internal {
struct Endpoint;
}  // namespace inprocess_internal

// The "network" of InProcessAgents: a name -> agent registry. Must outlive nothing in
// particular: agents hold it by shared_ptr.
class InProcessFabric {
 public:
  InProcessFabric() = default;
  InProcessFabric(const InProcessFabric&) = delete;
  InProcessFabric& operator=(const InProcessFabric&) = delete;

  // Simulates the death of the agent registered under `name` (kill -9 of its process): reads
  // from it fail UNAVAILABLE from now on, and its own transfers end UNAVAILABLE. Returns once no
  // thread reads its memory any more. Returns false when no live agent has that name.
  bool Kill(const std::string& name);

 private:
  friend class InProcessAgent;

  // Registers `endpoint` under `name`, replacing (and killing) a previous incarnation.
  void Attach(const std::string& name, std::shared_ptr<inprocess_internal::Endpoint> endpoint);
  // Removes `endpoint` if it is still the one registered under `name`.
  void Detach(const std::string& name, const inprocess_internal::Endpoint* endpoint);
  std::shared_ptr<inprocess_internal::Endpoint> Find(const std::string& name);
  uint64_t NextIncarnation();

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<inprocess_internal::Endpoint>> agents_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
};

struct InProcessAgentOptions {
  // Bytes copied per step of the copy thread; Cancel and peer death are noticed between steps.
  uint64_t chunk_bytes = 256 << 10;
  // Sleep after every chunk: makes transfers slow enough for cancel / kill tests.
  absl::Duration chunk_delay = absl::ZeroDuration();
};

class InProcessAgent final : public TransferAgent {
 public:
  // `name` is this agent's address on `fabric` (worker names are unique per fabric).
  InProcessAgent(std::shared_ptr<InProcessFabric> fabric, std::string name,
                 InProcessAgentOptions options = {});
  ~InProcessAgent() override;
  InProcessAgent(const InProcessAgent&) = delete;
  InProcessAgent& operator=(const InProcessAgent&) = delete;

  std::string transport() const override { return "inprocess"; }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, uint64_t length,
                                          tandem::v1::MemoryKind kind) override;
  absl::Status FillLocalDescriptor(tandem::v1::TransferHandshake* handshake) override;
  absl::Status AddPeer(const std::string& peer_name,
                       const tandem::v1::TransferHandshake& peer) override;
  void RemovePeer(const std::string& peer_name) override;
  absl::StatusOr<TransferId> PostRead(const std::string& peer_name,
                                      absl::Span<const CopyOp> ops) override;
  // Strided reads: true for every known peer; the rows become one contiguous op each (this
  // transport is memcpy, so there is no per-descriptor cost to avoid).
  bool CanReadStrided(const std::string& peer_name, uint32_t local_region) override;
  absl::StatusOr<TransferId> PostStridedRead(const std::string& peer_name,
                                             absl::Span<const StridedCopyOp> ops) override;
  absl::StatusOr<bool> CheckTransfer(TransferId id) override;
  void Cancel(TransferId id) override;
  TransferAgentStats Stats() const override;

  // Test hook: while held, no bytes move (see the header comment).
  void HoldTransfers(bool hold);

  const std::string& name() const { return name_; }

 private:
  struct Peer {
    std::shared_ptr<inprocess_internal::Endpoint> endpoint;
    std::vector<uint64_t> region_bytes;  // from the peer's descriptor
  };
  struct Transfer {
    TransferId id = 0;
    std::string peer_name;
    std::shared_ptr<inprocess_internal::Endpoint> source;
    std::vector<CopyOp> ops;   // coalesced
    std::vector<char*> dests;  // local destination address of each op
    uint64_t total_bytes = 0;
    size_t next_op = 0;  // progress: ops[next_op] at byte next_offset
    uint64_t next_offset = 0;
    absl::Status cancel_reason;  // not OK once Cancel / RemovePeer asked it to stop
    bool ended = false;          // TransferTable's
    absl::Status result;         // valid once ended
  };

  void CopyLoop();
  // Copies up to chunk_bytes of `t` (called without mu_ held; only the copy thread touches a
  // transfer's progress fields). Returns non-OK when the source is dead.
  absl::Status CopyChunk(Transfer& t);
  void EndLocked(Transfer& t, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<InProcessFabric> fabric_;
  const std::string name_;
  const InProcessAgentOptions options_;
  const std::shared_ptr<inprocess_internal::Endpoint> self_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every event the copy loop must see
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  TransferTable<Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<TransferId> queue_ ABSL_GUARDED_BY(mu_);  // in-flight ids, copied in order
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  TransferAgentStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread copy_thread_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_INPROCESS_AGENT_H_
