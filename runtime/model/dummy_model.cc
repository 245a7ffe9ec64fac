// RandomModelWeights and WriteDummyModel (declared in model_weights.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/checkpoint_read.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using internal::HfTensor;

SafetensorsDtype StorageDtype(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32:
      return SafetensorsDtype::kF32;
    case WeightDtype::kF16:
      return SafetensorsDtype::kF16;
    case WeightDtype::kBF16:
      return SafetensorsDtype::kBF16;
  }
  return SafetensorsDtype::kF32;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

// Removes weight files of an earlier run: a stale model.safetensors would shadow new shards.
absl::Status RemoveStaleWeights(const fs::path& dir) {
  static const std::regex kShard(R"(model-\d+-of-\d+\.safetensors(\.tmp)?)");
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        name == "model.safetensors.tmp" || std::regex_match(name, kShard)) {
      fs::remove(entry.path(), ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot remove ", entry.path().string()));
    }
  }
  if (ec)
    return absl::InternalError(absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Writes one shard. Its values are drawn in pieces of at most kPiece elements, `helpers` pieces
// at once (each value is a function of seed, tensor and index alone, so the bytes do not depend
// on `helpers`), and appended in file order: a few large shards (the hub's ~5 GB) use every core.
absl::Status WriteShard(const fs::path& path, const std::vector<const HfTensor*>& tensors,
                        SafetensorsDtype dtype, uint64_t seed, int helpers) {
  std::vector<TensorSpec> specs;
  for (const HfTensor* t : tensors) specs.push_back({t->name, dtype, t->shape});
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   SafetensorsWriter::Create(path.string(), std::move(specs)));
  constexpr int64_t kPiece = int64_t{1} << 20;
  struct Piece {
    const HfTensor* tensor;
    int64_t begin;
    int64_t count;
  };
  std::vector<Piece> pieces;
  for (const HfTensor* t : tensors) {
    for (int64_t begin = 0, total = t->numel(); begin < total; begin += kPiece) {
      pieces.push_back({t, begin, std::min(kPiece, total - begin)});
    }
  }
  std::vector<std::vector<float>> buffers(static_cast<size_t>(std::max(helpers, 1)));
  for (size_t first = 0; first < pieces.size(); first += buffers.size()) {
    const size_t n = std::min(buffers.size(), pieces.size() - first);
    RETURN_IF_ERROR(internal::RunTasks(n, helpers, [&](size_t i, int) {
      const Piece& piece = pieces[first + i];
      buffers[i].resize(static_cast<size_t>(piece.count));
      internal::TensorRandomStream stream(seed, *piece.tensor);
      stream.Seek(piece.begin);
      stream.Fill(buffers[i].data(), piece.count);
      return absl::OkStatus();
    }));
    for (size_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(writer->AppendFloats(buffers[i].data(), pieces[first + i].count));
    }
  }
  return writer->Finish();
}

