// NcclAgent across two processes (NCCL will not put one device twice into a communicator): the
// source agent runs in a re-executed copy of this binary (nccl_agent_peer.h) on device 1, the
// reader here on device 0. Needs >= 2 GPUs; skips otherwise (the init-deadline tests need 1).
// Fault tests with hand-played peers in this process are in nccl_fault_test.cc.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_peer.h"

namespace tandem::kvtransfer {
namespace {

constexpr uint64_t kBlockBytes = 48 * 1024 + 8;  // odd-ish size: offsets are not powers of 2
constexpr uint32_t kBlocks = 96;
constexpr uint64_t kPoolBytes = kBlockBytes * kBlocks;
constexpr char kSentinel = 0x5a;

#define SKIP_WITHOUT_TWO_GPUS()                                                          \
  do {                                                                                   \
    TANDEM_SKIP_WITHOUT_GPU();                                                           \
    int count = 0;                                                                       \
    cudaGetDeviceCount(&count);                                                          \
    if (count < 2) {                                                                     \
      GTEST_SKIP() << "NcclAgent's two-process test needs 2 GPUs (NCCL cannot put both " \
                      "ranks of a communicator on one device); found "                   \
                   << count;                                                             \
    }                                                                                    \
  } while (false)

absl::StatusOr<bool> WaitEnded(NcclAgent& agent, TransferId id) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    absl::StatusOr<bool> r = agent.CheckTransfer(id);
    if (!r.ok() || *r) return r;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("transfer did not end");
    absl::SleepFor(absl::Microseconds(50));
  }
}

// Tests name the communicator count they cover (half of them 1, half 2) rather than take the
// default, so both stay covered whatever NcclAgentOptions::num_comms defaults to.
NcclAgentOptions WithComms(int num_comms) {
  NcclAgentOptions o;
  o.num_comms = num_comms;
  return o;
}

