#include "runtime/cuda/cuda_moe_fp8.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "kernels/moe/moe_fp8_cuda.h"
#ifdef TANDEM_HAVE_CUTLASS
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"
#endif

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;
using bf16 = __nv_bfloat16;
using Scheme = kernels::Fp8ActivationScheme;

// The device tables of one projection's experts (cuda_moe_fp8_weights.cc fills them).
kc::MoeFp8Experts DeviceExperts(const std::vector<CudaFp8Weight>& experts,
                                const DeviceBuffer& codes, const DeviceBuffer& scales) {
  return {codes.get<const uint8_t* const>(), scales.get<const float* const>(),
          experts.front().grid.GridCols()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaFp8MoeExperts>> CudaFp8MoeExperts::Create(const ModelConfig& c,
                                                                             int64_t max_tokens) {
  const int64_t H = c.hidden_size, Ie = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  if (H % 16 != 0 || Ie % 16 != 0 || Is % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 experts on CUDA need hidden, expert and shared-expert widths that are multiples of "
        "16 (the rank's: ",
        H, ", ", Ie, ", ", Is, ")"));
  }
  std::unique_ptr<CudaFp8MoeExperts> m(new CudaFp8MoeExperts(c, max_tokens));
  if (const char* env = std::getenv("TANDEM_MOE_FP8"); env != nullptr) {
    const absl::string_view v = env;
    if (v != "gemv" && v != "mma") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_MOE_FP8: unknown '", v, "' (gemv or mma)"));
    }
    m->grouped_mma_ = v == "mma";
  }
  RETURN_IF_ERROR(m->ReadPrefillEnv());
  // The tensor-core kernels' shared-memory opt-in, before any step is captured.
  RETURN_IF_ERROR(kc::MoeFp8GroupedMmaInit());
  const int64_t rows = max_tokens * c.num_experts_per_tok;
  ASSIGN_OR_RETURN(m->linear_, CudaFp8Linear::Create(max_tokens, std::max({H, Ie, Is})));
  m->w8a16_gemv_ = m->linear_->w8a16_gemv();  // TANDEM_FP8_W16_GEMV=0: off
  int64_t codes = std::max(max_tokens * H, rows * Ie);
  int64_t scales = std::max(max_tokens * ((H + 127) / 128), rows * ((Ie + 127) / 128));
  RETURN_IF_ERROR(m->AllocateCutlass());
  if (m->cutlass_experts_ > 0) {  // the gathered rows quantized: [rows, H] codes
    codes = std::max(codes, rows * H);
    scales = std::max(scales, rows * ((H + 127) / 128));
    // x quantized once per token before the gather: [T, H] codes and their scales.
    ASSIGN_OR_RETURN(m->x_codes_, DeviceBuffer::Allocate(max_tokens * H, "fp8 moe x codes"));
    ASSIGN_OR_RETURN(m->x_scales_, DeviceBuffer::Allocate(max_tokens * ((H + 127) / 128) * 4,
                                                          "fp8 moe x scales"));
  }
  ASSIGN_OR_RETURN(m->codes_, DeviceBuffer::Allocate(codes, "fp8 moe activation codes"));
  ASSIGN_OR_RETURN(m->scales_, DeviceBuffer::Allocate(scales * 4, "fp8 moe activation scales"));
  return m;
}

