// UcxAgent with CUDA memory between two real processes, UCX without CUDA transports (staging,
// see "Memory kinds" in ucx_agent.h): the source is this binary re-executed as the agent_peer
// harness (agent_peer.h) with its regions in device memory (served from the host mirror after
// SyncForRemoteRead) or in host memory; the reader pulls random block lists into device memory
// through pinned staging buffers. Every byte is checked after copying the device memory back.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/gpu_test_util.h"
#include "gtest/gtest.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/cuda_staging.h"
#include "kvtransfer/testing/agent_test_util.h"
#include "kvtransfer/testing/peer_process.h"
#include "kvtransfer/testing/quantized_kv_test_util.h"
#include "kvtransfer/ucx/agent_peer.h"
#include "kvtransfer/ucx/ucx_agent.h"
#include "kvtransfer/ucx/ucx_two_process_test_util.h"

namespace tandem::kvtransfer {
namespace {

using ::tandem::v1::MEMORY_KIND_CUDA;

constexpr uint8_t kFill = 0x5B;

// Device memory freed on scope exit (after the agent that registered it: declare it first).
struct DeviceBuffer {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  explicit DeviceBuffer(uint64_t n) : bytes(n) {
    absl::StatusOr<void*> p = CudaDeviceAlloc(n);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) ptr = *p;
  }
  ~DeviceBuffer() { CudaDeviceFree(ptr); }
  void Fill(uint8_t value) {
    std::vector<uint8_t> host(bytes, value);
    ASSERT_TRUE(CudaCopy(ptr, host.data(), bytes).ok());
  }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> host(bytes);
    EXPECT_TRUE(CudaCopy(host.data(), ptr, bytes).ok());
    return host;
  }
};

// Every test runs with each UcxAgentOptions::cuda_mirror_pin_granule_bytes (source and reader):
// 0 pins a mirror (and a mapping of one) whole; 16 MiB is the size meant for workers; 1 MiB puts
// granule boundaries inside most staged requests (max 1 MiB, staging buffers 768 KiB), so source
// syncs split per granule and DMAs across two granules take the staging buffers. (16 MiB
// granules failed 3 of these 4 tests on nvidia-h200, 2026-11-28, before copies were split.)
class UcxGpuTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  uint64_t granule() const { return GetParam(); }

  std::unique_ptr<PeerProcess> StartSelfPeer(std::vector<std::string> args) const {
    args.push_back(absl::StrCat("--cuda_mirror_pin_granule_bytes=", granule()));
    auto [binary, full] = ReexecAsAgentPeer(std::move(args));
    return testing::StartAgentPeer(binary, full);
  }

  // dma_from_mapped = false: every request through the staging buffers, also from sources
  // mapped over shared memory.
  std::unique_ptr<UcxAgent> StagingReader(bool dma_from_mapped = true,
                                          std::string transports = "tcp,self,sm") const {
    // Small buffers and requests, so one transfer cycles through every staging buffer many
    // times.
    auto agent = UcxAgent::Create({.transports = std::move(transports),
                                   .max_request_bytes = 1 << 20,
                                   .max_inflight_bytes = 4 << 20,
                                   .stage_cuda_memory = true,
                                   .cuda_staging_buffers = 3,
                                   .cuda_staging_bytes = 768 << 10,
                                   .cuda_mirror_pin_granule_bytes = granule(),
                                   .cuda_dma_from_mapped = dma_from_mapped});
    EXPECT_TRUE(agent.ok()) << agent.status();
    return agent.ok() ? *std::move(agent) : nullptr;
  }
};

