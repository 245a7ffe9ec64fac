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

// The element type a chunk is written as: fp32 (ReadTensors) or a Weight16 dtype.
enum class OutType { kF32, kBf16, kF16 };

int64_t OutSize(OutType out) { return out == OutType::kF32 ? 4 : 2; }

// True when `dtype` is stored exactly as `out` wants it: read straight into the destination.
bool SameType(SafetensorsDtype dtype, OutType out) {
  return (dtype == SafetensorsDtype::kF32 && out == OutType::kF32) ||
         (dtype == SafetensorsDtype::kBF16 && out == OutType::kBf16) ||
         (dtype == SafetensorsDtype::kF16 && out == OutType::kF16);
}

// count elements of `dtype` at src -> `out` at dst: widened exactly, then (16-bit out) rounded
// to nearest even, as the fp32 load followed by the device's conversion.
void Convert(SafetensorsDtype dtype, const uint8_t* src, int64_t count, OutType out, void* dst) {
  for (int64_t i = 0; i < count; ++i) {
    float v;
    if (dtype == SafetensorsDtype::kF32) {
      std::memcpy(&v, src + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, 2);
      v = dtype == SafetensorsDtype::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
    }
    if (out == OutType::kF32) {
      static_cast<float*>(dst)[i] = v;
    } else {
      static_cast<uint16_t*>(dst)[i] = out == OutType::kBf16 ? FloatToBf16(v) : FloatToF16(v);
    }
  }
}

// Reads one chunk's elements, in the rank part's order, to `out` (of type `type`); `staging`
// holds at least one read of the stored dtype.
absl::Status ReadChunk(const WidenTask& task, const Chunk& chunk, OutType type, void* out,
                       std::vector<uint8_t>* staging) {
  const HfTensor& t = *task.tensor;
  const TensorInfo& info = *task.info;
  const int64_t item = ItemSize(info);
  const int64_t per_unit = ShapeOf(t).floats_per_unit;
  // Column slices: one read per row; otherwise the chunk is one contiguous range.
  const int64_t reads = t.slice_dim == 1 ? chunk.end - chunk.begin : 1;
  const int64_t per_read = t.slice_dim == 1 ? per_unit : (chunk.end - chunk.begin) * per_unit;
  for (int64_t r = 0; r < reads; ++r) {
    const int64_t offset = SourceElement(t, chunk.begin + r) * item;
    const int64_t nbytes = per_read * item;
    void* dst = static_cast<uint8_t*>(out) + r * per_read * OutSize(type);
    if (SameType(info.dtype, type)) {  // straight into the destination
      RETURN_IF_ERROR(task.file->ReadTensorBytes(info, offset, nbytes, dst));
      continue;
    }
    RETURN_IF_ERROR(task.file->ReadTensorBytes(info, offset, nbytes, staging->data()));
    Convert(info.dtype, staging->data(), per_read, type, dst);
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

namespace {

// Every task's part split into chunks of at most chunk_bytes of stored bytes (at least one unit),
// in file order: each file is read front to back, which keeps the kernel's readahead useful.
struct ChunkPlan {
  std::vector<Chunk> chunks;
  int64_t largest_read = 1;   // stored bytes one pread covers: the staging size
  int64_t largest_chunk = 1;  // elements of the largest chunk
};
ChunkPlan PlanChunks(const std::vector<WidenTask>& tasks, const CheckpointReadOptions& options) {
  const int64_t chunk_bytes = std::max<int64_t>(options.chunk_bytes, 1);
  ChunkPlan plan;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const HfTensor& t = *tasks[i].tensor;
    const TaskShape shape = ShapeOf(t);
    const int64_t unit_bytes = shape.floats_per_unit * ItemSize(*tasks[i].info);
    const int64_t per_chunk = std::max<int64_t>(1, chunk_bytes / unit_bytes);
    for (int64_t u = 0; u < shape.units; u += per_chunk) {
      plan.chunks.push_back({i, u, std::min(shape.units, u + per_chunk)});
    }
    const int64_t units = std::min(per_chunk, shape.units);
    const int64_t read = t.slice_dim == 1 ? unit_bytes : units * unit_bytes;
    plan.largest_read = std::max(plan.largest_read, read);
    plan.largest_chunk = std::max(plan.largest_chunk, units * shape.floats_per_unit);
  }
  return plan;
}

// Runs read(chunk, worker, staging) for every chunk of `plan` on the reader threads, each with
// a staging buffer of its own.
absl::Status ReadChunks(
    const ChunkPlan& plan, int threads,
    const std::function<absl::Status(const Chunk&, int, std::vector<uint8_t>*)>& read) {
  std::vector<std::vector<uint8_t>> staging(static_cast<size_t>(threads));  // one per worker
  return RunTasks(plan.chunks.size(), threads, [&](size_t c, int worker) {
    std::vector<uint8_t>& buffer = staging[static_cast<size_t>(worker)];
    if (buffer.empty()) buffer.resize(static_cast<size_t>(plan.largest_read));
    return read(plan.chunks[c], worker, &buffer);
  });
}

}  // namespace

absl::Status ReadTensors(const std::vector<WidenTask>& tasks,
                         const CheckpointReadOptions& options) {
  const ChunkPlan plan = PlanChunks(tasks, options);
  return ReadChunks(plan, ReaderThreads(options),
                    [&](const Chunk& c, int, std::vector<uint8_t>* staging) {
                      const WidenTask& task = tasks[c.task];
                      float* out = task.out + c.begin * ShapeOf(*task.tensor).floats_per_unit;
                      return ReadChunk(task, c, OutType::kF32, out, staging);
                    });
}

absl::Status ReadTensors16(const std::vector<WidenTask>& tasks, Weight16 dtype,
                           WeightChunkSink* sink, const CheckpointReadOptions& options) {
  const ChunkPlan plan = PlanChunks(tasks, options);
  const int threads = ReaderThreads(options);
  RETURN_IF_ERROR(sink->Start(threads, plan.largest_chunk * 2));
  const OutType type = dtype == Weight16::kBf16 ? OutType::kBf16 : OutType::kF16;
  return ReadChunks(plan, threads, [&](const Chunk& c, int worker, std::vector<uint8_t>* staging) {
    const HfTensor& t = *tasks[c.task].tensor;
    ASSIGN_OR_RETURN(void* buffer, sink->Acquire(worker));
    RETURN_IF_ERROR(ReadChunk(tasks[c.task], c, type, buffer, staging));
    const int64_t per_unit = ShapeOf(t).floats_per_unit;
    return sink->Commit(worker, WeightChunk{t.slot, t.layer, t.offset + c.begin * per_unit,
                                            (c.end - c.begin) * per_unit});
  });
}

}  // namespace tandem::runtime::internal
