// Backend selection (--backend / --dtype) and model loading for a backend. Runs without a GPU:
// building a CUDA factory does not touch the device.
#include "runtime/engine/backend_factory.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/no_collectives_group.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_weights.h"
#include "runtime/model/mtp_weights.h"

namespace tandem::runtime {
namespace {

ModelConfig Tiny(WeightDtype dtype = WeightDtype::kF32) {
  absl::StatusOr<ModelConfig> config = PresetConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  config->dtype = dtype;
  return *config;
}

TEST(BackendFactoryTest, CpuBackend) {
  BackendOptions options;
  options.num_threads = 3;
  absl::StatusOr<ExecutorFactory> factory = MakeExecutorFactory(options, Tiny());
  ASSERT_TRUE(factory.ok()) << factory.status();
  EXPECT_EQ(factory->name, "cpu");
  EXPECT_EQ(factory->kv_elem_bytes(), 4);
  EXPECT_TRUE(factory->accepts_external_pool);
  options.num_threads = 0;
  EXPECT_EQ(MakeExecutorFactory(options, Tiny()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, RejectsUnknownBackendAndDtype) {
  BackendOptions options;
  options.backend = "tpu";
  absl::Status st = MakeExecutorFactory(options, Tiny()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tpu"), absl::string_view::npos) << st;
  options.backend = "cuda";
  options.dtype = "fp8";
  st = MakeExecutorFactory(options, Tiny()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("fp8"), absl::string_view::npos) << st;
  options.dtype = "bf16";
  options.prefill_kernel = "flash";
  st = MakeExecutorFactory(options, Tiny()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--prefill_kernel"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("flash"), absl::string_view::npos) << st;
}

// Qwen3 and the MoE families are CUDA models (issue 32): accepted where a toolkit built the
// backend; more experts than the CUDA MoE kernels take are refused naming the numbers.
TEST(BackendFactoryTest, CudaTakesMoeAndQwen3) {
  BackendOptions options;
  options.backend = "cuda";
  for (const char* config :
       {R"({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2})",
        R"({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2})",
        R"({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2})"}) {
    absl::StatusOr<ModelConfig> model = ParseModelConfig(config);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::Status st = MakeExecutorFactory(options, *model).status();
    if (CudaBackendAvailable()) {
      EXPECT_TRUE(st.ok()) << st;
    } else {
      EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
      EXPECT_NE(st.message().find("without the CUDA toolkit"), absl::string_view::npos) << st;
    }
  }
  absl::StatusOr<ModelConfig> many = ParseModelConfig(
      R"({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2,
          "num_experts": 1024, "num_experts_per_tok": 8})");
  ASSERT_TRUE(many.ok()) << many.status();
  absl::Status st = MakeExecutorFactory(options, *many).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("1024 experts"), absl::string_view::npos) << st;
  EXPECT_NE(st.message().find("512"), absl::string_view::npos) << st;
}

TEST(BackendFactoryTest, CudaBackendOrAClearError) {
  BackendOptions options;
  options.backend = "cuda";
  absl::StatusOr<ExecutorFactory> bf16 = MakeExecutorFactory(options, Tiny());
  if (!CudaBackendAvailable()) {
    EXPECT_EQ(bf16.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(bf16.status().message().find("--backend=cpu"), absl::string_view::npos);
    return;
  }
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->name, "cuda:bf16");  // auto: f32 checkpoints are served in bf16
  EXPECT_EQ(bf16->kv_elem_bytes(), 2);
  EXPECT_FALSE(bf16->accepts_external_pool);
  EXPECT_TRUE(static_cast<bool>(bf16->default_kv_cache_bytes));
  absl::StatusOr<ExecutorFactory> fp16 = MakeExecutorFactory(options, Tiny(WeightDtype::kF16));
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ(fp16->name, "cuda:fp16");  // auto: f16 checkpoints stay in fp16
  options.dtype = "bf16";
  EXPECT_EQ(MakeExecutorFactory(options, Tiny(WeightDtype::kF16))->name, "cuda:bf16");
  // DCP: the engine books KV per shard from the factory's dcp_size / dcp_interleave.
  options.dcp_size = 2;
  options.dcp_interleave = 4;
  absl::StatusOr<ExecutorFactory> dcp = MakeExecutorFactory(options, Tiny());
  ASSERT_TRUE(dcp.ok()) << dcp.status();
  EXPECT_EQ(dcp->dcp_size, 2);
  EXPECT_EQ(dcp->dcp_interleave, 4);
}

// --speculative_method=mtp's executor (issue 34): the CPU MtpModel, or on "cuda" the CUDA MTP
// runner where a toolkit built the backend (a clear error otherwise); the target's group options,
// device dummy weights and FP8 KV do not reach it (the MTP layer runs in this process from host
// weights, on its own 16-bit latent pool); a bad backend is refused as MakeExecutorFactory does.
TEST(BackendFactoryTest, MtpExecutorOnTheTargetsBackend) {
  absl::StatusOr<ModelConfig> mla = PresetConfig("tiny-mla");
  ASSERT_TRUE(mla.ok()) << mla.status();
  mla->num_nextn_predict_layers = 1;
  BackendOptions options;
  options.num_threads = 1;
  options.dcp_size = 2;
  options.dummy_seed = 7;
  options.kv_cache_dtype = "fp8";
  absl::StatusOr<MtpExecutorFactory> cpu = MakeMtpExecutorFactory(options, *mla);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ExecutorSpec spec;
  spec.model_config = *mla;
  spec.num_blocks = 2;
  spec.block_size = 16;
  spec.max_num_batched_tokens = 16;
  spec.max_num_seqs = 1;
  spec.max_model_len = 32;
  absl::StatusOr<std::unique_ptr<ModelExecutor>> executor =
      (*cpu)(spec, RandomMtpWeights(*mla, RandomModelWeights(*mla, 5), 5));
  ASSERT_TRUE(executor.ok()) << executor.status();
  const int64_t H = mla->hidden_size;
  const std::vector<int32_t> tokens = {5, 9, 11};
  const std::vector<BlockId> blocks = {0};
  std::vector<float> hidden(3 * H);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = 0.01f * static_cast<float>(i % 37) - 0.2f;
  SchedulerOutput step;
  ScheduledSeq seq;
  seq.new_tokens = tokens;
  seq.block_table = blocks;
  seq.samples = true;
  step.seqs.push_back(seq);
  step.num_batched_tokens = 3;
  step.return_hidden_states = true;
  step.input_hidden = hidden;
  absl::StatusOr<RunnerOutput> out = (*executor)->Run(step);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(static_cast<int64_t>(out->hidden_states.size()), 3 * H);  // y of every row
  EXPECT_GE(out->sampled_tokens[0], 0);

  options.backend = "cuda";
  absl::StatusOr<MtpExecutorFactory> cuda = MakeMtpExecutorFactory(options, *mla);
  if (CudaBackendAvailable()) {
    EXPECT_TRUE(cuda.ok()) << cuda.status();  // builds nothing on the device yet
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnimplemented) << cuda.status();
  }
  options.backend = "tpu";
  EXPECT_EQ(MakeMtpExecutorFactory(options, *mla).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --kv_cache_dtype=fp8 (kv_layout.h): a DeepSeek MLA latent in FP8 on either backend, with DCP
// and groups; a GQA model's FP8 K / V on either backend too (CUDA: head_dim 64 / 128, the CPU any);
// unknown spellings refused by name.
TEST(BackendFactoryTest, Fp8KvOnEitherBackend) {
  absl::StatusOr<ModelConfig> mla = PresetConfig("tiny-mla");
  ASSERT_TRUE(mla.ok()) << mla.status();
  BackendOptions options;
  options.kv_cache_dtype = "fp8";
  absl::StatusOr<ExecutorFactory> cpu = MakeExecutorFactory(options, *mla);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kv_dtype, KvDtype::kFp8E4m3);
  EXPECT_EQ(cpu->name, "cpu:fp8-kv");
  absl::StatusOr<ExecutorFactory> cpu_gqa = MakeExecutorFactory(options, Tiny());
  ASSERT_TRUE(cpu_gqa.ok()) << cpu_gqa.status();
  EXPECT_EQ(cpu_gqa->kv_dtype, KvDtype::kFp8E4m3);
  ModelConfig odd = Tiny();
  odd.head_dim = 96;  // the CPU attention reads any head_dim
  EXPECT_TRUE(MakeExecutorFactory(options, odd).ok());
  absl::Status st;
  {
    BackendOptions gqa = options;
    gqa.backend = "cuda";
    ModelConfig llama = *PresetConfig("llama3-8b");
    absl::StatusOr<ExecutorFactory> f = MakeExecutorFactory(gqa, llama);
    EXPECT_EQ(f.ok(), CudaBackendAvailable()) << f.status();
    if (f.ok()) {
      EXPECT_EQ(f->kv_dtype, KvDtype::kFp8E4m3);
      EXPECT_EQ(KvBlockBytes(llama, 16, f->kv_dtype), KvBlockBytes(llama, 16, KvDtype::kBf16) / 2);
    }
    llama.head_dim = 96;  // the FP8 prefill kernel reads head_dim 64 / 128
    st = MakeExecutorFactory(gqa, llama).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
    EXPECT_NE(st.message().find("head_dim 64 or 128"), std::string::npos) << st;
  }
  // DCP (and tensor-parallel groups) on either backend (CUDA: where this build has it).
  options.dcp_size = 2;
  EXPECT_TRUE(MakeExecutorFactory(options, *mla).ok());
  options.backend = "cuda";
  st = MakeExecutorFactory(options, *mla).status();
  EXPECT_EQ(st.ok(), CudaBackendAvailable()) << st;
  if (!st.ok()) {
    EXPECT_NE(st.message().find("without the CUDA toolkit"), std::string::npos) << st;
  }
  options.backend = "cpu";
  options.dcp_size = 1;
  options.kv_cache_dtype = "int4";
  st = MakeExecutorFactory(options, *mla).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("--kv_cache_dtype"), std::string::npos) << st;
  if (!CudaBackendAvailable()) return;
  options.kv_cache_dtype = "fp8";
  options.backend = "cuda";
  absl::StatusOr<ExecutorFactory> cuda = MakeExecutorFactory(options, *mla);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->kv_dtype, KvDtype::kFp8E4m3);
}

// --kv_cache_dtype=fp8 with --dp_attention in a group of 2: the CPU backend wraps its FP8 latent
// runner in the DP executor (each DP rank's pool of FP8 latent blocks; the generate golden:
// tests/golden/mla_fp8_kv_parallel_test.sh); CUDA wraps its runner the same way where the build
// has CUDA (tests/gpu/mla_fp8_cuda_golden.sh fp8-tp2-ep-dp).
TEST(BackendFactoryTest, Fp8LatentKvWithDpAttentionOnBothBackends) {
  absl::StatusOr<ModelConfig> mla = PresetConfig("tiny-mla");
  ASSERT_TRUE(mla.ok()) << mla.status();
  comm::NoCollectivesGroup group(0, 2);  // factories read the group's size only
  BackendOptions options;
  options.kv_cache_dtype = "fp8";
  options.group = &group;
  options.expert_parallel = true;
  options.dp_attention = true;
  absl::StatusOr<ExecutorFactory> cpu = MakeExecutorFactory(options, *mla);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->kv_dtype, KvDtype::kFp8E4m3);
  EXPECT_EQ(cpu->dp_size, 2);
  EXPECT_EQ(cpu->name, "cpu:fp8-kv dp-attention");
  options.backend = "cuda";
  absl::StatusOr<ExecutorFactory> cuda = MakeExecutorFactory(options, *mla);
  EXPECT_EQ(cuda.ok(), CudaBackendAvailable()) << cuda.status();
  if (cuda.ok()) {
    EXPECT_EQ(cuda->kv_dtype, KvDtype::kFp8E4m3);
    EXPECT_EQ(cuda->dp_size, 2);
  }
  // A group of one has no DP ranks: CUDA's one-GPU FP8 latent (where the build has CUDA).
  comm::NoCollectivesGroup one(0, 1);
  options.group = &one;
  EXPECT_EQ(MakeExecutorFactory(options, *mla).ok(), CudaBackendAvailable());
}

// LoadModelForBackend of `source` on the CPU and on CUDA; false when the CUDA load is not there
// to check (a build without CUDA refuses it as UNIMPLEMENTED, checked here) or failed.
bool LoadOnCpuAndCuda(const ModelSource& source, BackendModel* cpu, BackendModel* cuda) {
  absl::StatusOr<BackendModel> on_cpu = LoadModelForBackend(source, BackendOptions());
  EXPECT_TRUE(on_cpu.ok()) << on_cpu.status();
  if (on_cpu.ok()) *cpu = std::move(*on_cpu);
  BackendOptions options;
  options.backend = "cuda";
  absl::StatusOr<BackendModel> on_cuda = LoadModelForBackend(source, options);
  if (!CudaBackendAvailable()) {
    EXPECT_EQ(on_cuda.status().code(), absl::StatusCode::kUnimplemented);
    return false;
  }
  EXPECT_TRUE(on_cuda.ok()) << on_cuda.status();
  if (!on_cuda.ok() || !on_cpu.ok()) return false;
  *cuda = std::move(*on_cuda);
  return true;
}

TEST(BackendFactoryTest, LoadModelForBackendGeneratesDummyWeightsWhereTheyRun) {
  ModelSource source;
  source.load_format = "dummy";
  source.dummy_config = "tiny";
  source.dummy_seed = 3;
  BackendModel on_cpu, on_cuda;
  const bool cuda = LoadOnCpuAndCuda(source, &on_cpu, &on_cuda);
  EXPECT_EQ(on_cpu.factory.name, "cpu");
  EXPECT_FALSE(on_cpu.model.weights.embed_tokens.empty());
  EXPECT_EQ(on_cpu.model.model_id, "dummy:tiny:3");
  if (!cuda) return;
  // The device generates them: the host loads the config only, and the id says so (a CPU and a
  // CUDA worker with the same seed hold different weights and must not pair).
  EXPECT_TRUE(on_cuda.model.weights.embed_tokens.empty());
  EXPECT_TRUE(on_cuda.model.weights.layers.empty());
  EXPECT_EQ(on_cuda.model.model_id, "dummy:tiny:3:backend");
}

// A dense 16/32-bit checkpoint on CUDA is read by the backend itself (runtime/cuda/
// checkpoint_upload.h): the host gets the config and no weights, the factory the rank's source;
// MoE checkpoints, --checkpoint_on_device=false and the CPU backend load fp32 host weights.
TEST(BackendFactoryTest, LoadModelForBackendReadsDenseCheckpointsOnTheDevice) {
  const std::string dir = ::testing::TempDir() + "/factory_ckpt";
  const std::string moe_dir = ::testing::TempDir() + "/factory_ckpt_moe";
  ASSERT_TRUE(WriteDummyModel(Tiny(WeightDtype::kBF16), dir, 1).ok());
  ASSERT_TRUE(WriteDummyModel(*PresetConfig("tiny-moe"), moe_dir, 1).ok());
  ModelSource source;
  source.model_dir = dir;
  BackendModel on_cpu, on_cuda;
  const bool cuda = LoadOnCpuAndCuda(source, &on_cpu, &on_cuda);
  EXPECT_FALSE(on_cpu.model.weights.layers.empty());
  if (!cuda) return;
  EXPECT_TRUE(on_cuda.model.weights.layers.empty());
  EXPECT_TRUE(on_cuda.model.weights.embed_tokens.empty());
  EXPECT_EQ(on_cuda.model.model_id, on_cpu.model.model_id);  // the same weights either way
  BackendOptions options;
  options.backend = "cuda";
  options.checkpoint_on_device = false;
  absl::StatusOr<BackendModel> via_host = LoadModelForBackend(source, options);
  ASSERT_TRUE(via_host.ok()) << via_host.status();
  EXPECT_FALSE(via_host->model.weights.layers.empty());
  options.checkpoint_on_device = true;
  source.model_dir = moe_dir;
  absl::StatusOr<BackendModel> moe = LoadModelForBackend(source, options);
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_FALSE(moe->model.weights.layers.empty());
}

TEST(BackendFactoryTest, EngineNeedsABudgetOrABackendDefault) {
  EngineConfig config;
  config.kv_cache_bytes = 0;  // the CPU backend has no default budget
  const ModelConfig model = Tiny();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(config, model, RandomModelWeights(model, 1));
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("cpu"), absl::string_view::npos) << engine.status();
  ExecutorFactory empty;  // no create(): refused before anything is built
  config.kv_cache_bytes = int64_t{1} << 20;
  engine = Engine::Create(config, model, RandomModelWeights(model, 1), {}, &empty);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
}

