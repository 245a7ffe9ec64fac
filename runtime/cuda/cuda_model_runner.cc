#include "runtime/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "comm/host_staged_communicator.h"
#include "comm/nccl_communicator.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/sampling/cuda/sampling_cuda.h"
#include "runtime/engine/kv_layout.h"
#include "runtime/kv_cache/dcp_blocks.h"

namespace tandem::runtime::cuda {
namespace {

// The workspace an FP8 K / V pool's prefill widening takes (CudaBackendConfig::
// prefill_fp8_widen_max_bytes) where it can run: a GQA model's FP8 pool on the wgmma prefill
// kernel; else 0.
int64_t Fp8WidenWorkspaceBytes(const CudaBackendConfig& config, const ModelConfig& model) {
  const bool widens =
      config.fp8_kv && !model.IsMla() && config.use_prefill_kernel && config.prefill_allow_wgmma;
  return widens ? std::max<int64_t>(0, config.prefill_fp8_widen_max_bytes) : 0;
}

namespace kc = ::tandem::kernels::cuda;

int64_t Align16(int64_t x) { return (x + 15) / 16 * 16; }

const std::vector<int64_t>& DefaultGraphSizes() {
  static const std::vector<int64_t> kSizes = {1,  2,  4,   8,   16,  24,  32, 48,
                                              64, 96, 128, 160, 192, 224, 256};
  return kSizes;
}

// TANDEM_DECODE_CLUSTER_MERGE (read once): "1" / "0" override CudaBackendConfig::
// decode_cluster_merge for an A/B; unset: the config decides.
std::optional<bool> DecodeClusterMergeFromEnv() {
  static const std::optional<bool> on = []() -> std::optional<bool> {
    const char* v = std::getenv("TANDEM_DECODE_CLUSTER_MERGE");
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

ExecutorFactory CudaExecutorFactory(const CudaBackendConfig& config) {
  ExecutorFactory factory;
  factory.name = std::string("cuda:") + ActDtypeName(config.dtype);
  factory.kv_dtype = config.dtype == ActDtype::kFp16 ? KvDtype::kF16 : KvDtype::kBf16;
  if (config.fp8_kv) factory.kv_dtype = KvDtype::kFp8E4m3;
  factory.accepts_external_pool = false;
  factory.verifies_drafts = true;  // a verify pass samples K + 1 rows (graphed: verify_graphs)
  // The engine books KV per shard from these (ExecutorSpec::num_blocks is one shard's pool).
  factory.dcp_size = config.dcp_size;
  factory.dcp_interleave = config.dcp_interleave;
  factory.create = [config](
                       const ExecutorSpec& spec,
                       ModelWeights weights) -> absl::StatusOr<std::unique_ptr<ModelExecutor>> {
    ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> runner,
                     CudaModelRunner::Create(config, spec, std::move(weights)));
    return std::unique_ptr<ModelExecutor>(std::move(runner));
  };
  factory.default_kv_cache_bytes = [config](const ModelConfig& model) -> absl::StatusOr<int64_t> {
    if (!(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu_memory_utilization ", config.gpu_memory_utilization, " not in (0, 1]"));
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(config.device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    const int64_t weights = model.DeviceWeightBytes();  // FP8 projections: 1 byte a weight
    // The activations' reserve, and the FP8 prefill widening's workspace (Create allocates it).
    const int64_t reserve = (int64_t{2} << 30) + Fp8WidenWorkspaceBytes(config, model);
    const int64_t budget =
        static_cast<int64_t>(static_cast<double>(free_bytes) * config.gpu_memory_utilization) -
        weights - reserve;
    if (budget <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for a KV cache: ", free_bytes, " bytes free x ", config.gpu_memory_utilization,
          " minus ", weights, " bytes of weights and a ", reserve, "-byte reserve"));
    }
    return budget;
  };
  return factory;
}

namespace {

absl::StatusOr<std::unique_ptr<comm::DeviceCommunicator>> MakeCommunicator(
    const CudaBackendConfig& config) {
  if (config.tp_comm == "gloo") {
    return std::make_unique<comm::HostStagedCommunicator>(config.group);
  }
  if (config.tp_comm != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp_comm must be nccl or gloo, got '", config.tp_comm, "'"));
  }
  comm::NcclCommunicatorOptions options;
  options.device = config.device;
  options.timeout = config.comm_timeout;
  if (!config.custom_all_reduce) options.custom_all_reduce_max_bytes = 0;
  options.fuse_all_reduce_norm = config.fuse_all_reduce_norm;
  options.custom_all_reduce_pdl = config.custom_all_reduce_pdl && config.programmatic_launch;
  ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> nccl,
                   comm::NcclCommunicator::Create(config.group, options));
  if (config.group->rank() == 0 && options.custom_all_reduce_max_bytes > 0 &&
      !nccl->custom_all_reduce_off_reason().empty()) {
    LOG(INFO) << "tensor-parallel all-reduce on NCCL only: "
              << nccl->custom_all_reduce_off_reason();
  }
  return nccl;
}

// This rank's KV shard under decode context parallelism (size 1 without it).
absl::StatusOr<kernels::DcpShard> DcpShardOf(const CudaBackendConfig& config,
                                             const ExecutorSpec& spec) {
  if (config.dcp_size <= 1) return kernels::DcpShard{};
  if (config.group == nullptr || config.group->size() % config.dcp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dcp=", config.dcp_size, " must divide the group of --tp=",
                     config.group == nullptr ? 1 : config.group->size(), " ranks"));
  }
  const DcpBlockLayout blocks =
      DcpBlockLayout::FromFlags(config.dcp_size, config.dcp_interleave, spec.block_size);
  RETURN_IF_ERROR(blocks.Validate());
  return blocks.ShardForTpRank(config.group->rank());
}

}  // namespace

CudaModelRunner::CudaModelRunner(const CudaBackendConfig& config, const ExecutorSpec& spec)
    : config_(config), spec_(spec) {}

CudaModelRunner::~CudaModelRunner() {
  DropGraphs();
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const CudaBackendConfig& config, const ExecutorSpec& spec, ModelWeights weights) {
  return Build(
      config, spec,
      [&weights, &spec](CudaModelRunner* r,
                        const CudaModelOptions& options) -> absl::StatusOr<kernels::KvCacheLayout> {
        if (spec.model_config.IsMla()) {
          ASSIGN_OR_RETURN(
              r->mla_model_,
              CudaMlaModel::Create(spec.model_config, std::move(weights), options, r->stream_));
          return r->mla_model_->KvLayout(spec.num_blocks, spec.block_size);
        }
        ASSIGN_OR_RETURN(r->model_, CudaLlamaModel::Create(spec.model_config, std::move(weights),
                                                           options, r->stream_));
        return r->model_->KvLayout(spec.num_blocks, spec.block_size);
      });
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Build(
    const CudaBackendConfig& config, const ExecutorSpec& spec, const ModelMaker& make_model) {
  if (spec.kv_pool != nullptr) {
    return absl::InvalidArgumentError("the CUDA backend allocates its own device KV pool");
  }
  if (spec.num_blocks <= 0 || spec.block_size <= 0 || spec.max_num_batched_tokens <= 0 ||
      spec.max_num_seqs <= 0 || spec.max_model_len <= 0) {
    return absl::InvalidArgumentError("CudaModelRunner: non-positive bounds in ExecutorSpec");
  }
  std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(config, spec));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(config.device));
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&r->num_sms_, cudaDevAttrMultiProcessorCount, config.device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->stream_, cudaStreamNonBlocking));

  // Graph sizes: sorted, unique, within max_num_seqs and max_num_batched_tokens.
  const int64_t seq_cap = std::min(spec.max_num_seqs, spec.max_num_batched_tokens);
  {
    // Padded decode uses these sizes with or without graphs (identical numerics either way).
    std::vector<int64_t> sizes =
        config.graph_batch_sizes.empty() ? DefaultGraphSizes() : config.graph_batch_sizes;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    for (int64_t s : sizes) {
      if (s <= 0) return absl::InvalidArgumentError("graph batch sizes must be positive");
      if (s <= seq_cap) r->graph_sizes_.push_back(s);
    }
  }
  r->max_seqs_ = spec.max_num_seqs;
  r->max_tokens_ = std::max(spec.max_num_batched_tokens,
                            r->graph_sizes_.empty() ? int64_t{1} : r->graph_sizes_.back());
  r->max_rows_ =
      std::max(r->max_seqs_, r->graph_sizes_.empty() ? int64_t{1} : r->graph_sizes_.back());
  // Speculative decoding: a verify pass samples at its last token and every draft (rows never
  // outnumber the step's tokens).
  r->max_rows_ = std::max(
      r->max_rows_, std::min(r->max_tokens_, r->max_seqs_ * (1 + spec.num_speculative_tokens)));
  r->max_blocks_per_seq_ = (spec.max_model_len + spec.block_size - 1) / spec.block_size;
  ASSIGN_OR_RETURN(r->dcp_, DcpShardOf(config, spec));

  CudaModelOptions options;
  options.dtype = config.dtype;
  options.max_tokens = r->max_tokens_;
  options.max_logit_rows = r->max_rows_;
  options.dummy_seed = config.dummy_seed;
  options.dummy_plan = config.dummy_plan;
  options.checkpoint = config.checkpoint;
  options.programmatic_launch = config.programmatic_launch;
  options.fold_norm = config.fold_norm;
  options.fold_rope = config.fold_rope;
  options.qk_norm_rope = config.qk_norm_rope;
  options.fold_moe = config.fold_moe;
  options.mla_norm_in_write = config.mla_norm_in_write;
  options.mla_rope_in_write = config.mla_rope_in_write;
  options.mla_fold_norm = config.mla_fold_norm;
  options.mla_rows16 = config.mla_rows16;
  options.mla_rows16_max_requests = config.mla_rows16_max_requests;
  options.fp8_weight_only_fold = config.fp8_weight_only_fold;
  options.dcp = r->dcp_;
  options.fp8_kv = config.fp8_kv;
  if (config.group != nullptr) {
    ASSIGN_OR_RETURN(r->comm_, MakeCommunicator(config));
    // Data-parallel attention: the communicator carries the MoE layers' all-to-alls only.
    (spec.model_config.dp_attention ? options.moe_comm : options.comm) = r->comm_.get();
    LOG(INFO) << "tensor-parallel rank " << r->comm_->rank() << "/" << r->comm_->size()
              << ": collectives over " << r->comm_->backend()
              << (r->dcp_.size > 1 ? absl::StrCat(", DCP shard ", r->dcp_.rank, "/", r->dcp_.size,
                                                  " interleave ", r->dcp_.interleave)
                                   : std::string());
  }
  ASSIGN_OR_RETURN(const kernels::KvCacheLayout layout, make_model(r.get(), options));
  RETURN_IF_ERROR(r->AllocatePool(layout));
  RETURN_IF_ERROR(r->AllocateStepBuffers());
  // The FP8 prefill widening's whole budget now, so a device without room for it fails here, not
  // in the middle of serving (EnsureAttnWorkspace would otherwise allocate it at the first step).
  if (const int64_t widen = Fp8WidenWorkspaceBytes(config, spec.model_config); widen > 0) {
    ASSIGN_OR_RETURN(r->attn_workspace_,
                     DeviceBuffer::Allocate(widen, "attention workspace (FP8 prefill widening)"));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r->stream_));
  return r;
}