absl::Status CudaFp8MoeExperts::ReadPrefillEnv() {
  if (const char* scales = std::getenv("TANDEM_MOE_FP8_CUTLASS_SCALES"); scales != nullptr) {
    const absl::string_view v = scales;
    if (v != "row" && v != "block") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_MOE_FP8_CUTLASS_SCALES: unknown '", v, "' (row or block)"));
    }
    cutlass_scales_ = v == "block" ? CutlassScales::kBlock : CutlassScales::kRow;
  }
  if (const char* decode = std::getenv("TANDEM_MOE_FP8_DECODE"); decode != nullptr) {
    const absl::string_view v = decode;
    if (v != "cutlass" && v != "mma") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_MOE_FP8_DECODE: unknown '", v, "' (cutlass or mma)"));
    }
    decode_ = v == "cutlass" ? Decode::kCutlass : Decode::kMma;
  }
  if (const char* n = std::getenv("TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS"); n != nullptr) {
    if (!absl::SimpleAtoi(n, &cutlass_swap_rows_) || cutlass_swap_rows_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat("TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS: '", n,
                                                     "' is not a row count >= 0 (0: never)"));
    }
  }
  if (const char* n = std::getenv("TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS"); n != nullptr) {
    if (!absl::SimpleAtoi(n, &cutlass_decode_min_tokens_) || cutlass_decode_min_tokens_ < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_MOE_FP8_CUTLASS_MIN_TOKENS: '", n, "' is not a token count >= 1"));
    }
  }
  const char* env = std::getenv("TANDEM_MOE_FP8_PREFILL");
  if (env == nullptr) return absl::OkStatus();
  const absl::string_view v = env;
  if (v == "cutlass") {
    prefill_ = Prefill::kCutlass;
  } else if (v == "mma") {
    prefill_ = Prefill::kMma;
  } else if (v == "per-expert") {
    prefill_ = Prefill::kPerExpert;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("TANDEM_MOE_FP8_PREFILL: unknown '", v, "' (cutlass, mma or per-expert)"));
  }
  return absl::OkStatus();
}

absl::Status CudaFp8MoeExperts::AllocateCutlass() {
#ifdef TANDEM_HAVE_CUTLASS
  const WeightQuantization& q = config_.quantization;
  if ((prefill_ != Prefill::kCutlass && decode_ == Decode::kMma) || q.activation == Scheme::kNone ||
      !kc::MoeFp8CutlassGroupedSupported()) {
    return absl::OkStatus();
  }
  // The rank's experts, + 1: the zero expert under expert parallelism.
  const int64_t experts = config_.num_experts + 1;
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  if (H % 128 != 0 || Ie % 128 != 0) return absl::OkStatus();  // the kernel's k
  // Per-token / per-tensor activations and per-channel (or per-tensor) weights: the scales
  // broadcast over the 128-column groups, for the larger projection.
  const int64_t rows = max_tokens_ * config_.num_experts_per_tok;
  if (q.activation != Scheme::kDynamicGroup128) {
    ASSIGN_OR_RETURN(a_scales_wide_, DeviceBuffer::Allocate(rows * (std::max(H, Ie) / 128) * 4,
                                                            "fp8 moe cutlass activation scales"));
  }
  if (q.block_cols != 128) {
    const int64_t floats = std::max(kc::MoeFp8CutlassWideWeightScales(experts, 2 * Ie, H),
                                    kc::MoeFp8CutlassWideWeightScales(experts, H, Ie));
    ASSIGN_OR_RETURN(w_scales_wide_,
                     DeviceBuffer::Allocate(floats * 4, "fp8 moe cutlass weight scales"));
  }
  RETURN_IF_ERROR(kc::MoeFp8CutlassGroupedInit());
  ASSIGN_OR_RETURN(size_t bytes, kc::MoeFp8CutlassGroupedWorkspaceBytes(experts));
  // Either form (set_cutlass_scales may switch after Create): the block form's for both
  // projections, with their compact scale copies where the upload's ld is not k / 128.
  cutlass_block_ = H % 128 == 0 && Ie % 128 == 0;
  if (cutlass_block_) {
    ASSIGN_OR_RETURN(const size_t gate_up, kc::MoeFp8CutlassGroupedBlockWorkspaceBytes(
                                               experts, 2 * Ie, H, kc::Block128WeightScaleLd(H)));
    ASSIGN_OR_RETURN(const size_t down, kc::MoeFp8CutlassGroupedBlockWorkspaceBytes(
                                            experts, H, Ie, kc::Block128WeightScaleLd(Ie)));
    bytes = std::max({bytes, gate_up, down});
  }
  ASSIGN_OR_RETURN(cutlass_workspace_, DeviceBuffer::Allocate(static_cast<int64_t>(bytes),
                                                              "fp8 moe cutlass workspace"));
  cutlass_experts_ = experts;
#endif
  return absl::OkStatus();
}

