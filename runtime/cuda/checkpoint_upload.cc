#include "runtime/cuda/checkpoint_upload.h"

#include <cuda_runtime_api.h>

#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace tandem::runtime::cuda {
namespace {

// One reader thread's staging: two pinned buffers used in turn, the stream their copies run on
// and, per buffer, the event of its last copy.
struct Lane {
  std::array<PinnedBuffer, 2> staging;
  std::array<cudaEvent_t, 2> copied = {nullptr, nullptr};
  cudaStream_t stream = nullptr;
  int current = 0;  // the buffer Acquire handed out last
};

class PinnedUploadSink : public WeightChunkSink {
 public:
  PinnedUploadSink(int device, const DeviceSlotBuffer& slot_buffer)
      : device_(device), slot_buffer_(slot_buffer) {}
  ~PinnedUploadSink() override {
    for (Lane& lane : lanes_) {  // copies still in flight read the staging: wait first
      if (lane.stream != nullptr) cudaStreamSynchronize(lane.stream);
      for (cudaEvent_t e : lane.copied) {
        if (e != nullptr) cudaEventDestroy(e);
      }
      if (lane.stream != nullptr) cudaStreamDestroy(lane.stream);
    }
  }

  absl::Status Start(int workers, int64_t chunk_bytes) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    lanes_.resize(static_cast<size_t>(workers));
    for (Lane& lane : lanes_) {
      for (int b = 0; b < 2; ++b) {
        ASSIGN_OR_RETURN(lane.staging[b], PinnedBuffer::Allocate(chunk_bytes, "weight staging"));
        CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&lane.copied[b], cudaEventDisableTiming));
      }
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<void*> Acquire(int worker) override {
    Lane& lane = lanes_[static_cast<size_t>(worker)];
    // The reader threads are the loader's: make the device current on each (cheap when it is).
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    lane.current ^= 1;
    // The copy that last read this buffer (none yet: an unrecorded event is complete).
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane.copied[lane.current]));
    return lane.staging[lane.current].data();
  }

  absl::Status Commit(int worker, const WeightChunk& chunk) override {
    Lane& lane = lanes_[static_cast<size_t>(worker)];
    DeviceBuffer* dst = slot_buffer_(chunk.slot, chunk.layer);
    const int64_t end = (chunk.offset + chunk.count) * 2;
    if (dst == nullptr || chunk.offset < 0 || end > dst->bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint chunk of slot ", static_cast<int>(chunk.slot), " layer ", chunk.layer,
          " (elements [", chunk.offset, ", ", chunk.offset + chunk.count, ")) does not fit ",
          dst == nullptr ? "any device buffer" : absl::StrCat(dst->bytes() / 2, " elements")));
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst->get<uint8_t>() + chunk.offset * 2,
                                         lane.staging[lane.current].data(), chunk.count * 2,
                                         cudaMemcpyHostToDevice, lane.stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.copied[lane.current], lane.stream));
    return absl::OkStatus();
  }

  // Every copy done (the first failure's status).
  absl::Status Finish() {
    absl::Status status;
    for (Lane& lane : lanes_) {
      if (lane.stream == nullptr) continue;
      status.Update(CudaStatus(cudaStreamSynchronize(lane.stream),
                               {"cudaStreamSynchronize", __FILE__, __LINE__}));
    }
    return status;
  }

 private:
  const int device_;
  const DeviceSlotBuffer& slot_buffer_;
  std::vector<Lane> lanes_;  // one per reader thread; lane w used by worker w alone
};

}  // namespace

absl::Status UploadCheckpoint(const CheckpointSource& source, Weight16 dtype, int device,
                              const DeviceSlotBuffer& slot_buffer) {
  PinnedUploadSink sink(device, slot_buffer);
  absl::Status streamed = StreamModelWeights16(source.model_dir, source.config, source.shard, dtype,
                                               &sink, source.read);
  absl::Status finished = sink.Finish();
  RETURN_IF_ERROR(streamed);
  return finished;
}

}  // namespace tandem::runtime::cuda
