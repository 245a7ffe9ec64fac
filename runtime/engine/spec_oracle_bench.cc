// //runtime/engine:spec_oracle_bench — speculative decoding's verifier, measured in steady state
// on one device (issue 34's benchmark table; runtime/engine/BENCHMARKS.md).
//
//   spec_oracle_bench --backend=cuda --dummy_config=llama3-8b --batches=1,8 --ks=1,2,3,4,5,6
//       --acceptances=1,0.7,0.5      (the oracle drafter, spec_oracle.h; acceptance 0 always runs)
//   spec_oracle_bench ... --speculative_method=ngram|draft|mtp --num_speculative_tokens=6
//       [--draft_model=...] [--speculative_adaptive=false] --ks=3        (a real drafter)
//
// One model load, one engine. For each batch size: a warm-up (a plain run and one run per K of
// --warmup_tokens tokens on other prompts, so that every decode / verify CUDA graph and the
// draft / MTP runner's graphs are captured before any timed run), then a plain timed run (its
// output is the oracle's reference), each K (x each acceptance with the oracle), and plain again.
// K below the engine's --num_speculative_tokens is a per-pass cap (BenchDraftHook::MaxDrafts).
// The oracle runs with a fixed K (no adaptive length) and method ngram with its hook. Per K the
// acceptance-0 run comes first (always, even without 0 in --acceptances): its output is the
// verifier's own greedy sequence at width K + 1 and the reference of the other acceptances (on a
// GPU a verify pass's bf16 results differ from a one-token step's, so plain decoding's output is
// not what the verifier follows); a timed run whose output still left its reference is repeated
// with its own output as the reference, up to --calibration_rounds times.
//
// One line per timed run: tokens/s over the step loop, the mean inter-token latency (per request,
// first to last token over tokens - 1, averaged), and the speculative counters of that run.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "runtime/engine/backend_factory.h"
#include "runtime/engine/draft_model_loader.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/spec_oracle.h"
#include "runtime/engine/speculative_flags.h"
#include "runtime/model/model_source.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory (or --load_format=dummy)");
ABSL_FLAG(std::string, load_format, "dummy", "auto (read --model) or dummy (random weights)");
ABSL_FLAG(std::string, dummy_config, "llama3-8b", "preset or config.json for dummy weights");
ABSL_FLAG(std::string, backend, "cuda", "cpu or cuda");
ABSL_FLAG(int32_t, device, 0, "cuda: device ordinal");
ABSL_FLAG(int32_t, num_threads, 2, "cpu: threads");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{4} << 30, "KV cache budget (and the draft's)");
ABSL_FLAG(std::string, batches, "1,8", "batch sizes (requests run together)");
ABSL_FLAG(std::string, ks, "1,2,3,4,5,6", "drafts per pass to measure (<= the engine's K)");
ABSL_FLAG(std::string, acceptances, "1,0.7,0.5",
          "oracle mode (no --speculative_method): target acceptance rates (0 always runs)");
ABSL_FLAG(int64_t, prompt_len, 64, "prompt tokens");
ABSL_FLAG(int64_t, prompt_vocab, 30000, "prompt token ids in [3, min(this, vocabulary))");
ABSL_FLAG(int64_t, max_tokens, 256, "generated tokens per request in a timed run");
ABSL_FLAG(int64_t, warmup_tokens, 24, "generated tokens per request in a warm-up run");
ABSL_FLAG(int32_t, calibration_rounds, 2, "oracle: reruns with the output as the reference");

namespace tandem::runtime {
namespace {

absl::StatusOr<std::vector<double>> ParseList(const std::string& text, const char* flag) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

// Caps the drafts of a real drafter (n-gram prompt lookup runs as usual).
class DraftCap : public BenchDraftHook {
 public:
  int64_t cap = 0;
  int64_t MaxDrafts(int64_t /*request_id*/) const override { return cap; }
  std::optional<std::vector<int32_t>> Draft(int64_t, absl::Span<const int32_t>,
                                            int64_t) const override {
    return std::nullopt;
  }
};

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;  // per request
  double seconds = 0;                        // the step loop
  double itl_ms = 0;                         // mean over requests
  SpecStats stats;                           // this run's counters
};

class Bench {
 public:
  Bench(Engine* engine, int64_t vocab) : engine_(engine), vocab_(vocab) {}

