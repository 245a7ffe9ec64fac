// UcxAgent with both agents in this process (loopback; the two-process tests are in
// ucx_two_process_test.cc).
#include "kvtransfer/ucx/ucx_agent.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/testing/agent_test_util.h"
#include "kvtransfer/ucx/ucx_gather_wire.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::FillPattern;
using ::tandem::kvtransfer::testing::FirstPatternMismatch;
using ::tandem::kvtransfer::testing::WaitForEnd;
using ::tandem::v1::MEMORY_KIND_HOST;

constexpr uint8_t kFill = 0xC3;

class UcxAgentTest : public ::testing::Test {
 protected:
  // `block` bytes per block, `blocks` blocks per pool. allocate_source: the source pool comes
  // from AllocateMemory (shared memory), so the reader copies it directly (direct copies).
  // source_options: the source's, when they differ from the reader's.
  void Start(uint64_t block, uint32_t blocks, UcxAgentOptions options = {},
             bool allocate_source = false,
             std::optional<UcxAgentOptions> source_options = std::nullopt) {
    seed_ = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    rng_.seed(seed_);
    block_ = block;
    blocks_ = blocks;
    dst_pool_.assign(block * blocks, kFill);
    auto src = UcxAgent::Create(source_options.value_or(options));
    ASSERT_TRUE(src.ok()) << src.status();
    auto dst = UcxAgent::Create(options);
    ASSERT_TRUE(dst.ok()) << dst.status();
    src_ = *std::move(src);
    dst_ = *std::move(dst);
    if (allocate_source) {
      auto allocated = src_->AllocateMemory(block * blocks, MEMORY_KIND_HOST);
      ASSERT_TRUE(allocated.ok()) << allocated.status();
      ASSERT_EQ(allocated->second, 0u);
      FillPattern(seed_, 0,
                  absl::MakeSpan(static_cast<uint8_t*>(allocated->first), block * blocks));
    } else {
      src_pool_.resize(block * blocks);
      FillPattern(seed_, 0, absl::MakeSpan(src_pool_));
      ASSERT_EQ(*src_->RegisterMemory(src_pool_.data(), src_pool_.size(), MEMORY_KIND_HOST), 0u);
    }
    ASSERT_EQ(*dst_->RegisterMemory(dst_pool_.data(), dst_pool_.size(), MEMORY_KIND_HOST), 0u);
    ASSERT_TRUE(src_->FillLocalDescriptor(&src_descriptor_).ok());
    ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());
  }

  std::vector<CopyOp> RandomOps(uint32_t n, bool partial_last) {
    std::vector<uint32_t> local(blocks_), remote(blocks_);
    for (uint32_t i = 0; i < blocks_; ++i) local[i] = remote[i] = i;
    std::shuffle(local.begin(), local.end(), rng_);
    std::shuffle(remote.begin(), remote.end(), rng_);
    local.resize(n);
    remote.resize(n);
    if (rng_() % 2) std::sort(remote.begin(), remote.end());
    if (rng_() % 2) std::sort(local.begin(), local.end());
    std::vector<CopyOp> ops = BlockCopyOps(0, 0, block_, local, remote);
    if (partial_last) ops.back().length -= rng_() % ops.back().length;
    return ops;
  }

  // Every target byte holds the source pattern; every other byte still holds kFill.
  void ExpectExactly(const std::vector<CopyOp>& ops) {
    std::vector<bool> written(dst_pool_.size(), false);
    for (const CopyOp& op : ops) {
      ASSERT_EQ(FirstPatternMismatch(seed_, op.remote_offset,
                                     absl::MakeSpan(&dst_pool_[op.local_offset], op.length)),
                -1);
      std::fill_n(written.begin() + op.local_offset, op.length, true);
    }
    for (size_t i = 0; i < written.size(); ++i) {
      if (!written[i]) {
        ASSERT_EQ(dst_pool_[i], kFill) << "byte " << i << " outside the targets changed";
      }
    }
  }

  // Cancels a long transfer after a random delay, `rounds` times: it ends OK or CANCELLED,
  // nothing changes after its end was observed, and every byte that did arrive is correct.
  void CancelAndCheckNoLateWrites(int rounds) {
    int cancelled = 0;
    for (int round = 0; round < rounds; ++round) {
      std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
      const std::vector<CopyOp> ops = RandomOps(blocks_, false);
      const TransferId id = *dst_->PostRead("p0", ops);
      // Round 0 cancels at once (surely before the end), the others after a random delay.
      if (round > 0) absl::SleepFor(absl::Microseconds(rng_() % 2000));
      dst_->Cancel(id);
      absl::Status end = WaitForEnd(*dst_, id);
      ASSERT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
      cancelled += end.code() == absl::StatusCode::kCancelled;
      const std::vector<uint8_t> at_end = dst_pool_;
      absl::SleepFor(absl::Milliseconds(20));
      ASSERT_TRUE(dst_pool_ == at_end) << "bytes written after the end was observed";
      for (const CopyOp& op : ops) {
        for (uint64_t i = 0; i < op.length; i += 997) {
          const uint8_t got = dst_pool_[op.local_offset + i];
          if (got != kFill) {
            ASSERT_EQ(got, testing::PatternByte(seed_, op.remote_offset + i))
                << "local byte " << op.local_offset + i;
          }
        }
      }
    }
    EXPECT_GT(cancelled, 0);
    EXPECT_EQ(dst_->Stats().transfers_failed, static_cast<uint64_t>(cancelled));
  }

  // Rounds of random strided ops (rows up to max_row bytes, gaps on either side) split into two
  // concurrent transfers: every row lands where it should and nothing else changes.
  void CheckStridedRounds(int rounds, uint64_t max_row) {
    for (int round = 0; round < rounds; ++round) {
      std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
      const std::vector<StridedCopyOp> ops = testing::RandomStridedOps(
          rng_, dst_pool_.size(), block_ * blocks_, 8, round % 2 == 0 ? max_row / 3 : max_row);
      const size_t half = ops.size() / 2;
      absl::StatusOr<TransferId> a =
          dst_->PostStridedRead("p0", absl::MakeConstSpan(ops).subspan(0, half));
      absl::StatusOr<TransferId> b =
          dst_->PostStridedRead("p0", absl::MakeConstSpan(ops).subspan(half));
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      ASSERT_TRUE(WaitForEnd(*dst_, *a).ok());
      ASSERT_TRUE(WaitForEnd(*dst_, *b).ok());
      const absl::Status check = testing::CheckStridedCopies(seed_, ops, dst_pool_, kFill);
      ASSERT_TRUE(check.ok()) << "round " << round << ": " << check;
    }
  }

  unsigned seed_ = 0;
  std::mt19937 rng_;
  uint64_t block_ = 0;
  uint32_t blocks_ = 0;
  std::vector<uint8_t> src_pool_, dst_pool_;
  std::unique_ptr<UcxAgent> src_, dst_;
  tandem::v1::TransferHandshake src_descriptor_;
};

