#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/half.h"

namespace tandem::runtime {
namespace {

using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

// The reference implementation refuses headers above 100 MB as well.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// errno may be 0 after a short fwrite (e.g. a closed stream): never turn that into OK.
absl::Status IoError(absl::string_view message) {
  const int error = errno;
  return absl::ErrnoToStatus(error != 0 ? error : EIO, message);
}

// A non-negative JSON integer that fits int64, else nullopt.
std::optional<int64_t> NonNegativeInt(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    if (i >= 0) return i;
  }
  return std::nullopt;
}

SafetensorsDtype DtypeFromName(absl::string_view name) {
  if (name == "F32") return SafetensorsDtype::kF32;
  if (name == "F16") return SafetensorsDtype::kF16;
  if (name == "BF16") return SafetensorsDtype::kBF16;
  return SafetensorsDtype::kOther;
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const json& entry,
                                      const uint8_t* data_start, int64_t data_size) {
  const std::string what = absl::StrCat("tensor '", name, "'");
  if (!entry.is_object()) return Invalid(absl::StrCat(what, ": header entry is not an object"));
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Invalid(absl::StrCat(what, ": missing or non-string 'dtype'"));
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Invalid(absl::StrCat(what, ": missing or non-list 'shape'"));
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return Invalid(absl::StrCat(what, ": 'data_offsets' must be a list [begin, end]"));
  }
  TensorInfo info;
  info.name = name;
  info.dtype_name = dtype_it->get<std::string>();
  info.dtype = DtypeFromName(info.dtype_name);
  int64_t elements = 1;
  for (const json& dim : *shape_it) {
    std::optional<int64_t> d = NonNegativeInt(dim);
    if (!d.has_value()) {
      return Invalid(absl::StrCat(what, ": shape entries must be non-negative integers"));
    }
    info.shape.push_back(*d);
    if (__builtin_mul_overflow(elements, *d, &elements)) {
      return Invalid(absl::StrCat(what, ": shape ", ShapeString(info.shape), " overflows"));
    }
  }
  std::optional<int64_t> begin = NonNegativeInt((*offsets_it)[0]);
  std::optional<int64_t> end = NonNegativeInt((*offsets_it)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end) {
    return Invalid(absl::StrCat(what, ": data_offsets must be integers 0 <= begin <= end"));
  }
  if (*end > data_size) {
    return Invalid(absl::StrCat(what, ": data_offsets [", *begin, ", ", *end,
                                "] out of bounds of the ", data_size, "-byte data buffer"));
  }
  info.nbytes = *end - *begin;
  info.data = data_start + *begin;
  const int64_t item_size = SafetensorsItemSize(info.dtype_name);
  if (item_size > 0) {
    int64_t expected = 0;
    if (__builtin_mul_overflow(elements, item_size, &expected) || expected != info.nbytes) {
      return Invalid(absl::StrCat(what, ": ", info.nbytes, " bytes of data but shape ",
                                  ShapeString(info.shape), " of ", info.dtype_name, " needs ",
                                  elements, " x ", item_size));
    }
  }
  return info;
}

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
    case SafetensorsDtype::kOther:
      break;
  }
  return "";
}

