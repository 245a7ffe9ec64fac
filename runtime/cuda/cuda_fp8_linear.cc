#include "runtime/cuda/cuda_fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8_cuda.h"
#include "kernels/fp8/fp8_gemm_kernels.h"
#include "kernels/fp8/fp8_gemv_cuda.h"
#include "kernels/fp8/fp8_w8a16_gemv_cuda.h"
#include "runtime/cuda/dummy_init.h"

#ifdef TANDEM_HAVE_CUTLASS
#include "kernels/moe/cutlass/moe_fp8_cutlass_grouped.h"
#endif

namespace tandem::runtime::cuda {
namespace {

namespace kc = ::tandem::kernels::cuda;
using Scheme = kernels::Fp8ActivationScheme;

constexpr int64_t kGroup = 128;
// The swapped GEMM's fp32 split sums: slices x m x n floats. A split only pays where the weight
// has few tiles (n x m small), so a few MiB hold every split SwapSplits picks at decode sizes.
constexpr int64_t kSplitScratchBytes = int64_t{8} << 20;
constexpr int64_t kSplitMinCols = 512;
// Up to this many rows the decode kernel quantizes the bf16 activations itself (no separate
// pass). 0: on an H200 the fused form measured slower than QuantizeActivations + the kernel on
// its codes at every m (kernels/fp8/BENCHMARKS.md), so it is not used.
constexpr int64_t kFusedQuantMaxM = 0;

// The cuBLASLt GEMM takes one scale per weight row and per token (or per tensor).
bool GemmServes(const CudaFp8Weight& w) {
  return w.grid.block_cols >= w.grid.cols &&
         (w.activation == Scheme::kDynamicToken || w.activation == Scheme::kStaticTensor);
}

// The block-scaled GEMM: 128 x 128 weight blocks in cuBLASLt's layout and 1x128 activations.
// CublasLtFp8Gemm takes k with a multiple of 4 groups of 128 columns on cuBLASLt, and any multiple
// of 128 on CUTLASS (`cutlass`: its block kernel is CUTLASS's). Before CUTLASS took the other k,
// DeepSeek-V2-Lite's shared experts' down (k = 2816: 22 groups) ran its prefill rows through the
// GEMV 16 rows at a time (kernels/fp8/BENCHMARKS.md, nineteenth session).
bool BlockGemmServes(const CudaFp8Weight& w, bool cutlass) {
  if (w.block_scales.empty() || w.activation != Scheme::kDynamicGroup128) return false;
  return kc::Block128Groups(w.grid.cols) % 4 == 0 || (cutlass && w.grid.cols % kGroup == 0);
}

// The one-group CUTLASS row GEMM: per-row scales over 128-column groups (whatever a 128-row
// block's rows hold, any k a multiple of 16) and FP8 activations with scales.
bool RowGemmServes(const CudaFp8Weight& w) {
  const kernels::Fp8ScaleGrid& g = w.grid;
  return g.block_rows == 1 && g.block_cols == kGroup && g.cols > kGroup && g.cols % 16 == 0 &&
         g.rows % 8 == 0 &&
         (w.activation == Scheme::kDynamicGroup128 || w.activation == Scheme::kDynamicToken ||
          w.activation == Scheme::kStaticTensor);
}

// The swapped CUTLASS GEMM (the scaled form): whole-row weight scales with per-token or static
// activations, rows a multiple of 8 (16-byte bf16 output rows), k of 16 (16-byte TMA rows).
bool SwapGemmServes(const CudaFp8Weight& w) {
  return GemmServes(w) && w.grid.rows % 8 == 0 && w.grid.cols % 16 == 0;
}

// Whether m rows of w run the swapped CUTLASS GEMM (row_gemm: the object has CUTLASS's workspace).
bool UseSwapGemm(const CudaFp8Weight& w, int64_t m, bool row_gemm, Fp8DecodeGemm g) {
  if (!row_gemm || m < 2 || !SwapGemmServes(w)) return false;
  if (g == Fp8DecodeGemm::kCutlassSwap) return true;
  if (g != Fp8DecodeGemm::kAuto && g != Fp8DecodeGemm::kAutoNarrow) return false;
  if (w.grid.rows * w.grid.cols < kFp8SwapGemmMinElements) return false;
  if (m >= kFp8SwapGemmMinM && m <= kFp8SwapGemmMaxM) return true;
  return g == Fp8DecodeGemm::kAuto && m >= kFp8WideSwapMinM && m <= kFp8WideSwapMaxM &&
         w.grid.rows >= kFp8WideSwapMinN;
}

// Whether m rows run the small-m GEMV: up to kFp8SmallMMaxM, except where cuBLASLt is forced on a
// weight it serves.
bool UseSmallMGemv(const CudaFp8Weight& w, int64_t m, Fp8DecodeGemm g) {
  return m <= kc::kFp8SmallMMaxM && !(g == Fp8DecodeGemm::kCublasLt && m >= 2 && GemmServes(w));
}

kc::Fp8DeviceWeight DeviceWeight(const CudaFp8Weight& w) { return w.device(); }

// The W8A16 GEMV's weights in CudaFp8Linear: m = 1, scales per 128-column group and a k it takes
// (per-channel weights keep the W8A8 GEMV here; CudaLlamaModel folds them itself).
bool W8a16GemvServes(const CudaFp8Weight& w, int64_t m) {
  const kernels::Fp8ScaleGrid& g = w.grid;
  return m >= 1 && m <= kc::kFp8W16GemvMaxM && kc::Fp8W16GroupedScales(g) && g.cols % 16 == 0 &&
         g.cols <= kc::kFp8W16MaxK;
}

}  // namespace

absl::StatusOr<CudaFp8Weight> AllocateFp8Weight(const kernels::Fp8ScaleGrid& grid,
                                                Scheme activation, float input_scale,
                                                int64_t max_tokens) {
  const bool row_scales = grid.block_cols == kGroup || grid.block_cols >= grid.cols;
  if (grid.rows < 1 || grid.cols < 16 || grid.cols % 16 != 0 || grid.block_rows != 1 ||
      !row_scales || (activation == Scheme::kStaticTensor && !(input_scale > 0.0f))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FP8 weight [", grid.rows, ", ", grid.cols, "] with scale blocks ", grid.block_rows, "x",
        grid.block_cols,
        ": the CUDA backend needs k a multiple of 16, per-row scales over 128 columns or the "
        "whole row, and a positive static input scale"));
  }
  CudaFp8Weight w;
  w.grid = grid;
  w.activation = activation;
  w.input_scale = input_scale;
  ASSIGN_OR_RETURN(w.codes, DeviceBuffer::Allocate(grid.rows * grid.cols, "fp8 weight codes"));
  ASSIGN_OR_RETURN(w.scales, DeviceBuffer::Allocate(grid.NumScales() * int64_t{4}, "fp8 scales"));
  if (activation == Scheme::kStaticTensor) {
    ASSIGN_OR_RETURN(w.static_act_scales,
                     DeviceBuffer::Allocate(max_tokens * int64_t{4}, "fp8 static act scales"));
    const std::vector<float> copies(static_cast<size_t>(max_tokens), input_scale);
    CUDA_RETURN_IF_ERROR(cudaMemcpy(w.static_act_scales.data(), copies.data(),
                                    copies.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  return w;
}

absl::StatusOr<CudaFp8Weight> UploadFp8Weight(Fp8LinearWeight* host, int64_t rows, int64_t cols,
                                              int64_t max_tokens, const std::string& what) {
  const kernels::Fp8ScaleGrid& g = host->grid;
  if (g.rows != rows || g.cols != cols || static_cast<int64_t>(host->codes.size()) != rows * cols ||
      static_cast<int64_t>(host->scales.size()) != g.NumScales()) {
    return absl::InvalidArgumentError(absl::StrCat("FP8 weight ", what, " is [", g.rows, ", ",
                                                   g.cols, "] (", host->codes.size(),
                                                   " codes), expected [", rows, ", ", cols, "]"));
  }
  absl::StatusOr<CudaFp8Weight> alloc =
      AllocateFp8Weight(g, host->activation, host->input_scale, max_tokens);
  if (!alloc.ok()) {
    return absl::Status(alloc.status().code(), absl::StrCat(what, ": ", alloc.status().message()));
  }
  CudaFp8Weight w = *std::move(alloc);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(w.codes.data(), host->codes.data(), host->codes.size(), cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(w.scales.data(), host->scales.data(),
                                  host->scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (host->activation == Scheme::kDynamicGroup128 && g.block_cols == kGroup) {
    // Rows of one 128-block that differ (fused parts or slices off block boundaries, or per-row
    // scales): no block GEMM, the chunked GEMV serves the weight.
    absl::StatusOr<std::vector<float>> blocks = kc::Block128WeightScales(host->scales.data(), g);
    if (blocks.ok()) {
      ASSIGN_OR_RETURN(
          w.block_scales,
          DeviceBuffer::Allocate(static_cast<int64_t>(blocks->size()) * 4, "fp8 block scales"));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(w.block_scales.data(), blocks->data(),
                                      blocks->size() * sizeof(float), cudaMemcpyHostToDevice));
    }
  }
  *host = Fp8LinearWeight();
  return w;
}

absl::StatusOr<CudaFp8Weight> AllocateFp8DummyWeight(const WeightQuantization& q, int64_t n,
                                                     int64_t k, int64_t max_tokens) {
  ASSIGN_OR_RETURN(CudaFp8Weight w,
                   AllocateFp8Weight(Fp8QuantizedGrid(q, n, k), q.activation, 0.0f, max_tokens));
  CUDA_RETURN_IF_ERROR(cudaMemset(w.codes.data(), 0, w.codes.bytes()));
  CUDA_RETURN_IF_ERROR(cudaMemset(w.scales.data(), 0, w.scales.bytes()));
  w.dummy_tiles = Fp8QuantizesTiles(q);
  if (w.dummy_tiles && q.activation == Scheme::kDynamicGroup128) {
    const int64_t blocks = (n + kGroup - 1) / kGroup * kc::Block128WeightScaleLd(k);
    ASSIGN_OR_RETURN(w.block_scales, DeviceBuffer::Allocate(blocks * 4, "fp8 block scales"));
    CUDA_RETURN_IF_ERROR(cudaMemset(w.block_scales.data(), 0, w.block_scales.bytes()));
  }
  // cudaMemset runs on the legacy stream, asynchronously to the host: done before a fill on the
  // model's (non-blocking) stream writes the weight.
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return w;
}

absl::Status FillFp8Dummy(const DummyTensorFill& fill, uint64_t seed, float* staging,
                          CudaFp8Weight* w, cudaStream_t stream) {
  const int64_t k = w->grid.cols, n = fill.slice.numel();
  if (fill.offset % k != 0 || n % k != 0 || fill.offset + n > w->grid.rows * k) {
    return absl::InvalidArgumentError(
        absl::StrCat("dummy FP8 fill of elements [", fill.offset, ", ", fill.offset + n,
                     ") is not whole rows of a [", w->grid.rows, ", ", k, "] weight"));
  }
  RETURN_IF_ERROR(
      FillDummySlice<float>(staging, fill.slice, fill.mean, seed, fill.stream_id, stream));
  const int64_t row0 = fill.offset / k;
  uint8_t* codes = w->codes.get<uint8_t>() + fill.offset;
  float* scales = w->scales.get<float>() + row0 * w->grid.GridCols();
  if (w->dummy_tiles) {  // 128 x 128 tiles from the fill's first row (kernels::QuantizeWeight)
    if (row0 % kGroup != 0 && !w->block_scales.empty()) {
      // The weight's 128-row blocks do not share their scales: no block-scaled GEMM for it.
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // earlier fills wrote them
      w->block_scales.Reset();
    }
    const int64_t ld = kc::Block128WeightScaleLd(k);
    float* blocks =
        w->block_scales.empty() ? nullptr : w->block_scales.get<float>() + row0 / kGroup * ld;
    return kc::QuantizeWeightTiles128(staging, n / k, k, codes, scales, blocks, ld, stream);
  }
  // Per-row amax / 448 (or per 128 columns), x / scale rounded: kernels::QuantizeWeight's codes.
  const Scheme rows_as = w->grid.block_cols >= k ? Scheme::kDynamicToken : Scheme::kDynamicGroup128;
  return kc::QuantizeActivations(staging, n / k, k, rows_as, 0.0f, codes, scales, stream);
}

absl::Status FillFp8Dummy(const DummyTensorFill& fill, uint64_t seed, DeviceBuffer* staging,
                          CudaFp8Weight* w, cudaStream_t stream) {
  const int64_t bytes = fill.slice.numel() * int64_t{4};
  if (staging->bytes() < bytes) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the old staging is no longer read
    staging->Reset();
    ASSIGN_OR_RETURN(*staging, DeviceBuffer::Allocate(bytes, "fp8 dummy staging"));
  }
  return FillFp8Dummy(fill, seed, staging->get<float>(), w, stream);
}

absl::StatusOr<std::unique_ptr<CudaFp8Linear>> CudaFp8Linear::Create(int64_t max_tokens,
                                                                     int64_t max_k) {
  std::unique_ptr<CudaFp8Linear> out(new CudaFp8Linear());
  out->max_tokens_ = max_tokens;
  out->max_k_ = max_k;
  if (const char* env = std::getenv("TANDEM_FP8_W16_GEMV"); env != nullptr) {
    out->w8a16_gemv_ = std::string(env) != "0";
  }
  if (const char* env = std::getenv("TANDEM_FP8_GROUP_CODES"); env != nullptr) {
    out->group_codes_ = std::string(env) != "0";
  }
  if (const char* env = std::getenv("TANDEM_FP8_GROUP_MAJOR"); env != nullptr) {
    out->group_major_ = std::string(env) != "0";
  }
  if (const char* env = std::getenv("TANDEM_FP8_SWAP_TOKENS"); env != nullptr) {
    const std::string t = env;
    if (t != "32" && t != "64" && t != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_FP8_SWAP_TOKENS=", t, ": expected auto, 32 or 64"));
    }
    out->swap_token_tile_ = t == "auto" ? 0 : std::stoi(t);
  }
  if (const char* env = std::getenv("TANDEM_FP8_DECODE_GEMM"); env != nullptr) {
    const std::string g = env;
    if (g == "gemv") {
      out->decode_gemm_ = Fp8DecodeGemm::kGemv;
    } else if (g == "cublaslt") {
      out->decode_gemm_ = Fp8DecodeGemm::kCublasLt;
    } else if (g == "swap") {
      out->decode_gemm_ = Fp8DecodeGemm::kCutlassSwap;
    } else if (g == "auto32") {
      out->decode_gemm_ = Fp8DecodeGemm::kAutoNarrow;
    } else if (g != "auto") {
      return absl::InvalidArgumentError(absl::StrCat(
          "TANDEM_FP8_DECODE_GEMM=", g, ": expected auto, auto32, gemv, cublaslt or swap"));
    }
  }
  if (const char* env = std::getenv("TANDEM_FP8_GEMV_KERNEL"); env != nullptr) {
    const std::string kernel = env;
    if (kernel == "streaming") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kStreaming;
    } else if (kernel == "register") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kRegisterLoads;
    } else if (kernel == "pipelined") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kPipelined;
    } else if (kernel == "pipelined_one_early") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kPipelinedOneEarly;
    } else if (kernel == "pipelined_l2") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kPipelinedPrefetchL2;
    } else if (kernel == "pipelined_late") {
      out->gemv_kernel_ = kc::Fp8GemvKernel::kPipelinedLate;
    } else if (kernel != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("TANDEM_FP8_GEMV_KERNEL=", kernel,
                       ": expected auto, pipelined, pipelined_one_early, pipelined_l2, "
                       "pipelined_late, streaming or register"));
    }
  }
  ASSIGN_OR_RETURN(out->gemm_, kc::CublasLtFp8Gemm::Create());
  ASSIGN_OR_RETURN(out->codes_, DeviceBuffer::Allocate(max_tokens * max_k, "fp8 activations"));
  ASSIGN_OR_RETURN(out->scales_,
                   DeviceBuffer::Allocate(max_tokens * ((max_k + kGroup - 1) / kGroup) * 4,
                                          "fp8 activation scales"));
  ASSIGN_OR_RETURN(out->block_act_scales_,
                   DeviceBuffer::Allocate(max_tokens * ((max_k + kGroup - 1) / kGroup) * 4,
                                          "fp8 block activation scales"));
  const char* row_env = std::getenv("TANDEM_FP8_ROW_GEMM");
  if (RowGemmAvailable() && (row_env == nullptr || std::string(row_env) != "0")) {
    RETURN_IF_ERROR(out->CreateRowGemm());
  }
  return out;
}

