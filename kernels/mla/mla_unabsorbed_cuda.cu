// The unabsorbed MLA prefill (mla_cuda.h, MlaUnabsorbedAttention): gather the requests' latent
// context from the pages, up-project it through kv_b_proj into a block-size-1 K/V pool (cuBLAS
// strided-batched GEMMs over the heads), causal MHA over it by PagedPrefillAttention (V rows
// read to Dv columns).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

// Byte offsets into the unabsorbed workspace, each 256-byte aligned: ctx_start [S + 1] int32 |
// table [S, max_seq_len] int32 (block size 1: the request's rows of kv) | c_kv [N, L] T |
// kv [N][2][Hq][Dqk] T (K then V of each context row; V's columns past Dv never written or read).
struct UnabsorbedWorkspace {
  int64_t ctx_start = 0, table = 0, ckv = 0, kv = 0, total = 0;
  UnabsorbedWorkspace(const MlaPlanInput& in, int64_t n_ctx, int64_t head_dim) {
    const MlaDims& d = in.dims;
    auto take = [this](int64_t bytes) {
      const int64_t at = total;
      total += (bytes + 255) / 256 * 256;
      return at;
    };
    ctx_start = take((in.num_seqs + 1) * 4);
    table = take(in.num_seqs * in.max_seq_len * 4);
    ckv = take(n_ctx * d.kv_lora_rank * 2);
    kv = take(n_ctx * 2 * d.num_heads * head_dim * 2);
  }
};

// ctx_start[s] = seq_lens[0] + ... + seq_lens[s - 1], s in [0, S]: where request s's rows start
// in c_kv / kv. One CTA, kScanThreads requests per pass.
constexpr int kScanThreads = 256;
__global__ void ContextStartsKernel(const int32_t* seq_lens, int num_seqs, int32_t* ctx_start) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int32_t carry = 0;
  for (int s0 = 0; s0 <= num_seqs; s0 += kScanThreads) {
    const int s = s0 + static_cast<int>(threadIdx.x);
    const int32_t len = s < num_seqs ? seq_lens[s] : 0;
    int32_t before = 0, total = 0;
    Scan(tmp).ExclusiveSum(len, before, total);
    if (s <= num_seqs) ctx_start[s] = carry + before;
    carry += total;
    __syncthreads();  // tmp reused by the next pass
  }
}

struct GatherParams {
  const void* pool;
  int64_t layer_offset;  // elements
  int64_t block_elems;
  int block_size;
  int dim;  // L + Dr
  int lora;
  int heads;
  int head_dim;  // Dqk
  int nope;      // Dn
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t max_blocks;
  const int32_t* ctx_start;
  int32_t* table;  // [S, max_seq_len]
  int max_seq_len;
  void* ckv;  // [N, L]
  void* kv;   // [N][2][Hq][Dqk]
};

// Grid (max_seq_len, S): the CTA of latent j of request s copies its c_kv to c_kv row n =
// ctx_start[s] + j, its k_pe into columns [Dn, Dqk) of every head's K row n, and n into the block
// table. 16-byte units throughout (every width a multiple of 8 values of 2 bytes).
__global__ void GatherLatentKernel(const __grid_constant__ GatherParams p) {
  const int s = blockIdx.y, j = blockIdx.x;
  if (j >= p.seq_lens[s]) return;
  const int64_t n = p.ctx_start[s] + j;
  if (threadIdx.x == 0) p.table[int64_t{s} * p.max_seq_len + j] = static_cast<int32_t>(n);
  const int64_t block = p.block_tables[s * p.max_blocks + j / p.block_size];
  const uint4* row = static_cast<const uint4*>(p.pool) +
                     (block * p.block_elems + p.layer_offset + (j % p.block_size) * p.dim) / 8;
  const int lora_u = p.lora / 8, pe_u = (p.dim - p.lora) / 8;
  uint4* ckv = static_cast<uint4*>(p.ckv) + n * lora_u;
  for (int u = threadIdx.x; u < lora_u; u += blockDim.x) ckv[u] = row[u];
  const int row_u = p.head_dim / 8;
  uint4* k = static_cast<uint4*>(p.kv) + n * 2 * p.heads * row_u;
  for (int c = threadIdx.x; c < p.heads * pe_u; c += blockDim.x) {
    const int h = c / pe_u, u = c % pe_u;
    k[h * row_u + p.nope / 8 + u] = row[lora_u + u];
  }
}

