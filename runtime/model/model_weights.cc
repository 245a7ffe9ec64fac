// LoadModelWeights: safetensors checkpoint (single file or sharded) -> fp32 ModelWeights.
#include "runtime/model/model_weights.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/model/checkpoint_read.h"
#include "runtime/model/mtp_weights.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_fp8.h"
#include "runtime/model/weight_layout.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;
using internal::HfTensor;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Where a tensor was found: for error messages.
struct Found {
  const TensorInfo* info = nullptr;
  const SafetensorsFile* file = nullptr;
};

struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, Found> tensors;  // sorted: errors come out in a stable order
};

absl::Status AddFile(std::unique_ptr<SafetensorsFile> file, Checkpoint* checkpoint) {
  for (const TensorInfo& info : file->tensors()) {
    auto [it, inserted] = checkpoint->tensors.emplace(info.name, Found{&info, file.get()});
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "' appears in both ",
                                                     it->second.file->path(), " and ",
                                                     file->path()));
    }
  }
  checkpoint->files.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status OpenSharded(const fs::path& dir, const std::string& index_path,
                         Checkpoint* checkpoint) {
  ASSIGN_OR_RETURN(std::string text, ReadText(index_path));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::vector<std::string>> shards;  // file -> tensors it should hold
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry of '", it.key(), "' is not a file name"));
    }
    const std::string shard = it.value().get<std::string>();
    // A plain file name inside the model directory: an index must not reach elsewhere.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": shard name '", shard, "' of '",
                                                     it.key(), "' is not a plain file name"));
    }
    shards[shard].push_back(it.key());
  }
  for (const auto& [shard, names] : shards) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open((dir / shard).string()));
    for (const std::string& name : names) {
      if (file->Find(name) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, " lists tensor '", name, "' in ",
                                                       shard, " but it is not there"));
      }
    }
    RETURN_IF_ERROR(AddFile(std::move(file), checkpoint));
  }
  return absl::OkStatus();
}

absl::Status OpenCheckpoint(const std::string& model_dir, Checkpoint* checkpoint) {
  const fs::path dir(model_dir);
  const std::string single = (dir / "model.safetensors").string();
  const std::string index = (dir / "model.safetensors.index.json").string();
  std::error_code ec;
  // transformers prefers the single file when both exist; so do we.
  if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    return AddFile(std::move(file), checkpoint);
  }
  if (fs::exists(index, ec)) return OpenSharded(dir, index, checkpoint);
  std::string hint;
  if (fs::exists(dir / "pytorch_model.bin", ec) ||
      fs::exists(dir / "pytorch_model.bin.index.json", ec)) {
    hint = " (pytorch_model.bin checkpoints are not supported: convert them to safetensors)";
  }
  return absl::NotFoundError(
      absl::StrCat("no model.safetensors or model.safetensors.index.json in ", model_dir, hint));
}

bool IsIgnoredBuffer(absl::string_view name) {
  // Older transformers saved RoPE's inverse frequencies; they are recomputed from the config.
  return absl::EndsWith(name, "rotary_emb.inv_freq");
}

absl::Status CheckTensor(const HfTensor& expected, const Found& found, bool fp8) {
  const TensorInfo& info = *found.info;
  if (info.shape != expected.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", expected.name, "' has shape ", ShapeString(info.shape), " in ",
                     found.file->path(), ", expected ", ShapeString(expected.shape)));
  }
  if (info.dtype == SafetensorsDtype::kOther && !fp8) {  // FP8 dtypes: weight_fp8.cc
    return absl::InvalidArgumentError(absl::StrCat("tensor '", expected.name,
                                                   "' has unsupported dtype '", info.dtype_name,
                                                   "' (supported: F32, BF16, F16)"));
  }
  return absl::OkStatus();
}

