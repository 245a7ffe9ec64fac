// //runtime:generate — run prompts through the single-worker engine and print JSON lines.
//
//   generate --model=DIR --prompt_ids="1,2,3;4,5,6" --max_tokens=N [--temperature=0]
//            [--top_k=0] [--top_p=1] [--seed=0] [--ignore_eos] [--dump_last_logits]
//            [--backend=cpu] [--max_num_batched_tokens=2048] [--max_num_seqs=256]
//            [--kv_cache_bytes=268435456] [--block_size=16] [--num_threads=2]
//            [--speculative_method=ngram --num_speculative_tokens=K [--ngram_min/max=N]]
//            [--speculative_method=draft --draft_model=DIR|dummy:CONFIG[:SEED] ...]
//            [--speculative_method=mtp --num_speculative_tokens=K]  (DeepSeek-V3's MTP layer)
//   generate --load_format=dummy --dummy_config=tiny ...      (random weights, no files)
//   generate --tp=N ...   tensor parallelism: N rank processes (runtime/parallel/rank_group.h)
//
// Prompts separated by ';' run as one continuous batch. Output: one JSON object per prompt, in
// prompt order: {"tokens":[...],"finish_reason":"...","last_prompt_logits":[...]} (logits only
// with --dump_last_logits). Bad input exits non-zero with a message on stderr. A last line on
// stderr gives the tokens generated, the time of the step loop and the speculative counters.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/draft_model_loader.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/speculative_flags.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_source.h"
#include "runtime/model/model_weights.h"
#include "runtime/parallel/group_backend.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, load_format, "auto", "auto (read --model) or dummy (random weights)");
ABSL_FLAG(std::string, dummy_config, "tiny", "preset or config.json path for --load_format=dummy");
ABSL_FLAG(uint64_t, dummy_seed, 0, "weight seed for --load_format=dummy");
ABSL_FLAG(std::string, quantization, "",
          "fp8: quantize the linear layers of a 16/32-bit checkpoint to FP8 at load (per-channel "
          "weights, dynamic per-token activations); empty: as the checkpoint says");
ABSL_FLAG(bool, quantize_lm_head, false,
          "lm_head to FP8 too (per-row scales, per-token activations), with --quantization=fp8 "
          "or on an FP8 checkpoint: faster batch-1 decode, logits less exact; Llama family");
ABSL_FLAG(std::string, prompt_ids, "", "prompts as token ids: '1,2,3;4,5,6'");
ABSL_FLAG(int64_t, max_tokens, 16, "tokens to generate per prompt");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "0 = off");
ABSL_FLAG(double, top_p, 1.0, "1 = off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed (prompt i uses seed + i)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past eos");
ABSL_FLAG(bool, dump_last_logits, false, "print the logits of each prompt's last position");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda (CUDA builds)");
ABSL_FLAG(std::string, dtype, "auto", "cuda: bf16, fp16 or auto (fp16 for f16 checkpoints)");
ABSL_FLAG(int32_t, device, 0, "cuda: device ordinal");
ABSL_FLAG(bool, cuda_graphs, true, "cuda: capture decode steps as CUDA graphs");
ABSL_FLAG(bool, checkpoint_on_device, true,
          "cuda: read a dense 16/32-bit --model checkpoint straight into device memory, each rank "
          "its part (false: through fp32 host weights, for comparisons)");
ABSL_FLAG(bool, cuda_verify_graphs, true,
          "cuda: pad speculative verify passes to graph sizes and capture them (false: eager)");
ABSL_FLAG(std::string, prefill_kernel, "auto",
          "cuda: auto (Hopper wgmma where supported), mma (mma.sync) or decode (no prefill "
          "kernel)");