// tiny-mla with DeepSeek's MoE layers, as an FP8 (128 x 128 blocks) checkpoint's config.
absl::StatusOr<ModelConfig> Fp8MlaMoe() {
  absl::StatusOr<ModelConfig> mla = PresetConfig("tiny-mla");
  if (!mla.ok()) return mla;
  mla->num_experts = 4;
  mla->num_experts_per_tok = 2;
  mla->moe_intermediate_size = 32;
  mla->quantization.method = WeightQuantization::Method::kFp8Block;
  return mla;
}

// FP8 checkpoints of DeepSeek's MLA + MoE models on CUDA (issue 38: cuda_moe_fp8.h,
// cuda_mla_model_fp8.cc): accepted where the build has CUDA (nothing built on the device yet),
// their FP8 MTP layer too (its block through the same FP8 path: cuda_mtp_model.h), and as device
// dummy FP8 weights (drawn and quantized on the device: cuda_mla_fp8_dummy_test; refused by name
// before). A build without CUDA refuses every CUDA factory: MtpExecutorOnTheTargetsBackend.
TEST(BackendFactoryTest, Fp8MlaAndMoeCheckpointsOnCuda) {
  absl::StatusOr<ModelConfig> mla = Fp8MlaMoe();
  ASSERT_TRUE(mla.ok()) << mla.status();
  mla->num_nextn_predict_layers = 1;
  BackendOptions options;
  options.backend = "cuda";
  options.num_threads = 1;
  absl::Status st = MakeExecutorFactory(options, *mla).status();
  EXPECT_EQ(st.ok(), CudaBackendAvailable()) << st;
  if (!CudaBackendAvailable()) return;
  st = MakeMtpExecutorFactory(options, *mla).status();
  EXPECT_TRUE(st.ok()) << st;
  options.dummy_seed = 3;
  st = MakeExecutorFactory(options, *mla).status();
  EXPECT_TRUE(st.ok()) << st;
}

