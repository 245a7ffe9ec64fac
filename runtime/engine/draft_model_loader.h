// Speculative decoding with a draft model: the draft loaded for a backend and attached to an
// engine, as //runtime:generate and //runtime:tandem_worker do for --draft_model.
#ifndef TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_LOADER_H_
#define TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_LOADER_H_

#include "absl/status/status.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_source.h"

namespace tandem::runtime {

// Loads the draft model from `source` for `backend` on an executor of its own (no tensor-parallel
// group or DCP: a group's rank 0 drafts, the group verifies; on CUDA, dummy weights are drawn on
// the device) and attaches it to `engine` (Engine::AttachDraftModel's errors, the vocabulary
// check among them).
absl::Status LoadAndAttachDraftModel(const ModelSource& source, BackendOptions backend,
                                     Engine& engine);

// --speculative_method=mtp: loads the first MTP layer of the target `source` (LoadMtpWeights; for
// --load_format=dummy, RandomMtpWeights beside the model's dummy weights) for `config` (the whole
// model's) and attaches it to `engine` on `backend` (MakeMtpExecutorFactory: the MTP runs in this
// process, a group's rank 0, on the CPU or on backend.device). INVALID_ARGUMENT naming
// num_nextn_predict_layers for a model without an MTP layer.
absl::Status LoadAndAttachMtp(const ModelSource& source, const ModelConfig& config,
                              const BackendOptions& backend, Engine& engine);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_DRAFT_MODEL_LOADER_H_
