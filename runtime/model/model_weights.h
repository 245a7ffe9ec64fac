// Model weights in memory (fp32, owned) and the Hugging Face checkpoint formats they come from.
//
// Matrices use torch's Linear layout [out_features, in_features], row-major, so y = W x reads a
// row per output. q/k/v and gate/up are fused at load time (one GEMM each in the forward); the
// checkpoint stores them unfused under transformers' names:
//   model.embed_tokens.weight                          [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight            [hidden]
//   model.layers.{i}.self_attn.{q,k,v}_proj.weight     [Hq*D | Hkv*D | Hkv*D, hidden]
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias       (config.qkv_bias)
//   model.layers.{i}.self_attn.o_proj.weight           [hidden, Hq*D]   (.bias: config.o_bias)
//   model.layers.{i}.post_attention_layernorm.weight   [hidden]
//   model.layers.{i}.mlp.{gate,up}_proj.weight         [inter, hidden]  (.bias: config.mlp_bias)
//   model.layers.{i}.mlp.down_proj.weight              [hidden, inter]  (.bias: config.mlp_bias)
//   model.layers.{i}.self_attn.{q,k}_norm.weight       [D]              (config.qk_norm)
// and, on mixture-of-experts layers instead of mlp.*_proj (weight_layout_moe.cc), with
// M = "block_sparse_moe" (Mixtral) or "mlp", E experts of width Ie, a shared one of width Is:
//   model.layers.{i}.M.gate.weight                     [E, hidden]
//   model.layers.{i}.M.experts.{e}.{gate,up}_proj.weight  [Ie, hidden]  (Mixtral: w1, w3)
//   model.layers.{i}.M.experts.{e}.down_proj.weight    [hidden, Ie]     (Mixtral: w2)
//   model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight
//                                                      (Qwen2-MoE: [Is, hidden] / [hidden, Is]
//                                                      / [1, hidden])
//   DeepSeek: mlp.gate.weight, mlp.gate.e_score_correction_bias [E] (V3), mlp.experts.{e}.*,
//   mlp.shared_experts.{gate,up,down}_proj.weight (no gate)
// and, for DeepSeek MLA (config.IsMla(), weight_layout_mla.cc) instead of q/k/v_proj:
//   model.layers.{i}.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
//                               kv_a_layernorm, kv_b_proj}.weight (LayerWeights' MLA fields)
//   model.norm.weight                                  [hidden]
//   lm_head.weight                                     [vocab, hidden]  (absent when tied)
// with Hq = num_attention_heads, Hkv = num_key_value_heads, D = head_dim.
//
// All functions are thread-safe (no shared state).
#ifndef TANDEM_RUNTIME_MODEL_MODEL_WEIGHTS_H_
#define TANDEM_RUNTIME_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/fp8/fp8_linear.h"
#include "runtime/model/dummy_draw.h"
#include "runtime/model/model_config.h"
#include "runtime/model/tensor_parallel.h"

