#include "runtime/model/weight_layout.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/weight_layout_mla.h"

namespace tandem::runtime {
namespace internal {

int64_t HfTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t HfTensor::local_numel() const { return keep ? slice().numel() : 0; }

DummySlice HfTensor::slice() const {
  const int64_t cols = shape.size() > 1 ? shape[1] : 1;
  if (slice_dim < 0) return DummySlice{numel(), 0, 1, 0, numel()};
  if (slice_dim == 0) return DummySlice{cols, slice_begin, slice_count, 0, cols};
  return DummySlice{cols, 0, shape[0], slice_begin, slice_count};
}

TpDims FullTpDims(const ModelConfig& c) {
  TpDims d;
  d.q_heads = c.num_attention_heads;
  d.o_heads = c.num_attention_heads;
  d.kv_heads = c.num_key_value_heads;
  d.intermediate = c.intermediate_size;
  d.moe_intermediate = c.moe_intermediate_size;
  d.shared_intermediate = c.shared_expert_intermediate_size;
  d.vocab_rows = c.vocab_size;
  return d;
}

std::vector<HfTensor> HfTensorLayout(const ModelConfig& c) {
  return HfTensorLayout(c, FullTpDims(c));
}

std::vector<HfTensor> HfTensorLayout(const ModelConfig& c, const TpDims& d) {
  if (c.IsMla()) return MlaTensorLayout(c, d);  // weight_layout_mla.cc
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t q = c.num_attention_heads * hd;
  const int64_t kv = c.num_key_value_heads * hd;
  const int64_t inter = c.intermediate_size;
  // Local widths and where the rank's slices start in the checkpoint tensors.
  const int64_t lq = d.q_heads * hd, q0 = d.q_head_begin * hd;
  const int64_t lkv = d.kv_heads * hd, kv0 = d.kv_head_begin * hd;
  const int64_t lo = d.o_heads * hd, o0 = d.o_head_begin * hd;
  const int64_t li = d.intermediate, i0 = d.intermediate_begin;
  const int64_t vocab_count =
      std::max<int64_t>(0, std::min(d.vocab_rows, c.vocab_size - d.vocab_begin));
  std::vector<HfTensor> out;
  // slice: {dim, begin, count}; dim -1 = whole.
  struct Slice {
    int dim = -1;
    int64_t begin = 0, count = 0;
  };
  auto add = [&out](std::string name, std::vector<int64_t> shape, WeightSlot slot, int64_t layer,
                    int64_t offset, Slice s, bool is_norm = false, bool keep = true) {
    HfTensor t{std::move(name), std::move(shape), slot, layer, offset, is_norm};
    t.slice_dim = s.dim;
    t.slice_begin = s.begin;
    t.slice_count = s.count;
    t.keep = keep;
    out.push_back(std::move(t));
  };
  const Slice whole;
  const Slice vocab{0, d.vocab_begin, vocab_count};
  const Slice q_rows{0, q0, lq}, kv_rows{0, kv0, lkv}, o_cols{1, o0, lo};
  const Slice i_rows{0, i0, li}, i_cols{1, i0, li};
  const bool row_bias = d.adds_row_parallel_bias;
  add("model.embed_tokens.weight", {c.vocab_size, h}, WeightSlot::kEmbedTokens, -1, 0, vocab);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", {h}, WeightSlot::kInputLayernorm, i, 0, whole, true);
    add(p + "self_attn.q_proj.weight", {q, h}, WeightSlot::kQkvProj, i, 0, q_rows);
    add(p + "self_attn.k_proj.weight", {kv, h}, WeightSlot::kQkvProj, i, lq * h, kv_rows);
    add(p + "self_attn.v_proj.weight", {kv, h}, WeightSlot::kQkvProj, i, (lq + lkv) * h, kv_rows);
    if (c.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q}, WeightSlot::kQkvBias, i, 0, q_rows);
      add(p + "self_attn.k_proj.bias", {kv}, WeightSlot::kQkvBias, i, lq, kv_rows);
      add(p + "self_attn.v_proj.bias", {kv}, WeightSlot::kQkvBias, i, lq + lkv, kv_rows);
    }
    add(p + "self_attn.o_proj.weight", {h, q}, WeightSlot::kOProj, i, 0, o_cols);
    if (c.o_bias) {
      add(p + "self_attn.o_proj.bias", {h}, WeightSlot::kOBias, i, 0, whole, false, row_bias);
    }
    add(p + "post_attention_layernorm.weight", {h}, WeightSlot::kPostAttentionLayernorm, i, 0,
        whole, true);
    internal::AppendFamilyLayerTensors(c, d, i, &out);  // q/k norms, experts
    if (c.IsMoeLayer(i)) continue;
    add(p + "mlp.gate_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, 0, i_rows);
    add(p + "mlp.up_proj.weight", {inter, h}, WeightSlot::kGateUpProj, i, li * h, i_rows);
    add(p + "mlp.down_proj.weight", {h, inter}, WeightSlot::kDownProj, i, 0, i_cols);
    if (c.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {inter}, WeightSlot::kGateUpBias, i, 0, i_rows);
      add(p + "mlp.up_proj.bias", {inter}, WeightSlot::kGateUpBias, i, li, i_rows);
      add(p + "mlp.down_proj.bias", {h}, WeightSlot::kDownBias, i, 0, whole, false, row_bias);
    }
  }
  add("model.norm.weight", {h}, WeightSlot::kNorm, -1, 0, whole, true);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", {c.vocab_size, h}, WeightSlot::kLmHead, -1, 0, vocab);
  }
  // A slice that covers the whole tensor is the whole tensor (TP=1 loads take the fast path).
  for (HfTensor& t : out) {
    if (t.slice_dim >= 0 && t.slice_begin == 0 && t.slice_count == t.shape[t.slice_dim]) {
      t.slice_dim = -1;
    }
  }
  return out;
}

