// Scheduler's half of async scheduling (scheduler.h: MarkLaunched, Resolve): a step's tokens
// are applied one step late, while the next step runs.
#include <algorithm>
#include <utility>

#include "runtime/engine/scheduler.h"

namespace tandem::runtime {

uint64_t Scheduler::MarkLaunched(const SchedulerOutput& output) {
  const uint64_t tag = ++last_tag_;
  launched_tag_ = tag;
  launched_ids_.clear();
  for (size_t i = 0; i < output.seqs.size(); ++i) {
    const ScheduledSeq& seq = output.seqs[i];
    auto it = requests_.find(seq.request_id);
    if (it == requests_.end()) continue;
    Request* req = it->second.get();
    launched_ids_.insert(req->id);
    req->num_computed_tokens += static_cast<int64_t>(seq.new_tokens.size());
    if (!seq.samples) continue;
    // The sampled token's place; the spans into `tokens` of this step are stale from here on.
    req->tokens.push_back(kPendingToken);
    req->pending_index = static_cast<int64_t>(req->tokens.size()) - 1;
    req->pending_seq = static_cast<int64_t>(i);
  }
  return tag;
}

std::vector<RequestUpdate> Scheduler::Resolve(const SchedulerOutput& output, uint64_t tag,
                                              absl::Span<const int32_t> sampled_tokens,
                                              std::vector<std::vector<float>>* prompt_logits) {
  // Step `tag` ran: blocks that waited for it are free now.
  auto waited = std::stable_partition(deferred_frees_.begin(), deferred_frees_.end(),
                                      [tag](const auto& d) { return d.first > tag; });
  for (auto it = waited; it != deferred_frees_.end(); ++it) kv_cache_->Free(it->second);
  deferred_frees_.erase(waited, deferred_frees_.end());
  if (tag == launched_tag_) {
    launched_tag_ = 0;
    launched_ids_.clear();
  }
  std::vector<RequestUpdate> updates;
  bool any_finished = false;
  for (size_t i = 0; i < output.seqs.size(); ++i) {
    const ScheduledSeq& seq = output.seqs[i];
    auto it = requests_.find(seq.request_id);
    if (it == requests_.end()) continue;  // finished or aborted after this step was launched
    Request* req = it->second.get();
    if (req->status != RequestStatus::kRunning) continue;
    // The tokens this step computed; the token it sampled goes right after them.
    const int64_t end = seq.num_computed_tokens + static_cast<int64_t>(seq.new_tokens.size());
    RequestUpdate update = MakeUpdate(*req);
    if (seq.capture_prompt_logits && prompt_logits != nullptr && i < prompt_logits->size()) {
      req->last_prompt_logits = std::move((*prompt_logits)[i]);
      update.last_prompt_logits = req->last_prompt_logits;
    }
    if (seq.samples && i < sampled_tokens.size() &&
        end < static_cast<int64_t>(req->tokens.size())) {
      req->tokens[end] = sampled_tokens[i];
      if (req->pending_index == end) req->pending_index = req->pending_seq = -1;
      update.new_token_ids.push_back(sampled_tokens[i]);
      update.finish_reason = CheckStopAt(*req, end + 1);
    }
    kv_cache_->CacheBlocks(req->id, req->tokens, req->spec.cache_salt, end);
    // Output tokens known so far: a later step's placeholder is not one yet.
    const int64_t known =
        req->pending_index >= 0 ? req->pending_index : static_cast<int64_t>(req->tokens.size());
    update.num_output_tokens = known - req->num_prompt_tokens();
    if (update.finish_reason != FinishReason::kNone) {
      req->tokens.resize(end + 1);  // drop a later step's placeholder: that step is wasted
      update.num_output_tokens = end + 1 - req->num_prompt_tokens();
      Finish(req, update.finish_reason, &update);
      any_finished = true;
    }
    if (!update.new_token_ids.empty() || update.finish_reason != FinishReason::kNone ||
        !update.last_prompt_logits.empty()) {
      updates.push_back(std::move(update));
    }
  }
  if (any_finished) DropFinished(updates);
  return updates;
}

bool Scheduler::GrowsWithoutPreemption() const {
  int64_t needed = 0;
  for (const Request* req : running_) {
    needed +=
        kv_cache_->NumBlocksNeeded(req->id, static_cast<int64_t>(req->tokens.size()), nullptr);
  }
  // Conservative under DCP: every block could land on the fullest shard.
  int64_t free_blocks = kv_cache_->NumFreeBlocks();
  for (int64_t s = 0; s < kv_cache_->dcp().size; ++s) {
    free_blocks = std::min(free_blocks, kv_cache_->NumFreeBlocksOnShard(s));
  }
  return needed <= free_blocks;
}

}  // namespace tandem::runtime