namespace tandem::runtime {

// One FP8 linear layer as loaded (config.quantization; weight_fp8.cc): e4m3 codes and fp32
// scales, held per output row (grid.block_rows = 1; blocks of 128 columns or the whole row), so
// fused q/k/v and gate/up parts of any size and scale granularity concatenate.
struct Fp8LinearWeight {
  std::vector<uint8_t> codes;  // [grid.rows, grid.cols] e4m3fn
  std::vector<float> scales;   // [grid.NumScales()]
  kernels::Fp8ScaleGrid grid;
  kernels::Fp8ActivationScheme activation = kernels::Fp8ActivationScheme::kNone;
  float input_scale = 0.0f;  // kStaticTensor: the largest of the fused parts' input scales
  bool empty() const { return codes.empty(); }
  kernels::Fp8WeightView View() const {
    return {codes.data(), scales.data(), grid, activation, input_scale};
  }
};

struct LayerWeights {
  std::vector<float> input_layernorm;  // [hidden]
  std::vector<float> qkv_proj;         // [(Hq + 2*Hkv) * D, hidden]: q rows, k rows, v rows
  std::vector<float> qkv_bias;         // [(Hq + 2*Hkv) * D] or empty
  std::vector<float> o_proj;           // [hidden, Hq * D]
  std::vector<float> o_bias;           // [hidden] or empty
  std::vector<float> post_attention_layernorm;  // [hidden]
  std::vector<float> gate_up_proj;              // [2 * inter, hidden]: gate rows, then up rows
  std::vector<float> gate_up_bias;              // [2 * inter] or empty
  std::vector<float> down_proj;                 // [hidden, inter]
  std::vector<float> down_bias;                 // [hidden] or empty
  // DeepSeek MLA layers (config.IsMla(); weight_layout_mla.cc) instead of qkv_proj, with
  // Rq = q_lora_rank, Dqk = qk_nope + qk_rope head dims, L = kv_lora_rank, Dr = qk_rope_head_dim,
  // Dn / Dv = qk_nope / v head dims; o_proj is then [hidden, Hq * Dv].
  std::vector<float> q_a_proj;        // [Rq, hidden] (self_attn.q_a_proj; empty when Rq = 0)
  std::vector<float> q_a_layernorm;   // [Rq]
  std::vector<float> q_proj;          // [Hq * Dqk, Rq] q_b_proj, or [Hq * Dqk, hidden] q_proj
  std::vector<float> kv_a_proj;       // [L + Dr, hidden] (self_attn.kv_a_proj_with_mqa)
  std::vector<float> kv_a_layernorm;  // [L]
  std::vector<float> kv_b_proj;       // [Hq * (Dn + Dv), L]: per head W_UK rows, then W_UV rows
  // Qwen3 (config.qk_norm): per-head RMSNorm weights of q and k; empty otherwise.
  std::vector<float> q_norm;  // [D]
  std::vector<float> k_norm;  // [D]
  // Mixture-of-experts layers (config.IsMoeLayer; their gate_up_proj / down_proj are empty).
  // E = num_experts, Ie = moe_intermediate_size, Is = shared_expert_intermediate_size.
  std::vector<float> router;              // [E, hidden] (mlp.gate / block_sparse_moe.gate)
  std::vector<float> experts_gate_up;     // [E, 2 * Ie, hidden]: per expert gate rows, up rows
  std::vector<float> experts_down;        // [E, hidden, Ie]
  std::vector<float> shared_gate_up;      // [2 * Is, hidden] or empty (Qwen2-MoE)
  std::vector<float> shared_down;         // [hidden, Is] or empty
  std::vector<float> shared_expert_gate;  // [hidden] or empty
  std::vector<float> router_bias;         // [E]: DeepSeek-V3's e_score_correction_bias, or empty
  // FP8 weights (config.quantization.IsFp8()) of qkv_proj, o_proj, gate_up_proj and down_proj,
  // whose fp32 vectors are then empty; biases stay fp32.
  Fp8LinearWeight qkv_fp8, o_fp8, gate_up_fp8, down_fp8;
  // FP8 checkpoints of MoE and MLA models (weight_fp8.cc), the fp32 vectors above then empty:
  // the experts stacked as the fp32 ones ([E * 2 * Ie, hidden] and [E * hidden, Ie]: per-row
  // scales, so expert e is rows [e * 2 * Ie, (e + 1) * 2 * Ie)), the shared expert, and the MLA
  // projections q_a_proj, q_b_proj / q_proj and kv_a_proj_with_mqa. kv_b_proj is used absorbed
  // (W_UK / W_UV): it is dequantized into kv_b_proj at load (as vLLM does) and kv_b_fp8 is empty
  // after the load.
  Fp8LinearWeight experts_gate_up_fp8, experts_down_fp8, shared_gate_up_fp8, shared_down_fp8;
  Fp8LinearWeight q_a_fp8, q_fp8, kv_a_fp8, kv_b_fp8;
  // A checkpoint calibrated for an FP8 KV cache (config.quantization.kv_cache_fp8): this layer's
  // K and V dequantization scales (modelopt's k_proj.k_scale / v_proj.v_scale, compressed-tensors'
  // k_scale / v_scale, the older kv_scale for both); 0 where the checkpoint has none. Used by an
  // FP8 K / V pool (--kv_cache_dtype=fp8 on CUDA), else unused.
  float kv_k_scale = 0.0f, kv_v_scale = 0.0f;
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> norm;     // [hidden]
  std::vector<float> lm_head;  // [vocab, hidden]; EMPTY when tie_word_embeddings (use embed_tokens)
  // config.quantization.lm_head (QuantizeWeightsFp8): the head in e4m3 with a scale a row, the
  // same rows as lm_head (or embed_tokens when tied); lm_head is then empty.
  Fp8LinearWeight lm_head_fp8;
};

// Loads `model_dir`/model.safetensors, or else every shard named in
// `model_dir`/model.safetensors.index.json ("weight_map"; shard names must be plain file names
// inside model_dir). F32, BF16 and F16 tensors are widened to fp32 exactly.
// NOT_FOUND when neither file exists. INVALID_ARGUMENT, naming the tensor (and both shapes where
// there are two), for a missing tensor, an unexpected one, a wrong shape, an unsupported dtype,
// a tensor in two shards, or an index entry its shard does not hold. Ignored: rotary
// "*.rotary_emb.inv_freq" buffers (old checkpoints saved them), and lm_head.weight when
// embeddings are tied, provided it has the embedding's shape.
// With a `shard` of a tensor-parallel group, only that rank's slices (tensor_parallel.h) are read
// from the memory-mapped files and kept; the whole checkpoint is still checked. Its topology
// errors (ComputeTpDims) are INVALID_ARGUMENT. A row-parallel slice (o_proj, down_proj: some
// columns of every row) still reads most pages of its tensor; a pre-sharded checkpoint
// (WritePreShardedCheckpoint) reads only the rank's bytes.
// A directory with kPreShardedManifest is pre-sharded: the rank reads
// `model_dir`/rank-R-of-N/model.safetensors, which holds exactly its parts, checked like a
// whole checkpoint; INVALID_ARGUMENT naming both topologies when the manifest's tp / dcp are
// not the shard's.
// The 16/32-bit tensors are read with pread (an I/O error names the file) by a small pool of
// reader threads that the call owns and joins; memory beyond the weights is one staging buffer
// of `read.chunk_bytes` per thread. The weights do not depend on `read`.
struct CheckpointReadOptions {
  int threads = 0;                          // reader threads; 0: min(8, hardware threads)
  int64_t chunk_bytes = int64_t{16} << 20;  // bytes of one read (at least one element or row)
};
absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const ModelConfig& config, TpShard shard = {},
                                              const CheckpointReadOptions& read = {});