class NcclTwoProcessTest : public ::testing::Test {
 protected:
  void SetUpAgents(NcclAgentOptions reader = {},
                   nccl_peer::PeerMode mode = nccl_peer::PeerMode::kAgent) {
    seed_ = std::random_device{}();
    auto peer = nccl_peer::PeerProcess::Spawn(/*device=*/1, kPoolBytes, seed_,
                                              /*staging_chunk_bytes=*/0, mode);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = std::make_unique<nccl_peer::PeerProcess>(std::move(*peer));
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&local_), kPoolBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(local_, kSentinel, kPoolBytes), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(NewReader(reader));
  }
  // Replaces the reader agent (same pool) with one of other options, connected to the source
  // (restarted with `source` first unless that is null).
  void NewReader(NcclAgentOptions options, const nccl_peer::PeerAgentConfig* source = nullptr) {
    agent_.reset();
    if (source != nullptr) {
      absl::Status restarted = peer_->RestartAgent(*source);
      ASSERT_TRUE(restarted.ok()) << restarted;
    }
    options.device = 0;
    auto agent = NcclAgent::Create(options);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(*agent);
    ASSERT_TRUE(agent_->RegisterMemory(local_, kPoolBytes, tandem::v1::MEMORY_KIND_CUDA).ok());
    ASSERT_TRUE(agent_->AddPeer("src", peer_->descriptor()).ok());
  }
  void TearDown() override {
    agent_.reset();
    peer_.reset();
    if (local_ != nullptr) cudaFree(local_);
  }
  std::vector<char> LocalBytes() {
    std::vector<char> host(kPoolBytes);
    EXPECT_EQ(cudaMemcpy(host.data(), local_, kPoolBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

  uint64_t seed_ = 0;
  char* local_ = nullptr;
  std::unique_ptr<nccl_peer::PeerProcess> peer_;
  std::unique_ptr<NcclAgent> agent_;
};

TEST(NcclAgentTest, RejectsHostMemoryAndBadDescriptors) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto agent = NcclAgent::Create();
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ((*agent)->transport(), "nccl");
  std::vector<char> host(64, 1);
  EXPECT_EQ((*agent)
                ->RegisterMemory(host.data(), host.size(), tandem::v1::MEMORY_KIND_HOST)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  tandem::v1::TransferHandshake desc;
  ASSERT_TRUE((*agent)->FillLocalDescriptor(&desc).ok());
  EXPECT_EQ(desc.transport(), "nccl");
  EXPECT_EQ(desc.worker_address(), (*agent)->control_address());
  tandem::v1::TransferHandshake bad = desc;
  bad.set_transport("ucx");
  EXPECT_EQ((*agent)->AddPeer("p", bad).code(), absl::StatusCode::kInvalidArgument);
  bad = desc;
  bad.set_worker_address("no-port");
  EXPECT_EQ((*agent)->AddPeer("p", bad).code(), absl::StatusCode::kInvalidArgument);
  bad.set_worker_address("127.0.0.1:1");  // nothing listens on port 1
  EXPECT_EQ((*agent)->AddPeer("p", bad).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*agent)->PostRead("p", {{0, 0, 0, 0, 1}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*agent)->CheckTransfer(12345).status().code(), absl::StatusCode::kNotFound);
  for (int comms : {0, 3}) {
    NcclAgentOptions wrong;
    wrong.num_comms = comms;
    EXPECT_EQ(NcclAgent::Create(wrong).status().code(), absl::StatusCode::kInvalidArgument)
        << "num_comms " << comms;
  }
}

// Several reader configurations over one source: everything packed into one staged message
// (defaults); odd-sized chunks smaller than a block with runs of >= 3 blocks sent directly, a
// 2-buffer ring that wraps many times and a 3-CTA copy kernel; chunks of a few blocks with a
// 3-buffer ring; every whole block direct (runs of direct messages go as one NCCL group) with
// only the partial ranges staged. The 1st and 3rd use 1 communicator, the 2nd and 4th 2 (NCCL
// calls alternate between them). The source is restarted with each configuration's copy mode
// (the kernel by default, streaming kernel, copy engines), ring and CTAs. Each round posts several
// transfers at once whose destinations may overlap: they must land in posting order (stream
// order across transfers).
TEST_F(NcclTwoProcessTest, RandomBlockListsAreBitExact) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(WithComms(1)));
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  std::mt19937_64 rng(seed_);
  std::vector<NcclAgentOptions> configs(4, WithComms(1));  // configs[0]: SetUpAgents' reader
  configs[1].staging_chunk_bytes = 64 * 1024 + 24;
  configs[1].direct_min_bytes = 3 * kBlockBytes;
  configs[1].copy_ctas = 3;
  configs[1].max_posted_transfers = 2;
  configs[1].copy_mode = nccl_copy::CopyMode::kStreamingKernel;
  configs[1].num_comms = 2;
  configs[2].staging_chunk_bytes = 5 * kBlockBytes + 8;
  configs[2].staging_buffers = 3;
  configs[2].copy_mode = nccl_copy::CopyMode::kCopyEngine;
  configs[3].direct_min_bytes = kBlockBytes;
  configs[3].staging_chunk_bytes = 3 * kBlockBytes;
  configs[3].num_comms = 2;
  std::vector<char> expected(kPoolBytes, kSentinel);  // what local_ should hold
  std::vector<char> block;
  uint64_t transfers = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    if (c > 0) {
      nccl_peer::PeerAgentConfig source;
      source.copy_ctas = configs[c].copy_ctas;
      source.staging_buffers = configs[c].staging_buffers;
      source.copy_mode = static_cast<int>(configs[c].copy_mode);
      ASSERT_NO_FATAL_FAILURE(NewReader(configs[c], &source));
    }
    for (int round = 0; round < 4; ++round) {
      std::vector<TransferId> ids;
      const int batch = 1 + static_cast<int>(rng() % 4);
      for (int b = 0; b < batch; ++b) {
        std::vector<uint32_t> src(kBlocks), dst(kBlocks);
        std::iota(src.begin(), src.end(), 0);
        std::iota(dst.begin(), dst.end(), 0);
        std::shuffle(src.begin(), src.end(), rng);
        std::shuffle(dst.begin(), dst.end(), rng);
        const size_t n = 1 + rng() % 40;
        src.resize(n);
        dst.resize(n);
        if (round == 0 && b == 0) {  // long contiguous runs on both sides
          std::iota(src.begin(), src.end(), 0);
          std::iota(dst.begin(), dst.end(), 3);
        }
        std::vector<CopyOp> ops = BlockCopyOps(0, 0, kBlockBytes, dst, src);
        // A partial range too: not every op is block-aligned.
        const uint64_t off = rng() % (kBlockBytes / 2);
        ops.push_back({0, dst[0] * kBlockBytes + off, 0, src[0] * kBlockBytes + off, 1 + off / 3});
        absl::StatusOr<TransferId> id = agent_->PostRead("src", ops);
        ASSERT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
        for (const CopyOp& op : ops) {  // in posting order: later transfers overwrite
          block.resize(op.length);
          nccl_peer::FillPattern(seed_, op.remote_offset, op.length, block.data());
          std::copy(block.begin(), block.end(), expected.begin() + op.local_offset);
        }
      }
      for (TransferId id : ids) {
        absl::StatusOr<bool> done = WaitEnded(*agent_, id);
        ASSERT_TRUE(done.ok()) << done.status();
      }
      transfers += ids.size();
      ASSERT_TRUE(LocalBytes() == expected) << "config " << c << " round " << round << " mismatch";
    }
    EXPECT_GT(agent_->Stats().bytes_read, 0u);
  }
  EXPECT_GT(transfers, 0u);
}