// Every tensor of `layout` is in `checkpoint` with its shape and a dtype we convert; nothing
// else is (see LoadModelWeights).
absl::Status CheckCheckpoint(const Checkpoint& checkpoint, const std::vector<HfTensor>& layout,
                             const ModelConfig& config, const std::string& where) {
  std::map<std::string, const HfTensor*> expected;
  for (const HfTensor& t : layout) expected.emplace(t.name, &t);
  for (const std::string& name : internal::Fp8ScaleTensorNames(config, layout)) {
    expected.emplace(name, nullptr);  // checked by CheckFp8Checkpoint
  }
  std::vector<std::string> missing;
  for (const HfTensor& t : layout) {
    auto it = checkpoint.tensors.find(t.name);
    if (it == checkpoint.tensors.end()) {
      missing.push_back(absl::StrCat("'", t.name, "' (expected shape ", ShapeString(t.shape), ")"));
      continue;
    }
    RETURN_IF_ERROR(CheckTensor(t, it->second, internal::IsFp8Weight(config, t)));
  }
  if (!missing.empty()) {
    std::string more =
        missing.size() > 1 ? absl::StrCat(" and ", missing.size() - 1, " more") : std::string();
    return absl::InvalidArgumentError(
        absl::StrCat("missing tensor ", missing[0], more, " in ", where));
  }
  int64_t mtp_tensors = 0;
  for (const auto& [name, found] : checkpoint.tensors) {
    if (expected.count(name) > 0 || IsIgnoredBuffer(name)) continue;
    if (IsMtpTensorName(name, config)) {  // loaded by LoadMtpWeights when speculating with it
      ++mtp_tensors;
      continue;
    }
    const std::vector<int64_t>& shape = found.info->shape;
    if (name == "lm_head.weight" && config.tie_word_embeddings) {
      // Some exporters store the tied head anyway; it must at least be the embedding's twin.
      const std::vector<int64_t> embedding = {config.vocab_size, config.hidden_size};
      if (shape == embedding) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor 'lm_head.weight' has shape ", ShapeString(shape), " in ", found.file->path(),
          ", expected ", ShapeString(embedding), " (tied to model.embed_tokens.weight)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected tensor '", name, "' with shape ", ShapeString(shape), " in ",
        found.file->path(), " (not part of ", config.architecture, " with this config)"));
  }
  if (mtp_tensors > 0) {
    std::fprintf(stderr,
                 "LoadModelWeights: ignoring the MTP layer model.layers.%lld (%lld tensors; "
                 "num_nextn_predict_layers = %lld; --speculative_method=mtp loads it)\n",
                 static_cast<long long>(config.num_hidden_layers),
                 static_cast<long long>(mtp_tensors),
                 static_cast<long long>(config.num_nextn_predict_layers));
  }
  return absl::OkStatus();
}

// The rank directory of a pre-sharded checkpoint.
std::string RankDir(int rank, int size) { return absl::StrCat("rank-", rank, "-of-", size); }

// A pre-sharded checkpoint's manifest: nullopt when `model_dir` has none.
struct PreSharding {
  int tp = 0;
  int dcp = 0;
};
absl::StatusOr<std::optional<PreSharding>> ReadPreSharding(const std::string& model_dir) {
  const fs::path path = fs::path(model_dir) / kPreShardedManifest;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  ASSIGN_OR_RETURN(std::string text, ReadText(path.string()));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto int_field = [&](const char* key) -> int {
    auto it = j.is_object() ? j.find(key) : j.end();
    return it != j.end() && it->is_number_integer() ? it->get<int>() : 0;
  };
  PreSharding p{int_field("tp"), int_field("dcp")};
  if (p.tp < 1 || p.dcp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": needs integer \"tp\" and \"dcp\" >= 1"));
  }
  return p;
}

// The rank's part of every tensor as a whole tensor of its own: what a pre-sharded rank file
// holds (parts a rank does not keep are not in it).
std::vector<HfTensor> LocalLayout(const std::vector<HfTensor>& layout) {
  std::vector<HfTensor> out;
  for (HfTensor t : layout) {
    if (!t.keep) continue;
    if (t.slice_dim >= 0) t.shape[t.slice_dim] = t.slice_count;
    t.slice_dim = -1;
    out.push_back(std::move(t));
  }
  return out;
}

