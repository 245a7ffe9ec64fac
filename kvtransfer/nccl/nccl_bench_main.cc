// NcclAgent vs raw NCCL send/recv between two processes on two GPUs (issue 5: target >= 90%).
//
//   bazel-bin/kvtransfer/nccl_bench [--quick] [--configs=64/64/4/2,128/32/4/3/16]
//                                   [--blocks=1,16,64,256,1024] [--halves] [--reshard=2,4]
//
// The source agent runs in a re-executed copy of this binary on device 1 (nccl_agent_peer.h),
// the reader here on device 0. For each batch of B blocks of 2 MiB (random, mostly
// non-contiguous block ids on both sides): the agent's rate posts `iters` PostReads and waits
// for all; the raw rate is `iters` ncclRecv/ncclSend of the same B * 2 MiB as one contiguous
// buffer on a separate communicator. Both after one warm-up round; each rate is the median of
// 5 repetitions. One table per configuration "chunk_mib/copy_ctas/max_posted/buffers[/direct_mib
// [/mode]]" (staging_chunk_bytes in MiB, copy kernel CTAs, max_posted_transfers, staging_buffers,
// direct_min_bytes in MiB, default 32; copy_mode k = kernel, s = streaming kernel, e = copy
// engines; the default is the kernel), applied to both agents (the source is restarted with it).
// Each table ends with a fully contiguous 1024-block batch ("1024c": one direct message, or chunked
// without copies when direct_mib > 2048), with --halves batches random on one side only, and raw
// NCCL in messages of the chunk size (NCCL's own cost per message). --reshard adds, per TP ratio R,
// strided reads of KV head slices (PostStridedRead: 1/R of every 2 KiB row; 1->R the source
// gathers, R->1 the reader scatters) against whole-block reads and raw NCCL of the same kept bytes.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/copy_ops.h"
#include "kvtransfer/nccl/nccl_agent.h"
#include "kvtransfer/nccl/nccl_agent_copy.h"
#include "kvtransfer/nccl/nccl_agent_peer.h"

ABSL_FLAG(bool, quick, false, "fewer iterations");
ABSL_FLAG(int64_t, lone_min_mib, 32,
          "NcclAgentOptions::lone_min_chunk_bytes in MiB for every config (0 = off)");
ABSL_FLAG(std::string, configs, "128/32/4/3/32/k/2,128/32/4/3/32/e/2,128/32/4/3/32/k/1",
          "comma-separated configs chunk_mib/copy_ctas/max_posted/staging_buffers"
          "[/direct_mib[/k|s|e[/num_comms]]]");
ABSL_FLAG(bool, halves, false,
          "also time 1024 blocks random on one side only (1024g: source, 1024s: reader)");
ABSL_FLAG(std::string, reshard, "2,4",
          "TP ratios R of the re-shard rows (strided reads, kvtransfer/BENCHMARKS.md): 1->R "
          "reads 1/R of every 2 KiB row of 256 / 1024 random source blocks (the source gathers), "
          "R->1 writes them into 1/R of every row (the reader scatters); empty = none");
ABSL_FLAG(std::string, blocks, "1,16,64,256,1024",
          "comma-separated batch sizes (random blocks); a contiguous 1024-block batch follows");

namespace tandem::kvtransfer {
namespace {

constexpr uint64_t kBlockBytes = uint64_t{2} << 20;
constexpr uint32_t kPoolBlocks = 1024;
constexpr uint64_t kPoolBytes = kBlockBytes * kPoolBlocks;
constexpr int kReps = 5;

#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    auto _s = (expr);                                                                    \
    if (!_s.ok()) {                                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #expr, std::string(_s.message()).c_str()); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (false)
#define CHECK_TRUE(cond)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      std::fprintf(stderr, "check failed: %s\n", #cond); \
      std::exit(1);                                      \
    }                                                    \
  } while (false)

// Omitted trailing fields keep NcclAgentOptions' defaults.
struct Config {
  uint64_t chunk_mib = 128;
  int copy_ctas = 32;
  int max_posted = 4;
  int buffers = 3;
  uint64_t direct_mib = 32;
  char copy_mode = 'k';  // k: kernel (the default), s: streaming kernel, e: copy engines
  int num_comms = 2;
};

nccl_copy::CopyMode ModeOf(char c) {
  return c == 's'   ? nccl_copy::CopyMode::kStreamingKernel
         : c == 'e' ? nccl_copy::CopyMode::kCopyEngine
                    : nccl_copy::CopyMode::kKernel;
}

std::vector<uint32_t> ParseBlocks(const std::string& text) {
  std::vector<uint32_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint32_t b = 0;
    CHECK_TRUE(absl::SimpleAtoi(item, &b) && b >= 1 && b <= kPoolBlocks);
    out.push_back(b);
  }
  return out;
}