bool CudaFp8Linear::RowGemmAvailable() {
#ifdef TANDEM_HAVE_CUTLASS
  return kc::MoeFp8CutlassGroupedSupported();
#else
  return false;
#endif
}

absl::Status CudaFp8Linear::CreateRowGemm() {
#ifdef TANDEM_HAVE_CUTLASS
  RETURN_IF_ERROR(kc::MoeFp8CutlassGroupedInit());
  ASSIGN_OR_RETURN(const size_t bytes, kc::MoeFp8CutlassGroupedWorkspaceBytes(1));
  std::vector<int32_t> pairs(2 * static_cast<size_t>(max_tokens_ + 1));
  for (int64_t m = 0; m <= max_tokens_; ++m) pairs[2 * m + 1] = static_cast<int32_t>(m);
  ASSIGN_OR_RETURN(row_gemm_offsets_, DeviceBuffer::Allocate(static_cast<int64_t>(pairs.size()) * 4,
                                                             "fp8 row gemm offsets"));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpy(row_gemm_offsets_.data(), pairs.data(), pairs.size() * 4, cudaMemcpyHostToDevice));
  ASSIGN_OR_RETURN(row_gemm_workspace_,
                   DeviceBuffer::Allocate(static_cast<int64_t>(bytes), "fp8 row gemm workspace"));
  ASSIGN_OR_RETURN(split_partials_, DeviceBuffer::Allocate(kSplitScratchBytes, "fp8 split sums"));
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
#endif
  return absl::OkStatus();
}

