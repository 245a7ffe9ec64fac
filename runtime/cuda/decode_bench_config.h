// decode_step_bench's request length (no CUDA here, so the CPU test covers it).
#ifndef TANDEM_RUNTIME_CUDA_DECODE_BENCH_CONFIG_H_
#define TANDEM_RUNTIME_CUDA_DECODE_BENCH_CONFIG_H_

#include <algorithm>
#include <cstdint>

#include "runtime/model/model_config.h"

namespace tandem::runtime::cuda {

// New tokens each bench request asks for beyond its timed steps (prefill + warm-up steps).
inline constexpr int64_t kDecodeBenchExtraTokens = 8;

// Makes room for requests of `context` prompt tokens and steps + kDecodeBenchExtraTokens new
// ones: Engine::Create caps EngineConfig::max_model_len (`max_model_len`) at the model's
// max_position_embeddings, so both are raised (the bench's synthetic Llama shapes say 8192,
// which refused every --context=8192 row). The dummy model has no trained position limit: RoPE
// is computed for any position. (No engine dependency: runtime/cuda libraries must not reach the
// CPU backend, tests/check_deps.sh.)
inline void FitDecodeBenchLength(int64_t context, int64_t steps, ModelConfig* model,
                                 int64_t* max_model_len) {
  const int64_t needed = context + steps + kDecodeBenchExtraTokens;
  *max_model_len = std::max<int64_t>({*max_model_len, 8192, needed});
  model->max_position_embeddings = std::max(model->max_position_embeddings, needed);
}

}  // namespace tandem::runtime::cuda

#endif  // TANDEM_RUNTIME_CUDA_DECODE_BENCH_CONFIG_H_