// Random block lists from a source whose memory is CUDA, shared host or heap host, into device
// memory: bit-exact, and device bytes outside the targets untouched.
TEST_P(UcxGpuTest, RandomBlockListsIntoDeviceMemoryAreBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const uint64_t block = 256 << 10;
  const uint64_t remote_bytes = block * 96, local_bytes = block * 64;
  // Sources: device memory (read from its mirror), shared host memory (both mapped here: DMA
  // from the mapping, or staged when dma_from_mapped is off), heap (GETs over TCP, staged).
  struct Case {
    std::string source;
    bool dma_from_mapped;
  };
  for (const Case& c : {Case{"--cuda", true}, Case{"--cuda", false}, Case{"--allocate", true},
                        Case{"--allocate=false", true}}) {
    const std::string& source = c.source;
    SCOPED_TRACE(::testing::Message() << source << " dma_from_mapped " << c.dma_from_mapped);
    std::unique_ptr<PeerProcess> peer =
        StartSelfPeer({absl::StrCat("--region_bytes=", remote_bytes, ",1000003"),
                       absl::StrCat("--seed=", seed), source});
    ASSERT_NE(peer, nullptr);
    DeviceBuffer local(local_bytes);
    std::unique_ptr<UcxAgent> reader = StagingReader(c.dma_from_mapped);
    ASSERT_NE(reader, nullptr);
    ASSERT_TRUE(reader->RegisterMemory(local.ptr, local_bytes, MEMORY_KIND_CUDA).ok());
    ASSERT_TRUE(reader->AddPeer("p", peer->descriptor()).ok());
    for (int round = 0; round < 6; ++round) {
      local.Fill(kFill);
      // Whole blocks from region 0, or odd-sized pieces from region 1 (same local slots).
      const uint32_t rr = round % 3 == 2 ? 1 : 0;
      const uint64_t size = rr == 0 ? block : 4099 + rng() % 9000;
      const uint64_t remote_len = rr == 0 ? remote_bytes : 1000003;
      const testing::BlockPairs pairs =
          testing::RandomBlockPairs(rng, static_cast<uint32_t>(remote_len / size),
                                    static_cast<uint32_t>(local_bytes / size), 1 + rng() % 40);
      const std::vector<CopyOp> ops = BlockCopyOps(0, rr, size, pairs.local, pairs.remote);
      absl::StatusOr<TransferId> id = reader->PostRead("p", ops);
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(testing::WaitForEnd(*reader, *id).ok());
      const std::vector<uint8_t> got = local.Read();
      std::vector<bool> written(local_bytes, false);
      for (const CopyOp& op : ops) {
        const int64_t bad = testing::FirstPatternMismatch(
            seed + op.remote_region, op.remote_offset,
            absl::MakeConstSpan(got.data() + op.local_offset, op.length));
        ASSERT_EQ(bad, -1) << "round " << round << " local byte " << op.local_offset + bad;
        std::fill_n(written.begin() + op.local_offset, op.length, true);
      }
      for (uint64_t i = 0; i < local_bytes; ++i) {
        ASSERT_TRUE(written[i] || got[i] == kFill) << "device byte " << i << " outside targets";
      }
    }
    EXPECT_EQ(reader->Stats().transfers_completed, 6u);
    reader.reset();
    EXPECT_EQ(peer->Stop(), 0);
  }
}

// Strided reads (a tensor-parallel re-shard's head slices) into device memory: from the mirror
// of a CUDA source, and from shared host memory by 2D DMA from the mapping or through the
// staging buffers (then one 2D device copy per request), and gathers at the source over TCP (a
// heap source, or any source with the reader on TCP only: the source packs the rows, the answer
// lands in a staging buffer, one 2D device copy); every row bit-exact, every other device byte
// untouched.
TEST_P(UcxGpuTest, StridedReadsIntoDeviceMemoryAreBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const uint64_t remote_bytes = 24 << 20, local_bytes = 16 << 20;
  struct Case {
    std::string source;
    bool dma_from_mapped;
    std::string transports;  // the reader's
  };
  for (const Case& c :
       {Case{"--cuda", true, "tcp,self,sm"}, Case{"--cuda", false, "tcp,self,sm"},
        Case{"--allocate", true, "tcp,self,sm"}, Case{"--allocate", false, "tcp,self,sm"},
        Case{"--allocate=false", true, "tcp,self,sm"}, Case{"--cuda", true, "tcp,self"},
        Case{"--allocate", true, "tcp,self"}}) {
    SCOPED_TRACE(::testing::Message() << c.source << " dma_from_mapped " << c.dma_from_mapped
                                      << " reader transports " << c.transports);
    std::unique_ptr<PeerProcess> peer = StartSelfPeer(
        {absl::StrCat("--region_bytes=", remote_bytes), absl::StrCat("--seed=", seed), c.source});
    ASSERT_NE(peer, nullptr);
    DeviceBuffer local(local_bytes);
    std::unique_ptr<UcxAgent> reader = StagingReader(c.dma_from_mapped, c.transports);
    ASSERT_NE(reader, nullptr);
    ASSERT_TRUE(reader->RegisterMemory(local.ptr, local_bytes, MEMORY_KIND_CUDA).ok());
    ASSERT_TRUE(reader->AddPeer("p", peer->descriptor()).ok());
    ASSERT_TRUE(reader->CanReadStrided("p", 0));
    for (int round = 0; round < 4; ++round) {
      local.Fill(kFill);
      // Rows of KV head slices (256 B - 4 KiB) and odd ones; some ops span many requests.
      const std::vector<StridedCopyOp> ops =
          testing::RandomStridedOps(rng, local_bytes, remote_bytes, 6, round % 2 == 0 ? 4096 : 777);
      absl::StatusOr<TransferId> id = reader->PostStridedRead("p", ops);
      ASSERT_TRUE(id.ok()) << id.status();
      ASSERT_TRUE(testing::WaitForEnd(*reader, *id).ok());
      const std::vector<uint8_t> got = local.Read();
      const absl::Status check = testing::CheckStridedCopies(seed, ops, got, kFill);
      ASSERT_TRUE(check.ok()) << "round " << round << ": " << check;
    }
    reader.reset();
    EXPECT_EQ(peer->Stop(), 0);
  }
}