absl::Status CudaFp8Linear::RowGemm(const CudaFp8Weight& w, int64_t m, __nv_bfloat16* out,
                                    cudaStream_t stream, bool swap_ab, int k_splits,
                                    const __nv_bfloat16* split_bias, const float* a_scales) {
#ifdef TANDEM_HAVE_CUTLASS
  const int64_t k = w.grid.cols;
  kc::MoeFp8CutlassGroupedArgs args;
  args.a = codes_.get<uint8_t>();
  // QuantizeActivations' (static: scales_[0]), token-major.
  args.a_scales = a_scales != nullptr ? a_scales : scales_.get<float>();
  args.w.groups = w.grid.GridCols();
  args.single_codes = w.codes.get<uint8_t>();
  args.single_scales = w.scales.get<float>();
  args.expert_offsets = row_gemm_offsets_.get<int32_t>() + 2 * m;
  args.num_experts = 1;
  args.n = w.grid.rows;
  args.k = k;
  args.out = out;
  args.a_scheme = w.activation;
  args.swap_ab = swap_ab;
  args.raster_along_tokens = swap_ab;  // one weight: its token tiles next to each other
  if (swap_ab && k_splits == 1) args.swap_token_tile = SwapTokenTile(m, w.grid.rows, k);
  if (k_splits > 1) {
    args.k_splits = k_splits;
    args.split_partials = split_partials_.get<float>();
    args.split_bias = split_bias;
    args.split_rows = m;
  }
  if (w.activation != Scheme::kDynamicGroup128) {
    args.a_scales_wide = block_act_scales_.get<float>();  // [m, ceil(k / 128)]: as the block GEMM's
  }
  return kc::MoeFp8CutlassGroupedGemm(args, row_gemm_workspace_.data(),
                                      static_cast<size_t>(row_gemm_workspace_.bytes()), stream);
#else
  // Not reached: without CUTLASS, CreateRowGemm allocates nothing, row_gemm() is false and
  // Linear never calls this; an error rather than a silent no-op if a caller ever did.
  (void)w, (void)m, (void)out, (void)stream, (void)swap_ab, (void)k_splits, (void)split_bias;
  return absl::UnimplementedError("CudaFp8Linear: built without CUTLASS (no row GEMM)");
#endif
}

