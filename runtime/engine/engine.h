// The single-worker engine: one step reads like the architecture diagram,
//
//   batch = scheduler.Schedule(); out = runner.Run(batch); scheduler.Update(batch, out);
//
// Callers add requests (validated here, before anything is allocated), call Step() until
// HasUnfinished() is false, and collect per-request updates (new tokens, finish reasons,
// captured prompt logits).
//
// Thread safety: not thread-safe; one thread drives an engine (the worker daemon wraps it in
// its own loop).
#ifndef TANDEM_RUNTIME_ENGINE_ENGINE_H_
#define TANDEM_RUNTIME_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/threading/thread_pool.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/request.h"
#include "runtime/engine/scheduler.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

struct EngineConfig {
  int64_t block_size = 16;
  // KV pool budget; num_blocks = kv_cache_bytes / bytes per block (all layers' K and V).
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  // 0 = the model's max_position_embeddings.
  int64_t max_model_len = 0;
  bool enable_prefix_caching = true;
  int num_threads = 2;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        const ModelConfig& model_config,
                                                        ModelWeights weights);

  // INVALID_ARGUMENT for an empty prompt, token ids outside the vocabulary, max_tokens < 1,
  // prompt + max_tokens beyond the model's maximum length or the KV pool, bad sampling
  // parameters; ALREADY_EXISTS for a duplicate id. Nothing is allocated on error.
  absl::Status AddRequest(int64_t request_id, RequestSpec spec);

  // Drops a request and frees its blocks; false if it is unknown (or already finished).
  bool Abort(int64_t request_id);

  // Runs one scheduling step. Returns the updates of the requests it advanced.
  absl::StatusOr<std::vector<RequestUpdate>> Step();

  bool HasUnfinished() const { return scheduler_->HasUnfinished(); }
  KvCacheStats kv_cache_stats() const { return scheduler_->kv_cache().Stats(); }
  int64_t num_kv_blocks() const { return num_blocks_; }
  int64_t max_model_len() const { return max_model_len_; }
  const ModelConfig& model_config() const { return model_config_; }

 private:
  Engine(const EngineConfig& config, const ModelConfig& model_config, int64_t num_blocks,
         int64_t max_model_len);

  const EngineConfig config_;
  const ModelConfig model_config_;
  const int64_t num_blocks_;
  const int64_t max_model_len_;
  std::unique_ptr<kernels::ThreadPool> pool_;  // outlives the runner's model
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_ENGINE_ENGINE_H_