int64_t SafetensorsItemSize(absl::string_view name) {
  if (name == "F64" || name == "I64" || name == "U64" || name == "C64") return 8;
  if (name == "F32" || name == "I32" || name == "U32") return 4;
  if (name == "F16" || name == "BF16" || name == "I16" || name == "U16") return 2;
  if (name == "BOOL" || name == "U8" || name == "I8" || name == "F8_E5M2" || name == "F8_E4M3" ||
      name == "F8_E8M0") {
    return 1;
  }
  return 0;  // unknown or sub-byte (F4, F6_*): size not checked
}

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensors(
    const uint8_t* data, int64_t size, std::map<std::string, std::string>* metadata) {
  if (size < 8) {
    return Invalid(
        absl::StrCat("file is ", size, " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                kMaxHeaderBytes, " bytes (not a safetensors file?)"));
  }
  if (header_len > static_cast<uint64_t>(size - 8)) {
    return Invalid(absl::StrCat("header length ", header_len, " exceeds the ", size - 8,
                                " bytes after it (truncated file?)"));
  }
  const char* header_text = reinterpret_cast<const char*>(data + 8);
  json header = json::parse(header_text, header_text + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) return Invalid("header is not valid JSON");
  if (!header.is_object()) return Invalid("header is not a JSON object");

  const int64_t data_offset = 8 + static_cast<int64_t>(header_len);
  const int64_t data_size = size - data_offset;
  std::vector<TensorInfo> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Invalid("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Invalid(absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
        }
        if (metadata != nullptr) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info,
                     ParseEntry(it.key(), it.value(), data + data_offset, data_size));
    tensors.push_back(std::move(info));
  }
  // Tensors must tile the buffer: sorted by offset, each begins where the previous ended.
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  const uint8_t* cursor = data + data_offset;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.data < cursor) {
      return Invalid(absl::StrCat("tensor '", t.name, "' overlaps tensor '", previous->name, "'"));
    }
    if (t.data > cursor) {
      return Invalid(absl::StrCat("hole of ", t.data - cursor, " bytes before tensor '", t.name,
                                  "' in the data buffer"));
    }
    cursor = t.data + t.nbytes;
    previous = &t;
  }
  if (cursor != data + size) {
    return Invalid(absl::StrCat((data + size) - cursor,
                                " trailing bytes after the last tensor in the data buffer"));
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->fd_ = fd;  // closed by the destructor from here on
  const int64_t size = st.st_size;
  if (size >= 8) {
    void* mapping = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      return absl::ErrnoToStatus(error, absl::StrCat("cannot mmap ", path));
    }
    file->mapping_ = mapping;
    file->mapping_size_ = static_cast<size_t>(size);
  }
  static const uint8_t kEmpty[1] = {0};
  const uint8_t* bytes =
      file->mapping_ != nullptr ? static_cast<const uint8_t*>(file->mapping_) : kEmpty;
  absl::StatusOr<std::vector<TensorInfo>> tensors = ParseSafetensors(bytes, size, &file->metadata_);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", tensors.status().message()));
  }
  file->tensors_ = *std::move(tensors);
  for (size_t i = 0; i < file->tensors_.size(); ++i) {
    file->index_.emplace(file->tensors_[i].name, static_cast<int64_t>(i));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SafetensorsFile::ReadTensorBytes(const TensorInfo& info, int64_t offset,
                                              int64_t nbytes, void* out) const {
  const uint8_t* base = static_cast<const uint8_t*>(mapping_);
  if (base == nullptr || info.data < base || info.data + info.nbytes > base + mapping_size_ ||
      offset < 0 || nbytes < 0 || offset > info.nbytes - nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("read of bytes [", offset, ", +", nbytes,
                                                   ") of tensor '", info.name, "' outside it in ",
                                                   path_));
  }
  const int64_t start = (info.data - base) + offset;  // file offset
  auto* dst = static_cast<uint8_t*>(out);
  for (int64_t done = 0; done < nbytes;) {
    const ssize_t n = ::pread(fd_, dst + done, static_cast<size_t>(nbytes - done), start + done);
    const int error = errno;
    if (n < 0 && error == EINTR) continue;
    if (n < 0) {
      return absl::ErrnoToStatus(error, absl::StrCat("reading tensor '", info.name, "' from ",
                                                     path_, " at offset ", start + done));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("reading tensor '", info.name, "' from ", path_,
                                              ": the file ends at offset ", start + done,
                                              " (truncated since it was opened?)"));
    }
    done += n;
  }
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[static_cast<size_t>(it->second)];
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> specs,
    const std::map<std::string, std::string>& metadata,
    const std::map<std::string, std::string>& raw_dtypes) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<int64_t> ends;
  std::vector<std::string> dtype_names;
  int64_t offset = 0;
  std::set<std::string> names;
  for (const TensorSpec& spec : specs) {
    if (spec.name.empty() || spec.name == "__metadata__" || !names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty, reserved or duplicate tensor name '", spec.name, "'"));
    }
    std::string dtype_name(SafetensorsDtypeName(spec.dtype));
    if (spec.dtype == SafetensorsDtype::kOther) {
      auto raw = raw_dtypes.find(spec.name);
      if (raw == raw_dtypes.end() || SafetensorsItemSize(raw->second) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name,
            "': the writer stores F32, F16, BF16 and raw bytes of dtypes of known size"));
      }
      dtype_name = raw->second;
    }
    dtype_names.push_back(dtype_name);
    int64_t bytes = SafetensorsItemSize(dtype_name);
    for (int64_t d : spec.shape) {
      if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", spec.name, "': bad shape ", ShapeString(spec.shape)));
      }
    }
    header[spec.name] = {
        {"dtype", dtype_name}, {"shape", spec.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    ends.push_back(offset);
  }
  std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  // Pad so the data buffer starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  auto writer = std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter());
  writer->path_ = path;
  writer->tmp_path_ = path + ".tmp";
  writer->specs_ = std::move(specs);
  writer->dtype_names_ = std::move(dtype_names);
  writer->ends_ = std::move(ends);
  writer->data_bytes_ = offset;
  writer->file_ = std::fopen(writer->tmp_path_.c_str(), "wb");
  if (writer->file_ == nullptr) {
    return IoError(absl::StrCat("cannot create ", writer->tmp_path_));
  }
  const uint64_t header_len = text.size();
  RETURN_IF_ERROR(writer->Write(&header_len, sizeof(header_len)));
  RETURN_IF_ERROR(writer->Write(text.data(), text.size()));
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) std::remove(tmp_path_.c_str());
}