int CudaFp8Linear::SwapSplits(int64_t m, int64_t n, int64_t k) const {
#ifdef TANDEM_HAVE_CUTLASS
  if (sm_count_ < 1 || m < 1) return 1;
  const int64_t tiles = (n + 127) / 128 * ((m + 31) / 32);
  // A model of the call's time in weight bytes an SM streams: the waves of (tile, slice) units,
  // each 128 rows x the slice's columns, plus the split sums written and read back, spread over
  // the SMs.
  auto cost = [&](int64_t slices, int64_t cols) {
    const int64_t waves = (tiles * slices + sm_count_ - 1) / sm_count_;
    const int64_t sums = slices > 1 ? slices * m * n * 8 / sm_count_ : 0;
    return static_cast<double>(waves * 128 * cols + sums);
  };
  int best = 1;
  double best_cost = cost(1, k);
  for (int s = 2; s <= kc::kMoeFp8CutlassMaxSplits; ++s) {
    const int64_t cols = kc::MoeFp8CutlassSplitCols(k, s);
    if (cols < kSplitMinCols) break;
    const int64_t slices = (k + cols - 1) / cols;
    if (slices * m * n * 4 > split_partials_.bytes()) break;
    // A split costs a second launch: taken only where it saves a tenth.
    if (cost(slices, cols) < 0.9 * cost(1, k) && cost(slices, cols) < best_cost) {
      best = static_cast<int>(slices);
      best_cost = cost(slices, cols);
    }
  }
  return best;
#else
  (void)m, (void)n, (void)k;
  return 1;
#endif
}

