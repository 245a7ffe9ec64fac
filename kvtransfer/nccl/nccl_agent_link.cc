#include "kvtransfer/nccl/nccl_agent_link.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda_status.h"
#include "common/nccl_status.h"
#include "common/status_macros.h"
#include "kvtransfer/nccl/nccl_agent_copy.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"

namespace tandem::kvtransfer {
namespace {

// Largest tile of the gather / scatter kernel: a 64 MiB message makes 512 tiles, enough to keep
// every CTA busy, while the table stays ~0.02% of the data.
constexpr uint64_t kTileBytes = uint64_t{128} << 10;
constexpr size_t kMinTileCapacity = 4096;
constexpr uint64_t kStagingAlign = 256;

}  // namespace

// Freed only after the link drained its streams (~NcclLink), or while idle.
// A transfer ended once all streams passed its last work: an event per stream, not one stream
// waiting for the other, so the next transfer's first gather (sender) can run while this one's
// last send is still on the wire.
struct NcclLink::Slot {
  nccl_plan::CopyTile* host = nullptr;  // pinned
  nccl_plan::CopyTile* device = nullptr;
  size_t capacity = 0;
  cudaEvent_t copy_done = nullptr;
  std::vector<cudaEvent_t> nccl_done;  // per NCCL stream
  ~Slot() {
    if (host != nullptr) cudaFreeHost(host);
    if (device != nullptr) cudaFree(device);
    if (copy_done != nullptr) cudaEventDestroy(copy_done);
    for (cudaEvent_t e : nccl_done) cudaEventDestroy(e);
  }
};

NcclLink::NcclLink(const NcclLinkOptions& options, Role role, int control_fd,
                   const std::atomic<bool>& stop)
    : options_(options), role_(role), control_fd_(control_fd), stop_(stop) {}

absl::StatusOr<std::unique_ptr<NcclLink>> NcclLink::Connect(const NcclLinkOptions& options,
                                                            Role role,
                                                            absl::Span<const ncclUniqueId> ids,
                                                            int control_fd,
                                                            const std::atomic<bool>& stop) {
  if (options.staging_chunk_bytes == 0 || options.staging_buffers < 1 || options.copy_ctas < 1 ||
      ids.empty() || ids.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl link: staging_chunk_bytes ", options.staging_chunk_bytes,
                     ", staging_buffers ", options.staging_buffers, ", copy_ctas ",
                     options.copy_ctas, ", communicators ", ids.size(), " (1 or 2)"));
  }
  std::unique_ptr<NcclLink> link(new NcclLink(options, role, control_fd, stop));
  RETURN_IF_ERROR(link->Setup(ids));
  return link;
}

absl::Status NcclLink::CommErrors() {
  for (ncclComm_t comm : comms_) {
    if (comm == nullptr) continue;
    ncclResult_t state = ncclSuccess;
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state != ncclInProgress) NCCL_RETURN_IF_ERROR(state);
  }
  return absl::OkStatus();
}

absl::Status NcclLink::Setup(absl::Span<const ncclUniqueId> ids) {
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  comms_.assign(ids.size(), nullptr);
  for (size_t c = 0; c < ids.size(); ++c) {
    nccl_streams_.emplace_back();
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&nccl_streams_.back(), cudaStreamNonBlocking));
    joins_.emplace_back();
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&joins_.back(), cudaEventDisableTiming));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  for (int b = 0; b < options_.staging_buffers; ++b) {
    ready_.emplace_back();
    free_.emplace_back();
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_.back(), cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&free_.back(), cudaEventDisableTiming));
  }
  staging_stride_ =
      (options_.staging_chunk_bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&staging_), staging_stride_ * options_.staging_buffers));
  CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&scratch_), kStagingAlign));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const int rank = role_ == Role::kReceiver ? 0 : 1;
  // Both sides start the inits in the same order, so they join concurrently.
  for (size_t c = 0; c < ids.size(); ++c) {
    ncclResult_t init = ncclCommInitRankConfig(&comms_[c], 2, ids[c], rank, &config);
    if (init != ncclSuccess && init != ncclInProgress) {
      NCCL_RETURN_IF_ERROR(init);
    }
  }
  RETURN_IF_ERROR(WaitFor(
      [this]() -> absl::StatusOr<bool> {
        for (ncclComm_t comm : comms_) {
          ncclResult_t state = ncclSuccess;
          NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
          if (state == ncclInProgress) return false;
          NCCL_RETURN_IF_ERROR(state);
        }
        return true;
      },
      deadline, "communicator init (the peer never joined)"));
  // Warm-up: NCCL connects p2p channels lazily, on the first message.
  for (size_t c = 0; c < comms_.size(); ++c) {
    if (role_ == Role::kReceiver) {
      RETURN_IF_ERROR(Settle(
          comms_[c], ncclRecv(scratch_, 1, ncclInt8, 1, comms_[c], nccl_streams_[c]), deadline));
    } else {
      RETURN_IF_ERROR(Settle(
          comms_[c], ncclSend(scratch_, 1, ncclInt8, 0, comms_[c], nccl_streams_[c]), deadline));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(joins_[c], nccl_streams_[c]));
  }
  return WaitFor(
      [this]() -> absl::StatusOr<bool> {
        RETURN_IF_ERROR(CommErrors());
        for (cudaEvent_t e : joins_) {
          const cudaError_t q = cudaEventQuery(e);
          if (q == cudaErrorNotReady) return false;
          CUDA_RETURN_IF_ERROR(q);
        }
        return true;
      },
      deadline, "warm-up message");
}

