// A rank's part of a safetensors checkpoint straight into its device buffers (issue 31: a
// Llama-3-70B TP=4 rank had widened ~35 GB of bf16 into ~70 GB of fp32 host vectors before its
// upload, and the four ranks' 280 GB of fresh host memory kept the group from starting).
//
// StreamModelWeights16 (runtime/model/model_weights.h) reads the rank's tensor parts in the
// activation dtype (bf16 / f16 kept as stored; the same layout, slicing and values as
// LoadModelWeights rounded on the device) on its reader threads. Each thread owns two pinned
// staging buffers and a stream: it reads a chunk into one buffer, enqueues its copy to the
// device on its stream, and reads the next chunk into the other buffer while that copy runs
// (it waits only for the copy that last used a buffer before refilling it). Host memory beyond
// the page cache: 2 x chunk x threads of pinned staging; no host copy of the weights.
//
// Thread safety: UploadCheckpoint is a blocking call that owns its threads and joins them;
// `slot_buffer` is called from those threads concurrently and must only look buffers up.
#ifndef TANDEM_RUNTIME_CUDA_CHECKPOINT_UPLOAD_H_
#define TANDEM_RUNTIME_CUDA_CHECKPOINT_UPLOAD_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda {

// The device buffer the rank's (slot, layer) vector lives in, laid out as ModelWeights holds it
// in 2-byte elements; null when the model has no such buffer.
using DeviceSlotBuffer = std::function<DeviceBuffer*(WeightSlot slot, int64_t layer)>;

// Streams `source`'s rank part as `dtype` into the buffers of `slot_buffer` on `device` and
// returns when every copy has finished. The buffers must be allocated, and any earlier work on
// them (a zero fill) finished. INVALID_ARGUMENT naming the slot for a chunk with no buffer or
// past its end; StreamModelWeights16's errors; CUDA errors converted.
absl::Status UploadCheckpoint(const CheckpointSource& source, Weight16 dtype, int device,
                              const DeviceSlotBuffer& slot_buffer);

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_CHECKPOINT_UPLOAD_H_
