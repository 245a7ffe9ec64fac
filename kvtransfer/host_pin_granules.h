// HostPinGranules: page-locks a large host buffer granule by granule, each the first time a
// copy is about to touch it, instead of all of it up front.
//
// Why (issue 31): UcxAgent serves a CUDA KV pool through a host mirror of the whole pool
// (kvtransfer/ucx/DESIGN.md); pinning it at registration (cudaHostRegister) faults in and locks
// every page, ~110 GB per rank of an 8B TP=4 group at gpu_memory_utilization 0.85, and held the
// worker's start for tens of seconds. The device -> mirror copies only need the ranges they copy
// pinned to run at DMA speed, so SyncForRemoteRead pins what it is about to copy; a reader on
// the same host that DMAs from its mapping of a peer's mirror (cuda_dma_from_mapped) likewise
// pins what each request reads. An unpinned range still copies (through the driver's bounce
// buffers or the staging buffers, slower), so a failed pin is not an error: it is counted and
// not tried again.
//
//   HostPinGranules pins(mirror, length, uint64_t{16} << 20, CudaPinHostMemory,
//                        CudaUnpinHostMemory);
//   RETURN_IF_ERROR(pins.PinCovering(offset, bytes).status());  // then copy [offset, +bytes)
//
// Granules are [i * granule_bytes, min((i + 1) * granule_bytes, length)) of the buffer, each
// pinned by its own call (a page-aligned base and granule size keep them on distinct pages).
// The destructor unpins every granule it pinned (before the caller unmaps the buffer).
//
// Thread safety: thread-safe; pins are serialised by one mutex (a caller whose granules are all
// tried waits for a concurrent pin to finish).
#ifndef TANDEM_KVTRANSFER_HOST_PIN_GRANULES_H_
#define TANDEM_KVTRANSFER_HOST_PIN_GRANULES_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::kvtransfer {

class HostPinGranules {
 public:
  using PinFn = std::function<absl::Status(void* ptr, uint64_t bytes)>;
  using UnpinFn = std::function<void(void* ptr)>;

  struct Stats {
    uint64_t granules_pinned = 0;
    uint64_t granules_failed = 0;  // pin refused: left unpinned, not retried
    uint64_t bytes_pinned = 0;
  };

  // REQUIRES: granule_bytes > 0; [base, base + length) stays mapped until destruction.
  HostPinGranules(char* base, uint64_t length, uint64_t granule_bytes, PinFn pin, UnpinFn unpin);
  ~HostPinGranules();
  HostPinGranules(const HostPinGranules&) = delete;
  HostPinGranules& operator=(const HostPinGranules&) = delete;

  // Pins every granule that [offset, offset + bytes) touches and that was not tried before;
  // returns whether all of them are pinned now (false: a pin was refused, now or before).
  // OUT_OF_RANGE for a range beyond the buffer; a refused pin is counted, never an error.
  absl::StatusOr<bool> PinCovering(uint64_t offset, uint64_t bytes);

  Stats stats() const;
  // Each granule is its own page-locked registration, and CUDA refuses one copy that spans two
  // (cudaErrorInvalidValue, seen on an H200): callers copy granule by granule (ForEachPiece) or
  // take another path for a range that is not WithinOneGranule.
  uint64_t granule_bytes() const { return granule_bytes_; }
  bool WithinOneGranule(uint64_t offset, uint64_t bytes) const {
    return bytes == 0 || offset / granule_bytes_ == (offset + bytes - 1) / granule_bytes_;
  }
  // Calls copy(piece_offset, piece_bytes) for [offset, offset + bytes) cut at granule
  // boundaries, in order; stops at the first error and returns it.
  template <typename Copy>
  absl::Status ForEachPiece(uint64_t offset, uint64_t bytes, Copy copy) const {
    for (uint64_t at = offset; at < offset + bytes;) {
      const uint64_t end = std::min(offset + bytes, (at / granule_bytes_ + 1) * granule_bytes_);
      if (absl::Status s = copy(at, end - at); !s.ok()) return s;
      at = end;
    }
    return absl::OkStatus();
  }

 private:
  enum class State : uint8_t { kUntried, kPinned, kFailed };

  char* const base_;
  const uint64_t length_;
  const uint64_t granule_bytes_;
  const PinFn pin_;
  const UnpinFn unpin_;
  mutable absl::Mutex mu_;
  std::vector<State> granules_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_HOST_PIN_GRANULES_H_
