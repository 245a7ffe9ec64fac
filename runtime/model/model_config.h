// Model hyperparameters of a Llama-family checkpoint, read from a Hugging Face `config.json`.
//
// Supported architectures (silu MLPs, RMSNorm, full attention, rotate-half RoPE over the whole
// head): the dense LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM and Qwen3ForCausalLM
// (per-head q/k RMSNorm), and the mixtures of experts MixtralForCausalLM, Qwen2MoeForCausalLM
// (shared expert with a sigmoid gate) and Qwen3MoeForCausalLM (model_config_family.cc). Parsing
// follows transformers' config classes, including the two RoPE spellings in the wild:
//   * transformers < 5: top-level `rope_theta` + `rope_scaling` (null, or a dict whose type is
//     under "rope_type" or the older "type");
//   * transformers >= 5: `rope_parameters` = {"rope_type", "rope_theta", "factor", ...}.
// When both are present `rope_scaling` wins (as in transformers 5); a `rope_theta` inside the
// dict wins over the top-level one. Absent or null fields take transformers' defaults.
// Everything this runtime cannot run exactly (other architectures, yarn/dynamic/longrope RoPE,
// partial rotary, sliding-window layers, activations other than silu) is INVALID_ARGUMENT
// naming the field and value, never silently approximated.
//
// All functions are thread-safe (no shared state).
#ifndef TANDEM_RUNTIME_MODEL_MODEL_CONFIG_H_
#define TANDEM_RUNTIME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/fp8/fp8.h"
#include "kernels/layers/rope.h"
#include "runtime/model/expert_placement.h"

