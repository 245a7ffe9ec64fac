// NcclLink: one side of a reader/source pair's 2-rank NCCL communicators
// (kvtransfer/nccl/nccl_agent.h) and the pipeline that moves transfers over them. CUDA builds only.
//
// Connect joins one communicator per ncclUniqueId (1 or 2), each with its own NCCL stream, with
// NCCL's non-blocking init (ncclCommInitRankConfig with blocking = 0) and polls them, so it never
// blocks forever: DEADLINE_EXCEEDED when the peer did not join within init_timeout, UNAVAILABLE
// when the control socket closed meanwhile, CANCELLED when `stop` was raised. It then exchanges
// the 1-byte warm-up message (nccl_agent_wire.h) on each under the same deadline, so NCCL's lazy
// p2p connection setup cannot hang a transfer later.
//
// With 2 communicators, NCCL call k of the link (a message, or a run of direct messages; both
// sides count the same calls) goes on communicator k % 2, so NCCL's start-up cost of one message
// overlaps the tail of the one before. The staging ring's events below order the messages
// across both NCCL streams.
//
// Enqueue puts one whole transfer (the messages of an nccl_plan::Plan) on the GPU, in stream
// order behind earlier transfers; nothing waits on the host. Per message:
//   contiguous on this side (nccl_plan::ContiguousAddress): NCCL reads / writes the pool itself.
//   otherwise (rows with gaps between them: by the kernel in every copy mode), with b cycling
//   through the staging ring (continuing across transfers), and [nccl] the stream of the message's
//   communicator:
//     sender   (rank 1, source): [copy] wait free[b]; gather kernel -> staging[b]; record ready[b]
//                                [nccl] wait ready[b]; ncclSend(staging[b]); record free[b]
//     receiver (rank 0, reader): [nccl] wait free[b]; ncclRecv(staging[b]); record ready[b]
//                                [copy] wait ready[b]; scatter kernel -> pool; record free[b]
// so the gather / scatter of one message overlaps the NCCL transfer of its neighbours (and of
// the neighbouring transfers: neither stream waits for the other at a transfer's end). A run of
// consecutive direct messages (nccl_plan::Message::direct) is one ncclGroupStart/End: one
// launch for the run.
// A transfer has ended once all streams passed its last work (an event on each; on the
// receiver the copy stream's is after its last scatter). PollOldest reports ends in order.
// Transfers land in enqueue order (a receiver transfer with direct messages first waits for the
// earlier scatters and NCCL calls); ops of one transfer with overlapping destinations land in no
// set order.
//
// ~NcclLink: ncclCommAbort of every communicator, concurrently (stops NCCL kernels waiting for a
// silent or dead peer), then drains the streams: no byte lands in the pool after it returns.
//
// Memory per link: staging_buffers * staging_chunk_bytes of device memory, allocated by Connect,
// plus per in-flight transfer a tile table (48 bytes per <= 128 KiB of staged data, pinned host +
// device, grown on demand; none with the copy engines, which take the table from the host,
// unless a transfer has strided messages: those go through the kernel in every copy mode).
//
// Thread safety: none. One thread owns a link (the agent's connection thread); `stop` and
// `control_fd` must outlive it.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_LINK_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_LINK_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/nccl/nccl_agent_copy.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"

namespace tandem::kvtransfer {

struct NcclLinkOptions {
  int device = 0;
  uint64_t staging_chunk_bytes = uint64_t{128} << 20;  // packed messages must fit
  int staging_buffers = 3;
  int copy_ctas = 32;  // CTAs of the gather / scatter kernel
  nccl_copy::CopyMode copy_mode = nccl_copy::CopyMode::kKernel;
  // Connect's whole budget; also bounds any later wait for NCCL's non-blocking calls.
  absl::Duration init_timeout = absl::Seconds(30);
};

class NcclLink {
 public:
  enum class Role {
    kReceiver,  // rank 0: the reader
    kSender,    // rank 1: the source
  };

  // ids: one per communicator, 1 or 2 (INVALID_ARGUMENT otherwise); both sides pass the same.
  static absl::StatusOr<std::unique_ptr<NcclLink>> Connect(const NcclLinkOptions& options,
                                                           Role role,
                                                           absl::Span<const ncclUniqueId> ids,
                                                           int control_fd,
                                                           const std::atomic<bool>& stop);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // op_place[i]: where op i lives in this side's pool (device addresses; strided ops are
  // gathered / scattered row by row, nccl_plan::AppendTiles). INVALID_ARGUMENT when a packed
  // message exceeds staging_chunk_bytes. Any other error leaves the link unusable.
  absl::Status Enqueue(const nccl_plan::Plan& plan, absl::Span<const nccl_plan::OpPlace> op_place);
  // OK(true): the oldest enqueued transfer ended (and is forgotten). OK(false): it is still
  // running, or none is. Error: the communicator or the device failed.
  absl::StatusOr<bool> PollOldest();
  size_t in_flight() const { return running_.size(); }

 private:
  struct Slot;  // one in-flight transfer's tile table and end events
  NcclLink(const NcclLinkOptions& options, Role role, int control_fd,
           const std::atomic<bool>& stop);
  absl::Status Setup(absl::Span<const ncclUniqueId> ids);
  // Polls `done` until it says true, failing on its error, `stop`, a closed control socket or
  // `deadline` (DEADLINE_EXCEEDED naming `what`).
  absl::Status WaitFor(const std::function<absl::StatusOr<bool>()>& done, absl::Time deadline,
                       absl::string_view what);
  // A non-blocking communicator answers ncclInProgress; wait (spinning) until the call on `comm`
  // took effect, failing on `stop` or `deadline`.
  absl::Status Settle(ncclComm_t comm, ncclResult_t result, absl::Time deadline);
  // The first asynchronous error of any communicator.
  absl::Status CommErrors();
  absl::StatusOr<std::unique_ptr<Slot>> TakeSlot();
  absl::Status EnqueueWith(Slot& slot, const nccl_plan::Plan& plan,
                           absl::Span<const nccl_plan::OpPlace> op_place);

  const NcclLinkOptions options_;
  const Role role_;
  const int control_fd_;
  const std::atomic<bool>& stop_;
  std::vector<ncclComm_t> comms_;           // null until created
  std::vector<cudaStream_t> nccl_streams_;  // one per communicator
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t join_ = nullptr;      // warm-up; a receiver's direct messages wait for scatters
  std::vector<cudaEvent_t> joins_;  // per NCCL stream: a receiver's direct messages wait for all
  uint64_t next_call_ = 0;          // NCCL calls so far: picks the communicator
  std::vector<cudaEvent_t> ready_;  // per staging buffer: filled (gathered / received)
  std::vector<cudaEvent_t> free_;   // per staging buffer: drained (sent / scattered)
  char* staging_ = nullptr;
  uint64_t staging_stride_ = 0;
  char* scratch_ = nullptr;   // warm-up byte
  uint64_t next_buffer_ = 0;  // staged messages so far: the ring position
  std::vector<std::unique_ptr<Slot>> idle_;
  std::deque<std::unique_ptr<Slot>> running_;
  std::vector<nccl_plan::CopyTile> tiles_;  // scratch of Enqueue
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_LINK_H_
