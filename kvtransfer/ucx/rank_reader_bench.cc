// Heterogeneous-TP KV transfer through real UCX agents (one per rank, pools from AllocateMemory
// as the worker allocates them), in one process: a P group of TP=a serves one request's KV
// (Llama-3-8B shapes: 32 layers, 8 KV heads, head_dim 128, bf16, block 16 -> 2 MiB blocks at
// TP=1), and every rank of a D group of TP=b reads its heads with a RankKvReader, all D ranks in
// parallel. Prints, per (a, b): useful GB/s (bytes that landed in the D pools / wall time), wire
// GB/s (bytes the agents moved), descriptors per D rank, and the useful GB/s relative to the
// equal-TP case of the same D size. Not a test: numbers for kvtransfer/BENCHMARKS.md.
//
//   bazel run -c opt //kvtransfer/ucx:rank_reader_bench -- [--tokens=2048] [--rounds=3]
//       [--shapes=1:1,2:2,2:1,4:1,4:2,1:2,1:4] [--copy_threads=2] [--modes=strided,staged]
//       [--transports=tcp,self,sm]
// --transports=tcp,self: no shared memory, so no agent maps another's pool (as between hosts):
// equal TP reads by GETs over TCP, strided reads are gathers at the source.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvtransfer/rank_reader.h"
#include "kvtransfer/ucx/ucx_agent.h"

ABSL_FLAG(int, tokens, 2048, "tokens of the request");
ABSL_FLAG(int, rounds, 3, "timed rounds per shape (the best is reported)");
ABSL_FLAG(std::string, shapes, "1:1,2:2,4:4,2:1,4:1,4:2,1:2,1:4", "P_TP:D_TP pairs");
ABSL_FLAG(int, copy_threads, 2, "UcxAgentOptions::copy_threads of each agent");
ABSL_FLAG(std::string, transports, "tcp,self,sm", "UcxAgentOptions::transports of every agent");
ABSL_FLAG(std::string, modes, "strided,staged",
          "re-shard paths to measure: strided (the agent copies head slices in one pass), "
          "staged (whole blocks into staging, then a scatter)");