NcclLink::~NcclLink() {
  cudaSetDevice(options_.device);
  // Abort first: it makes NCCL kernels that wait for the peer exit, so the drains below end.
  // All communicators at once: one's kernels may wait (through the staging ring's events) for
  // the other's, so no abort may wait for the next one to start.
  std::vector<std::thread> aborts;
  for (size_t c = 1; c < comms_.size(); ++c) {
    if (comms_[c] == nullptr) continue;
    aborts.emplace_back([this, c] {
      cudaSetDevice(options_.device);
      ncclCommAbort(comms_[c]);
    });
  }
  if (!comms_.empty() && comms_[0] != nullptr) ncclCommAbort(comms_[0]);
  for (std::thread& t : aborts) t.join();
  for (cudaStream_t s : nccl_streams_) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  idle_.clear();
  running_.clear();
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
  for (cudaEvent_t e : joins_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (staging_ != nullptr) cudaFree(staging_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (cudaStream_t s : nccl_streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
}

absl::Status NcclLink::WaitFor(const std::function<absl::StatusOr<bool>()>& done,
                               absl::Time deadline, absl::string_view what) {
  for (;;) {
    ASSIGN_OR_RETURN(bool finished, done());
    if (finished) return absl::OkStatus();
    if (stop_.load()) return absl::CancelledError("nccl link: connection stopped");
    RETURN_IF_ERROR(nccl_socket::CheckOpen(control_fd_));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("nccl link: ", what,
                                                      " did not finish within ",
                                                      absl::FormatDuration(options_.init_timeout)));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

absl::Status NcclLink::Settle(ncclComm_t comm, ncclResult_t result, absl::Time deadline) {
  // A non-blocking communicator answers every ncclSend / ncclRecv with ncclInProgress and
  // launches it from a helper thread within tens of microseconds; later stream work must wait
  // for that launch. Spin, not sleep: a sleep here (>= ~60 us with timer slack, measured ~300 us
  // per message) would throttle the whole pipeline to one message per sleep.
  uint32_t spins = 0;
  while (result == ncclInProgress) {
    NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &result));
    if (result != ncclInProgress) break;
    if ((++spins & 1023) == 0) {
      if (stop_.load()) return absl::CancelledError("nccl link: connection stopped");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("nccl link: an NCCL call did not launch within ",
                         absl::FormatDuration(options_.init_timeout)));
      }
    }
    std::this_thread::yield();
  }
  NCCL_RETURN_IF_ERROR(result);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclLink::Slot>> NcclLink::TakeSlot() {
  if (!idle_.empty()) {
    std::unique_ptr<Slot> slot = std::move(idle_.back());
    idle_.pop_back();
    return slot;
  }
  auto slot = std::make_unique<Slot>();
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot->copy_done, cudaEventDisableTiming));
  for (size_t c = 0; c < nccl_streams_.size(); ++c) {
    slot->nccl_done.emplace_back();
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot->nccl_done.back(), cudaEventDisableTiming));
  }
  return slot;
}

absl::Status NcclLink::Enqueue(const nccl_plan::Plan& plan,
                               absl::Span<const nccl_plan::OpPlace> op_place) {
  if (plan.max_packed_bytes > options_.staging_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("nccl link: packed message of ",
                                                   plan.max_packed_bytes, " bytes exceeds ",
                                                   options_.staging_chunk_bytes));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  ASSIGN_OR_RETURN(std::unique_ptr<Slot> slot, TakeSlot());
  absl::Status status = EnqueueWith(*slot, plan, op_place);
  if (!status.ok()) {
    idle_.push_back(std::move(slot));  // may still be read by queued work: freed after the drain
    return status;
  }
  running_.push_back(std::move(slot));
  return absl::OkStatus();
}

