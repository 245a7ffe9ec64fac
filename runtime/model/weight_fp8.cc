// FP8 checkpoints: checking and loading e4m3 weights with their scales (weight_fp8.h), and
// quantizing fp32 weights at load (QuantizeWeightsFp8).
#include "runtime/model/weight_fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "runtime/model/half.h"

namespace tandem::runtime {
namespace internal {
namespace {

using Method = WeightQuantization::Method;
constexpr int64_t kBlock = 128;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "model.layers.0.self_attn.q_proj." for "model.layers.0.self_attn.q_proj.weight".
std::string Prefix(const HfTensor& t) { return t.name.substr(0, t.name.size() - 6); }

bool Blocked(const ModelConfig& c) { return c.quantization.block_cols > 0; }

// The scale tensors of one FP8 weight: name and the shapes accepted for it.
struct ScaleSpec {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  bool input = false;  // the static activation scale
};

std::vector<ScaleSpec> ScaleSpecs(const ModelConfig& c, const HfTensor& t) {
  const int64_t n = t.shape[0], k = t.shape[1];
  const std::string p = Prefix(t);
  const std::vector<int64_t> blocks = {CeilDiv(n, kBlock), CeilDiv(k, kBlock)};
  std::vector<ScaleSpec> out;
  switch (c.quantization.method) {
    case Method::kFp8Block:
      out.push_back({p + "weight_scale_inv", {blocks}});
      break;
    case Method::kCompressedTensors:
      if (Blocked(c)) {
        out.push_back({p + "weight_scale", {blocks}});
      } else if (c.quantization.block_rows == 1) {
        out.push_back({p + "weight_scale", {{n, 1}, {n}}});
      } else {
        out.push_back({p + "weight_scale", {{1}, {}}});
      }
      break;
    case Method::kModelOpt:
      if (Blocked(c)) {  // FP8_PB_WO: modelopt writes [row blocks, 1, column blocks, 1]
        out.push_back({p + "weight_scale", {blocks, {blocks[0], 1, blocks[1], 1}}});
      } else if (c.quantization.block_rows == 1) {  // FP8_PER_CHANNEL_PER_TOKEN
        out.push_back({p + "weight_scale", {{n}, {n, 1}}});
      } else {
        out.push_back({p + "weight_scale", {{}, {1}}});
      }
      break;
    case Method::kNone:
    case Method::kOnlineFp8:
      break;
  }
  if (c.quantization.activation == kernels::Fp8ActivationScheme::kStaticTensor) {
    out.push_back({p + "input_scale", {{}, {1}}, true});
  }
  return out;
}

float ScaleAt(const TensorInfo& info, int64_t i) {
  if (info.dtype == SafetensorsDtype::kF32) {
    float v;
    std::memcpy(&v, info.data + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, info.data + 2 * i, 2);
  return info.dtype == SafetensorsDtype::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status CheckScale(const ScaleSpec& spec, const HfTensor& weight, const FindTensor& find) {
  const TensorInfo* info = find(spec.name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing scale tensor '", spec.name, "' (expected shape ",
                     ShapeString(spec.shapes[0]), ") of FP8 weight '", weight.name, "'"));
  }
  if (std::find(spec.shapes.begin(), spec.shapes.end(), info->shape) == spec.shapes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale tensor '", spec.name, "' has shape ", ShapeString(info->shape), ", expected ",
        ShapeString(spec.shapes[0]),
        weight.shape.empty() ? std::string(" (a per-tensor KV scale)")
                             : absl::StrCat(" for weight ", ShapeString(weight.shape))));
  }
  if (info->dtype == SafetensorsDtype::kOther) {
    return absl::InvalidArgumentError(absl::StrCat("scale tensor '", spec.name, "' has dtype ",
                                                   info->dtype_name, " (F32, BF16 or F16)"));
  }
  for (int64_t i = 0; i < NumElements(info->shape); ++i) {
    const float v = ScaleAt(*info, i);
    if (!(v > 0.0f) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("scale tensor '", spec.name, "' holds ", v,
                                                     " at ", i,
                                                     " (scales must be positive and finite)"));
    }
  }
  return absl::OkStatus();
}

// A block-scaled weight's TP slice must not cut a 128-block.
absl::Status CheckBlockSlice(const HfTensor& t, const TpDims& dims) {
  if (t.slice_dim < 0) return absl::OkStatus();
  const int64_t end = t.slice_begin + t.slice_count, extent = t.shape[t.slice_dim];
  if (t.slice_begin % kBlock == 0 && (end % kBlock == 0 || end == extent)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tp=", dims.shard.size, " cuts the 128x128 FP8 scale blocks of '", t.name, "' (rank ",
      dims.shard.rank, " would keep ", t.slice_dim == 0 ? "rows" : "columns", " [", t.slice_begin,
      ", ", end, ") of ", extent, "): choose a TP size that splits it on multiples of 128"));
}

// Local rows / columns of the rank's part of `t`, and the row it starts at in the fused slot.
struct LocalPart {
  int64_t rows, cols, row_offset;
};
LocalPart PartOf(const HfTensor& t) {
  const int64_t rows = t.slice_dim == 0 ? t.slice_count : t.shape[0];
  const int64_t cols = t.slice_dim == 1 ? t.slice_count : t.shape[1];
  return {rows, cols, cols == 0 ? 0 : t.offset / cols};
}

// Copies the rank's codes and per-row scales of `t` into `slot` (sized already).
void FillPart(const ModelConfig& c, const HfTensor& t, const FindTensor& find,
              Fp8LinearWeight* slot) {
  const LocalPart part = PartOf(t);
  const TensorInfo& codes = *find(t.name);
  const int64_t k = t.shape[1];
  const int64_t row0 = t.slice_dim == 0 ? t.slice_begin : 0;
  const int64_t col0 = t.slice_dim == 1 ? t.slice_begin : 0;
  for (int64_t r = 0; r < part.rows; ++r) {
    std::memcpy(slot->codes.data() + (part.row_offset + r) * part.cols,
                codes.data + (row0 + r) * k + col0, static_cast<size_t>(part.cols));
  }
  const std::vector<ScaleSpec> specs = ScaleSpecs(c, t);
  const TensorInfo& scale = *find(specs[0].name);
  const int64_t grid_cols = slot->grid.GridCols();
  const int64_t scales = NumElements(scale.shape);
  for (int64_t r = 0; r < part.rows; ++r) {
    const int64_t row = row0 + r;
    for (int64_t b = 0; b < grid_cols; ++b) {
      int64_t i = 0;  // per-tensor
      if (Blocked(c)) {
        i = (row / kBlock) * CeilDiv(k, kBlock) + col0 / kBlock + b;
      } else if (scales > 1) {
        i = row;  // per-channel
      }
      slot->scales[(part.row_offset + r) * grid_cols + b] = ScaleAt(scale, i);
    }
  }
  if (specs.size() > 1) {
    slot->input_scale = std::max(slot->input_scale, ScaleAt(*find(specs[1].name), 0));
  }
}

// The first of `config`'s ignore entries that matches module `name` ("" when none): equal names,
// or "re:" regexes matched from the name's start (Python's re.match, as compressed-tensors does).
std::string IgnoredBy(const ModelConfig& config, const std::vector<std::regex>& patterns,
                      const std::string& name) {
  size_t regex = 0;
  for (const std::string& entry : config.quantization.ignore) {
    if (entry.rfind("re:", 0) != 0) {
      if (entry == name) return entry;
      continue;
    }
    if (std::regex_search(name, patterns[regex++], std::regex_constants::match_continuous)) {
      return entry;
    }
  }
  return "";
}

// No ignore entry names a projection the FP8 path reads as e4m3 (a partly FP8 decoder).
absl::Status CheckIgnored(const ModelConfig& config, const std::vector<HfTensor>& layout) {
  if (config.quantization.ignore.empty()) return absl::OkStatus();
  std::vector<std::regex> patterns;
  for (const std::string& entry : config.quantization.ignore) {
    if (entry.rfind("re:", 0) == 0) patterns.emplace_back(entry.substr(3));  // checked at parse
  }
  for (const HfTensor& t : layout) {
    if (!IsFp8Weight(config, t)) continue;
    const std::string module = t.name.substr(0, t.name.size() - 7);  // less ".weight"
    const std::string entry = IgnoredBy(config, patterns, module);
    if (entry.empty()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization_config's ignore list leaves '", module, "' unquantized (entry '", entry,
        "'), but its weight is read as FP8 (", config.quantization.Describe(),
        "): a partly FP8 decoder is not supported; only lm_head and the MoE router gates may "
        "stay 16-bit"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsFp8Slot(WeightSlot slot) {
  switch (slot) {
    case WeightSlot::kQkvProj:
    case WeightSlot::kOProj:
    case WeightSlot::kGateUpProj:
    case WeightSlot::kDownProj:
    case WeightSlot::kExpertsGateUp:
    case WeightSlot::kExpertsDown:
    case WeightSlot::kSharedGateUp:
    case WeightSlot::kSharedDown:
    case WeightSlot::kMlaQAProj:
    case WeightSlot::kMlaQProj:
    case WeightSlot::kMlaKvAProj:
    case WeightSlot::kMlaKvBProj:
      return true;
    default:  // embeddings, norms, lm_head, the router and Qwen2-MoE's shared-expert gate
      return false;
  }
}

bool IsFp8Weight(const ModelConfig& config, const HfTensor& t) {
  return config.quantization.FromCheckpoint() && IsFp8Slot(t.slot) && t.shape.size() == 2;
}

Fp8LinearWeight* Fp8SlotOf(LayerWeights* layer, WeightSlot slot) {
  switch (slot) {
    case WeightSlot::kQkvProj:
      return &layer->qkv_fp8;
    case WeightSlot::kOProj:
      return &layer->o_fp8;
    case WeightSlot::kGateUpProj:
      return &layer->gate_up_fp8;
    case WeightSlot::kDownProj:
      return &layer->down_fp8;
    case WeightSlot::kExpertsGateUp:
      return &layer->experts_gate_up_fp8;
    case WeightSlot::kExpertsDown:
      return &layer->experts_down_fp8;
    case WeightSlot::kSharedGateUp:
      return &layer->shared_gate_up_fp8;
    case WeightSlot::kSharedDown:
      return &layer->shared_down_fp8;
    case WeightSlot::kMlaQAProj:
      return &layer->q_a_fp8;
    case WeightSlot::kMlaQProj:
      return &layer->q_fp8;
    case WeightSlot::kMlaKvAProj:
      return &layer->kv_a_fp8;
    case WeightSlot::kMlaKvBProj:
      return &layer->kv_b_fp8;
    default:
      return nullptr;
  }
}

std::vector<std::string> KvScaleTensorNames(const ModelConfig& config,
                                            const std::vector<HfTensor>& layout) {
  std::vector<std::string> names;
  if (!config.quantization.kv_cache_fp8) return names;
  std::set<std::string> attention;  // "model.layers.3.self_attn." of every layer in `layout`
  for (const HfTensor& t : layout) {
    const size_t at = t.name.find(".self_attn.");
    if (at != std::string::npos) attention.insert(t.name.substr(0, at + 11));
  }
  for (const std::string& p : attention) {
    for (const char* suffix :
         {"k_proj.k_scale", "v_proj.v_scale", "k_scale", "v_scale", "kv_scale"}) {
      names.push_back(p + suffix);
    }
  }
  return names;
}

void LoadKvScales(const ModelConfig& config, const std::vector<HfTensor>& layout,
                  const FindTensor& find, ModelWeights* weights) {
  if (!config.quantization.kv_cache_fp8) return;
  std::map<std::string, int64_t> attention;  // "model.layers.3.self_attn." -> 3
  for (const HfTensor& t : layout) {
    const size_t at = t.name.find(".self_attn.");
    if (at != std::string::npos && t.layer >= 0)
      attention.emplace(t.name.substr(0, at + 11), t.layer);
  }
  auto first = [&find](const std::string& p, std::initializer_list<const char*> suffixes) {
    for (const char* s : suffixes) {
      if (const TensorInfo* info = find(p + s); info != nullptr) return ScaleAt(*info, 0);
    }
    return 0.0f;
  };
  for (const auto& [prefix, layer] : attention) {
    if (layer >= static_cast<int64_t>(weights->layers.size())) continue;
    LayerWeights& l = weights->layers[layer];
    l.kv_k_scale = first(prefix, {"k_proj.k_scale", "k_scale", "kv_scale"});
    l.kv_v_scale = first(prefix, {"v_proj.v_scale", "v_scale", "kv_scale"});
  }
}

std::vector<std::string> Fp8ScaleTensorNames(const ModelConfig& config,
                                             const std::vector<HfTensor>& layout) {
  std::vector<std::string> names = KvScaleTensorNames(config, layout);
  for (const HfTensor& t : layout) {
    if (!IsFp8Weight(config, t)) continue;
    for (const ScaleSpec& s : ScaleSpecs(config, t)) names.push_back(s.name);
  }
  return names;
}

absl::Status CheckFp8Checkpoint(const ModelConfig& config, const TpDims& dims,
                                const std::vector<HfTensor>& layout, const FindTensor& find) {
  RETURN_IF_ERROR(CheckIgnored(config, layout));
  for (const std::string& name : KvScaleTensorNames(config, layout)) {
    if (find(name) == nullptr) continue;  // optional: the KV pool does not use them
    RETURN_IF_ERROR(CheckScale({name, {{}, {1}}}, HfTensor{name, {}}, find));
  }
  for (const HfTensor& t : layout) {
    if (!IsFp8Weight(config, t)) continue;
    const TensorInfo* info = find(t.name);
    if (info != nullptr && info->dtype_name != "F8_E4M3") {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has dtype ",
                                                     info->dtype_name, ", expected F8_E4M3 (",
                                                     config.quantization.Describe(), ")"));
    }
    for (const ScaleSpec& s : ScaleSpecs(config, t)) RETURN_IF_ERROR(CheckScale(s, t, find));
    if (Blocked(config)) RETURN_IF_ERROR(CheckBlockSlice(t, dims));
  }
  return absl::OkStatus();
}

void LoadFp8Weights(const ModelConfig& config, const std::vector<HfTensor>& layout,
                    const FindTensor& find, ModelWeights* weights) {
  // First the fused slots' sizes (every part of a slot has the same local columns).
  std::map<std::pair<int64_t, WeightSlot>, LocalPart> sizes;
  for (const HfTensor& t : layout) {
    if (!t.keep || !IsFp8Weight(config, t)) continue;
    const LocalPart part = PartOf(t);
    LocalPart& size =
        sizes.try_emplace({t.layer, t.slot}, LocalPart{0, part.cols, 0}).first->second;
    size.rows = std::max(size.rows, part.row_offset + part.rows);
  }
  for (const auto& [key, size] : sizes) {
    Fp8LinearWeight* slot = Fp8SlotOf(&weights->layers[key.first], key.second);
    slot->grid = {size.rows, size.cols, 1, Blocked(config) ? kBlock : size.cols};
    slot->codes.assign(static_cast<size_t>(size.rows * size.cols), 0);
    slot->scales.assign(static_cast<size_t>(slot->grid.NumScales()), 0.0f);
    slot->activation = config.quantization.activation;
    slot->input_scale = 0.0f;
  }
  for (const HfTensor& t : layout) {
    if (!t.keep || !IsFp8Weight(config, t)) continue;
    FillPart(config, t, find, Fp8SlotOf(&weights->layers[t.layer], t.slot));
  }
  LoadKvScales(config, layout, find, weights);
  // kv_b_proj is used absorbed (W_UK / W_UV inside the latent attention), so it is widened once
  // here, as vLLM's MLA does (get_and_maybe_dequant_weights(kv_b_proj)); it is small (32 MB per
  // DeepSeek-V3 layer in fp8).
  for (LayerWeights& layer : weights->layers) {
    if (layer.kv_b_fp8.empty()) continue;
    layer.kv_b_proj.resize(
        static_cast<size_t>(layer.kv_b_fp8.grid.rows * layer.kv_b_fp8.grid.cols));
    kernels::cpu::DequantizeFp8Weight(layer.kv_b_fp8.View(), 0, layer.kv_b_fp8.grid.rows,
                                      layer.kv_b_proj.data());
    layer.kv_b_fp8 = Fp8LinearWeight();
  }
}

std::vector<Fp8ScalePart> Fp8ScaleParts(const ModelConfig& config, const HfTensor& t,
                                        const FindTensor& find) {
  std::vector<Fp8ScalePart> parts;
  for (const ScaleSpec& spec : ScaleSpecs(config, t)) {
    const TensorInfo& info = *find(spec.name);
    Fp8ScalePart part;
    part.spec = {spec.name, info.dtype, info.shape};
    const int64_t item = info.nbytes / std::max<int64_t>(1, NumElements(info.shape));
    const char* data = reinterpret_cast<const char*>(info.data);
    const bool sliced = !spec.input && t.slice_dim >= 0 && NumElements(info.shape) > 1;
    if (!sliced) {
      part.bytes.assign(data, info.nbytes);
    } else if (Blocked(config)) {  // [row blocks, column blocks]: blocks of the slice
      const int64_t b0 = t.slice_begin / kBlock;
      const int64_t b1 = CeilDiv(t.slice_begin + t.slice_count, kBlock);
      // (modelopt's [row blocks, 1, column blocks, 1] is the same bytes; the rank file gets 2-D)
      const int64_t rows = info.shape[0], cols = NumElements(info.shape) / rows;
      if (t.slice_dim == 0) {
        part.spec.shape = {b1 - b0, cols};
        part.bytes.assign(data + b0 * cols * item, (b1 - b0) * cols * item);
      } else {
        part.spec.shape = {rows, b1 - b0};
        for (int64_t r = 0; r < rows; ++r) {
          part.bytes.append(data + (r * cols + b0) * item, (b1 - b0) * item);
        }
      }
    } else if (t.slice_dim == 0) {  // per-channel: the slice's rows
      part.spec.shape[0] = t.slice_count;
      part.bytes.assign(data + t.slice_begin * item, t.slice_count * item);
    } else {  // per-channel, column slice: every row keeps its scale
      part.bytes.assign(data, info.nbytes);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace internal

kernels::Fp8ScaleGrid Fp8QuantizedGrid(const WeightQuantization& q, int64_t n, int64_t k) {
  return {n, k, 1, q.block_cols > 0 ? internal::kBlock : k};
}

bool Fp8QuantizesTiles(const WeightQuantization& q) {
  return q.block_rows == internal::kBlock && q.block_cols == internal::kBlock;
}

namespace {

// One fp32 weight QuantizeWeightsFp8 quantizes: its FP8 slot, input width (k; the rows follow
// from the size) and checkpoint slot (where `parts` place its tensors).
struct QuantizedSlot {
  std::vector<float>* fp32;
  Fp8LinearWeight* fp8;
  int64_t k;
  WeightSlot slot;
};

std::vector<QuantizedSlot> SlotsOf(const ModelConfig& config, LayerWeights& layer) {
  const int64_t h = config.hidden_size;
  auto cols = [h](const std::vector<float>& w) { return static_cast<int64_t>(w.size()) / h; };
  return {
      {&layer.qkv_proj, &layer.qkv_fp8, h, WeightSlot::kQkvProj},
      {&layer.o_proj, &layer.o_fp8, cols(layer.o_proj), WeightSlot::kOProj},
      {&layer.gate_up_proj, &layer.gate_up_fp8, h, WeightSlot::kGateUpProj},
      {&layer.down_proj, &layer.down_fp8, cols(layer.down_proj), WeightSlot::kDownProj},
      // MoE: the stacked experts ([E * 2 * Ie, H], [E * H, Ie]: per-row scales, so each
      // expert's rows are its own weight) and the shared experts; the router stays 16-bit.
      {&layer.experts_gate_up, &layer.experts_gate_up_fp8, h, WeightSlot::kExpertsGateUp},
      {&layer.experts_down, &layer.experts_down_fp8, config.moe_intermediate_size,
       WeightSlot::kExpertsDown},
      {&layer.shared_gate_up, &layer.shared_gate_up_fp8, h, WeightSlot::kSharedGateUp},
      {&layer.shared_down, &layer.shared_down_fp8, std::max<int64_t>(1, cols(layer.shared_down)),
       WeightSlot::kSharedDown},
      // MLA (DeepSeek-V3's FP8 checkpoints: every projection of the decoder e4m3).
      {&layer.q_a_proj, &layer.q_a_fp8, h, WeightSlot::kMlaQAProj},
      {&layer.q_proj, &layer.q_fp8, config.q_lora_rank > 0 ? config.q_lora_rank : h,
       WeightSlot::kMlaQProj},
      {&layer.kv_a_proj, &layer.kv_a_fp8, h, WeightSlot::kMlaKvAProj},
      {&layer.kv_b_proj, &layer.kv_b_fp8, config.kv_lora_rank, WeightSlot::kMlaKvBProj},
  };
}

// Quantizes w [rows, k] into fp8 (grid set): per row, or in 128 x 128 tiles restarting at each
// row of `starts` (sorted, the first 0), each tile's scale held by its rows.
void QuantizeSlot(const WeightQuantization& q, const float* w, int64_t rows, int64_t k,
                  const std::vector<int64_t>& starts, Fp8LinearWeight* fp8) {
  fp8->grid = Fp8QuantizedGrid(q, rows, k);
  fp8->codes.resize(static_cast<size_t>(rows * k));
  fp8->scales.resize(static_cast<size_t>(fp8->grid.NumScales()));
  fp8->activation = q.activation;
  if (!Fp8QuantizesTiles(q)) {
    kernels::QuantizeWeight(w, fp8->grid, fp8->codes.data(), fp8->scales.data());
    return;
  }
  const int64_t groups = fp8->grid.GridCols();
  std::vector<float> tiles;
  for (size_t p = 0; p < starts.size(); ++p) {
    const int64_t r0 = starts[p], r1 = p + 1 < starts.size() ? starts[p + 1] : rows;
    const kernels::Fp8ScaleGrid grid{r1 - r0, k, internal::kBlock, internal::kBlock};
    tiles.resize(static_cast<size_t>(grid.NumScales()));
    kernels::QuantizeWeight(w + r0 * k, grid, fp8->codes.data() + r0 * k, tiles.data());
    for (int64_t r = r0; r < r1; ++r) {
      std::copy_n(tiles.data() + (r - r0) / internal::kBlock * groups, groups,
                  fp8->scales.data() + r * groups);
    }
  }
}

}  // namespace

absl::Status QuantizeWeightsFp8(const ModelConfig& config, ModelWeights* weights) {
  return QuantizeWeightsFp8(config, weights, {});
}

absl::Status QuantizeWeightsFp8(const ModelConfig& config, ModelWeights* weights,
                                const std::vector<DummyTensorFill>& parts) {
  const WeightQuantization& q = config.quantization;
  if (!q.IsFp8()) return absl::OkStatus();
  if (q.activation == kernels::Fp8ActivationScheme::kStaticTensor) {
    return absl::InvalidArgumentError(
        "static FP8 activation scales come from calibration: weights quantized at load (dummy "
        "or --quantization=fp8) need a dynamic scheme");
  }
  for (size_t l = 0; l < weights->layers.size(); ++l) {
    LayerWeights& layer = weights->layers[l];
    for (const QuantizedSlot& s : SlotsOf(config, layer)) {
      if (s.fp32->empty()) continue;
      const int64_t size = static_cast<int64_t>(s.fp32->size());
      if (s.k <= 0 || size % s.k != 0) {
        return absl::InvalidArgumentError(absl::StrCat("FP8 quantization at load: a weight of ",
                                                       size, " elements is not rows of ", s.k));
      }
      std::vector<int64_t> starts = {0};
      for (const DummyTensorFill& f : parts) {
        if (f.slot == s.slot && f.layer == static_cast<int64_t>(l) && f.offset > 0) {
          starts.push_back(f.offset / s.k);
        }
      }
      std::sort(starts.begin(), starts.end());
      starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
      QuantizeSlot(q, s.fp32->data(), size / s.k, s.k, starts, s.fp8);
      if (s.slot == WeightSlot::kMlaKvBProj) {  // used absorbed: widened as the loader does
        kernels::cpu::DequantizeFp8Weight(s.fp8->View(), 0, size / s.k, s.fp32->data());
        *s.fp8 = Fp8LinearWeight();
        continue;
      }
      std::vector<float>().swap(*s.fp32);
    }
  }
  return QuantizeLmHeadFp8(config, weights);
}

WeightQuantization LmHeadFp8Scheme(const WeightQuantization& q) {
  WeightQuantization head = q;
  head.block_rows = 1;
  head.block_cols = 0;
  // A weight-only model's head stays weight-only; any other's takes its input per token.
  if (q.activation != kernels::Fp8ActivationScheme::kNone) {
    head.activation = kernels::Fp8ActivationScheme::kDynamicToken;
  }
  return head;
}

absl::Status QuantizeLmHeadFp8(const ModelConfig& config, ModelWeights* weights) {
  if (!config.quantization.lm_head || !weights->lm_head_fp8.empty()) return absl::OkStatus();
  // Untied: the head's own rows, freed after; tied: a copy of the embedding's.
  std::vector<float>& src = weights->lm_head.empty() ? weights->embed_tokens : weights->lm_head;
  const int64_t h = config.hidden_size, size = static_cast<int64_t>(src.size());
  if (h <= 0 || size == 0 || size % h != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FP8 lm_head at load: ", size, " head elements are not rows of ", h));
  }
  QuantizeSlot(LmHeadFp8Scheme(config.quantization), src.data(), size / h, h, {0},
               &weights->lm_head_fp8);
  std::vector<float>().swap(weights->lm_head);
  return absl::OkStatus();
}

}  // namespace tandem::runtime
