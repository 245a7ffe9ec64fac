// dcp_bench: decode context parallelism per layer across real ranks (issue 17): for each model
// shape, batch, context and DCP size N, ranks 0..N-1 each hold ctx / N tokens of every request
// in a bf16 paged pool and run shard attention, pack, ONE all-to-all on the device communicator
// and the LSE merge (dcp_bench_layer.h); rank 0 prints each part's time (the slowest rank's),
// the attention speedup against N = 1 and the 0.85·N goal, the all-to-all's share of the layer,
// KV bytes per rank (capacity xN) and the attention-only decode step / tokens per second per
// request (the layer x the model's layer count). Every N > 1 row is also checked: the merged
// heads against unsharded attention over the same global request.
//
// One process per GPU rank. Without --rank this process is rank 0 and starts ranks
// 1..max(--dcp)-1 on this host (GPU --device + rank; the children die with it); with --rank
// --world_size --dist_init=HOST:PORT a launcher started every rank (rank 0 serves the TcpStore
// rendezvous). The host group is Gloo; each N gets a Gloo subgroup of ranks 0..N-1 and an NCCL
// communicator over it (--comm=gloo: host-staged). --share_device runs every rank on one GPU
// over the host-staged communicator: a smoke test whose timings mean nothing.
//
//   dcp_bench --shape=llama3-8b,llama3-70b --batch=1,8 --context=32768,131072,524288
//       --dcp=1,2,4,8                                                  # 8 GPUs
//   dcp_bench --share_device --dcp=1,2,4 --context=4096 --batch=1,3    # one GPU, smoke
#include <cuda_runtime.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/gloo_process_group.h"
#include "comm/host_staged_communicator.h"
#include "comm/nccl_communicator.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "runtime/parallel/dcp_bench/dcp_bench_layer.h"
#include "runtime/parallel/dcp_bench/dcp_bench_table.h"
#include "runtime/parallel/rank_group.h"

ABSL_FLAG(std::string, shape, "llama3-8b",
          "model shapes: llama3-8b, llama3-70b, deepseek-v3 (MLA) (comma list)");
ABSL_FLAG(std::string, batch, "1,8", "decode batch sizes (comma list)");
ABSL_FLAG(std::string, context, "32768,131072,524288", "tokens per request (comma list)");
ABSL_FLAG(std::string, dcp, "",
          "DCP sizes N (comma list; N runs on ranks 0..N-1); empty: 1,2,4,8 up to the visible "
          "GPUs (1,2 with --share_device)");
ABSL_FLAG(bool, share_device, false,
          "every rank on --device over the host-staged communicator: smoke test, timings "
          "meaningless");
ABSL_FLAG(std::string, comm, "auto", "device collectives: nccl, gloo (host-staged), auto");
ABSL_FLAG(bool, graphs, true, "time CUDA-graph replays (nccl); false or gloo: eager calls");
ABSL_FLAG(bool, check, true, "check merged heads against unsharded attention (N > 1)");
ABSL_FLAG(int, iters, 0, "layers per measurement (0: about 20 ms of attention, 20..500)");
ABSL_FLAG(int, block_size, 16, "KV block size = DCP interleave");
ABSL_FLAG(int, rank, -1, "this rank (-1: rank 0, starting the others on this host)");
ABSL_FLAG(int, world_size, 0, "ranks in all (with --rank; 0: max --dcp)");
ABSL_FLAG(std::string, dist_init, "", "HOST:PORT of rank 0's rendezvous (with --rank)");
ABSL_FLAG(std::string, dist_bind, "",
          "address this rank's collectives bind (default: 127.0.0.1 for a loopback --dist_init, "
          "else this host's first non-loopback address)");
ABSL_FLAG(int, device, -1, "CUDA device (-1: rank % visible GPUs; 0 with --share_device)");
ABSL_FLAG(int, timeout_s, 300, "deadline of the rendezvous and of every collective");