// FP8 checkpoints (config.quantization.FromCheckpoint(); weight_fp8.h): q/k/v/o and gate/up/down
// (and MoE experts, shared experts, MLA projections: DeepSeek-V3's format; kv_b_proj dequantized
// at load) are F8_E4M3 with their scale tensors and land in LayerWeights' *_fp8 slots (scales per
// row: per-tensor and per-channel scales repeated per row, 128x128 blocks per row and 128-column
// block; static input scales of fused parts merged by max, as vLLM does), never widened; a
// tensor-parallel slice that cuts a 128-block is refused naming the TP size.
// WritePreShardedCheckpoint keeps FP8 weights' bytes as they are and writes each rank's slice of
// their scale tensors beside them (block scales on block boundaries).

// Quantizes the fp32 q/k/v/o, gate/up and down weights of `weights` (loaded for `config`, the
// rank's LocalModelConfig), a MoE layer's experts and shared experts (not the router) and the MLA
// projections q_a / q_b (q_proj) / kv_a_proj_with_mqa / kv_b_proj into FP8 slots as
// config.quantization says (Fp8QuantizedGrid; kv_b_proj dequantized back into its fp32 vector, as
// the loader holds a checkpoint's), freeing the fp32 vectors: --quantization=fp8 (online:
// per-channel, dynamic per-token activations) and dummy weights of an FP8 config (the CUDA
// backend draws the same codes and scales on the device: runtime/cuda/cuda_fp8_linear.h
// FillFp8Dummy). A 128 x 128-block config (Fp8QuantizesTiles) gets one scale per 128 x 128 tile
// of each checkpoint tensor, tiles starting at the tensor's first row as its weight_scale_inv
// [ceil(n / 128), ceil(k / 128)] does; `parts` (the 3-argument form: DummyWeightPlan's fills) say
// where each tensor's rows start in its fused slot; without them each slot is one tensor.
// INVALID_ARGUMENT for a static activation scheme (needs calibration).
absl::Status QuantizeWeightsFp8(const ModelConfig& config, ModelWeights* weights);
// The lm_head part of it (config.quantization.lm_head; QuantizeWeightsFp8 calls it last, and
// LoadModel on an FP8 checkpoint): the head's rows (embed_tokens' when tied) quantized into
// lm_head_fp8 as LmHeadFp8Scheme says, lm_head freed; nothing when lm_head_fp8 is filled already
// or the config keeps lm_head 16-bit.
absl::Status QuantizeLmHeadFp8(const ModelConfig& config, ModelWeights* weights);
// An FP8 lm_head's scheme under the model's `q`: a scale a row whatever the projections' weight
// scales, and dynamic per-token activations (no calibrated input scale exists for it) unless the
// model is weight-only (kNone: the head is too).
WeightQuantization LmHeadFp8Scheme(const WeightQuantization& q);
// The scale grid QuantizeWeightsFp8 gives an [n, k] weight in memory: per-row scales over groups
// of 128 columns when q.block_cols > 0 (a 128 x 128 tile's rows each hold its scale, as the
// loader holds a block checkpoint's), else over the whole row.
kernels::Fp8ScaleGrid Fp8QuantizedGrid(const WeightQuantization& q, int64_t n, int64_t k);
// Whether weights quantized at load for `q` get one scale per 128 x 128 tile (weight_block_size
// [128, 128]: DeepSeek-V3's and Qwen3-FP8's format) rather than per row.
bool Fp8QuantizesTiles(const WeightQuantization& q);

