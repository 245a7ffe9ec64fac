// The FP8 experts' device weights (cuda_moe_fp8.h): a layer's e4m3 experts uploaded from the
// loader's per-layer tensors or allocated for device dummy draws, their device pointer tables
// (codes, per-row scales, 128 x 128 block scales), and the dummy fills. The experts' kernels:
// cuda_moe_fp8.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "runtime/cuda/cuda_moe_fp8.h"

namespace tandem::runtime::cuda {
namespace {

// Experts of `all` ([held * rows, cols]) uploaded one by one, plus `zero` all-zero experts.
absl::Status UploadExperts(Fp8LinearWeight* all, int64_t held, int64_t rows, int64_t cols,
                           int64_t zero, int64_t max_tokens, const std::string& what,
                           std::vector<CudaFp8Weight>* out) {
  const kernels::Fp8ScaleGrid& g = all->grid;
  if (g.rows != held * rows || g.cols != cols || g.block_rows != 1 ||
      static_cast<int64_t>(all->codes.size()) != g.rows * g.cols ||
      static_cast<int64_t>(all->scales.size()) != g.NumScales()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 ", what, " is [", g.rows, ", ", g.cols, "] with row blocks ", g.block_rows,
        ", expected [", held * rows, ", ", cols, "] (", held, " experts) with per-row scales"));
  }
  for (int64_t e = 0; e < held; ++e) {
    Fp8LinearWeight one = Fp8Rows(*all, e * rows, rows);
    ASSIGN_OR_RETURN(CudaFp8Weight w, UploadFp8Weight(&one, rows, cols, max_tokens,
                                                      absl::StrCat(what, " of expert ", e)));
    out->push_back(std::move(w));
  }
  for (int64_t z = 0; z < zero; ++z) {  // codes 0 and scales 0: exactly zero outputs
    kernels::Fp8ScaleGrid grid = g;
    grid.rows = rows;
    ASSIGN_OR_RETURN(CudaFp8Weight w,
                     AllocateFp8Weight(grid, all->activation, all->input_scale, max_tokens));
    CUDA_RETURN_IF_ERROR(cudaMemset(w.codes.data(), 0, w.codes.bytes()));
    CUDA_RETURN_IF_ERROR(cudaMemset(w.scales.data(), 0, w.scales.bytes()));
    if (held > 0 && !out->front().block_scales.empty()) {  // as the held experts (zeros)
      const int64_t bytes = out->front().block_scales.bytes();
      ASSIGN_OR_RETURN(w.block_scales, DeviceBuffer::Allocate(bytes, "fp8 block scales"));
      CUDA_RETURN_IF_ERROR(cudaMemset(w.block_scales.data(), 0, bytes));
    }
    out->push_back(std::move(w));
  }
  *all = Fp8LinearWeight();
  return absl::OkStatus();
}

