#include "runtime/model/mtp_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/half.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_fp8.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using internal::HfTensor;
using json = nlohmann::json;

// One tensor of the MTP layer: its checkpoint name and shape, and where it lands.
struct MtpTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;
  bool optional = false;  // embed_tokens / shared_head.head: the model's when absent
  // Destination: a block tensor (layout entry of the one-layer config), or a named vector.
  const HfTensor* block = nullptr;
  std::vector<float>* vec = nullptr;
};

std::string LayerPrefix(const ModelConfig& config, int64_t index = 0) {
  return absl::StrCat("model.layers.", config.num_hidden_layers + index, ".");
}

// The one-layer block's layout (HfTensorLayout(MtpBlockConfig(config))) with its layer-0 tensors
// named as the checkpoint stores them, model.layers.{num_hidden_layers + index}.* (slots and
// offsets those of layer 0 of the block). `index` picks the MTP layer (0: the first).
std::vector<HfTensor> BlockLayout(const ModelConfig& config, int64_t index = 0) {
  std::vector<HfTensor> layout = internal::HfTensorLayout(MtpBlockConfig(config));
  const std::string p = LayerPrefix(config, index);
  for (HfTensor& t : layout) {
    if (t.layer == 0) t.name = p + t.name.substr(std::strlen("model.layers.0."));
  }
  return layout;
}

// The MTP layer's tensors in a fixed order (the order they are drawn and written in).
// `block_layout` is BlockLayout(config, index); destinations point into `w`.
std::vector<MtpTensor> MtpTensors(const ModelConfig& config,
                                  const std::vector<HfTensor>& block_layout, MtpWeights* w,
                                  int64_t index = 0) {
  const std::string p = LayerPrefix(config, index);
  const int64_t H = config.hidden_size, V = config.vocab_size;
  std::vector<MtpTensor> out;
  out.push_back({p + "enorm.weight", {H}, true, false, nullptr, &w->enorm});
  out.push_back({p + "hnorm.weight", {H}, true, false, nullptr, &w->hnorm});
  out.push_back({p + "eh_proj.weight", {H, 2 * H}, false, false, nullptr, &w->eh_proj});
  for (const HfTensor& t : block_layout) {
    if (t.layer != 0) continue;
    MtpTensor m;
    m.name = t.name;
    m.shape = t.shape;
    m.is_norm = t.is_norm;
    m.block = &t;
    out.push_back(std::move(m));
  }
  out.push_back({p + "shared_head.norm.weight", {H}, true, false, nullptr, &w->block.norm});
  out.push_back({p + "shared_head.head.weight", {V, H}, false, true, nullptr, &w->block.lm_head});
  out.push_back({p + "embed_tokens.weight", {V, H}, false, true, nullptr, &w->block.embed_tokens});
  return out;
}

float* Destination(const MtpTensor& t, MtpWeights* w) {
  return t.block != nullptr ? internal::SlotData(&w->block, *t.block) : t.vec->data();
}

void Allocate(const ModelConfig& config, MtpWeights* w) {
  const auto H = static_cast<size_t>(config.hidden_size);
  internal::AllocateModelWeights(MtpBlockConfig(config), &w->block);
  w->block.lm_head.assign(static_cast<size_t>(config.vocab_size) * H, 0.0f);
  w->enorm.assign(H, 0.0f);
  w->hnorm.assign(H, 0.0f);
  w->eh_proj.assign(2 * H * H, 0.0f);
}

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The checkpoint's files, by tensor name (single file or the index's shards).
struct Files {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const TensorInfo*> tensors;
};

absl::Status OpenFiles(const std::string& model_dir, Files* out) {
  const fs::path dir(model_dir);
  std::vector<std::string> names;
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors", ec)) {
    names.push_back("model.safetensors");
  } else {
    ASSIGN_OR_RETURN(std::string text, ReadText(dir / "model.safetensors.index.json"));
    const json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_dir, "/model.safetensors.index.json: no \"weight_map\" object"));
    }
    std::map<std::string, bool> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) continue;
      const std::string file = shard.get<std::string>();
      // Plain file names inside the directory only (LoadModelWeights checks the index fully).
      if (file.find('/') != std::string::npos || file == "..") {
        return absl::InvalidArgumentError(absl::StrCat("shard name '", file, "' is not plain"));
      }
      shards[file] = true;
    }
    for (const auto& [file, unused] : shards) names.push_back(file);
  }
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open((dir / name).string()));
    for (const TensorInfo& info : file->tensors()) out->tensors.emplace(info.name, &info);
    out->files.push_back(std::move(file));
  }
  return absl::OkStatus();
}