// FP8 experts under data-parallel attention + EP (b) on CUDA (issues 32 / 38: CudaMoeMlp's
// dispatched forward runs the rank's e4m3 experts on the rows it receives): a compressed-tensors
// Qwen3-MoE config and DeepSeek's FP8 MLA + MoE config with --dp_attention in a group of 2 get
// the DP executor where the build has CUDA, the Qwen3-MoE also as device dummy weights (drawn
// and quantized on the device: cuda_moe_fp8_dummy_test).
TEST(BackendFactoryTest, Fp8ExpertsUnderDpAttentionOnCuda) {
  absl::StatusOr<ModelConfig> moe = ParseModelConfig(
      R"({"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2,
          "num_experts": 8, "num_experts_per_tok": 2})");
  ASSERT_TRUE(moe.ok()) << moe.status();
  moe->quantization.method = WeightQuantization::Method::kCompressedTensors;
  absl::StatusOr<ModelConfig> mla = Fp8MlaMoe();
  ASSERT_TRUE(mla.ok()) << mla.status();
  comm::NoCollectivesGroup group(0, 2);  // factories read the group's size only
  BackendOptions options;
  options.backend = "cuda";
  options.num_threads = 1;
  options.group = &group;
  options.expert_parallel = true;
  options.dp_attention = true;
  for (const ModelConfig* model : {&*moe, &*mla}) {
    absl::StatusOr<ExecutorFactory> factory = MakeExecutorFactory(options, *model);
    EXPECT_EQ(factory.ok(), CudaBackendAvailable()) << factory.status();
    if (!CudaBackendAvailable()) return;
    ASSERT_TRUE(factory.ok()) << model->architecture << ": " << factory.status();
    EXPECT_EQ(factory->dp_size, 2);
    EXPECT_NE(factory->name.find("dp-attention"), std::string::npos) << factory->name;
  }
  options.dummy_seed = 3;
  absl::StatusOr<ExecutorFactory> dummy = MakeExecutorFactory(options, *moe);
  ASSERT_TRUE(dummy.ok()) << dummy.status();
  EXPECT_EQ(dummy->dp_size, 2);
  options.group = nullptr;  // one GPU
  options.expert_parallel = options.dp_attention = false;
  EXPECT_TRUE(MakeExecutorFactory(options, *moe).ok());
}