namespace tandem::kvtransfer {
namespace {

constexpr int kLayers = 32, kHeads = 8, kHeadDim = 128, kBlock = 16, kElem = 2;

tandem::v1::CompatibilityInfo Layout() {
  tandem::v1::CompatibilityInfo info;
  tandem::v1::KvLayout* l = info.mutable_layout();
  l->set_layout_name("block_major_v1");
  l->set_num_layers(kLayers);
  l->set_num_kv_heads(kHeads);
  l->set_head_dim(kHeadDim);
  l->set_block_size(kBlock);
  l->set_kv_dtype(tandem::v1::KV_DTYPE_BF16);
  return info;
}

struct Rank {
  std::unique_ptr<UcxAgent> agent;
  char* pool = nullptr;
  uint32_t region = 0;
  int head_begin = 0, heads = 0;
  tandem::v1::RankGeometry geometry;
};

uint64_t BlockBytes(int heads) { return uint64_t{kLayers} * 2 * kBlock * heads * kHeadDim * kElem; }

std::vector<Rank> MakeGroup(int tp, int pool_blocks, bool fill) {
  std::vector<Rank> group(tp);
  for (int r = 0; r < tp; ++r) {
    Rank& rank = group[r];
    UcxAgentOptions options;
    options.copy_threads = absl::GetFlag(FLAGS_copy_threads);
    options.transports = absl::GetFlag(FLAGS_transports);
    rank.agent = *UcxAgent::Create(options);
    rank.heads = kHeads / tp;
    rank.head_begin = r * rank.heads;
    auto memory = *rank.agent->AllocateMemory(pool_blocks * BlockBytes(rank.heads),
                                              tandem::v1::MEMORY_KIND_HOST);
    rank.pool = static_cast<char*>(memory.first);
    rank.region = memory.second;
    if (fill) {
      std::mt19937_64 rng(r);
      uint64_t* words = reinterpret_cast<uint64_t*>(rank.pool);
      for (uint64_t i = 0; i < pool_blocks * BlockBytes(rank.heads) / 8; ++i) words[i] = rng();
    }
    rank.geometry.set_tp_size(tp);
    rank.geometry.set_tp_rank(r);
    rank.geometry.set_kv_head_begin(rank.head_begin);
    rank.geometry.set_kv_head_count(rank.heads);
    rank.geometry.set_dcp_size(1);
    rank.geometry.set_dcp_interleave(1);
    rank.geometry.set_block_bytes(BlockBytes(rank.heads));
  }
  return group;
}

tandem::v1::TransferHandshake Describe(const std::vector<Rank>& group) {
  tandem::v1::TransferHandshake h;
  *h.mutable_compatibility() = Layout();
  for (const Rank& rank : group) {
    tandem::v1::TransferHandshake* d = h.add_ranks();
    if (!rank.agent->FillLocalDescriptor(d).ok()) std::abort();
    *d->mutable_geometry() = rank.geometry;
  }
  if (group.size() == 1) {
    tandem::v1::TransferHandshake single = h.ranks(0);
    *single.mutable_compatibility() = h.compatibility();
    return single;
  }
  return h;
}

struct Result {
  double seconds = 1e30;
  uint64_t kept = 0, wire = 0, ops = 0, agent_reads = 0;
};

Result RunShape(int p_tp, int d_tp, int tokens, int rounds, bool strided) {
  const int blocks = (tokens + kBlock - 1) / kBlock;
  const int pool_blocks = blocks + 16;
  std::vector<Rank> p = MakeGroup(p_tp, pool_blocks, /*fill=*/true);
  std::vector<Rank> d = MakeGroup(d_tp, pool_blocks, /*fill=*/false);
  const tandem::v1::TransferHandshake source = Describe(p);
  std::vector<std::unique_ptr<RankKvReader>> readers;
  for (int r = 0; r < d_tp; ++r) {
    RankKvReaderOptions o;
    o.compatibility = Layout();
    o.geometry = d[r].geometry;
    o.pool_region = d[r].region;
    o.pool = d[r].pool;
    o.pool_blocks = pool_blocks;
    o.strided_reads = strided;
    readers.push_back(std::make_unique<RankKvReader>(d[r].agent.get(), o));
    absl::Status linked = readers.back()->AddSource("p", source);
    if (!linked.ok()) {
      std::fprintf(stderr, "link: %s\n", linked.ToString().c_str());
      std::abort();
    }
  }
  // Random source blocks (a prefill pool is fragmented), consecutive destination blocks.
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (int i = 0; i < blocks; ++i) pairs.emplace_back(ids[i], i);
  Result best;
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
    std::vector<RankKvReaderStats> before;
    for (auto& reader : readers) before.push_back(reader->stats());
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads;
    for (int r = 0; r < d_tp; ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<TransferId> id = readers[r]->PostRead("p", pairs);
        if (!id.ok()) std::abort();
        while (true) {
          absl::StatusOr<bool> done = readers[r]->CheckTransfer(*id);
          if (!done.ok()) std::abort();
          if (*done) break;
          absl::SleepFor(absl::Microseconds(50));
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    Result res;
    res.seconds = seconds;
    for (int r = 0; r < d_tp; ++r) {
      const RankKvReaderStats s = readers[r]->stats();
      res.kept += s.bytes_kept - before[r].bytes_kept;
      res.wire += s.bytes_read - before[r].bytes_read;
      res.ops += s.copy_ops - before[r].copy_ops;
      res.agent_reads += s.agent_reads - before[r].agent_reads;
    }
    if (round > 0 && res.seconds < best.seconds) best = res;
  }
  return best;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace tandem::kvtransfer;
  const int tokens = absl::GetFlag(FLAGS_tokens);
  std::printf(
      "request of %d tokens, Llama-3-8B KV (32 layers, 8 KV heads, head_dim 128, bf16, "
      "block 16): %.1f MiB in all; best of %d rounds; UCX transports %s\n",
      tokens, tokens / 16.0 * BlockBytes(8) / 1048576.0, absl::GetFlag(FLAGS_rounds),
      absl::GetFlag(FLAGS_transports).c_str());
  std::printf("%-8s %-8s %10s %12s %12s %14s %14s %10s\n", "P->D TP", "mode", "ms", "useful GB/s",
              "wire GB/s", "descr/D rank", "reads/D rank", "vs equal");
  std::vector<std::pair<int, int>> shapes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> ab = absl::StrSplit(s, ':');
    int a = 0, b = 0;
    if (ab.size() != 2 || !absl::SimpleAtoi(ab[0], &a) || !absl::SimpleAtoi(ab[1], &b)) return 2;
    shapes.emplace_back(a, b);
  }
  std::vector<std::pair<int, double>> equal;  // D size -> useful GB/s with P of the same size
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  for (auto [a, b] : shapes) {
    for (const std::string& mode : modes) {
      if (a == b && mode != modes.front()) continue;  // equal TP reads direct in every mode
      const Result r = RunShape(a, b, tokens, absl::GetFlag(FLAGS_rounds), mode == "strided");
      const double useful = r.kept / r.seconds / 1e9;
      if (a == b) equal.emplace_back(b, useful);
      std::string vs = "-";
      for (auto [size, gbs] : equal) {
        if (size == b && a != b) vs = absl::StrCat(static_cast<int>(100 * useful / gbs), "%");
      }
      std::printf("%d->%-5d %-8s %10.1f %12.2f %12.2f %14.1f %14.1f %10s\n", a, b,
                  a == b ? "direct" : mode.c_str(), r.seconds * 1e3, useful,
                  r.wire / r.seconds / 1e9, static_cast<double>(r.ops) / b,
                  static_cast<double>(r.agent_reads) / b, vs.c_str());
    }
  }
  return 0;
}
