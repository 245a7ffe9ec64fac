// Where a process gets its model: a Hugging Face directory, or random weights for a preset /
// config.json (--load_format=dummy). Shared by //runtime:generate and //runtime:tandem_worker.
#ifndef TANDEM_RUNTIME_MODEL_MODEL_SOURCE_H_
#define TANDEM_RUNTIME_MODEL_MODEL_SOURCE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {

struct ModelSource {
  std::string model_dir;              // load_format "auto"
  std::string load_format = "auto";   // "auto" or "dummy"
  std::string dummy_config = "tiny";  // preset name or config.json path (dummy)
  uint64_t dummy_seed = 0;
  // dummy only: return the config and no weights; the backend generates them where they live
  // (the CUDA backend fills device memory directly).
  bool dummy_weights_on_backend = false;
  // auto only: return the config and no weights; the backend reads the rank's part of the
  // checkpoint itself (the CUDA backend: straight into device memory, StreamModelWeights16).
  bool checkpoint_on_backend = false;
  // "fp8": quantize a 16/32-bit model's linear layers at load (vLLM's online FP8: per-channel
  // weight scales, dynamic per-token activations; model_id gains ":fp8", so workers of different
  // weight quantization do not pair); "" or "none": as the checkpoint says.
  std::string quantization;
  // lm_head in FP8 too (per-row scales, dynamic per-token activations;
  // WeightQuantization::lm_head): with quantization "fp8" (model_id ":fp8+lm_head") or on an FP8
  // checkpoint (":lm_head_fp8"). Llama-family models only.
  bool quantize_lm_head = false;
  // Load only this tensor-parallel rank's part of the weights (tensor_parallel.h).
  TpShard shard;
};

struct LoadedModel {
  ModelConfig config;        // the whole model
  ModelConfig local_config;  // what this rank computes with (LocalModelConfig; = config at tp 1)
  ModelWeights weights;
  // Identifies the weights: workers pair only with workers serving the same model_id.
  // "dummy:<config>:<seed>" or "hf:<absolute dir>".
  std::string model_id;
};

// INVALID_ARGUMENT for a bad format or quantization, missing --model, --quantization=fp8 on a
// checkpoint that is quantized already, or quantize_lm_head without FP8 weights or on an MLA
// model; loader errors otherwise.
absl::StatusOr<LoadedModel> LoadModel(const ModelSource& source);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_MODEL_SOURCE_H_
