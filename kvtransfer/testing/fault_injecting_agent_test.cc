#include "kvtransfer/testing/fault_injecting_agent.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/inprocess/inprocess_agent.h"
#include "kvtransfer/testing/agent_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::FillPattern;
using ::tandem::kvtransfer::testing::FirstPatternMismatch;
using ::tandem::kvtransfer::testing::WaitForEnd;
using ::tandem::v1::MEMORY_KIND_HOST;
using Faults = FaultInjectingAgent::Faults;

constexpr uint64_t kBlock = 1000;  // odd size on purpose
constexpr uint32_t kBlocks = 32;
constexpr uint8_t kFill = 0x5A;

// P (plain in-process agent) and D (in-process agent wrapped in fault injection).
class FaultInjectingAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    rng_.seed(seed_);
    src_pool_.resize(kBlock * kBlocks);
    dst_pool_.assign(kBlock * kBlocks, kFill);
    FillPattern(seed_, 0, absl::MakeSpan(src_pool_));
    fabric_ = std::make_shared<InProcessFabric>();
    src_ = std::make_unique<InProcessAgent>(fabric_, "p0");
    real_dst_ = std::make_unique<InProcessAgent>(fabric_, "d0");
    dst_ = std::make_unique<FaultInjectingAgent>(real_dst_.get());
    ASSERT_TRUE(src_->RegisterMemory(src_pool_.data(), src_pool_.size(), MEMORY_KIND_HOST).ok());
    ASSERT_TRUE(dst_->RegisterMemory(dst_pool_.data(), dst_pool_.size(), MEMORY_KIND_HOST).ok());
    ASSERT_TRUE(src_->FillLocalDescriptor(&src_descriptor_).ok());
    ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());
  }

  // A shuffled batch of `n` blocks: remote block i -> local block perm[i].
  std::vector<CopyOp> RandomOps(uint32_t n) {
    std::vector<uint32_t> local(kBlocks), remote(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) local[i] = remote[i] = i;
    std::shuffle(local.begin(), local.end(), rng_);
    std::shuffle(remote.begin(), remote.end(), rng_);
    local.resize(n);
    remote.resize(n);
    return BlockCopyOps(0, 0, kBlock, local, remote);
  }

  // Checks that exactly the first `bytes` bytes of `ops` (in op order) arrived and nothing else
  // changed.
  void ExpectPrefixWritten(const std::vector<CopyOp>& ops, uint64_t bytes) {
    std::vector<uint8_t> expected(dst_pool_.size(), kFill);
    for (const CopyOp& op : ops) {
      const uint64_t n = std::min(op.length, bytes);
      std::copy_n(&src_pool_[op.remote_offset], n, &expected[op.local_offset]);
      bytes -= n;
    }
    EXPECT_EQ(dst_pool_, expected);
  }

  bool AllFill() const {
    return std::all_of(dst_pool_.begin(), dst_pool_.end(), [](uint8_t b) { return b == kFill; });
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
  std::vector<uint8_t> src_pool_, dst_pool_;
  std::shared_ptr<InProcessFabric> fabric_;
  std::unique_ptr<InProcessAgent> src_, real_dst_;
  std::unique_ptr<FaultInjectingAgent> dst_;
  tandem::v1::TransferHandshake src_descriptor_;
};

#define TRACE_SEED() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_F(FaultInjectingAgentTest, NoFaultsPassesThrough) {
  TRACE_SEED();
  const std::vector<CopyOp> ops = RandomOps(kBlocks / 2);
  ASSERT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", ops)).ok());
  ExpectPrefixWritten(ops, TotalBytes(ops));
  EXPECT_EQ(dst_->Stats().transfers_completed, 1u);
  EXPECT_EQ(dst_->Stats().bytes_read, TotalBytes(ops));
  EXPECT_EQ(dst_->Stats().peers, 1u);
  EXPECT_EQ(dst_->transport(), "inprocess");
}