template <typename T>
constexpr cudaDataType_t CudaType() {
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}

// kv rows of every head h: rows n of [out_dim] values at kv + base + h * Dqk, ld 2 Hq Dqk =
// kv_b_proj rows [h (Dn + Dv) + w_row, + out_dim) (row-major [out_dim, L]) times c_kv[n].
template <typename T>
absl::Status UpProject(cublasHandle_t cublas, const T* kv_b_proj, int64_t w_row, int64_t out_dim,
                       const T* ckv, int64_t n_ctx, const MlaDims& d, int64_t head_dim, T* dst) {
  const int64_t L = d.kv_lora_rank, H = d.num_heads;
  const float one = 1.0f, zero = 0.0f;
  // Column-major: dst_h [out_dim, N] (ld 2 H Dqk) = (W_h viewed [L, out_dim] ld L)^T x c_kv^T
  // [L, N] (ld L, shared by every head: stride 0).
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_dim), static_cast<int>(n_ctx),
      static_cast<int>(L), &one, kv_b_proj + w_row * L, CudaType<T>(), static_cast<int>(L),
      (d.qk_nope_head_dim + d.v_head_dim) * L, ckv, CudaType<T>(), static_cast<int>(L), 0, &zero,
      dst, CudaType<T>(), static_cast<int>(2 * H * head_dim), head_dim, static_cast<int>(H),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MlaUnabsorbedPlan> PlanMlaUnabsorbed(const MlaPlanInput& input,
                                                    int64_t max_context_tokens) {
  const MlaDims& d = input.dims;
  RETURN_IF_ERROR(d.Validate());
  const int64_t dqk = d.QkHeadDim();
  // The prefill kernel's widths: K = V in 64 / 128 / 192 / 256, or K 192 with V 128.
  const bool widths =
      ((dqk == 64 || dqk == 128 || dqk == 192 || dqk == 256) && d.v_head_dim == dqk) ||
      (dqk == 192 && d.v_head_dim == 128);
  if (!widths || d.kv_lora_rank % 8 != 0 || d.qk_nope_head_dim % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanMlaUnabsorbed: dims (nope ", d.qk_nope_head_dim, ", rope ", d.qk_rope_head_dim,
        ", lora ", d.kv_lora_rank, ", v ", d.v_head_dim,
        ") unsupported (Dn + Dr = Dv in 64/128/192/256, or 192 with Dv 128; L and Dn multiples "
        "of 8)"));
  }
  if (input.dcp.size > 1) {
    return absl::InvalidArgumentError("PlanMlaUnabsorbed: decode context parallelism (absorbed)");
  }
  if (input.num_seqs < 0 || input.num_seqs > 65535 || input.num_tokens < 0 ||
      input.max_seq_len < 0 || max_context_tokens < input.max_seq_len ||
      max_context_tokens > (int64_t{1} << 30) || 2 * d.num_heads * dqk > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PlanMlaUnabsorbed: bounds out of range (num_seqs ", input.num_seqs, ", max_seq_len ",
        input.max_seq_len, ", max_context_tokens ", max_context_tokens, ")"));
  }
  MlaUnabsorbedPlan plan;
  plan.input = input;
  plan.max_context_tokens = max_context_tokens;
  plan.head_dim = dqk;
  ASSIGN_OR_RETURN(plan.prefill,
                   PlanPagedPrefill({.num_seqs = input.num_seqs,
                                     .num_tokens = input.num_tokens,
                                     .max_q_len = std::max<int64_t>(input.max_q_len, 1),
                                     .max_seq_len = input.max_seq_len,
                                     .num_q_heads = d.num_heads,
                                     .num_kv_heads = d.num_heads,
                                     .head_dim = dqk,
                                     .num_sms = input.num_sms,
                                     .allow_wgmma = input.allow_wgmma,
                                     .v_head_dim = d.v_head_dim}));
  plan.workspace_bytes = UnabsorbedWorkspace(input, max_context_tokens, dqk).total;
  return plan;
}

