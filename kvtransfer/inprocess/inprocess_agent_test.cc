#include "kvtransfer/inprocess/inprocess_agent.h"

#include <algorithm>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/testing/agent_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::FillPattern;
using ::tandem::kvtransfer::testing::FirstPatternMismatch;
using ::tandem::kvtransfer::testing::WaitForEnd;
using ::tandem::v1::MEMORY_KIND_HOST;

constexpr uint64_t kBlock = 4096 + 24;  // odd-ish block size on purpose
constexpr uint32_t kBlocks = 64;

// A P/D pair on one fabric: `src` holds a pattern-filled pool, `dst` a pool of a fill byte.
struct Pair {
  explicit Pair(InProcessAgentOptions options = {}, uint64_t seed = 1)
      : fabric(std::make_shared<InProcessFabric>()),
        seed(seed),
        src_pool(kBlock * kBlocks),
        dst_pool(kBlock * kBlocks, kFill) {
    FillPattern(seed, 0, absl::MakeSpan(src_pool));
    src = std::make_unique<InProcessAgent>(fabric, "p0", options);
    dst = std::make_unique<InProcessAgent>(fabric, "d0", options);
    EXPECT_EQ(*src->RegisterMemory(src_pool.data(), src_pool.size(), MEMORY_KIND_HOST), 0u);
    EXPECT_EQ(*dst->RegisterMemory(dst_pool.data(), dst_pool.size(), MEMORY_KIND_HOST), 0u);
    tandem::v1::TransferHandshake hs;
    EXPECT_TRUE(src->FillLocalDescriptor(&hs).ok());
    EXPECT_TRUE(dst->AddPeer("p0", hs).ok());
  }
  static constexpr uint8_t kFill = 0xA5;
  std::shared_ptr<InProcessFabric> fabric;
  uint64_t seed;
  std::vector<uint8_t> src_pool, dst_pool;
  std::unique_ptr<InProcessAgent> src, dst;
};

std::vector<CopyOp> AllBlocks() {
  std::vector<uint32_t> ids(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) ids[i] = i;
  return BlockCopyOps(0, 0, kBlock, ids, ids);
}

TEST(InProcessAgentTest, RandomBlockListsAreBitExact) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Pair pair({.chunk_bytes = 10000}, seed);
  for (int round = 0; round < 20; ++round) {
    std::fill(pair.dst_pool.begin(), pair.dst_pool.end(), Pair::kFill);
    std::vector<uint32_t> remote(kBlocks), local(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) remote[i] = local[i] = i;
    std::shuffle(remote.begin(), remote.end(), rng);
    std::shuffle(local.begin(), local.end(), rng);
    const uint32_t n = 1 + rng() % (kBlocks - 1);
    remote.resize(n);
    local.resize(n);
    if (round % 2) std::sort(remote.begin(), remote.end());  // some contiguous runs
    std::vector<CopyOp> ops = BlockCopyOps(0, 0, kBlock, local, remote);
    ops.back().length -= rng() % kBlock;  // partial last block
    absl::StatusOr<TransferId> id = pair.dst->PostRead("p0", ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(WaitForEnd(*pair.dst, *id).ok());
    std::vector<bool> written(pair.dst_pool.size(), false);
    for (const CopyOp& op : ops) {
      ASSERT_EQ(FirstPatternMismatch(seed, op.remote_offset,
                                     absl::MakeSpan(&pair.dst_pool[op.local_offset], op.length)),
                -1);
      std::fill_n(written.begin() + op.local_offset, op.length, true);
    }
    for (size_t i = 0; i < written.size(); ++i) {
      if (!written[i]) {
        ASSERT_EQ(pair.dst_pool[i], Pair::kFill) << "byte " << i << " touched";
      }
    }
  }
  EXPECT_EQ(pair.dst->Stats().transfers_completed, 20u);
  EXPECT_EQ(pair.dst->Stats().peers, 1u);
}

