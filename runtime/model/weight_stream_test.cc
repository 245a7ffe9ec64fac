// StreamModelWeights16 against LoadModelWeights: every element a rank's sink receives is the
// fp32 load's element rounded to the sink's dtype, for whole models and TP shards (fused q/k/v
// and gate/up, row-parallel column slices, padded vocabulary rows), any chunk size and thread
// count. HostSink is the host-side twin of the CUDA backend's pinned staging
// (runtime/cuda/checkpoint_upload.h): per-worker buffers, each committed chunk copied to its
// place.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "runtime/model/half.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

namespace fs = std::filesystem;

// A small Llama whose every tensor is sliced at TP 2 and 4: GQA, all biases, a vocabulary that
// does not divide by 4 (padded rows), untied lm_head.
ModelConfig SmallLlama(WeightDtype dtype) {
  ModelConfig c = *PresetConfig("tiny");
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.vocab_size = 50;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_word_embeddings = false;
  c.dtype = dtype;
  return c;
}

using SlotKey = std::pair<WeightSlot, int64_t>;

// Every non-empty vector of `w` by (slot, layer).
std::map<SlotKey, const std::vector<float>*> SlotsOf(ModelWeights* w) {
  std::map<SlotKey, const std::vector<float>*> out;
  for (int s = 0; s <= static_cast<int>(WeightSlot::kRouterBias); ++s) {
    const auto slot = static_cast<WeightSlot>(s);
    const bool model_level = slot == WeightSlot::kEmbedTokens || slot == WeightSlot::kNorm ||
                             slot == WeightSlot::kLmHead;
    for (int64_t l = model_level ? -1 : 0; l < (model_level ? 0 : int64_t(w->layers.size())); ++l) {
      const std::vector<float>* v = SlotVector(w, slot, l);
      if (v != nullptr && !v->empty()) out[{slot, l}] = v;
    }
  }
  return out;
}

// The sink's host twin: a 16-bit vector per slot of the fp32 load's sizes; counts the writes of
// every element (each must be written exactly once, except padded rows: never).
class HostSink : public WeightChunkSink {
 public:
  explicit HostSink(const std::map<SlotKey, const std::vector<float>*>& sizes) {
    for (const auto& [key, v] : sizes) {
      values_[key].assign(v->size(), 0);
      writes_[key].assign(v->size(), 0);
    }
  }
  absl::Status Start(int workers, int64_t chunk_bytes) override {
    buffers_.assign(static_cast<size_t>(workers), std::vector<uint8_t>(chunk_bytes));
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Acquire(int worker) override {
    return buffers_.at(static_cast<size_t>(worker)).data();
  }
  absl::Status Commit(int worker, const WeightChunk& c) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (fail_after_ >= 0 && commits_ == fail_after_) return absl::DataLossError("sink failed");
    ++commits_;
    auto it = values_.find({c.slot, c.layer});
    if (it == values_.end() || c.offset < 0 || c.offset + c.count > int64_t(it->second.size()) ||
        c.count * 2 > int64_t(buffers_[size_t(worker)].size())) {
      return absl::OutOfRangeError(absl::StrCat("chunk of slot ", static_cast<int>(c.slot),
                                                " layer ", c.layer, " at ", c.offset));
    }
    std::memcpy(it->second.data() + c.offset, buffers_[size_t(worker)].data(), c.count * 2);
    for (int64_t i = 0; i < c.count; ++i) ++writes_[{c.slot, c.layer}][size_t(c.offset + i)];
    return absl::OkStatus();
  }
  void FailAfter(int commits) { fail_after_ = commits; }
  int commits() const { return commits_; }
  const std::map<SlotKey, std::vector<uint16_t>>& values() const { return values_; }
  const std::map<SlotKey, std::vector<int>>& writes() const { return writes_; }

 private:
  std::vector<std::vector<uint8_t>> buffers_;
  absl::Mutex mu_;
  std::map<SlotKey, std::vector<uint16_t>> values_;  // keys fixed at construction
  std::map<SlotKey, std::vector<int>> writes_;
  int commits_ = 0;
  int fail_after_ = -1;
};

