// Private to //runtime/model: FP8 checkpoints (config.quantization; issue 38). Which tensors of
// the layout are stored as e4m3, the scale tensors beside them, and how a rank's codes and scales
// land in LayerWeights' Fp8LinearWeight slots (fused q/k/v and gate/up, TP slices).
//
// Scale tensors, for a weight `P.weight` [n, k]:
//   fp8 (block):           P.weight_scale_inv [ceil(n/128), ceil(k/128)]
//   compressed-tensors:    P.weight_scale [1] or [] (tensor), [n, 1] or [n] (channel),
//                          [ceil(n/128), ceil(k/128)] (block); P.input_scale [1] or [] (static)
//   modelopt:              P.weight_scale [] or [1] (FP8), [n] or [n, 1]
//                          (FP8_PER_CHANNEL_PER_TOKEN), [ceil(n/128), ceil(k/128)] or
//                          [ceil(n/128), 1, ceil(k/128), 1] (FP8_PB_WO); P.input_scale [] or [1]
//                          (FP8)
// and, when config.quantization.kv_cache_fp8, per attention layer A ("model.layers.3.self_attn."):
// A.k_proj.k_scale / A.v_proj.v_scale (modelopt), A.k_scale / A.v_scale (compressed-tensors,
// newer modelopt) or the older A.kv_scale, [] or [1], each optional (the KV pool does not use
// them) and checked when present.
// F32, BF16 or F16, positive and finite. A tensor-parallel slice of a block-scaled weight must
// start and end on 128-element block boundaries (or the tensor's end).
#ifndef TANDEM_RUNTIME_MODEL_WEIGHT_FP8_H_
#define TANDEM_RUNTIME_MODEL_WEIGHT_FP8_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime::internal {

// Looks a checkpoint tensor up by name; nullptr when absent.
using FindTensor = std::function<const TensorInfo*(const std::string&)>;

// The slots FP8 covers: qkv_proj, o_proj, gate_up_proj, down_proj; the MoE experts and shared
// expert (stacked, per-row scales); the MLA projections q_a / q_b (q_proj) / kv_a_proj_with_mqa
// and kv_b_proj (dequantized into its fp32 vector after the load: used absorbed). Not the
// router, norms, embeddings or lm_head (DeepSeek-V3's checkpoint keeps them bf16).
bool IsFp8Slot(WeightSlot slot);
// `t` is stored as e4m3 in a checkpoint of `config`.
bool IsFp8Weight(const ModelConfig& config, const HfTensor& t);
// The FP8 twin of an fp32 slot of `layer` (nullptr for other slots).
Fp8LinearWeight* Fp8SlotOf(LayerWeights* layer, WeightSlot slot);

// The KV scale tensor names a checkpoint of `config` may hold for the attention layers of
// `layout` (empty unless config.quantization.kv_cache_fp8; the forms above).
std::vector<std::string> KvScaleTensorNames(const ModelConfig& config,
                                            const std::vector<HfTensor>& layout);
// Reads the KV scales of KvScaleTensorNames into each layer's LayerWeights::kv_k_scale /
// kv_v_scale (K: k_proj.k_scale, else k_scale, else kv_scale; V: v_proj.v_scale, else v_scale,
// else kv_scale); layers without them keep 0. The tensors were checked by CheckFp8Checkpoint.
void LoadKvScales(const ModelConfig& config, const std::vector<HfTensor>& layout,
                  const FindTensor& find, ModelWeights* weights);
// Names of the scale tensors the checkpoint may hold beside the FP8 weights of `layout` (the
// weights' own, then KvScaleTensorNames).
std::vector<std::string> Fp8ScaleTensorNames(const ModelConfig& config,
                                             const std::vector<HfTensor>& layout);

// INVALID_ARGUMENT naming the tensor: an FP8 weight of another dtype, a missing scale, a scale
// (a KV scale included) of the wrong shape, dtype or value; a tensor-parallel slice (rank of
// `dims`) that cuts a 128-block, naming the TP size; an FP8 weight whose module an entry of
// config.quantization.ignore names (naming both).
absl::Status CheckFp8Checkpoint(const ModelConfig& config, const TpDims& dims,
                                const std::vector<HfTensor>& layout, const FindTensor& find);

// Reads the rank's codes and scales of every FP8 weight of `layout` into `weights`' FP8 slots.
// REQUIRES: CheckFp8Checkpoint passed.
void LoadFp8Weights(const ModelConfig& config, const std::vector<HfTensor>& layout,
                    const FindTensor& find, ModelWeights* weights);

// One scale tensor of a rank's pre-sharded FP8 weight: its local shape and bytes (the rows /
// columns of the whole tensor that belong to the rank's slice of the weight; whole for
// per-tensor and input scales).
struct Fp8ScalePart {
  TensorSpec spec;
  std::string bytes;
};
// The scale tensors of FP8 weight `t` (sliced for a rank) as the rank's file holds them.
// REQUIRES: CheckFp8Checkpoint passed for the rank.
std::vector<Fp8ScalePart> Fp8ScaleParts(const ModelConfig& config, const HfTensor& t,
                                        const FindTensor& find);

}  // namespace tandem::runtime::internal

#endif  // TANDEM_RUNTIME_MODEL_WEIGHT_FP8_H_