// A load of more than 1 GiB says on stderr how long the rank's fp32 allocation and its reads took
// (issue 31: where a large model's start goes); `sink`: a 16-bit stream (no fp32 allocation), the
// reads including the sink's copies.
void ReportLargeLoad(const TpShard& shard, int64_t read_bytes, size_t files, int threads,
                     Clock::time_point start, Clock::time_point allocated, bool sink = false) {
  if (read_bytes < (int64_t{1} << 30)) return;
  const double alloc_s = std::chrono::duration<double>(allocated - start).count();
  const double read_s = std::chrono::duration<double>(Clock::now() - allocated).count();
  const std::string after =
      sink ? std::string(" into 16-bit chunks (no fp32 host copy)")
           : absl::StrFormat(" after allocating its fp32 weights in %.2f s", alloc_s);
  std::fprintf(stderr,
               "%s: rank %d of %d read %.2f GB from %zu files in %.2f s (%.2f GB/s, %d reader "
               "threads)%s\n",
               sink ? "StreamModelWeights16" : "LoadModelWeights", shard.rank, shard.size,
               read_bytes / 1e9, files, read_s, read_bytes / 1e9 / std::max(read_s, 1e-9), threads,
               after.c_str());
}

// The checkpoint a rank reads, opened and checked (LoadModelWeights' contract): the rank's
// layout (its local one in a pre-sharded directory) and the tensors found.
struct RankCheckpoint {
  TpDims dims;
  std::vector<HfTensor> layout;
  Checkpoint checkpoint;
  internal::FindTensor find;
};
absl::Status OpenRankCheckpoint(const std::string& model_dir, const ModelConfig& config,
                                const TpShard& shard, RankCheckpoint* out) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  ASSIGN_OR_RETURN(out->dims, ComputeTpDims(config, shard));
  out->layout = internal::HfTensorLayout(config, out->dims);
  std::string weights_dir = model_dir;
  ASSIGN_OR_RETURN(std::optional<PreSharding> pre, ReadPreSharding(model_dir));
  if (pre.has_value()) {
    if (pre->tp != shard.size || pre->dcp != shard.dcp) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_dir, " is pre-sharded for tp=", pre->tp, " dcp=", pre->dcp,
                       ", but this rank belongs to a group of tp=", shard.size, " dcp=", shard.dcp,
                       " (shard the original checkpoint for this group, or load the original)"));
    }
    if (shard.expert_parallel && config.IsMoe()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_dir, " is pre-sharded (each rank a slice of every expert), but ",
          "--enable_expert_parallel places whole experts: load the original checkpoint"));
    }
    weights_dir = (fs::path(model_dir) / RankDir(shard.rank, shard.size)).string();
    out->layout = LocalLayout(out->layout);
  }
  RETURN_IF_ERROR(OpenCheckpoint(weights_dir, &out->checkpoint));
  // Check everything before converting anything: a bad checkpoint fails fast.
  RETURN_IF_ERROR(CheckCheckpoint(out->checkpoint, out->layout, config, weights_dir));
  out->find = [tensors = &out->checkpoint.tensors](const std::string& name) -> const TensorInfo* {
    auto it = tensors->find(name);
    return it == tensors->end() ? nullptr : it->second.info;
  };
  RETURN_IF_ERROR(internal::CheckFp8Checkpoint(config, out->dims, out->layout, out->find));
  if (config.quantization.kv_cache_fp8 && shard.rank == 0) {
    int64_t found = 0;
    for (const std::string& name : internal::KvScaleTensorNames(config, out->layout)) {
      found += out->find(name) != nullptr;
    }
    std::fprintf(stderr,
                 "LoadModelWeights: the checkpoint was calibrated for an FP8 KV cache (%lld k / v "
                 "scale tensors, checked): an FP8 K / V pool (--kv_cache_dtype=fp8, CUDA) uses "
                 "them; the KV pool is what --kv_cache_dtype says (auto: 16-bit)\n",
                 static_cast<long long>(found));
  }
  return absl::OkStatus();
}