namespace tandem::runtime::dcp_bench {
namespace {

using ::tandem::comm::DeviceCommunicator;
using ::tandem::comm::GlooGroupOptions;
using ::tandem::comm::GlooProcessGroup;
using ::tandem::comm::HostStagedCommunicator;
using ::tandem::comm::NcclCommunicator;
using ::tandem::comm::ProcessGroup;

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not >= 1"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

struct Options {
  std::vector<ModelShape> shapes;
  std::vector<int64_t> batches, contexts, dcps;
  bool share_device = false, graphs = true, check = true;
  std::string comm;  // "nccl" or "gloo"
  int iters = 0, block_size = 16, rank = -1, world_size = 0, device = -1;
  std::string dist_init, dist_bind;
  absl::Duration timeout;
};

absl::StatusOr<Options> OptionsFromFlags(int visible_gpus) {
  Options o;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',')) {
    ASSIGN_OR_RETURN(ModelShape shape, ShapeByName(std::string(name)));
    o.shapes.push_back(shape);
  }
  ASSIGN_OR_RETURN(o.batches, ParseList(absl::GetFlag(FLAGS_batch), "batch"));
  ASSIGN_OR_RETURN(o.contexts, ParseList(absl::GetFlag(FLAGS_context), "context"));
  o.share_device = absl::GetFlag(FLAGS_share_device);
  std::string dcp = absl::GetFlag(FLAGS_dcp);
  if (dcp.empty()) {
    dcp = "1";
    for (int n : {2, 4, 8}) {
      if (o.share_device ? n == 2 : n <= visible_gpus) absl::StrAppend(&dcp, ",", n);
    }
  }
  ASSIGN_OR_RETURN(o.dcps, ParseList(dcp, "dcp"));
  std::sort(o.dcps.begin(), o.dcps.end());
  o.comm = absl::GetFlag(FLAGS_comm);
  if (o.comm == "auto") o.comm = o.share_device ? "gloo" : "nccl";
  if (o.comm != "nccl" && o.comm != "gloo") {
    return absl::InvalidArgumentError("--comm must be nccl, gloo or auto, got " + o.comm);
  }
  if (o.comm == "nccl" && o.share_device && o.dcps.back() > 1) {
    return absl::InvalidArgumentError(
        "--share_device needs --comm=gloo (NCCL refuses two ranks "
        "on one GPU)");
  }
  o.graphs = absl::GetFlag(FLAGS_graphs) && o.comm == "nccl";
  o.check = absl::GetFlag(FLAGS_check);
  o.iters = absl::GetFlag(FLAGS_iters);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  if (o.world_size == 0) o.world_size = static_cast<int>(o.dcps.back());
  if (o.world_size < o.dcps.back()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size=", o.world_size, " is smaller than --dcp=", o.dcps.back()));
  }
  o.dist_init = absl::GetFlag(FLAGS_dist_init);
  o.dist_bind = absl::GetFlag(FLAGS_dist_bind);
  o.device = absl::GetFlag(FLAGS_device);
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  return o;
}

// This process's place in the run: its rank, its device and the host group of all ranks
// (RankGroup: the rendezvous and, for a local launch, the rank processes; rank_group.h).
struct RankContext {
  int rank = 0, world = 1, device = 0;
  std::unique_ptr<RankGroup> ranks;
  ProcessGroup* world_group = nullptr;  // null for a world of one
};

// Joins (or, without --rank, launches) the ranks: rank 0 of a local launch starts ranks
// 1..world-1 as copies of this process (GPU --device + rank; they die with it).
absl::StatusOr<std::unique_ptr<RankContext>> JoinRanks(const Options& o,
                                                       std::vector<std::string> argv,
                                                       int visible_gpus) {
  auto rc = std::make_unique<RankContext>();
  rc->world = o.world_size;
  const bool launched = o.rank >= 0;
  if (launched && (o.rank >= o.world_size || o.dist_init.empty())) {
    return absl::InvalidArgumentError("--rank needs --dist_init and a rank below --world_size");
  }
  rc->rank = launched ? o.rank : 0;
  rc->device = o.device >= 0 ? o.device : o.share_device ? 0 : rc->rank % visible_gpus;
  if (!o.share_device && !launched && o.world_size > visible_gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp up to ", o.world_size, " needs ", o.world_size, " GPUs (one per rank); ",
        visible_gpus, " visible. --share_device runs the ranks on one GPU as a smoke test"));
  }
  RankGroupOptions g;
  g.tp = o.world_size;
  g.rank = o.rank;
  g.world_size = o.world_size;
  g.dist_init = o.dist_init;
  g.dist_bind = o.dist_bind;
  g.timeout = o.timeout;
  g.device = rc->device;
  g.share_device = o.share_device;
  g.plan_segment = false;                                              // no engine commands here
  argv.push_back(absl::StrCat("--dcp=", absl::StrJoin(o.dcps, ",")));  // the sizes rank 0 chose
  ASSIGN_OR_RETURN(rc->ranks, RankGroup::Join(g, argv));
  rc->world_group = rc->ranks->group();
  return rc;
}

// The ranks 0..N-1 of one DCP size: their host group and device communicator.
struct DcpGroup {
  std::unique_ptr<GlooProcessGroup> owned_host;
  ProcessGroup* host = nullptr;
  std::unique_ptr<DeviceCommunicator> device;
};

// Every rank calls this for every N in order; ranks >= N get nothing.
absl::StatusOr<std::map<int64_t, DcpGroup>> MakeGroups(const Options& o, const RankContext& rc) {
  std::map<int64_t, DcpGroup> groups;
  for (int64_t n : o.dcps) {
    if (n == 1 || rc.rank >= n) continue;
    DcpGroup& d = groups[n];
    if (n == rc.world) {
      d.host = rc.world_group;
    } else {
      GlooGroupOptions g{.rank = rc.rank,
                         .world_size = static_cast<int>(n),
                         .store_host = rc.ranks->store_host(),
                         .store_port = rc.ranks->store_port(),
                         .serve_store = false,
                         .bind_host = rc.ranks->bind_host(),
                         .timeout = o.timeout,
                         .name = absl::StrCat("dcp_bench_", n)};
      ASSIGN_OR_RETURN(d.owned_host, GlooProcessGroup::Create(g));
      d.host = d.owned_host.get();
    }
    if (o.comm == "gloo") {
      d.device = std::make_unique<HostStagedCommunicator>(d.host);
    } else {
      ASSIGN_OR_RETURN(
          d.device, NcclCommunicator::Create(d.host, {.device = rc.device, .timeout = o.timeout}));
    }
  }
  return groups;
}