absl::Status NcclLink::EnqueueWith(Slot& slot, const nccl_plan::Plan& plan,
                                   absl::Span<const nccl_plan::OpPlace> op_place) {
  // Where NCCL reads / writes each message, and which tiles the kernel copies for it.
  struct Step {
    char* buffer = nullptr;
    int ring = -1;  // staging buffer index; -1: NCCL uses the pool directly
    uint32_t first_tile = 0;
    uint32_t num_tiles = 0;
    bool kernel = false;  // the copy kernel moves its tiles (else the copy engines)
  };
  std::vector<Step> steps(plan.messages.size());
  tiles_.clear();
  // The copy engines take one copy per piece, described from the host during the call. A
  // re-shard (any op of strided rows; both sides see the same ops, so both decide alike) goes
  // through the kernel in every mode and for every message: the engines move rows of a few
  // hundred bytes at 80-270 GB/s on an H200, the kernel at 400-1000 (kvtransfer/BENCHMARKS.md,
  // "NCCL re-shard copies"), and on 2 H100s a re-shard with the packed side copied by the
  // engines reached 35-80% of whole blocks, all-kernel 97-99% ("NCCL re-shard on two GPUs").
  const bool reshard = std::any_of(plan.ops.begin(), plan.ops.end(),
                                   [](const nccl_plan::OpShape& op) { return op.rows > 1; });
  const bool engines = options_.copy_mode == nccl_copy::CopyMode::kCopyEngine && !reshard;
  const nccl_plan::Direction direction =
      role_ == Role::kSender ? nccl_plan::Direction::kGather : nccl_plan::Direction::kScatter;
  bool any_kernel = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& s = steps[i];
    const nccl_plan::Message& m = plan.messages[i];
    if (std::optional<uint64_t> addr = nccl_plan::ContiguousAddress(plan, m, op_place)) {
      s.buffer = reinterpret_cast<char*>(*addr);
      continue;
    }
    s.ring = static_cast<int>(next_buffer_++ % static_cast<uint64_t>(options_.staging_buffers));
    s.buffer = staging_ + staging_stride_ * s.ring;
    s.first_tile = static_cast<uint32_t>(tiles_.size());
    const uint64_t staging = reinterpret_cast<uint64_t>(s.buffer);
    nccl_plan::AppendTiles(plan, m, op_place, staging, direction, engines ? UINT64_MAX : kTileBytes,
                           &tiles_);
    s.kernel = !engines || std::any_of(tiles_.begin() + s.first_tile, tiles_.end(),
                                       [](const nccl_plan::CopyTile& t) { return t.rows > 1; });
    if (engines && s.kernel) {  // again, in tiles the kernel's CTAs share out
      tiles_.resize(s.first_tile);
      nccl_plan::AppendTiles(plan, m, op_place, staging, direction, kTileBytes, &tiles_);
    }
    s.num_tiles = static_cast<uint32_t>(tiles_.size()) - s.first_tile;
    any_kernel |= s.kernel;
  }
  if (any_kernel && tiles_.size() > slot.capacity) {
    // The slot is idle (its last transfer ended), so its old table is no longer read.
    const size_t capacity = std::max({tiles_.size(), kMinTileCapacity, 2 * slot.capacity});
    if (slot.host != nullptr) CUDA_RETURN_IF_ERROR(cudaFreeHost(slot.host));
    if (slot.device != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(slot.device));
    slot.host = nullptr;
    slot.device = nullptr;
    slot.capacity = 0;
    const size_t bytes = capacity * sizeof(nccl_plan::CopyTile);
    CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(reinterpret_cast<void**>(&slot.host), bytes, cudaHostAllocDefault));
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&slot.device), bytes));
    slot.capacity = capacity;
  }
  if (any_kernel && !tiles_.empty()) {
    const size_t bytes = tiles_.size() * sizeof(nccl_plan::CopyTile);
    std::memcpy(slot.host, tiles_.data(), bytes);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, copy_stream_));
  }
  // Transfers land in posting order even where their destinations overlap: staged messages
  // are scattered in copy-stream order, but a direct receive writes the pool from an NCCL
  // stream, so it first waits for the scatters and NCCL calls of earlier transfers.
  const bool any_direct =
      std::any_of(steps.begin(), steps.end(), [](const Step& s) { return s.ring < 0; });
  if (role_ == Role::kReceiver && any_direct) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, copy_stream_));
    for (size_t c = 0; c < nccl_streams_.size(); ++c) {
      CUDA_RETURN_IF_ERROR(cudaEventRecord(joins_[c], nccl_streams_[c]));
    }
    for (size_t c = 0; c < nccl_streams_.size(); ++c) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(nccl_streams_[c], join_, 0));
      for (size_t o = 0; o < nccl_streams_.size(); ++o) {
        if (o != c) CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(nccl_streams_[c], joins_[o], 0));
      }
    }
  }
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  // Posts messages [begin, end) as one NCCL call. A non-blocking communicator launches every
  // group from a helper thread of its own (tens of microseconds of host time), so a run of
  // direct messages goes as one group: one launch. Runs are cut by the plan's `direct` flags,
  // which both sides share, so sender and receiver group the same messages, and make the same
  // calls: call k goes on communicator k % comms_.size() on both sides.
  auto stream_of_next = [&]() { return nccl_streams_[next_call_ % nccl_streams_.size()]; };
  auto post = [&](size_t begin, size_t end) -> absl::Status {
    const size_t c = next_call_++ % comms_.size();
    ncclComm_t comm = comms_[c];
    cudaStream_t stream = nccl_streams_[c];
    const bool group = end - begin > 1;
    if (group) NCCL_RETURN_IF_ERROR(ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    for (size_t i = begin; i < end && (r == ncclSuccess || r == ncclInProgress); ++i) {
      r = role_ == Role::kSender ? ncclSend(steps[i].buffer, plan.messages[i].bytes, ncclInt8,
                                            /*peer=*/0, comm, stream)
                                 : ncclRecv(steps[i].buffer, plan.messages[i].bytes, ncclInt8,
                                            /*peer=*/1, comm, stream);
    }
    if (!group) return Settle(comm, r, deadline);
    const ncclResult_t ended = ncclGroupEnd();  // always: it closes the group even after errors
    if (r != ncclSuccess && r != ncclInProgress) {
      Settle(comm, ended, deadline).IgnoreError();
      NCCL_RETURN_IF_ERROR(r);
    }
    return Settle(comm, ended, deadline);
  };
  auto copy = [&](const Step& s) -> cudaError_t {
    if (!s.kernel) {
      return nccl_copy::CopyTilesWithEngines(tiles_.data() + s.first_tile, s.num_tiles,
                                             copy_stream_);
    }
    return nccl_copy::LaunchCopyTiles(slot.device + s.first_tile, s.num_tiles, options_.copy_ctas,
                                      options_.copy_mode == nccl_copy::CopyMode::kStreamingKernel,
                                      copy_stream_);
  };
  for (size_t i = 0; i < steps.size();) {
    const Step& s = steps[i];
    if (plan.messages[i].direct) {
      size_t end = i + 1;
      while (end < steps.size() && plan.messages[end].direct) ++end;
      RETURN_IF_ERROR(post(i, end));
      i = end;
      continue;
    }
    if (s.ring < 0) {  // contiguous on this side only: alone, as the other side posts it
      RETURN_IF_ERROR(post(i, i + 1));
      ++i;
      continue;
    }
    cudaStream_t nccl_stream = stream_of_next();
    if (role_ == Role::kSender) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, free_[s.ring], 0));
      CUDA_RETURN_IF_ERROR(copy(s));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[s.ring], copy_stream_));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(nccl_stream, ready_[s.ring], 0));
      RETURN_IF_ERROR(post(i, i + 1));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[s.ring], nccl_stream));
    } else {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(nccl_stream, free_[s.ring], 0));
      RETURN_IF_ERROR(post(i, i + 1));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[s.ring], nccl_stream));
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, ready_[s.ring], 0));
      CUDA_RETURN_IF_ERROR(copy(s));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(free_[s.ring], copy_stream_));
    }
    ++i;
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copy_done, copy_stream_));
  for (size_t c = 0; c < nccl_streams_.size(); ++c) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.nccl_done[c], nccl_streams_[c]));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> NcclLink::PollOldest() {
  if (running_.empty()) return false;
  RETURN_IF_ERROR(CommErrors());
  const Slot& oldest = *running_.front();
  for (cudaEvent_t done : oldest.nccl_done) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaErrorNotReady) return false;
    CUDA_RETURN_IF_ERROR(q);
  }
  const cudaError_t q = cudaEventQuery(oldest.copy_done);
  if (q == cudaErrorNotReady) return false;
  CUDA_RETURN_IF_ERROR(q);
  idle_.push_back(std::move(running_.front()));
  running_.pop_front();
  return true;
}

}  // namespace tandem::kvtransfer