bool CudaFp8MoeExperts::CutlassPrefillServes(const CudaFp8MoeWeights& w, int64_t rows) const {
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  const int64_t E = static_cast<int64_t>(w.gate_up.size());
  if (cutlass_experts_ == 0 || E < 1 || E > cutlass_experts_ || w.down.empty()) return false;
  const CudaFp8Weight& g = w.gate_up.front();
  const CudaFp8Weight& d = w.down.front();
  // Per-row weight scales over 128-column groups (in place), or over the whole row (broadcast).
  auto weight_serves = [&](const CudaFp8Weight& x) {
    if (x.grid.block_rows != 1 || x.grid.cols % 128 != 0) return false;
    const int64_t groups = x.grid.cols / 128, cols = x.grid.GridCols();
    return cols == groups || (cols == 1 && !w_scales_wide_.empty());
  };
  const Scheme a = g.activation;
  const bool wide_a = a == Scheme::kDynamicToken || a == Scheme::kStaticTensor;
  const int64_t a_groups = a == Scheme::kDynamicGroup128 ? H / 128 : 1;
  return (a == Scheme::kDynamicGroup128 || (wide_a && !a_scales_wide_.empty())) &&
         d.activation == a && weight_serves(g) && weight_serves(d) && H % 128 == 0 &&
         Ie % 128 == 0 && rows * H <= codes_.bytes() && rows * a_groups * 4 <= scales_.bytes() &&
         (!wide_a || rows * (std::max(H, Ie) / 128) * 4 <= a_scales_wide_.bytes());
}

bool CudaFp8MoeExperts::CutlassDecodeServes(const CudaFp8MoeWeights& w, int64_t rows) const {
  if (w.gate_up.empty()) return false;
  const bool groups = w.gate_up.front().activation == Scheme::kDynamicGroup128;
  return (groups || CutlassScaledFormServes(w)) && CutlassPrefillServes(w, rows);
}

bool CudaFp8MoeExperts::CutlassBlockScalesServe(const CudaFp8MoeWeights& w) const {
  return cutlass_scales_ == CutlassScales::kBlock && cutlass_block_ &&
         !w.gate_up_block_scales.empty() && !w.down_block_scales.empty();
}

bool CudaFp8MoeExperts::CutlassScaledFormServes(const CudaFp8MoeWeights& w) const {
  if (cutlass_scales_ == CutlassScales::kRow || w.gate_up.empty() || w.down.empty()) return false;
  const CudaFp8Weight& g = w.gate_up.front();
  const CudaFp8Weight& d = w.down.front();
  return g.grid.GridCols() == 1 && d.grid.GridCols() == 1 &&
         (g.activation == Scheme::kDynamicToken || g.activation == Scheme::kStaticTensor);
}

bool CudaFp8MoeExperts::CutlassSwapServes(const CudaFp8MoeWeights& w, int64_t rows,
                                          int64_t E) const {
  const bool block = CutlassBlockScalesServe(w) && !w.gate_up.empty() &&
                     w.gate_up.front().activation == Scheme::kDynamicGroup128;
  return (CutlassScaledFormServes(w) || block) && rows <= cutlass_swap_rows_ * E;
}

const char* CudaFp8MoeExperts::CutlassPath(const CudaFp8MoeWeights& w, int64_t rows,
                                           int64_t E) const {
  const bool swapped = CutlassSwapServes(w, rows, E);
  if (CutlassBlockScalesServe(w)) {
    return swapped ? "fp8-cutlass-grouped-block-swapped" : "fp8-cutlass-grouped-block";
  }
  if (CutlassScaledFormServes(w)) {
    return swapped ? "fp8-cutlass-grouped-swapped" : "fp8-cutlass-grouped-scaled";
  }
  return "fp8-cutlass-grouped";
}