void AllocateModelWeights(const ModelConfig& c, ModelWeights* w) {
  AllocateModelWeights(c, FullTpDims(c), w);
}

void AllocateModelWeights(const ModelConfig& c, const TpDims& d, ModelWeights* w) {
  if (c.IsMla()) return AllocateMlaWeights(c, d, w);  // weight_layout_mla.cc
  const auto h = static_cast<size_t>(c.hidden_size);
  const auto q = static_cast<size_t>(d.q_heads * c.head_dim);
  const auto kv = static_cast<size_t>(d.kv_heads * c.head_dim);
  const auto o = static_cast<size_t>(d.o_heads * c.head_dim);
  const auto inter = static_cast<size_t>(d.intermediate);
  const auto vocab = static_cast<size_t>(d.vocab_rows);
  const bool row_bias = d.adds_row_parallel_bias;
  w->embed_tokens.assign(vocab * h, 0.0f);
  w->norm.assign(h, 0.0f);
  w->lm_head.clear();
  if (!c.tie_word_embeddings) w->lm_head.assign(vocab * h, 0.0f);
  w->layers.assign(static_cast<size_t>(c.num_hidden_layers), LayerWeights());
  // FP8 checkpoints keep q/k/v/o and gate/up/down in the *_fp8 slots (weight_fp8.cc).
  const size_t fp32_linear = c.quantization.FromCheckpoint() ? 0 : 1;
  for (LayerWeights& layer : w->layers) {
    layer.input_layernorm.assign(h, 0.0f);
    layer.qkv_proj.assign(fp32_linear * (q + 2 * kv) * h, 0.0f);
    if (c.qkv_bias) layer.qkv_bias.assign(q + 2 * kv, 0.0f);
    layer.o_proj.assign(fp32_linear * h * o, 0.0f);
    if (c.o_bias && row_bias) layer.o_bias.assign(h, 0.0f);
    layer.post_attention_layernorm.assign(h, 0.0f);
    layer.gate_up_proj.assign(fp32_linear * 2 * inter * h, 0.0f);
    if (c.mlp_bias) layer.gate_up_bias.assign(2 * inter, 0.0f);
    layer.down_proj.assign(fp32_linear * h * inter, 0.0f);
    if (c.mlp_bias && row_bias) layer.down_bias.assign(h, 0.0f);
  }
  AllocateFamilyWeights(c, d, w);
}

}  // namespace internal

