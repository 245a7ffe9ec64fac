#include "kvtransfer/host_pin_granules.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

HostPinGranules::HostPinGranules(char* base, uint64_t length, uint64_t granule_bytes, PinFn pin,
                                 UnpinFn unpin)
    : base_(base),
      length_(length),
      granule_bytes_(std::max<uint64_t>(granule_bytes, 1)),
      pin_(std::move(pin)),
      unpin_(std::move(unpin)),
      granules_((length + granule_bytes_ - 1) / granule_bytes_, State::kUntried) {}

HostPinGranules::~HostPinGranules() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < granules_.size(); ++i) {
    if (granules_[i] == State::kPinned) unpin_(base_ + i * granule_bytes_);
  }
}

absl::StatusOr<bool> HostPinGranules::PinCovering(uint64_t offset, uint64_t bytes) {
  if (offset > length_ || bytes > length_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("pin range [", offset, ", +", bytes, ") of a buffer of ", length_, " bytes"));
  }
  if (bytes == 0) return true;
  const uint64_t first = offset / granule_bytes_;
  const uint64_t last = (offset + bytes - 1) / granule_bytes_;
  absl::MutexLock lock(&mu_);
  bool all = true;
  for (uint64_t i = first; i <= last; ++i) {
    if (granules_[i] == State::kFailed) all = false;
    if (granules_[i] != State::kUntried) continue;
    const uint64_t begin = i * granule_bytes_;
    const uint64_t size = std::min(granule_bytes_, length_ - begin);
    if (pin_(base_ + begin, size).ok()) {
      granules_[i] = State::kPinned;
      ++stats_.granules_pinned;
      stats_.bytes_pinned += size;
    } else {
      granules_[i] = State::kFailed;
      ++stats_.granules_failed;
      all = false;
    }
  }
  return all;
}

HostPinGranules::Stats HostPinGranules::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tandem::kvtransfer