namespace tandem::runtime {

// Storage dtype of the checkpoint (compute is always fp32 on the CPU backend).
enum class WeightDtype { kF32, kF16, kBF16 };

// "float32" / "float16" / "bfloat16", the spelling transformers writes in config.json.
absl::string_view WeightDtypeName(WeightDtype dtype);
// Accepts those names plus "fp32"/"float", "fp16"/"half", "bf16" and a "torch." prefix.
absl::StatusOr<WeightDtype> ParseWeightDtype(absl::string_view name);

// How the decoder's linear layers (q/k/v/o, gate/up/down) are stored and multiplied (issue 38;
// model_config_quant.cc). Embeddings and norms stay in `dtype`; lm_head too unless `lm_head`.
struct WeightQuantization {
  enum class Method {
    kNone,
    kFp8Block,           // quant_method "fp8" + weight_block_size (DeepSeek, Qwen3-FP8)
    kCompressedTensors,  // quant_method "compressed-tensors", float 8-bit (llm-compressor)
    kModelOpt,           // quant_method "modelopt", quant_algo "FP8" (TensorRT Model Optimizer)
    kOnlineFp8,          // a 16/32-bit checkpoint quantized at load (--quantization=fp8)
  };
  Method method = Method::kNone;
  // Weight scale blocks of a checkpoint weight [n, k]; 0 = the whole dimension: per-tensor
  // {0, 0}, per-channel {1, 0}, DeepSeek blocks {128, 128}.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  kernels::Fp8ActivationScheme activation = kernels::Fp8ActivationScheme::kNone;
  // Modules the checkpoint leaves 16-bit (compressed-tensors `ignore`, fp8
  // `modules_to_not_convert`, modelopt `exclude_modules`): module names ("model.layers.0.mlp.gate",
  // "lm_head") or "re:" regexes matched from the name's start, as compressed-tensors matches them.
  // The loader refuses an entry naming a projection it reads as e4m3 (weight_fp8.h); lm_head, MoE
  // routers and gates are 16-bit in every FP8 format anyway.
  std::vector<std::string> ignore;
  // The checkpoint was calibrated for an e4m3 KV cache and ships per-layer k / v scales (modelopt
  // kv_cache_quant_algo "FP8", compressed-tensors kv_cache_scheme float 8-bit per tensor). The
  // loader checks those scale tensors (weight_fp8.h KvScaleTensorNames) and does not use them:
  // the KV pool is whatever --kv_cache_dtype says (auto: 16-bit, as vLLM's auto), and an FP8
  // latent pool (MLA) takes a scale per token row.
  bool kv_cache_fp8 = false;
  // lm_head is e4m3 too, quantized at load with one scale per vocabulary row and dynamic
  // per-token activations (LmHeadFp8Scheme; weight-only models: none) whatever the projections'
  // scheme: --quantize_lm_head with --quantization=fp8 or on an FP8 checkpoint (as TensorRT-LLM's
  // quantize_lm_head; Llama family only). Off unless asked: every checkpoint format stores
  // lm_head 16-bit. A tied lm_head gets its own e4m3 copy of the embedding.
  bool lm_head = false;
  bool IsFp8() const { return method != Method::kNone; }
  bool FromCheckpoint() const { return IsFp8() && method != Method::kOnlineFp8; }
  // One line, e.g. "fp8 compressed-tensors: per-channel weight scales, dynamic per-token
  // activations"; "none" when unquantized.
  std::string Describe() const;
};

struct ModelConfig {
  std::string architecture;  // one of the supported architectures above
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == num_attention_heads (MHA), a divisor (GQA), 1 (MQA)
  int64_t head_dim = 0;             // may differ from hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool qkv_bias = false;  // q/k/v projections have biases (Llama attention_bias; Qwen2 always)
  bool o_bias = false;    // o_proj has a bias (Llama attention_bias; never for Qwen2)
  bool mlp_bias = false;  // gate/up/down have biases (Llama mlp_bias)
  // DeepSeek-V2/V3 multi-head latent attention (model_config_mla.cc), when kv_lora_rank > 0:
  // q through q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj when q_lora_rank > 0; heads of
  // qk_nope_head_dim + qk_rope_head_dim; kv_a_proj_with_mqa -> latent c_kv (kv_lora_rank, then
  // kv_a_layernorm) + one shared k_pe (qk_rope_head_dim); kv_b_proj -> per-head k_nope and v
  // (v_head_dim). head_dim is qk_rope_head_dim (the RoPE'd part, as transformers sets it) and
  // the KV cache keeps one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = false;  // RoPE on (x[2i], x[2i+1]) pairs (V2; V3's flag), else rotate-half
  int64_t first_k_dense_replace = 0;  // layers below it have a dense MLP (all of them, for now)
  // DeepSeek-V3's multi-token prediction layers after the decoder's (model.layers.{N ..}; N =
  // num_hidden_layers): loaded only for --speculative_method=mtp (runtime/model/mtp_weights.h).
  int64_t num_nextn_predict_layers = 0;
  bool IsMla() const { return kv_lora_rank > 0; }
  // Tokens that end generation: config.json's eos_token_id (int or list) merged with
  // generation_config.json's (see LoadModelConfig). May be empty.
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
  WeightDtype dtype = WeightDtype::kF32;  // `dtype` (transformers 5) or `torch_dtype`
  // Qwen3 / Qwen3-MoE: q and k are RMSNorm'ed per head (weights [head_dim]) before RoPE.
  bool qk_norm = false;