#define TRACE_SEED() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_F(UcxAgentTest, RandomBlockListsAreBitExact) {
  // Small requests so one transfer spans many requests and the in-flight window.
  Start(64 << 10, 48, {.max_request_bytes = 100000, .max_inflight_bytes = 300000});
  TRACE_SEED();
  for (int round = 0; round < 12; ++round) {
    std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
    const std::vector<CopyOp> ops = RandomOps(1 + rng_() % blocks_, round % 2 == 1);
    absl::StatusOr<TransferId> id = dst_->PostRead("p0", ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(WaitForEnd(*dst_, *id).ok());
    ExpectExactly(ops);
  }
  EXPECT_EQ(dst_->Stats().transfers_completed, 12u);
  EXPECT_EQ(dst_->Stats().peers, 1u);
}

TEST_F(UcxAgentTest, OddBlockSizeAndConcurrentTransfers) {
  Start(4099, 64, {.max_request_bytes = 5000, .max_inflight_bytes = 20000});
  TRACE_SEED();
  // Four concurrent transfers over disjoint destination blocks.
  std::vector<TransferId> ids;
  std::vector<CopyOp> all;
  for (uint32_t t = 0; t < 4; ++t) {
    std::vector<uint32_t> local, remote;
    for (uint32_t b = t; b < blocks_; b += 4) {
      local.push_back(b);
      remote.push_back(blocks_ - 1 - b);
    }
    std::vector<CopyOp> ops = BlockCopyOps(0, 0, block_, local, remote);
    all.insert(all.end(), ops.begin(), ops.end());
    ids.push_back(*dst_->PostRead("p0", ops));
  }
  for (TransferId id : ids) ASSERT_TRUE(WaitForEnd(*dst_, id).ok());
  ExpectExactly(all);
}