absl::Status CudaFp8MoeExperts::CutlassGrouped(const CudaFp8MoeWeights& w, const bf16* x,
                                               int64_t Tn, const kc::DeviceMoePermutation& perm,
                                               int64_t E, bf16* gate_up, bf16* act,
                                               bf16* expert_out, cudaStream_t stream) {
#ifdef TANDEM_HAVE_CUTLASS
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  const int64_t rows = Tn * config_.num_experts_per_tok;
  const CudaFp8Weight& g0 = w.gate_up.front();
  const CudaFp8Weight& d0 = w.down.front();
  const Scheme scheme = g0.activation;
  uint8_t* codes = codes_.get<uint8_t>();
  float* scales = scales_.get<float>();
  // x quantized once per token (1 x 128 groups, per token or one static scale: row-local), then
  // its codes gathered into the permuted rows: the codes of the gathered rows.
  uint8_t* x_codes = x_codes_.get<uint8_t>();
  float* x_scales = x_scales_.get<float>();
  RETURN_IF_ERROR(
      kc::QuantizeActivations(x, Tn, H, scheme, g0.input_scale, x_codes, x_scales, stream));
  RETURN_IF_ERROR(kc::MoeGatherFp8Rows(x_codes, x_scales, H, scheme, perm.token_of_row, rows, codes,
                                       scales, stream));
  kc::MoeFp8CutlassGroupedArgs args{codes,
                                    scheme == Scheme::kStaticTensor ? x_scales : scales,
                                    DeviceExperts(w.gate_up, w.gate_up_codes, w.gate_up_scales),
                                    perm.expert_offsets,
                                    E,
                                    2 * Ie,
                                    H,
                                    gate_up};
  args.a_scheme = scheme;
  args.a_scales_wide = a_scales_wide_.empty() ? nullptr : a_scales_wide_.get<float>();
  args.w_scales_wide = w_scales_wide_.empty() ? nullptr : w_scales_wide_.get<float>();
  // Per-channel weights with per-token / static activations: their scales in the epilogue (the
  // scaled form), unless kRow asks for the broadcast row form; few rows an expert: swapped.
  args.broadcast_scales = !CutlassScaledFormServes(w);
  args.swap_ab = CutlassSwapServes(w, rows, E);
  const bool block = CutlassBlockScalesServe(w);
  if (block) {  // the block form: the upload's block scales [ceil(n / 128), ld]
    args.block_scales = w.gate_up_block_scales.get<const float* const>();
    args.block_scale_ld = kc::Block128WeightScaleLd(H);
  }
  void* ws = cutlass_workspace_.data();
  const size_t ws_bytes = static_cast<size_t>(cutlass_workspace_.bytes());
  RETURN_IF_ERROR(kc::MoeFp8CutlassGroupedGemm(args, ws, ws_bytes, stream));
  // SiLU * up and its quantization in one pass (act written too: the bf16 rows the other paths
  // and the tests read).
  RETURN_IF_ERROR(kc::MoeSiluAndMulQuantFp8(gate_up, rows, Ie, scheme, d0.input_scale, act, codes,
                                            scales, stream));
  args.w = DeviceExperts(w.down, w.down_codes, w.down_scales);
  args.a_scales = scales;
  args.n = H;
  args.k = Ie;
  args.out = expert_out;
  if (block) {
    args.block_scales = w.down_block_scales.get<const float* const>();
    args.block_scale_ld = kc::Block128WeightScaleLd(Ie);
  }
  return kc::MoeFp8CutlassGroupedGemm(args, ws, ws_bytes, stream);
#else
  static_cast<void>(w), static_cast<void>(x), static_cast<void>(Tn), static_cast<void>(perm);
  static_cast<void>(E), static_cast<void>(gate_up);
  static_cast<void>(act), static_cast<void>(expert_out), static_cast<void>(stream);
  return absl::FailedPreconditionError("FP8 experts: built without CUTLASS");
#endif
}

void CudaFp8MoeExperts::set_w8a16_gemv(bool on) {
  w8a16_gemv_ = on;
  linear_->set_w8a16_gemv(on);
}

bool CudaFp8MoeExperts::WeightOnly(const CudaFp8MoeWeights& w, int64_t Tn) const {
  return w8a16_gemv_ && Tn <= kc::kFp8W16GemvMaxM && !w.gate_up.empty() && !w.down.empty() &&
         kc::Fp8W16GroupedScales(w.gate_up.front().grid) &&
         kc::Fp8W16GroupedScales(w.down.front().grid);
}