int CudaFp8Linear::SwapTokenTile(int64_t m, int64_t n, int64_t k) const {
  if (swap_token_tile_ != 0) return swap_token_tile_;
  if (decode_gemm_ != Fp8DecodeGemm::kAuto || n < kFp8WideSwapMinN || m <= 32) return 32;
  return m > kFp8SwapGemmMaxM || SwapSplits(m, n, k) == 1 ? 64 : 32;
}

absl::Status CudaFp8Linear::SwapGemm(const CudaFp8Weight& w, int64_t m, const __nv_bfloat16* bias,
                                     __nv_bfloat16* out, cudaStream_t stream) {
  const int splits = SwapTokenTile(m, w.grid.rows, w.grid.cols) == 32
                         ? SwapSplits(m, w.grid.rows, w.grid.cols)
                         : 1;
  if (splits == 1) {
    RETURN_IF_ERROR(RowGemm(w, m, out, stream, /*swap_ab=*/true));
    if (bias != nullptr) RETURN_IF_ERROR(kc::AddBias(out, bias, m, w.grid.rows, stream));
    return absl::OkStatus();
  }
  return RowGemm(w, m, out, stream, /*swap_ab=*/true, splits, bias);
}

const char* CudaFp8Linear::PathFor(const CudaFp8Weight& w, int64_t m, bool w8a16_gemv,
                                   bool row_gemm, Fp8DecodeGemm decode_gemm) {
  if (w8a16_gemv && W8a16GemvServes(w, m)) return "fp8-w8a16-gemv";
  if (UseSwapGemm(w, m, row_gemm, decode_gemm)) return "fp8-cutlass-swap-gemm";
  if (UseSmallMGemv(w, m, decode_gemm)) return "fp8-gemv";
  if (BlockGemmServes(w, kc::Fp8BlockGemmCutlassAvailable())) {
    return "fp8-block-gemm";  // CUTLASS where built, else cuBLASLt
  }
  if (GemmServes(w)) return "cublaslt-fp8-gemm";
  return row_gemm && RowGemmServes(w) ? "fp8-cutlass-row-gemm" : "fp8-gemv-chunks";
}