// fp8 values + fp32 scales, both regions in device memory on both sides.
TEST_P(UcxGpuTest, QuantizedKvWithScalesDeviceToDeviceIsBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::string dims = "4,16,4,128";
  absl::StatusOr<testing::QuantizedKvShape> shape = testing::ParseQuantizedKvShape("fp8", dims);
  ASSERT_TRUE(shape.ok());
  const uint32_t remote_blocks = 96, local_blocks = 64;
  std::unique_ptr<PeerProcess> peer = StartSelfPeer(
      {"--kv_quant=fp8", absl::StrCat("--kv_shape=", dims),
       absl::StrCat("--kv_blocks=", remote_blocks), absl::StrCat("--seed=", seed), "--cuda"});
  ASSERT_NE(peer, nullptr);
  DeviceBuffer values(local_blocks * shape->ValueBlockBytes());
  DeviceBuffer scales(local_blocks * shape->ScaleBlockBytes());
  std::unique_ptr<UcxAgent> reader = StagingReader();
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(reader->RegisterMemory(values.ptr, values.bytes, MEMORY_KIND_CUDA).ok());
  ASSERT_TRUE(reader->RegisterMemory(scales.ptr, scales.bytes, MEMORY_KIND_CUDA).ok());
  ASSERT_TRUE(reader->AddPeer("p", peer->descriptor()).ok());
  for (int round = 0; round < 4; ++round) {
    values.Fill(kFill);
    scales.Fill(kFill);
    const testing::BlockPairs pairs =
        testing::RandomBlockPairs(rng, remote_blocks, local_blocks, 1 + rng() % 48);
    absl::StatusOr<TransferId> id =
        reader->PostRead("p", testing::QuantizedBlockOps(*shape, pairs));
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(testing::WaitForEnd(*reader, *id).ok());
    const std::vector<uint8_t> v = values.Read();
    const std::vector<uint8_t> s = scales.Read();
    testing::ExpectQuantizedBlocks(*shape, seed, v, s, pairs, kFill);
    if (HasFatalFailure()) return;
  }
  reader.reset();
  EXPECT_EQ(peer->Stop(), 0);
}

// Cancel while staging into device memory: the end is CANCELLED (or OK when it finished first)
// and the device memory no longer changes after the end was observed.
TEST_P(UcxGpuTest, CancelStopsDeviceWrites) {
  TANDEM_SKIP_WITHOUT_GPU();
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const uint64_t bytes = uint64_t{256} << 20;
  std::unique_ptr<PeerProcess> peer = StartSelfPeer(
      {absl::StrCat("--region_bytes=", bytes), absl::StrCat("--seed=", seed), "--cuda"});
  ASSERT_NE(peer, nullptr);
  DeviceBuffer local(bytes);
  const std::vector<CopyOp> all = {{0, 0, 0, 0, bytes}};
  int cancelled = 0;
  std::unique_ptr<UcxAgent> reader;
  for (int round = 0; round < 4; ++round) {
    if (round % 2 == 0) {  // DMA from the mapping, then through the staging buffers
      reader = StagingReader(/*dma_from_mapped=*/round == 0);
      ASSERT_NE(reader, nullptr);
      ASSERT_TRUE(reader->RegisterMemory(local.ptr, bytes, MEMORY_KIND_CUDA).ok());
      ASSERT_TRUE(reader->AddPeer("p", peer->descriptor()).ok());
    }
    local.Fill(kFill);
    const TransferId id = *reader->PostRead("p", all);
    absl::SleepFor(absl::Microseconds(rng() % 3000));
    reader->Cancel(id);
    const absl::Status end = testing::WaitForEnd(*reader, id, absl::Seconds(20));
    ASSERT_TRUE(end.ok() || end.code() == absl::StatusCode::kCancelled) << end;
    cancelled += !end.ok();
    const std::vector<uint8_t> at_end = local.Read();
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(local.Read() == at_end) << "device bytes written after the end";
    for (uint64_t i = 0; i < bytes; i += 4093) {
      if (at_end[i] != kFill) {
        ASSERT_EQ(at_end[i], testing::PatternByte(seed, i)) << i;
      }
    }
  }
  EXPECT_GT(cancelled, 0);
  reader.reset();
  EXPECT_EQ(peer->Stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(PinGranules, UcxGpuTest,
                         ::testing::Values(uint64_t{0}, uint64_t{1} << 20, uint64_t{16} << 20),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return info.param == 0 ? std::string("WholeMirror")
                                                  : absl::StrCat(info.param >> 20, "MiB");
                         });

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  int exit_code = 0;
  if (tandem::kvtransfer::MaybeRunAsAgentPeer(argc, argv, &exit_code)) return exit_code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