  // Mixture of experts (num_experts == 0: dense). A sparse layer replaces the MLP by a router
  // ([num_experts, hidden], no bias) -> softmax -> top num_experts_per_tok (renormalised when
  // norm_topk_prob) -> SwiGLU experts of width moe_intermediate_size, weighted and summed; plus,
  // for Qwen2-MoE, a shared expert of width shared_expert_intermediate_size scaled by
  // sigmoid(shared_expert_gate . x). Dense layers (IsMoeLayer false) keep the MLP of width
  // intermediate_size. Mixtral: every layer sparse, experts of width intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  int64_t decoder_sparse_step = 1;              // layer l sparse when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;         // ... and l is not listed here
  // DeepSeek's router (model_config_mla.cc, kernels/moe GroupedTopK): V2 softmax scores, V3
  // sigmoid + e_score_correction_bias (a [E] tensor beside the router) for the choice; experts
  // in num_expert_groups groups of which topk_expert_groups are kept; weights times
  // routed_scaling_factor. Its shared experts (shared_expert_intermediate_size =
  // n_shared_experts * moe_intermediate_size) have no gate; first_k_dense_replace layers are
  // dense (listed in mlp_only_layers).
  enum class MoeRouter { kSoftmaxTopK, kDeepseekV2, kDeepseekV3 };
  MoeRouter moe_router = MoeRouter::kSoftmaxTopK;
  int64_t num_expert_groups = 1;
  int64_t topk_expert_groups = 1;
  double routed_scaling_factor = 1.0;
  // Expert parallelism (--enable_expert_parallel; tensor_parallel.h): set on one rank's
  // LocalModelConfig only: the group's expert -> rank table and this rank, whose weights hold
  // its experts whole (stacked in placement.experts_of(rank) order). Null: the weights hold
  // every expert (at tp > 1 a slice of each).
  std::shared_ptr<const ExpertPlacement> expert_placement = nullptr;
  int expert_rank = 0;
  // Data-parallel attention with expert parallelism (--dp_attention; tensor_parallel.h), set on
  // one rank's LocalModelConfig only: the rank runs attention, dense MLPs, shared experts,
  // embedding and lm_head whole (replicated weights) on its own requests' tokens, and each MoE
  // layer's routed rows travel to the ranks holding their experts by one all-to-all (dispatch)
  // and back by another (combine). expert_placement is then set too.
  bool dp_attention = false;

  bool IsMoe() const { return num_experts > 0; }
  bool IsMoeLayer(int64_t layer) const;
  // The experts this config's weights hold: num_experts, or this rank's under expert parallelism.
  int64_t NumHeldExperts() const {
    return expert_placement == nullptr
               ? num_experts
               : static_cast<int64_t>(expert_placement->experts_of(expert_rank).size());
  }
  // Checkpoint names of the experts: Mixtral's block_sparse_moe.experts.{e}.w1/w3/w2, else
  // mlp.experts.{e}.gate_proj/up_proj/down_proj.
  bool MixtralExpertNames() const { return architecture == "MixtralForCausalLM"; }
  // DeepSeek: mlp.shared_experts.* (no gate), V3's mlp.gate.e_score_correction_bias.
  bool DeepseekMoe() const { return moe_router != MoeRouter::kSoftmaxTopK; }

  // `quantization_config` of config.json (or --quantization=fp8, set by the loader).
  WeightQuantization quantization;

  // Every weight the checkpoint stores (lm_head counted only when not tied).
  int64_t NumParameters() const;
  // Bytes of the weights on a GPU backend (what a --kv_cache_bytes=0 KV pool is sized around;
  // model_config_quant.cc): 2 a parameter, but the decoder's FP8 projections (`quantization`:
  // q/k/v/o, the dense layers' gate/up/down; the loader refuses an `ignore` entry naming one)
  // 1 a parameter plus their fp32 scales, and an FP8 lm_head (`quantization.lm_head`) 1 a
  // parameter plus a scale a row (a tied one adds that copy to the embedding's 2). MLA models and
  // MoE experts count 2 a parameter (an estimate that may only fall on the high side).
  int64_t DeviceWeightBytes() const;
};

// Parses and validates the text of a config.json. Its `quantization_config`
// (model_config_quant.cc):
//   * quant_method "fp8" with weight_block_size [128, 128] and activation_scheme "dynamic"
//     (`*.weight` e4m3 + `*.weight_scale_inv` per block; activations in dynamic 1 x 128 groups);
//   * quant_method "compressed-tensors", format "float-quantized" (or "naive-quantized"), one
//     config group targeting Linear with 8-bit float weights of strategy "tensor", "channel" or
//     "block" ([128, 128]) and input activations null, dynamic "token", static "tensor" or dynamic
//     "group" of 128; `ignore` a list of module names or "re:" regexes (WeightQuantization::ignore:
//     lm_head and MoE router gates, as llm-compressor writes them; one naming an FP8 projection
//     is refused at load);
//   * quant_method "modelopt" (flat in config.json, or under "quantization" as hf_quant_config.json
//     nests it) with quant_algo (any case) "FP8" (per-tensor weight and static input scales),
//     "FP8_PER_CHANNEL_PER_TOKEN" (per-channel weight scales, dynamic per-token activations) or
//     "FP8_PB_WO" (128 x 128 weight blocks; run as vLLM runs it, with dynamic 1 x 128 activation
//     groups); exclude_modules (or config.json's `ignore`) as `ignore`, fnmatch wildcards as
//     regexes;
//   * KV-cache quantization: modelopt kv_cache_quant_algo "FP8" or a kv_cache_scheme (modelopt
//     or compressed-tensors) of 8-bit float per-tensor scales sets kv_cache_fp8; any other KV
//     scheme is refused.
// Any other method or scheme is INVALID_ARGUMENT naming it and the supported ones, as is FP8 for
// an architecture other than the dense Llama family (Llama, Qwen2, Mistral, Qwen3).
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json);