absl::StatusOr<kc::MoeFp8Activations> CudaFp8MoeExperts::Input(const bf16* values, int64_t m,
                                                               int64_t k, const CudaFp8Weight& like,
                                                               cudaStream_t stream,
                                                               bool weight_only) {
  kc::MoeFp8Activations a;
  a.scheme = weight_only ? Scheme::kNone : like.activation;
  a.values = values;
  if (a.scheme == Scheme::kNone) return a;
  RETURN_IF_ERROR(kc::QuantizeActivations(values, m, k, a.scheme, like.input_scale,
                                          codes_.get<uint8_t>(), scales_.get<float>(), stream));
  a.codes = codes_.get<uint8_t>();
  a.scales = scales_.get<float>();
  return a;
}

absl::Status CudaFp8MoeExperts::Gemvs(const CudaFp8MoeWeights& w, const bf16* x, int64_t Tn,
                                      const kc::DeviceMoePermutation& perm, int64_t E, bf16* act,
                                      bf16* expert_out, cudaStream_t stream, bool pdl) {
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  const int64_t rows = Tn * config_.num_experts_per_tok;
  const bool weight_only = WeightOnly(w, Tn);
  ASSIGN_OR_RETURN(const kc::MoeFp8Activations xa,
                   Input(x, Tn, H, w.gate_up.front(), stream, weight_only));
  RETURN_IF_ERROR(
      kc::MoeFp8ExpertGemvGateUp(xa, DeviceExperts(w.gate_up, w.gate_up_codes, w.gate_up_scales), H,
                                 Ie, perm, E, rows, act, stream, pdl));
  ASSIGN_OR_RETURN(const kc::MoeFp8Activations aa,
                   Input(act, rows, Ie, w.down.front(), stream, weight_only));
  return kc::MoeFp8ExpertGemvDown(aa, DeviceExperts(w.down, w.down_codes, w.down_scales), H, Ie,
                                  perm, E, rows, expert_out, stream, pdl);
}

absl::Status CudaFp8MoeExperts::Mma(const CudaFp8MoeWeights& w, const bf16* x, int64_t Tn,
                                    const kc::DeviceMoePermutation& perm, int64_t E, bf16* gate_up,
                                    bf16* act, bf16* expert_out, cudaStream_t stream) {
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  const int64_t rows = Tn * config_.num_experts_per_tok;
  ASSIGN_OR_RETURN(const kc::MoeFp8Activations xa, Input(x, Tn, H, w.gate_up.front(), stream));
  RETURN_IF_ERROR(kc::MoeFp8GroupedMma(xa, perm.token_of_row,
                                       DeviceExperts(w.gate_up, w.gate_up_codes, w.gate_up_scales),
                                       perm.expert_offsets, E, rows, 2 * Ie, H, gate_up, stream));
  RETURN_IF_ERROR(kc::MoeSiluAndMul<bf16>(gate_up, rows, Ie, act, stream));
  ASSIGN_OR_RETURN(const kc::MoeFp8Activations aa, Input(act, rows, Ie, w.down.front(), stream));
  return kc::MoeFp8GroupedMma(aa, nullptr, DeviceExperts(w.down, w.down_codes, w.down_scales),
                              perm.expert_offsets, E, rows, H, Ie, expert_out, stream);
}