// The reads of the rank's F32 / BF16 / F16 tensor parts (FP8 weights are kept as they are);
// `weights` null: no fp32 destination (ReadTensors16). *read_bytes: their stored bytes.
std::vector<internal::WidenTask> WidenTasks(const RankCheckpoint& rank, const ModelConfig& config,
                                            ModelWeights* weights, int64_t* read_bytes) {
  std::vector<internal::WidenTask> tasks;
  *read_bytes = 0;
  for (const HfTensor& t : rank.layout) {
    if (!t.keep || internal::IsFp8Weight(config, t)) continue;
    const Found& found = rank.checkpoint.tensors.at(t.name);
    float* out = weights == nullptr ? nullptr : internal::SlotData(weights, t);
    tasks.push_back({found.file, found.info, &t, out});
    *read_bytes += t.local_numel() * (found.info->dtype == SafetensorsDtype::kF32 ? 4 : 2);
  }
  return tasks;
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const ModelConfig& config, TpShard shard,
                                              const CheckpointReadOptions& read) {
  // Heap-held: `find` points into the checkpoint, which must not move.
  auto rank = std::make_unique<RankCheckpoint>();
  RETURN_IF_ERROR(OpenRankCheckpoint(model_dir, config, shard, rank.get()));
  const Clock::time_point start = Clock::now();
  ModelWeights weights;
  internal::AllocateModelWeights(config, rank->dims, &weights);
  const Clock::time_point allocated = Clock::now();
  int64_t read_bytes = 0;
  RETURN_IF_ERROR(internal::ReadTensors(WidenTasks(*rank, config, &weights, &read_bytes), read));
  ReportLargeLoad(shard, read_bytes, rank->checkpoint.files.size(), internal::ReaderThreads(read),
                  start, allocated);
  internal::LoadFp8Weights(config, rank->layout, rank->find, &weights);  // e4m3 kept as it is
  return weights;
}

absl::Status StreamModelWeights16(const std::string& model_dir, const ModelConfig& config,
                                  TpShard shard, Weight16 dtype, WeightChunkSink* sink,
                                  const CheckpointReadOptions& read) {
  if (config.quantization.FromCheckpoint()) {
    return absl::UnimplementedError(
        absl::StrCat("streaming 16-bit weights: ", model_dir, " holds FP8 weights (",
                     config.quantization.Describe(), "); load them with LoadModelWeights"));
  }
  auto rank = std::make_unique<RankCheckpoint>();
  RETURN_IF_ERROR(OpenRankCheckpoint(model_dir, config, shard, rank.get()));
  const Clock::time_point start = Clock::now();
  int64_t read_bytes = 0;
  RETURN_IF_ERROR(
      internal::ReadTensors16(WidenTasks(*rank, config, nullptr, &read_bytes), dtype, sink, read));
  ReportLargeLoad(shard, read_bytes, rank->checkpoint.files.size(), internal::ReaderThreads(read),
                  start, start, /*sink=*/true);
  return absl::OkStatus();
}