// Reads `model_dir`/config.json (or `model_dir` itself when it names a file) and, when present,
// the files beside config.json: hf_quant_config.json (TensorRT Model Optimizer's export; read
// as the modelopt quantization_config when config.json has none) and generation_config.json: its
// eos_token_id entries come first, followed by config.json's not already listed (transformers'
// generate() stops on the generation config's; the union never misses a stop token), and its
// bos_token_id fills in a missing one. NOT_FOUND when config.json does not exist.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// INVALID_ARGUMENT naming the field when `config` cannot describe a model we can run: non-positive
// sizes, heads not divisible by kv heads, odd head_dim, bias flags impossible for the
// architecture, token ids outside the vocabulary, bad RoPE parameters.
absl::Status ValidateModelConfig(const ModelConfig& config);

// A config.json for `config` (2-space indented) that transformers >= 4.40 and 5.x load: RoPE as
// top-level rope_theta + rope_scaling, which both generations read. (llama3 RoPE needs
// transformers >= 4.43, a head_dim different from hidden/heads >= 4.45: older ones do not know
// them.)
std::string ModelConfigToJson(const ModelConfig& config);

// Built-in shapes for dummy models:
//   "llama3-8b":  Llama-3.1-8B (vocab 128256, hidden 4096, 32 layers, 32 heads, 8 kv heads,
//                 inter 14336, rope_theta 500000 with llama3 scaling), bfloat16.
//   "llama3-70b": Llama-3.1-70B (the same with hidden 8192, 80 layers, 64 heads, inter 28672).
//   "llama-100m": ~100M parameters (vocab 32000, hidden 768, 12 layers, 12 heads, 4 kv heads,
//                 inter 2048, tied embeddings), float32.
//   "tiny":       vocab 256, hidden 64, 2 layers, 4 heads, 2 kv heads, inter 128, float32.
//   "qwen3-30b-a3b": Qwen3-30B-A3B (48 layers, 128 experts of 768, top-8), bfloat16.
//   "qwen3-30b-a3b-fp8": the same with Qwen3-30B-A3B-FP8's quantization_config (fp8, 128 x 128
//                 weight blocks, dynamic 1 x 128 activations); dummy weights at load only.
//   "deepseek-v2-lite-fp8", "deepseek-v3-4l-fp8", "tiny-mla-fp8": the DeepSeek presets with
//                 DeepSeek-V3's quantization_config (fp8, 128 x 128 weight blocks on every
//                 decoder projection, dynamic 1 x 128 activations); dummy weights at load only.
//   "mixtral-8x7b":  Mixtral-8x7B (32 layers, 8 experts of 14336, top-2), bfloat16.
//   "tiny-moe":   a Qwen3-MoE of "tiny"'s shape with 8 experts of 32, top-2, float32.
// INVALID_ARGUMENT listing the presets for any other name.
absl::StatusOr<ModelConfig> PresetConfig(absl::string_view name);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_MODEL_CONFIG_H_
