// Private to //runtime/model: reading checkpoint tensors into fp32 weights with a small bounded
// pool of reader threads, and running independent tasks (a dummy model's shards) on such a pool.
//
// The pool is owned by the one call that makes it and joined before the call returns: no
// threads outlive a load, and nothing is shared between loads. Memory beyond the destination
// vectors is one staging buffer of CheckpointReadOptions::chunk_bytes per thread.
#ifndef TANDEM_RUNTIME_MODEL_CHECKPOINT_READ_H_
#define TANDEM_RUNTIME_MODEL_CHECKPOINT_READ_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime::internal {

// One checkpoint tensor whose rank part (tensor->slice_dim / slice_begin / slice_count) is
// widened to fp32 at `out` (local_numel() floats; ReadTensors16: unused). `info` belongs to `file`,
// whose dtype is F32, BF16 or F16.
struct WidenTask {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  const HfTensor* tensor = nullptr;
  float* out = nullptr;
};

// ReadTensors' 16-bit twin (StreamModelWeights16): each chunk of a task's part is written as
// `dtype` into a buffer of `sink` and committed there as the elements it fills of the task's
// (slot, layer) vector; same reads, same threads, same values rounded to the dtype.
absl::Status ReadTensors16(const std::vector<WidenTask>& tasks, Weight16 dtype,
                           WeightChunkSink* sink, const CheckpointReadOptions& options);

// Reads every task's part with pread (not through the mapping: an I/O error or a file truncated
// since it was opened is a status naming the file, not a SIGBUS), split into reads of at most
// options.chunk_bytes, on options.threads threads (0: the default, see CheckpointReadOptions).
// The first error stops the other readers and is returned. The result does not depend on the
// number of threads or the chunk size.
absl::Status ReadTensors(const std::vector<WidenTask>& tasks, const CheckpointReadOptions& options);

// Runs task(i, worker) for every i in [0, count) on min(threads, count) threads (threads <= 0:
// the hardware's; the calling thread is worker 0, the others 1, 2, ...), each taking the next
// index when done with one; after the first error no new index is started and that error is
// returned.
absl::Status RunTasks(size_t count, int threads,
                      const std::function<absl::Status(size_t index, int worker)>& task);

// CheckpointReadOptions::threads resolved: 0 -> min(8, hardware threads), at least 1.
int ReaderThreads(const CheckpointReadOptions& options);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_CHECKPOINT_READ_H_