  std::vector<std::vector<int32_t>> Prompts(int64_t batch, uint32_t seed) const;
  // Runs `prompts` to max_tokens each; request i gets id first_id() + i.
  absl::StatusOr<RunResult> Run(const std::vector<std::vector<int32_t>>& prompts,
                                int64_t max_tokens);
  int64_t first_id() const { return next_id_; }

 private:
  Engine* engine_;
  const int64_t vocab_;
  int64_t next_id_ = 0;
};

std::vector<std::vector<int32_t>> Bench::Prompts(int64_t batch, uint32_t seed) const {
  std::mt19937 rng(seed);
  const int64_t hi = std::min(absl::GetFlag(FLAGS_prompt_vocab), vocab_);
  std::vector<std::vector<int32_t>> prompts(batch);
  for (auto& p : prompts) {
    for (int64_t i = 0; i < absl::GetFlag(FLAGS_prompt_len); ++i) {
      p.push_back(static_cast<int32_t>(3 + rng() % (hi - 3)));
    }
  }
  return prompts;
}

absl::StatusOr<RunResult> Bench::Run(const std::vector<std::vector<int32_t>>& prompts,
                                     int64_t max_tokens) {
  const int64_t base = next_id_;
  next_id_ += static_cast<int64_t>(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.max_tokens = max_tokens;
    spec.ignore_eos = true;
    RETURN_IF_ERROR(engine_->AddRequest(base + static_cast<int64_t>(i), std::move(spec)));
  }
  RunResult r;
  r.tokens.resize(prompts.size());
  std::vector<absl::Time> first(prompts.size()), last(prompts.size());
  const SpecStats before = engine_->spec_stats();
  const absl::Time start = absl::Now();
  while (engine_->HasUnfinished()) {
    ASSIGN_OR_RETURN(std::vector<RequestUpdate> updates, engine_->Step());
    const absl::Time now = absl::Now();
    for (const RequestUpdate& u : updates) {
      auto& t = r.tokens[u.request_id - base];
      if (u.new_token_ids.empty()) continue;
      if (t.empty()) first[u.request_id - base] = now;
      last[u.request_id - base] = now;
      t.insert(t.end(), u.new_token_ids.begin(), u.new_token_ids.end());
    }
  }
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double n = std::max<double>(1, static_cast<double>(r.tokens[i].size()) - 1);
    r.itl_ms += absl::ToDoubleMilliseconds(last[i] - first[i]) / n / prompts.size();
  }
  const SpecStats& after = engine_->spec_stats();
  r.stats.verify_passes = after.verify_passes - before.verify_passes;
  r.stats.drafted_tokens = after.drafted_tokens - before.drafted_tokens;
  r.stats.accepted_tokens = after.accepted_tokens - before.accepted_tokens;
  return r;
}

int64_t Tokens(const RunResult& r) {
  int64_t n = 0;
  for (const auto& t : r.tokens) n += static_cast<int64_t>(t.size());
  return n;
}

int64_t SameAs(const RunResult& a, const RunResult& b) {
  int64_t same = 0;
  for (size_t i = 0; i < a.tokens.size(); ++i) same += a.tokens[i] == b.tokens[i] ? 1 : 0;
  return same;
}

void PrintRow(const std::string& what, int64_t batch, const RunResult& r, const RunResult& plain,
              const std::string& extra) {
  const SpecStats& s = r.stats;
  std::printf(
      "row batch=%lld %s tok_s=%.1f itl_ms=%.3f vs_plain=%.3fx passes=%llu drafted=%llu "
      "accepted=%llu acceptance=%.3f mean_len=%.2f same_as_plain=%lld/%lld%s\n",
      static_cast<long long>(batch), what.c_str(), Tokens(r) / std::max(r.seconds, 1e-9), r.itl_ms,
      (Tokens(r) / r.seconds) / (Tokens(plain) / plain.seconds),
      static_cast<unsigned long long>(s.verify_passes),
      static_cast<unsigned long long>(s.drafted_tokens),
      static_cast<unsigned long long>(s.accepted_tokens), s.acceptance_rate(),
      s.mean_accepted_length(), static_cast<long long>(SameAs(r, plain)),
      static_cast<long long>(r.tokens.size()), extra.c_str());
  std::fflush(stdout);
}