class WeightStreamTest : public ::testing::Test {
 protected:
  std::string Write(const ModelConfig& c, const std::string& name) {
    const fs::path dir =
        fs::path(::testing::TempDir()) / absl::StrCat("stream_", ::getpid(), "_", name);
    // Small shards: tensors of a layer land in different files.
    EXPECT_TRUE(WriteDummyModel(c, dir.string(), /*seed=*/7, /*shard_bytes=*/20000, 2).ok());
    return dir.string();
  }
  // Streams rank `shard` of `dir` as `dtype` and compares with the fp32 load, rounded.
  void ExpectStreamMatchesLoad(const std::string& dir, const ModelConfig& c, TpShard shard,
                               Weight16 dtype, CheckpointReadOptions read) {
    SCOPED_TRACE(absl::StrCat("tp ", shard.size, " rank ", shard.rank, " chunk ", read.chunk_bytes,
                              " threads ", read.threads));
    absl::StatusOr<ModelWeights> fp32 = LoadModelWeights(dir, c, shard);
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    const auto slots = SlotsOf(&*fp32);
    HostSink sink(slots);
    ASSERT_TRUE(StreamModelWeights16(dir, c, shard, dtype, &sink, read).ok());
    const int64_t vocab_begin = (c.vocab_size + shard.size - 1) / shard.size * shard.rank;
    for (const auto& [key, v] : slots) {
      const std::vector<uint16_t>& got = sink.values().at(key);
      const std::vector<int>& writes = sink.writes().at(key);
      // Embedding / lm_head rows past the vocabulary are padding: never read.
      const bool vocab = key.first == WeightSlot::kEmbedTokens || key.first == WeightSlot::kLmHead;
      const int64_t real = vocab ? std::max<int64_t>(0, c.vocab_size - vocab_begin) * c.hidden_size
                                 : int64_t(v->size());
      for (size_t i = 0; i < v->size(); ++i) {
        const float x = (*v)[i];
        const uint16_t want = dtype == Weight16::kBf16 ? FloatToBf16(x) : FloatToF16(x);
        ASSERT_EQ(writes[i], int64_t(i) < real ? 1 : 0)
            << "slot " << static_cast<int>(key.first) << " layer " << key.second << " i " << i;
        if (int64_t(i) < real) {
          ASSERT_EQ(got[i], want) << "slot " << static_cast<int>(key.first) << " layer "
                                  << key.second << " element " << i;
        }
      }
    }
  }
};

TEST_F(WeightStreamTest, Bf16ShardsAreTheFp32LoadRoundedAtTp124) {
  const ModelConfig c = SmallLlama(WeightDtype::kBF16);
  const std::string dir = Write(c, "bf16");
  for (int tp : {1, 2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      // Chunks of 64 bytes split rows and give each thread many chunks; 16 MiB: one per tensor.
      ExpectStreamMatchesLoad(dir, c, TpShard{rank, tp}, Weight16::kBf16, {3, 64});
      ExpectStreamMatchesLoad(dir, c, TpShard{rank, tp}, Weight16::kBf16, {1, int64_t{16} << 20});
    }
  }
  fs::remove_all(dir);
}

TEST_F(WeightStreamTest, OtherStoredDtypesAreConvertedAsTheDeviceConvertsFp32) {
  // bf16 -> f16, f16 -> bf16 / f16, f32 -> both: widened exactly, rounded to nearest even.
  for (WeightDtype stored : {WeightDtype::kBF16, WeightDtype::kF16, WeightDtype::kF32}) {
    const ModelConfig c = SmallLlama(stored);
    const std::string dir = Write(c, std::string(WeightDtypeName(stored)));
    for (Weight16 dtype : {Weight16::kBf16, Weight16::kF16}) {
      ExpectStreamMatchesLoad(dir, c, TpShard{1, 2}, dtype, {2, 100});
    }
    fs::remove_all(dir);
  }
}

TEST_F(WeightStreamTest, PreShardedDirectoryAndSinkErrors) {
  const ModelConfig c = SmallLlama(WeightDtype::kBF16);
  const std::string dir = Write(c, "presharded_src");
  const std::string sharded = dir + "_tp2";
  ASSERT_TRUE(WritePreShardedCheckpoint(dir, c, 2, 1, sharded).ok());
  for (int rank = 0; rank < 2; ++rank) {
    ExpectStreamMatchesLoad(sharded, c, TpShard{rank, 2}, Weight16::kBf16, {2, 256});
  }
  // A sink's error stops the reads and comes back as it is; a wrong topology is refused first.
  absl::StatusOr<ModelWeights> fp32 = LoadModelWeights(dir, c, TpShard{0, 2});
  ASSERT_TRUE(fp32.ok());
  HostSink failing(SlotsOf(&*fp32));
  failing.FailAfter(5);
  const absl::Status failed =
      StreamModelWeights16(dir, c, TpShard{0, 2}, Weight16::kBf16, &failing, {1, 64});
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_EQ(failing.commits(), 5);
  const absl::Status topology =
      StreamModelWeights16(sharded, c, TpShard{0, 4}, Weight16::kBf16, &failing, {});
  EXPECT_EQ(topology.code(), absl::StatusCode::kInvalidArgument) << topology;
  fs::remove_all(dir);
  fs::remove_all(sharded);
}

}  // namespace
}  // namespace tandem::runtime
