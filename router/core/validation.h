// Request and worker-message validation for the router. Everything here runs BEFORE any worker is
// called, so a bad request never costs a worker anything (proto/README.md, "Size limits").
//
// Two stages, because the model-dependent limits are only known once a route is chosen:
//   ValidateRequestShape    limits.h bounds that hold for every model (ids, sizes, sampling ranges)
//   ValidateAgainstModel    the chosen workers' vocab_size and max_model_len
// Every failure is INVALID_ARGUMENT naming the offending field and value.
//
// Thread safety: pure functions.
#ifndef TANDEM_ROUTER_CORE_VALIDATION_H_
#define TANDEM_ROUTER_CORE_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tandem/v1/request_shape.h"
#include "tandem/v1/router.pb.h"

namespace tandem::router {

// What the serving model allows; taken from WorkerInfo (the minimum over a P/D pair).
struct ModelLimits {
  uint32_t vocab_size = 0;
  uint32_t max_model_len = 0;
};

// The model-independent shape check is shared with the workers: proto/tandem/v1/request_shape.h.
using v1::ValidateRequestShape;

// Every prompt and stop token id < vocab_size; prompt + max_tokens <= max_model_len.
absl::Status ValidateAgainstModel(const v1::GenerateRequest& request, const ModelLimits& limits);

// RegisterWorker: worker_id 1..kMaxIdBytes bytes, non-empty address, a role, block_size,
// vocab_size and max_model_len >= 1, model_id <= kMaxIdBytes.
absl::Status ValidateWorkerInfo(const v1::WorkerInfo& info);

// Heartbeat: worker_id as above, each hash list <= kMaxHeartbeatBlockHashes.
absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& request);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_CORE_VALIDATION_H_