TEST(InProcessAgentTest, HeldTransferIsInFlightAndIdIsForgottenAfterEnd) {
  Pair pair;
  pair.dst->HoldTransfers(true);
  absl::StatusOr<TransferId> id = pair.dst->PostRead("p0", AllBlocks());
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<bool> done = pair.dst->CheckTransfer(*id);
    ASSERT_TRUE(done.ok());
    EXPECT_FALSE(*done);
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(pair.dst_pool[0], Pair::kFill);  // held: nothing moved
  pair.dst->HoldTransfers(false);
  ASSERT_TRUE(WaitForEnd(*pair.dst, *id).ok());
  EXPECT_EQ(FirstPatternMismatch(pair.seed, 0, pair.dst_pool), -1);
  EXPECT_EQ(pair.dst->CheckTransfer(*id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pair.dst->Stats().bytes_read, pair.dst_pool.size());
}

TEST(InProcessAgentTest, CancelWhileHeldEndsCancelledWithoutWrites) {
  Pair pair;
  pair.dst->HoldTransfers(true);
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  pair.dst->Cancel(id);
  pair.dst->Cancel(id);    // idempotent
  pair.dst->Cancel(9999);  // unknown: no-op
  EXPECT_EQ(WaitForEnd(*pair.dst, id).code(), absl::StatusCode::kCancelled);
  pair.dst->HoldTransfers(false);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(std::all_of(pair.dst_pool.begin(), pair.dst_pool.end(),
                          [](uint8_t b) { return b == Pair::kFill; }));
  EXPECT_EQ(pair.dst->Stats().transfers_failed, 1u);
}

TEST(InProcessAgentTest, CancelMidTransferStopsWriting) {
  Pair pair({.chunk_bytes = 4096, .chunk_delay = absl::Milliseconds(1)});
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  absl::SleepFor(absl::Milliseconds(10));
  pair.dst->Cancel(id);
  absl::Status end = WaitForEnd(*pair.dst, id);
  // OK is allowed if it raced to completion, but with ~65 chunks of 1 ms it should not.
  EXPECT_TRUE(end.code() == absl::StatusCode::kCancelled || end.ok()) << end;
  const std::vector<uint8_t> at_end = pair.dst_pool;
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(pair.dst_pool, at_end) << "bytes written after the end was observed";
}

TEST(InProcessAgentTest, KilledPeerFailsUnavailable) {
  Pair pair({.chunk_bytes = 4096, .chunk_delay = absl::Milliseconds(1)});
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(pair.fabric->Kill("p0"));
  EXPECT_FALSE(pair.fabric->Kill("p0"));
  EXPECT_EQ(WaitForEnd(*pair.dst, id).code(), absl::StatusCode::kUnavailable);
  // New reads from the dead peer fail too (the connection stays until RemovePeer).
  TransferId id2 = *pair.dst->PostRead("p0", AllBlocks());
  EXPECT_EQ(WaitForEnd(*pair.dst, id2).code(), absl::StatusCode::kUnavailable);
  // The killed agent itself is dead: it cannot read either.
  EXPECT_EQ(pair.src->PostRead("d0", AllBlocks()).status().code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessAgentTest, KilledPeerEndsHeldTransfers) {
  Pair pair;
  pair.dst->HoldTransfers(true);
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  pair.fabric->Kill("p0");
  EXPECT_EQ(WaitForEnd(*pair.dst, id).code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessAgentTest, DestroyedPeerFailsUnavailableAndItsMemoryIsNotRead) {
  Pair pair({.chunk_bytes = 4096, .chunk_delay = absl::Milliseconds(1)});
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  absl::SleepFor(absl::Milliseconds(5));
  pair.src.reset();
  pair.src_pool.assign(pair.src_pool.size(), 0);  // "freed": any later read would copy zeros
  pair.src_pool.clear();
  pair.src_pool.shrink_to_fit();
  EXPECT_EQ(WaitForEnd(*pair.dst, id).code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessAgentTest, RemovePeerEndsCancelledAndForgetsPeer) {
  Pair pair;
  pair.dst->HoldTransfers(true);
  TransferId id = *pair.dst->PostRead("p0", AllBlocks());
  pair.dst->RemovePeer("p0");
  pair.dst->RemovePeer("nobody");  // no-op
  EXPECT_EQ(WaitForEnd(*pair.dst, id).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(pair.dst->PostRead("p0", AllBlocks()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pair.dst->Stats().peers, 0u);
}

TEST(InProcessAgentTest, PostReadValidation) {
  Pair pair;
  EXPECT_EQ(pair.dst->PostRead("nobody", AllBlocks()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pair.dst->PostRead("p0", {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CopyOp> past_end = {{0, 0, 0, kBlock * kBlocks - 10, 11}};
  EXPECT_EQ(pair.dst->PostRead("p0", past_end).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<CopyOp> bad_region = {{1, 0, 0, 0, 8}};
  EXPECT_EQ(pair.dst->PostRead("p0", bad_region).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pair.dst->CheckTransfer(12345).status().code(), absl::StatusCode::kNotFound);
}

TEST(InProcessAgentTest, AddPeerAndRegisterErrors) {
  auto fabric = std::make_shared<InProcessFabric>();
  InProcessAgent a(fabric, "a");
  std::vector<uint8_t> buf(64, 1);
  EXPECT_EQ(a.RegisterMemory(buf.data(), buf.size(), tandem::v1::MEMORY_KIND_CUDA).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(a.RegisterMemory(nullptr, 8, MEMORY_KIND_HOST).status().code(),
            absl::StatusCode::kInvalidArgument);
  tandem::v1::TransferHandshake hs;
  hs.set_transport("ucx");
  EXPECT_EQ(a.AddPeer("x", hs).code(), absl::StatusCode::kInvalidArgument);
  hs.set_transport("inprocess");
  hs.set_worker_address("no-incarnation");
  EXPECT_EQ(a.AddPeer("x", hs).code(), absl::StatusCode::kInvalidArgument);
  hs.set_worker_address("ghost#1");
  EXPECT_EQ(a.AddPeer("x", hs).code(), absl::StatusCode::kUnavailable);
}

TEST(InProcessAgentTest, RestartedPeerNeedsNewDescriptor) {
  auto fabric = std::make_shared<InProcessFabric>();
  std::vector<uint8_t> pool(kBlock, 7), dst_pool(kBlock, 0);
  InProcessAgent d(fabric, "d");
  ASSERT_TRUE(d.RegisterMemory(dst_pool.data(), dst_pool.size(), MEMORY_KIND_HOST).ok());
  tandem::v1::TransferHandshake old_hs, new_hs;
  auto p1 = std::make_unique<InProcessAgent>(fabric, "p");
  ASSERT_TRUE(p1->RegisterMemory(pool.data(), pool.size(), MEMORY_KIND_HOST).ok());
  ASSERT_TRUE(p1->FillLocalDescriptor(&old_hs).ok());
  ASSERT_TRUE(d.AddPeer("p", old_hs).ok());
  // A new incarnation under the same name replaces the old one: the old connection is dead.
  InProcessAgent p2(fabric, "p");
  ASSERT_TRUE(p2.RegisterMemory(pool.data(), pool.size(), MEMORY_KIND_HOST).ok());
  const std::vector<CopyOp> ops = {{0, 0, 0, 0, kBlock}};
  EXPECT_EQ(WaitForEnd(d, *d.PostRead("p", ops)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(d.AddPeer("p", old_hs).code(), absl::StatusCode::kUnavailable);
  p1.reset();  // destroying the old incarnation must not unregister the new one
  ASSERT_TRUE(p2.FillLocalDescriptor(&new_hs).ok());
  EXPECT_NE(new_hs.worker_address(), old_hs.worker_address());
  ASSERT_TRUE(d.AddPeer("p", new_hs).ok());
  EXPECT_TRUE(WaitForEnd(d, *d.PostRead("p", ops)).ok());
  EXPECT_EQ(dst_pool[kBlock - 1], 7);
}

TEST(InProcessAgentTest, ConcurrentReadersFromManyThreads) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Pair pair({.chunk_bytes = 3000}, seed);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t owns blocks t, t + kThreads, ...: disjoint destinations.
      for (uint32_t b = t; b < kBlocks; b += kThreads) {
        const std::vector<CopyOp> ops = {{0, b * kBlock, 0, (kBlocks - 1 - b) * kBlock, kBlock}};
        absl::StatusOr<TransferId> id = pair.dst->PostRead("p0", ops);
        if (!id.ok()) {
          results[t] = id.status();
          return;
        }
        if (b % 3 == 0) pair.dst->Stats();
        results[t] = WaitForEnd(*pair.dst, *id);
        if (!results[t].ok()) return;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(FirstPatternMismatch(seed, (kBlocks - 1 - b) * kBlock,
                                   absl::MakeSpan(&pair.dst_pool[b * kBlock], kBlock)),
              -1)
        << "block " << b;
  }
  EXPECT_EQ(pair.dst->Stats().transfers_completed, kBlocks);
}

TEST(InProcessAgentTest, DestroyWithTransfersInFlight) {
  Pair pair({.chunk_bytes = 4096, .chunk_delay = absl::Milliseconds(1)});
  ASSERT_TRUE(pair.dst->PostRead("p0", AllBlocks()).ok());
  pair.dst->HoldTransfers(false);
  pair.dst.reset();  // must not hang or crash
  pair.src.reset();
}

}  // namespace
}  // namespace tandem::kvtransfer
