// Decode-step benchmark of the CUDA backend with Llama-3-8B (or -70B) shapes, or a dummy-model
// preset's (--shape=qwen3-30b-a3b, mixtral-8x7b: runtime/model PresetConfig), and
// device-generated dummy bf16 weights: the whole engine (scheduler, metadata copy, graphs,
// sampling), not a kernel.
//
//   decode_step_bench [--shape=8b|70b|PRESET] [--batches=1,64] [--context=1024] [--steps=64]
//                     [--graphs=1] [--pdl=1] [--tp=N] [--custom_ar=1]
//                     [--quantization=none,fp8,fp8_lm_head]
//                     [--ep=1] [--dp_attention=1] [--async_scheduling=0,1]
//
// --ep=1 (MoE shapes, --tp=N): expert parallelism over the TP ranks (EP a: experts whole on the
// ranks, tokens replicated; tok/s per GPU = tok/s / N). --dp_attention=1: data-parallel attention
// + EP (EP b, runtime/cuda/cuda_moe_all_to_all.h): every rank decodes its OWN batch of --batches
// requests (prompts differ per rank) through the whole model but its experts, the MoE layers'
// rows dispatched and combined by all-to-alls; tok/s per GPU = tok/s. Decode steps replay as
// CUDA graphs with the fixed-capacity dispatch (--dp_graphs=1, the default); --dp_graphs=0: eager
// with the counts read-back per layer (CudaBackendConfig::dp_attention_graphs). The roofline
// columns assume the TP split (not meaningful under --dp_attention).
//
// --async_scheduling: a list of 0 (off) / 1 (on) measured one after the other, each with its own
// engine (EngineConfig::async_scheduling: step s + 1 scheduled and launched while step s runs,
// its input ids copied from step s's sampled tokens on the device); the timed loop is the same
// Engine::Step() loop either way.
//
// --quantization: a comma-separated list of weight formats measured one after the other in this
// process, each with its own engine: none (the shape's own: bf16, or an FP8 preset's scheme such
// as qwen3-30b-a3b-fp8's or deepseek-v2-lite-fp8's 128 x 128 tiles) and fp8 (device dummy FP8
// weights as
// --quantization=fp8 makes them: per-channel e4m3 weights, dynamic per-token activations; dense
// and MoE Llama-family shapes, the experts too), fp8_lm_head the same with lm_head FP8 too
// (--quantize_lm_head); the roofline counts 1 byte per FP8 weight.
//
// Mixture-of-experts shapes: the roofline counts the weights a step reads, the non-expert ones
// plus, per MoE layer, the experts a batch of B tokens routes to if routing were uniform:
// E * (1 - (1 - k / E)^B) of them (random dummy weights route close to uniformly).
//
// --pdl=0 turns off programmatic dependent launch of the GEMV / norm kernels
// (CudaBackendConfig::programmatic_launch), for comparisons. --tp=N runs N rank processes (GPUs
// 0..N-1), each an engine over its shard with NCCL collectives (the same requests on every rank
// schedule identical steps, so no plan travels: the step without rank 0's plan broadcast);
// --custom_ar=0 keeps every all-reduce on NCCL (CudaBackendConfig::custom_all_reduce).
// --fused_norm=0 runs each custom all-reduce and the residual add + RMSNorm after it as two
// kernels (default: fused, CudaBackendConfig::fuse_all_reduce_norm); --ar_pdl=0 launches the custom
// all-reduce kernels without PDL (CudaBackendConfig::custom_all_reduce_pdl). --trace=1: rank 0
// records its kernels through CUPTI (KernelTrace) and prints, per batch, the timed steps' time per
// kernel class, busy and idle GPU time (step_breakdown.h; the traced step times include CUPTI's
// overhead). --prefill_trace=1 (with --trace=1): also each batch's first step, the prefill of
// batch x context tokens where they fit one step (max_num_batched_tokens), timed and traced.
// --vocab_greedy_min_rows=N: at TP > 1,
// greedy steps of at least N logit rows gather per-rank (value, id) candidates instead of the
// logits (default 64, 0 never, 1 always: CudaBackendConfig::vocab_parallel_greedy_min_rows).
// --attention_pdl=0: the paged decode kernel launched without PDL (CudaBackendConfig::
// decode_attention_pdl, default on).
// --merge_in_kernel=1: the paged decode kernel merges its own KV splits instead of a second (PDL)
// kernel (CudaBackendConfig::decode_merge_in_kernel, default off); rows print how many timed
// steps merged in the kernel. --fold_norm=0: the residual add + RMSNorm as separate kernels at
// batch 1 on one GPU (CudaBackendConfig::fold_norm, default on: folded into the GEMVs).
// --fold_rope=1: with the fold, RoPE + the KV write in the qkv GEMV's epilogue
// (CudaBackendConfig::fold_rope); rows print how many timed steps did. --qk_norm_rope=0: Qwen3's
// q/k head norms as their own kernel before RoPE (CudaBackendConfig::qk_norm_rope, default: in
// the RoPE kernel). --fold_moe=0: MoE models' batch-1 steps unfolded (CudaBackendConfig::
// fold_moe, default: folded with fold_norm). --mla_norm_write=0: DeepSeek's kv_a_layernorm as
// its own kernel before the latent write (CudaBackendConfig::mla_norm_in_write, default: inside
// the write kernel, 16-bit latent pools). --mla_rope_write=0: k_pe's RoPE as its own kernel
// (CudaBackendConfig::mla_rope_in_write, default: in the write kernel too). --mla_fold=0:
// DeepSeek's batch-1 steps unfolded (CudaBackendConfig::mla_fold_norm, default: the norms inside
// the GEMVs). --mla_rows16=0: DeepSeek's small-batch latent attention on kSerial instead of
// the 16-row kernel (CudaBackendConfig::mla_rows16). --fp8_kv=1 (or its older name
// --fp8_latent_kv=1): the KV pool in FP8 (CudaBackendConfig::fp8_kv, --kv_cache_dtype=fp8):
// DeepSeek's latent rows (KV bytes 1 + 4 / (L + Dr) a value; TANDEM_MLA_ROWS16_FP8=0: its small
// batches on the 64-row FP8 kernel) or a GQA model's K and V (1 byte a value, one scale per
// tensor). --fp8_w8a16=0: FP8 batch-1 steps keep the W8A8 kernels instead of the weight-only GEMVs
// with the norms folded in (CudaBackendConfig::fp8_weight_only_fold; TANDEM_FP8_W16_EARLY=0: their
// first weight loads after the PDL wait, not before; TANDEM_FP8_W16_MMA=1 / 0: their tensor-core /
// fp32 inner loop everywhere, =ring / ring2 / ringhalf: the shared-memory ring forms
// (Fp8W16Math::kRing ...), =deep / splitk[2|4] / persistent / wide: the latency forms
// (kTensorCoreDeep / kTensorCoreSplitK / kTensorCorePersistent / kTensorCoreWide), =auto:
// Fp8W16Math::kAuto, unset / =waves: kAutoWaves). Prints per batch (rank 0): mean decode step time,
// tokens/s, the tokens/s the per-GPU weight + KV read roofline allows (bytes / 4.3 TB/s per step)
// and the step's share of it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "comm/gloo_process_group.h"
#include "comm/rank_spawn.h"
#include "comm/tcp_store.h"
#include "runtime/cuda/cuda_model_runner.h"
#include "runtime/cuda/decode_bench_config.h"
#include "runtime/cuda/kernel_trace.h"
#include "runtime/cuda/step_breakdown.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/tensor_parallel.h"

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

