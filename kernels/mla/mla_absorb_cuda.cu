// The latent-row write, the W_UK / W_UV absorption through cuBLAS strided-batched GEMMs (one
// batch entry per head; decode-sized steps through the GEMVs of mla_absorb_gemv_cuda.cu), and
// the whole absorbed MLA step (mla_cuda.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cublas_status.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/mla/mla_cuda.h"
#include "kernels/mla/mla_cuda_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

// One thread per element of the [num_tokens, D] rows; row t goes to slot_mapping[t].
template <typename T>
__global__ void WriteLatentKernel(const T* c_kv, int64_t c_kv_stride, const T* k_pe,
                                  int64_t k_pe_stride, const int64_t* slots, int64_t num_tokens,
                                  int lora, int dim, int block_size, int64_t block_elems,
                                  int64_t layer_offset, T* pool) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_tokens * dim) return;
  const int64_t t = i / dim;
  const int c = static_cast<int>(i % dim);
  const int64_t slot = slots[t];
  if (slot < 0) return;
  T* dst = pool + (slot / block_size) * block_elems + layer_offset + (slot % block_size) * dim;
  dst[c] = c < lora ? c_kv[t * c_kv_stride + c] : k_pe[t * k_pe_stride + (c - lora)];
}

// One thread per (token, row, rotation pair).
template <typename T>
__global__ void MlaRopeKernel(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                              int half, float factor, bool interleave, T* x, int64_t rows,
                              int64_t row_stride, int64_t offset) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_tokens * rows * half) return;
  const int p = static_cast<int>(i % half);
  const int64_t tr = i / half, t = tr / rows;
  // The angle is the fp32 product, as in transformers; cos / sin in fp64 rounded to fp32.
  const float angle = static_cast<float>(positions[t]) * inv_freq[p];
  double sn, cs;
  sincos(static_cast<double>(angle), &sn, &cs);
  const float c = static_cast<float>(cs) * factor, s = static_cast<float>(sn) * factor;
  T* row = x + tr * row_stride + offset;
  const int a = interleave ? 2 * p : p, b = interleave ? 2 * p + 1 : p + half;
  const float x1 = internal::ToFloat(row[a]), x2 = internal::ToFloat(row[b]);
  row[a] = internal::FromFloat<T>(x1 * c - x2 * s);
  row[b] = internal::FromFloat<T>(x2 * c + x1 * s);
}

template <typename T>
constexpr cudaDataType_t CudaType() {
  return std::is_same_v<T, __half> ? CUDA_R_16F : CUDA_R_16BF;
}

}  // namespace

