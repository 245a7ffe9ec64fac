// Engine throughput on the CPU backend and scheduler overhead. Prints numbers; asserts nothing.
//
//   bazel run -c opt //runtime/engine:engine_bench -- [preset] [threads]
//   engine_bench --scheduler_only   (3. alone)
//
// 1. prefill tokens/s: one 512-token prompt (one step) on the dummy model;
// 2. decode tokens/s: batches of 1 and 16 requests, 32 decode steps after their prefill;
// 3. scheduler + KV-cache-manager time per decode step with 1 / 8 / 64 / 256 running requests
//    of 1024-token contexts (no model), synchronous and async (Scheduler::MarkLaunched / Resolve).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/scheduler.h"
#include "runtime/kv_cache/kv_cache_manager.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"

namespace tandem::runtime {
namespace {

RequestSpec Prompt(int64_t len, int64_t max_tokens, int32_t salt) {
  RequestSpec spec;
  for (int64_t i = 0; i < len; ++i)
    spec.prompt.push_back(static_cast<int32_t>((i * 31 + salt) % 1000));
  spec.max_tokens = max_tokens;
  spec.ignore_eos = true;
  return spec;
}

int BenchModel(const std::string& preset, int threads) {
  auto config = PresetConfig(preset);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s: %.1fM parameters, %d threads\n", preset.c_str(),
              config->NumParameters() / 1e6, threads);
  EngineConfig ec;
  ec.num_threads = threads;
  ec.kv_cache_bytes = int64_t{1} << 30;
  ec.enable_prefix_caching = false;  // measure compute, not cache hits
  auto engine = Engine::Create(ec, *config, RandomModelWeights(*config, 7));
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  Engine& e = **engine;
  int64_t next_id = 0;
  // Warm-up.
  (void)e.AddRequest(next_id++, Prompt(64, 1, 1));
  while (e.HasUnfinished()) (void)e.Step();

  for (int64_t len : {128, 512}) {
    (void)e.AddRequest(next_id++, Prompt(len, 1, 3));
    const absl::Time t0 = absl::Now();
    while (e.HasUnfinished()) (void)e.Step();
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    std::printf("prefill  prompt %4lld: %8.1f ms  %8.1f tokens/s\n", static_cast<long long>(len),
                s * 1e3, len / s);
  }
  for (int batch : {1, 16}) {
    for (int b = 0; b < batch; ++b) (void)e.AddRequest(next_id++, Prompt(128, 33, b));
    (void)e.Step();  // prefill all (budget 2048 >= 16 * 128)
    const int steps = 32;
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < steps; ++i) (void)e.Step();
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    std::printf("decode   batch %3d: %8.2f ms/step  %8.1f tokens/s\n", batch, s * 1e3 / steps,
                batch * steps / s);
    while (e.HasUnfinished()) (void)e.Step();
  }
  return 0;
}

// The host's scheduling share of the time between two device steps: Schedule() + Update() per
// decode step (and the async path's Schedule() + MarkLaunched() + Resolve()), 1024-token
// contexts as decode_step_bench's, prefix caching on as in serving.
int BenchScheduler() {
  for (int batch : {1, 8, 64, 256}) {
    for (bool async : {false, true}) {
      KvCacheConfig kv;
      kv.num_blocks = batch * 80;
      kv.block_size = 16;
      auto cache = KvCacheManager::Create(kv);
      if (!cache.ok()) return 1;
      SchedulerConfig sc;
      sc.max_num_batched_tokens = 1 << 18;
      sc.max_num_seqs = 256;
      sc.max_model_len = 4096;
      Scheduler s(sc, std::move(*cache), {});
      for (int i = 0; i < batch; ++i) (void)s.Add(i, Prompt(1024, 400, i));
      SchedulerOutput o = s.Schedule();
      std::vector<int32_t> tokens(o.seqs.size(), 5);
      s.Update(o, tokens, nullptr);
      const int steps = 300;
      SchedulerOutput launched;
      uint64_t tag = 0;
      const absl::Time t0 = absl::Now();
      for (int i = 0; i < steps; ++i) {
        o = s.Schedule();
        tokens.assign(o.seqs.size(), 5 + i % 7);
        if (!async) {
          s.Update(o, tokens, nullptr);
          continue;
        }
        const uint64_t next = s.MarkLaunched(o);
        if (tag != 0) s.Resolve(launched, tag, tokens, nullptr);
        launched = o;
        tag = next;
      }
      const double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / steps;
      std::printf("scheduler + KV cache manager, %3d running decodes%s: %6.1f us/step\n", batch,
                  async ? " (async)" : "        ", us);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--scheduler_only") {
    return tandem::runtime::BenchScheduler();
  }
  const std::string preset = argc > 1 ? argv[1] : "llama-100m";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  if (int rc = tandem::runtime::BenchModel(preset, threads); rc != 0) return rc;
  return tandem::runtime::BenchScheduler();
}