absl::Status SafetensorsWriter::Write(const void* bytes, size_t nbytes) {
  if (nbytes > 0 && std::fwrite(bytes, 1, nbytes, file_) != nbytes) {
    return IoError(absl::StrCat("cannot write ", tmp_path_));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AppendFloats(const float* values, int64_t count) {
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint16_t> halves;
  while (count > 0) {
    while (current_ < specs_.size() && written_ == ends_[current_]) ++current_;
    if (current_ >= specs_.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": ", count, " values appended past the last tensor"));
    }
    const SafetensorsDtype dtype = specs_[current_].dtype;
    if (dtype == SafetensorsDtype::kOther) {
      return absl::FailedPreconditionError(absl::StrCat(path_, ": tensor '", specs_[current_].name,
                                                        "' is ", dtype_names_[current_],
                                                        ": append its bytes"));
    }
    const int64_t item_size = dtype == SafetensorsDtype::kF32 ? 4 : 2;
    const int64_t n = std::min({count, (ends_[current_] - written_) / item_size, kChunk});
    if (dtype == SafetensorsDtype::kF32) {
      RETURN_IF_ERROR(Write(values, static_cast<size_t>(n) * 4));
    } else {
      halves.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        halves[i] =
            dtype == SafetensorsDtype::kBF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
      }
      RETURN_IF_ERROR(Write(halves.data(), static_cast<size_t>(n) * 2));
    }
    written_ += n * item_size;
    values += n;
    count -= n;
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AppendBytes(const void* bytes, int64_t nbytes) {
  const uint8_t* p = static_cast<const uint8_t*>(bytes);
  while (nbytes > 0) {
    while (current_ < specs_.size() && written_ == ends_[current_]) ++current_;
    if (current_ >= specs_.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": ", nbytes, " bytes appended past the last tensor"));
    }
    const int64_t item_size = SafetensorsItemSize(dtype_names_[current_]);
    const int64_t n = std::min(nbytes, ends_[current_] - written_);
    if (n % item_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": append splits an element of tensor '", specs_[current_].name, "'"));
    }
    RETURN_IF_ERROR(Write(p, static_cast<size_t>(n)));
    written_ += n;
    p += n;
    nbytes -= n;
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (finished_ || file_ == nullptr) return absl::FailedPreconditionError("already finished");
  while (current_ < specs_.size() && written_ == ends_[current_]) ++current_;
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": only ", written_, " of ",
                                                      data_bytes_, " data bytes written (tensor '",
                                                      specs_[current_].name, "' incomplete)"));
  }
  std::FILE* file = file_;
  file_ = nullptr;
  if (std::fclose(file) != 0) {
    return IoError(absl::StrCat("cannot close ", tmp_path_));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return IoError(absl::StrCat("cannot rename ", tmp_path_, " to ", path_));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<TensorSpec> specs;
  for (const TensorToWrite& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   SafetensorsWriter::Create(path, std::move(specs)));
  for (const TensorToWrite& t : tensors) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    if (count > 0 && t.values == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has no values"));
    }
    RETURN_IF_ERROR(writer->AppendFloats(t.values, count));
  }
  return writer->Finish();
}

}  // namespace tandem::runtime
