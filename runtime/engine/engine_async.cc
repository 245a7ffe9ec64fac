// Engine::Step under async scheduling (EngineConfig::async_scheduling): schedule and launch step
// s + 1, then collect step s and apply its tokens.
#include <utility>

#include "common/status_macros.h"
#include "runtime/engine/engine.h"

namespace tandem::runtime {
namespace {

// A step that may stay in flight while the next one is scheduled: plain decodes only, each
// sampling its one token (no prompt logits, drafts or hidden states to read back).
bool StaysInFlight(const SchedulerOutput& batch) {
  if (batch.return_hidden_states) return false;
  for (const ScheduledSeq& seq : batch.seqs) {
    if (seq.new_tokens.size() != 1 || !seq.samples || seq.capture_prompt_logits ||
        seq.num_draft_tokens > 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status Engine::Drain(std::vector<RequestUpdate>* updates) {
  if (!launched_.has_value()) return absl::OkStatus();
  LaunchedStep step = *std::move(launched_);
  launched_.reset();
  ASSIGN_OR_RETURN(RunnerOutput out, runner_->Collect());
  std::vector<RequestUpdate> applied =
      scheduler_->Resolve(step.batch, step.tag, out.sampled_tokens, &out.last_prompt_logits);
  for (RequestUpdate& u : applied) updates->push_back(std::move(u));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RequestUpdate>> Engine::StepAsync(std::vector<RequestUpdate> updates) {
  // A preemption must not take a request whose token is still in flight: resolve first.
  if (launched_.has_value() && !scheduler_->GrowsWithoutPreemption()) {
    RETURN_IF_ERROR(Drain(&updates));
  }
  SchedulerOutput batch = scheduler_->Schedule();
  if (connector_ != nullptr) RETURN_IF_ERROR(connector_->StartLoad(connector_->BuildStepMeta()));
  if (batch.empty()) {
    RETURN_IF_ERROR(Drain(&updates));
    return updates;
  }
  last_step_ = ShapeOf(batch);
  RETURN_IF_ERROR(runner_->Launch(batch));
  const uint64_t tag = scheduler_->MarkLaunched(batch);
  RETURN_IF_ERROR(Drain(&updates));  // the previous step, which ran while this one was planned
  const bool stays = StaysInFlight(batch);
  launched_ = LaunchedStep{std::move(batch), tag};
  if (!stays) RETURN_IF_ERROR(Drain(&updates));
  return updates;
}

}  // namespace tandem::runtime