TEST_F(FaultInjectingAgentTest, ValidationErrorsAreTheBaseAgents) {
  EXPECT_EQ(dst_->PostRead("nobody", RandomOps(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dst_->PostRead("p0", {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> bad = {{0, 0, 0, kBlock * kBlocks, 1}};
  EXPECT_EQ(dst_->PostRead("p0", bad).status().code(), absl::StatusCode::kOutOfRange);
  dst_->SetFaults({.fail_after_bytes = 0});
  EXPECT_EQ(dst_->PostRead("p0", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst_->CheckTransfer(77).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FaultInjectingAgentTest, DropStaysInFlightUntilCancel) {
  dst_->SetFaults({.drop = true});
  const TransferId id = *dst_->PostRead("p0", RandomOps(4));
  for (int i = 0; i < 20; ++i) {
    ASSERT_FALSE(*dst_->CheckTransfer(id));
    absl::SleepFor(absl::Milliseconds(1));
  }
  dst_->Cancel(id);
  EXPECT_EQ(WaitForEnd(*dst_, id).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(dst_->CheckTransfer(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dst_->Stats().transfers_failed, 1u);
}

TEST_F(FaultInjectingAgentTest, DropEndsOnKillAndRemove) {
  dst_->SetFaults({.drop = true});
  const TransferId a = *dst_->PostRead("p0", RandomOps(4));
  dst_->KillPeer("p0");
  EXPECT_EQ(WaitForEnd(*dst_, a).code(), absl::StatusCode::kUnavailable);
  dst_->RevivePeer("p0");
  const TransferId b = *dst_->PostRead("p0", RandomOps(4));
  dst_->RemovePeer("p0");
  EXPECT_EQ(WaitForEnd(*dst_, b).code(), absl::StatusCode::kCancelled);
}

TEST_F(FaultInjectingAgentTest, DelayIsALowerBoundOnTheEnd) {
  TRACE_SEED();
  const absl::Duration delay = absl::Milliseconds(30);
  dst_->SetFaults({.delay = delay});
  const std::vector<CopyOp> ops = RandomOps(3);
  const absl::Time start = absl::Now();
  const TransferId id = *dst_->PostRead("p0", ops);
  ASSERT_TRUE(WaitForEnd(*dst_, id).ok());
  EXPECT_GE(absl::Now() - start, delay);  // a lower bound by construction, not a timing race
  ExpectPrefixWritten(ops, TotalBytes(ops));
  // Cancel ends a delayed transfer without waiting out the delay.
  dst_->SetFaults({.delay = absl::Hours(1)});
  const TransferId slow = *dst_->PostRead("p0", ops);
  dst_->Cancel(slow);
  absl::Status end = WaitForEnd(*dst_, slow);
  EXPECT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
}

TEST_F(FaultInjectingAgentTest, FailAfterBytesWritesExactlyThePrefix) {
  TRACE_SEED();
  for (int round = 0; round < 10; ++round) {
    std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
    const std::vector<CopyOp> ops = RandomOps(1 + rng_() % 8);
    const uint64_t total = TotalBytes(ops);
    const uint64_t n = round == 0 ? 0 : round == 1 ? total : rng_() % total;
    dst_->SetFaults({.fail_after_bytes = n, .failure = absl::DataLossError("boom")});
    absl::Status end = WaitForEnd(*dst_, *dst_->PostRead("p0", ops));
    EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss) << end;
    ExpectPrefixWritten(ops, n);
  }
}

TEST_F(FaultInjectingAgentTest, KillPeerMidTransferWaitsForTheBaseAndStopsWrites) {
  real_dst_->HoldTransfers(true);  // the base transfer stays in flight
  const TransferId id = *dst_->PostRead("p0", RandomOps(kBlocks));
  EXPECT_FALSE(*dst_->CheckTransfer(id));
  dst_->KillPeer("p0");
  EXPECT_EQ(WaitForEnd(*dst_, id).code(), absl::StatusCode::kUnavailable);
  real_dst_->HoldTransfers(false);
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(AllFill()) << "bytes written after the end";
  // Dead until revived: new transfers fail too, and write nothing.
  EXPECT_EQ(WaitForEnd(*dst_, *dst_->PostRead("p0", RandomOps(2))).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(AllFill());
  ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());  // reconnect revives
  EXPECT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", RandomOps(2))).ok());
}

TEST_F(FaultInjectingAgentTest, PostErrorCountAndPeerOverride) {
  dst_->SetFaults({.post_error = absl::ResourceExhaustedError("full"), .count = 1});
  EXPECT_EQ(dst_->PostRead("p0", RandomOps(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", RandomOps(1))).ok());  // count used up
  EXPECT_TRUE(AllFill() == false);
  // A per-peer fault overrides the default one.
  dst_->SetFaults({.post_error = absl::InternalError("default")});
  dst_->SetPeerFaults("p0", {.fail_after_bytes = 10});
  EXPECT_EQ(WaitForEnd(*dst_, *dst_->PostRead("p0", RandomOps(1))).code(),
            absl::StatusCode::kUnavailable);
  dst_->ClearFaults();
  EXPECT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", RandomOps(1))).ok());
}

TEST_F(FaultInjectingAgentTest, RealPeerDeathStillSurfaces) {
  real_dst_->HoldTransfers(true);
  const TransferId id = *dst_->PostRead("p0", RandomOps(kBlocks));
  fabric_->Kill("p0");
  EXPECT_EQ(WaitForEnd(*dst_, id).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kvtransfer