absl::Status CudaModelRunner::AllocatePool(const kernels::KvCacheLayout& layout) {
  // KV pool, zero-filled once (padding reads nothing, but never leave garbage NaNs around).
  RETURN_IF_ERROR(layout.Validate());
  const bool latent_fp8 = config_.fp8_kv && mla_model_ != nullptr;
  if (latent_fp8) RETURN_IF_ERROR(CheckFp8LatentPool(layout));
  // An FP8 latent pool (kv_layout.h, Fp8LatentBlocks): each block its codes, then its fp32 row
  // scales, one range per block (so a block moves P -> D, is leased and hashed like any other).
  // A GQA FP8 pool: one byte a value, its scales per tensor (CudaLlamaModel::kv_scales).
  const int64_t pool_bytes = latent_fp8
                                 ? layout.TotalElems() + layout.TotalElems() / layout.head_dim * 4
                             : config_.fp8_kv ? layout.TotalElems()
                                              : layout.TotalElems() * 2;
  ASSIGN_OR_RETURN(pool_, DeviceBuffer::Allocate(pool_bytes, "KV pool"));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pool_.data(), 0, pool_.bytes(), stream_));
  cache_.data = pool_.data();
  cache_.layout = layout;
  cache_.dtype = model_ != nullptr       ? model_->kv_dtype()
                 : mla_model_ != nullptr ? mla_model_->kv_dtype()
                                         : mtp_model_->kv_dtype();
  if (config_.fp8_kv && !latent_fp8) {  // layer 0's scales; the model's layers take their own
    if (model_ == nullptr || model_->kv_scales() == nullptr) {
      return absl::InternalError("an FP8 K / V pool without the model's KV scales");
    }
    cache_.k_scale = model_->kv_scales();
    cache_.v_scale = model_->kv_scales() + layout.num_layers;
  }
  if (latent_fp8) {
    // kernels/mla reads block b's codes at b * latent_block_bytes and its row scales from
    // token_scales + b * latent_block_bytes / 4 (no per-tensor k/v scale).
    const Fp8LatentPool blocks = Fp8LatentBlocks(pool_.data(), layout);
    cache_.token_scales = blocks.scales;
    cache_.latent_block_bytes = blocks.block_bytes;
    return absl::OkStatus();
  }
  return kc::ValidateDeviceKvCache(cache_, "CUDA backend");
}

