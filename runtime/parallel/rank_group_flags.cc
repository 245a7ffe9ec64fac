// The worker-group flags, defined once for every binary that links //runtime/parallel
// (generate, tandem_worker): see rank_group.h.
#include <string>

#include "absl/flags/flag.h"
#include "runtime/parallel/rank_group.h"

ABSL_FLAG(int32_t, tp, 1,
          "tensor-parallel ranks in the worker group (its world size); alone, starts the other "
          "ranks on this host");
ABSL_FLAG(int32_t, dcp, 1,
          "decode context parallelism: KV shards per attention slice; divides --tp (--tp=N "
          "--dcp=K: N/K head slices, each over K ranks holding a part of every request's tokens)");
ABSL_FLAG(int64_t, dcp_interleave, 0,
          "with --dcp: consecutive tokens dealt to one KV shard (0: the block size; a multiple or "
          "divisor of it; KV from a prefill worker needs a multiple)");
ABSL_FLAG(bool, enable_expert_parallel, false,
          "mixture-of-experts models: place the routed experts whole on the group's --tp ranks "
          "(rank r: experts [r*E/tp, (r+1)*E/tp); tp must divide E) instead of a slice of every "
          "expert on each; attention stays split by heads, one all-reduce per MoE layer");
ABSL_FLAG(
    bool, dp_attention, false,
    "with --enable_expert_parallel: data-parallel attention (wide EP): each of the --tp ranks "
    "runs attention for its own requests with the whole (replicated) attention, dense MLP "
    "and lm_head weights and keeps their KV; each MoE layer's tokens go to their experts' "
    "ranks by one all-to-all and come back by another");
ABSL_FLAG(int32_t, rank, -1, "this process's rank when a launcher starts every rank");
ABSL_FLAG(int32_t, world_size, 0, "with --rank: the group's size (must equal --tp if both given)");
ABSL_FLAG(std::string, dist_init, "", "with --rank: HOST:PORT of rank 0's rendezvous");
ABSL_FLAG(std::string, dist_bind, "",
          "address this rank's collectives bind (default: 127.0.0.1 for a loopback --dist_init, "
          "else this host's first non-loopback address)");
ABSL_FLAG(double, dist_timeout_s, 30.0, "deadline of the rendezvous and of every collective");
ABSL_FLAG(bool, tp_share_device, false,
          "--tp alone: every local rank uses --device (CUDA ranks sharing one GPU over Gloo, a "
          "correctness path); default: rank r uses --device + r");

ABSL_FLAG(int32_t, dist_shm_fd, -1,
          "internal: set by rank 0 of a local launch (--tp alone) for the ranks it starts: the "
          "inherited descriptor of its shared-memory plan segment");

ABSL_FLAG(std::string, tp_comm, "auto",
          "CUDA ranks' tensor collectives: nccl (one GPU per rank, graph-capturable), gloo "
          "(staged through host memory; ranks may share a GPU), auto (gloo with "
          "--tp_share_device, else nccl)");

namespace tandem::runtime {

RankGroupOptions RankGroupOptionsFromFlags(int device) {
  RankGroupOptions o;
  o.tp = absl::GetFlag(FLAGS_tp);
  o.dcp = absl::GetFlag(FLAGS_dcp);
  o.dcp_interleave = absl::GetFlag(FLAGS_dcp_interleave);
  o.expert_parallel = absl::GetFlag(FLAGS_enable_expert_parallel);
  o.dp_attention = absl::GetFlag(FLAGS_dp_attention);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.dist_init = absl::GetFlag(FLAGS_dist_init);
  o.dist_bind = absl::GetFlag(FLAGS_dist_bind);
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_dist_timeout_s));
  o.device = device;
  o.share_device = absl::GetFlag(FLAGS_tp_share_device);
  o.comm = absl::GetFlag(FLAGS_tp_comm);
  o.plan_shm_fd = absl::GetFlag(FLAGS_dist_shm_fd);
  return o;
}

}  // namespace tandem::runtime
