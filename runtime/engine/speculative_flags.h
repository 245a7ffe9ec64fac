// The speculative-decoding flags, one spelling for every binary that runs an engine
// (//runtime:generate, //runtime:tandem_worker):
//
//   --speculative_method=none|ngram|draft|mtp  --num_speculative_tokens=K  --ngram_min=N
//   --ngram_max=M
//   --speculative_adaptive=true|false (per-request draft length, speculative.h)
//   --speculative_disable_by_batch_size=N (batch level: no drafts while >= N requests run)
//   --draft_model=DIR | dummy:CONFIG[:SEED]   (--speculative_method=draft: a Hugging Face
//       directory, or random weights of a preset / config.json with a seed, default 0)
//
// Off by default. A prefill worker never speculates (tandem_worker ignores them for
// --role=prefill).
#ifndef TANDEM_RUNTIME_ENGINE_SPECULATIVE_FLAGS_H_
#define TANDEM_RUNTIME_ENGINE_SPECULATIVE_FLAGS_H_

#include "absl/status/statusor.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model_source.h"

namespace tandem::runtime {

// The flags as a validated SpeculativeConfig (INVALID_ARGUMENT naming the bad flag).
absl::StatusOr<SpeculativeConfig> SpeculativeConfigFromFlags();

// --draft_model as a ModelSource (INVALID_ARGUMENT when empty or malformed).
absl::StatusOr<ModelSource> DraftModelSourceFromFlags();
// (Then LoadAndAttachDraftModel, draft_model_loader.h.)

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_SPECULATIVE_FLAGS_H_
