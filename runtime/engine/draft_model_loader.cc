#include "runtime/engine/draft_model_loader.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/model/mtp_weights.h"

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

absl::Status LoadAndAttachMtp(const ModelSource& source, const ModelConfig& config,
                              const BackendOptions& backend, Engine& engine) {
  if (config.num_nextn_predict_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative_method=mtp needs a model with an MTP layer; its config has "
                     "num_nextn_predict_layers = ",
                     config.num_nextn_predict_layers));
  }
  MtpWeights weights;
  if (source.load_format == "dummy") {
    // The model's seed: the MTP tensors' names give them streams of their own, and
    // make_dummy_model writes them with that seed too.
    weights = RandomMtpWeights(config, source.dummy_seed);
  } else {
    ASSIGN_OR_RETURN(weights, LoadMtpWeights(source.model_dir, config));
  }
  if (config.num_nextn_predict_layers > 1) {
    // vLLM chains layer k for draft k (spec_step_index); here one layer drafts every position.
    std::fprintf(stderr,
                 "MTP: the model has %lld MTP layers; only the first (model.layers.%lld) is "
                 "loaded and drafts, chained on its own output for K > 1 (the others are unused)\n",
                 static_cast<long long>(config.num_nextn_predict_layers),
                 static_cast<long long>(config.num_hidden_layers));
  }
  ASSIGN_OR_RETURN(const MtpExecutorFactory factory, MakeMtpExecutorFactory(backend, config));
  return engine.AttachMtp(config, std::move(weights), &factory);
}

}  // namespace tandem::runtime