// Dummy weights of `preset` (quantized as `quantization` says) on the CPU backend.
absl::StatusOr<BackendModel> DummyOnCpu(const std::string& preset,
                                        const std::string& quantization = "") {
  ModelSource source;
  source.load_format = "dummy";
  source.dummy_config = preset;
  source.quantization = quantization;
  BackendOptions options;
  options.backend = "cpu";
  options.num_threads = 1;
  return LoadModelForBackend(source, options);
}

// Dummy weights of an FP8 MoE config on the CPU (the reference the CUDA backend's device draw is
// checked against): --quantization=fp8 on tiny-moe, and the qwen3-30b-a3b-fp8 preset's scheme on
// a tiny-moe shape, load with e4m3 experts (the router 16-bit) and the scheme's scale grid.
TEST(BackendFactoryTest, DummyFp8MoeWeightsOnCpu) {
  absl::StatusOr<BackendModel> online = DummyOnCpu("tiny-moe", "fp8");
  ASSERT_TRUE(online.ok()) << online.status();
  const ModelConfig& c = online->model.config;
  const LayerWeights& l = online->model.weights.layers[0];
  EXPECT_TRUE(l.experts_gate_up.empty());
  EXPECT_FALSE(l.router.empty());
  EXPECT_EQ(l.experts_gate_up_fp8.grid.rows, c.num_experts * 2 * c.moe_intermediate_size);
  EXPECT_EQ(l.experts_gate_up_fp8.grid.block_cols, c.hidden_size);  // per-channel
  EXPECT_EQ(l.experts_down_fp8.grid.cols, c.moe_intermediate_size);
  EXPECT_EQ(l.experts_down_fp8.activation, kernels::Fp8ActivationScheme::kDynamicToken);
  EXPECT_TRUE(online->factory.create != nullptr);

  absl::StatusOr<ModelConfig> fp8 = PresetConfig("qwen3-30b-a3b-fp8");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  absl::StatusOr<ModelConfig> tiny = PresetConfig("tiny-moe");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  tiny->hidden_size = 256;  // two 128-column groups
  tiny->quantization = fp8->quantization;
  absl::StatusOr<ModelWeights> w = RandomModelWeights(*tiny, 5, TpShard{});
  ASSERT_TRUE(w.ok()) << w.status();
  const Fp8LinearWeight& gu = w->layers[1].experts_gate_up_fp8;
  EXPECT_EQ(gu.grid.block_cols, 128);
  EXPECT_EQ(gu.scales.size(), static_cast<size_t>(gu.grid.rows * 2));
  EXPECT_EQ(gu.activation, kernels::Fp8ActivationScheme::kDynamicGroup128);
  // A TP rank's slice of every expert is quantized at the rank's widths (its half of Ie).
  absl::StatusOr<ModelWeights> rank = RandomModelWeights(*tiny, 5, TpShard{1, 2});
  ASSERT_TRUE(rank.ok()) << rank.status();
  const Fp8LinearWeight& down = rank->layers[1].experts_down_fp8;
  EXPECT_EQ(down.grid.cols, tiny->moe_intermediate_size / 2);
  EXPECT_EQ(down.grid.rows, tiny->num_experts * tiny->hidden_size);
}

