// Shared by the CUDA engine tests (cuda_engine_test, cuda_engine_fold_test; GPU, testonly): an
// engine run over prompts (tokens + last-prompt logits), logits helpers, the MidConfig tests'
// backend and prompts, and the on / off comparison of one CudaBackendConfig option.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_ENGINE_TEST_UTIL_H_
#define TANDEM_RUNTIME_CUDA_CUDA_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_test_util.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime::cuda::engine_cuda_test {

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// Runs every prompt through one engine (all at once when `together`; factory null: the CPU
// backend) with ignore_eos and the last prompt logits captured.
std::vector<Output> RunPrompts(const ModelConfig& model, ModelWeights weights,
                               const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                               const ExecutorFactory* factory, bool together,
                               ExecutorStats* stats = nullptr);

float MaxAbs(const std::vector<float>& v);
int ArgMax(const std::vector<float>& v);
double Cosine(const std::vector<float>& a, const std::vector<float>& b);  // -2 on a size mismatch

// TANDEM_TEST_PREFILL=off|mma|wgmma (default wgmma, the backend's default) picks the prefill
// kernel of the MidConfig tests, to compare variants on a GPU without rebuilding.
CudaBackendConfig MidBackend();

std::vector<std::vector<int32_t>> RandomPrompts(int n, int max_len, int vocab, uint32_t seed);

// RandomModelWeights(model, seed) scaled (embeddings and lm_head x 25, the projections x 3) so
// logits are far from uniform: the comparisons against the CPU backend.
ModelWeights ScaledRandomWeights(const ModelConfig& model, uint32_t seed);

// Runs `prompts` through an engine on `on` and one on `off` (the random weights of `seed` each)
// and expects every prompt's max_new_tokens tokens and last-prompt logits equal, bit for bit.
// Returns the two engines' stats.
std::pair<ExecutorStats, ExecutorStats> ExpectSameOutputs(
    const ModelConfig& model, uint32_t seed, const CudaBackendConfig& on,
    const CudaBackendConfig& off, const std::vector<std::vector<int32_t>>& prompts,
    int max_new_tokens, bool together);

// Six random prompts (two of 1 token, so their prefill is a batch-1 step too) one at a time, so
// every decode step is batch 1 (graphs), with a MidBackend whose option `set` turns on and off;
// tokens and last-prompt logits compared by ExpectSameOutputs. Returns (on, off) stats.
std::pair<ExecutorStats, ExecutorStats> ExpectBatch1OptionKeepsOutputs(
    void (*set)(CudaBackendConfig&, bool), const ModelConfig& model = engine_test::MidConfig());

}  // namespace tandem::runtime::cuda::engine_cuda_test

#endif  // TANDEM_RUNTIME_CUDA_CUDA_ENGINE_TEST_UTIL_H_
