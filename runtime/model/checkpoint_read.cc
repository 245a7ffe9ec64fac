#include "runtime/model/checkpoint_read.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "runtime/model/half.h"

namespace tandem::runtime::internal {
namespace {

// One read: units [begin, end) of a task. A unit is an element where the rank's part is
// contiguous in the file (whole tensors, row slices), a row where it is a column slice (one
// pread per row: a row-parallel rank's columns of a row are a few KiB, and reading only them
// reads ~1/N of the tensor).
struct Chunk {
  size_t task = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

int64_t ItemSize(const TensorInfo& info) { return info.dtype == SafetensorsDtype::kF32 ? 4 : 2; }

// Units of a task and floats each unit fills.
struct TaskShape {
  int64_t units = 0;
  int64_t floats_per_unit = 1;
};
TaskShape ShapeOf(const HfTensor& t) {
  if (t.slice_dim == 1) return {t.shape[0], t.slice_count};
  if (t.slice_dim == 0) {
    const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
    return {t.slice_count * cols, 1};
  }
  return {t.numel(), 1};
}

// Element of the checkpoint tensor where unit `u`'s part starts.
int64_t SourceElement(const HfTensor& t, int64_t u) {
  if (t.slice_dim == 1) return u * t.shape[1] + t.slice_begin;
  if (t.slice_dim == 0) {
    const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
    return t.slice_begin * cols + u;
  }
  return u;
}

void Widen(SafetensorsDtype dtype, const uint8_t* src, int64_t count, float* out) {
  const bool bf16 = dtype == SafetensorsDtype::kBF16;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    out[i] = bf16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
  }
}

// Reads one chunk into its destination; `staging` holds at least one chunk of 16-bit source.
absl::Status ReadChunk(const WidenTask& task, const Chunk& chunk, std::vector<uint8_t>* staging) {
  const HfTensor& t = *task.tensor;
  const TensorInfo& info = *task.info;
  const int64_t item = ItemSize(info);
  const int64_t per_unit = ShapeOf(t).floats_per_unit;
  float* out = task.out + chunk.begin * per_unit;
  // Column slices: one read per row; otherwise the chunk is one contiguous range.
  const int64_t reads = t.slice_dim == 1 ? chunk.end - chunk.begin : 1;
  const int64_t floats_per_read = t.slice_dim == 1 ? per_unit : chunk.end - chunk.begin;
  for (int64_t r = 0; r < reads; ++r) {
    const int64_t offset = SourceElement(t, chunk.begin + r) * item;
    const int64_t nbytes = floats_per_read * item;
    float* dst = out + r * floats_per_read;
    if (info.dtype == SafetensorsDtype::kF32) {  // straight into the destination
      RETURN_IF_ERROR(task.file->ReadTensorBytes(info, offset, nbytes, dst));
      continue;
    }
    RETURN_IF_ERROR(task.file->ReadTensorBytes(info, offset, nbytes, staging->data()));
    Widen(info.dtype, staging->data(), floats_per_read, dst);
  }
  return absl::OkStatus();
}

// The first of the workers' errors; failed() is cheap to poll between tasks.
class FirstError {
 public:
  void Record(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
    failed_ = true;
  }
  bool failed() const { return failed_.load(); }
  absl::Status Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return std::move(status_);
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace

int ReaderThreads(const CheckpointReadOptions& options) {
  if (options.threads > 0) return options.threads;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hardware, 1, 8);
}

absl::Status RunTasks(size_t count, int threads,
                      const std::function<absl::Status(size_t index, int worker)>& task) {
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int workers = static_cast<int>(std::min(count, static_cast<size_t>(threads)));
  std::atomic<size_t> next{0};
  FirstError error;
  auto work = [&](int worker) {
    for (size_t i = next++; i < count && !error.failed(); i = next++) {
      absl::Status status = task(i, worker);
      if (!status.ok()) error.Record(std::move(status));
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);  // the calling thread is one of them
  for (std::thread& thread : pool) thread.join();
  return error.Take();
}

absl::Status ReadTensors(const std::vector<WidenTask>& tasks,
                         const CheckpointReadOptions& options) {
  const int64_t chunk_bytes = std::max<int64_t>(options.chunk_bytes, 1);
  // In file order: each file is read front to back, which keeps the kernel's readahead useful.
  std::vector<Chunk> chunks;
  int64_t largest_read = 1;  // bytes of 16-bit source one read covers: the staging size
  for (size_t i = 0; i < tasks.size(); ++i) {
    const HfTensor& t = *tasks[i].tensor;
    const TaskShape shape = ShapeOf(t);
    const int64_t unit_bytes = shape.floats_per_unit * ItemSize(*tasks[i].info);
    const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / unit_bytes);
    for (int64_t u = 0; u < shape.units; u += per_chunk) {
      chunks.push_back({i, u, std::min(shape.units, u + per_chunk)});
    }
    const int64_t read =
        t.slice_dim == 1 ? unit_bytes : std::min(per_chunk, shape.units) * unit_bytes;
    largest_read = std::max(largest_read, read);
  }
  const int threads = ReaderThreads(options);
  std::vector<std::vector<uint8_t>> staging(static_cast<size_t>(threads));  // one per worker
  return RunTasks(chunks.size(), threads, [&](size_t c, int worker) {
    std::vector<uint8_t>& buffer = staging[static_cast<size_t>(worker)];
    if (buffer.empty()) buffer.resize(static_cast<size_t>(largest_read));
    return ReadChunk(tasks[chunks[c].task], chunks[c], &buffer);
  });
}

}  // namespace tandem::runtime::internal