// DeepSeek's FP8 format as dummy weights on the CPU (the reference of the CUDA backend's device
// draw, cuda_mla_fp8_dummy_test): the tiny-mla-fp8 preset (DeepSeek-V3's quantization_config)
// loads with every decoder projection e4m3 over 128 x 128 tiles (kv_b_proj widened, the router
// and embeddings 16/32-bit), and the CPU engine generates from it. Before: refused ("FP8 weights
// quantized at load are not supported for DeepseekV3ForCausalLM").
TEST(BackendFactoryTest, DummyFp8MlaWeightsOnCpu) {
  absl::StatusOr<BackendModel> loaded = DummyOnCpu("tiny-mla-fp8");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ModelConfig& c = loaded->model.config;
  ASSERT_TRUE(c.IsMla());
  EXPECT_TRUE(Fp8QuantizesTiles(c.quantization));
  for (const LayerWeights& l : loaded->model.weights.layers) {
    for (const Fp8LinearWeight* w : {&l.q_a_fp8, &l.q_fp8, &l.kv_a_fp8, &l.o_fp8}) {
      EXPECT_FALSE(w->empty());
      EXPECT_EQ(w->grid.block_cols, 128);
      EXPECT_EQ(w->activation, kernels::Fp8ActivationScheme::kDynamicGroup128);
    }
    EXPECT_EQ(l.kv_a_fp8.grid.rows, c.kv_lora_rank + c.qk_rope_head_dim);
    EXPECT_TRUE(l.q_a_proj.empty() && l.q_proj.empty() && l.kv_a_proj.empty());
    EXPECT_TRUE(l.kv_b_fp8.empty());  // used absorbed: widened as the loader widens it
    EXPECT_EQ(static_cast<int64_t>(l.kv_b_proj.size()),
              c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank);
  }
  EngineConfig config;
  config.kv_cache_bytes = int64_t{1} << 20;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(config, c, std::move(loaded->model.weights), {}, &loaded->factory);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RequestSpec spec;
  spec.prompt = {5, 17, 42, 9, 100, 3};
  spec.max_tokens = 4;
  spec.ignore_eos = true;
  ASSERT_TRUE((*engine)->AddRequest(1, spec).ok());
  int64_t tokens = 0;
  while ((*engine)->HasWork()) {
    absl::StatusOr<std::vector<RequestUpdate>> updates = (*engine)->Step();
    ASSERT_TRUE(updates.ok()) << updates.status();
    for (const RequestUpdate& u : *updates) {
      for (int32_t t : u.new_token_ids) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, c.vocab_size);
        ++tokens;
      }
    }
  }
  EXPECT_EQ(tokens, 4);
}

}  // namespace
}  // namespace tandem::runtime