bool CudaFp8Linear::GroupMajorScales(const CudaFp8Weight& w, int64_t m) const {
  return group_major_ && w.activation == Scheme::kDynamicGroup128 && m > kc::kFp8SmallMMaxM &&
         m % kc::kBlock128RowMultiple == 0 && m <= max_tokens_ &&
         BlockGemmServes(w, gemm_->block_kernel() == kc::Fp8BlockGemmKernel::kCutlass);
}

bool CudaFp8Linear::TakesTokenCodes(const CudaFp8Weight& w, int64_t m) const {
  // 1 x 128 groups: not where the W8A16 GEMV takes the bf16 activations themselves (batch 1).
  const bool groups = group_codes_ && w.activation == Scheme::kDynamicGroup128 &&
                      !(w8a16_gemv_ && W8a16GemvServes(w, m));
  return !w.empty() && (w.activation == Scheme::kDynamicToken || groups) && m >= 1 &&
         m <= max_tokens_ && w.grid.cols <= max_k_;
}

absl::Status CudaFp8Linear::ReserveW16SplitK(int64_t weight_rows, int splits) {
  w16_split_k_.splits = splits;
  if (weight_rows <= w16_split_k_rows_) return absl::OkStatus();
  const int64_t bytes = kc::Fp8W16SplitKWorkspaceBytes(weight_rows);
  ASSIGN_OR_RETURN(w16_split_k_mem_, DeviceBuffer::Allocate(bytes, "fp8 w8a16 split-k workspace"));
  CUDA_RETURN_IF_ERROR(cudaMemset(w16_split_k_mem_.data(), 0, static_cast<size_t>(bytes)));
  w16_split_k_ = kc::Fp8W16SplitKWorkspaceAt(w16_split_k_mem_.data(), weight_rows, splits);
  w16_split_k_rows_ = weight_rows;
  return absl::OkStatus();
}