// Whether every rank of the group has the memory for `c` (ranks sharing a GPU each need it).
absl::StatusOr<bool> AllFit(const LayerConfig& c, const Options& o, ProcessGroup* host) {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t sharing = o.share_device ? c.dcp : 1;
  std::vector<float> misfits{
      DeviceBytesNeeded(c) * sharing > static_cast<int64_t>(free_bytes) ? 1.0f : 0.0f};
  if (host != nullptr) RETURN_IF_ERROR(host->AllReduceSum(absl::MakeSpan(misfits)));
  return misfits[0] == 0;
}

// One row: ranks < c.dcp run it; rank 0 gets the slowest rank's numbers (the worst error).
absl::StatusOr<RowResult> RunRow(LayerConfig c, const Options& o, const RankContext& rc,
                                 const std::map<int64_t, DcpGroup>& groups, int num_sms) {
  RowResult row;
  const DcpGroup* group = c.dcp > 1 ? &groups.at(c.dcp) : nullptr;
  c.rank = rc.rank;
  ASSIGN_OR_RETURN(row.fits, AllFit(c, o, group != nullptr ? group->host : nullptr));
  if (!row.fits) return row;
  ASSIGN_OR_RETURN(LayerTimes t,
                   RunLayer(c, group != nullptr ? group->device.get() : nullptr, num_sms));
  std::vector<float> mine{static_cast<float>(t.attention_us),  static_cast<float>(t.pack_us),
                          static_cast<float>(t.all_to_all_us), static_cast<float>(t.merge_us),
                          static_cast<float>(t.layer_us),      static_cast<float>(t.max_rel_err),
                          static_cast<float>(t.latent_us)};
  std::vector<float> all = mine;
  if (group != nullptr) {
    all.resize(mine.size() * c.dcp);
    RETURN_IF_ERROR(group->host->AllGather(mine, absl::MakeSpan(all)));
  }
  for (size_t r = 0; r < all.size() / mine.size(); ++r) {
    for (size_t i = 0; i < mine.size(); ++i) {
      mine[i] = std::max(mine[i], all[r * mine.size() + i]);
    }
  }
  row.times = {mine[0], mine[1], mine[2], mine[3], mine[4], mine[5], t.num_splits, mine[6]};
  return row;
}

// Rank 0 of a local launch: the other ranks exit after the last barrier; reaps them and fails
// when one failed.
absl::Status WaitForChildren(const std::vector<pid_t>& children) {
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(failed, " rank process(es) failed"));
}

absl::Status Run(const std::vector<std::string>& argv) {
  int visible = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&visible));
  ASSIGN_OR_RETURN(const Options o, OptionsFromFlags(visible));
  ASSIGN_OR_RETURN(std::unique_ptr<RankContext> rc, JoinRanks(o, argv, visible));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(rc->device));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, rc->device));
  ASSIGN_OR_RETURN(auto groups, MakeGroups(o, *rc));
  Table table(TableSetup{.device = prop.name,
                         .world = rc->world,
                         .comm = o.comm,
                         .graphs = o.graphs,
                         .share_device = o.share_device});
  if (rc->rank == 0) table.PrintHeader();
  for (const ModelShape& shape : o.shapes) {
    for (int64_t batch : o.batches) {
      for (int64_t context : o.contexts) {
        for (int64_t n : o.dcps) {
          const LayerConfig c{.shape = shape,
                              .batch = batch,
                              .context = context,
                              .dcp = n,
                              .block_size = o.block_size,
                              .iters = o.iters,
                              .graphs = o.graphs,
                              .check = o.check};
          RowResult row;
          if (rc->rank < n) {
            ASSIGN_OR_RETURN(row, RunRow(c, o, *rc, groups, prop.multiProcessorCount));
          }
          if (rc->rank == 0) table.PrintRow(c, row);
          if (rc->world_group != nullptr) RETURN_IF_ERROR(rc->world_group->Barrier());
        }
      }
    }
  }
  if (rc->rank == 0) table.PrintFooter();
  RETURN_IF_ERROR(WaitForChildren(rc->ranks->children()));
  if (table.failures() > 0) {
    return absl::InternalError(absl::StrCat(table.failures(), " row(s) failed the check"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::runtime::dcp_bench

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);        // NVLink multicast stays off
  absl::ParseCommandLine(argc, argv);                      // no positional arguments
  const std::vector<std::string> self(argv, argv + argc);  // re-run for the other ranks
  const absl::Status status = tandem::runtime::dcp_bench::Run(self);
  if (!status.ok()) {
    std::fprintf(stderr, "dcp_bench (rank %d): %s\n", std::max(0, absl::GetFlag(FLAGS_rank)),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