// Sets `oracle`'s references for the run that will start at `bench.first_id()`.
void SetReferences(const Bench& bench, const std::vector<std::vector<int32_t>>& prompts,
                   const RunResult& reference, OracleDrafter* oracle) {
  oracle->ClearReferences();
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ref = prompts[i];
    ref.insert(ref.end(), reference.tokens[i].begin(), reference.tokens[i].end());
    oracle->SetReference(bench.first_id() + static_cast<int64_t>(i), std::move(ref));
  }
}

// One timed oracle run at (k, acceptance) following `start` (the rate-1 run's output at this
// K), repeated with its own output as the reference while it left its reference
// (calibration_rounds at most). Returns the run.
absl::StatusOr<RunResult> OracleRow(Bench& bench, OracleDrafter& oracle,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const RunResult& plain, const RunResult& start, int64_t k,
                                    double acceptance) {
  const double rate = acceptance >= 1   ? 0.0
                      : acceptance <= 0 ? 1.0
                                        : CorruptRateForAcceptance(acceptance, k);
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  RunResult reference = start;
  for (int round = 0;; ++round) {
    SetReferences(bench, prompts, reference, &oracle);
    oracle.Configure(k, rate);
    oracle.ClearDiverged();
    ASSIGN_OR_RETURN(RunResult r, bench.Run(prompts, max_tokens));
    const int64_t diverged = oracle.diverged();
    if (diverged == 0 || round >= absl::GetFlag(FLAGS_calibration_rounds)) {
      PrintRow(absl::StrCat("mode=oracle K=", k, " target_acceptance=", acceptance,
                            " corrupt_rate=", rate),
               static_cast<int64_t>(prompts.size()), r, plain,
               absl::StrCat(" diverged=", diverged, " calibration_round=", round));
      return r;
    }
    reference = std::move(r);
  }
}

// The oracle rows of one K. First acceptance 0 (rate 1: K random drafts verified at every step,
// whatever the reference): its output is the verifier's own greedy sequence at width K + 1, which
// on a GPU differs from plain decoding (bf16 results depend on the step's shape), so it is the
// reference of the other acceptances' runs, whose passes have the same width.
absl::Status OracleRows(Bench& bench, OracleDrafter& oracle,
                        const std::vector<std::vector<int32_t>>& prompts, const RunResult& plain,
                        int64_t k, const std::vector<double>& acceptances) {
  ASSIGN_OR_RETURN(const RunResult start, OracleRow(bench, oracle, prompts, plain, plain, k, 0));
  for (double a : acceptances) {
    if (a > 0) RETURN_IF_ERROR(OracleRow(bench, oracle, prompts, plain, start, k, a).status());
  }
  return absl::OkStatus();
}

absl::Status RunBatch(Bench& bench, OracleDrafter* oracle, DraftCap* cap, const std::string& name,
                      int64_t batch, const std::vector<double>& ks,
                      const std::vector<double>& acceptances) {
  const int64_t warm = absl::GetFlag(FLAGS_warmup_tokens);
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  auto set_k = [&](int64_t k, double rate) {
    if (oracle != nullptr) oracle->Configure(k, rate);
    if (cap != nullptr) cap->cap = k;
  };
  // Warm-up on other prompts: plain, then every K (the oracle at acceptance 1).
  const auto warm_prompts = bench.Prompts(batch, 1000 + batch);
  set_k(0, 0);
  ASSIGN_OR_RETURN(RunResult warm_plain, bench.Run(warm_prompts, warm));
  for (double k : ks) {
    if (oracle != nullptr) SetReferences(bench, warm_prompts, warm_plain, oracle);
    set_k(static_cast<int64_t>(k), 0);
    RETURN_IF_ERROR(bench.Run(warm_prompts, warm).status());
  }
  const auto prompts = bench.Prompts(batch, 7 + batch);
  set_k(0, 0);
  ASSIGN_OR_RETURN(RunResult plain, bench.Run(prompts, max_tokens));
  PrintRow("mode=plain", batch, plain, plain, "");
  for (double kd : ks) {
    const int64_t k = static_cast<int64_t>(kd);
    if (oracle == nullptr) {
      set_k(k, 0);
      ASSIGN_OR_RETURN(RunResult r, bench.Run(prompts, max_tokens));
      PrintRow(absl::StrCat("mode=", name, " K=", k), batch, r, plain, "");
      continue;
    }
    RETURN_IF_ERROR(OracleRows(bench, *oracle, prompts, plain, k, acceptances));
  }
  set_k(0, 0);
  ASSIGN_OR_RETURN(RunResult again, bench.Run(prompts, max_tokens));
  PrintRow("mode=plain_again", batch, again, plain, "");
  return absl::OkStatus();
}

