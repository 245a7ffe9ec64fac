// Private to //runtime/model: the checkpoint tensors of a DeepSeek MLA model (weight_layout.h's
// HfTensorLayout / AllocateModelWeights / SlotVector hand MLA configs here).
#ifndef TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_MLA_H_
#define TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_MLA_H_

#include <cstdint>
#include <vector>

#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime::internal {

// Every tensor of a DeepSeek checkpoint: embeddings, per layer input_layernorm, the MLA
// projections (q_a_proj / q_a_layernorm / q_b_proj or q_proj, kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj), o_proj, post_attention_layernorm and mlp.{gate,up,down}_proj (or,
// on MoE layers, weight_layout_moe.cc's experts), then model.norm and lm_head (untied). Whole
// tensors: MLA models run on one rank (`dims` is the whole model).
std::vector<HfTensor> MlaTensorLayout(const ModelConfig& config, const TpDims& dims);

// Sizes those vectors (zero-filled); qkv_proj stays empty.
void AllocateMlaWeights(const ModelConfig& config, const TpDims& dims, ModelWeights* weights);

// The LayerWeights vector of an MLA slot; nullptr for any other slot.
std::vector<float>* MlaSlotVector(LayerWeights* layer, WeightSlot slot);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_WEIGHT_LAYOUT_MLA_H_
