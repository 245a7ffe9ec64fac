// DeepSeek-V3's multi-token prediction (MTP) module as a Hugging Face checkpoint stores it, for
// speculative decoding (--speculative_method=mtp). A config with num_nextn_predict_layers = n >= 1
// has, after the model's N = num_hidden_layers decoder layers, n more under
// model.layers.{N .. N + n - 1}. (transformers drops them on load; so does LoadModelWeights, which
// names them in its log). Layer N holds:
//   model.layers.N.enorm.weight               [hidden]      RMSNorm of the next token's embedding
//   model.layers.N.hnorm.weight               [hidden]      RMSNorm of the previous hidden state
//   model.layers.N.eh_proj.weight             [hidden, 2 * hidden]  on [enorm(e) | hnorm(h)]
//   model.layers.N.{input_layernorm, self_attn.*, post_attention_layernorm, mlp.*}  one decoder
//       layer, named and shaped as the model's layer N would be (MLA attention; DeepSeek's MoE
//       layer when N >= first_k_dense_replace)
//   model.layers.N.shared_head.norm.weight    [hidden]
//   model.layers.N.shared_head.head.weight    [vocab, hidden]   optional: the model's lm_head
//   model.layers.N.embed_tokens.weight        [vocab, hidden]   optional: model.embed_tokens
// (DeepSeek-V3's released checkpoints carry their own copies of the last two; vLLM reads them from
// the MTP layer, and they equal the model's.)
//
// Only the first MTP layer is loaded: with K > 1 drafts it runs chained on its own outputs, as
// vLLM does with one layer.
//
// Thread safety: the functions are thread-safe (no shared state).
#ifndef TANDEM_RUNTIME_MODEL_MTP_WEIGHTS_H_
#define TANDEM_RUNTIME_MODEL_MTP_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {

struct MtpWeights {
  std::vector<float> enorm;    // [hidden]
  std::vector<float> hnorm;    // [hidden]
  std::vector<float> eh_proj;  // [hidden, 2 * hidden]: columns [0, H) embedding, [H, 2H) hidden
  // The decoder layer as a one-layer model of MtpBlockConfig(config): layers[0] the layer,
  // norm = shared_head.norm, lm_head = shared_head.head (or the model's head), embed_tokens the
  // MTP's embedding (or the model's).
  ModelWeights block;
  bool own_embed_tokens = false;  // the checkpoint's layer N had its own copies
  bool own_head = false;
};

// The one-layer model config the MTP block runs as: `config` with num_hidden_layers = 1, its
// layer 0 dense or DeepSeek's MoE layer as the checkpoint's layer num_hidden_layers is, and no
// MTP layers of its own.
ModelConfig MtpBlockConfig(const ModelConfig& config);

// The first MTP layer of `model_dir` (single model.safetensors, or the shards of
// model.safetensors.index.json) for `config` (the model's, no tensor parallelism): F32 / BF16 /
// F16 widened to fp32. In an FP8 checkpoint (config.quantization.FromCheckpoint()) the decoder
// block's projections and experts are read as the model's FP8 layers are (weight_fp8.h: e4m3
// codes and scales kept in block.layers[0]'s *_fp8 slots, kv_b_proj widened): DeepSeek-V3 ships
// its MTP layer so, with the glue (enorm, hnorm, eh_proj, shared_head) and head copies in bf16.
// INVALID_ARGUMENT naming num_nextn_predict_layers when the config has no MTP layer; naming the
// tensor when one is missing, misshapen or of another dtype, or a scale tensor as
// CheckFp8Checkpoint does.
absl::StatusOr<MtpWeights> LoadMtpWeights(const std::string& model_dir, const ModelConfig& config);

// Random MTP weights (what --load_format=dummy serves), deterministic in (config, seed), drawn as
// RandomModelWeights draws the model's tensors; the embedding and head are the model's
// (`model`'s, which RandomModelWeights(config, seed) made).
MtpWeights RandomMtpWeights(const ModelConfig& config, const ModelWeights& model, uint64_t seed);
// The same, bit for bit, drawing only the model's embedding and head (not its layers: for
// DeepSeek-V2-Lite RandomModelWeights would draw 15.7B fp32 values on the host).
MtpWeights RandomMtpWeights(const ModelConfig& config, uint64_t seed);

// Adds the first MTP layer to the single-file checkpoint `model_dir`/model.safetensors (its other
// tensors kept bit for bit, the MTP tensors in F32 drawn as RandomMtpWeights does; with
// `own_embed_and_head` the layer's embed_tokens and shared_head.head too, as copies of the model's
// embedding and head) and sets num_nextn_predict_layers = 1 in its config.json. For tests and
// make_dummy_model.
absl::Status AddMtpLayerToCheckpoint(const std::string& model_dir, const ModelConfig& config,
                                     uint64_t seed, bool own_embed_and_head);

// True when `name` is a tensor of one of `config`'s MTP layers (model.layers.{i}.* with
// num_hidden_layers <= i < num_hidden_layers + num_nextn_predict_layers).
bool IsMtpTensorName(absl::string_view name, const ModelConfig& config);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_MTP_WEIGHTS_H_
