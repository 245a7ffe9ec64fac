#include "runtime/model/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/half.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device()();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    rng_.seed(seed_);
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("safetensors_", ::getpid(), "_", seed_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string PathOf(const std::string& name) { return (dir_ / name).string(); }

  std::vector<float> RandomValues(int64_t n) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng_);
    return v;
  }

  // A file from a raw header text (length prefix computed unless given) and data bytes.
  std::string WriteRaw(const std::string& name, const std::string& header, const std::string& data,
                       std::optional<uint64_t> length = std::nullopt) {
    const uint64_t n = length.value_or(header.size());
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    bytes += header + data;
    return WriteBytes(name, bytes);
  }
  std::string WriteBytes(const std::string& name, const std::string& bytes) {
    const std::string path = PathOf(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::string ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  void ExpectInvalid(const std::string& path, absl::string_view needle) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << "opened " << path;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(std::string(needle)));
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripAllDtypes) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  struct Spec {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {
      {"a.weight", SafetensorsDtype::kF32, {7, 5}}, {"b.bias", SafetensorsDtype::kBF16, {13}},
      {"c", SafetensorsDtype::kF16, {3, 2, 4}},     {"scalar", SafetensorsDtype::kBF16, {}},
      {"empty", SafetensorsDtype::kF32, {0, 3}},    {"odd", SafetensorsDtype::kF16, {1}},
  };
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  for (const Spec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    values.push_back(RandomValues(n));
  }
  values[1][0] = std::numeric_limits<float>::infinity();
  values[2][0] = 1e6f;   // overflows f16 -> inf
  values[2][1] = 1e-7f;  // f16 subnormal
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.push_back({specs[i].name, specs[i].dtype, specs[i].shape, values[i].data()});
  }
  const std::string path = PathOf("round_trip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), specs.size());
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  uint64_t header_len = 0;
  std::memcpy(&header_len, ReadBytes(path).data(), 8);
  EXPECT_EQ(header_len % 8, 0u);  // data buffer 8-byte aligned in the file
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(specs[i].name);
    const TensorInfo* t = (*file)->Find(specs[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, specs[i].dtype);
    EXPECT_EQ(t->dtype_name, SafetensorsDtypeName(specs[i].dtype));
    EXPECT_EQ(t->shape, specs[i].shape);
    for (size_t k = 0; k < values[i].size(); ++k) {
      const float v = values[i][k];
      if (t->dtype == SafetensorsDtype::kF32) {
        float got;
        std::memcpy(&got, t->data + 4 * k, 4);
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(v));
      } else {
        uint16_t got;
        std::memcpy(&got, t->data + 2 * k, 2);
        ASSERT_EQ(got, t->dtype == SafetensorsDtype::kBF16 ? FloatToBf16(v) : FloatToF16(v));
      }
    }
  }
}

TEST_F(SafetensorsTest, StreamingWriterRawBytesAcrossTensors) {
  // Exact bit patterns (NaN payloads, -0, subnormals) survive AppendBytes untouched.
  const std::vector<uint16_t> bits = {0x7c01, 0x8000, 0x0001, 0xfbff, 0x7fff, 0x3c00};
  const std::string path = PathOf("raw.safetensors");
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer = SafetensorsWriter::Create(
      path, {{"x", SafetensorsDtype::kF16, {2}}, {"y", SafetensorsDtype::kBF16, {2, 2}}}, {});
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->data_bytes(), 12);
  ASSERT_TRUE((*writer)->AppendBytes(bits.data(), 6).ok());  // spans x and y
  EXPECT_EQ((*writer)->AppendBytes(bits.data(), 3).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->AppendBytes(bits.data() + 3, 6).ok());
  EXPECT_EQ((*writer)->AppendBytes(bits.data(), 2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*writer)->Finish().ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->metadata().empty());
  const TensorInfo* x = (*file)->Find("x");
  const TensorInfo* y = (*file)->Find("y");
  ASSERT_TRUE(x != nullptr && y != nullptr);
  EXPECT_EQ(std::memcmp(x->data, bits.data(), 4), 0);
  EXPECT_EQ(std::memcmp(y->data, bits.data() + 2, 8), 0);
}

