// Reading and writing the safetensors format (https://github.com/huggingface/safetensors).
//
// File layout (all integers little-endian):
//   [8 bytes]  N = header length (u64)
//   [N bytes]  UTF-8 JSON object: {"__metadata__": {str: str} (optional),
//              "<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...],
//                                "data_offsets": [begin, end]}, ...}
//              (writers pad it with spaces; ours to a multiple of 8 bytes)
//   [rest]     data buffer; offsets are relative to its start, row-major, little-endian.
// As in the reference implementation, the tensors must tile the data buffer exactly: no overlaps,
// no holes, no trailing bytes (this also rules out polyglot files).
#ifndef TANDEM_RUNTIME_MODEL_SAFETENSORS_H_
#define TANDEM_RUNTIME_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::runtime {

// Floating-point dtypes we convert; every other safetensors dtype ("I64", "F8_E4M3", ...) is
// kOther, with its name kept in TensorInfo::dtype_name.
enum class SafetensorsDtype { kF32, kF16, kBF16, kOther };

// "F32" / "F16" / "BF16" (empty for kOther).
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);

struct TensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kOther;
  std::string dtype_name;         // as written in the header, e.g. "BF16"
  std::vector<int64_t> shape;     // [] is a scalar (one element)
  const uint8_t* data = nullptr;  // into the mapping; NOT aligned (read with memcpy)
  int64_t nbytes = 0;             // == prod(shape) * itemsize for dtypes whose size we know
};

// A read-only memory mapping of one .safetensors file. Open() validates the whole header up
// front, so every TensorInfo it hands out points to in-bounds bytes of the right size. Dtypes we
// do not know the element size of (none of the standard ones) are kOther with only the bounds
// and tiling checked. Immutable after Open(): safe to share between threads; TensorInfo::data is
// valid until the SafetensorsFile is destroyed.
class SafetensorsFile {
 public:
  // NOT_FOUND if the file does not exist; INVALID_ARGUMENT naming the file and the problem for a
  // truncated file, a bad header length, invalid JSON, a malformed entry, an offset out of bounds,
  // a size that does not match the shape, or overlapping / non-contiguous tensors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();  // munmap, close

  // nullptr if absent.
  const TensorInfo* Find(absl::string_view name) const;
  // In data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Copies bytes [offset, offset + nbytes) of `info`'s data (a tensor of this file) to `out` with
  // pread, bypassing the mapping: an I/O error, or a file that shrank since Open, is an error
  // naming the file and the tensor (DATA_LOSS for a short read) where a read through the mapping
  // would raise SIGBUS. INVALID_ARGUMENT when the range is outside the tensor. Thread-safe.
  absl::Status ReadTensorBytes(const TensorInfo& info, int64_t offset, int64_t nbytes,
                               void* out) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;  // kept open for ReadTensorBytes
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, int64_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Parses and validates a complete file image (the same checks as Open(); exposed so tests and
// tools can check bytes without a file). `data` must outlive the returned infos.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensors(
    const uint8_t* data, int64_t size, std::map<std::string, std::string>* metadata);

// Bytes per element of a safetensors dtype name ("F32" -> 4), 0 if unknown.
int64_t SafetensorsItemSize(absl::string_view dtype_name);

struct TensorSpec {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;  // kF32, kF16 or kBF16
  std::vector<int64_t> shape;
};

// Streams a .safetensors file: the header (all tensors' names, dtypes and shapes) is written
// first, then the data in spec order, in appends of any size (a tensor may take many appends, an
// append may span tensors). Data goes to `path`.tmp, renamed to `path` by Finish(), so a crash
// or error never leaves a half-written file under the final name. Not thread-safe.
class SafetensorsWriter {
 public:
  // INVALID_ARGUMENT for an empty or duplicate name, a kOther dtype not named in `raw_dtypes`
  // (or named with a dtype of unknown element size) or a negative dimension. `raw_dtypes`: tensor
  // name -> another dtype ("F8_E4M3", ...) for kOther specs, written with AppendBytes only (the
  // copied bytes of an FP8 checkpoint's shards).
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> specs,
      const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
      const std::map<std::string, std::string>& raw_dtypes = {});

  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();  // removes the temporary file unless Finish() succeeded

  // Appends `count` fp32 values, each converted (round to nearest even) to the dtype of the
  // tensor it lands in. FAILED_PRECONDITION when it would write past the last tensor or into a
  // raw-dtype tensor.
  absl::Status AppendFloats(const float* values, int64_t count);
  // Appends raw little-endian element bytes; `nbytes` may not split an element.
  absl::Status AppendBytes(const void* bytes, int64_t nbytes);
  // FAILED_PRECONDITION if data is missing; then flushes, closes and renames.
  absl::Status Finish();

  // Bytes of data the specs need in total (excluding the header).
  int64_t data_bytes() const { return data_bytes_; }

 private:
  SafetensorsWriter() = default;
  absl::Status Write(const void* bytes, size_t nbytes);

  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  std::vector<TensorSpec> specs_;
  std::vector<std::string> dtype_names_;  // of each spec (raw_dtypes for kOther)
  std::vector<int64_t> ends_;             // cumulative byte end of each spec
  int64_t data_bytes_ = 0;
  int64_t written_ = 0;
  size_t current_ = 0;  // spec the next byte belongs to
  bool finished_ = false;
};

// One tensor for WriteSafetensors: prod(shape) fp32 values, stored converted to `dtype`.
struct TensorToWrite {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  const float* values = nullptr;
};

// Writes every tensor in one go (a convenience over SafetensorsWriter).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_SAFETENSORS_H_
