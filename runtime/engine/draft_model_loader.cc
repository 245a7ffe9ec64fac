#include "runtime/engine/draft_model_loader.h"

#include <utility>

#include "common/status_macros.h"

namespace tandem::runtime {

absl::Status LoadAndAttachDraftModel(const ModelSource& source, BackendOptions backend,
                                     Engine& engine) {
  backend.group = nullptr;  // the draft runs in this process alone
  backend.dcp_size = 1;
  backend.dummy_plan.clear();
  ASSIGN_OR_RETURN(BackendModel draft, LoadModelForBackend(source, backend));
  return engine.AttachDraftModel(draft.model.config, std::move(draft.model.weights),
                                 &draft.factory);
}

}  // namespace tandem::runtime