template <typename T>
absl::Status MlaUnabsorbedAttention(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                                    const DeviceKvCache& cache, int64_t layer,
                                    const AttentionBatch& batch, float scale,
                                    const MlaUnabsorbedPlan& plan, void* workspace, T* out,
                                    float* lse, cudaStream_t stream) {
  const MlaPlanInput& in = plan.input;
  const MlaDims& d = in.dims;
  RETURN_IF_ERROR(mla_internal::CheckLatentPool<T>(cache, d, layer, "MlaUnabsorbedAttention"));
  if (batch.num_seqs != in.num_seqs || !(scale > 0.0f) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat("MlaUnabsorbedAttention: num_seqs ",
                                                   batch.num_seqs, " != plan's ", in.num_seqs,
                                                   " or scale ", scale));
  }
  if (in.num_seqs == 0 || in.num_tokens == 0) return absl::OkStatus();
  if (cublas == nullptr || q == nullptr || kv_b_proj == nullptr || out == nullptr ||
      workspace == nullptr || batch.query_start_loc == nullptr || batch.seq_lens == nullptr ||
      batch.block_tables == nullptr) {
    return absl::InvalidArgumentError("MlaUnabsorbedAttention: null pointer");
  }
  const int64_t H = d.num_heads, dqk = plan.head_dim, n_ctx = plan.max_context_tokens;
  const UnabsorbedWorkspace ws(in, n_ctx, dqk);
  unsigned char* base = static_cast<unsigned char*>(workspace);
  auto* ctx_start = reinterpret_cast<int32_t*>(base + ws.ctx_start);
  auto* table = reinterpret_cast<int32_t*>(base + ws.table);
  T* ckv = reinterpret_cast<T*>(base + ws.ckv);
  T* kv = reinterpret_cast<T*>(base + ws.kv);
  ContextStartsKernel<<<1, kScanThreads, 0, stream>>>(batch.seq_lens, static_cast<int>(in.num_seqs),
                                                      ctx_start);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (in.max_seq_len > 0) {
    GatherParams g{cache.data,
                   cache.layout.TileOffset(0, layer, 0),
                   cache.layout.BlockElems(),
                   static_cast<int>(cache.layout.block_size),
                   static_cast<int>(d.LatentDim()),
                   static_cast<int>(d.kv_lora_rank),
                   static_cast<int>(H),
                   static_cast<int>(dqk),
                   static_cast<int>(d.qk_nope_head_dim),
                   batch.seq_lens,
                   batch.block_tables,
                   batch.max_blocks_per_seq,
                   ctx_start,
                   table,
                   static_cast<int>(in.max_seq_len),
                   ckv,
                   kv};
    GatherLatentKernel<<<dim3(static_cast<unsigned>(in.max_seq_len),
                              static_cast<unsigned>(in.num_seqs)),
                         128, 0, stream>>>(g);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
    RETURN_IF_ERROR(UpProject<T>(cublas, kv_b_proj, 0, d.qk_nope_head_dim, ckv, n_ctx, d, dqk, kv));
    RETURN_IF_ERROR(UpProject<T>(cublas, kv_b_proj, d.qk_nope_head_dim, d.v_head_dim, ckv, n_ctx, d,
                                 dqk, kv + H * dqk));
  }
  const KvDtype own = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  const DeviceKvCache rows{.data = kv,
                           .layout = {.num_blocks = n_ctx,
                                      .num_layers = 1,
                                      .block_size = 1,
                                      .num_kv_heads = H,
                                      .head_dim = dqk,
                                      .num_planes = 2},
                           .dtype = own};
  PagedPrefillPlan prefill = plan.prefill;
  prefill.input.kv_dtype = own;
  const AttentionBatch rows_batch{.query_start_loc = batch.query_start_loc,
                                  .seq_lens = batch.seq_lens,
                                  .block_tables = table,
                                  .num_seqs = in.num_seqs,
                                  .max_blocks_per_seq = in.max_seq_len};
  return PagedPrefillAttention<T>(q, rows, 0, rows_batch, {.scale = scale}, prefill, out, lse,
                                  nullptr, stream);
}

#define TANDEM_MLA_UNABSORBED_INSTANTIATE(T)                                                    \
  template absl::Status MlaUnabsorbedAttention<T>(                                              \
      cublasHandle_t, const T*, const T*, const DeviceKvCache&, int64_t, const AttentionBatch&, \
      float, const MlaUnabsorbedPlan&, void*, T*, float*, cudaStream_t);
TANDEM_MLA_UNABSORBED_INSTANTIATE(__nv_bfloat16)
TANDEM_MLA_UNABSORBED_INSTANTIATE(__half)
#undef TANDEM_MLA_UNABSORBED_INSTANTIATE

}  // namespace tandem::kernels::cuda
