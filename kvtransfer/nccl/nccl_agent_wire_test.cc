// CPU tests of NcclAgent's control wire format and socket helpers (no GPU, no NCCL).
#include "kvtransfer/nccl/nccl_agent_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"

namespace tandem::kvtransfer::nccl_wire {
namespace {

std::vector<StridedCopyOp> RandomOps(std::mt19937_64& rng, size_t n) {
  std::vector<StridedCopyOp> ops(n);
  for (StridedCopyOp& op : ops) {
    op.local_region = static_cast<uint32_t>(rng() % 4);
    op.local_offset = rng();
    op.local_stride = rng();
    op.remote_region = static_cast<uint32_t>(rng());
    op.remote_offset = rng();
    op.remote_stride = rng();
    op.row_bytes = rng() | 1;
    op.rows = rng() % 2 ? 1 : rng();
  }
  return ops;
}

// A contiguous op of `length` bytes at the source's `region` + `offset`.
StridedCopyOp Source(uint32_t region, uint64_t offset, uint64_t length) {
  return AsStrided({0, 0, region, offset, length});
}

TEST(NcclWireTest, ReadRequestRoundTripsRandomOps) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 20; ++round) {
    const uint64_t id = rng();
    const nccl_plan::PlanParams params{rng() | 1, rng() | 1};
    std::vector<StridedCopyOp> ops = RandomOps(rng, 1 + rng() % 300);
    absl::StatusOr<std::string> wire = EncodeReadRequest(id, params, ops);
    ASSERT_TRUE(wire.ok()) << wire.status();
    absl::StatusOr<ReadRequest> req = DecodeReadRequest(*wire);
    ASSERT_TRUE(req.ok()) << req.status();
    EXPECT_EQ(req->id, id);
    EXPECT_EQ(req->params.chunk_bytes, params.chunk_bytes);
    EXPECT_EQ(req->params.direct_min_bytes, params.direct_min_bytes);
    ASSERT_EQ(req->ops.size(), ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(req->ops[i].remote_region, ops[i].remote_region);
      EXPECT_EQ(req->ops[i].remote_offset, ops[i].remote_offset);
      EXPECT_EQ(req->ops[i].remote_stride, ops[i].remote_stride);
      EXPECT_EQ(req->ops[i].row_bytes, ops[i].row_bytes);
      EXPECT_EQ(req->ops[i].rows, ops[i].rows);
      EXPECT_EQ(req->ops[i].local_region, 0u);  // the reader's side does not travel
      EXPECT_EQ(req->ops[i].local_offset, 0u);
      EXPECT_EQ(req->ops[i].local_stride, 0u);
    }
    // Every truncation and any extra byte is refused.
    const size_t cut = rng() % wire->size();
    EXPECT_EQ(DecodeReadRequest(wire->substr(0, cut)).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeReadRequest(*wire + "x").status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(NcclWireTest, ReadRequestRejectsEmptyBadCountsAndZeroParams) {
  const nccl_plan::PlanParams params{1 << 20, 1 << 22};
  const std::vector<StridedCopyOp> one = {Source(0, 0, 5)};
  EXPECT_EQ(EncodeReadRequest(1, params, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeReadRequest(1, {0, 1}, one).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeReadRequest(1, {1, 0}, one).status().code(), absl::StatusCode::kInvalidArgument);
  std::string wire = *EncodeReadRequest(7, params, one);
  std::string zero = wire;
  zero[24] = zero[25] = zero[26] = zero[27] = 0;  // op count 0
  EXPECT_EQ(DecodeReadRequest(zero).status().code(), absl::StatusCode::kInvalidArgument);
  std::string huge = wire;
  huge[27] = static_cast<char>(0x7f);  // count far beyond kMaxOpsPerRead
  EXPECT_EQ(DecodeReadRequest(huge).status().code(), absl::StatusCode::kInvalidArgument);
  std::string no_chunk = wire;
  for (int i = 8; i < 16; ++i) no_chunk[i] = 0;  // chunk_bytes 0
  EXPECT_EQ(DecodeReadRequest(no_chunk).status().code(), absl::StatusCode::kInvalidArgument);
  std::string no_direct = wire;
  for (int i = 16; i < 24; ++i) no_direct[i] = 0;  // direct_min_bytes 0
  EXPECT_EQ(DecodeReadRequest(no_direct).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclWireTest, AckRoundTripsStatusAndChunk) {
  for (const absl::Status& s : {absl::OkStatus(), absl::OutOfRangeError("op 3 past region 1"),
                                absl::InvalidArgumentError("")}) {
    absl::StatusOr<ReadAck> got = DecodeReadAck(EncodeReadAck({42, 12345, s}));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->id, 42u);
    EXPECT_EQ(got->chunk_bytes, 12345u);
    EXPECT_EQ(got->verdict, s);
  }
  EXPECT_FALSE(DecodeReadAck("short").ok());
  std::string bad = EncodeReadAck({1, 8, absl::OkStatus()});
  bad[16] = 99;  // no such status code
  EXPECT_FALSE(DecodeReadAck(bad).ok());
  // An OK ack must name the chunk it planned with; a refusal need not.
  EXPECT_FALSE(DecodeReadAck(EncodeReadAck({1, 0, absl::OkStatus()})).ok());
  EXPECT_TRUE(DecodeReadAck(EncodeReadAck({1, 0, absl::OutOfRangeError("x")})).ok());
}

TEST(NcclWireTest, HeaderChecksTypeAndSize) {
  MessageType type;
  uint32_t bytes = 0;
  ASSERT_TRUE(DecodeHeader(EncodeHeader(MessageType::kReadAck, 123), &type, &bytes).ok());
  EXPECT_EQ(type, MessageType::kReadAck);
  EXPECT_EQ(bytes, 123u);
  ASSERT_TRUE(DecodeHeader(EncodeHeader(MessageType::kChallenge, 32), &type, &bytes).ok());
  EXPECT_EQ(type, MessageType::kChallenge);
  std::string unknown = EncodeHeader(MessageType::kRead, 1);
  unknown[0] = 9;
  EXPECT_EQ(DecodeHeader(unknown, &type, &bytes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DecodeHeader(EncodeHeader(MessageType::kRead, kMaxPayloadBytes + 1), &type, &bytes).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeHeader("abc", &type, &bytes).ok());
}

TEST(NcclWireTest, ValidateSourceRangesUsesOnlyTheSourceSide) {
  const std::vector<uint64_t> regions = {100, 50};
  // local_* fields are garbage on purpose: the source cannot know the reader's regions.
  StridedCopyOp garbage_local = Source(1, 10, 40);
  garbage_local.local_region = 77;
  garbage_local.local_offset = 999999;
  garbage_local.local_stride = 3;  // below the row: only the source's stride counts
  EXPECT_TRUE(ValidateSourceRanges({garbage_local, Source(0, 0, 100)}, regions).ok());
  EXPECT_EQ(ValidateSourceRanges({Source(1, 10, 41)}, regions).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateSourceRanges({Source(2, 0, 1)}, regions).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateSourceRanges({Source(0, ~uint64_t{0}, 2)}, regions).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ValidateSourceRanges({Source(0, 0, 0)}, regions).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateSourceRanges({}, regions).code(), absl::StatusCode::kInvalidArgument);
  // Strided: 4 rows of 10 bytes 30 apart from 5 end at 5 + 3 * 30 + 10 = 105 > 100.
  StridedCopyOp rows = Source(0, 5, 10);
  rows.rows = 4;
  rows.remote_stride = 30;
  EXPECT_EQ(ValidateSourceRanges({rows}, regions).code(), absl::StatusCode::kOutOfRange);
  rows.remote_offset = 0;  // ends at 100: fits
  EXPECT_TRUE(ValidateSourceRanges({rows}, regions).ok());
  rows.remote_stride = 9;  // rows would overlap
  EXPECT_EQ(ValidateSourceRanges({rows}, regions).code(), absl::StatusCode::kInvalidArgument);
  rows.remote_stride = ~uint64_t{0} / 2;  // overflow
  EXPECT_EQ(ValidateSourceRanges({rows}, regions).code(), absl::StatusCode::kOutOfRange);
}

TEST(NcclWireTest, HelloCarriesTheCredentialAndOneOrTwoIdsWithinItsBounds) {
  const std::string ids(kUniqueIdBytes, 'i'), two(2 * kUniqueIdBytes, 'j');
  for (const std::string& token : {std::string(), std::string(56, 't')}) {
    for (const std::string* u : {&ids, &two}) {
      absl::StatusOr<std::string> payload = EncodeHello(token, *u);
      ASSERT_TRUE(payload.ok()) << payload.status();
      EXPECT_LE(payload->size(), kMaxHelloBytes);
      absl::StatusOr<Hello> hello = DecodeHello(*payload);
      ASSERT_TRUE(hello.ok()) << hello.status();
      EXPECT_EQ(hello->credential, token);
      EXPECT_EQ(hello->unique_ids, *u);
    }
  }
  EXPECT_FALSE(EncodeHello(std::string(kMaxHelloTokenBytes + 1, 't'), ids).ok());
  EXPECT_FALSE(EncodeHello("", std::string(kUniqueIdBytes + 1, 'i')).ok());
  const std::string good = *EncodeHello("tok", ids);
  EXPECT_FALSE(DecodeHello(good.substr(0, 3)).ok()) << "truncated length";
  EXPECT_FALSE(DecodeHello(good.substr(0, good.size() - 1)).ok()) << "truncated ids";
  EXPECT_FALSE(DecodeHello(good + "x").ok()) << "trailing byte";
  std::string huge = good;
  huge[0] = '\xff';  // token length past the payload
  EXPECT_FALSE(DecodeHello(huge).ok());
  EXPECT_FALSE(DecodeHello(ids).ok()) << "the pre-token form (ids only)";
}

TEST(NcclWireTest, AddressParsing) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(ParseAddress(FormatAddress("10.0.0.7", 4242), &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.7");
  EXPECT_EQ(port, 4242);
  for (const char* bad : {"", "host", ":80", "h:0", "h:65536", "h:x", "h:"}) {
    EXPECT_EQ(ParseAddress(bad, &host, &port).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NcclSocketTest, FramesCrossALoopbackConnectionAndEofIsUnavailable) {
  int port = 0;
  absl::StatusOr<int> listen_fd = nccl_socket::Listen("127.0.0.1", 0, &port);
  ASSERT_TRUE(listen_fd.ok()) << listen_fd.status();
  absl::StatusOr<int> client = nccl_socket::Connect("127.0.0.1", port, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  const int server = accept(*listen_fd, nullptr, nullptr);
  ASSERT_GE(server, 0);
  const std::string payload =
      *EncodeReadRequest(5, {64, 64}, std::vector<StridedCopyOp>(1000, Source(1, 2, 3)));
  ASSERT_TRUE(nccl_socket::CheckOpen(server).ok());
  ASSERT_TRUE(nccl_socket::SendFrame(*client, MessageType::kRead, payload).ok());
  ASSERT_TRUE(nccl_socket::WaitReadable(server, std::atomic<bool>{false}, absl::Seconds(5)).ok());
  // Unread bytes: CheckAlive calls them unexpected, CheckOpen leaves them for RecvFrame.
  EXPECT_EQ(nccl_socket::CheckAlive(server).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(nccl_socket::CheckOpen(server).ok());
  std::atomic<bool> stop{false};
  MessageType type;
  std::string got;
  ASSERT_TRUE(nccl_socket::RecvFrame(server, stop, absl::Seconds(5), &type, &got).ok());
  EXPECT_EQ(type, MessageType::kRead);
  EXPECT_EQ(got, payload);
  EXPECT_TRUE(nccl_socket::CheckAlive(server).ok());
  EXPECT_EQ(nccl_socket::RecvFrame(server, stop, absl::Milliseconds(20), &type, &got).code(),
            absl::StatusCode::kDeadlineExceeded);
  stop = true;
  EXPECT_EQ(nccl_socket::WaitReadable(server, stop, absl::Seconds(5)).code(),
            absl::StatusCode::kCancelled);
  close(*client);
  EXPECT_EQ(nccl_socket::CheckAlive(server).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(nccl_socket::CheckOpen(server).code(), absl::StatusCode::kUnavailable);
  close(server);
  close(*listen_fd);
  // Nobody listens there any more.
  EXPECT_EQ(nccl_socket::Connect("127.0.0.1", port, absl::Seconds(2)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl_wire