// Marks a pre-sharded checkpoint directory: {"format": "tandem-tp-shards", "tp": N, "dcp": K,
// "ranks": ["rank-0-of-N", ...]}.
inline constexpr char kPreShardedManifest[] = "tandem_tp_shards.json";

// Splits the checkpoint in `model_dir` (checked as LoadModelWeights does) for a group of `tp`
// ranks with `dcp` KV shards into `out_dir`: per rank rank-R-of-N/model.safetensors with that
// rank's parts of every tensor it keeps, in their stored dtype (bit for bit), under the same
// names; the other files of `model_dir` (config, tokenizer, templates; not the weights) copied
// next to them; the manifest written last, so an interrupted run leaves no loadable directory.
// Each rank then reads ~1/N of the weights (vLLM's sharded_state load format does the same).
// Topology errors as ComputeTpDims; INVALID_ARGUMENT when out_dir is model_dir.
absl::Status WritePreShardedCheckpoint(const std::string& model_dir, const ModelConfig& config,
                                       int tp, int dcp, const std::string& out_dir);

// Random weights (--load_format=dummy), deterministic in (config, seed): element i of every
// checkpoint tensor is DummyValue(seed, DummyStreamId(tensor name), i, mean) (dummy_draw.h), so
// the values do not depend on the order or sharding they are produced in. Matrices and biases
// ~ N(0, 0.02^2); norm weights 1 + N(0, 0.02^2). `config` must pass ValidateModelConfig. With a
// `shard`: that rank's slices of the same values, only those drawn (DummyWeightPlan); topology
// errors as ComputeTpDims.
ModelWeights RandomModelWeights(const ModelConfig& config, uint64_t seed);
absl::StatusOr<ModelWeights> RandomModelWeights(const ModelConfig& config, uint64_t seed,
                                                TpShard shard);

// Which vector of ModelWeights / LayerWeights a checkpoint tensor lands in.
enum class WeightSlot {
  kEmbedTokens,
  kNorm,
  kLmHead,
  kInputLayernorm,
  kQkvProj,
  kQkvBias,
  kOProj,
  kOBias,
  kPostAttentionLayernorm,
  kGateUpProj,
  kGateUpBias,
  kDownProj,
  kDownBias,
  kMlaQAProj,
  kMlaQALayernorm,
  kMlaQProj,
  kMlaKvAProj,
  kMlaKvALayernorm,
  kMlaKvBProj,
  kQNorm,
  kKNorm,
  kRouter,
  kExpertsGateUp,
  kExpertsDown,
  kSharedGateUp,
  kSharedDown,
  kSharedExpertGate,
  kRouterBias,
};

// The vector of `slot` in `weights` (of layers[layer] for per-layer slots).
std::vector<float>* SlotVector(ModelWeights* weights, WeightSlot slot, int64_t layer);