absl::Status CudaFp8Linear::Linear(const __nv_bfloat16* a, const CudaFp8Weight& w,
                                   const __nv_bfloat16* bias, int64_t m, __nv_bfloat16* out,
                                   cudaStream_t stream, bool programmatic_launch,
                                   bool codes_ready) {
  const int64_t k = w.grid.cols, n = w.grid.rows;
  if (w.empty() || m < 1 || m > max_tokens_ || k > max_k_ ||
      (codes_ready && !TakesTokenCodes(w, m))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaFp8Linear: m=", m, " k=", k, " outside the workspace (", max_tokens_, ", ", max_k_,
        "), no FP8 weight, or codes_ready for a weight not quantizing per token"));
  }
  if (w8a16_gemv_ && !codes_ready && W8a16GemvServes(w, m) &&
      kc::Fp8W16GemvSupported(a, DeviceWeight(w), m)) {
    // Batch 1, per-128-column scales: the bf16 activations as they are (no quantization pass),
    // the first weight loads before the PDL wait as the W8A8 GEMV's below.
    RETURN_IF_ERROR(kc::Fp8W16Gemv<__nv_bfloat16>(a, DeviceWeight(w), bias, m, out, stream,
                                                  programmatic_launch, /*early_weight_loads=*/true,
                                                  w8a16_math_, w16_split_k()));
    last_path_ = "fp8-w8a16-gemv";
    return absl::OkStatus();
  }
  if (UseSwapGemm(w, m, row_gemm(), decode_gemm_)) {
    // Decode-sized m on whole-row scales: the weight as the swapped GEMM's 128-row operand.
    if (!codes_ready) {
      RETURN_IF_ERROR(kc::QuantizeActivations(a, m, k, w.activation, w.input_scale,
                                              codes_.get<uint8_t>(), scales_.get<float>(), stream));
    }
    RETURN_IF_ERROR(SwapGemm(w, m, bias, out, stream));
    last_path_ = "fp8-cutlass-swap-gemm";
    return absl::OkStatus();
  }
  if (UseSmallMGemv(w, m, decode_gemm_)) {  // decode: the weight read once for all rows
    kc::Fp8SmallMActivations act;
    act.scheme = w.activation;
    if (!codes_ready && (w.activation == Scheme::kNone || m <= kFusedQuantMaxM)) {
      act.values = a;  // weight-only, or quantized inside the kernel
      act.static_scale = w.input_scale;
    } else {
      if (!codes_ready) {
        RETURN_IF_ERROR(kc::QuantizeActivations(a, m, k, w.activation, w.input_scale,
                                                codes_.get<uint8_t>(), scales_.get<float>(), stream,
                                                programmatic_launch));
      }
      act.codes = codes_.get<uint8_t>();
      act.scales = scales_.get<float>();
    }
    RETURN_IF_ERROR(kc::Fp8SmallMLinear<__nv_bfloat16>(act, DeviceWeight(w), bias, m, out, stream,
                                                       programmatic_launch, true, gemv_kernel_));
    last_path_ = "fp8-gemv";
    return absl::OkStatus();
  }
  const bool group_major = GroupMajorScales(w, m);  // the block GEMM below takes every row
  const float* token_scales = nullptr;              // the fallbacks' scales: scales_
  if (w.activation != Scheme::kNone && !codes_ready) {
    RETURN_IF_ERROR(kc::QuantizeActivations(a, m, k, w.activation, w.input_scale,
                                            codes_.get<uint8_t>(), scales_.get<float>(), stream,
                                            false, group_major ? m : 0));
  }
  if (GemmServes(w)) {  // m > kFp8SmallMMaxM, or cuBLASLt forced (decode_gemm_)
    const float* a_scales = w.activation == Scheme::kStaticTensor ? w.static_act_scales.get<float>()
                                                                  : scales_.get<float>();
    // Per-token (or static) x per-channel: cuBLASLt's outer-vector scales where it has them (an
    // H200 has), else its unit-scaled fp32 product + one scaling epilogue (CublasLtFp8Gemm).
    const absl::Status st = gemm_->Linear(codes_.get<uint8_t>(), a_scales, w.codes.get<uint8_t>(),
                                          w.scales.get<float>(), kc::Fp8GemmScaling::kTokenChannel,
                                          m, n, k, out, stream, bias);
    if (st.ok()) {
      last_path_ = "cublaslt-fp8-gemm";
      return st;
    }
    // No cuBLASLt kernel for this shape: the chunked GEMV below (same numerics).
    if (!absl::IsUnimplemented(st)) return st;
  }
  if (m > kc::kFp8SmallMMaxM &&
      BlockGemmServes(w, gemm_->block_kernel() == kc::Fp8BlockGemmKernel::kCutlass)) {
    // 1x128 x 128x128 blocks: the block-scaled GEMM (CUTLASS where built, else cuBLASLt:
    // CublasLtFp8Gemm's dispatch) on the rows cuBLASLt has kernels for (a multiple of 4), the
    // group scales in its VEC128 layout (group-major: written so where it takes every row, else
    // transposed); the last m % 4 rows on the GEMV below.
    const int64_t gemm_rows = m / kc::kBlock128RowMultiple * kc::kBlock128RowMultiple;
    const int64_t groups = (k + kGroup - 1) / kGroup;
    if (!group_major) {
      RETURN_IF_ERROR(kc::TransposeGroupScales(scales_.get<float>(), gemm_rows, groups,
                                               block_act_scales_.get<float>(), stream));
    }
    const float* a_scales = group_major ? scales_.get<float>() : block_act_scales_.get<float>();
    const absl::Status st = gemm_->Linear(
        codes_.get<uint8_t>(), a_scales, w.codes.get<uint8_t>(), w.block_scales.get<float>(),
        kc::Fp8GemmScaling::kBlock128, gemm_rows, n, k, out, stream, bias);
    if (st.ok()) {
      if (gemm_rows < m) RETURN_IF_ERROR(GemvChunks(w, a, bias, m, out, stream, gemm_rows));
      last_path_ = "fp8-block-gemm";  // which kernel ran: gemm_->last_block_kernel()
      return absl::OkStatus();
    }
    if (!absl::IsUnimplemented(st)) return st;
    if (group_major) {
      // The paths below read the scales token-major: [groups, m] -> [m, groups] into
      // block_act_scales_ (scales_ stays as written: a later codes_ready call may read it).
      RETURN_IF_ERROR(kc::TransposeGroupScales(scales_.get<float>(), groups, m,
                                               block_act_scales_.get<float>(), stream));
      token_scales = block_act_scales_.get<float>();
    }
  }
  if (m > kc::kFp8SmallMMaxM && row_gemm() && RowGemmServes(w)) {
    // Per-row group scales no block GEMM takes: one group of CUTLASS's grouped row form, a bias
    // added after its bf16 output (as the cuBLASLt GEMMs' AddBias).
    RETURN_IF_ERROR(RowGemm(w, m, out, stream, false, 1, nullptr, token_scales));
    if (bias != nullptr) RETURN_IF_ERROR(kc::AddBias(out, bias, m, n, stream));
    last_path_ = "fp8-cutlass-row-gemm";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(GemvChunks(w, a, bias, m, out, stream, 0, token_scales));
  last_path_ = m <= kc::kFp8SmallMMaxM ? "fp8-gemv" : "fp8-gemv-chunks";
  return absl::OkStatus();
}

