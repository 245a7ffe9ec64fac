// Decode-step benchmark of the CUDA backend with Llama-3-8B shapes and device-generated dummy
// bf16 weights: the whole engine (scheduler, metadata copy, graphs, sampling), not a kernel.
//
//   decode_step_bench [--batches=1,64] [--context=1024] [--steps=64] [--graphs=1] [--pdl=1]
//
// --pdl=0 turns off programmatic dependent launch of the GEMV / norm kernels
// (CudaBackendConfig::programmatic_launch), for comparisons.
// Prints per batch: mean decode step time, tokens/s, the tokens/s the weight-read roofline
// allows (weight bytes / 4.3 TB/s per step) and the step's share of it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/engine/engine.h"

namespace tandem::runtime::cuda {
namespace {

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 8192;
  c.eos_token_ids = {128001};
  return c;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != '\0';) {
    out.push_back(std::atoi(p));
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return out;
}

int Main(int argc, char** argv) {
  std::vector<int> batches = {1, 64};
  int context = 1024, steps = 64;
  bool graphs = true, pdl = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--batches=", 0) == 0) batches = ParseList(argv[i] + 10);
    if (a.rfind("--context=", 0) == 0) context = std::atoi(argv[i] + 10);
    if (a.rfind("--steps=", 0) == 0) steps = std::atoi(argv[i] + 8);
    if (a.rfind("--graphs=", 0) == 0) graphs = std::atoi(argv[i] + 9) != 0;
    if (a.rfind("--pdl=", 0) == 0) pdl = std::atoi(argv[i] + 6) != 0;
  }
  const ModelConfig model = Llama3_8B();
  CudaBackendConfig backend;
  backend.dummy_seed = 1;
  backend.enable_cuda_graphs = graphs;
  backend.programmatic_launch = pdl;
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  EngineConfig config;
  config.kv_cache_bytes = 0;  // the backend's default: a fraction of free memory
  config.max_num_batched_tokens = 8192;
  config.max_num_seqs = 256;
  config.max_model_len = 8192;
  auto engine = Engine::Create(config, model, ModelWeights{}, {}, &factory);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  // Weight bytes read per decode step: every parameter once (bf16), tied or not.
  const double weight_bytes = static_cast<double>(model.NumParameters()) * 2.0;
  std::printf(
      "Llama-3-8B shapes, dummy bf16 weights (%.2f GB), CUDA graphs %s, PDL %s, context %d\n",
      weight_bytes / 1e9, graphs ? "on" : "off", pdl ? "on" : "off", context);
  std::printf("%6s %8s %12s %12s %12s %10s\n", "batch", "context", "step_ms", "tok/s", "roofline",
              "% roof");
  int64_t next_id = 0;
  for (int batch : batches) {
    for (int b = 0; b < batch; ++b) {
      RequestSpec spec;
      spec.prompt.resize(context);
      for (int t = 0; t < context; ++t) spec.prompt[t] = 1000 + (t * 7919 + b * 31) % 100000;
      spec.max_tokens = steps + 8;
      spec.ignore_eos = true;
      if (auto st = (*engine)->AddRequest(next_id++, spec); !st.ok()) {
        std::fprintf(stderr, "add: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    // Prefill (and the first decode steps, which capture graphs) untimed.
    int warm = 0;
    while ((*engine)->num_waiting() > 0 || warm < 4) {
      auto u = (*engine)->Step();
      if (!u.ok()) {
        std::fprintf(stderr, "step: %s\n", u.status().ToString().c_str());
        return 1;
      }
      if ((*engine)->num_waiting() == 0) ++warm;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      auto u = (*engine)->Step();
      if (!u.ok()) {
        std::fprintf(stderr, "step: %s\n", u.status().ToString().c_str());
        return 1;
      }
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        steps;
    const double tok_s = batch * 1000.0 / ms;
    const double roof_ms = weight_bytes / 4.3e12 * 1e3;
    std::printf("%6d %8d %12.3f %12.1f %12.1f %9.1f%%\n", batch, context, ms, tok_s,
                batch * 1000.0 / roof_ms, 100.0 * roof_ms / ms);
    while ((*engine)->HasUnfinished()) {
      auto u = (*engine)->Step();
      if (!u.ok()) return 1;
    }
  }
  std::printf("roofline = weight bytes / 4.3 TB/s per step (KV reads not counted)\n");
  return 0;
}

}  // namespace
}  // namespace tandem::runtime::cuda

int main(int argc, char** argv) { return tandem::runtime::cuda::Main(argc, argv); }