ModelConfig Llama3_70B() {
  ModelConfig c = Llama3_8B();
  c.hidden_size = 8192;
  c.intermediate_size = 28672;
  c.num_hidden_layers = 80;
  c.num_attention_heads = 64;
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
  int context = 1024, steps = 64, tp = 1;
  bool expert_parallel = false, dp_attention = false, dp_graphs = true;
  bool graphs = true, pdl = true, custom_ar = true, big = false;
  bool fused_norm = CudaBackendConfig().fuse_all_reduce_norm, ar_pdl = true, trace = false;
  bool prefill_trace = false;
  bool merge_in_kernel = CudaBackendConfig().decode_merge_in_kernel;
  bool attention_pdl = CudaBackendConfig().decode_attention_pdl;
  bool fold_norm = CudaBackendConfig().fold_norm, fold_rope = CudaBackendConfig().fold_rope;
  bool fp8_w8a16 = CudaBackendConfig().fp8_weight_only_fold;
  bool qk_norm_rope = CudaBackendConfig().qk_norm_rope, fold_moe = CudaBackendConfig().fold_moe;
  bool mla_norm_write = CudaBackendConfig().mla_norm_in_write;
  bool mla_fold = CudaBackendConfig().mla_fold_norm;
  bool mla_rows16 = CudaBackendConfig().mla_rows16;
  bool fp8_kv = false;
  bool mla_rope_write = CudaBackendConfig().mla_rope_in_write;
  int64_t vocab_greedy_min_rows = 64;
  std::string preset;
  std::vector<std::string> quants = {"none"};
  std::vector<int> async_modes = {0};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--async_scheduling=", 0) == 0) async_modes = ParseList(argv[i] + 19);
    if (a.rfind("--quantization=", 0) == 0) quants = absl::StrSplit(a.substr(15), ',');
    if (a.rfind("--batches=", 0) == 0) batches = ParseList(argv[i] + 10);
    if (a.rfind("--context=", 0) == 0) context = std::atoi(argv[i] + 10);
    if (a.rfind("--steps=", 0) == 0) steps = std::atoi(argv[i] + 8);
    if (a.rfind("--graphs=", 0) == 0) graphs = std::atoi(argv[i] + 9) != 0;
    if (a.rfind("--pdl=", 0) == 0) pdl = std::atoi(argv[i] + 6) != 0;
    if (a.rfind("--tp=", 0) == 0) tp = std::atoi(argv[i] + 5);
    if (a.rfind("--ep=", 0) == 0) expert_parallel = std::atoi(argv[i] + 5) != 0;
    if (a.rfind("--dp_attention=", 0) == 0) dp_attention = std::atoi(argv[i] + 15) != 0;
    if (a.rfind("--dp_graphs=", 0) == 0) dp_graphs = std::atoi(argv[i] + 12) != 0;
    if (a.rfind("--custom_ar=", 0) == 0) custom_ar = std::atoi(argv[i] + 12) != 0;
    if (a.rfind("--fused_norm=", 0) == 0) fused_norm = std::atoi(argv[i] + 13) != 0;
    if (a.rfind("--ar_pdl=", 0) == 0) ar_pdl = std::atoi(argv[i] + 9) != 0;
    if (a.rfind("--trace=", 0) == 0) trace = std::atoi(argv[i] + 8) != 0;
    if (a.rfind("--prefill_trace=", 0) == 0) prefill_trace = std::atoi(argv[i] + 16) != 0;
    if (a.rfind("--merge_in_kernel=", 0) == 0) merge_in_kernel = std::atoi(argv[i] + 18) != 0;
    if (a.rfind("--attention_pdl=", 0) == 0) attention_pdl = std::atoi(argv[i] + 16) != 0;
    if (a.rfind("--fold_norm=", 0) == 0) fold_norm = std::atoi(argv[i] + 12) != 0;
    if (a.rfind("--fold_rope=", 0) == 0) fold_rope = std::atoi(argv[i] + 12) != 0;
    if (a.rfind("--fp8_w8a16=", 0) == 0) fp8_w8a16 = std::atoi(argv[i] + 12) != 0;
    if (a.rfind("--qk_norm_rope=", 0) == 0) qk_norm_rope = std::atoi(argv[i] + 15) != 0;
    if (a.rfind("--fold_moe=", 0) == 0) fold_moe = std::atoi(argv[i] + 11) != 0;
    if (a.rfind("--mla_norm_write=", 0) == 0) mla_norm_write = std::atoi(argv[i] + 17) != 0;
    if (a.rfind("--mla_fold=", 0) == 0) mla_fold = std::atoi(argv[i] + 11) != 0;
    if (a.rfind("--mla_rows16=", 0) == 0) mla_rows16 = std::atoi(argv[i] + 13) != 0;
    if (a.rfind("--fp8_kv=", 0) == 0) fp8_kv = std::atoi(argv[i] + 9) != 0;
    if (a.rfind("--fp8_latent_kv=", 0) == 0) fp8_kv = std::atoi(argv[i] + 16) != 0;
    if (a.rfind("--mla_rope_write=", 0) == 0) mla_rope_write = std::atoi(argv[i] + 17) != 0;
    if (a.rfind("--vocab_greedy_min_rows=", 0) == 0) {
      vocab_greedy_min_rows = std::atoll(argv[i] + 24);
    }
    if (a == "--shape=70b") big = true;
    if (a.rfind("--shape=", 0) == 0 && a != "--shape=70b" && a != "--shape=8b") {
      preset = a.substr(8);
    }
  }
  const int rank = comm::SpawnedRank();
  if (tp > 1 && rank < 0) {  // the launcher: start the ranks, wait for them
    auto server = comm::TcpStoreServer::Start("127.0.0.1", 0);
    if (!server.ok()) return 1;
    std::vector<pid_t> pids;
    for (int r = 0; r < tp; ++r) {
      pids.push_back(comm::SpawnRank(r, tp, (*server)->port(),
                                     std::vector<std::string>(argv + 1, argv + argc)));
    }
    int rc = 0;
    for (pid_t p : pids) rc |= comm::WaitRank(p, absl::Minutes(9)) != 0;
    return rc;
  }
  ModelConfig model = big ? Llama3_70B() : Llama3_8B();
  if (!preset.empty()) {
    absl::StatusOr<ModelConfig> p = PresetConfig(preset);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
      return 1;
    }
    model = *p;
  }
  EngineConfig config;
  // A batch's prompts enter kBatchedTokens a step, and the first requests decode meanwhile: each
  // request gets that many steps (and the warm-up's 4) more to generate, so none finishes inside
  // the timed steps (which would time a smaller batch: the PARTIAL flag below).
  constexpr int64_t kBatchedTokens = 8192;
  auto prefill_steps = [&](int64_t batch) {
    return (batch * context + kBatchedTokens - 1) / kBatchedTokens + 4;
  };
  const int64_t most_prefill_steps =
      prefill_steps(batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end()));
  FitDecodeBenchLength(context, steps + most_prefill_steps, &model,
                       &config.max_model_len);  // before LocalModelConfig copies it
  CudaBackendConfig backend;
  backend.dummy_seed = 1;
  backend.enable_cuda_graphs = graphs;
  backend.dp_attention_graphs = dp_graphs;
  backend.programmatic_launch = pdl;
  backend.custom_all_reduce = custom_ar;
  backend.fuse_all_reduce_norm = fused_norm;
  backend.custom_all_reduce_pdl = ar_pdl;
  backend.vocab_parallel_greedy_min_rows = vocab_greedy_min_rows;
  backend.decode_merge_in_kernel = merge_in_kernel;
  backend.decode_attention_pdl = attention_pdl;
  backend.fold_norm = fold_norm;
  backend.fold_rope = fold_rope;
  backend.fp8_weight_only_fold = fp8_w8a16;
  backend.qk_norm_rope = qk_norm_rope;
  backend.fold_moe = fold_moe;
  backend.mla_norm_in_write = mla_norm_write;
  backend.mla_fold_norm = mla_fold;
  backend.mla_rows16 = mla_rows16;
  backend.fp8_kv = fp8_kv;
  backend.mla_rope_in_write = mla_rope_write;
  // Graphs for the measured batch sizes only: capture time is not what is measured here.
  backend.graph_batch_sizes.assign(batches.begin(), batches.end());
  std::unique_ptr<comm::GlooProcessGroup> group;
  ModelConfig local = model;
  const int me = rank < 0 ? 0 : rank;
  if (tp > 1) {
    comm::GlooGroupOptions g;
    g.rank = me;
    g.world_size = tp;
    g.store_port = comm::SpawnedPort();
    g.serve_store = false;
    g.timeout = absl::Seconds(120);
    auto made = comm::GlooProcessGroup::Create(g);
    TpShard shard{me, tp};
    shard.expert_parallel = expert_parallel || dp_attention;
    shard.dp_attention = dp_attention;
    auto plan = DummyWeightPlan(model, shard);
    auto local_config = LocalModelConfig(model, shard);
    if (!made.ok() || !plan.ok() || !local_config.ok()) return 1;
    group = *std::move(made);
    local = *local_config;
    backend.device = me;
    backend.group = group.get();
    backend.dummy_plan = *plan;
    backend.comm_timeout = absl::Seconds(120);
  }
  // Rank 0's kernels, recorded from before graph capture (KernelTrace).
  std::unique_ptr<KernelTrace> tracer;
  if (trace && me == 0) {
    absl::StatusOr<std::unique_ptr<KernelTrace>> started = KernelTrace::Start();
    if (!started.ok()) {
      std::fprintf(stderr, "--trace: %s\n", started.status().ToString().c_str());
    } else {
      tracer = *std::move(started);
    }
  }
  const ExecutorFactory factory = CudaExecutorFactory(backend);
  config.kv_cache_bytes = 0;  // the backend's default: a fraction of free memory
  config.max_num_batched_tokens = kBatchedTokens;
  config.max_num_seqs = 256;
  const double dense_bytes = static_cast<double>(model.NumParameters()) * 2.0 / tp;
  std::vector<std::pair<std::string, bool>> runs;  // (weight format, async scheduling)
  for (const std::string& quant : quants) {
    for (int async : async_modes) runs.emplace_back(quant, async != 0);
  }
  for (const auto& [quant, async] : runs) {
    config.async_scheduling = async;
    const bool online = quant == "fp8" || quant == "fp8_lm_head";
    if ((!online && quant != "none") || (online && (model.IsMla() || model.quantization.IsFp8()))) {
      std::fprintf(stderr,
                   "--quantization takes none (the shape's own weights), fp8 and fp8_lm_head "
                   "(Llama-family 16-bit shapes), got '%s'\n",
                   quant.c_str());
      return 1;
    }
    WeightQuantization q = model.quantization;  // a preset's own (qwen3-30b-a3b-fp8) or none
    if (online) {  // what generate --quantization=fp8 [--quantize_lm_head] sets (model_source.cc)
      q.method = WeightQuantization::Method::kOnlineFp8;
      q.block_rows = 1;
      q.activation = kernels::Fp8ActivationScheme::kDynamicToken;
      q.lm_head = quant == "fp8_lm_head";
    }
    const bool fp8 = q.IsFp8();
    local.quantization = q;
    // The decoder's q/k/v/o and dense gate/up/down weights: 1 byte each in FP8 (scales: 4
    // bytes a row or a 128-column group, not counted); MoE layers' experts below.
    double linear_params = 0.0;
    for (int64_t l = 0; l < model.num_hidden_layers && model.IsMla(); ++l) {
      // DeepSeek's FP8 format (the -fp8 presets): q_a, q_b (q_proj), kv_a_proj_with_mqa, o_proj,
      // the dense MLP and the shared experts e4m3; kv_b_proj stays 16-bit (widened at load).
      const double H = static_cast<double>(model.hidden_size);
      const double Rq = static_cast<double>(model.q_lora_rank);
      const double heads = static_cast<double>(model.num_attention_heads);
      linear_params +=
          Rq * H +
          heads * static_cast<double>(model.qk_nope_head_dim + model.qk_rope_head_dim) *
              (Rq > 0 ? Rq : H) +
          static_cast<double>(model.kv_lora_rank + model.qk_rope_head_dim) * H +
          H * heads * static_cast<double>(model.v_head_dim) +
          3.0 * H *
              static_cast<double>(model.IsMoeLayer(l) ? model.shared_expert_intermediate_size
                                                      : model.intermediate_size);
    }
    for (int64_t l = 0; l < model.num_hidden_layers && !model.IsMla(); ++l) {
      linear_params +=
          static_cast<double>((model.num_attention_heads + 2 * model.num_key_value_heads) *
                              model.head_dim * model.hidden_size) +
          static_cast<double>(model.hidden_size * model.num_attention_heads * model.head_dim) +
          (model.IsMoeLayer(l)
               ? 0.0
               : 3.0 * static_cast<double>(model.hidden_size * model.intermediate_size));
    }
    if (q.lm_head) {  // the head a step reads: 1 byte a weight (tied: its e4m3 copy)
      linear_params += static_cast<double>(model.vocab_size * model.hidden_size);
    }
    linear_params /= tp;
    const auto created = std::chrono::steady_clock::now();
    auto engine = Engine::Create(config, local, ModelWeights{}, {}, &factory);
    if (!engine.ok()) {
      std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
      return 1;
    }
    const double create_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
    // Bytes read per decode step on one GPU: its weights (bf16) and, per sequence, its KV heads.
    // MoE: the experts' share replaced per batch by the experts the batch routes to (routed_bytes).
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < model.num_hidden_layers; ++l) moe_layers += model.IsMoeLayer(l);
    const double expert_params = 3.0 * model.moe_intermediate_size * model.hidden_size / tp;
    const double weight_bytes =
        (dense_bytes - (fp8 ? linear_params : 0.0) -
         static_cast<double>(moe_layers) * model.num_experts * expert_params * 2.0);
    auto routed_bytes = [&](int batch) {  // FP8 experts: 1 byte a weight
      if (!model.IsMoe()) return 0.0;
      const double E = static_cast<double>(model.num_experts), k = model.num_experts_per_tok;
      const double active = E * (1.0 - std::pow(1.0 - k / E, batch));
      return static_cast<double>(moe_layers) * active * expert_params * (fp8 ? 1.0 : 2.0);
    };
    // MLA (DeepSeek): one latent row of kv_lora_rank + qk_rope_head_dim per layer, whole on every
    // rank; otherwise K and V of the rank's KV heads.
    const double kv_bytes_per_token =
        model.IsMla() ? static_cast<double>(model.num_hidden_layers) *
                            (static_cast<double>(model.kv_lora_rank + model.qk_rope_head_dim) *
                                 (fp8_kv ? 1.0 : 2.0) +
                             (fp8_kv ? 4.0 : 0.0))
                      : 2.0 * (fp8_kv ? 1.0 : 2.0) * static_cast<double>(model.num_hidden_layers) *
                            static_cast<double>(local.num_key_value_heads * model.head_dim);
    const bool print = me == 0;
    if (print) {
      std::printf(
          "%s shapes, tp %d, dummy %s weights (%.2f GB per GPU, engine up in %.1f s), "
          "CUDA graphs %s, PDL %s, all-reduce %s, async scheduling %s, norms folded %s%s%s%s%s%s, "
          "KV pool %s\n",
          preset.empty() ? (big ? "Llama-3-70B" : "Llama-3-8B") : preset.c_str(), tp,
          fp8 ? q.Describe().c_str() : "bf16", (weight_bytes + routed_bytes(1 << 20)) / 1e9,
          create_s, graphs ? "on" : "off", pdl ? "on" : "off",
          custom_ar ? (fused_norm ? "custom+nccl, fused add+norm" : "custom+nccl") : "nccl",
          (*engine)->async_scheduling() ? "on" : "off", fold_norm ? "on" : "off",
          fp8 ? (fp8_w8a16 ? ", FP8 batch 1 W8A16" : ", FP8 batch 1 W8A8") : "",
          model.IsMoe() ? (fold_moe ? ", MoE fold on" : ", MoE fold off") : "",
          model.qk_norm ? (qk_norm_rope ? ", qk-norm in RoPE" : ", qk-norm kernel") : "",
          model.kv_lora_rank > 0
              ? (mla_norm_write ? (mla_rope_write ? ", kv_a norm + k_pe RoPE in latent write"
                                                  : ", kv_a norm in latent write")
                                : ", kv_a norm kernel")
              : "",
          model.kv_lora_rank > 0 ? (mla_fold ? ", MLA fold on" : ", MLA fold off") : "",
          fp8_kv ? "fp8_e4m3" : "bf16");
      if (tp > 1) {
        std::printf(
            "greedy steps of >= %lld logit rows (0: none) sample from vocab-parallel "
            "candidates\n",
            static_cast<long long>(vocab_greedy_min_rows));
      }
      if (tp > 1 && (expert_parallel || dp_attention)) {
        std::printf("%s\n", !dp_attention ? "EP a: experts over the TP ranks; tok/s per GPU = "
                                            "tok/s / tp"
                            : dp_graphs   ? "EP b: data-parallel attention + EP, batch per rank, "
                                            "fixed-capacity dispatch, graphs; tok/s per GPU = tok/s"
                                          : "EP b: data-parallel attention + EP, batch per rank, "
                                            "eager (counts read back); tok/s per GPU = tok/s");
      }
      std::printf("%6s %8s %12s %12s %12s %10s\n", "batch", "context", "step_ms", "tok/s",
                  "roofline", "% roof");
    }
    int64_t next_id = 0;
    for (int batch : batches) {
      for (int b = 0; b < batch; ++b) {
        RequestSpec spec;
        spec.prompt.resize(context);
        // Ids in [1000, vocab): the Llama shapes' 100000 span, smaller vocabularies' whole range.
        const int64_t span = std::min<int64_t>(100000, model.vocab_size - 1000);
        const int64_t salt = dp_attention ? me * 104729 : 0;  // each DP rank its own prompts
        for (int t = 0; t < context; ++t) {
          spec.prompt[t] = 1000 + (t * 7919 + b * 31 + salt) % span;
        }
        spec.max_tokens = steps + kDecodeBenchExtraTokens + prefill_steps(batch);
        spec.ignore_eos = true;
        if (auto st = (*engine)->AddRequest(next_id++, spec); !st.ok()) {
          std::fprintf(stderr, "add: %s\n", st.ToString().c_str());
          return 1;
        }
      }
      // Prefill (and the first decode steps, which capture graphs) untimed; with --prefill_trace
      // the first step (the prefill of batch x context tokens where they fit one step) traced.
      if (tracer != nullptr && prefill_trace) {
        cudaDeviceSynchronize();
        if (!tracer->Collect().ok()) return 1;  // drop what ran before this batch
      }
      int warm = 0;
      for (bool first = true; (*engine)->num_waiting() > 0 || warm < 4; first = false) {
        const auto s0 = std::chrono::steady_clock::now();
        auto u = (*engine)->Step();
        if (!u.ok()) {
          std::fprintf(stderr, "step: %s\n", u.status().ToString().c_str());
          return 1;
        }
        if ((*engine)->num_waiting() == 0) ++warm;
        if (first && tracer != nullptr && prefill_trace) {
          cudaDeviceSynchronize();
          const double step_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0)
                  .count();
          absl::StatusOr<std::vector<KernelRecord>> records = tracer->Collect();
          if (!records.ok()) return 1;
          std::printf("rank 0 kernels of the first step of batch %d x context %d (%.3f ms):\n%s",
                      batch, context, step_ms,
                      FormatBreakdown(BreakDownSteps(*records, 1), step_ms).c_str());
        }
      }
      if (tracer != nullptr) {
        cudaDeviceSynchronize();
        if (!tracer->Collect().ok()) return 1;  // drop the prefill's and warm-up's kernels
      }
      const ExecutorStats before = (*engine)->executor_stats();
      // The fewest requests a timed step ran: below `batch` when the KV pool cannot hold batch x
      // (context + steps) tokens and the scheduler preempts or holds some back; such a row is
      // not this batch's time (it is flagged below).
      int64_t fewest = (*engine)->num_running();
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        auto u = (*engine)->Step();
        if (!u.ok()) {
          std::fprintf(stderr, "step: %s\n", u.status().ToString().c_str());
          return 1;
        }
        fewest = std::min(fewest, (*engine)->num_running());
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          steps;
      const double tok_s = batch * 1000.0 / ms;
      const double roof_ms = (weight_bytes + routed_bytes(batch) +
                              kv_bytes_per_token * batch * (context + steps / 2.0)) /
                             4.3e12 * 1e3;
      const ExecutorStats after = (*engine)->executor_stats();
      const int64_t launches = after.graph_steps - before.graph_steps;
      if (print) {
        std::printf("%6d %8d %12.3f %12.1f %12.1f %9.1f%%", batch, context, ms, tok_s,
                    batch * 1000.0 / roof_ms, 100.0 * roof_ms / ms);
        if (fewest < batch) {
          std::printf(
              "   PARTIAL: as few as %lld of %d requests ran a step (the KV pool holds "
              "fewer than batch x context tokens)",
              static_cast<long long>(fewest), batch);
        }
        if (launches > 0) {  // host time inside cudaGraphLaunch (GPU idle through most of it)
          std::printf(
              "   graph launch %.1f us",
              static_cast<double>(after.graph_launch_ns - before.graph_launch_ns) / launches / 1e3);
        }
        std::printf(
            "   split merge in kernel %lld/%d steps, cluster %lld/%d   norms folded %lld/%d   rope "
            "folded %lld/%d\n",
            static_cast<long long>(after.split_merge_in_kernel_steps -
                                   before.split_merge_in_kernel_steps),
            steps,
            static_cast<long long>(after.split_merge_cluster_steps -
                                   before.split_merge_cluster_steps),
            steps, static_cast<long long>(after.folded_norm_steps - before.folded_norm_steps),
            steps, static_cast<long long>(after.folded_rope_steps - before.folded_rope_steps),
            steps);
        std::fflush(stdout);
      }
      if (tracer != nullptr) {
        cudaDeviceSynchronize();
        absl::StatusOr<std::vector<KernelRecord>> records = tracer->Collect();
        if (!records.ok()) return 1;
        std::printf("rank 0 kernels over the %d steps above (traced), batch %d:\n%s", steps, batch,
                    FormatBreakdown(BreakDownSteps(*records, steps), ms).c_str());
        std::fflush(stdout);
      }
      while ((*engine)->HasUnfinished()) {
        auto u = (*engine)->Step();
        if (!u.ok()) return 1;
      }
    }
  }  // quant
  if (me == 0) {
    std::printf("roofline = (weight + KV bytes per GPU) / 4.3 TB/s per step%s\n",
                model.IsMoe() ? "; MoE: non-expert weights + the experts a uniform routing of the "
                                "batch reads"
                              : "");
  }
  return 0;
}

}  // namespace
}  // namespace tandem::runtime::cuda

int main(int argc, char** argv) { return tandem::runtime::cuda::Main(argc, argv); }