TEST_F(UcxAgentTest, ReadFromSelf) {
  Start(8192, 8);
  TRACE_SEED();
  tandem::v1::TransferHandshake self;
  ASSERT_TRUE(src_->FillLocalDescriptor(&self).ok());
  ASSERT_TRUE(src_->AddPeer("self", self).ok());
  const std::vector<CopyOp> ops = {{0, 0, 0, 4 * 8192, 8192}};  // block 4 -> block 0
  ASSERT_TRUE(WaitForEnd(*src_, *src_->PostRead("self", ops)).ok());
  EXPECT_EQ(FirstPatternMismatch(seed_, 4 * 8192, absl::MakeSpan(src_pool_.data(), 8192)), -1);
}

TEST_F(UcxAgentTest, PostReadValidation) {
  Start(4096, 4);
  EXPECT_EQ(dst_->PostRead("nobody", RandomOps(1, false)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(dst_->PostRead("p0", {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> zero = {{0, 0, 0, 0, 0}};
  EXPECT_EQ(dst_->PostRead("p0", zero).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> past_remote = {{0, 0, 0, 4 * 4096 - 1, 2}};
  EXPECT_EQ(dst_->PostRead("p0", past_remote).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<CopyOp> past_local = {{0, 4 * 4096, 0, 0, 1}};
  EXPECT_EQ(dst_->PostRead("p0", past_local).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<CopyOp> bad_region = {{0, 0, 3, 0, 1}};
  EXPECT_EQ(dst_->PostRead("p0", bad_region).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(dst_->CheckTransfer(999).status().code(), absl::StatusCode::kNotFound);
  dst_->Cancel(999);  // no-op
}

TEST_F(UcxAgentTest, RegisterAndAddPeerErrors) {
  Start(4096, 4);
  EXPECT_FALSE(dst_->SupportsCudaMemory());
  std::vector<uint8_t> buf(4096, 1);
  // CUDA memory without UCX CUDA support: UNIMPLEMENTED unless staging is asked for.
  EXPECT_EQ(
      dst_->RegisterMemory(buf.data(), buf.size(), tandem::v1::MEMORY_KIND_CUDA).status().code(),
      absl::StatusCode::kUnimplemented);
  // With staging, host memory called CUDA: CPU-only builds cannot stage (UNIMPLEMENTED); CUDA
  // builds find it is no device memory (INVALID_ARGUMENT), or that there is no GPU
  // (UNAVAILABLE).
  auto staging = UcxAgent::Create({.stage_cuda_memory = true});
  ASSERT_TRUE(staging.ok()) << staging.status();
  const absl::Status cuda =
      (*staging)->RegisterMemory(buf.data(), buf.size(), tandem::v1::MEMORY_KIND_CUDA).status();
  if (CudaStagingCompiled()) {
    EXPECT_TRUE(cuda.code() == absl::StatusCode::kInvalidArgument ||
                cuda.code() == absl::StatusCode::kUnavailable)
        << cuda;
  } else {
    EXPECT_EQ(cuda.code(), absl::StatusCode::kUnimplemented) << cuda;
  }
  EXPECT_EQ(dst_->RegisterMemory(nullptr, 10, MEMORY_KIND_HOST).status().code(),
            absl::StatusCode::kInvalidArgument);
  tandem::v1::TransferHandshake bad = src_descriptor_;
  bad.set_transport("inprocess");
  EXPECT_EQ(dst_->AddPeer("x", bad).code(), absl::StatusCode::kInvalidArgument);
  bad = src_descriptor_;
  bad.clear_worker_address();
  EXPECT_EQ(dst_->AddPeer("x", bad).code(), absl::StatusCode::kInvalidArgument);
  bad = src_descriptor_;
  bad.mutable_regions(0)->clear_packed_rkey();
  EXPECT_EQ(dst_->AddPeer("x", bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst_->Stats().peers, 1u);
}

TEST_F(UcxAgentTest, CancelEndsAndNothingIsWrittenAfterTheEnd) {
  // Many small requests through a narrow window: the transfer is long enough to cancel.
  Start(64 << 10, 256, {.max_request_bytes = 4096, .max_inflight_bytes = 8192});
  TRACE_SEED();
  CancelAndCheckNoLateWrites(5);
  if (HasFatalFailure()) return;
  // The agent still works afterwards.
  std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
  const std::vector<CopyOp> ops = RandomOps(3, true);
  ASSERT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", ops)).ok());
  ExpectExactly(ops);
}

TEST_F(UcxAgentTest, RemoveAndReAddPeer) {
  Start(64 << 10, 128, {.max_request_bytes = 4096, .max_inflight_bytes = 8192});
  TRACE_SEED();
  const TransferId id = *dst_->PostRead("p0", RandomOps(blocks_, false));
  dst_->RemovePeer("p0");
  absl::Status end = WaitForEnd(*dst_, id);
  EXPECT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
  EXPECT_EQ(dst_->PostRead("p0", RandomOps(1, false)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dst_->Stats().peers, 0u);
  ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());
  // Re-adding over a live connection replaces it.
  const TransferId before = *dst_->PostRead("p0", RandomOps(blocks_, false));
  ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());
  end = WaitForEnd(*dst_, before);
  EXPECT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
  std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
  const std::vector<CopyOp> ops = RandomOps(5, true);
  ASSERT_TRUE(WaitForEnd(*dst_, *dst_->PostRead("p0", ops)).ok());
  ExpectExactly(ops);
}

TEST_F(UcxAgentTest, DestroyWithTransfersInFlight) {
  Start(64 << 10, 128, {.max_request_bytes = 4096, .max_inflight_bytes = 8192});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(dst_->PostRead("p0", RandomOps(blocks_, false)).ok());
  dst_.reset();  // must not hang or crash
  const std::vector<uint8_t> after = dst_pool_;
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(dst_pool_ == after);
}

TEST_F(UcxAgentTest, IdleAgentDoesNotSpin) {
  Start(4096, 4);
  // CPU time of this process over an idle period: two idle progress threads must not burn it.
  const std::clock_t c0 = std::clock();
  absl::SleepFor(absl::Milliseconds(300));
  const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  // Generous: a spinning thread would use ~0.3 s; idle wakeups use well under 0.05 s.
  EXPECT_LT(cpu_s, 0.15) << "idle CPU " << cpu_s << " s";
}

TEST(UcxAgentOptionsTest, CopyThreadsOutOfRangeAreRefused) {
  for (int threads : {0, -1, 65}) {
    EXPECT_EQ(UcxAgent::Create({.copy_threads = threads}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << threads;
  }
}

// Direct copies (source pool from AllocateMemory, mapped by the reader) run by 1, 2 or 3 copy
// threads.
class UcxAgentDirectCopyTest : public UcxAgentTest, public ::testing::WithParamInterface<int> {
 protected:
  // Small requests through a window of several: the copy queue holds many copies at once.
  void StartDirect(uint64_t block, uint32_t blocks, uint64_t request_bytes, uint64_t window_bytes) {
    Start(block, blocks,
          {.max_request_bytes = request_bytes,
           .max_inflight_bytes = window_bytes,
           .copy_threads = GetParam(),
           .min_streaming_transfer_bytes = 0},  // streaming stores even for short transfers
          /*allocate_source=*/true);
  }
};

TEST_P(UcxAgentDirectCopyTest, RandomBlockListsAndConcurrentTransfersAreBitExact) {
  StartDirect(64 << 10, 64, 10007, 200000);
  TRACE_SEED();
  for (int round = 0; round < 8; ++round) {
    std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
    // Two concurrent transfers into disjoint destination blocks (even / odd), odd lengths.
    std::vector<CopyOp> all;
    std::vector<TransferId> ids;
    std::vector<uint32_t> remote(blocks_);
    for (uint32_t i = 0; i < blocks_; ++i) remote[i] = i;
    std::shuffle(remote.begin(), remote.end(), rng_);
    for (uint32_t part = 0; part < 2; ++part) {
      std::vector<uint32_t> local, src;
      for (uint32_t b = part; b < blocks_; b += 2) {
        if (rng_() % 3 == 0) continue;
        local.push_back(b);
        src.push_back(remote[b]);
      }
      if (local.empty()) continue;
      std::vector<CopyOp> ops = BlockCopyOps(0, 0, block_, local, src);
      ops.back().length -= rng_() % ops.back().length;
      all.insert(all.end(), ops.begin(), ops.end());
      absl::StatusOr<TransferId> id = dst_->PostRead("p0", ops);
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    for (TransferId id : ids) ASSERT_TRUE(WaitForEnd(*dst_, id).ok());
    ExpectExactly(all);
    if (HasFatalFailure()) return;
  }
}

TEST_P(UcxAgentDirectCopyTest, CancelEndsAndNothingIsWrittenAfterTheEnd) {
  StartDirect(64 << 10, 256, 4096, 64 << 10);
  TRACE_SEED();
  CancelAndCheckNoLateWrites(5);
}

TEST_P(UcxAgentDirectCopyTest, RemovePeerAndDestroyWithCopiesQueued) {
  StartDirect(64 << 10, 128, 4096, 64 << 10);
  TRACE_SEED();
  const TransferId removed = *dst_->PostRead("p0", RandomOps(blocks_, false));
  dst_->RemovePeer("p0");
  const absl::Status end = WaitForEnd(*dst_, removed);
  EXPECT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
  ASSERT_TRUE(dst_->AddPeer("p0", src_descriptor_).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(dst_->PostRead("p0", RandomOps(blocks_, false)).ok());
  dst_.reset();  // must not hang or crash, and leaves no copy running
  const std::vector<uint8_t> after = dst_pool_;
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(dst_pool_ == after);
}

// Strided reads (a re-shard's head slices) from a mapped source: random rows, gaps and strides,
// ops of many requests' worth of rows, two transfers at once; every row lands where it should
// and nothing else changes.
TEST_P(UcxAgentDirectCopyTest, StridedReadsAreBitExact) {
  StartDirect(64 << 10, 64, 10007, 200000);
  TRACE_SEED();
  ASSERT_TRUE(dst_->CanReadStrided("p0", 0));
  EXPECT_FALSE(dst_->CanReadStrided("nobody", 0));
  EXPECT_FALSE(dst_->CanReadStrided("p0", 7));
  CheckStridedRounds(6, 9000);
  // Bad batches: the same checks as PostRead's, plus strides and row sizes.
  StridedCopyOp op{.local_stride = 64, .remote_stride = 64, .row_bytes = 64, .rows = 4};
  EXPECT_EQ(dst_->PostStridedRead("nobody", {op}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dst_->PostStridedRead("p0", {}).status().code(), absl::StatusCode::kInvalidArgument);
  StridedCopyOp overlap = op;
  overlap.local_stride = 32;
  EXPECT_EQ(dst_->PostStridedRead("p0", {overlap}).status().code(),
            absl::StatusCode::kInvalidArgument);
  StridedCopyOp past = op;
  past.rows = dst_pool_.size() / 64 + 1;
  EXPECT_EQ(dst_->PostStridedRead("p0", {past}).status().code(), absl::StatusCode::kOutOfRange);
  StridedCopyOp huge = op;
  huge.row_bytes = huge.local_stride = huge.remote_stride = 20000;  // > one request
  huge.rows = 2;
  EXPECT_EQ(dst_->PostStridedRead("p0", {huge}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(CopyThreads, UcxAgentDirectCopyTest, ::testing::Values(1, 2, 3));

// Gathers at the source: strided reads from a source the reader does not map (heap memory over
// TCP, as a reader on another host sees it). Param: the request size and UCX's rendezvous
// threshold ("" = UCX's choice): many small requests answered eagerly, and 1 MiB requests answered
// by rendezvous.
class UcxAgentGatherTest : public UcxAgentTest,
                           public ::testing::WithParamInterface<std::pair<uint64_t, std::string>> {
 protected:
  void StartGather(uint64_t block, uint32_t blocks) {
    UcxAgentOptions options{.transports = "tcp,self",
                            .max_request_bytes = GetParam().first,
                            .max_inflight_bytes = 4 * GetParam().first};
    if (!GetParam().second.empty()) options.extra_config = {{"RNDV_THRESH", GetParam().second}};
    Start(block, blocks, options);
  }
};

TEST_P(UcxAgentGatherTest, StridedReadsAreBitExact) {
  StartGather(64 << 10, 64);
  TRACE_SEED();
  ASSERT_TRUE(dst_->CanReadStrided("p0", 0));
  CheckStridedRounds(6, 9000);
}

// The source answers only requests carrying the gather key of its handshake: a reader holding a
// descriptor with another key (one it made up) reads nothing, its transfer fails
// PERMISSION_DENIED and no byte of its pool changes; the same reader with the real descriptor
// reads.
TEST_P(UcxAgentGatherTest, RequestsWithoutTheSourcesKeyReadNothing) {
  StartGather(64 << 10, 16);
  TRACE_SEED();
  ASSERT_EQ(src_descriptor_.ucx_gather_key().size(), kGatherKeyBytes);
  tandem::v1::TransferHandshake forged = src_descriptor_;
  std::string key = forged.ucx_gather_key();
  key[rng_() % key.size()] ^= 0x20;
  forged.set_ucx_gather_key(key);
  ASSERT_TRUE(dst_->AddPeer("forged", forged).ok());
  ASSERT_TRUE(dst_->CanReadStrided("forged", 0));
  // Strided ops only (a one-row op is a GET, whose credential is the region's rkey instead).
  std::vector<StridedCopyOp> ops;
  for (uint64_t i = 0; i < 4; ++i) {
    const uint64_t row = 1 + rng_() % 3000;
    ops.push_back({.local_offset = i * (block_ * blocks_ / 4),
                   .local_stride = row + rng_() % 64,
                   .remote_offset = rng_() % 4096,
                   .remote_stride = 2 * row,
                   .row_bytes = row,
                   .rows = 2 + rng_() % 30});
  }
  const absl::Status end = WaitForEnd(*dst_, *dst_->PostStridedRead("forged", ops));
  EXPECT_EQ(end.code(), absl::StatusCode::kPermissionDenied) << end;
  EXPECT_TRUE(std::all_of(dst_pool_.begin(), dst_pool_.end(), [](uint8_t b) { return b == kFill; }))
      << "a request without the key wrote bytes";
  CheckStridedRounds(1, 3000);  // the real key still reads
}

// A cancelled gather read ends (answers still on their way are dropped) and writes nothing after
// its end; the agent serves the next read.
TEST_P(UcxAgentGatherTest, CancelEndsAndNothingIsWrittenAfterTheEnd) {
  StartGather(256 << 10, 64);  // transfers of several MiB: round 0's cancel comes before the end
  TRACE_SEED();
  int cancelled = 0;
  for (int round = 0; round < 5; ++round) {
    std::fill(dst_pool_.begin(), dst_pool_.end(), kFill);
    const std::vector<StridedCopyOp> ops =
        testing::RandomStridedOps(rng_, dst_pool_.size(), block_ * blocks_, 8, 4000);
    const TransferId id = *dst_->PostStridedRead("p0", ops);
    if (round > 0) absl::SleepFor(absl::Microseconds(rng_() % 2000));
    dst_->Cancel(id);
    const absl::Status end = WaitForEnd(*dst_, id);
    ASSERT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
    cancelled += end.code() == absl::StatusCode::kCancelled;
    const std::vector<uint8_t> at_end = dst_pool_;
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(dst_pool_ == at_end) << "bytes written after the end was observed";
  }
  EXPECT_GT(cancelled, 0);
  CheckStridedRounds(1, 4000);
}

INSTANTIATE_TEST_SUITE_P(Answers, UcxAgentGatherTest,
                         ::testing::Values(std::pair<uint64_t, std::string>{10007, ""},
                                           std::pair<uint64_t, std::string>{1 << 20, ""},
                                           std::pair<uint64_t, std::string>{1 << 20, "1k"}));

// Without a mapping and without gathers (the reader's remote_gather off, or a source that does not
// answer them) or with direct copies off on a mapped source without gathers: no strided reads, so
// callers stage.
TEST_F(UcxAgentTest, NoStridedReadsWithoutAMappingOrGathers) {
  const StridedCopyOp op{.local_stride = 128, .remote_stride = 256, .row_bytes = 64, .rows = 4};
  Start(4096, 16, {.remote_gather = false});
  EXPECT_FALSE(dst_->CanReadStrided("p0", 0));
  EXPECT_EQ(dst_->PostStridedRead("p0", {op}).status().code(), absl::StatusCode::kUnimplemented);
  Start(4096, 16, {}, /*allocate_source=*/false, UcxAgentOptions{.remote_gather = false});
  EXPECT_FALSE(dst_->CanReadStrided("p0", 0));
  EXPECT_EQ(dst_->PostStridedRead("p0", {op}).status().code(), absl::StatusCode::kUnimplemented);
  Start(4096, 16, {.enable_am = false});
  EXPECT_FALSE(dst_->CanReadStrided("p0", 0));
  Start(4096, 16, {.direct_copy = false, .remote_gather = false}, /*allocate_source=*/true);
  EXPECT_FALSE(dst_->CanReadStrided("p0", 0));
  EXPECT_EQ(dst_->PostStridedRead("p0", {op}).status().code(), absl::StatusCode::kUnimplemented);
}

// Resident pages of [p, p + bytes) (p page-aligned): a shared segment's pages are resident in
// every mapping of it once any process faulted them in.
uint64_t ResidentPages(const char* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<char*>(p), bytes, in.data()), 0) << std::strerror(errno);
  return static_cast<uint64_t>(
      std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

// With cuda_mirror_pin_granule_bytes > 0 the reader maps a peer's shared segment without
// faulting all of it in: a P worker's CUDA mirror holds only the blocks it synced, and AddPeer's
// MADV_POPULATE_READ over the whole segment allocated the rest (issue 31, nvidia-h200-x4,
// 2026-11-28: ~100 GB, the first P->D load of an 8B pair with 16 MiB granules ran ~85 s and
// failed). Pages are populated granule by granule as requests first read them; bytes are exact.
TEST(UcxAgentLazyMappingTest, APeersSegmentIsFaultedInOnlyWhereRequestsRead) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr uint64_t kGranule = 1 << 20, kGranules = 64, kBytes = kGranule * kGranules;
  auto src = UcxAgent::Create({});
  auto dst = UcxAgent::Create({.cuda_mirror_pin_granule_bytes = kGranule});
  ASSERT_TRUE(src.ok() && dst.ok());
  auto allocated = (*src)->AllocateMemory(kBytes, MEMORY_KIND_HOST);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  const char* segment = static_cast<const char*>(allocated->first);
  if (ResidentPages(segment, kBytes) != 0) GTEST_SKIP() << "this UCX faults its segments in";
  // The source writes two random granules (a mirror's synced blocks).
  const uint64_t a = rng() % kGranules, b = (a + 1 + rng() % (kGranules - 1)) % kGranules;
  for (uint64_t g : {a, b}) {
    FillPattern(seed, g * kGranule,
                absl::MakeSpan(static_cast<uint8_t*>(allocated->first) + g * kGranule, kGranule));
  }
  std::vector<uint8_t> local(3 * kGranule, kFill);
  ASSERT_TRUE((*dst)->RegisterMemory(local.data(), local.size(), MEMORY_KIND_HOST).ok());
  tandem::v1::TransferHandshake descriptor;
  ASSERT_TRUE((*src)->FillLocalDescriptor(&descriptor).ok());
  ASSERT_TRUE((*dst)->AddPeer("p", descriptor).ok());
  EXPECT_EQ(ResidentPages(segment, kBytes), 2 * kGranule / sysconf(_SC_PAGESIZE))
      << "AddPeer faulted in what nobody wrote";
  // Reads of a piece of each written granule and of one nobody wrote (zeros): that one is
  // faulted in whole (populated ahead of the copy), nothing else.
  uint64_t c = rng() % kGranules;
  while (c == a || c == b) c = (c + 1) % kGranules;
  const uint64_t piece = 4096 + rng() % (kGranule / 2);
  const std::vector<CopyOp> ops = {{0, 0, 0, a * kGranule + rng() % (kGranule - piece), piece},
                                   {0, kGranule, 0, b * kGranule, piece},
                                   {0, 2 * kGranule, 0, c * kGranule + kGranule - piece, piece}};
  absl::StatusOr<TransferId> id = (*dst)->PostRead("p", ops);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitForEnd(**dst, *id).ok());
  for (const CopyOp& op : {ops[0], ops[1]}) {
    EXPECT_EQ(FirstPatternMismatch(seed, op.remote_offset,
                                   absl::MakeSpan(&local[op.local_offset], op.length)),
              -1);
  }
  EXPECT_TRUE(std::all_of(local.begin() + 2 * kGranule, local.begin() + 2 * kGranule + piece,
                          [](uint8_t v) { return v == 0; }));
  EXPECT_EQ(ResidentPages(segment + c * kGranule, kGranule), kGranule / sysconf(_SC_PAGESIZE))
      << "the unwritten granule read is populated whole";
  EXPECT_EQ(ResidentPages(segment, kBytes), 3 * kGranule / sysconf(_SC_PAGESIZE))
      << "reads faulted in more than the granules they read";
}

}  // namespace
}  // namespace tandem::kvtransfer
