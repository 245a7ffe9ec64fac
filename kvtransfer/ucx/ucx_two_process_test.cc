// UcxAgent between two real processes on loopback: this test reads from an agent_peer child
// (fork+exec; descriptor over a pipe, see peer_process.h).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/testing/agent_test_util.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/ucx/ucx_agent.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::kvtransfer::testing::FirstPatternMismatch;
using ::tandem::kvtransfer::testing::PatternByte;
using ::tandem::kvtransfer::testing::WaitForEnd;
using ::tandem::v1::MEMORY_KIND_HOST;

constexpr uint8_t kFill = 0x3C;

// allocate: the peer's regions come from AllocateMemory (shared-memory GETs) instead of the heap.
std::unique_ptr<PeerProcess> StartPeer(const std::vector<uint64_t>& region_bytes, uint64_t seed,
                                       bool fill = true, bool allocate = false) {
  std::string sizes;
  for (uint64_t b : region_bytes) absl::StrAppend(&sizes, sizes.empty() ? "" : ",", b);
  auto peer =
      PeerProcess::Start(SiblingBinary("agent_peer"),
                         {absl::StrCat("--region_bytes=", sizes), absl::StrCat("--seed=", seed),
                          absl::StrCat("--fill=", fill ? "true" : "false"),
                          absl::StrCat("--allocate=", allocate ? "true" : "false")});
  EXPECT_TRUE(peer.ok()) << peer.status();
  return peer.ok() ? *std::move(peer) : nullptr;
}

// Waits (at most 5 s) until process `pid` is stopped (state T in /proc/PID/stat).
bool WaitUntilStopped(pid_t pid) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// Expected value of remote byte `offset` of region `region` (the peer fills region i with
// pattern stream seed + i).
uint8_t RemoteByte(uint64_t seed, uint32_t region, uint64_t offset) {
  return PatternByte(seed + region, offset);
}

class UcxTwoProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));  // every test's log
    rng_.seed(seed_);
  }

  // Reader agent with local regions of the given sizes, filled with kFill.
  void StartReader(const std::vector<uint64_t>& local_bytes, UcxAgentOptions options = {}) {
    auto agent = UcxAgent::Create(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    reader_ = *std::move(agent);
    for (uint64_t bytes : local_bytes) {
      local_.emplace_back(bytes, kFill);
      ASSERT_TRUE(
          reader_->RegisterMemory(local_.back().data(), local_.back().size(), MEMORY_KIND_HOST)
              .ok());
    }
  }

  void ResetLocal() {
    for (auto& region : local_) std::fill(region.begin(), region.end(), kFill);
  }

  // Checks every byte of every local region: targets hold the remote pattern, the rest kFill.
  void ExpectExactly(const std::vector<CopyOp>& ops, uint64_t remote_seed) {
    std::vector<std::vector<uint8_t>> written;
    for (const auto& region : local_) written.emplace_back(region.size(), 0);
    for (const CopyOp& op : ops) {
      const int64_t bad = FirstPatternMismatch(
          remote_seed + op.remote_region, op.remote_offset,
          absl::MakeSpan(&local_[op.local_region][op.local_offset], op.length));
      ASSERT_EQ(bad, -1) << "local region " << op.local_region << " byte " << op.local_offset + bad
                         << " != remote region " << op.remote_region << " byte "
                         << op.remote_offset + bad;
      std::fill_n(written[op.local_region].begin() + op.local_offset, op.length, 1);
    }
    for (size_t r = 0; r < local_.size(); ++r) {
      for (size_t i = 0; i < local_[r].size(); ++i) {
        if (!written[r][i] && local_[r][i] != kFill) {
          FAIL() << "local region " << r << " byte " << i << " outside the targets changed";
        }
      }
    }
  }

  // A random non-contiguous block batch: `n` distinct remote blocks of `block` bytes from
  // remote region `rr` (of `remote_bytes`) into distinct local blocks of local region `lr`,
  // some runs sorted (coalescable), the last op maybe partial.
  std::vector<CopyOp> RandomBatch(uint32_t lr, uint32_t rr, uint64_t block, uint64_t remote_bytes,
                                  uint32_t n) {
    const uint32_t remote_blocks = static_cast<uint32_t>(remote_bytes / block);
    const uint32_t local_blocks = static_cast<uint32_t>(local_[lr].size() / block);
    n = std::min({n, remote_blocks, local_blocks});
    std::vector<uint32_t> remote(remote_blocks), local(local_blocks);
    for (uint32_t i = 0; i < remote_blocks; ++i) remote[i] = i;
    for (uint32_t i = 0; i < local_blocks; ++i) local[i] = i;
    std::shuffle(remote.begin(), remote.end(), rng_);
    std::shuffle(local.begin(), local.end(), rng_);
    remote.resize(n);
    local.resize(n);
    if (rng_() % 2) {
      std::sort(remote.begin(), remote.end());
      std::sort(local.begin(), local.end());
    }
    std::vector<CopyOp> ops = BlockCopyOps(lr, rr, block, local, remote);
    if (rng_() % 2) ops.back().length = 1 + rng_() % ops.back().length;
    return ops;
  }

  // strided: the reads are strided over TCP (gathers at the source).
  void KillSourceMidTransfer(bool allocate, bool separate, bool strided = false);
  void CancelStopsWriting(bool allocate, int copy_threads);

  unsigned seed_ = 0;
  std::mt19937 rng_;
  std::unique_ptr<UcxAgent> reader_;
  std::vector<std::vector<uint8_t>> local_;
};