template <typename T>
absl::Status MlaWriteLatent(const T* c_kv, int64_t c_kv_stride, const T* k_pe, int64_t k_pe_stride,
                            const int64_t* slot_mapping, int64_t num_tokens, const MlaDims& dims,
                            const DeviceKvCache& cache, int64_t layer, cudaStream_t stream) {
  RETURN_IF_ERROR(dims.Validate());
  RETURN_IF_ERROR(mla_internal::CheckLatentPool<T>(cache, dims, layer, "MlaWriteLatent"));
  if (num_tokens < 0 || c_kv_stride < dims.kv_lora_rank || k_pe_stride < dims.qk_rope_head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaWriteLatent: ", num_tokens, " tokens, strides ", c_kv_stride, ", ", k_pe_stride));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (c_kv == nullptr || k_pe == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("MlaWriteLatent: null pointer");
  }
  const int dim = static_cast<int>(dims.LatentDim());
  const int64_t n = num_tokens * dim;
  constexpr int kThreads = 256;
  WriteLatentKernel<T>
      <<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
          c_kv, c_kv_stride, k_pe, k_pe_stride, slot_mapping, num_tokens,
          static_cast<int>(dims.kv_lora_rank), dim, static_cast<int>(cache.layout.block_size),
          cache.layout.BlockElems(), cache.layout.TileOffset(0, layer, 0),
          static_cast<T*>(cache.data));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MlaRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                     int64_t rope_dim, float attention_factor, bool interleave, T* x,
                     int64_t rows_per_token, int64_t row_stride, int64_t offset,
                     cudaStream_t stream) {
  if (num_tokens < 0 || rope_dim <= 0 || rope_dim % 2 != 0 || rows_per_token < 1 || offset < 0 ||
      row_stride < offset + rope_dim) {
    return absl::InvalidArgumentError(absl::StrCat("MlaRope: rope_dim ", rope_dim, ", rows ",
                                                   rows_per_token, ", stride ", row_stride,
                                                   ", offset ", offset));
  }
  const int64_t n = num_tokens * rows_per_token * (rope_dim / 2);
  if (n == 0) return absl::OkStatus();
  if (positions == nullptr || inv_freq == nullptr || x == nullptr) {
    return absl::InvalidArgumentError("MlaRope: null pointer");
  }
  constexpr int kThreads = 256;
  MlaRopeKernel<T><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      positions, num_tokens, inv_freq, static_cast<int>(rope_dim / 2), attention_factor, interleave,
      x, rows_per_token, row_stride, offset);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status MlaAbsorbQuery(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                            const MlaDims& dims, int64_t num_tokens, T* q_cat, cudaStream_t stream,
                            const MlaAbsorbOptions& options) {
  RETURN_IF_ERROR(dims.Validate());
  if (num_tokens == 0) return absl::OkStatus();
  if (cublas == nullptr || q == nullptr || kv_b_proj == nullptr || q_cat == nullptr ||
      num_tokens < 0) {
    return absl::InvalidArgumentError("MlaAbsorbQuery: null pointer or negative size");
  }
  const int64_t H = dims.num_heads, Dn = dims.qk_nope_head_dim, Dr = dims.qk_rope_head_dim;
  const int64_t L = dims.kv_lora_rank, Dv = dims.v_head_dim, D = dims.LatentDim();
  if (mla_internal::AbsorbGemvApplies(dims, num_tokens, options.gemv_max_tokens, q_cat,
                                      kv_b_proj)) {
    return mla_internal::AbsorbQueryGemv<T>(q, kv_b_proj, dims, num_tokens, q_cat, options.pdl,
                                            stream);
  }
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
  // Column-major view: q_lat_h^T [L, T] (ld H*D) = W_UK_h^T [L, Dn] (W_UK_h row-major [Dn, L],
  // ld L) x q_nope_h^T [Dn, T] (ld H*(Dn+Dr)); batch over h.
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(L), static_cast<int>(num_tokens),
      static_cast<int>(Dn), &one, kv_b_proj, CudaType<T>(), static_cast<int>(L), (Dn + Dv) * L, q,
      CudaType<T>(), static_cast<int>(H * (Dn + Dr)), Dn + Dr, &zero, q_cat, CudaType<T>(),
      static_cast<int>(H * D), D, static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  // q_pe rows into the last Dr columns of each q_cat row.
  CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(q_cat + L, D * sizeof(T), q + Dn, (Dn + Dr) * sizeof(T),
                                         Dr * sizeof(T), num_tokens * H, cudaMemcpyDeviceToDevice,
                                         stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status MlaUnabsorbOutput(cublasHandle_t cublas, const T* o_lat, const T* kv_b_proj,
                               const MlaDims& dims, int64_t num_tokens, T* out, cudaStream_t stream,
                               const MlaAbsorbOptions& options) {
  RETURN_IF_ERROR(dims.Validate());
  if (num_tokens == 0) return absl::OkStatus();
  if (cublas == nullptr || o_lat == nullptr || kv_b_proj == nullptr || out == nullptr ||
      num_tokens < 0) {
    return absl::InvalidArgumentError("MlaUnabsorbOutput: null pointer or negative size");
  }
  const int64_t H = dims.num_heads, Dn = dims.qk_nope_head_dim;
  const int64_t L = dims.kv_lora_rank, Dv = dims.v_head_dim;
  if (mla_internal::AbsorbGemvApplies(dims, num_tokens, options.gemv_max_tokens, o_lat,
                                      kv_b_proj)) {
    return mla_internal::UnabsorbOutputGemv<T>(o_lat, kv_b_proj, dims, num_tokens, out, options.pdl,
                                               stream);
  }
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
  // Column-major: out_h^T [Dv, T] (ld H*Dv) = (W_UV_h viewed [L, Dv] ld L)^T x o_lat_h^T [L, T].
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(Dv), static_cast<int>(num_tokens),
      static_cast<int>(L), &one, kv_b_proj + Dn * L, CudaType<T>(), static_cast<int>(L),
      (Dn + Dv) * L, o_lat, CudaType<T>(), static_cast<int>(H * L), L, &zero, out, CudaType<T>(),
      static_cast<int>(H * Dv), Dv, static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

template <typename T>
absl::Status MlaAbsorbedAttention(cublasHandle_t cublas, const T* q, const T* kv_b_proj,
                                  const DeviceKvCache& cache, int64_t layer,
                                  const AttentionBatch& batch, float scale, const MlaPlan& plan,
                                  void* workspace, T* out, float* lse, cudaStream_t stream,
                                  const MlaAbsorbOptions& absorb) {
  const MlaPlanInput& in = plan.input;
  if (in.num_tokens == 0 || in.num_seqs == 0) return absl::OkStatus();
  if (workspace == nullptr) return absl::InvalidArgumentError("MlaAbsorbedAttention: workspace");
  const mla_internal::MlaWorkspace ws(in, plan.num_splits);
  unsigned char* base = static_cast<unsigned char*>(workspace);
  T* q_cat = reinterpret_cast<T*>(base + ws.q_cat);
  T* o_lat = reinterpret_cast<T*>(base + ws.o_lat);
  RETURN_IF_ERROR(
      MlaAbsorbQuery<T>(cublas, q, kv_b_proj, in.dims, in.num_tokens, q_cat, stream, absorb));
  RETURN_IF_ERROR(MlaLatentAttention<T>(q_cat, cache, layer, batch, scale, plan, workspace, o_lat,
                                        lse, stream));
  return MlaUnabsorbOutput<T>(cublas, o_lat, kv_b_proj, in.dims, in.num_tokens, out, stream,
                              absorb);
}

#define TANDEM_MLA_CUDA_INSTANTIATE(T)                                                            \
  template absl::Status MlaWriteLatent<T>(const T*, int64_t, const T*, int64_t, const int64_t*,   \
                                          int64_t, const MlaDims&, const DeviceKvCache&, int64_t, \
                                          cudaStream_t);                                          \
  template absl::Status MlaRope<T>(const int64_t*, int64_t, const float*, int64_t, float, bool,   \
                                   T*, int64_t, int64_t, int64_t, cudaStream_t);                  \
  template absl::Status MlaAbsorbQuery<T>(cublasHandle_t, const T*, const T*, const MlaDims&,     \
                                          int64_t, T*, cudaStream_t, const MlaAbsorbOptions&);    \
  template absl::Status MlaUnabsorbOutput<T>(cublasHandle_t, const T*, const T*, const MlaDims&,  \
                                             int64_t, T*, cudaStream_t, const MlaAbsorbOptions&); \
  template absl::Status MlaAbsorbedAttention<T>(                                                  \
      cublasHandle_t, const T*, const T*, const DeviceKvCache&, int64_t, const AttentionBatch&,   \
      float, const MlaPlan&, void*, T*, float*, cudaStream_t, const MlaAbsorbOptions&);
TANDEM_MLA_CUDA_INSTANTIATE(__nv_bfloat16)
TANDEM_MLA_CUDA_INSTANTIATE(__half)
#undef TANDEM_MLA_CUDA_INSTANTIATE

}  // namespace tandem::kernels::cuda
