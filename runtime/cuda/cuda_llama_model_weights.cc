// CudaLlamaModel's device weights that are not uploaded from host vectors: the rank's buffers
// allocated once (AllocateWeights), then filled by the dummy draw on the device (GenerateDummy)
// or by the checkpoint read straight into them (LoadCheckpoint, checkpoint_upload.h); SlotBuffer
// maps a ModelWeights slot onto its buffer for both.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "runtime/cuda/checkpoint_upload.h"
#include "runtime/cuda/cuda_llama_model.h"
#include "runtime/cuda/dummy_init.h"

namespace tandem::runtime::cuda {

absl::Status CudaLlamaModel::AllocateWeights(cudaStream_t stream) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t D = config_.head_dim, Hq = config_.num_attention_heads,
                Hk = config_.num_key_value_heads;
  const int64_t qkv_dim = (Hq + 2 * Hk) * D;
  const int64_t es = 2;  // bf16 and fp16
  // The rank's buffers, sized as Upload() checks them, zero-filled: vocabulary rows past the
  // end of the last partition stay zero.
  weight_bytes_ = 0;
  auto alloc = [&](DeviceBuffer* b, int64_t n, const char* what) -> absl::Status {
    ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(n * es, what));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->data(), 0, b->bytes(), stream));
    weight_bytes_ += b->bytes();
    return absl::OkStatus();
  };
  const bool row_bias = comm() == nullptr || comm()->rank() == 0;
  RETURN_IF_ERROR(alloc(&embed_tokens_, vocab_rows_ * H, "embed"));
  RETURN_IF_ERROR(alloc(&norm_, H, "norm"));
  if (config_.quantization.lm_head) {  // drawn from lm_head's fills, or the embedding's if tied
    ASSIGN_OR_RETURN(lm_head_fp8_, AllocateFp8DummyWeight(LmHeadFp8Scheme(config_.quantization),
                                                          vocab_rows_, H, options_.max_tokens));
    weight_bytes_ += lm_head_fp8_.bytes();
  } else if (!config_.tie_word_embeddings) {
    RETURN_IF_ERROR(alloc(&lm_head_, vocab_rows_ * H, "lm_head"));
  }
  layers_.resize(config_.num_hidden_layers);
  const bool fp8 = config_.quantization.IsFp8();  // FP8 projections instead of the dense four
  for (Layer& l : layers_) {
    RETURN_IF_ERROR(alloc(&l.input_layernorm, H, "input_layernorm"));
    if (fp8) RETURN_IF_ERROR(AllocateFp8(&l));
    if (!fp8) RETURN_IF_ERROR(alloc(&l.qkv_proj, qkv_dim * H, "qkv_proj"));
    if (config_.qkv_bias) RETURN_IF_ERROR(alloc(&l.qkv_bias, qkv_dim, "qkv_bias"));
    if (!fp8) RETURN_IF_ERROR(alloc(&l.o_proj, H * (Hq / options_.dcp.size) * D, "o_proj"));
    if (config_.o_bias && row_bias) RETURN_IF_ERROR(alloc(&l.o_bias, H, "o_bias"));
    RETURN_IF_ERROR(alloc(&l.post_attention_layernorm, H, "post_attention_layernorm"));
    if (config_.qk_norm) {
      RETURN_IF_ERROR(alloc(&l.q_norm, D, "q_norm"));
      RETURN_IF_ERROR(alloc(&l.k_norm, D, "k_norm"));
    }
    if (config_.IsMoeLayer(&l - layers_.data())) {  // its MoE MLP instead of gate_up / down
      ASSIGN_OR_RETURN(l.moe, AllocateMoeWeights(config_, stream, options_.max_tokens));
      weight_bytes_ += l.moe.bytes();
      continue;
    }
    if (!fp8) RETURN_IF_ERROR(alloc(&l.gate_up_proj, 2 * I * H, "gate_up_proj"));
    if (config_.mlp_bias) RETURN_IF_ERROR(alloc(&l.gate_up_bias, 2 * I, "gate_up_bias"));
    if (!fp8) RETURN_IF_ERROR(alloc(&l.down_proj, H * I, "down_proj"));
    if (config_.mlp_bias && row_bias) RETURN_IF_ERROR(alloc(&l.down_bias, H, "down_bias"));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::LoadCheckpoint(const CheckpointSource& source, cudaStream_t stream) {
  if (config_.IsMoe() || config_.quantization.IsFp8()) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend reads dense 16/32-bit checkpoints straight to the device; ",
        config_.architecture, config_.IsMoe() ? " (MoE)" : " (FP8)", " loads through the host"));
  }
  RETURN_IF_ERROR(AllocateWeights(stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the zero fill before the copies
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const Weight16 dtype = options_.dtype == ActDtype::kBf16 ? Weight16::kBf16 : Weight16::kF16;
  return UploadCheckpoint(source, dtype, device, [this](WeightSlot slot, int64_t layer) {
    return SlotBuffer(slot, layer);
  });
}

absl::Status CudaLlamaModel::GenerateDummy(uint64_t seed, cudaStream_t stream) {
  const bool fp8 = config_.quantization.IsFp8();
  const int64_t es = 2;  // bf16 and fp16
  RETURN_IF_ERROR(AllocateWeights(stream));
  std::vector<DummyTensorFill> whole;
  if (options_.dummy_plan.empty()) {
    ASSIGN_OR_RETURN(whole, DummyWeightPlan(config_));
  }
  const std::vector<DummyTensorFill>& plan =
      options_.dummy_plan.empty() ? whole : options_.dummy_plan;
  DeviceBuffer fp8_staging;  // FP8 configs: one fill's fp32 draw before quantization
  for (const DummyTensorFill& f : plan) {
    if (CudaFp8Weight* w = fp8 ? Fp8Slot(f.slot, f.layer) : nullptr; w != nullptr) {
      RETURN_IF_ERROR(FillFp8Dummy(f, seed, &fp8_staging, w, stream));
      continue;
    }
    if (f.slot == WeightSlot::kEmbedTokens && !lm_head_fp8_.empty() &&
        config_.tie_word_embeddings) {  // the tied head's e4m3 copy of these rows, then them
      RETURN_IF_ERROR(FillFp8Dummy(f, seed, &fp8_staging, &lm_head_fp8_, stream));
    }
    if (IsMoeSlot(f.slot) && f.layer >= 0 && f.layer < static_cast<int64_t>(layers_.size())) {
      Layer& l = layers_[static_cast<size_t>(f.layer)];
      RETURN_IF_ERROR(options_.dtype == ActDtype::kBf16
                          ? FillMoeDummy<__nv_bfloat16>(f, seed, &l.moe, &fp8_staging, stream)
                          : FillMoeDummy<__half>(f, seed, &l.moe, &fp8_staging, stream));
      continue;
    }
    DeviceBuffer* b = SlotBuffer(f.slot, f.layer);
    if (b == nullptr || (f.offset + f.slice.numel()) * es > b->bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dummy plan does not fit the model: slot ", static_cast<int>(f.slot),
                       " layer ", f.layer, " elements [", f.offset, ", ",
                       f.offset + f.slice.numel(), ") of ", b == nullptr ? 0 : b->bytes() / es));
    }
    if (options_.dtype == ActDtype::kBf16) {
      RETURN_IF_ERROR(FillDummySlice(b->get<__nv_bfloat16>() + f.offset, f.slice, f.mean, seed,
                                     f.stream_id, stream));
    } else {
      RETURN_IF_ERROR(
          FillDummySlice(b->get<__half>() + f.offset, f.slice, f.mean, seed, f.stream_id, stream));
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // fp8_staging is freed on return
  return absl::OkStatus();
}

DeviceBuffer* CudaLlamaModel::SlotBuffer(WeightSlot slot, int64_t layer) {
  if (layer >= static_cast<int64_t>(layers_.size())) return nullptr;
  Layer* l = layer >= 0 ? &layers_[static_cast<size_t>(layer)] : nullptr;
  if ((l == nullptr) != (slot == WeightSlot::kEmbedTokens || slot == WeightSlot::kNorm ||
                         slot == WeightSlot::kLmHead)) {
    return nullptr;
  }
  switch (slot) {
    case WeightSlot::kEmbedTokens:
      return &embed_tokens_;
    case WeightSlot::kNorm:
      return &norm_;
    case WeightSlot::kLmHead:
      return &lm_head_;
    case WeightSlot::kInputLayernorm:
      return &l->input_layernorm;
    case WeightSlot::kQkvProj:
      return &l->qkv_proj;
    case WeightSlot::kQkvBias:
      return &l->qkv_bias;
    case WeightSlot::kOProj:
      return &l->o_proj;
    case WeightSlot::kOBias:
      return &l->o_bias;
    case WeightSlot::kPostAttentionLayernorm:
      return &l->post_attention_layernorm;
    case WeightSlot::kGateUpProj:
      return &l->gate_up_proj;
    case WeightSlot::kGateUpBias:
      return &l->gate_up_bias;
    case WeightSlot::kDownProj:
      return &l->down_proj;
    case WeightSlot::kDownBias:
      return &l->down_bias;
    case WeightSlot::kQNorm:
      return &l->q_norm;
    case WeightSlot::kKNorm:
      return &l->k_norm;
    default:  // slots of other model families: no buffer in this dense model
      return nullptr;
  }
}

}  // namespace tandem::runtime::cuda