#define TRACE_SEED() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_F(UcxTwoProcessTest, RandomBlockListsAreBitExact) {
  TRACE_SEED();
  const std::vector<uint64_t> remote_bytes = {(64 << 10) * 96, 1000003};
  std::unique_ptr<PeerProcess> peer = StartPeer(remote_bytes, seed_);
  ASSERT_NE(peer, nullptr);
  StartReader({(64 << 10) * 80, 777777},
              {.max_request_bytes = 200000, .max_inflight_bytes = 1 << 20});
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  // 64 KiB blocks (the realistic case) and odd block sizes, both regions on both sides.
  const std::vector<uint64_t> blocks = {64 << 10, 4099, 12345, 1};
  for (int round = 0; round < 16; ++round) {
    ResetLocal();
    const uint64_t block = blocks[round % blocks.size()];
    std::vector<CopyOp> ops;
    for (int part = 0; part < 2; ++part) {
      // Two sub-batches: one into each local region, so destinations never overlap.
      const uint32_t lr = (round + part) % 2;
      const uint32_t rr = (round / 2 + part) % 2;
      std::vector<CopyOp> sub =
          RandomBatch(lr, rr, block, remote_bytes[rr], block == 1 ? 500 : 1 + rng_() % 60);
      ops.insert(ops.end(), sub.begin(), sub.end());
    }
    absl::StatusOr<TransferId> id = reader_->PostRead("p", ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(WaitForEnd(*reader_, *id).ok());
    ExpectExactly(ops, seed_);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(reader_->Stats().transfers_completed, 16u);
  EXPECT_EQ(peer->Stop(), 0);  // clean exit of the harness
}

// Kills the source process mid-transfer; the transfer must end with an error, not hang.
void UcxTwoProcessTest::KillSourceMidTransfer(bool allocate, bool separate, bool strided) {
  const uint64_t bytes = uint64_t{128} << 20;
  std::unique_ptr<PeerProcess> peer = StartPeer({bytes}, seed_, /*fill=*/false, allocate);
  ASSERT_NE(peer, nullptr);
  // Small requests through a narrow window: the transfer stays in flight long enough to kill.
  StartReader({bytes}, {.transports = strided ? "tcp,self" : "tcp,self,sm",
                        .max_request_bytes = 64 << 10,
                        .max_inflight_bytes = 128 << 10,
                        .separate_data_endpoint = separate});
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  const std::vector<CopyOp> all = {{0, 0, 0, 0, bytes}};
  // Strided: the first 1 KiB of every 2 KiB, over TCP (gathers at the source).
  const std::vector<StridedCopyOp> rows = {
      {.local_stride = 1024, .remote_stride = 2048, .row_bytes = 1024, .rows = bytes / 2048}};
  auto post = [&] {
    return strided ? reader_->PostStridedRead("p", rows) : reader_->PostRead("p", all);
  };
  ASSERT_TRUE(WaitForEnd(*reader_, *post()).ok());  // connection works

  TransferId id = *post();
  absl::SleepFor(absl::Milliseconds(rng_() % 10));
  // On shared memory the transfer may already be over: then CheckTransfer reports its end once.
  const absl::StatusOr<bool> first = reader_->CheckTransfer(id);
  const bool in_flight = first.ok() && !*first;
  std::optional<absl::Status> first_end;
  if (!in_flight) first_end = first.ok() ? absl::OkStatus() : first.status();
  const absl::Time killed_at = absl::Now();
  peer->Kill();
  // Reads that finish before the death is noticed may succeed (shared memory outlives the
  // process while mapped); keep reading until one fails.
  absl::Status end;
  for (int reads = 0; reads < 1000 && absl::Now() - killed_at < absl::Seconds(10); ++reads) {
    if (first_end.has_value()) {
      end = *first_end;
      first_end.reset();
    } else {
      end = WaitForEnd(*reader_, id, absl::Seconds(10), absl::Microseconds(200));
    }
    ASSERT_NE(end.code(), absl::StatusCode::kDeadlineExceeded) << "hang: " << end;
    if (!end.ok()) break;
    absl::StatusOr<TransferId> next = post();
    ASSERT_TRUE(next.ok()) << next.status();
    id = *next;
  }
  EXPECT_FALSE(end.ok());
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  const absl::Duration since_kill = absl::Now() - killed_at;
  std::printf(
      "allocate %d separate %d strided %d: kill -9 -> transfer error in %s (was in flight: %d): "
      "%s\n",
      allocate, separate, strided, absl::FormatDuration(since_kill).c_str(), in_flight,
      end.ToString().c_str());
  EXPECT_LT(since_kill, absl::Seconds(5)) << "dead peer found too late";
  // Later reads from the dead peer fail too, and do not hang.
  absl::StatusOr<TransferId> later = post();
  if (later.ok()) {
    absl::Status s = WaitForEnd(*reader_, *later, absl::Seconds(10));
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  }
}

TEST_F(UcxTwoProcessTest, KilledSourceFailsTheTransfer) {
  TRACE_SEED();
  KillSourceMidTransfer(/*allocate=*/false, /*separate=*/true);
}

TEST_F(UcxTwoProcessTest, KilledSourceFailsTheTransferOnSharedMemory) {
  TRACE_SEED();
  KillSourceMidTransfer(/*allocate=*/true, /*separate=*/true);
}

TEST_F(UcxTwoProcessTest, KilledSourceFailsTheTransferOnOneEndpoint) {
  TRACE_SEED();
  KillSourceMidTransfer(/*allocate=*/false, /*separate=*/false);
}

TEST_F(UcxTwoProcessTest, KilledSourceFailsAGatherRead) {
  TRACE_SEED();
  KillSourceMidTransfer(/*allocate=*/false, /*separate=*/true, /*strided=*/true);
}

// Gathers from another process over TCP: bit-exact rows (gaps on the source side, and on both
// sides), and a source stopped with SIGSTOP (it answers nothing) does not keep a cancelled read
// from ending; once it runs again the connection still serves.
TEST_F(UcxTwoProcessTest, GatherReadsAreBitExactAndACancelEndsOnAStoppedSource) {
  TRACE_SEED();
  const uint64_t bytes = uint64_t{16} << 20;
  std::unique_ptr<PeerProcess> peer = StartPeer({bytes}, seed_);
  ASSERT_NE(peer, nullptr);
  StartReader({bytes}, {.transports = "tcp,self", .max_request_bytes = 256 << 10});
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  ASSERT_TRUE(reader_->CanReadStrided("p", 0));
  for (const auto& [row, local_stride] :
       {std::pair<uint64_t, uint64_t>{1024, 1024}, {768, 1000}, {4096, 4096 + 64}}) {
    ResetLocal();
    const uint64_t n = std::min(bytes / (2 * row), bytes / local_stride);
    const std::vector<StridedCopyOp> ops = {
        {.local_stride = local_stride, .remote_stride = 2 * row, .row_bytes = row, .rows = n}};
    ASSERT_TRUE(WaitForEnd(*reader_, *reader_->PostStridedRead("p", ops)).ok());
    const absl::Status check = testing::CheckStridedCopies(seed_, ops, local_[0], kFill);
    ASSERT_TRUE(check.ok()) << "rows of " << row << ": " << check;
  }
  ASSERT_EQ(kill(peer->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitUntilStopped(peer->pid()));  // answers nothing from here on
  const std::vector<StridedCopyOp> rows = {
      {.local_stride = 1024, .remote_stride = 2048, .row_bytes = 1024, .rows = bytes / 2048}};
  const TransferId id = *reader_->PostStridedRead("p", rows);
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_FALSE(*reader_->CheckTransfer(id)) << "a stopped source answered";
  const absl::Time cancelled_at = absl::Now();
  reader_->Cancel(id);
  const absl::Status end = WaitForEnd(*reader_, id, absl::Seconds(10));
  EXPECT_EQ(end.code(), absl::StatusCode::kCancelled) << end;
  // A receive that cannot end (the source stopped mid-rendezvous) is closed by force after 1 s.
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(5))
      << "cancel on a stopped source took too long";
  ASSERT_EQ(kill(peer->pid(), SIGCONT), 0);
  ResetLocal();
  absl::Status again = WaitForEnd(*reader_, *reader_->PostStridedRead("p", rows));
  if (!again.ok()) {
    // A cancel that had to close the connection (an answer was being received when the source
    // stopped) leaves the peer failed until it is added again.
    EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
    ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
    again = WaitForEnd(*reader_, *reader_->PostStridedRead("p", rows));
  }
  ASSERT_TRUE(again.ok()) << again;
  const absl::Status check = testing::CheckStridedCopies(seed_, rows, local_[0], kFill);
  EXPECT_TRUE(check.ok()) << check;
}

// AllocateMemory'd regions on both sides (the shared-memory fast path): random block lists
// arrive bit-exact and nothing outside the targets changes.
TEST_F(UcxTwoProcessTest, AllocatedRegionsAreBitExact) {
  TRACE_SEED();
  const uint64_t block = 64 << 10;
  const std::vector<uint64_t> remote_bytes = {block * 64, 1000003};
  std::unique_ptr<PeerProcess> peer = StartPeer(remote_bytes, seed_, /*fill=*/true,
                                                /*allocate=*/true);
  ASSERT_NE(peer, nullptr);
  auto agent = UcxAgent::Create({.max_request_bytes = 100000, .max_inflight_bytes = 1 << 20});
  ASSERT_TRUE(agent.ok()) << agent.status();
  reader_ = *std::move(agent);
  const uint64_t local_bytes = block * 48;
  auto allocated = reader_->AllocateMemory(local_bytes, MEMORY_KIND_HOST);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  ASSERT_EQ(allocated->second, 0u);
  uint8_t* local = static_cast<uint8_t*>(allocated->first);
  EXPECT_EQ(reader_->AllocateMemory(0, MEMORY_KIND_HOST).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  for (int round = 0; round < 8; ++round) {
    std::fill_n(local, local_bytes, kFill);
    // Distinct destinations; odd sizes from region 1 in odd rounds.
    const uint32_t rr = round % 2;
    const uint64_t size = rr == 0 ? block : 4099 + rng_() % 5000;
    const uint32_t n = 1 + rng_() % 40;
    std::vector<uint32_t> src(remote_bytes[rr] / size), dst(local_bytes / size);
    for (uint32_t i = 0; i < src.size(); ++i) src[i] = i;
    for (uint32_t i = 0; i < dst.size(); ++i) dst[i] = i;
    std::shuffle(src.begin(), src.end(), rng_);
    std::shuffle(dst.begin(), dst.end(), rng_);
    src.resize(std::min<size_t>(n, src.size()));
    dst.resize(src.size());
    const std::vector<CopyOp> ops = BlockCopyOps(0, rr, size, dst, src);
    absl::StatusOr<TransferId> id = reader_->PostRead("p", ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(WaitForEnd(*reader_, *id).ok());
    std::vector<bool> written(local_bytes, false);
    for (const CopyOp& op : ops) {
      const int64_t bad = FirstPatternMismatch(seed_ + op.remote_region, op.remote_offset,
                                               absl::MakeSpan(local + op.local_offset, op.length));
      ASSERT_EQ(bad, -1) << "round " << round << " local byte " << op.local_offset + bad;
      std::fill_n(written.begin() + op.local_offset, op.length, true);
    }
    for (uint64_t i = 0; i < local_bytes; ++i) {
      ASSERT_TRUE(written[i] || local[i] == kFill) << "byte " << i << " outside the targets";
    }
  }
  EXPECT_EQ(reader_->Stats().transfers_completed, 8u);
  reader_.reset();
  EXPECT_EQ(peer->Stop(), 0);
}

// Cancels a 64 MiB read after a random delay: it ends OK or CANCELLED, nothing is written after
// the end, what arrived is correct, and the connection still works. allocate: the source's pool
// is shared memory, read by direct copies on `copy_threads` threads.
void UcxTwoProcessTest::CancelStopsWriting(bool allocate, int copy_threads) {
  const uint64_t bytes = uint64_t{64} << 20;
  std::unique_ptr<PeerProcess> peer = StartPeer({bytes}, seed_, /*fill=*/true, allocate);
  ASSERT_NE(peer, nullptr);
  StartReader({bytes}, {.max_request_bytes = 64 << 10,
                        .max_inflight_bytes = allocate ? uint64_t{1} << 20 : uint64_t{128} << 10,
                        .copy_threads = copy_threads});
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  const std::vector<CopyOp> all = {{0, 0, 0, 0, bytes}};
  int cancelled = 0;
  for (int round = 0; round < 4; ++round) {
    ResetLocal();
    const TransferId id = *reader_->PostRead("p", all);
    // Round 0 cancels at once (surely before the end), the others after a random delay.
    if (round > 0) absl::SleepFor(absl::Microseconds(rng_() % 5000));
    reader_->Cancel(id);
    absl::Status end = WaitForEnd(*reader_, id, absl::Seconds(10));
    ASSERT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
    cancelled += !end.ok();
    const std::vector<uint8_t> at_end = local_[0];
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(local_[0] == at_end) << "bytes written after the end was observed";
    // What did arrive is correct (a prefix of requests, in any order: check byte-wise).
    for (uint64_t i = 0; i < bytes; i += 4093) {
      if (local_[0][i] != kFill) {
        ASSERT_EQ(local_[0][i], RemoteByte(seed_, 0, i)) << i;
      }
    }
  }
  EXPECT_GT(cancelled, 0);
  // The connection is still usable after cancellations.
  ResetLocal();
  const std::vector<CopyOp> one = {{0, 4096, 0, 8192, 100000}};
  ASSERT_TRUE(WaitForEnd(*reader_, *reader_->PostRead("p", one)).ok());
  ExpectExactly(one, seed_);
}

TEST_F(UcxTwoProcessTest, CancelEndsCancelledAndStopsWriting) {
  TRACE_SEED();
  CancelStopsWriting(/*allocate=*/false, /*copy_threads=*/2);
}

TEST_F(UcxTwoProcessTest, CancelStopsDirectCopiesOnOneThread) {
  TRACE_SEED();
  CancelStopsWriting(/*allocate=*/true, /*copy_threads=*/1);
}

TEST_F(UcxTwoProcessTest, CancelStopsDirectCopiesOnTwoThreads) {
  TRACE_SEED();
  CancelStopsWriting(/*allocate=*/true, /*copy_threads=*/2);
}

// P must survive D's crash: a reader process is killed while it pulls from this process's
// agent; afterwards the source still serves a new reader correctly.
// The source's pool comes from AllocateMemory, as in the worker daemon: readers then copy it in
// place and the source serves no GETs. (With a heap-registered pool, UCX 1.13 emulates GETs with
// messages answered by the source, and a reader killed mid-GET can make UCX abort the SOURCE
// process: ucp_get_req_handler's "Fatal: unexpected error: Endpoint timeout". That is why the
// worker allocates its pool through the agent.)
// Param: the reader's strided rows (0: whole-region reads, direct copies; > 0: strided reads over
// TCP, which the source answers by gathers).
class UcxKilledReaderTest : public UcxTwoProcessTest,
                            public ::testing::WithParamInterface<uint64_t> {};

TEST_P(UcxKilledReaderTest, KilledReaderDoesNotHurtTheSource) {
  TRACE_SEED();
  const uint64_t row = GetParam();
  const uint64_t bytes = uint64_t{32} << 20;
  auto source = UcxAgent::Create();
  ASSERT_TRUE(source.ok()) << source.status();
  auto allocated = (*source)->AllocateMemory(bytes, MEMORY_KIND_HOST);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  testing::FillPattern(seed_, 0, absl::MakeSpan(static_cast<uint8_t*>(allocated->first), bytes));
  tandem::v1::TransferHandshake descriptor;
  ASSERT_TRUE((*source)->FillLocalDescriptor(&descriptor).ok());
  for (int round = 0; round < 2; ++round) {
    auto reader =
        PeerProcess::Start(SiblingBinary("agent_peer"),
                           {"--mode=reader", absl::StrCat("--region_bytes=", bytes), "--fill=false",
                            absl::StrCat("--strided_row_bytes=", row),
                            absl::StrCat("--transports=", row > 0 ? "tcp,self" : "tcp,self,sm")});
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_TRUE((*reader)->Send(descriptor.SerializeAsString()).ok());
    absl::SleepFor(absl::Milliseconds(100 + rng_() % 200));  // it is pulling in a loop
    ASSERT_TRUE((*reader)->Running()) << "the reader failed on its own";
    (*reader)->Kill();
  }
  // A fresh reader in this process gets correct bytes from the same source.
  StartReader({bytes}, {.transports = row > 0 ? "tcp,self" : "tcp,self,sm"});
  ASSERT_TRUE(reader_->AddPeer("p", descriptor).ok());
  if (row > 0) {
    const std::vector<StridedCopyOp> rows = {{.local_stride = row,
                                              .remote_stride = 2 * row,
                                              .row_bytes = row,
                                              .rows = bytes / (2 * row)}};
    ASSERT_TRUE(WaitForEnd(*reader_, *reader_->PostStridedRead("p", rows)).ok());
    const absl::Status check = testing::CheckStridedCopies(seed_, rows, local_[0], kFill);
    EXPECT_TRUE(check.ok()) << check;
  } else {
    const std::vector<CopyOp> all = {{0, 0, 0, 0, bytes}};
    ASSERT_TRUE(WaitForEnd(*reader_, *reader_->PostRead("p", all)).ok());
    EXPECT_EQ(FirstPatternMismatch(seed_, 0, local_[0]), -1);
  }
  reader_.reset();
  source->reset();  // clean shutdown with dead peers' endpoints around
}

INSTANTIATE_TEST_SUITE_P(Rows, UcxKilledReaderTest, ::testing::Values(0, 4096));

TEST_F(UcxTwoProcessTest, AddPeerOfDeadProcessFailsWithoutHanging) {
  std::unique_ptr<PeerProcess> peer = StartPeer({1 << 20}, seed_);
  ASSERT_NE(peer, nullptr);
  const tandem::v1::TransferHandshake descriptor = peer->descriptor();
  peer->Kill();
  StartReader({1 << 20}, {.connect_timeout = absl::Seconds(5)});
  const absl::Time start = absl::Now();
  absl::Status added = reader_->AddPeer("p", descriptor);
  std::printf("AddPeer of a dead process: %s after %s\n", added.ToString().c_str(),
              absl::FormatDuration(absl::Now() - start).c_str());
  if (added.ok()) {  // UCX may connect lazily; then the first read must fail
    const std::vector<CopyOp> ops = {{0, 0, 0, 0, 4096}};
    absl::Status end = WaitForEnd(*reader_, *reader_->PostRead("p", ops), absl::Seconds(10));
    EXPECT_FALSE(end.ok());
    EXPECT_NE(end.code(), absl::StatusCode::kDeadlineExceeded) << end;
  } else {
    EXPECT_EQ(added.code(), absl::StatusCode::kUnavailable) << added;
    EXPECT_EQ(reader_->PostRead("p", std::vector<CopyOp>{{0, 0, 0, 0, 8}}).status().code(),
              absl::StatusCode::kNotFound);
  }
}

TEST_F(UcxTwoProcessTest, PostReadValidation) {
  std::unique_ptr<PeerProcess> peer = StartPeer({100000}, seed_);
  ASSERT_NE(peer, nullptr);
  StartReader({50000});
  ASSERT_TRUE(reader_->AddPeer("p", peer->descriptor()).ok());
  EXPECT_EQ(reader_->PostRead("unknown", std::vector<CopyOp>{{0, 0, 0, 0, 8}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader_->PostRead("p", {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::vector<CopyOp>> out_of_range = {
      {{0, 0, 0, 99999, 2}},  // past the remote region
      {{0, 49999, 0, 0, 2}},  // past the local region
      {{0, 0, 1, 0, 1}},      // no remote region 1
      {{1, 0, 0, 0, 1}},      // no local region 1
  };
  for (const auto& ops : out_of_range) {
    EXPECT_EQ(reader_->PostRead("p", ops).status().code(), absl::StatusCode::kOutOfRange);
  }
  EXPECT_EQ(reader_->Stats().transfers_completed + reader_->Stats().transfers_failed, 0u);
}

}  // namespace
}  // namespace tandem::kvtransfer