absl::Status Main() {
  ASSIGN_OR_RETURN(std::vector<double> batches, ParseList(absl::GetFlag(FLAGS_batches), "batches"));
  ASSIGN_OR_RETURN(std::vector<double> ks, ParseList(absl::GetFlag(FLAGS_ks), "ks"));
  ASSIGN_OR_RETURN(std::vector<double> acceptances,
                   ParseList(absl::GetFlag(FLAGS_acceptances), "acceptances"));
  ModelSource source;
  source.model_dir = absl::GetFlag(FLAGS_model);
  source.load_format = absl::GetFlag(FLAGS_load_format);
  source.dummy_config = absl::GetFlag(FLAGS_dummy_config);
  BackendOptions backend;
  backend.backend = absl::GetFlag(FLAGS_backend);
  backend.device = absl::GetFlag(FLAGS_device);
  backend.num_threads = absl::GetFlag(FLAGS_num_threads);
  ASSIGN_OR_RETURN(BackendModel loaded, LoadModelForBackend(source, backend));
  const ModelConfig config = loaded.model.local_config;

  EngineConfig engine_config;
  engine_config.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  engine_config.num_threads = backend.num_threads;
  engine_config.enable_prefix_caching = false;  // every timed run prefills alike
  ASSIGN_OR_RETURN(engine_config.speculative, SpeculativeConfigFromFlags());
  SpeculativeConfig& spec = engine_config.speculative;
  const int64_t max_k = static_cast<int64_t>(*std::max_element(ks.begin(), ks.end()));
  std::optional<OracleDrafter> oracle;
  DraftCap cap;
  const bool use_oracle = !spec.enabled();
  if (use_oracle) {  // the oracle drafts through method kNgram's hook, fixed K
    oracle.emplace(config.vocab_size, /*seed=*/17);
    spec.method = SpeculativeMethod::kNgram;
    spec.num_speculative_tokens = max_k;
    spec.adaptive = false;
    spec.bench_hook = &*oracle;
  } else {
    if (max_k > spec.num_speculative_tokens) {
      return absl::InvalidArgumentError("--ks exceeds --num_speculative_tokens");
    }
    spec.bench_hook = &cap;
  }
  ASSIGN_OR_RETURN(
      auto engine,
      Engine::Create(engine_config, config, std::move(loaded.model.weights), {}, &loaded.factory));
  if (spec.method == SpeculativeMethod::kDraft) {
    ASSIGN_OR_RETURN(ModelSource draft, DraftModelSourceFromFlags());
    RETURN_IF_ERROR(LoadAndAttachDraftModel(draft, backend, *engine));
  }
  if (spec.method == SpeculativeMethod::kMtp) {
    RETURN_IF_ERROR(LoadAndAttachMtp(source, loaded.model.config, backend, *engine));
  }
  Bench bench(engine.get(), config.vocab_size);
  const std::string name = use_oracle ? "oracle" : SpeculativeMethodName(spec.method);
  for (double b : batches) {
    RETURN_IF_ERROR(RunBatch(bench, use_oracle ? &*oracle : nullptr, use_oracle ? nullptr : &cap,
                             name, static_cast<int64_t>(b), ks, acceptances));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::runtime

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = tandem::runtime::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "spec_oracle_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
