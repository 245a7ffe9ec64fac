// shard_memory_bench: what one tensor-parallel rank's weight load costs (issue: "each rank reads
// only its slices ... resident weight memory per rank ~ 1/N").
//
//   shard_memory_bench --model=DIR --tp=N --rank=R [--evict=true] [--read_threads=T]
//                      [--stream16]
//
// Loads rank R's shard of DIR (LoadModelWeights with TpShard{R, N}) in this process alone and
// prints one JSON line: anonymous memory held after the load (RssAnon: the fp32 weights; the
// file mapping is gone by then), bytes read from storage during the load (/proc/self/io
// read_bytes; the files are evicted from the page cache first, so every byte read counts,
// readahead included),
// the fp32 bytes of the shard and of the whole model. Run it once per (N, R). DIR may be a
// pre-sharded checkpoint (shard_checkpoint --tp=N): then the rank reads its own file only.
// --stream16: StreamModelWeights16 instead (bf16 chunks into a sink that keeps none of them), the
// host side of the CUDA backend's load (runtime/cuda/checkpoint_upload.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(int32_t, tp, 1, "group size");
ABSL_FLAG(int32_t, rank, 0, "rank to load");
ABSL_FLAG(int32_t, read_threads, 0,
          "LoadModelWeights' reader threads (CheckpointReadOptions::threads; 0: its default)");
ABSL_FLAG(bool, stream16, false,
          "StreamModelWeights16 (bf16) into a sink that keeps nothing: the host side of the CUDA "
          "backend's load straight to the device (no fp32 weights; anon_bytes: its staging)");
ABSL_FLAG(bool, evict, true,
          "evict the checkpoint's files from the page cache first (posix_fadvise DONTNEED), so "
          "read_bytes counts every byte the load reads");

namespace {

// A "Key:   123 kB" line of /proc/self/status, in bytes; or a "key: 123" line of /proc/self/io.
int64_t ProcValue(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::vector<std::string> parts =
        absl::StrSplit(line.substr(key.size() + 1), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t v = 0;
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &v)) return -1;
    return parts.size() > 1 && parts[1] == "kB" ? v * 1024 : v;
  }
  return -1;
}

int64_t Bytes(const tandem::runtime::ModelWeights& w) {
  int64_t n = w.embed_tokens.size() + w.norm.size() + w.lm_head.size();
  for (const auto& l : w.layers) {
    n += l.input_layernorm.size() + l.qkv_proj.size() + l.qkv_bias.size() + l.o_proj.size() +
         l.o_bias.size() + l.post_attention_layernorm.size() + l.gate_up_proj.size() +
         l.gate_up_bias.size() + l.down_proj.size() + l.down_bias.size();
  }
  return n * 4;
}

// The reader threads LoadModelWeights used (CheckpointReadOptions' default resolved).
int ReaderThreadsOf(const tandem::runtime::CheckpointReadOptions& read) {
  if (read.threads > 0) return read.threads;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

// Counts the elements it is given and keeps none: per worker one staging buffer.
class CountingSink : public tandem::runtime::WeightChunkSink {
 public:
  absl::Status Start(int workers, int64_t chunk_bytes) override {
    buffers_.assign(static_cast<size_t>(workers), std::vector<uint8_t>(chunk_bytes));
    counts_.assign(static_cast<size_t>(workers), 0);
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Acquire(int worker) override {
    return buffers_[static_cast<size_t>(worker)].data();
  }
  absl::Status Commit(int worker, const tandem::runtime::WeightChunk& chunk) override {
    counts_[static_cast<size_t>(worker)] += chunk.count;
    return absl::OkStatus();
  }
  int64_t elements() const {
    int64_t n = 0;
    for (int64_t c : counts_) n += c;
    return n;
  }

 private:
  std::vector<std::vector<uint8_t>> buffers_;
  std::vector<int64_t> counts_;  // one per worker: no two threads write one
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace tandem::runtime;
  auto config = LoadModelConfig(absl::GetFlag(FLAGS_model));
  if (!config.ok()) {
    std::fprintf(stderr, "shard_memory_bench: %s\n", config.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_evict)) {
    // Recursive: a pre-sharded checkpoint keeps its rank files in subdirectories.
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(absl::GetFlag(FLAGS_model))) {
      if (entry.path().extension() != ".safetensors") continue;
      const int fd = open(entry.path().c_str(), O_RDONLY);
      if (fd < 0) continue;
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
  }
  const int64_t anon0 = ProcValue("/proc/self/status", "RssAnon");
  const int64_t read0 = ProcValue("/proc/self/io", "read_bytes");
  const absl::Time start = absl::Now();
  CheckpointReadOptions options;
  options.threads = absl::GetFlag(FLAGS_read_threads);
  const TpShard shard{absl::GetFlag(FLAGS_rank), absl::GetFlag(FLAGS_tp)};
  absl::StatusOr<ModelWeights> weights;
  CountingSink sink;
  if (absl::GetFlag(FLAGS_stream16)) {
    absl::Status streamed = StreamModelWeights16(absl::GetFlag(FLAGS_model), *config, shard,
                                                 Weight16::kBf16, &sink, options);
    weights = streamed.ok() ? absl::StatusOr<ModelWeights>(ModelWeights()) : streamed;
  } else {
    weights = LoadModelWeights(absl::GetFlag(FLAGS_model), *config, shard, options);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!weights.ok()) {
    std::fprintf(stderr, "shard_memory_bench: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  const int64_t anon = ProcValue("/proc/self/status", "RssAnon") - anon0;
  const int64_t read = ProcValue("/proc/self/io", "read_bytes") - read0;
  std::printf(
      "{\"tp\":%d,\"rank\":%d,\"shard_fp32_bytes\":%lld,\"full_fp32_bytes\":%lld,"
      "\"anon_bytes\":%lld,\"read_bytes\":%lld,\"load_s\":%.2f,\"read_threads\":%d,"
      "\"streamed_bf16_bytes\":%lld}\n",
      absl::GetFlag(FLAGS_tp), absl::GetFlag(FLAGS_rank), static_cast<long long>(Bytes(*weights)),
      static_cast<long long>(config->NumParameters() * 4), static_cast<long long>(anon),
      static_cast<long long>(read), seconds, ReaderThreadsOf(options),
      static_cast<long long>(sink.elements() * 2));
  return 0;
}