std::string GenerationConfigJson(const ModelConfig& config) {
  nlohmann::ordered_json out;
  out["_from_model_config"] = true;
  out["bos_token_id"] = config.bos_token_id.has_value()
                            ? nlohmann::ordered_json(*config.bos_token_id)
                            : nlohmann::ordered_json(nullptr);
  if (config.eos_token_ids.size() == 1) {
    out["eos_token_id"] = config.eos_token_ids[0];
  } else if (config.eos_token_ids.empty()) {
    out["eos_token_id"] = nullptr;
  } else {
    out["eos_token_id"] = config.eos_token_ids;
  }
  return out.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<std::vector<DummyTensorFill>> DummyWeightPlan(const ModelConfig& config,
                                                             TpShard shard) {
  ASSIGN_OR_RETURN(TpDims dims, ComputeTpDims(config, shard));
  std::vector<DummyTensorFill> plan;
  for (const HfTensor& t : internal::HfTensorLayout(config, dims)) {
    if (!t.keep) continue;
    plan.push_back(DummyTensorFill{t.slot, t.layer, t.offset, t.slice(),
                                   DummyStreamId(t.name.c_str()), t.is_norm ? 1.0f : 0.0f});
  }
  return plan;
}

ModelWeights RandomModelWeights(const ModelConfig& config, uint64_t seed) {
  absl::StatusOr<ModelWeights> weights = RandomModelWeights(config, seed, TpShard{});
  return weights.ok() ? *std::move(weights) : ModelWeights();  // one rank always splits
}

absl::StatusOr<ModelWeights> RandomModelWeights(const ModelConfig& config, uint64_t seed,
                                                TpShard shard) {
  if (config.quantization.IsFp8()) {  // drawn in fp32, then quantized as the config says
    ModelConfig plain = config;
    plain.quantization = WeightQuantization();
    ASSIGN_OR_RETURN(ModelWeights weights, RandomModelWeights(plain, seed, shard));
    ASSIGN_OR_RETURN(const ModelConfig local,
                     LocalModelConfig(config, shard));  // the rank's widths
    // The checkpoint tensors' rows in their slots: 128 x 128 tiles restart at each.
    ASSIGN_OR_RETURN(const std::vector<DummyTensorFill> parts, DummyWeightPlan(plain, shard));
    RETURN_IF_ERROR(QuantizeWeightsFp8(local, &weights, parts));
    return weights;
  }
  ASSIGN_OR_RETURN(TpDims dims, ComputeTpDims(config, shard));
  ASSIGN_OR_RETURN(std::vector<DummyTensorFill> plan, DummyWeightPlan(config, shard));
  ModelWeights weights;
  internal::AllocateModelWeights(config, dims, &weights);
  const int threads = internal::DummyDrawThreads();
  for (const DummyTensorFill& fill : plan) {
    internal::FillDummySliceParallel(
        seed, fill.stream_id, fill.mean, fill.slice,
        SlotVector(&weights, fill.slot, fill.layer)->data() + fill.offset, threads);
  }
  return weights;
}

absl::Status WriteDummyModel(const ModelConfig& config, const std::string& out_dir, uint64_t seed,
                             int64_t shard_bytes, int threads) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  if (config.quantization.IsFp8()) {  // config.json would not say so (ModelConfigToJson)
    return absl::InvalidArgumentError(
        absl::StrCat("dummy checkpoints are written 16/32-bit; ", config.quantization.Describe(),
                     " weights are drawn at load only (--load_format=dummy)"));
  }
  if (shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_bytes must be positive, got ", shard_bytes));
  }
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  RETURN_IF_ERROR(RemoveStaleWeights(dir));

  const SafetensorsDtype dtype = StorageDtype(config.dtype);
  const int64_t item_size = dtype == SafetensorsDtype::kF32 ? 4 : 2;
  std::vector<HfTensor> layout = internal::HfTensorLayout(config);
  // DeepSeek's MTP layers (num_nextn_predict_layers) after the model's, drawn as RandomMtpWeights
  // draws them, so that --load_format=dummy and the written files speculate alike.
  for (int64_t i = 0; i < config.num_nextn_predict_layers; ++i) {
    for (HfTensor& t : internal::MtpLayerLayout(config, i)) layout.push_back(std::move(t));
  }
  // Greedy packing in layout order, so a layer's tensors stay together as in transformers' shards.
  std::vector<std::vector<const HfTensor*>> shards(1);
  int64_t shard_size = 0;
  int64_t total_size = 0;
  for (const HfTensor& t : layout) {
    const int64_t bytes = t.numel() * item_size;
    if (!shards.back().empty() && shard_size + bytes > shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(&t);
    shard_size += bytes;
    total_size += bytes;
  }

  // Shards are independent: one per thread, and the threads left over draw a shard's pieces.
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int writers = static_cast<int>(std::min(shards.size(), static_cast<size_t>(threads)));
  const int helpers = (threads + writers - 1) / writers;
  if (shards.size() == 1) {
    RETURN_IF_ERROR(WriteShard(dir / "model.safetensors", shards[0], dtype, seed, helpers));
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_size}};
    std::vector<std::string> names;
    std::map<std::string, std::string> weight_map;  // sorted by name, like transformers
    for (size_t i = 0; i < shards.size(); ++i) {
      names.push_back(absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size()));
      for (const HfTensor* t : shards[i]) weight_map[t->name] = names.back();
    }
    RETURN_IF_ERROR(internal::RunTasks(shards.size(), writers, [&](size_t i, int) {
      return WriteShard(dir / names[i], shards[i], dtype, seed, helpers);
    }));
    index["weight_map"] = weight_map;
    RETURN_IF_ERROR(WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  }
  RETURN_IF_ERROR(WriteText(dir / "generation_config.json", GenerationConfigJson(config)));
  return WriteText(dir / "config.json", ModelConfigToJson(config));
}

}  // namespace tandem::runtime
