// How a process becomes one rank of a worker group (one rule for sizes, vLLM's: a group has
// `--tp=N` ranks in all; DCP, later, divides it):
//   * `--tp=N` alone: this process is rank 0 and starts ranks 1..N-1 on this host itself (the
//     same binary and flags plus --rank/--world_size/--dist_init/--device=device+rank), serving
//     the rendezvous on 127.0.0.1; the children die with it (PR_SET_PDEATHSIG). Rank 0 also
//     creates the shared memory its commands travel through (plan_segment.h), which the children
//     inherit (--dist_shm_fd).
//   * `--tp=N --rank=R --dist_init=HOST:PORT` (the form srun and Kubernetes use): a launcher
//     started every rank; rank 0 serves the rendezvous on HOST:PORT.
// Each rank's collectives bind `--dist_bind` (default: 127.0.0.1 for a loopback --dist_init,
// else this host's first non-loopback address).
//
// Thread safety: a RankGroup is owned by main(); its ProcessGroup is used by one thread at a time
// (group_executor.h).
#ifndef TANDEM_RUNTIME_PARALLEL_RANK_GROUP_H_
#define TANDEM_RUNTIME_PARALLEL_RANK_GROUP_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/gloo_process_group.h"
#include "comm/process_group.h"
#include "comm/tcp_store.h"
#include "runtime/parallel/plan_segment.h"

namespace tandem::runtime {

struct RankGroupOptions {
  int tp = 1;             // ranks in the group (its world size)
  int rank = -1;          // -1: this process is rank 0 and starts the others (one host)
  int world_size = 0;     // with --rank: must equal --tp when both are given (0: --tp)
  std::string dist_init;  // HOST:PORT of rank 0's rendezvous (required with --rank)
  std::string dist_bind;  // this rank's collective address ("": see the header comment)
  absl::Duration timeout = absl::Seconds(30);  // rendezvous and every collective
  int device = 0;  // this rank's device ordinal; local ranks get device + rank
  // Local ranks all use `device` (--tp_share_device): a correctness path for CUDA ranks over
  // Gloo on a machine with one GPU (NCCL refuses two ranks on one device).
  bool share_device = false;
  // The CUDA ranks' device collectives (--tp_comm): "nccl", "gloo" (host-staged), or "auto"
  // (gloo with share_device, else nccl). See TpComm().
  std::string comm = "auto";
  // "nccl" or "gloo": what `comm` means for these options.
  // Decode context parallelism (--dcp, --dcp_interleave): KV shards per attention slice, dividing
  // the group's size; tokens per unit dealt to a shard (0: the block size).
  int dcp = 1;
  int64_t dcp_interleave = 0;
  // Expert parallelism over the group's ranks (--enable_expert_parallel): each mixture-of-experts
  // layer's experts placed whole on the ranks instead of sliced (runtime/model/tensor_parallel.h).
  bool expert_parallel = false;
  // Data-parallel attention with expert parallelism (--dp_attention; tensor_parallel.h, "Wide
  // expert parallelism"): each rank serves its own requests' attention and KV.
  bool dp_attention = false;
  // Set by rank 0 of a local launch for the ranks it starts (--dist_shm_fd): the inherited
  // descriptor of its plan segment. -1: none.
  int plan_shm_fd = -1;
  // A local launch shares rank 0's plan segment with its ranks (--dist_shm_fd); false: no
  // segment (a binary without the engine's commands, e.g. dcp_bench).
  bool plan_segment = true;
  std::string TpComm() const { return comm != "auto" ? comm : share_device ? "gloo" : "nccl"; }
};

class RankGroup {
 public:
  // INVALID_ARGUMENT naming the flags for inconsistent sizes, a missing or malformed
  // --dist_init; the rendezvous' errors (UNAVAILABLE / DEADLINE_EXCEEDED) when ranks are missing.
  // `argv`: this process's command line, re-run for the local ranks.
  static absl::StatusOr<std::unique_ptr<RankGroup>> Join(const RankGroupOptions& options,
                                                         const std::vector<std::string>& argv);
  // Rank 0 of a local launch: waits up to 10 s for its ranks to exit (they do after the
  // executor's shutdown command; at once if the group is broken), then kills what is left,
  // and reaps them.
  ~RankGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  // The address this rank's collectives bind (127.0.0.1 for a local launch); empty alone.
  const std::string& bind_host() const { return bind_host_; }
  // The rendezvous every rank met on (a TcpStore, served by rank 0): subgroups of these ranks
  // (comm::GlooGroupOptions with serve_store = false) may meet there too. Empty / 0 alone.
  const std::string& store_host() const { return store_host_; }
  int store_port() const { return store_port_; }
  // Null for a group of one.
  comm::ProcessGroup* group() const { return group_.get(); }
  // The shared memory of rank 0's commands (a local launch; null otherwise, and when it could
  // not be made: then commands go over the group).
  PlanSegment* plan_segment() const { return plan_segment_.get(); }
  // The deadline of the group's collectives (--dist_timeout_s).
  absl::Duration timeout() const { return timeout_; }
  // The ranks this process started (rank 0 of a local launch).
  const std::vector<pid_t>& children() const { return children_; }
  // Rank 0 of a local launch: UNAVAILABLE naming the first rank process that exited or was
  // killed (seen without reaping it, so the destructor still reaps it); OK while all run, and
  // for every other rank. Cheap (one waitid per rank): a supervisor may poll it.
  absl::Status CheckRanksAlive() const;
  // Rank 0 of a local launch giving up on a broken group: kills (SIGKILL) and reaps every rank
  // process it started, at once; the destructor then has none to wait for.
  void KillRanks();

 private:
  RankGroup(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}

  const int rank_;
  const int size_;
  const int device_;
  std::string bind_host_;
  std::string store_host_;
  int store_port_ = 0;
  absl::Duration timeout_ = absl::Seconds(30);
  std::unique_ptr<PlanSegment> plan_segment_;
  std::unique_ptr<comm::TcpStoreServer> store_;  // local launch: rank 0 serves the rendezvous
  std::unique_ptr<comm::GlooProcessGroup> group_;
  std::vector<pid_t> children_;
};

// The --tp / --dcp / --dcp_interleave / --rank / --world_size / --dist_init / --dist_bind /
// --dist_timeout_s flags
// (defined once, in rank_group_flags.cc) as options; `device` is the binary's --device.
RankGroupOptions RankGroupOptionsFromFlags(int device);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_RANK_GROUP_H_
