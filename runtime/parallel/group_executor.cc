#include "runtime/parallel/group_executor.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/parallel/plan_codec.h"

namespace tandem::runtime {
namespace {

// Gathers one flag per rank (1 = ok); returns the ranks that reported 0.
absl::StatusOr<std::vector<int>> FailedRanks(comm::ProcessGroup* group, bool ok) {
  const float mine = ok ? 1.0f : 0.0f;
  std::vector<float> all(group->size());
  RETURN_IF_ERROR(group->AllGather(absl::MakeConstSpan(&mine, 1), absl::MakeSpan(all)));
  std::vector<int> failed;
  for (int r = 0; r < group->size(); ++r) {
    if (all[r] != 1.0f) failed.push_back(r);
  }
  return failed;
}

// The group's minimum of each rank's budget, exchanged in MiB (exact in a float below 16 TiB).
absl::StatusOr<int64_t> MinBudget(comm::ProcessGroup* group, int64_t bytes) {
  const float mine = static_cast<float>(bytes >> 20);
  std::vector<float> all(group->size());
  RETURN_IF_ERROR(group->AllGather(absl::MakeConstSpan(&mine, 1), absl::MakeSpan(all)));
  const float lowest = *std::min_element(all.begin(), all.end());
  return static_cast<int64_t>(lowest) << 20;
}

ExecutorSpec SpecFromCommand(const tandem::v1::CreateExecutor& c, const ModelConfig& config) {
  ExecutorSpec spec;
  spec.model_config = config;
  spec.num_blocks = c.num_blocks();
  spec.block_size = c.block_size();
  spec.max_num_batched_tokens = c.max_num_batched_tokens();
  spec.max_num_seqs = c.max_num_seqs();
  spec.max_model_len = c.max_model_len();
  spec.num_speculative_tokens = c.num_speculative_tokens();
  return spec;
}

// A follower's executor for `spec`, its pool where `kv` places it (the rank's transfer agent's
// memory), announced to `kv` once built.
absl::StatusOr<std::unique_ptr<ModelExecutor>> CreateFollowerExecutor(const ExecutorFactory& local,
                                                                      ExecutorSpec spec,
                                                                      ModelWeights weights,
                                                                      RankKvHooks* kv) {
  if (kv != nullptr && local.accepts_external_pool) {
    const int64_t bytes =
        spec.num_blocks * KvBlockBytes(spec.model_config, spec.block_size, local.kv_dtype);
    ASSIGN_OR_RETURN(spec.kv_pool, kv->AllocatePool(bytes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor, local.create(spec, std::move(weights)));
  if (kv != nullptr) RETURN_IF_ERROR(kv->PoolReady(*executor, spec));
  return executor;
}

}  // namespace

GroupExecutor::GroupExecutor(std::unique_ptr<ModelExecutor> local,
                             std::shared_ptr<GroupChannel> channel)
    : local_(std::move(local)), channel_(std::move(channel)) {}

GroupExecutor::~GroupExecutor() { channel_->Shutdown(); }

absl::StatusOr<RunnerOutput> GroupExecutor::Run(const SchedulerOutput& batch) {
  tandem::v1::RankCommand command;
  *command.mutable_step() = plans_.Encode(batch);
  absl::StatusOr<RunnerOutput> out = absl::UnknownError("step not run");
  absl::Status sent = channel_->Run(command, [&] {
    out = local_->Run(batch);
    return out.status();
  });
  if (!sent.ok()) {
    plans_.Reset();  // the plan may not have reached the followers: the next one goes whole
    return sent;
  }
  return out;
}

ExecutorFactory GroupExecutorFactory(ExecutorFactory local, comm::ProcessGroup* group,
                                     GroupExecutorOptions options) {
  return GroupExecutorFactory(std::move(local),
                              std::make_shared<GroupChannel>(group, options.keepalive));
}

ExecutorFactory GroupExecutorFactory(ExecutorFactory local, std::shared_ptr<GroupChannel> channel) {
  ExecutorFactory factory = local;
  factory.name = absl::StrCat(local.name, " x", channel->size());
  factory.create = [local, channel](
                       const ExecutorSpec& spec,
                       ModelWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    tandem::v1::RankCommand command;
    tandem::v1::CreateExecutor* c = command.mutable_create();
    c->set_num_blocks(spec.num_blocks);
    c->set_block_size(spec.block_size);
    c->set_max_num_batched_tokens(spec.max_num_batched_tokens);
    c->set_max_num_seqs(spec.max_num_seqs);
    c->set_max_model_len(spec.max_model_len);
    c->set_num_speculative_tokens(spec.num_speculative_tokens);
    absl::StatusOr<std::unique_ptr<ModelExecutor>> mine = absl::UnknownError("executor not built");
    RETURN_IF_ERROR(channel->RunWithGroup(command, [&](comm::ProcessGroup* group) -> absl::Status {
      mine = local.create(spec, std::move(weights));
      ASSIGN_OR_RETURN(std::vector<int> failed, FailedRanks(group, mine.ok()));
      if (!mine.ok()) return mine.status();
      if (!failed.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker group: rank(s) ", absl::StrJoin(failed, ", "),
                         " could not build their executor (see their logs)"));
      }
      return absl::OkStatus();
    }));
    return std::unique_ptr<ModelExecutor>(new GroupExecutor(*std::move(mine), channel));
  };
  if (local.default_kv_cache_bytes) {
    factory.default_kv_cache_bytes =
        [local, channel](const ModelConfig& config) -> absl::StatusOr<int64_t> {
      int64_t lowest = 0;
      tandem::v1::RankCommand command;
      command.set_kv_budget(true);
      RETURN_IF_ERROR(
          channel->RunWithGroup(command, [&](comm::ProcessGroup* group) -> absl::Status {
            absl::StatusOr<int64_t> mine = local.default_kv_cache_bytes(config);
            ASSIGN_OR_RETURN(lowest, MinBudget(group, mine.ok() ? *mine : 0));
            return mine.status();
          }));
      return lowest;
    };
  }
  return factory;
}

absl::Status RunFollower(comm::ProcessGroup* group, const ExecutorFactory& local,
                         const ModelConfig& local_config, ModelWeights weights, RankKvHooks* kv,
                         CommandLine* line) {
  std::unique_ptr<CommandLine> gloo_line;
  if (line == nullptr) {
    gloo_line = GlooCommandLine(group);
    line = gloo_line.get();
  }
  std::unique_ptr<ModelExecutor> executor;
  ReceivedStep step;
  PlanDeltaDecoder plans;
  while (true) {
    ASSIGN_OR_RETURN(tandem::v1::RankCommand command, line->Receive());
    switch (command.command_case()) {
      case tandem::v1::RankCommand::kShutdown:
        return absl::OkStatus();
      case tandem::v1::RankCommand::kKeepalive:
        break;
      case tandem::v1::RankCommand::kKvBudget: {
        absl::StatusOr<int64_t> mine = local.default_kv_cache_bytes
                                           ? local.default_kv_cache_bytes(local_config)
                                           : absl::StatusOr<int64_t>(0);
        if (!mine.ok()) LOG(ERROR) << "worker group: KV budget: " << mine.status();
        RETURN_IF_ERROR(MinBudget(group, mine.ok() ? *mine : 0).status());
        break;
      }
      case tandem::v1::RankCommand::kCreate: {
        if (executor != nullptr) {
          return absl::FailedPreconditionError("worker group: executor created twice");
        }
        absl::StatusOr<std::unique_ptr<ModelExecutor>> made = CreateFollowerExecutor(
            local, SpecFromCommand(command.create(), local_config), std::move(weights), kv);
        if (!made.ok()) LOG(ERROR) << "worker group: cannot build the executor: " << made.status();
        RETURN_IF_ERROR(FailedRanks(group, made.ok()).status());
        RETURN_IF_ERROR(made.status());
        executor = *std::move(made);
        break;
      }
      case tandem::v1::RankCommand::kStep: {
        if (executor == nullptr) {
          return absl::FailedPreconditionError("worker group: a step before the executor");
        }
        RETURN_IF_ERROR(plans.Apply(std::move(*command.mutable_step()), &step));
        RETURN_IF_ERROR(executor->Run(step.batch).status());
        break;
      }
      case tandem::v1::RankCommand::kKv: {
        std::string reply;
        if (kv != nullptr) {
          reply = kv->Handle(command.kv());
        } else {
          tandem::v1::KvReply refused;
          refused.set_code(static_cast<int>(absl::StatusCode::kUnimplemented));
          refused.set_message("this rank has no KV transfer side (--role=mixed)");
          reply = refused.SerializeAsString();
        }
        RETURN_IF_ERROR(GatherBytes(group, reply).status());
        break;
      }
      default:
        return absl::InvalidArgumentError("worker group: unknown rank command");
    }
  }
}

absl::Status CheckGroupAgreement(comm::ProcessGroup* group, const std::string& identity) {
  std::string root = identity;
  RETURN_IF_ERROR(BroadcastBytes(group, &root));
  ASSIGN_OR_RETURN(std::vector<int> failed, FailedRanks(group, root == identity));
  if (failed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("worker group: rank(s) ", absl::StrJoin(failed, ", "),
                   " loaded something else than rank 0 (rank 0: ", root,
                   group->rank() == 0 ? "" : absl::StrCat("; this rank: ", identity), ")"));
}

}  // namespace tandem::runtime