std::vector<float>* SlotVector(ModelWeights* w, WeightSlot slot, int64_t layer_index) {
  std::vector<float>* target = nullptr;
  LayerWeights* layer = layer_index >= 0 ? &w->layers[static_cast<size_t>(layer_index)] : nullptr;
  switch (slot) {
    case WeightSlot::kEmbedTokens:
      target = &w->embed_tokens;
      break;
    case WeightSlot::kNorm:
      target = &w->norm;
      break;
    case WeightSlot::kLmHead:
      target = &w->lm_head;
      break;
    case WeightSlot::kInputLayernorm:
      target = &layer->input_layernorm;
      break;
    case WeightSlot::kQkvProj:
      target = &layer->qkv_proj;
      break;
    case WeightSlot::kQkvBias:
      target = &layer->qkv_bias;
      break;
    case WeightSlot::kOProj:
      target = &layer->o_proj;
      break;
    case WeightSlot::kOBias:
      target = &layer->o_bias;
      break;
    case WeightSlot::kPostAttentionLayernorm:
      target = &layer->post_attention_layernorm;
      break;
    case WeightSlot::kGateUpProj:
      target = &layer->gate_up_proj;
      break;
    case WeightSlot::kGateUpBias:
      target = &layer->gate_up_bias;
      break;
    case WeightSlot::kDownProj:
      target = &layer->down_proj;
      break;
    case WeightSlot::kDownBias:
      target = &layer->down_bias;
      break;
    case WeightSlot::kMlaQAProj:
    case WeightSlot::kMlaQALayernorm:
    case WeightSlot::kMlaQProj:
    case WeightSlot::kMlaKvAProj:
    case WeightSlot::kMlaKvALayernorm:
    case WeightSlot::kMlaKvBProj:
      target = internal::MlaSlotVector(layer, slot);  // weight_layout_mla.cc
      break;
    case WeightSlot::kQNorm:
    case WeightSlot::kKNorm:
    case WeightSlot::kRouter:
    case WeightSlot::kExpertsGateUp:
    case WeightSlot::kExpertsDown:
    case WeightSlot::kSharedGateUp:
    case WeightSlot::kSharedDown:
    case WeightSlot::kSharedExpertGate:
    case WeightSlot::kRouterBias:
      target = internal::FamilySlotVector(layer, slot);  // weight_layout_moe.cc
      break;
  }
  return target;
}

namespace internal {

float* SlotData(ModelWeights* w, const HfTensor& t) {
  return SlotVector(w, t.slot, t.layer)->data() + t.offset;
}

TensorRandomStream::TensorRandomStream(uint64_t seed, const HfTensor& tensor)
    : seed_(seed),
      stream_id_(DummyStreamId(tensor.name.c_str())),
      mean_(tensor.is_norm ? 1.0f : 0.0f) {}

void TensorRandomStream::Fill(float* out, int64_t count, int threads) {
  FillDummySliceParallel(seed_, stream_id_, mean_, DummySlice{count, 0, 1, position_, count}, out,
                         threads);
  position_ += count;
}

void FillDummySliceParallel(uint64_t seed, uint64_t stream_id, float mean, const DummySlice& slice,
                            float* out, int threads) {
  constexpr int64_t kMinChunk = int64_t{1} << 20;
  const bool by_rows = slice.num_rows > 1;
  const int64_t units = by_rows ? slice.num_rows : slice.num_cols;  // what chunks split
  const int64_t unit_values = by_rows ? slice.num_cols : 1;
  const int64_t chunks = std::min<int64_t>({threads, units, slice.numel() / kMinChunk});
  if (chunks <= 1) {
    FillDummySlice(seed, stream_id, mean, slice, out);
    return;
  }
  std::vector<std::thread> workers;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t begin = units * i / chunks, end = units * (i + 1) / chunks;
    DummySlice part = slice;
    if (by_rows) {
      part.row_begin += begin;
      part.num_rows = end - begin;
    } else {
      part.col_begin += begin;
      part.num_cols = end - begin;
    }
    float* dst = out + begin * unit_values;
    workers.emplace_back([=] { FillDummySlice(seed, stream_id, mean, part, dst); });
  }
  for (std::thread& w : workers) w.join();
}

int DummyDrawThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 32);
}

void FillDummySlice(uint64_t seed, uint64_t stream_id, float mean, const DummySlice& slice,
                    float* out) {
  for (int64_t r = 0; r < slice.num_rows; ++r) {
    // One row of the slice is a run of consecutive checkpoint indices [g, end).
    int64_t g = (slice.row_begin + r) * slice.cols + slice.col_begin;
    const int64_t end = g + slice.num_cols;
    float* dst = out + r * slice.num_cols;
    while (g < end) {
      float z[2];
      DummyPair(seed, stream_id, static_cast<uint64_t>(g) >> 1, mean, &z[0], &z[1]);
      for (int64_t k = g & 1; k < 2 && g < end; ++k, ++g) *dst++ = z[k];
    }
  }
}

}  // namespace internal
}  // namespace tandem::runtime
