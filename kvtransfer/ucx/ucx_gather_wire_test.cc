// The gather wire: a source refuses every request that is not exactly a request for rows inside
// one of its regions; replies carry a status both ways.
#include "kvtransfer/ucx/ucx_gather_wire.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

const std::vector<uint64_t> kRegions = {1 << 20, 4096};
const std::string kKey = "0123456789abcdef";

// A request carrying kKey.
GatherRequest Keyed(GatherRequest r) {
  std::memcpy(r.key, kKey.data(), kGatherKeyBytes);
  return r;
}

absl::StatusOr<GatherRequest> Parse(const GatherRequest& request,
                                    size_t length = sizeof(GatherRequest)) {
  return ParseGatherRequest(&request, length, kKey, kRegions);
}

absl::StatusCode CodeOf(const GatherRequest& request, size_t length = sizeof(GatherRequest)) {
  return Parse(request, length).status().code();
}

TEST(GatherWireTest, ValidRequestsParse) {
  const GatherRequest request = Keyed(
      {.region = 0, .token = 77, .offset = 100, .stride = 2048, .row_bytes = 1000, .rows = 8});
  absl::StatusOr<GatherRequest> parsed = Parse(request);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->token, 77u);
  EXPECT_EQ(parsed->rows, 8u);
  // The last row ends exactly at the region's end.
  const GatherRequest last = Keyed(
      {.region = 1, .offset = 4096 - 512 - 3 * 1024, .stride = 1024, .row_bytes = 512, .rows = 4});
  EXPECT_TRUE(Parse(last).ok());
  const GatherRequest one_row =
      Keyed({.region = 1, .offset = 0, .stride = 0, .row_bytes = 4096, .rows = 1});
  EXPECT_TRUE(Parse(one_row).ok());
}

// Only a request with the source's exact key is looked at: no key, a key off by one bit, and a
// source without a key (it answers no gathers) are refused PERMISSION_DENIED, even for a request
// that is otherwise valid.
TEST(GatherWireTest, RequestsWithoutTheKeyAreRefused) {
  const GatherRequest good =
      Keyed({.region = 0, .offset = 0, .stride = 256, .row_bytes = 128, .rows = 4});
  ASSERT_TRUE(Parse(good).ok());
  GatherRequest r = good;
  std::memset(r.key, 0, sizeof(r.key));
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kPermissionDenied);
  for (size_t bit = 0; bit < 8 * kGatherKeyBytes; bit += 13) {
    r = good;
    r.key[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_EQ(CodeOf(r), absl::StatusCode::kPermissionDenied) << "bit " << bit;
  }
  EXPECT_EQ(ParseGatherRequest(&good, sizeof(good), "", kRegions).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Fresh keys: the right size, and not the same twice.
  absl::StatusOr<std::string> a = NewGatherKey();
  absl::StatusOr<std::string> b = NewGatherKey();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kGatherKeyBytes);
  EXPECT_NE(*a, *b);
}

TEST(GatherWireTest, MalformedRequestsAreRefused) {
  const GatherRequest good =
      Keyed({.region = 0, .offset = 0, .stride = 256, .row_bytes = 128, .rows = 4});
  EXPECT_EQ(CodeOf(good, sizeof(good) - 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf(good, sizeof(good) + 8), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseGatherRequest(nullptr, sizeof(good), kKey, kRegions).status().code(),
            absl::StatusCode::kInvalidArgument);
  GatherRequest r = good;
  r.version = 1;
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.rows = 0;
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.row_bytes = 0;
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.stride = 64;  // rows would overlap
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.region = 2;
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kOutOfRange);
  r = good;
  r.region = 1;
  r.offset = 4096 - 3 * 256 - 127;  // the last row one byte past the end
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kOutOfRange);
  r = good;
  r.offset = ~uint64_t{0} - 10;  // wraps
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kOutOfRange);
  r = good;
  r.stride = ~uint64_t{0} / 2;  // the rows' span overflows
  EXPECT_NE(CodeOf(r), absl::StatusCode::kOk);
  r = good;
  r.row_bytes = r.stride = 1 << 20;
  r.rows = (kMaxGatherBytes >> 20) + 1;  // over the per-request cap (before any region check)
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
  r.rows = ~uint64_t{0};  // rows * row_bytes overflows
  EXPECT_EQ(CodeOf(r), absl::StatusCode::kInvalidArgument);
}

// Random requests: accepted exactly when every row lies inside the region (a byte-level model).
TEST(GatherWireTest, RandomRequestsMatchAByteModel) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20000; ++i) {
    GatherRequest r = Keyed({});
    r.region = rng() % 3;
    r.rows = rng() % 6;
    r.row_bytes = rng() % 700;
    r.stride = r.row_bytes + rng() % 300 - (rng() % 4 == 0 ? 50 : 0);
    r.offset = rng() % 5000;
    bool want = r.rows > 0 && r.row_bytes > 0 && r.region < kRegions.size() &&
                (r.rows == 1 || r.stride >= r.row_bytes);
    if (want) {
      const unsigned __int128 end =
          static_cast<unsigned __int128>(r.rows - 1) * r.stride + r.offset + r.row_bytes;
      want = end <= kRegions[r.region];
    }
    EXPECT_EQ(Parse(r).ok(), want) << "region " << r.region << " offset " << r.offset << " rows "
                                   << r.rows << " x " << r.row_bytes << " stride " << r.stride;
  }
}

TEST(GatherWireTest, RepliesCarryTheStatus) {
  EXPECT_TRUE(GatherReplyStatus(MakeGatherReply(5, absl::OkStatus())).ok());
  const GatherReply refused = MakeGatherReply(9, absl::OutOfRangeError("row 3 past region 0"));
  EXPECT_EQ(refused.token, 9u);
  const absl::Status s = GatherReplyStatus(refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("row 3 past region 0"), absl::string_view::npos) << s;
  // A long reason is cut, still NUL-terminated.
  const GatherReply long_reason =
      MakeGatherReply(1, absl::ResourceExhaustedError(std::string(500, 'x')));
  EXPECT_EQ(long_reason.reason[sizeof(long_reason.reason) - 1], '\0');
  EXPECT_EQ(GatherReplyStatus(long_reason).code(), absl::StatusCode::kResourceExhausted);
  // A code that is no absl code, and a reason without a NUL, from a broken peer.
  GatherReply bad = refused;
  bad.code = 99;
  EXPECT_EQ(GatherReplyStatus(bad).code(), absl::StatusCode::kInternal);
  std::memset(bad.reason, 'y', sizeof(bad.reason));
  bad.code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
  EXPECT_EQ(GatherReplyStatus(bad).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kvtransfer
