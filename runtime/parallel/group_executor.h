// A worker group's step fan-out (ARCHITECTURE.md "Worker groups"): rank 0 runs the scheduler,
// the KV-cache manager's bookkeeping and the services; every rank executes each step.
//
// Rank 0's engine gets an ExecutorFactory from GroupExecutorFactory(): its executor
// (GroupExecutor) sends each step's plan (plan_codec.h) on its channel's CommandLine and then
// runs the rank's own executor, whose model takes part in the step's collectives
// (tensor-parallel all-reduces). The other ranks run RunFollower(): receive a command, execute
// it with their own executor, until rank 0 says shutdown. The two sides are this one interface,
// not `if (rank == 0)` branches through the engine.
//
// Failure model: a rank that dies or wedges fails the others' collectives (UNAVAILABLE /
// DEADLINE_EXCEEDED, comm/process_group.h) and the group stays broken: rank 0's steps fail
// with that error and health() reports it, so the worker goes NOT_SERVING; followers return it
// and exit. While rank 0 is idle it sends a keepalive every `keepalive` (well inside the group's
// deadline), so an idle follower's wait never times out and a dead follower is noticed.
//
// Thread safety: GroupExecutor's Run() is called from the engine's step loop; the group is
// shared with the keepalive and KV transfer calls through the GroupChannel. health() is
// thread-safe.
#ifndef TANDEM_RUNTIME_PARALLEL_GROUP_EXECUTOR_H_
#define TANDEM_RUNTIME_PARALLEL_GROUP_EXECUTOR_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/process_group.h"
#include "runtime/engine/model_executor.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/parallel/command_line.h"
#include "runtime/parallel/group_channel.h"
#include "runtime/parallel/plan_delta.h"

namespace tandem::runtime {

struct GroupExecutorOptions {
  // Rank 0 idle for this long sends a keepalive command (must be well under the group's
  // collective deadline).
  absl::Duration keepalive = absl::Seconds(2);
};

class GroupExecutor final : public ModelExecutor {
 public:
  GroupExecutor(std::unique_ptr<ModelExecutor> local, std::shared_ptr<GroupChannel> channel);
  // Tells the followers to shut down (when the group still works).
  ~GroupExecutor() override;
  absl::StatusOr<RunnerOutput> Run(const SchedulerOutput& batch) override;
  void* kv_pool_data() override { return local_->kv_pool_data(); }
  int64_t kv_pool_bytes() const override { return local_->kv_pool_bytes(); }
  bool pool_on_device() const override { return local_->pool_on_device(); }
  ExecutorStats stats() const override { return local_->stats(); }
  absl::Status health() const override { return channel_->status(); }

 private:
  const std::unique_ptr<ModelExecutor> local_;
  const std::shared_ptr<GroupChannel> channel_;
  PlanDeltaEncoder plans_;  // Run() only (the engine's step loop)
};

// A rank's KV transfer side in a prefill or decode group (group_kv.h implements it): where the
// executor's pool lives, and what the rank does with rank 0's KV commands.
class RankKvHooks {
 public:
  virtual ~RankKvHooks() = default;
  // Memory for the executor's KV pool of `bytes`; nullptr: the executor allocates its own.
  virtual absl::StatusOr<void*> AllocatePool(int64_t bytes) = 0;
  // The executor was built for `spec` (its pool at executor.kv_pool_data()).
  virtual absl::Status PoolReady(ModelExecutor& executor, const ExecutorSpec& spec) = 0;
  // This rank's answer to a KV command: a serialized tandem.v1.KvReply.
  virtual std::string Handle(const tandem::v1::KvCommand& command) = 0;
};

// Rank 0's backend: `local` (this rank's own backend, built for the group) fanned out over
// `group`. create() tells every rank to build its executor for the same spec and fails, naming
// the ranks, when any could not; default_kv_cache_bytes() is the minimum over the ranks (each
// measures its own GPU). `group` must outlive the factory and its executors.
ExecutorFactory GroupExecutorFactory(ExecutorFactory local, std::shared_ptr<GroupChannel> channel);
// As above with a channel of its own over `group`.
ExecutorFactory GroupExecutorFactory(ExecutorFactory local, comm::ProcessGroup* group,
                                     GroupExecutorOptions options = {});

// Ranks > 0: executes rank 0's commands with `local` (built with this rank's `local_config`
// and `weights`) until shutdown (OK) or the group fails (its error).
// `kv` (may be null: KV commands are answered UNIMPLEMENTED) places the pool and serves rank 0's
// KV commands; it must outlive the call. `line` (may be null: the group's broadcast) receives the
// commands; it must be of the kind rank 0's GroupChannel sends on, and outlive the call.
absl::Status RunFollower(comm::ProcessGroup* group, const ExecutorFactory& local,
                         const ModelConfig& local_config, ModelWeights weights,
                         RankKvHooks* kv = nullptr, CommandLine* line = nullptr);

// Every rank calls this once at startup with what it loaded (model id, backend, dtype, tp):
// FAILED_PRECONDITION on every rank, naming the ranks and rank 0's identity, unless all agree.
absl::Status CheckGroupAgreement(comm::ProcessGroup* group, const std::string& identity);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_PARALLEL_GROUP_EXECUTOR_H_
