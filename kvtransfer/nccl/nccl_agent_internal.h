// NcclAgent's private parts shared by its files (nccl_agent.h has the design): the state of a
// transfer and of a connection either way, and two helpers. nccl_agent.cc holds the public
// methods (regions, peers, posting, cancel, stats), nccl_agent_reader.cc the reader's connection
// thread (PeerLoop), nccl_agent_source.cc the source's accept loop and its served connections.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_INTERNAL_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_INTERNAL_H_

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_link.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer {

static_assert(sizeof(ncclUniqueId) == nccl_wire::kUniqueIdBytes);

struct NcclAgent::Transfer {
  TransferId id = 0;
  std::vector<StridedCopyOp> ops;  // coalesced; a contiguous op is one row
  uint64_t bytes = 0;
  bool posted = false;  // its kRead went out: it can no longer be withdrawn
  bool cancel = false;
  bool ended = false;
  absl::Status result;
};

// Outgoing connection: this agent reads from the peer (rank 0 of the pair's communicator).
struct NcclAgent::Peer {
  std::string name;
  std::string token;  // the source's access token (desc.access_token), sent in the hello
  std::string host;
  int port = 0;
  std::vector<uint64_t> remote_bytes;
  std::deque<TransferId> queue;  // guarded by the agent's mu_
  bool ready = false;            // guarded by mu_: init finished (see init_status)
  absl::Status init_status;      // guarded by mu_
  absl::Status failure;          // guarded by mu_: not OK once the connection died
  std::atomic<bool> stop{false};
  std::thread thread;
};

// Incoming connection: this agent is the source (rank 1).
struct NcclAgent::Served {
  int fd = -1;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// A reader-side transfer whose kRead went out. Owned by the peer thread; the Transfer itself
// stays in transfers_ (guarded by mu_).
struct NcclAgent::Posted {
  Transfer* t = nullptr;
  absl::Time deadline;  // of the ack (awaiting), or of finishing once it is the oldest (running)
};

namespace nccl_agent_internal {

// The link settings of `o` (both sides of a connection use their own).
NcclLinkOptions LinkOptions(const NcclAgentOptions& o);

// The (row_bytes, rows) of each op, what nccl_plan::MakePlan cuts into messages.
std::vector<nccl_plan::OpShape> OpShapes(absl::Span<const StridedCopyOp> ops);

}  // namespace nccl_agent_internal
}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_INTERNAL_H_