absl::Status Widen(const std::string& name, const TensorInfo& info,
                   const std::vector<int64_t>& shape, float* out) {
  if (info.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("MTP tensor '", name, "' has shape [",
                                                   absl::StrJoin(info.shape, ", "), "], expected [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (info.dtype == SafetensorsDtype::kF32) {
    std::memcpy(out, info.data, static_cast<size_t>(n) * 4);
    return absl::OkStatus();
  }
  if (info.dtype != SafetensorsDtype::kBF16 && info.dtype != SafetensorsDtype::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MTP tensor '", name, "' has dtype ", info.dtype_name, " (supported: F32, BF16, F16)"));
  }
  const bool bf16 = info.dtype == SafetensorsDtype::kBF16;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, info.data + 2 * i, 2);  // the mapping is not aligned
    out[i] = bf16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
  }
  return absl::OkStatus();
}

// The value RandomModelWeights would draw for a tensor of this name (dummy_draw.h).
void Draw(const MtpTensor& t, uint64_t seed, float* out) {
  HfTensor h;
  h.name = t.name;
  h.shape = t.shape;
  h.is_norm = t.is_norm;
  internal::TensorRandomStream(seed, h).Fill(out, h.numel(), internal::DummyDrawThreads());
}

}  // namespace

namespace internal {

std::vector<HfTensor> MtpLayerLayout(const ModelConfig& config, int64_t index) {
  MtpWeights unused;  // MtpTensors only takes addresses in it
  const std::vector<HfTensor> block = BlockLayout(config, index);
  std::vector<HfTensor> out;
  for (const MtpTensor& t : MtpTensors(config, block, &unused, index)) {
    if (t.optional) continue;  // embed_tokens / shared_head.head: the model's
    HfTensor h;
    h.name = t.name;
    h.shape = t.shape;
    h.is_norm = t.is_norm;
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace internal

ModelConfig MtpBlockConfig(const ModelConfig& config) {
  ModelConfig c = config;
  const bool moe = config.IsMoeLayer(config.num_hidden_layers);
  c.num_hidden_layers = 1;
  c.num_nextn_predict_layers = 0;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
  c.first_k_dense_replace = moe ? 0 : 1;
  if (!moe) c.mlp_only_layers.push_back(0);
  return c;
}

absl::StatusOr<MtpWeights> LoadMtpWeights(const std::string& model_dir, const ModelConfig& config) {
  if (config.num_nextn_predict_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative_method=mtp needs a model with an MTP layer: ", model_dir,
        "/config.json has num_nextn_predict_layers = ", config.num_nextn_predict_layers));
  }
  if (!config.IsMla()) {
    return absl::InvalidArgumentError(
        "MTP layers are supported for DeepSeek (MLA) checkpoints only");
  }
  Files files;
  RETURN_IF_ERROR(OpenFiles(model_dir, &files));
  MtpWeights w;
  Allocate(config, &w);
  const ModelConfig block_config = MtpBlockConfig(config);
  const std::vector<HfTensor> layout = BlockLayout(config);
  const std::vector<MtpTensor> tensors = MtpTensors(config, layout, &w);
  for (const MtpTensor& t : tensors) {
    if (t.optional || files.tensors.count(t.name) > 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "missing MTP tensor '", t.name, "' in ", model_dir,
        " (config.json says num_nextn_predict_layers = ", config.num_nextn_predict_layers,
        " but the checkpoint lacks that layer)"));
  }
  // An FP8 checkpoint's block (DeepSeek-V3 ships its MTP layer's projections and experts in
  // 128x128-block FP8, the glue and heads bf16) loads as the model's FP8 layers do: e4m3 codes
  // and scales kept (weight_fp8.h); the layout's names are the checkpoint's.
  const internal::FindTensor find = [&files](const std::string& name) -> const TensorInfo* {
    auto it = files.tensors.find(name);
    return it == files.tensors.end() ? nullptr : it->second;
  };
  RETURN_IF_ERROR(
      internal::CheckFp8Checkpoint(block_config, internal::FullTpDims(block_config), layout, find));
  for (const MtpTensor& t : tensors) {
    if (t.block != nullptr && internal::IsFp8Weight(block_config, *t.block)) continue;
    auto it = files.tensors.find(t.name);
    if (it == files.tensors.end()) continue;  // optional: the model's, below
    RETURN_IF_ERROR(Widen(t.name, *it->second, t.shape, Destination(t, &w)));
    if (t.vec == &w.block.embed_tokens) w.own_embed_tokens = true;
    if (t.vec == &w.block.lm_head) w.own_head = true;
  }
  internal::LoadFp8Weights(block_config, layout, find, &w.block);
  // The model's embedding and head stand in for copies the layer does not carry.
  const int64_t H = config.hidden_size, V = config.vocab_size;
  auto fallback = [&](std::vector<float>* dst, const char* name) -> absl::Status {
    auto it = files.tensors.find(name);
    if (it == files.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "' in ", model_dir));
    }
    return Widen(name, *it->second, {V, H}, dst->data());
  };
  if (!w.own_embed_tokens) {
    RETURN_IF_ERROR(fallback(&w.block.embed_tokens, "model.embed_tokens.weight"));
  }
  if (!w.own_head) {
    RETURN_IF_ERROR(fallback(&w.block.lm_head, config.tie_word_embeddings
                                                   ? "model.embed_tokens.weight"
                                                   : "lm_head.weight"));
  }
  return w;
}