absl::Status CudaModelRunner::AllocateStepBuffers() {
  // Packed metadata: small arrays first, block tables last (copied up to the used rows).
  MetaLayout& m = meta_;
  int64_t off = 0;
  auto take = [&off](int64_t bytes) {
    const int64_t at = off;
    off = Align16(off + bytes);
    return at;
  };
  m.token_ids = take(max_tokens_ * 4);
  m.positions = take(max_tokens_ * 8);
  m.slot_mapping = take(max_tokens_ * 8);
  const int64_t seqs_cap = std::max(max_seqs_, max_rows_);
  m.query_start_loc = take((seqs_cap + 1) * 4);
  m.seq_lens = take(seqs_cap * 4);
  m.local_seq_lens = take(seqs_cap * 4);
  m.logit_rows = take(max_rows_ * 4);
  m.sampling_rows = take(max_rows_ * static_cast<int64_t>(sizeof(kc::DeviceSamplingRow)));
  m.block_tables = take(seqs_cap * max_blocks_per_seq_ * 4);
  m.total = off;
  ASSIGN_OR_RETURN(meta_host_, PinnedBuffer::Allocate(m.total, "step metadata (host)"));
  ASSIGN_OR_RETURN(meta_dev_, DeviceBuffer::Allocate(m.total, "step metadata"));
  std::memset(meta_host_.data(), 0, m.total);
  ASSIGN_OR_RETURN(sample_workspace_,
                   DeviceBuffer::Allocate(
                       kc::SampleTokensWorkspaceBytes(max_rows_, spec_.model_config.vocab_size),
                       "sampling workspace"));
  ASSIGN_OR_RETURN(sampled_dev_, DeviceBuffer::Allocate(max_rows_ * 4, "sampled tokens"));
  ASSIGN_OR_RETURN(sampled_host_, PinnedBuffer::Allocate(max_rows_ * 4, "sampled tokens"));
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ModelForward(const DeviceStep& step, const StepAttentionPlan& plan) {
  if (mla_model_ != nullptr) {
    return mla_model_->Forward(step, cache_, plan, AttnWorkspace(plan), stream_);
  }
  if (mtp_model_ != nullptr) {
    return mtp_model_->Forward(step, cache_, plan, input_hidden_.get<float>(), stream_);
  }
  return model_->Forward(step, cache_, plan, AttnWorkspace(plan), stream_);
}

const float* CudaModelRunner::ModelLogits() const {
  if (mtp_model_ != nullptr) return mtp_model_->logits();
  return mla_model_ != nullptr ? mla_model_->logits() : model_->logits();
}

DeviceStep CudaModelRunner::Pack(const SchedulerOutput& batch, int64_t padded_seqs, int64_t width,
                                 int64_t* max_q_len, int64_t* max_seq_len, int64_t* copy_bytes) {
  char* base = meta_host_.get<char>();
  auto* token_ids = reinterpret_cast<int32_t*>(base + meta_.token_ids);
  auto* positions = reinterpret_cast<int64_t*>(base + meta_.positions);
  auto* slots = reinterpret_cast<int64_t*>(base + meta_.slot_mapping);
  auto* qsl = reinterpret_cast<int32_t*>(base + meta_.query_start_loc);
  auto* seq_lens = reinterpret_cast<int32_t*>(base + meta_.seq_lens);
  auto* local_seq_lens = reinterpret_cast<int32_t*>(base + meta_.local_seq_lens);
  auto* logit_rows = reinterpret_cast<int32_t*>(base + meta_.logit_rows);
  auto* rows = reinterpret_cast<kc::DeviceSamplingRow*>(base + meta_.sampling_rows);
  auto* tables = reinterpret_cast<int32_t*>(base + meta_.block_tables);
  const int64_t bs = spec_.block_size;
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  int64_t t = 0, r = 0;
  *max_q_len = 1;
  *max_seq_len = 1;
  qsl[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const ScheduledSeq& seq = batch.seqs[s];
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    int32_t* table = tables + s * max_blocks_per_seq_;
    PackBlockTable(seq.block_table, table);
    for (int64_t j = 0; j < n; ++j, ++t) {
      const int64_t pos = seq.num_computed_tokens + j;
      // The MTP layer embeds nothing at position 0 (CudaMtpModel: id -1 is a zero row).
      token_ids[t] = mtp_model_ != nullptr && pos == 0 ? -1 : seq.new_tokens[j];
      positions[t] = pos;
      // Only the shard holding the token writes it, at its local index (without DCP: every
      // token, local = global).
      const int64_t local = kernels::DcpLocalCount(pos, dcp_);
      slots[t] = kernels::DcpRankOf(pos, dcp_) == dcp_.rank
                     ? int64_t{table[local / bs]} * bs + local % bs
                     : -1;
    }
    qsl[s + 1] = static_cast<int32_t>(t);
    seq_lens[s] = static_cast<int32_t>(seq.num_computed_tokens + n);
    local_seq_lens[s] = static_cast<int32_t>(kernels::DcpLocalCount(seq_lens[s], dcp_));
    *max_q_len = std::max(*max_q_len, n);
    *max_seq_len = std::max<int64_t>(*max_seq_len, local_seq_lens[s]);
    // A padded decode step computes logits for every row (the graph's shape is fixed). A verify
    // pass samples at its last token and at each of its K drafts (padded or not).
    if (padded_seqs > 0 || seq.samples || seq.capture_prompt_logits) {
      const int64_t k = seq.samples ? seq.num_draft_tokens : 0;
      for (int64_t j = 0; j <= k; ++j, ++r) {
        logit_rows[r] = static_cast<int32_t>(t - 1 - k + j);
        kc::DeviceSamplingRow& row = rows[r];
        row.temperature = seq.sampling.temperature;
        row.top_k = seq.sampling.top_k;
        row.top_p = seq.sampling.top_p;
        row.seed = seq.sampling.seed;
        row.step = static_cast<uint64_t>(seq.sample_step + j);
        row.vocab_limit = seq.sampling.vocab_limit;
      }
    }
  }
  int64_t num_seqs = S;
  if (padded_seqs > 0) {
    // Padding sequences: q_len 0, nothing read or written. Padding tokens (to padded_seqs x
    // width) belong to no sequence and write no slot; padding rows are greedy and ignored.
    const int64_t real_tokens = t, padded_tokens = padded_seqs * width;
    for (int64_t s = S; s < padded_seqs; ++s) {
      qsl[s + 1] = static_cast<int32_t>(real_tokens);
      seq_lens[s] = 0;
      local_seq_lens[s] = 0;
    }
    for (; t < padded_tokens; ++t) {
      token_ids[t] = 0;
      positions[t] = 0;
      slots[t] = -1;
    }
    for (; r < padded_tokens; ++r) {
      logit_rows[r] = static_cast<int32_t>(real_tokens > 0 ? real_tokens - 1 : 0);
      rows[r] = kc::DeviceSamplingRow{};
    }
    num_seqs = padded_seqs;
    // Rows of q/out beyond qsl[S] are padding; T stays the padded size for fixed shapes.
  }
  *copy_bytes = meta_.block_tables + num_seqs * max_blocks_per_seq_ * 4;

  const char* dev = meta_dev_.get<char>();
  DeviceStep step;
  step.token_ids = reinterpret_cast<const int32_t*>(dev + meta_.token_ids);
  step.positions = reinterpret_cast<const int64_t*>(dev + meta_.positions);
  step.slot_mapping = reinterpret_cast<const int64_t*>(dev + meta_.slot_mapping);
  step.logit_rows = reinterpret_cast<const int32_t*>(dev + meta_.logit_rows);
  step.attention.query_start_loc = reinterpret_cast<const int32_t*>(dev + meta_.query_start_loc);
  step.attention.seq_lens = reinterpret_cast<const int32_t*>(dev + meta_.seq_lens);
  step.attention.block_tables = reinterpret_cast<const int32_t*>(dev + meta_.block_tables);
  step.attention.local_seq_lens =
      dcp_.size > 1 ? reinterpret_cast<const int32_t*>(dev + meta_.local_seq_lens) : nullptr;
  step.attention.num_seqs = num_seqs;
  step.attention.max_blocks_per_seq = max_blocks_per_seq_;
  step.num_tokens = t;
  step.num_logit_rows = r;
  return step;
}

void CudaModelRunner::PackBlockTable(absl::Span<const BlockId> table, int32_t* row) const {
  if (dcp_.size == 1) {
    std::copy(table.begin(), table.end(), row);
    return;
  }
  // The request's blocks on this shard, in order, as local ids of this rank's pool.
  const DcpBlockLayout blocks{dcp_.size, dcp_.interleave, spec_.block_size};
  blocks.ShardLocalBlocks(table, dcp_.rank, row);
}

absl::StatusOr<StepAttentionPlan> CudaModelRunner::Plan(int64_t num_seqs, int64_t num_tokens,
                                                        int64_t max_q_len, int64_t max_seq_len,
                                                        int64_t total_kv_blocks,
                                                        bool allow_prefill) const {
  const ModelConfig& m = spec_.model_config;
  StepAttentionPlan plan;
  if (m.IsMla()) {  // CudaMlaModel plans its own kernels from these bounds
    plan.decode.input.num_seqs = num_seqs;
    plan.decode.input.num_tokens = num_tokens;
    plan.decode.input.max_q_len = max_q_len;
    plan.decode.input.max_seq_len = max_seq_len;
    return plan;
  }
  const bool prefill_head_dim = m.head_dim == 64 || m.head_dim == 128 || m.head_dim == 256;
  // The prefill kernel has no DCP path; the decode kernel takes any q_len on a shard.
  if (allow_prefill && dcp_.size == 1 && max_q_len >= kPrefillMinQLen && prefill_head_dim) {
    kc::PagedPrefillPlanInput in;
    in.num_seqs = num_seqs;
    in.num_tokens = num_tokens;
    in.max_q_len = max_q_len;
    in.max_seq_len = max_seq_len;
    in.num_q_heads = m.num_attention_heads;
    in.num_kv_heads = m.num_key_value_heads;
    in.head_dim = m.head_dim;
    in.kv_dtype = cache_.dtype;
    in.num_sms = num_sms_;
    in.allow_wgmma = config_.prefill_allow_wgmma;
    in.kv_block_size = spec_.block_size;
    in.total_kv_blocks = total_kv_blocks;
    in.fp8_widen_max_bytes = config_.prefill_fp8_widen_max_bytes;
    ASSIGN_OR_RETURN(plan.prefill, kc::PlanPagedPrefill(in));
    plan.use_prefill = true;
    return plan;
  }
  kc::PagedAttentionPlanInput in;
  in.num_seqs = num_seqs;
  in.num_tokens = num_tokens;
  in.max_q_len = max_q_len;
  in.max_seq_len = max_seq_len;
  in.num_q_heads = m.num_attention_heads;
  in.num_kv_heads = m.num_key_value_heads;
  in.head_dim = m.head_dim;
  in.kv_dtype = cache_.dtype;
  in.num_sms = num_sms_;
  in.workspace_zeroed = config_.decode_merge_in_kernel;  // decode_workspace_
  in.programmatic_launch = config_.programmatic_launch && config_.decode_attention_pdl;
  in.cluster_merge = DecodeClusterMergeFromEnv().value_or(
      config_.decode_cluster_merge.value_or(m.quantization.IsFp8()));
  ASSIGN_OR_RETURN(plan.decode, kc::PlanPagedAttention(in));
  return plan;
}

bool CudaModelRunner::GreedyOnly(const SchedulerOutput& batch, int64_t num_logit_rows) const {
  const int64_t min_rows = config_.vocab_parallel_greedy_min_rows;
  if (min_rows <= 0 || num_logit_rows < min_rows) return false;
  if (model_ == nullptr || !model_->vocab_parallel()) return false;
  for (const ScheduledSeq& seq : batch.seqs) {
    if (seq.capture_prompt_logits) return false;
    if (seq.samples && seq.sampling.temperature > 0.0f) return false;
  }
  return true;
}

absl::Status CudaModelRunner::Enqueue(const DeviceStep& step, const StepAttentionPlan& plan,
                                      bool greedy) {
  if (model_ != nullptr) model_->set_gather_logits(!greedy);
  RETURN_IF_ERROR(ModelForward(step, plan));
  if (step.num_logit_rows == 0) return absl::OkStatus();
  const char* dev = meta_dev_.get<char>();
  const auto* rows = reinterpret_cast<const kc::DeviceSamplingRow*>(dev + meta_.sampling_rows);
  if (greedy) {
    return model_->GreedyTokens(step.num_logit_rows, rows, sampled_dev_.get<int32_t>(), stream_);
  }
  return kc::SampleTokens(ModelLogits(), step.num_logit_rows, spec_.model_config.vocab_size, rows,
                          sampled_dev_.get<int32_t>(), sample_workspace_.data(),
                          sample_workspace_.bytes(), stream_);
}

absl::StatusOr<RunnerOutput> CudaModelRunner::Run(const SchedulerOutput& batch) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(config_.device));
  const int64_t S = static_cast<int64_t>(batch.seqs.size());
  RunnerOutput out;
  out.sampled_tokens.assign(S, -1);
  out.last_prompt_logits.resize(S);
  out.draft_samples.resize(S);
  const bool dp = DpMoe();
  if (S == 0) {
    // Data-parallel attention: a rank without sequences still joins every MoE layer's
    // collectives: as a padded step of padding sequences when the step pads (DpPaddedSeqs).
    if (!dp) return out;
    if (DpPaddedSeqs(batch) == 0) {
      RETURN_IF_ERROR(DpIdleStep());
      return out;
    }
  }
  if (S > max_seqs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", S, " sequences, the runner was sized for ", max_seqs_));
  }
  int64_t total_tokens = 0;
  for (const ScheduledSeq& seq : batch.seqs) {
    const int64_t n = static_cast<int64_t>(seq.new_tokens.size());
    total_tokens += n;
    if (static_cast<int64_t>(seq.block_table.size()) > max_blocks_per_seq_) {
      return absl::InvalidArgumentError(absl::StrCat("request ", seq.request_id, " has ",
                                                     seq.block_table.size(),
                                                     " blocks, more than max_model_len allows"));
    }
  }
  if ((total_tokens == 0 && S > 0) || total_tokens > max_tokens_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", total_tokens, " tokens; the runner takes 1..", max_tokens_));
  }
  int64_t padded = 0;
  const int64_t width = PaddedWidth(batch, &padded);
  int64_t max_q_len = 1, max_seq_len = 1, copy_bytes = 0;
  const DeviceStep step = Pack(batch, padded, width, &max_q_len, &max_seq_len, &copy_bytes);
  if (dp) SetMoeDispatchCapacity(padded);  // every DP rank pads alike
  const bool greedy = GreedyOnly(batch, step.num_logit_rows);
  RETURN_IF_ERROR(UploadInputHidden(batch, total_tokens));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_dev_.data(), meta_host_.data(), copy_bytes,
                                       cudaMemcpyHostToDevice, stream_));
  // Decode sizes recur every step: their GEMM algorithms are worth timing once (eagerly, before
  // any graph capture); prefill sizes vary too much.
  const int64_t autotune_m = config_.gemm_autotune && padded > 0 ? step.num_tokens : 0;
  if (model_ != nullptr) model_->set_gemm_autotune_max_m(autotune_m);
  if (mla_model_ != nullptr) mla_model_->set_gemm_autotune_max_m(autotune_m);
  if (mtp_model_ != nullptr) mtp_model_->set_gemm_autotune_max_m(autotune_m);
  if (padded > 0) {
    // Fixed plan for the padded size: the grid must not depend on this step's lengths (bounded
    // by the most tokens of max_model_len this rank's shard can hold).
    auto planned = padded_plans_.find({padded, width});
    if (planned == padded_plans_.end()) {
      ASSIGN_OR_RETURN(
          StepAttentionPlan fresh,
          Plan(padded, padded * width, width, kernels::DcpLocalCount(spec_.max_model_len, dcp_),
               /*total_kv_blocks=*/0, /*allow_prefill=*/false));
      planned = padded_plans_.emplace(std::make_pair(padded, width), fresh).first;
    }
    const StepAttentionPlan& plan = planned->second;
    RETURN_IF_ERROR(EnsureAttnWorkspace(plan));
    ++stats_.padded_steps;
    stats_.split_merge_in_kernel_steps += plan.decode.merge_in_kernel ? 1 : 0;
    stats_.split_merge_cluster_steps += plan.decode.cluster_merge ? 1 : 0;
    if (config_.enable_cuda_graphs && (comm_ == nullptr || comm_->graph_capturable())) {
      ASSIGN_OR_RETURN(cudaGraphExec_t exec, GraphFor(step, plan, width, greedy));
      const absl::Time launch = absl::Now();
      CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_));
      stats_.graph_launch_ns += absl::ToInt64Nanoseconds(absl::Now() - launch);
      ++stats_.graph_steps;
    } else {
      RETURN_IF_ERROR(Enqueue(step, plan, greedy));
    }
  } else {
    // The step's blocks (the fp8 prefill widening sizes its copy by them).
    const auto* seq_lens =
        reinterpret_cast<const int32_t*>(meta_host_.get<char>() + meta_.seq_lens);
    int64_t kv_blocks = 0;
    for (int64_t s = 0; s < S; ++s) {
      kv_blocks += (seq_lens[s] + spec_.block_size - 1) / spec_.block_size;
    }
    ASSIGN_OR_RETURN(StepAttentionPlan plan, Plan(S, total_tokens, max_q_len, max_seq_len,
                                                  kv_blocks, config_.use_prefill_kernel));
    RETURN_IF_ERROR(EnsureAttnWorkspace(plan));
    RETURN_IF_ERROR(Enqueue(step, plan, greedy));
    ++stats_.eager_steps;
    stats_.widened_fp8_prefill_steps += plan.use_prefill && plan.prefill.widen_fp8 ? 1 : 0;
    stats_.split_merge_in_kernel_steps += !plan.use_prefill && plan.decode.merge_in_kernel ? 1 : 0;
    stats_.split_merge_cluster_steps += !plan.use_prefill && plan.decode.cluster_merge ? 1 : 0;
  }
  const bool folded = (model_ != nullptr && model_->FoldsNorms(step.num_tokens)) ||
                      (mla_model_ != nullptr && mla_model_->FoldsNorms(step.num_tokens));
  stats_.folded_norm_steps += folded ? 1 : 0;
  stats_.folded_rope_steps += model_ != nullptr && model_->FoldsRope(step.num_tokens) ? 1 : 0;
  RETURN_IF_ERROR(EnqueueHiddenCopy(batch, total_tokens));
  RETURN_IF_ERROR(EnqueueRejection(batch, padded > 0));
  const int64_t R = step.num_logit_rows;
  if (R > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sampled_host_.data(), sampled_dev_.data(), R * 4,
                                         cudaMemcpyDeviceToHost, stream_));
  }
  if (comm_ != nullptr) {
    // The step's collectives wait for the other ranks: the group's deadline, never a hang.
    RETURN_IF_ERROR(comm_->Synchronize(stream_));
  } else {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  TakeHidden(batch, total_tokens, &out);
  // Row r belongs to the r-th sequence that has a row (every sequence when padded).
  const int64_t vocab = spec_.model_config.vocab_size;
  int64_t r = 0;
  for (int64_t s = 0; s < S; ++s) {
    const ScheduledSeq& seq = batch.seqs[s];
    if (padded == 0 && !seq.samples && !seq.capture_prompt_logits) continue;
    // A verify pass's rows: one per draft position, then the last (speculative.h).
    const int64_t k = seq.samples ? seq.num_draft_tokens : 0;
    const int32_t* sampled = sampled_host_.get<int32_t>() + r;
    out.draft_samples[s].assign(sampled, sampled + k);
    r += k;
    if (seq.samples) out.sampled_tokens[s] = sampled_host_.get<int32_t>()[r];
    if (seq.capture_prompt_logits) {
      std::vector<float>& logits = out.last_prompt_logits[s];
      logits.resize(vocab);
      CUDA_RETURN_IF_ERROR(cudaMemcpy(logits.data(), ModelLogits() + r * vocab,
                                      vocab * sizeof(float), cudaMemcpyDeviceToHost));
    }
    ++r;
  }
  TakeRejection(batch, &out);
  return out;
}

}  // namespace tandem::runtime::cuda
