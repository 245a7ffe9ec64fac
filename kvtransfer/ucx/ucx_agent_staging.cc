// UcxAgent, part 3: CUDA memory without UCX CUDA transports (see "Memory kinds" in
// ucx_agent.h): host mirrors of device regions for readers, pinned staging buffers for READs
// into device memory. The CUDA calls go through cuda_staging.h, so this file is the same in
// CPU-only builds, where RegisterStagedCudaLocked reports UNIMPLEMENTED.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/ucx_status.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/ucx/ucx_agent_impl.h"

// Converted UCX error naming the call and the line it failed at.
#define UCX_ERROR(status, call) ::tandem::UcxStatus((status), {(call), __FILE__, __LINE__})

namespace tandem::kvtransfer {

absl::StatusOr<uint32_t> UcxAgentImpl::RegisterStagedCudaLocked(char* device, uint64_t length) {
  if (!CudaStagingCompiled()) {
    return absl::UnimplementedError(
        "CUDA memory: UCX has no CUDA transports and this build has no CUDA to stage through "
        "host memory");
  }
  absl::StatusOr<int> device_id = CudaDeviceOf(device);
  if (!device_id.ok()) return device_id.status();
  if (copy_stream_ != nullptr && copy_stream_->device() != *device_id) {
    return absl::UnimplementedError(absl::StrCat("CUDA memory of device ", *device_id,
                                                 ": this agent stages for device ",
                                                 copy_stream_->device(), " only"));
  }
  if (copy_stream_ == nullptr) RETURN_IF_ERROR(InitStagingLocked(*device_id));
  // The mirror: memory of a shared-memory domain, so readers on this host copy it in place.
  ucp_mem_h memh = nullptr;
  ASSIGN_OR_RETURN(char* mirror, MapSharedHostMemory(length, &memh));
  // Page-locked, device -> mirror copies run at full DMA speed; without it they still work
  // (through the driver's bounce buffers), so a failed pin is not fatal. Pinned granule by
  // granule as SyncForRemoteRead first copies into it: pinning the whole mirror here faulted in
  // and locked all of it (~110 GB per rank of an 8B TP=4 group) before the worker could serve.
  absl::StatusOr<uint32_t> index =
      AddRegionLocked(mirror, length, memh, tandem::v1::MEMORY_KIND_CUDA);
  if (!index.ok()) return index.status();
  const uint64_t granule = options_.cuda_mirror_pin_granule_bytes;
  LocalRegion& region = regions_[*index];
  region.device = device;
  region.mirror_pins = std::make_unique<HostPinGranules>(
      mirror, length, granule == 0 ? length : granule, CudaPinHostMemory, CudaUnpinHostMemory);
  if (granule == 0) region.mirror_pins->PinCovering(0, length).IgnoreError();  // in range
  return index;
}

absl::Status UcxAgentImpl::InitStagingLocked(int device) {
  if (options_.cuda_staging_buffers < 1 || options_.cuda_staging_bytes == 0) {
    return absl::InvalidArgumentError("CUDA staging needs at least one non-empty buffer");
  }
  absl::StatusOr<std::unique_ptr<CudaCopyStream>> stream =
      CudaCopyStream::Create(device, options_.cuda_staging_buffers);
  if (!stream.ok()) return stream.status();
  std::vector<StagingSlot> slots(static_cast<size_t>(options_.cuda_staging_buffers));
  absl::Status status = absl::OkStatus();
  for (size_t i = 0; i < slots.size() && status.ok(); ++i) {
    slots[i].index = static_cast<int>(i);
    absl::StatusOr<void*> host = CudaPinnedAlloc(options_.cuda_staging_bytes);
    if (!host.ok()) {
      status = host.status();
      break;
    }
    slots[i].host = static_cast<char*>(*host);
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = slots[i].host;
    params.length = options_.cuda_staging_bytes;
    params.memory_type = UCS_MEMORY_TYPE_HOST;
    if (ucs_status_t s = ucp_mem_map(context_, &params, &slots[i].memh); s != UCS_OK) {
      slots[i].memh = nullptr;
      status = UCX_ERROR(s, "ucp_mem_map(staging buffer)");
    }
  }
  if (!status.ok()) {
    for (StagingSlot& slot : slots) {
      if (slot.memh != nullptr) ucp_mem_unmap(context_, slot.memh);
      CudaPinnedFree(slot.host);
    }
    return status;
  }
  staging_ = std::move(slots);  // never resized again: UCX callbacks hold slot pointers
  copy_stream_ = *std::move(stream);
  return absl::OkStatus();
}

UcxAgentImpl::StagingSlot* UcxAgentImpl::FreeStagingSlotLocked() {
  for (StagingSlot& slot : staging_) {
    if (slot.state == StagingSlot::State::kFree) return &slot;
  }
  return nullptr;
}

bool UcxAgentImpl::DmaFromMappedLocked(RemoteRegion& remote, uint64_t offset, uint64_t bytes) {
  if (!options_.cuda_dma_from_mapped || remote.mapped == nullptr) return false;
  if (remote.pins == nullptr) {
    // Granules of the mapping, each pinned the first time a request reads it: pinning all of a
    // peer's mirror at once (~110 GB for an 8B TP=4 rank) stalled the first read for tens of
    // seconds, and faulted in pages its source never wrote.
    const uint64_t granule = options_.cuda_mirror_pin_granule_bytes;
    remote.pins = std::make_unique<HostPinGranules>(const_cast<char*>(remote.mapped), remote.length,
                                                    granule == 0 ? remote.length : granule,
                                                    CudaPinHostMemory, CudaUnpinHostMemory);
  }
  // A DMA across two granules (two registrations) fails: such a read takes the staging buffers.
  if (!remote.pins->WithinOneGranule(offset, bytes)) return false;
  absl::StatusOr<bool> pinned = remote.pins->PinCovering(offset, bytes);
  return pinned.ok() && *pinned;  // else the staging buffers
}

void UcxAgentImpl::StartToDeviceLocked(StagingSlot& slot) {
  Transfer& t = *slot.transfer;
  absl::Status started = absl::OkStatus();
  if (t.error.ok()) {  // a stopped transfer writes nothing more
    const char* from = slot.source != nullptr ? slot.source : slot.host;
    if (slot.rows > 1) {  // a strided request: rows packed in `host`, or strided at `source`
      started =
          copy_stream_->Copy2DAsync(slot.device_dst, slot.device_stride, from,
                                    slot.source != nullptr ? slot.source_stride : slot.row_bytes,
                                    slot.row_bytes, slot.rows, slot.index);
    } else {
      started = copy_stream_->CopyAsync(slot.device_dst, from, slot.bytes, slot.index);
    }
    if (started.ok()) {
      slot.state = StagingSlot::State::kToDevice;
      return;
    }
  }
  slot.state = StagingSlot::State::kFree;
  EndRequestLocked(t, slot.bytes, started);
}

bool UcxAgentImpl::PollStagingLocked() {
  bool any = false;
  for (StagingSlot& slot : staging_) {
    if (slot.state != StagingSlot::State::kToDevice) continue;
    absl::StatusOr<bool> done = copy_stream_->SlotDone(slot.index);
    if (done.ok() && !*done) continue;
    slot.state = StagingSlot::State::kFree;
    EndRequestLocked(*slot.transfer, slot.bytes, done.status());
    any = true;
  }
  return any;
}

void UcxAgentImpl::OnStagedGetDone(void* request, ucs_status_t status, void* user_data) {
  StagingSlot* slot = static_cast<StagingSlot*>(user_data);
  Transfer& t = *slot->transfer;
  UcxAgentImpl* agent = t.conn->agent;
  agent->mu_.AssertHeld();  // callbacks run inside UCX calls we make under mu_
  t.requests.erase(request);
  ucp_request_free(request);
  if (status == UCS_OK) {
    agent->StartToDeviceLocked(*slot);
    return;
  }
  slot->state = StagingSlot::State::kFree;
  agent->EndRequestLocked(t, slot->bytes,
                          status == UCS_ERR_CANCELED && t.cancel_requested
                              ? absl::CancelledError(absl::StrCat("transfer ", t.id, " cancelled"))
                              : UCX_ERROR(status, "ucp_get_nbx completion"));
}

void UcxAgentImpl::DestroyStagingLocked() {
  if (copy_stream_ != nullptr) {
    copy_stream_->Synchronize().IgnoreError();  // teardown: nothing left to report to
    PollStagingLocked();
    copy_stream_.reset();
  }
  for (StagingSlot& slot : staging_) {
    if (slot.memh != nullptr) ucp_mem_unmap(context_, slot.memh);
    CudaPinnedFree(slot.host);
  }
  staging_.clear();
}

absl::Status UcxAgentImpl::SyncForRemoteRead(uint32_t region, absl::Span<const ByteRange> ranges) {
  char* device = nullptr;
  char* mirror = nullptr;
  HostPinGranules* pins = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (region >= regions_.size()) {
      return absl::OutOfRangeError(absl::StrCat("SyncForRemoteRead: no region ", region));
    }
    const LocalRegion& r = regions_[region];
    for (const ByteRange& range : ranges) {
      if (range.offset > r.length || range.length > r.length - range.offset) {
        return absl::OutOfRangeError(absl::StrCat("SyncForRemoteRead: range [", range.offset, ", +",
                                                  range.length, ") of region ", region, " (",
                                                  r.length, " bytes)"));
      }
    }
    device = r.device;
    mirror = r.base;
    pins = r.mirror_pins.get();
  }
  if (device == nullptr) return absl::OkStatus();  // host memory: readers see it directly
  // Unlocked: regions are never removed while the agent lives, and a synchronous copy of
  // megabytes must not stall the progress thread.
  for (const ByteRange& range : ranges) {
    if (range.length == 0) continue;
    if (pins == nullptr) {
      RETURN_IF_ERROR(CudaCopy(mirror + range.offset, device + range.offset, range.length));
      continue;
    }
    RETURN_IF_ERROR(pins->PinCovering(range.offset, range.length).status());
    // One copy per granule: a copy across two registrations fails (host_pin_granules.h).
    RETURN_IF_ERROR(pins->ForEachPiece(range.offset, range.length, [&](uint64_t at, uint64_t n) {
      return CudaCopy(mirror + at, device + at, n);
    }));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