absl::Status CudaFp8MoeExperts::Routed(const CudaFp8MoeWeights& w, const bf16* x, int64_t Tn,
                                       const kc::DeviceMoePermutation& perm, int64_t E,
                                       bf16* rows_in, bf16* gate_up, bf16* act, bf16* expert_out,
                                       kc::MoeGroupedGemm* grouped, cudaStream_t stream, bool pdl) {
  const int64_t rows = Tn * config_.num_experts_per_tok;
  if (Tn < 1 || Tn > max_tokens_ || static_cast<int64_t>(w.gate_up.size()) != E ||
      static_cast<int64_t>(w.down.size()) != E) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 experts: ", Tn, " tokens (at most ",
                                                   max_tokens_, "), ", w.gate_up.size(),
                                                   " experts uploaded for ", E));
  }
  // CudaFp8Linear reads a static scheme's scale vector per row: the upload's length bounds it.
  const CudaFp8Weight& g0 = w.gate_up.front();
  const bool static_fits =
      g0.activation != Scheme::kStaticTensor || g0.static_act_scales.bytes() >= Tn * int64_t{4};
  if (grouped == nullptr || Tn <= kGemvMaxTokens || !static_fits) {  // sync-free, capturable
    // From cutlass_decode_min_tokens_ on (past the GEMVs' bound too: CUTLASS reads only the
    // experts with rows, as they do), except the weight-only batch-1 step.
    if (grouped_mma_ && decode_ != Decode::kMma && Tn >= cutlass_decode_min_tokens_ &&
        !WeightOnly(w, Tn) && CutlassDecodeServes(w, rows)) {
      last_path_ = CutlassPath(w, rows, E);
      return CutlassGrouped(w, x, Tn, perm, E, gate_up, act, expert_out, stream);
    }
    if (grouped_mma_ && g0.activation != Scheme::kNone &&
        Tn > std::max<int64_t>(4, E / config_.num_experts_per_tok)) {
      last_path_ = "fp8-grouped-mma";
      return Mma(w, x, Tn, perm, E, gate_up, act, expert_out, stream);
    }
    last_path_ = WeightOnly(w, Tn) ? "fp8-expert-w8a16-gemv" : "fp8-expert-gemv";
    return Gemvs(w, x, Tn, perm, E, act, expert_out, stream, pdl);
  }
  if (prefill_ == Prefill::kCutlass && CutlassPrefillServes(w, rows)) {
    last_path_ = CutlassPath(w, rows, E);
    return CutlassGrouped(w, x, Tn, perm, E, gate_up, act, expert_out, stream);
  }
  if (prefill_ == Prefill::kMma && g0.activation != Scheme::kNone) {
    last_path_ = "fp8-grouped-mma";
    return Mma(w, x, Tn, perm, E, gate_up, act, expert_out, stream);
  }
  last_path_ = "fp8-per-expert-gemm";
  return PerExpert(w, x, Tn, perm, E, rows_in, gate_up, act, expert_out, grouped, stream);
}

absl::Status CudaFp8MoeExperts::PerExpert(const CudaFp8MoeWeights& w, const bf16* x, int64_t Tn,
                                          const kc::DeviceMoePermutation& perm, int64_t E,
                                          bf16* rows_in, bf16* gate_up, bf16* act, bf16* expert_out,
                                          kc::MoeGroupedGemm* grouped, cudaStream_t stream) {
  const int64_t H = config_.hidden_size, Ie = config_.moe_intermediate_size;
  const int64_t rows = Tn * config_.num_experts_per_tok;
  RETURN_IF_ERROR(kc::MoeGatherRows<bf16>(x, H, perm.token_of_row, rows, rows_in, stream));
  RETURN_IF_ERROR(grouped->ReadOffsets(perm.expert_offsets, E, stream));
  const std::vector<int32_t>& o = grouped->offsets();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    if (m == 0) continue;  // an expert without rows is never read
    RETURN_IF_ERROR(linear_->Linear(rows_in + o[e] * H, w.gate_up[e], nullptr, m,
                                    gate_up + o[e] * 2 * Ie, stream));
  }
  RETURN_IF_ERROR(kc::MoeSiluAndMul<bf16>(gate_up, rows, Ie, act, stream));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    if (m == 0) continue;
    RETURN_IF_ERROR(
        linear_->Linear(act + o[e] * Ie, w.down[e], nullptr, m, expert_out + o[e] * H, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaFp8MoeExperts::Shared(const CudaFp8MoeWeights& w, const bf16* x, int64_t Tn,
                                       bf16* gate_up, bf16* act, bf16* out, cudaStream_t stream) {
  const int64_t Is = config_.shared_expert_intermediate_size;
  RETURN_IF_ERROR(linear_->Linear(x, w.shared_gate_up, nullptr, Tn, gate_up, stream));
  RETURN_IF_ERROR(kc::MoeSiluAndMul<bf16>(gate_up, Tn, Is, act, stream));
  return linear_->Linear(act, w.shared_down, nullptr, Tn, out, stream);
}

}  // namespace tandem::runtime::cuda
