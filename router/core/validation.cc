#include "router/core/validation.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "tandem/v1/limits.h"
#include "tandem/v1/request_shape.h"

namespace tandem::router {
using v1::CheckIdLength;

absl::Status ValidateAgainstModel(const v1::GenerateRequest& request, const ModelLimits& limits) {
  const auto& prompt = request.prompt_token_ids();
  for (int i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i, "] = ", prompt[i],
                                                     " is not below the vocabulary size ",
                                                     limits.vocab_size));
    }
  }
  const auto& stops = request.sampling().stop_token_ids();
  for (int i = 0; i < stops.size(); ++i) {
    if (stops[i] >= limits.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop_token_ids[", i, "] = ", stops[i],
                       " is not below the vocabulary size ", limits.vocab_size));
    }
  }
  const uint64_t total = static_cast<uint64_t>(prompt.size()) + request.sampling().max_tokens();
  if (total > limits.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) + max_tokens (", request.sampling().max_tokens(),
        ") = ", total, " exceeds the model's max length ", limits.max_model_len));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkerInfo(const v1::WorkerInfo& info) {
  if (info.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  if (absl::Status s = CheckIdLength("worker_id", info.worker_id()); !s.ok()) return s;
  if (absl::Status s = CheckIdLength("model_id", info.model_id()); !s.ok()) return s;
  if (info.address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", info.worker_id(), ": address is empty"));
  }
  if (info.address().size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", info.worker_id(), ": address is longer than 1024 bytes"));
  }
  if (info.role() != v1::WORKER_ROLE_PREFILL && info.role() != v1::WORKER_ROLE_DECODE &&
      info.role() != v1::WORKER_ROLE_MIXED) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", info.worker_id(), ": role must be prefill, decode or mixed"));
  }
  if (info.block_size() < 1 || info.vocab_size() < 1 || info.max_model_len() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", info.worker_id(), ": block_size (", info.block_size(), "), vocab_size (",
        info.vocab_size(), ") and max_model_len (", info.max_model_len(), ") must all be >= 1"));
  }
  if (info.eos_token_ids_size() > v1::kMaxStopTokenIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", info.worker_id(), ": ", info.eos_token_ids_size(),
                     " eos_token_ids; the limit is ", v1::kMaxStopTokenIds));
  }
  return absl::OkStatus();
}

absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  if (absl::Status s = CheckIdLength("worker_id", request.worker_id()); !s.ok()) return s;
  for (int n : {request.added_block_hashes_size(), request.removed_block_hashes_size()}) {
    if (n > v1::kMaxHeartbeatBlockHashes) {
      return absl::InvalidArgumentError(absl::StrCat("heartbeat from ", request.worker_id(),
                                                     " carries ", n, " block hashes; the limit is ",
                                                     v1::kMaxHeartbeatBlockHashes));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