std::vector<Config> ParseConfigs(const std::string& text) {
  std::vector<Config> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(item, '/');
    Config c;
    CHECK_TRUE(f.size() >= 4 && f.size() <= 7 && absl::SimpleAtoi(f[0], &c.chunk_mib) &&
               absl::SimpleAtoi(f[1], &c.copy_ctas) && absl::SimpleAtoi(f[2], &c.max_posted) &&
               absl::SimpleAtoi(f[3], &c.buffers) &&
               (f.size() < 5 || absl::SimpleAtoi(f[4], &c.direct_mib)));
    if (f.size() >= 6) {
      CHECK_TRUE(f[5] == "k" || f[5] == "s" || f[5] == "e");
      c.copy_mode = f[5][0];
    }
    if (f.size() == 7) {
      CHECK_TRUE(absl::SimpleAtoi(f[6], &c.num_comms) && c.num_comms >= 1 && c.num_comms <= 2);
    }
    out.push_back(c);
  }
  CHECK_TRUE(!out.empty());
  return out;
}

template <typename Op>
double AgentSeconds(NcclAgent& agent, const std::vector<Op>& ops, int iters) {
  const absl::Time start = absl::Now();
  std::vector<TransferId> ids;
  for (int i = 0; i < iters; ++i) {
    absl::StatusOr<TransferId> id;
    if constexpr (std::is_same_v<Op, StridedCopyOp>) {
      id = agent.PostStridedRead("src", ops);
    } else {
      id = agent.PostRead("src", ops);
    }
    CHECK_OK(id.status());
    ids.push_back(*id);
  }
  for (TransferId id : ids) {
    for (;;) {
      auto r = agent.CheckTransfer(id);
      CHECK_OK(r.status());
      if (*r) break;
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double RawSeconds(nccl_peer::PeerProcess& peer, ncclComm_t comm, cudaStream_t stream, char* buf,
                  uint64_t bytes, int iters) {
  const absl::Time start = absl::Now();
  CHECK_OK(peer.RawSend(bytes, static_cast<uint32_t>(iters)));
  for (int i = 0; i < iters; ++i)
    CHECK_TRUE(ncclRecv(buf, bytes, ncclInt8, 1, comm, stream) == ncclSuccess);
  CHECK_TRUE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK_OK(peer.WaitRawDone());
  return absl::ToDoubleSeconds(absl::Now() - start);
}

template <typename F>
double MedianRate(double bytes, F seconds) {
  std::vector<double> rates;
  for (int r = 0; r < kReps; ++r) rates.push_back(bytes / seconds() / 1e9);
  std::sort(rates.begin(), rates.end());
  return rates[kReps / 2];
}

// Block order of a batch: random on both sides, contiguous on both, or random on one side only
// (the other side's copy kernel does all the work: "g" gathers on the source, "s" scatters on
// the reader).
enum class Layout : char {
  kRandom = ' ',
  kContiguous = 'c',
  kGatherOnly = 'g',
  kScatterOnly = 's'
};

std::vector<CopyOp> Batch(std::mt19937_64& rng, uint32_t blocks, Layout layout) {
  std::vector<uint32_t> src(kPoolBlocks), dst(kPoolBlocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  if (layout == Layout::kRandom || layout == Layout::kGatherOnly) {
    std::shuffle(src.begin(), src.end(), rng);
  }
  if (layout == Layout::kRandom || layout == Layout::kScatterOnly) {
    std::shuffle(dst.begin(), dst.end(), rng);
  }
  src.resize(blocks);
  dst.resize(blocks);
  return BlockCopyOps(0, 0, kBlockBytes, dst, src);
}

// A re-shard between TP splits of ratio `ratio`: per random block pair, rows of 2 KiB (one
// token's heads of one layer's K or V) of which 1/ratio is kept. gather: the source holds the
// whole rows (P tp < D tp) and the reader's block is the kept slices back to back; else the
// reverse (the reader scatters into every row).
constexpr uint64_t kRowBytes = 2048;
std::vector<StridedCopyOp> ReshardBatch(std::mt19937_64& rng, uint32_t blocks, uint64_t ratio,
                                        bool gather) {
  std::vector<uint32_t> src(kPoolBlocks), dst(kPoolBlocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  const uint64_t kept = kRowBytes / ratio;
  std::vector<StridedCopyOp> ops;
  for (uint32_t i = 0; i < blocks; ++i) {
    const uint64_t slice = (rng() % ratio) * kept;  // which heads
    StridedCopyOp op;
    op.row_bytes = kept;
    op.rows = kBlockBytes / kRowBytes;
    if (gather) {
      op.remote_offset = src[i] * kBlockBytes + slice;
      op.remote_stride = kRowBytes;
      op.local_offset = dst[i] * (kBlockBytes / ratio);
      op.local_stride = kept;
    } else {
      op.remote_offset = src[i] * (kBlockBytes / ratio);
      op.remote_stride = kept;
      op.local_offset = dst[i] * kBlockBytes + slice;
      op.local_stride = kRowBytes;
    }
    ops.push_back(op);
  }
  return ops;
}

std::vector<uint64_t> ParseRatios(const std::string& text) {
  std::vector<uint64_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint64_t r = 0;
    CHECK_TRUE(absl::SimpleAtoi(item, &r) && r >= 2 && kRowBytes % r == 0);
    out.push_back(r);
  }
  return out;
}

int Run(bool quick, bool halves, const std::vector<Config>& configs,
        const std::vector<uint32_t>& blocks) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) {
    std::printf("nccl_bench: needs 2 GPUs, found %d; skipped\n", count);
    return 0;
  }
  auto peer = nccl_peer::PeerProcess::Spawn(1, kPoolBytes, 1);
  CHECK_OK(peer.status());
  CHECK_TRUE(cudaSetDevice(0) == cudaSuccess);
  char* local = nullptr;
  CHECK_TRUE(cudaMalloc(reinterpret_cast<void**>(&local), kPoolBytes) == cudaSuccess);

  ncclUniqueId id;
  CHECK_TRUE(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK_OK(peer->RawInit(std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  ncclComm_t raw = nullptr;
  CHECK_TRUE(ncclCommInitRank(&raw, 2, id, 0) == ncclSuccess);
  cudaStream_t stream = nullptr;
  CHECK_TRUE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);

  std::map<uint64_t, double> raw_gbs;  // by batch bytes
  auto raw_rate = [&](uint64_t bytes, int iters) {
    auto it = raw_gbs.find(bytes);
    if (it != raw_gbs.end()) return it->second;
    RawSeconds(*peer, raw, stream, local, bytes, 1);
    const double gbs = MedianRate(static_cast<double>(bytes) * iters, [&] {
      return RawSeconds(*peer, raw, stream, local, bytes, iters);
    });
    return raw_gbs[bytes] = gbs;
  };

  for (const Config& c : configs) {
    CHECK_OK(peer->RestartAgent(
        {c.chunk_mib << 20, c.copy_ctas, c.buffers, static_cast<int>(ModeOf(c.copy_mode))}));
    NcclAgentOptions options;
    options.device = 0;
    options.staging_chunk_bytes = c.chunk_mib << 20;
    options.copy_ctas = c.copy_ctas;
    options.max_posted_transfers = c.max_posted;
    options.staging_buffers = c.buffers;
    options.direct_min_bytes = c.direct_mib << 20;
    options.copy_mode = ModeOf(c.copy_mode);
    options.num_comms = c.num_comms;
    options.lone_min_chunk_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_lone_min_mib)) << 20;
    auto agent = NcclAgent::Create(options);
    CHECK_OK(agent.status());
    CHECK_OK((*agent)->RegisterMemory(local, kPoolBytes, tandem::v1::MEMORY_KIND_CUDA).status());
    CHECK_OK((*agent)->AddPeer("src", peer->descriptor()));
    std::printf(
        "\nconfig %llu/%d/%d/%d/%llu/%c/%d: staging_chunk %llu MiB, copy_ctas %d, "
        "max_posted_transfers %d, staging_buffers %d, direct_min %llu MiB, copy %s, "
        "num_comms %d, lone_min_chunk %llu MiB\n",
        static_cast<unsigned long long>(c.chunk_mib), c.copy_ctas, c.max_posted, c.buffers,
        static_cast<unsigned long long>(c.direct_mib), c.copy_mode, c.num_comms,
        static_cast<unsigned long long>(c.chunk_mib), c.copy_ctas, c.max_posted, c.buffers,
        static_cast<unsigned long long>(c.direct_mib),
        c.copy_mode == 's'   ? "streaming kernel"
        : c.copy_mode == 'e' ? "copy engines"
                             : "kernel",
        c.num_comms, static_cast<unsigned long long>(options.lone_min_chunk_bytes >> 20));
    std::printf("%8s %10s %6s %12s %12s %8s\n", "blocks", "MiB/batch", "iters", "agent GB/s",
                "raw GB/s", "agent%");
    std::mt19937_64 rng(7);
    std::vector<std::pair<uint32_t, Layout>> rows;
    for (uint32_t b : blocks) rows.push_back({b, Layout::kRandom});
    rows.push_back({kPoolBlocks, Layout::kContiguous});
    if (halves) {
      rows.push_back({kPoolBlocks, Layout::kGatherOnly});
      rows.push_back({kPoolBlocks, Layout::kScatterOnly});
    }
    double worst = 1e9;  // lowest agent% of the random batches >= 64 blocks
    for (auto [blocks, layout] : rows) {
      const std::vector<CopyOp> ops = Batch(rng, blocks, layout);
      const uint64_t bytes = blocks * kBlockBytes;
      const int iters = std::max(quick ? 2 : 5, static_cast<int>((quick ? 256 : 4096) / blocks));
      AgentSeconds(**agent, ops, 1);
      const double agent_gbs = MedianRate(static_cast<double>(bytes) * iters,
                                          [&] { return AgentSeconds(**agent, ops, iters); });
      const double raw = raw_rate(bytes, iters);
      std::printf("%7u%c %10llu %6d %12.1f %12.1f %7.1f%%\n", blocks, static_cast<char>(layout),
                  static_cast<unsigned long long>(bytes >> 20), iters, agent_gbs, raw,
                  100.0 * agent_gbs / raw);
      if (layout == Layout::kRandom && blocks >= 64)
        worst = std::min(worst, 100.0 * agent_gbs / raw);
      std::fflush(stdout);
    }
    // Re-shard rows: kept GB/s vs the agent's whole-block rate and raw NCCL on the same bytes.
    for (uint64_t ratio : ParseRatios(absl::GetFlag(FLAGS_reshard))) {
      for (bool gather : {true, false}) {
        for (uint32_t n : {256u, 1024u}) {
          const std::vector<StridedCopyOp> ops = ReshardBatch(rng, n, ratio, gather);
          const uint64_t bytes = n * kBlockBytes / ratio;
          const int iters = std::max(quick ? 2 : 5, static_cast<int>((quick ? 256 : 4096) / n));
          AgentSeconds(**agent, ops, 1);
          const double gbs = MedianRate(static_cast<double>(bytes) * iters,
                                        [&] { return AgentSeconds(**agent, ops, iters); });
          const std::vector<CopyOp> equal =
              Batch(rng, n / static_cast<uint32_t>(ratio), Layout::kRandom);
          const double equal_gbs = MedianRate(static_cast<double>(bytes) * iters,
                                              [&] { return AgentSeconds(**agent, equal, iters); });
          const double raw = raw_rate(bytes, iters);
          const std::string label =
              gather ? "1->" + std::to_string(ratio) : std::to_string(ratio) + "->1";
          std::printf(
              "%-5s %4u blocks, %4llu MiB kept: %7.1f GB/s, %5.1f%% of whole blocks "
              "(%.1f GB/s), %5.1f%% of raw NCCL\n",
              label.c_str(), n, static_cast<unsigned long long>(bytes >> 20), gbs,
              100.0 * gbs / equal_gbs, equal_gbs, 100.0 * gbs / raw);
          std::fflush(stdout);
        }
      }
    }
    // NCCL's own cost per message: the same 2 GiB as raw messages of the chunk size.
    const uint64_t chunk = std::min(c.chunk_mib << 20, kPoolBytes);
    const double raw_chunked = raw_rate(chunk, static_cast<int>(kPoolBytes / chunk));
    std::printf(
        "raw NCCL in %llu MiB messages: %.1f GB/s; lowest agent%% for >= 64 blocks: %.1f%%\n",
        static_cast<unsigned long long>(chunk >> 20), raw_chunked, worst);
    std::fflush(stdout);
  }
  // Abort, not destroy: ncclCommDestroy waits for the peer, which only leaves its command loop
  // once our pipe closes (after this returns).
  ncclCommAbort(raw);
  cudaStreamDestroy(stream);
  cudaFree(local);
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  const int peer_rc = tandem::kvtransfer::nccl_peer::MaybeRunPeer();
  if (peer_rc >= 0) return peer_rc;
  absl::ParseCommandLine(argc, argv);
  return tandem::kvtransfer::Run(absl::GetFlag(FLAGS_quick), absl::GetFlag(FLAGS_halves),
                                 tandem::kvtransfer::ParseConfigs(absl::GetFlag(FLAGS_configs)),
                                 tandem::kvtransfer::ParseBlocks(absl::GetFlag(FLAGS_blocks)));
}