// The device tables of the experts' code and scale pointers, and of their block scales where
// every expert has them (else `blocks` stays empty).
absl::Status Tables(const std::vector<CudaFp8Weight>& experts, DeviceBuffer* codes,
                    DeviceBuffer* scales, DeviceBuffer* blocks) {
  std::vector<const void*> c, s, b;
  for (const CudaFp8Weight& w : experts) {
    c.push_back(w.codes.data());
    s.push_back(w.scales.data());
    if (!w.block_scales.empty()) b.push_back(w.block_scales.data());
  }
  const int64_t bytes = static_cast<int64_t>(c.size() * sizeof(void*));
  ASSIGN_OR_RETURN(*codes, DeviceBuffer::Allocate(bytes, "fp8 expert code table"));
  ASSIGN_OR_RETURN(*scales, DeviceBuffer::Allocate(bytes, "fp8 expert scale table"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(codes->data(), c.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(scales->data(), s.data(), bytes, cudaMemcpyHostToDevice));
  if (b.empty() || b.size() != c.size()) return absl::OkStatus();
  ASSIGN_OR_RETURN(*blocks, DeviceBuffer::Allocate(bytes, "fp8 expert block scale table"));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(blocks->data(), b.data(), bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace

Fp8LinearWeight Fp8Rows(const Fp8LinearWeight& all, int64_t first, int64_t count) {
  Fp8LinearWeight w;
  const int64_t k = all.grid.cols, gc = all.grid.GridCols();
  w.codes.assign(all.codes.begin() + first * k, all.codes.begin() + (first + count) * k);
  w.scales.assign(all.scales.begin() + first * gc, all.scales.begin() + (first + count) * gc);
  w.grid = all.grid;
  w.grid.rows = count;
  w.activation = all.activation;
  w.input_scale = all.input_scale;
  return w;
}

int64_t CudaFp8MoeWeights::bytes() const {
  int64_t b = shared_gate_up.bytes() + shared_down.bytes();
  for (const CudaFp8Weight& w : gate_up) b += w.bytes();
  for (const CudaFp8Weight& w : down) b += w.bytes();
  return b;
}

absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> UploadFp8MoeWeights(const ModelConfig& c,
                                                                       LayerWeights* l,
                                                                       int64_t max_tokens) {
  const int64_t H = c.hidden_size, Ie = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  const bool ep = c.expert_placement != nullptr;
  const int64_t held = ep ? c.NumHeldExperts() : c.num_experts;
  auto w = std::make_unique<CudaFp8MoeWeights>();
  RETURN_IF_ERROR(UploadExperts(&l->experts_gate_up_fp8, held, 2 * Ie, H, ep ? 1 : 0, max_tokens,
                                "experts gate_up", &w->gate_up));
  RETURN_IF_ERROR(UploadExperts(&l->experts_down_fp8, held, H, Ie, ep ? 1 : 0, max_tokens,
                                "experts down", &w->down));
  RETURN_IF_ERROR(
      Tables(w->gate_up, &w->gate_up_codes, &w->gate_up_scales, &w->gate_up_block_scales));
  RETURN_IF_ERROR(Tables(w->down, &w->down_codes, &w->down_scales, &w->down_block_scales));
  if (!l->shared_gate_up_fp8.empty()) {
    ASSIGN_OR_RETURN(w->shared_gate_up, UploadFp8Weight(&l->shared_gate_up_fp8, 2 * Is, H,
                                                        max_tokens, "shared experts gate_up"));
    ASSIGN_OR_RETURN(w->shared_down, UploadFp8Weight(&l->shared_down_fp8, H, Is, max_tokens,
                                                     "shared experts down"));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<CudaFp8MoeWeights>> AllocateFp8MoeWeights(const ModelConfig& c,
                                                                         int64_t max_tokens) {
  const int64_t H = c.hidden_size, Ie = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  const bool ep = c.expert_placement != nullptr;
  const int64_t experts = (ep ? c.NumHeldExperts() : c.num_experts) + (ep ? 1 : 0);
  const WeightQuantization& q = c.quantization;
  // Codes 0 and scales 0: the zero expert's exact zeros, and no stale bytes anywhere.
  auto alloc = [&](int64_t n, int64_t k) { return AllocateFp8DummyWeight(q, n, k, max_tokens); };
  auto w = std::make_unique<CudaFp8MoeWeights>();
  for (int64_t e = 0; e < experts; ++e) {
    ASSIGN_OR_RETURN(CudaFp8Weight gate_up, alloc(2 * Ie, H));
    w->gate_up.push_back(std::move(gate_up));
    ASSIGN_OR_RETURN(CudaFp8Weight down, alloc(H, Ie));
    w->down.push_back(std::move(down));
  }
  RETURN_IF_ERROR(
      Tables(w->gate_up, &w->gate_up_codes, &w->gate_up_scales, &w->gate_up_block_scales));
  RETURN_IF_ERROR(Tables(w->down, &w->down_codes, &w->down_scales, &w->down_block_scales));
  if (Is > 0) {
    ASSIGN_OR_RETURN(w->shared_gate_up, alloc(2 * Is, H));
    ASSIGN_OR_RETURN(w->shared_down, alloc(H, Is));
  }
  return w;
}

absl::Status FillFp8MoeDummy(const DummyTensorFill& fill, uint64_t seed, DeviceBuffer* staging,
                             CudaFp8MoeWeights* w, cudaStream_t stream) {
  DummyTensorFill local = fill;
  // The expert whose stacked rows the fill starts in; the fill is then local to it (FillFp8Dummy
  // refuses one running past that expert's rows).
  auto expert = [&](std::vector<CudaFp8Weight>& experts) -> CudaFp8Weight* {
    if (experts.empty()) return nullptr;
    const int64_t size = experts.front().grid.rows * experts.front().grid.cols;
    const int64_t e = fill.offset / size;
    if (fill.offset < 0 || e >= static_cast<int64_t>(experts.size())) return nullptr;
    local.offset = fill.offset - e * size;
    return &experts[static_cast<size_t>(e)];
  };
  CudaFp8Weight* target = nullptr;
  DeviceBuffer* block_table = nullptr;  // the experts' block-scale table the target is in
  switch (fill.slot) {
    case WeightSlot::kExpertsGateUp:
      target = expert(w->gate_up);
      block_table = &w->gate_up_block_scales;
      break;
    case WeightSlot::kExpertsDown:
      target = expert(w->down);
      block_table = &w->down_block_scales;
      break;
    case WeightSlot::kSharedGateUp:
      target = w->shared_gate_up.empty() ? nullptr : &w->shared_gate_up;
      break;
    case WeightSlot::kSharedDown:
      target = w->shared_down.empty() ? nullptr : &w->shared_down;
      break;
    default:
      break;
  }
  if (target == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("dummy plan does not fit the FP8 experts: slot ",
                                                   static_cast<int>(fill.slot), " layer ",
                                                   fill.layer, " elements from ", fill.offset));
  }
  const bool had_blocks = !target->block_scales.empty();
  RETURN_IF_ERROR(FillFp8Dummy(local, seed, staging, target, stream));
  // A fill inside a 128-row block drops the expert's block scales (FillFp8Dummy): the table
  // would point at freed memory, and the projection is no longer all 128 x 128 blocks.
  if (had_blocks && target->block_scales.empty() && block_table != nullptr) block_table->Reset();
  return absl::OkStatus();
}

}  // namespace tandem::runtime::cuda