MtpWeights RandomMtpWeights(const ModelConfig& config, const ModelWeights& model, uint64_t seed) {
  MtpWeights w;
  Allocate(config, &w);
  const std::vector<HfTensor> layout = BlockLayout(config);
  for (const MtpTensor& t : MtpTensors(config, layout, &w)) {
    if (!t.optional) Draw(t, seed, Destination(t, &w));
  }
  w.block.embed_tokens = model.embed_tokens;
  w.block.lm_head = model.lm_head.empty() ? model.embed_tokens : model.lm_head;
  return w;
}

MtpWeights RandomMtpWeights(const ModelConfig& config, uint64_t seed) {
  // Tensors are drawn by name (DummyStreamId), so a one-layer model with a small dense MLP draws
  // the same embedding and head; FP8 quantization leaves them alone.
  ModelConfig embed_and_head = config;
  embed_and_head.num_hidden_layers = 1;
  embed_and_head.first_k_dense_replace = 1;
  embed_and_head.intermediate_size = 16;
  embed_and_head.num_nextn_predict_layers = 0;
  embed_and_head.quantization = WeightQuantization();
  return RandomMtpWeights(config, RandomModelWeights(embed_and_head, seed), seed);
}

absl::Status AddMtpLayerToCheckpoint(const std::string& model_dir, const ModelConfig& config,
                                     uint64_t seed, bool own_embed_and_head) {
  const fs::path dir(model_dir);
  const std::string path = (dir / "model.safetensors").string();
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  MtpWeights scratch;
  const std::vector<HfTensor> layout = BlockLayout(config);
  const std::vector<MtpTensor> mtp = MtpTensors(config, layout, &scratch);
  std::vector<TensorSpec> specs;
  for (const TensorInfo& info : file->tensors())
    specs.push_back({info.name, info.dtype, info.shape});
  for (const MtpTensor& t : mtp) {
    if (!t.optional || own_embed_and_head)
      specs.push_back({t.name, SafetensorsDtype::kF32, t.shape});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   SafetensorsWriter::Create(path + ".mtp", specs));
  for (const TensorInfo& info : file->tensors()) {
    RETURN_IF_ERROR(writer->AppendBytes(info.data, info.nbytes));
  }
  for (const MtpTensor& t : mtp) {
    if (t.optional && !own_embed_and_head) continue;
    HfTensor h;
    h.shape = t.shape;
    std::vector<float> values(static_cast<size_t>(h.numel()));
    if (t.optional) {  // copies of the model's embedding / head
      const bool head = absl::StrContains(t.name, "shared_head");
      const char* source =
          head && !config.tie_word_embeddings ? "lm_head.weight" : "model.embed_tokens.weight";
      const TensorInfo* info = file->Find(source);
      if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat("no ", source));
      RETURN_IF_ERROR(Widen(source, *info, t.shape, values.data()));
    } else {
      Draw(t, seed, values.data());
    }
    RETURN_IF_ERROR(writer->AppendFloats(values.data(), h.numel()));
  }
  RETURN_IF_ERROR(writer->Finish());
  file.reset();
  std::error_code ec;
  fs::rename(path + ".mtp", path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", ec.message()));
  ASSIGN_OR_RETURN(std::string text, ReadText(dir / "config.json"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  j["num_nextn_predict_layers"] = 1;
  std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError("cannot write config.json");
  return absl::OkStatus();
}

bool IsMtpTensorName(absl::string_view name, const ModelConfig& config) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::ConsumePrefix(&name, kPrefix)) return false;
  const size_t dot = name.find('.');
  int64_t layer = -1;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer)) {
    return false;
  }
  return layer >= config.num_hidden_layers &&
         layer < config.num_hidden_layers + config.num_nextn_predict_layers;
}

}  // namespace tandem::runtime