// A rank's 16-bit weights streamed from the checkpoint to where they live (issue 31: the CUDA
// backend copies each chunk to the device, so no rank holds its weights in fp32 on the host).
// The sink sees each read chunk once, in a host buffer it owns, as `count` elements of the sink's
// dtype for elements [offset, offset + count) of the rank's (slot, layer) vector, laid out as
// LoadModelWeights lays that vector out (fused q/k/v and gate/up, TP slices): the same
// HfTensorLayout and slicing, so the values are LoadModelWeights' rounded to the dtype
// (bf16 -> bf16 and f16 -> f16 copied as stored; other pairs widened exactly and rounded to
// nearest even).
enum class Weight16 { kBf16, kF16 };
struct WeightChunk {
  WeightSlot slot = WeightSlot::kEmbedTokens;
  int64_t layer = -1;  // -1 for model-level slots
  int64_t offset = 0;  // elements
  int64_t count = 0;
};
// Thread safety: Start is called once before the reads; then the loader's reader threads call
// Acquire / Commit, each with its own worker index in [0, workers): calls of one worker never
// overlap, calls of different workers do.
class WeightChunkSink {
 public:
  virtual ~WeightChunkSink() = default;
  // `workers` reader threads will write chunks of at most `chunk_bytes` bytes.
  virtual absl::Status Start(int workers, int64_t chunk_bytes) = 0;
  // A host buffer of chunk_bytes for the worker's next chunk: the loader fills it, then commits
  // it, after which the sink owns it again (a device sink copies from it asynchronously).
  virtual absl::StatusOr<void*> Acquire(int worker) = 0;
  virtual absl::Status Commit(int worker, const WeightChunk& chunk) = 0;
};

// Streams the parts of the F32 / BF16 / F16 tensors the rank of `shard` keeps into `sink` as
// `dtype`, with LoadModelWeights' checks, errors, pre-sharded directories and parallel preads.
// UNIMPLEMENTED for FP8 checkpoints (their e4m3 bytes: LoadModelWeights). The sink's first error
// stops the reads and is returned.
absl::Status StreamModelWeights16(const std::string& model_dir, const ModelConfig& config,
                                  TpShard shard, Weight16 dtype, WeightChunkSink* sink,
                                  const CheckpointReadOptions& read = {});

// A rank's checkpoint that its backend reads itself (the CUDA backend: StreamModelWeights16
// straight to the device; the host then loads the config only).
struct CheckpointSource {
  std::string model_dir;
  ModelConfig config;  // the whole model's, as LoadModelWeights takes it
  TpShard shard;
  CheckpointReadOptions read;
};

// One checkpoint tensor's part of a rank's dummy weights: local element i of `slice` is
// DummyValue(seed, stream_id, slice.GlobalIndex(i), mean) and goes to element offset + i of the
// rank's `slot` vector (of layer `layer`; -1 for model-level slots), sized as RandomModelWeights
// sizes it (embedding / lm_head rows past the vocabulary stay zero).
struct DummyTensorFill {
  WeightSlot slot = WeightSlot::kEmbedTokens;
  int64_t layer = -1;
  int64_t offset = 0;
  DummySlice slice;
  uint64_t stream_id = 0;
  float mean = 0.0f;  // 1 for norm weights
};

// Every tensor the rank of `shard` keeps, as fills: what RandomModelWeights(config, seed, shard)
// computes on the host, and what the CUDA backend draws on the device for that rank only.
// Topology errors as ComputeTpDims.
absl::StatusOr<std::vector<DummyTensorFill>> DummyWeightPlan(const ModelConfig& config,
                                                             TpShard shard = {});

// QuantizeWeightsFp8 with the checkpoint tensors' places in their slots (tiles restart at each).
absl::Status QuantizeWeightsFp8(const ModelConfig& config, ModelWeights* weights,
                                const std::vector<DummyTensorFill>& parts);

// Writes a Hugging Face model directory that transformers and LoadModelWeights accept:
// config.json, generation_config.json and the weights of RandomModelWeights(config, seed) in
// config.dtype under the unfused names, as model.safetensors or, when the weights exceed
// `shard_bytes`, as model-0000i-of-0000N.safetensors shards (a tensor larger than shard_bytes gets
// a shard of its own) plus model.safetensors.index.json. Creates `out_dir` if needed and first
// removes model.safetensors* / model-*-of-*.safetensors left there by an earlier run. Generates
// and writes one tensor chunk at a time: memory stays small even for 8B models.
// Shards are generated and written by `threads` threads at once (0: the hardware's; each shard's
// bytes do not depend on it); with fewer shards than threads, the others draw a shard's values in
// 1M-element pieces beside its writer.
absl::Status WriteDummyModel(const ModelConfig& config, const std::string& out_dir, uint64_t seed,
                             int64_t shard_bytes = 4LL << 30, int threads = 0);

}  // namespace tandem::runtime

#endif  // TANDEM_RUNTIME_MODEL_MODEL_WEIGHTS_H_