absl::Status WritePreShardedCheckpoint(const std::string& model_dir, const ModelConfig& config,
                                       int tp, int dcp, const std::string& out_dir) {
  RETURN_IF_ERROR(ValidateModelConfig(config));
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::equivalent(fs::path(model_dir), out, ec)) {
    return absl::InvalidArgumentError("pre-sharding: the output directory is the model directory");
  }
  Checkpoint checkpoint;
  RETURN_IF_ERROR(OpenCheckpoint(model_dir, &checkpoint));
  RETURN_IF_ERROR(CheckCheckpoint(checkpoint, internal::HfTensorLayout(config), config, model_dir));
  fs::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  // A manifest of an earlier run would vouch for rank files about to be replaced.
  fs::remove(out / kPreShardedManifest, ec);
  for (int rank = 0; rank < tp; ++rank) {
    ASSIGN_OR_RETURN(TpDims dims, ComputeTpDims(config, TpShard{rank, tp, dcp}));
    const std::vector<HfTensor> full = internal::HfTensorLayout(config, dims);
    const std::vector<HfTensor> local = LocalLayout(full);
    const internal::FindTensor find = [&checkpoint](const std::string& name) {
      auto it = checkpoint.tensors.find(name);
      return it == checkpoint.tensors.end() ? nullptr : it->second.info;
    };
    RETURN_IF_ERROR(internal::CheckFp8Checkpoint(config, dims, full, find));
    // Every kept tensor in its stored dtype (FP8 bytes as they are), each FP8 weight followed by
    // its scale tensors cut to the rank's slice (weight_fp8.h).
    std::map<std::string, std::vector<internal::Fp8ScalePart>> scales;  // by weight name
    for (const HfTensor& t : full) {
      if (t.keep && internal::IsFp8Weight(config, t)) {
        scales[t.name] = internal::Fp8ScaleParts(config, t, find);
      }
    }
    std::vector<TensorSpec> specs;
    std::map<std::string, std::string> raw_dtypes;  // FP8 (and FP8 scales' kOther, if any)
    for (const HfTensor& t : local) {
      const TensorInfo& info = *checkpoint.tensors.at(t.name).info;
      specs.push_back({t.name, info.dtype, t.shape});
      if (info.dtype == SafetensorsDtype::kOther) raw_dtypes[t.name] = info.dtype_name;
      auto it = scales.find(t.name);
      if (it == scales.end()) continue;
      for (const internal::Fp8ScalePart& part : it->second) specs.push_back(part.spec);
    }
    const fs::path dir = out / RankDir(rank, tp);
    fs::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir.string()));
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                     SafetensorsWriter::Create((dir / "model.safetensors").string(), specs,
                                               {{"format", "pt"}}, raw_dtypes));
    for (const HfTensor& t : full) {
      if (!t.keep) continue;
      const TensorInfo& info = *checkpoint.tensors.at(t.name).info;
      const int64_t item = info.nbytes / std::max<int64_t>(1, t.numel());
      const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
      if (t.slice_dim < 0) {
        RETURN_IF_ERROR(writer->AppendBytes(info.data, info.nbytes));
      } else if (t.slice_dim == 0) {
        RETURN_IF_ERROR(writer->AppendBytes(info.data + t.slice_begin * cols * item,
                                            t.slice_count * cols * item));
      } else {
        for (int64_t r = 0; r < t.shape[0]; ++r) {
          RETURN_IF_ERROR(writer->AppendBytes(info.data + (r * cols + t.slice_begin) * item,
                                              t.slice_count * item));
        }
      }
      if (auto it = scales.find(t.name); it != scales.end()) {
        for (const internal::Fp8ScalePart& part : it->second) {
          RETURN_IF_ERROR(
              writer->AppendBytes(part.bytes.data(), static_cast<int64_t>(part.bytes.size())));
        }
      }
    }
    RETURN_IF_ERROR(writer->Finish());
  }
  // The config, tokenizer and templates go along; the weights do not.
  const std::regex weights(R"(model(-\d+-of-\d+)?\.safetensors(\.index\.json)?|.*\.bin)");
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || std::regex_match(name, weights)) continue;
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", name, ": ", ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", model_dir, ": ", ec.message()));
  json manifest = {{"format", "tandem-tp-shards"}, {"tp", tp}, {"dcp", dcp}};
  for (int rank = 0; rank < tp; ++rank) manifest["ranks"].push_back(RankDir(rank, tp));
  std::ofstream f(out / kPreShardedManifest, std::ios::binary | std::ios::trunc);
  f << manifest.dump(2) << "\n";
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", kPreShardedManifest));
  return absl::OkStatus();
}

}  // namespace tandem::runtime
