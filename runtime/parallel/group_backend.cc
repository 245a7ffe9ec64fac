#include "runtime/parallel/group_backend.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/tensor_parallel.h"
#include "runtime/parallel/shm_command_line.h"

namespace tandem::runtime {
namespace {

// How long ranks wait for each other to finish loading (a checkpoint of a large model on slow
// disks), with progress in the log; the group's own --dist_timeout_s when longer.
constexpr absl::Duration kLoadMeetLimit = absl::Minutes(15);

// Shared memory between the ranks rank 0 started on its host; the group's broadcast otherwise.
// Rank 0 and its followers decide alike: the segment exists on all of them or on none.
std::unique_ptr<CommandLine> CommandLineOf(const RankGroup& group) {
  if (group.plan_segment() != nullptr) {
    return std::make_unique<ShmCommandLine>(group.plan_segment(), group.group(), group.timeout());
  }
  return GlooCommandLine(group.group());
}

}  // namespace

absl::StatusOr<GroupBackend> LoadGroupBackend(ModelSource source, BackendOptions backend,
                                              const RankGroupOptions& group_options,
                                              const std::vector<std::string>& argv,
                                              GroupExecutorOptions executor_options) {
  GroupBackend out;
  ASSIGN_OR_RETURN(out.group, RankGroup::Join(group_options, argv));
  backend.group = out.group->group();
  backend.device = out.group->device();
  backend.tp_comm = group_options.TpComm();
  backend.comm_timeout = group_options.timeout;
  backend.dcp_size = group_options.dcp;
  backend.dcp_interleave = group_options.dcp_interleave;
  backend.expert_parallel = group_options.expert_parallel;
  backend.dp_attention = group_options.dp_attention;
  const absl::Time load_start = absl::Now();
  absl::StatusOr<BackendModel> loaded = LoadModelForBackend(std::move(source), backend);
  comm::ProcessGroup* group = out.group->group();
  if (group != nullptr) {
    // The ranks load at their own pace: meet with a log line every 10 s naming the ranks still
    // loading, so a slow peer shows in the log instead of as a collective's timeout.
    const int rank = out.group->rank();
    LOG(INFO) << "worker group: rank " << rank << " loaded the model in "
              << absl::FormatDuration(absl::Now() - load_start);
    RETURN_IF_ERROR(group->MeetWithProgress(
        "loaded", std::max(kLoadMeetLimit, group_options.timeout), absl::Seconds(10),
        [rank](const std::vector<int>& missing, absl::Duration waited) {
          LOG(INFO) << "worker group: rank " << rank << " waits for rank(s) "
                    << absl::StrJoin(missing, ", ") << " to finish loading ("
                    << absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))) << ")";
        }));
    // Every rank states what it loaded, even a failed load: the others then fail with a message
    // naming it instead of waiting on a collective it will never join.
    const std::string identity =
        loaded.ok() ? absl::StrCat(loaded->model.model_id, " backend=", loaded->factory.name,
                                   " kv_dtype=", KvDtypeName(loaded->factory.kv_dtype),
                                   " tp=", group->size(), " dcp=", group_options.dcp,
                                   " dcp_interleave=", group_options.dcp_interleave,
                                   " expert_parallel=", group_options.expert_parallel,
                                   " dp_attention=", group_options.dp_attention)
                    : absl::StrCat("load failed: ", loaded.status().message());
    absl::Status agreement = CheckGroupAgreement(group, identity);
    RETURN_IF_ERROR(loaded.status());
    RETURN_IF_ERROR(agreement);
    if (out.group->rank() == 0) {
      LOG(INFO) << "worker group: "
                << DescribeTp(loaded->model.config, group->size(), group_options.dcp);
      if (loaded->model.local_config.dp_attention) {
        LOG(INFO) << "worker group: data-parallel attention over " << group->size()
                  << " ranks (each its own requests and KV; attention, dense MLPs and lm_head "
                     "replicated; one all-to-all dispatch and one combine per MoE layer)";
      }
      if (loaded->model.local_config.expert_placement != nullptr) {
        LOG(INFO) << "worker group: expert parallelism, "
                  << loaded->model.local_config.expert_placement->Describe();
      }
    }
  }
  RETURN_IF_ERROR(loaded.status());
  out.loaded = *std::move(loaded);
  out.local_factory = out.loaded.factory;
  if (group != nullptr && out.is_leader()) {
    out.channel = std::make_shared<GroupChannel>(group, executor_options.keepalive,
                                                 CommandLineOf(*out.group));
    out.loaded.factory = GroupExecutorFactory(out.local_factory, out.channel);
  }
  return out;
}

absl::Status RunFollowerRank(GroupBackend backend, RankKvHooks* kv) {
  const ModelConfig local_config = backend.loaded.model.local_config;
  const std::unique_ptr<CommandLine> line = CommandLineOf(*backend.group);
  return RunFollower(backend.group->group(), backend.local_factory, local_config,
                     std::move(backend.loaded.model.weights), kv, line.get());
}

}  // namespace tandem::runtime