// Strided reads (the head slices of a re-shard between TP splits): random rows with gaps on
// one side or both, rows cut by small chunks, interleaved with plain reads, under the default
// copy engines (strided messages go through the kernel) and the kernel; bit-exact against the
// source pattern, in posting order.
TEST_F(NcclTwoProcessTest, StridedReadsAreBitExact) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(WithComms(2)));
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  EXPECT_TRUE(agent_->CanReadStrided("src", 0));
  EXPECT_FALSE(agent_->CanReadStrided("nobody", 0));
  EXPECT_FALSE(agent_->CanReadStrided("src", 1));  // no such local region
  std::mt19937_64 rng(seed_);
  std::vector<NcclAgentOptions> configs(2, WithComms(2));
  configs[1].staging_chunk_bytes = 40 * 1024 + 48;  // cuts rows
  configs[1].copy_mode = nccl_copy::CopyMode::kKernel;
  configs[1].num_comms = 1;
  std::vector<char> expected(kPoolBytes, kSentinel);
  std::vector<char> row;
  for (size_t c = 0; c < configs.size(); ++c) {
    if (c > 0) {
      nccl_peer::PeerAgentConfig source;
      source.copy_mode = static_cast<int>(configs[c].copy_mode);
      ASSERT_NO_FATAL_FAILURE(NewReader(configs[c], &source));
    }
    for (int round = 0; round < 4; ++round) {
      std::vector<TransferId> ids;
      for (int b = 0; b < 3; ++b) {
        // A block of 2 layers x K,V x 16 tokens of H heads: the source keeps 8 heads per row,
        // the reader 2 or 4 (P tp < D tp) or the reverse; the kept slice at a random head.
        const uint64_t head = 16 << (rng() % 4);
        const uint64_t rows = 64;
        const uint64_t src_heads = 1 + rng() % 8, dst_heads = 1 + rng() % 8;
        const uint64_t kept = 1 + rng() % std::min(src_heads, dst_heads);
        std::vector<StridedCopyOp> ops;
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < n; ++k) {
          StridedCopyOp op;
          op.row_bytes = kept * head;
          op.rows = rows;
          op.remote_stride = src_heads * head;
          op.local_stride = dst_heads * head;
          const uint64_t src_span = (rows - 1) * op.remote_stride + op.row_bytes;
          const uint64_t dst_span = (rows - 1) * op.local_stride + op.row_bytes;
          op.remote_offset = rng() % (kPoolBytes - src_span);
          // Disjoint destinations within the transfer: slot k of the pool's n slots.
          const uint64_t slot = kPoolBytes / n;
          if (dst_span > slot) continue;
          op.local_offset = k * slot + rng() % (slot - dst_span + 1);
          ops.push_back(op);
        }
        if (ops.empty()) continue;
        absl::StatusOr<TransferId> id = agent_->PostStridedRead("src", ops);
        ASSERT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
        for (const StridedCopyOp& op : ops) {
          row.resize(op.row_bytes);
          for (uint64_t r = 0; r < op.rows; ++r) {
            nccl_peer::FillPattern(seed_, op.remote_offset + r * op.remote_stride, op.row_bytes,
                                   row.data());
            std::copy(row.begin(), row.end(),
                      expected.begin() + op.local_offset + r * op.local_stride);
          }
        }
        // A plain read of whole blocks between the strided ones.
        const uint64_t from = rng() % kBlocks, to = rng() % kBlocks;
        id = agent_->PostRead("src", {{0, to * kBlockBytes, 0, from * kBlockBytes, kBlockBytes}});
        ASSERT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
        row.resize(kBlockBytes);
        nccl_peer::FillPattern(seed_, from * kBlockBytes, kBlockBytes, row.data());
        std::copy(row.begin(), row.end(), expected.begin() + to * kBlockBytes);
      }
      for (TransferId id : ids) {
        absl::StatusOr<bool> done = WaitEnded(*agent_, id);
        ASSERT_TRUE(done.ok()) << done.status();
      }
      ASSERT_TRUE(LocalBytes() == expected) << "config " << c << " round " << round;
    }
  }
  // Rows past the source's region are refused locally; overlapping rows too.
  StridedCopyOp bad{0, 0, 64, 0, kPoolBytes - 64, 64, 64, 2};
  EXPECT_EQ(agent_->PostStridedRead("src", {bad}).status().code(), absl::StatusCode::kOutOfRange);
  bad = {0, 0, 32, 0, 0, 64, 64, 2};
  EXPECT_EQ(agent_->PostStridedRead("src", {bad}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclTwoProcessTest, SourceRefusesRangesItDoesNotHave) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(WithComms(1)));
  // Local validation first.
  EXPECT_EQ(agent_->PostRead("src", {{0, 0, 0, kPoolBytes, 1}}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(agent_->PostRead("src", {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A descriptor that overstates the source's region passes local checks; the source refuses.
  tandem::v1::TransferHandshake lying = peer_->descriptor();
  lying.mutable_regions(0)->set_length(kPoolBytes * 2);
  ASSERT_TRUE(agent_->AddPeer("liar", lying).ok());
  absl::StatusOr<TransferId> id = agent_->PostRead("liar", {{0, 0, 0, kPoolBytes, 16}});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(WaitEnded(*agent_, *id).status().code(), absl::StatusCode::kOutOfRange);
  // The connection survives a refused read.
  id = agent_->PostRead("liar", {{0, 0, 0, 0, kBlockBytes}});
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(WaitEnded(*agent_, *id).ok());
  EXPECT_EQ(agent_->CheckTransfer(*id).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NcclTwoProcessTest, CancelAndRemovePeerEndTransfers) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(WithComms(1)));
  std::vector<TransferId> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = agent_->PostRead("src", {{0, 0, 0, 0, kPoolBytes}});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  agent_->Cancel(ids.back());
  // Either it was still queued (CANCELLED) or already posted (CANCELLED after its bytes land,
  // or OK if it finished first).
  absl::StatusOr<bool> last = WaitEnded(*agent_, ids.back());
  EXPECT_TRUE(last.ok() || last.status().code() == absl::StatusCode::kCancelled) << last.status();
  for (int i = 0; i + 1 < 4; ++i) EXPECT_TRUE(WaitEnded(*agent_, ids[i]).ok());
  agent_->RemovePeer("src");
  for (int i = 3; i + 1 < 8; ++i) {
    absl::StatusOr<bool> r = WaitEnded(*agent_, ids[i]);
    EXPECT_TRUE(r.ok() || r.status().code() == absl::StatusCode::kCancelled) << r.status();
  }
  EXPECT_EQ(agent_->PostRead("src", {{0, 0, 0, 0, 1}}).status().code(),
            absl::StatusCode::kNotFound);
  // Re-adding reconnects.
  ASSERT_TRUE(agent_->AddPeer("src", peer_->descriptor()).ok());
  auto id = agent_->PostRead("src", {{0, 0, 0, 0, kBlockBytes}});
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(WaitEnded(*agent_, *id).ok());
}

// With 2 communicators per pair: both are aborted.
TEST_F(NcclTwoProcessTest, DeadPeerEndsTransfersUnavailable) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(WithComms(2)));
  std::vector<TransferId> ids;
  for (int i = 0; i < 16; ++i) {
    auto id = agent_->PostRead("src", {{0, 0, 0, 0, kPoolBytes}});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  peer_->Kill();
  // Transfers that raced ahead of the kill may have finished; the rest end UNAVAILABLE.
  for (TransferId id : ids) {
    absl::StatusOr<bool> r = WaitEnded(*agent_, id);
    EXPECT_TRUE(r.ok() || r.status().code() == absl::StatusCode::kUnavailable) << r.status();
  }
  // The peer stays known but unusable until AddPeer; a read posted before the death is
  // noticed ends UNAVAILABLE.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::Status last;
  while (absl::Now() < deadline) {
    absl::StatusOr<TransferId> id = agent_->PostRead("src", {{0, 0, 0, 0, 1}});
    last = id.ok() ? WaitEnded(*agent_, *id).status() : id.status();
    if (!last.ok()) break;
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
}

// A source that is alive (its sockets stay open) but makes no progress (SIGSTOP): the reader's
// transfer deadline aborts the connection and ends the transfers UNAVAILABLE instead of hanging.
TEST_F(NcclTwoProcessTest, SilentSourceEndsTransfersUnavailable) {
  SKIP_WITHOUT_TWO_GPUS();
  NcclAgentOptions reader = WithComms(1);
  reader.transfer_timeout = absl::Seconds(2);
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(reader));
  auto warm = agent_->PostRead("src", {{0, 0, 0, 0, kPoolBytes}});
  ASSERT_TRUE(warm.ok());
  ASSERT_TRUE(WaitEnded(*agent_, *warm).ok());
  peer_->Stop();
  const absl::Time start = absl::Now();
  std::vector<TransferId> ids;
  for (int i = 0; i < 6; ++i) {
    auto id = agent_->PostRead("src", {{0, 0, 0, 0, kPoolBytes}});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (TransferId id : ids) {
    absl::StatusOr<bool> r = WaitEnded(*agent_, id);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  const absl::Duration took = absl::Now() - start;
  // Generous bound: the point is "ends", not "fast" (2 s deadline).
  EXPECT_LT(took, absl::Seconds(30)) << "silent source noticed after " << took;
  EXPECT_EQ(agent_->PostRead("src", {{0, 0, 0, 0, 1}}).status().code(),
            absl::StatusCode::kUnavailable);
  peer_->Kill();
}

// A source that acks a read and then sends nothing (the hand-played kStallAfterAck peer): the
// reader's receive is posted and waits on the GPU. The transfer deadline must abort the
// communicators (which stops the waiting kernels), drain the streams and end it UNAVAILABLE.
TEST_F(NcclTwoProcessTest, SourceThatStallsMidTransferIsAbortedAfterTheDeadline) {
  SKIP_WITHOUT_TWO_GPUS();
  NcclAgentOptions reader = WithComms(2);
  reader.transfer_timeout = absl::Seconds(2);
  ASSERT_NO_FATAL_FAILURE(SetUpAgents(reader, nccl_peer::PeerMode::kStallAfterAck));
  const absl::Time start = absl::Now();
  // Two ranges apart on the reader, so it stages: its scatter waits behind the stuck receive.
  absl::StatusOr<TransferId> id = agent_->PostRead(
      "src", {{0, 4 * kBlockBytes, 0, 0, 2 * kBlockBytes}, {0, 0, 0, 8 * kBlockBytes, 64}});
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<bool> r = WaitEnded(*agent_, *id);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no progress"), std::string::npos) << r.status();
  EXPECT_LT(took, absl::Seconds(30)) << "stalled source noticed after " << took;
  EXPECT_EQ(agent_->PostRead("src", {{0, 0, 0, 0, 1}}).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  const int peer_rc = tandem::kvtransfer::nccl_peer::MaybeRunPeer();
  if (peer_rc >= 0) return peer_rc;
  // A hang is a failure, not a stuck CI job: SIGALRM ends the process (its children see EOF).
  alarm(240);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