absl::Status CudaFp8Linear::GemvChunks(const CudaFp8Weight& w, const __nv_bfloat16* a,
                                       const __nv_bfloat16* bias, int64_t m, __nv_bfloat16* out,
                                       cudaStream_t stream, int64_t first_row,
                                       const float* a_scales) {
  const int64_t k = w.grid.cols, n = w.grid.rows;
  // Activation scales per row: none (static: one), 1 (per token), k / 128 groups.
  const int64_t scale_stride = w.activation == Scheme::kDynamicToken ? 1
                               : w.activation == Scheme::kDynamicGroup128
                                   ? (k + kGroup - 1) / kGroup
                                   : 0;
  for (int64_t r0 = first_row; r0 < m; r0 += kc::kFp8SmallMMaxM) {
    const int64_t rows = std::min(kc::kFp8SmallMMaxM, m - r0);
    kc::Fp8SmallMActivations act;
    act.scheme = w.activation;
    if (w.activation == Scheme::kNone) {
      act.values = a + r0 * k;
    } else {
      act.codes = codes_.get<uint8_t>() + r0 * k;
      act.scales = (a_scales != nullptr ? a_scales : scales_.get<float>()) + r0 * scale_stride;
    }
    RETURN_IF_ERROR(kc::Fp8SmallMLinear<__nv_bfloat16>(
        act, DeviceWeight(w), bias, rows, out + r0 * n, stream, false, true, gemv_kernel_));
  }
  return absl::OkStatus();
}

}  // namespace tandem::runtime::cuda