ABSL_FLAG(int64_t, max_num_batched_tokens, 2048, "token budget per step (chunked prefill)");
ABSL_FLAG(int64_t, max_num_seqs, 256, "running requests at most");
ABSL_FLAG(bool, async_scheduling, false,
          "schedule step s + 1 while step s runs (runtime/engine/engine.h; decode steps)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20, "KV cache budget in bytes");
ABSL_FLAG(int64_t, block_size, 16, "KV block size in tokens");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto (the backend's KV dtype) or fp8: e4m3 KV, DeepSeek MLA latents with a scale per "
          "token, K / V of other models with one scale per tensor (both backends)");
ABSL_FLAG(int32_t, num_threads, 2, "CPU threads");
ABSL_FLAG(bool, enable_prefix_caching, true, "share full KV blocks across requests");

namespace tandem::runtime {
namespace {

absl::StatusOr<std::vector<std::vector<int32_t>>> ParsePrompts(const std::string& text) {
  if (text.empty()) return absl::InvalidArgumentError("--prompt_ids is required");
  std::vector<std::vector<int32_t>> prompts;
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    std::vector<int32_t> prompt;
    for (absl::string_view tok : absl::StrSplit(part, ',', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(tok, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt ", prompts.size(), ": '", tok, "' is not a token id"));
      }
      prompt.push_back(id);
    }
    if (prompt.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", prompts.size(), " is empty"));
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

std::string JsonFloat(float v) {
  if (std::isnan(v)) return "NaN";  // not valid JSON; never expected from a finite model
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

ModelSource ModelSourceFromFlags() {
  ModelSource source;
  source.model_dir = absl::GetFlag(FLAGS_model);
  source.load_format = absl::GetFlag(FLAGS_load_format);
  source.dummy_config = absl::GetFlag(FLAGS_dummy_config);
  source.dummy_seed = absl::GetFlag(FLAGS_dummy_seed);
  source.quantization = absl::GetFlag(FLAGS_quantization);
  source.quantize_lm_head = absl::GetFlag(FLAGS_quantize_lm_head);
  return source;
}

BackendOptions BackendOptionsFromFlags() {
  BackendOptions backend;
  backend.backend = absl::GetFlag(FLAGS_backend);
  backend.num_threads = absl::GetFlag(FLAGS_num_threads);
  backend.device = absl::GetFlag(FLAGS_device);
  backend.dtype = absl::GetFlag(FLAGS_dtype);
  backend.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  backend.checkpoint_on_device = absl::GetFlag(FLAGS_checkpoint_on_device);
  backend.cuda_verify_graphs = absl::GetFlag(FLAGS_cuda_verify_graphs);
  backend.prefill_kernel = absl::GetFlag(FLAGS_prefill_kernel);
  backend.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  return backend;
}

absl::StatusOr<EngineConfig> EngineConfigFromFlags() {
  EngineConfig engine_config;
  engine_config.block_size = absl::GetFlag(FLAGS_block_size);
  engine_config.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  engine_config.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  engine_config.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  engine_config.num_threads = absl::GetFlag(FLAGS_num_threads);
  engine_config.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  engine_config.async_scheduling = absl::GetFlag(FLAGS_async_scheduling);
  ASSIGN_OR_RETURN(engine_config.speculative, SpeculativeConfigFromFlags());
  return engine_config;
}

// Adds prompt i as request i, with the sampling flags (seed + i).
absl::Status AddPrompts(const std::vector<std::vector<int32_t>>& prompts, bool dump,
                        Engine& engine) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    spec.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
    spec.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    spec.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
    spec.sampling.seed = absl::GetFlag(FLAGS_seed) + i;
    spec.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
    spec.capture_last_prompt_logits = dump;
    absl::Status s = engine.AddRequest(static_cast<int64_t>(i), std::move(spec));
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("prompt ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// What each request produced, indexed by request id (= prompt index).
struct Generations {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // last prompt logits (--dump_last_logits)
  std::vector<FinishReason> reasons;
};

// Steps `engine` until every request finished; the stats line goes to stderr.
absl::StatusOr<Generations> RunToCompletion(size_t num_requests, Engine& engine) {
  Generations out;
  out.tokens.resize(num_requests);
  out.logits.resize(num_requests);
  out.reasons.assign(num_requests, FinishReason::kNone);
  const absl::Time start = absl::Now();
  int64_t generated = 0;
  while (engine.HasUnfinished()) {
    ASSIGN_OR_RETURN(std::vector<RequestUpdate> updates, engine.Step());
    for (RequestUpdate& u : updates) {
      auto& t = out.tokens[u.request_id];
      t.insert(t.end(), u.new_token_ids.begin(), u.new_token_ids.end());
      generated += static_cast<int64_t>(u.new_token_ids.size());
      if (!u.last_prompt_logits.empty()) {
        out.logits[u.request_id] = std::move(u.last_prompt_logits);
      }
      if (u.finish_reason != FinishReason::kNone) out.reasons[u.request_id] = u.finish_reason;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const SpecStats& spec = engine.spec_stats();
  std::fprintf(stderr,
               "generate: %lld tokens in %.3f s (%.1f tok/s); speculative: verify passes %llu, "
               "drafted %llu, accepted %llu, acceptance rate %.3f, mean accepted length %.3f\n",
               static_cast<long long>(generated), seconds, generated / std::max(seconds, 1e-9),
               static_cast<unsigned long long>(spec.verify_passes),
               static_cast<unsigned long long>(spec.drafted_tokens),
               static_cast<unsigned long long>(spec.accepted_tokens), spec.acceptance_rate(),
               spec.mean_accepted_length());
  return out;
}

// One JSON line per request to stdout, in request order.
void PrintGenerations(const Generations& gen, bool dump) {
  for (size_t i = 0; i < gen.tokens.size(); ++i) {
    std::string line = "{\"tokens\":[";
    for (size_t j = 0; j < gen.tokens[i].size(); ++j) {
      absl::StrAppend(&line, j ? "," : "", gen.tokens[i][j]);
    }
    absl::StrAppend(&line, "],\"finish_reason\":\"", FinishReasonName(gen.reasons[i]), "\"");
    if (dump) {
      absl::StrAppend(&line, ",\"last_prompt_logits\":[");
      for (size_t j = 0; j < gen.logits[i].size(); ++j) {
        absl::StrAppend(&line, j ? "," : "", JsonFloat(gen.logits[i][j]));
      }
      absl::StrAppend(&line, "]");
    }
    absl::StrAppend(&line, "}\n");
    std::fputs(line.c_str(), stdout);
  }
}

absl::Status Run(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(auto prompts, ParsePrompts(absl::GetFlag(FLAGS_prompt_ids)));
  const ModelSource source = ModelSourceFromFlags();
  const BackendOptions backend = BackendOptionsFromFlags();
  ASSIGN_OR_RETURN(
      GroupBackend group_backend,
      LoadGroupBackend(source, backend, RankGroupOptionsFromFlags(backend.device), argv));
  if (!group_backend.is_leader()) return RunFollowerRank(std::move(group_backend));
  LoadedModel& model = group_backend.loaded.model;
  const ExecutorFactory& factory = group_backend.loaded.factory;
  ModelConfig config = model.local_config;
  ModelWeights weights = std::move(model.weights);

  ASSIGN_OR_RETURN(const EngineConfig engine_config, EngineConfigFromFlags());
  ASSIGN_OR_RETURN(auto engine,
                   Engine::Create(engine_config, config, std::move(weights), {}, &factory));
  if (engine_config.speculative.method == SpeculativeMethod::kDraft) {
    ASSIGN_OR_RETURN(ModelSource draft, DraftModelSourceFromFlags());
    RETURN_IF_ERROR(LoadAndAttachDraftModel(draft, backend, *engine));
  }
  if (engine_config.speculative.method == SpeculativeMethod::kMtp) {
    RETURN_IF_ERROR(LoadAndAttachMtp(source, model.config, backend, *engine));
  }

  const bool dump = absl::GetFlag(FLAGS_dump_last_logits);
  RETURN_IF_ERROR(AddPrompts(prompts, dump, *engine));
  ASSIGN_OR_RETURN(const Generations gen, RunToCompletion(prompts.size(), *engine));
  PrintGenerations(gen, dump);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "generate --model=DIR --prompt_ids='1,2,3;4,5' --max_tokens=N [--dump_last_logits]");
  const std::vector<std::string> args(argv, argv + argc);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = tandem::runtime::Run(args);
  if (!s.ok()) {
    std::fprintf(stderr, "generate: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