TEST_F(SafetensorsTest, WriterRejectsBadInputAndLeavesNoFile) {
  const std::string path = PathOf("bad.safetensors");
  EXPECT_EQ(SafetensorsWriter::Create(
                path, {{"a", SafetensorsDtype::kF32, {1}}, {"a", SafetensorsDtype::kF32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", SafetensorsDtype::kOther, {1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SafetensorsWriter::Create(path, {{"a", SafetensorsDtype::kF32, {-1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
        SafetensorsWriter::Create(path, {{"a", SafetensorsDtype::kF32, {4}}});
    ASSERT_TRUE(writer.ok());
    const std::vector<float> v = RandomValues(3);
    ASSERT_TRUE((*writer)->AppendFloats(v.data(), 3).ok());
    absl::Status finish = (*writer)->Finish();
    EXPECT_EQ(finish.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(finish.message()), HasSubstr("'a'"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(SafetensorsWriter::Create((dir_ / "no/such/dir/x").string(), {}).ok());
}

TEST_F(SafetensorsTest, CorruptHeadersGiveClearErrors) {
  const std::string data(24, '\x01');
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  int begin, int end) {
    return absl::StrCat("\"", name, "\": {\"dtype\": \"", dtype, "\", \"shape\": ", shape,
                        ", \"data_offsets\": [", begin, ", ", end, "]}");
  };
  const std::string a = entry("a", "F32", "[2, 2]", 0, 16);
  const std::string b = entry("b", "BF16", "[4]", 16, 24);
  ASSERT_TRUE(SafetensorsFile::Open(WriteRaw("ok", "{" + a + ", " + b + "}", data)).ok());

  ExpectInvalid(WriteBytes("empty", ""), "too short");
  ExpectInvalid(WriteBytes("short", "abcde"), "too short");
  ExpectInvalid(WriteRaw("long_len", "{}", "", 1000), "exceeds the 2 bytes");
  ExpectInvalid(WriteRaw("huge_len", "{}", "", uint64_t{1} << 60), "exceeds the limit");
  ExpectInvalid(WriteRaw("bad_json", "{\"a\": ", data), "not valid JSON");
  ExpectInvalid(WriteRaw("not_object", "[1, 2]", ""), "not a JSON object");
  ExpectInvalid(WriteRaw("entry_not_object", "{\"a\": 5}", ""), "tensor 'a'");
  ExpectInvalid(WriteRaw("no_dtype", "{\"a\": {\"shape\": [], \"data_offsets\": [0, 0]}}", ""),
                "'dtype'");
  ExpectInvalid(WriteRaw("neg_shape", "{" + entry("a", "F32", "[-1]", 0, 0) + "}", ""),
                "non-negative");
  ExpectInvalid(WriteRaw("float_shape", "{" + entry("a", "F32", "[1.5]", 0, 4) + "}", "xxxx"),
                "non-negative integers");
  ExpectInvalid(WriteRaw("reversed", "{" + entry("a", "F32", "[1]", 8, 4) + "}", data),
                "begin <= end");
  ExpectInvalid(WriteRaw("oob", "{" + entry("a", "F32", "[10]", 0, 40) + "}", data),
                "out of bounds");
  ExpectInvalid(WriteRaw("size", "{" + entry("a", "F32", "[5]", 0, 24) + "}", data),
                "shape [5] of F32 needs 5 x 4");
  ExpectInvalid(
      WriteRaw("overflow", "{" + entry("a", "F32", "[4294967296, 4294967296]", 0, 24) + "}", data),
      "overflows");
  ExpectInvalid(WriteRaw("overlap",
                         "{" + a + ", " + entry("b", "BF16", "[4]", 8, 16) + ", " +
                             entry("c", "U8", "[8]", 16, 24) + "}",
                         data),
                "overlaps");
  ExpectInvalid(WriteRaw("hole", "{" + entry("a", "F32", "[2]", 8, 16) + "}", data.substr(0, 16)),
                "hole of 8 bytes");
  ExpectInvalid(WriteRaw("trailing", "{" + a + "}", data), "8 trailing bytes");
  ExpectInvalid(WriteRaw("meta", "{\"__metadata__\": {\"format\": 1}}", ""), "__metadata__");
  ExpectInvalid(WriteRaw("offsets3",
                         "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
                         "\"data_offsets\": [0, 4, 8]}}",
                         data.substr(0, 4)),
                "data_offsets");

  // Dtypes we do not convert still open (kOther); sizes are checked where known.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> other = SafetensorsFile::Open(WriteRaw(
      "other",
      "{" + entry("i", "I64", "[2]", 0, 16) + ", " + entry("f4", "F4", "[16]", 16, 24) + "}",
      data));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->Find("i")->dtype, SafetensorsDtype::kOther);
  EXPECT_EQ((*other)->Find("i")->dtype_name, "I64");
  ExpectInvalid(WriteRaw("i64_size", "{" + entry("i", "I64", "[2]", 0, 24) + "}", data), "needs");

  EXPECT_EQ(SafetensorsFile::Open(PathOf("does_not_exist")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open(dir_.string()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every truncation of a valid file, and random byte corruption, fails cleanly (never crashes);
// when a corrupted file still opens, every tensor lies inside the file.
// ReadTensorBytes (the loader's parallel readers) returns exactly the mapped bytes, refuses
// ranges outside the tensor, and reports a file cut short after Open as an error naming the file
// and the tensor instead of the SIGBUS a read through the mapping would raise.
TEST_F(SafetensorsTest, PreadOfTensorBytesAndAFileTruncatedAfterOpen) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const std::vector<float> a = RandomValues(1000), b = RandomValues(3000);
  const std::string path = PathOf("read.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", SafetensorsDtype::kBF16, {10, 100}, a.data()},
                                      {"b", SafetensorsDtype::kF32, {3000}, b.data()}})
                  .ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo& ta = *(*file)->Find("a");
  const TensorInfo& tb = *(*file)->Find("b");
  std::uniform_int_distribution<int64_t> pick(0, tb.nbytes);
  for (int i = 0; i < 20; ++i) {
    int64_t begin = pick(rng_), end = pick(rng_);
    if (begin > end) std::swap(begin, end);
    std::string got(static_cast<size_t>(end - begin), '\0');
    ASSERT_TRUE((*file)->ReadTensorBytes(tb, begin, end - begin, got.data()).ok());
    EXPECT_EQ(std::memcmp(got.data(), tb.data + begin, got.size()), 0) << begin << ".." << end;
  }
  std::string whole(static_cast<size_t>(ta.nbytes), '\0');
  ASSERT_TRUE((*file)->ReadTensorBytes(ta, 0, ta.nbytes, whole.data()).ok());
  EXPECT_EQ(std::memcmp(whole.data(), ta.data, whole.size()), 0);
  const absl::Status outside = (*file)->ReadTensorBytes(ta, 10, ta.nbytes, whole.data());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;

  // Cut into the last tensor: reads before the cut still work, reads past it fail by name.
  fs::resize_file(path, fs::file_size(path) - 4000);
  EXPECT_TRUE((*file)->ReadTensorBytes(ta, 0, ta.nbytes, whole.data()).ok());
  std::string tail(8000, '\0');
  const absl::Status cut = (*file)->ReadTensorBytes(tb, tb.nbytes - 8000, 8000, tail.data());
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss) << cut;
  EXPECT_THAT(cut.message(), HasSubstr(path));
  EXPECT_THAT(cut.message(), HasSubstr("'b'"));
}

TEST_F(SafetensorsTest, TruncationAndCorruptionNeverCrash) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed_);
  const std::vector<float> v = RandomValues(10);
  const std::string path = PathOf("valid.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", SafetensorsDtype::kF32, {2, 3}, v.data()},
                                      {"b", SafetensorsDtype::kBF16, {4}, v.data() + 6}})
                  .ok());
  const std::string bytes = ReadBytes(path);
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(WriteBytes("truncated", bytes.substr(0, len)));
    ASSERT_FALSE(file.ok()) << "length " << len;
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::uniform_int_distribution<size_t> position(0, bytes.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string corrupt = bytes;
    for (int k = 0; k < 1 + trial % 3; ++k) corrupt[position(rng_)] = static_cast<char>(byte(rng_));
    std::map<std::string, std::string> metadata;
    absl::StatusOr<std::vector<TensorInfo>> tensors =
        ParseSafetensors(reinterpret_cast<const uint8_t*>(corrupt.data()),
                         static_cast<int64_t>(corrupt.size()), &metadata);
    if (!tensors.ok()) {
      ASSERT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    for (const TensorInfo& t : *tensors) {
      const auto* begin = reinterpret_cast<const uint8_t*>(corrupt.data());
      ASSERT_GE(t.data, begin);
      ASSERT_LE(t.data + t.nbytes, begin + corrupt.size());
    }
  }
}

}  // namespace
}  // namespace tandem::runtime
