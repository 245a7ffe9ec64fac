// What a binary with --tp does at startup, in one place for generate and tandem_worker: join the
// worker group (rank_group.h), load this rank's shard of the model, check that every rank loaded
// the same thing, and hand rank 0 a backend fanned out over the group (group_executor.h). Ranks
// > 0 then call RunFollowerRank() and exit with its status.
#ifndef TANDEM_RUNTIME_PARALLEL_GROUP_BACKEND_H_
#define TANDEM_RUNTIME_PARALLEL_GROUP_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/model/model_source.h"
#include "runtime/parallel/group_executor.h"
#include "runtime/parallel/rank_group.h"

namespace tandem::runtime {

struct GroupBackend {
  std::unique_ptr<RankGroup> group;
  // The rank's model (loaded.model.local_config / weights: its shard) and, on rank 0, the
  // backend to build the engine with (fanned out over the group when it has several ranks).
  BackendModel loaded;
  ExecutorFactory local_factory;  // this rank's own backend
  // Rank 0 of a group of several: its line to the other ranks (shared by the executor it built
  // and the group's KV transfer side). Null otherwise.
  std::shared_ptr<GroupChannel> channel;
  bool is_leader() const { return group->rank() == 0; }
};

// Errors of RankGroup::Join, LoadModelForBackend and CheckGroupAgreement; INVALID_ARGUMENT
// naming the numbers for a model the group size cannot split (tensor_parallel.h).
absl::StatusOr<GroupBackend> LoadGroupBackend(ModelSource source, BackendOptions backend,
                                              const RankGroupOptions& group_options,
                                              const std::vector<std::string>& argv,
                                              GroupExecutorOptions executor_options = {});

// Ranks > 0: serves rank 0's steps (and, with `kv`, its KV transfer commands) until it shuts
// the group down (RunFollower).
absl::Status RunFollowerRank(GroupBackend backend, RankKvHooks* kv = nullptr);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_GROUP_BACKEND_H_
