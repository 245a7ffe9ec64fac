// Host side of cuda::PagedPrefillAttention: the planner, argument checks, and the one place
// where run-time head_dim / soft-cap / kernel choice / pool dtype become template constants.
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/paged_prefill_cuda.h"
#include "kernels/attention/cuda/prefill_fp8_widen.h"
#include "kernels/attention/cuda/prefill_mma_kernel.cuh"
#include "kernels/attention/cuda/prefill_wgmma_kernel.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::prefill::Fp8WidenBytes;
using internal::prefill::MmaCfg;
using internal::prefill::PrefillMmaKernel;
using internal::prefill::PrefillParams;
using internal::prefill::PrefillWgmmaKernel;
using internal::prefill::WgCfg;
using internal::prefill::WidenFp8Pool;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("cuda::PagedPrefillAttention: ", args...));
}

int64_t NumWorkItems(const PagedPrefillPlanInput& in, int rows) {
  const int64_t group = in.num_q_heads / in.num_kv_heads;
  return (in.num_tokens * group / rows + in.num_seqs) * in.num_kv_heads;
}

// fp8 pools: head_dim 64 / 128 only (PlanPagedPrefill).
int MmaCtasPerSm(int64_t head_dim, KvDtype kv_dtype) {
  if (kv_dtype == KvDtype::kFp8E4m3) {
    return head_dim <= 64 ? MmaCfg<64, 1>::kCtasPerSm : MmaCfg<128, 1>::kCtasPerSm;
  }
  if (head_dim <= 64) return MmaCfg<64>::kCtasPerSm;
  if (head_dim <= 128) return MmaCfg<128>::kCtasPerSm;
  return head_dim <= 192 ? MmaCfg<192>::kCtasPerSm : MmaCfg<256>::kCtasPerSm;
}

// The wgmma kernel exists only as sm_90a machine code (its compute_90 PTX twin is empty), so
// it may run only on a compute capability 9.0 device.
absl::StatusOr<bool> DeviceIsSm90() {
  int device = 0, major = 0, minor = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

template <typename T, typename KV, int D, bool kSoftcap, int DV = D>
absl::Status Launch(const PrefillParams<T, KV>& p, bool wgmma, int grid, cudaStream_t stream) {
  if constexpr (D <= 128 && std::is_same_v<T, KV>) {
    if (wgmma) {
      using C = WgCfg<D>;
      auto* kernel = &PrefillWgmmaKernel<T, D, kSoftcap>;
      CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
      kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
      CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return absl::OkStatus();
    }
  }
  using C = MmaCfg<D, int{sizeof(KV)}>;
  auto* kernel = &PrefillMmaKernel<T, KV, D, kSoftcap, DV>;
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T, typename KV, bool kSoftcap>
absl::Status DispatchHeadDim(const PrefillParams<T, KV>& p, int64_t head_dim, int64_t v_head_dim,
                             bool wgmma, int grid, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, KV>) {  // fp8 pools: the mma.sync kernel, head_dim 64 / 128
    if (head_dim == 64) return Launch<T, KV, 64, kSoftcap>(p, false, grid, stream);
    if (head_dim == 128) return Launch<T, KV, 128, kSoftcap>(p, false, grid, stream);
    return Invalid("head_dim ", head_dim, " not supported with an fp8_e4m3 pool (64, 128)");
  } else {
    switch (head_dim) {
      case 64:
        return Launch<T, T, 64, kSoftcap>(p, wgmma, grid, stream);
      case 128:
        return Launch<T, T, 128, kSoftcap>(p, wgmma, grid, stream);
      case 192:  // MLA's unabsorbed prefill (kernels/mla): qk 128 + 64, V 128
        if (v_head_dim == 128) return Launch<T, T, 192, kSoftcap, 128>(p, false, grid, stream);
        return Launch<T, T, 192, kSoftcap>(p, false, grid, stream);
      case 256:
        return Launch<T, T, 256, kSoftcap>(p, false, grid, stream);
      default:
        return Invalid("head_dim ", head_dim, " not supported (64, 128, 192, 256)");
    }
  }
}

// Fills the launch parameters (the pool read as KV) and launches. wgmma: the plan's choice,
// already narrowed to what this device runs (never for an fp8 pool).
template <typename T, typename KV>
absl::Status Run(const T* q, const DeviceKvCache& cache, int64_t layer, const AttentionBatch& batch,
                 const AttentionParams& params, const PagedPrefillPlan& plan, bool wgmma, T* out,
                 float* lse, cudaStream_t stream) {
  const KvCacheLayout& layout = cache.layout;
  const PagedPrefillPlanInput& in = plan.input;
  PrefillParams<T, KV> p{};
  p.q = q;
  p.out = out;
  p.lse = lse;
  p.pool = static_cast<const KV*>(cache.data) + layout.TileOffset(0, layer, 0);
  p.block_elems = layout.BlockElems();
  p.tile_elems = layout.TileElems();
  p.token_stride = static_cast<int>(layout.num_kv_heads * layout.head_dim);
  p.block_size = static_cast<int>(layout.block_size);
  p.block_shift = -1;
  for (int s = 0; s < 31; ++s) {
    if ((int64_t{1} << s) == layout.block_size) p.block_shift = s;
  }
  p.query_start_loc = batch.query_start_loc;
  p.seq_lens = batch.seq_lens;
  p.block_tables = batch.block_tables;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.num_seqs = static_cast<int>(in.num_seqs);
  p.num_q_heads = static_cast<int>(in.num_q_heads);
  p.num_kv_heads = static_cast<int>(in.num_kv_heads);
  p.group = static_cast<int>(in.num_q_heads / in.num_kv_heads);
  p.num_work = static_cast<int>(NumWorkItems(in, wgmma ? 128 : 64));
  const bool softcap = params.softcap > 0;
  p.score_scale = softcap ? 1.0f : params.scale * internal::prefill::kLog2e;
  p.softcap_pre = softcap ? params.scale / params.softcap : 0.0f;
  p.softcap_log2 = softcap ? params.softcap * internal::prefill::kLog2e : 0.0f;
  p.window_left = static_cast<int>(params.window_left);
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  p.scale_per_head = cache.per_head_scale;
  if (softcap) {
    return DispatchHeadDim<T, KV, true>(p, in.head_dim, in.v_head_dim, wgmma, plan.grid, stream);
  }
  return DispatchHeadDim<T, KV, false>(p, in.head_dim, in.v_head_dim, wgmma, plan.grid, stream);
}

}  // namespace

absl::StatusOr<PagedPrefillPlan> PlanPagedPrefill(const PagedPrefillPlanInput& in) {
  if (in.num_kv_heads <= 0 || in.num_q_heads <= 0 || in.num_q_heads % in.num_kv_heads != 0) {
    return Invalid("num_q_heads ", in.num_q_heads, " is not a positive multiple of num_kv_heads ",
                   in.num_kv_heads);
  }
  if (in.head_dim != 64 && in.head_dim != 128 && in.head_dim != 192 && in.head_dim != 256) {
    return Invalid("head_dim ", in.head_dim, " not supported (64, 128, 192, 256)");
  }
  if (in.v_head_dim != 0 && in.v_head_dim != in.head_dim &&
      !(in.head_dim == 192 && in.v_head_dim == 128)) {
    return Invalid("v_head_dim ", in.v_head_dim, " with head_dim ", in.head_dim,
                   " not supported (0, head_dim, or 128 with 192)");
  }
  const bool fp8 = in.kv_dtype == KvDtype::kFp8E4m3;
  if (in.kv_dtype != KvDtype::kBf16 && in.kv_dtype != KvDtype::kFp16 && !fp8) {
    return Invalid("kv_dtype ", KvDtypeName(in.kv_dtype), " not supported (bf16, fp16, fp8_e4m3)");
  }
  if (fp8 && in.head_dim != 64 && in.head_dim != 128) {
    return Invalid("kv_dtype fp8_e4m3 with head_dim ", in.head_dim, " not supported (64, 128)");
  }
  if (in.num_seqs < 0 || in.num_tokens < 0 || in.max_q_len < 1 || in.max_seq_len < 0 ||
      in.num_sms <= 0) {
    return Invalid("plan bounds must be non-negative (max_q_len >= 1, num_sms > 0): num_seqs=",
                   in.num_seqs, " num_tokens=", in.num_tokens, " max_q_len=", in.max_q_len,
                   " max_seq_len=", in.max_seq_len, " num_sms=", in.num_sms);
  }
  if (in.max_seq_len > (int64_t{1} << 30) || in.num_tokens > (int64_t{1} << 30) ||
      in.num_seqs > (int64_t{1} << 30) || in.num_q_heads > 65536) {
    return Invalid("num_seqs / num_tokens / max_seq_len beyond 2^30 or num_q_heads beyond 65536");
  }
  if (in.kv_block_size < 0 || in.total_kv_blocks < 0 || in.fp8_widen_max_bytes < 0) {
    return Invalid("kv_block_size, total_kv_blocks and fp8_widen_max_bytes must be >= 0");
  }
  PagedPrefillPlan plan;
  plan.input = in;
  if (fp8 && in.allow_wgmma && in.kv_block_size > 0 && in.total_kv_blocks > 0) {
    // Widened into the workspace when the copy fits the budget (and the wgmma kernel then runs).
    const KvCacheLayout one{.num_blocks = 1,
                            .num_layers = 1,
                            .block_size = in.kv_block_size,
                            .num_kv_heads = in.num_kv_heads,
                            .head_dim = in.head_dim};
    const int64_t stride = (in.max_seq_len + in.kv_block_size - 1) / in.kv_block_size;
    const int64_t bytes =
        Fp8WidenBytes(one, in.total_kv_blocks, in.num_seqs, std::max<int64_t>(1, stride));
    if (in.total_kv_blocks <= INT32_MAX && bytes <= in.fp8_widen_max_bytes) {
      plan.widen_fp8 = true;
      plan.workspace_bytes = bytes;
    }
  }
  plan.use_wgmma = in.allow_wgmma && in.head_dim <= 128 && (!fp8 || plan.widen_fp8);
  plan.rows_per_tile = plan.use_wgmma ? 128 : 64;
  // The fallback to the mma kernel (non-Hopper device) walks 64-row items: size for both.
  plan.num_work_items = NumWorkItems(in, 64);
  if (plan.num_work_items > INT_MAX) {
    return Invalid("batch too large: ", plan.num_work_items, " work items");
  }
  const int64_t ctas_per_sm = plan.use_wgmma ? 1 : MmaCtasPerSm(in.head_dim, in.kv_dtype);
  plan.num_work_items = NumWorkItems(in, plan.rows_per_tile);
  plan.grid = static_cast<int>(
      std::clamp<int64_t>(plan.num_work_items, 1, int64_t{in.num_sms} * ctas_per_sm));
  return plan;
}

template <typename T>
absl::Status PagedPrefillAttention(const T* q, const DeviceKvCache& cache, int64_t layer,
                                   const AttentionBatch& batch, const AttentionParams& params,
                                   const PagedPrefillPlan& plan, T* out, float* lse,
                                   void* workspace, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateDeviceKvCache(cache, "cuda::PagedPrefillAttention"));
  const KvCacheLayout& layout = cache.layout;
  const PagedPrefillPlanInput& in = plan.input;
  RETURN_IF_ERROR(ValidateAttentionGeometry("cuda::PagedPrefillAttention", cache, layer, batch,
                                            in.num_kv_heads, in.head_dim, in.kv_dtype,
                                            in.num_seqs));
  constexpr KvDtype kOwn = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  const bool fp8 = cache.dtype == KvDtype::kFp8E4m3;  // its scales: ValidateDeviceKvCache
  if (cache.dtype != kOwn && !fp8) {
    return Invalid(KvDtypeName(cache.dtype), " pool with ", KvDtypeName(kOwn),
                   " activations (the prefill kernels read the activations' own dtype or fp8)");
  }
  if (layout.block_size > (int64_t{1} << 30) || in.num_kv_heads * in.head_dim > INT_MAX) {
    return Invalid("block_size or kv row width out of range");
  }
  RETURN_IF_ERROR(ValidateAttentionParams("cuda::PagedPrefillAttention", params));
  if (params.dcp_size > 1) {
    return Invalid("decode context parallelism (dcp_size ", params.dcp_size,
                   ") is served by cuda::PagedAttention (any q_len), not the prefill kernels");
  }
  if (batch.max_blocks_per_seq < 0) {
    return Invalid("max_blocks_per_seq must be >= 0, got ", batch.max_blocks_per_seq);
  }
  if (in.num_seqs == 0 || in.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateAttentionPointers("cuda::PagedPrefillAttention", q, out, batch));
  bool wgmma = plan.use_wgmma;
  if (wgmma) {
    ASSIGN_OR_RETURN(wgmma, DeviceIsSm90());
  }
  if (fp8 && !wgmma) {
    return Run<T, __nv_fp8_e4m3>(q, cache, layer, batch, params, plan, false, out, lse, stream);
  }
  if (fp8) {  // widened into the workspace (plan.widen_fp8), then read as T by the wgmma kernel
    if (layout.block_size != in.kv_block_size) {
      return Invalid("the plan widens blocks of ", in.kv_block_size, " tokens, the pool has ",
                     layout.block_size);
    }
    DeviceKvCache widened;
    AttentionBatch widened_batch;
    const int64_t stride =
        std::max<int64_t>(1, (in.max_seq_len + layout.block_size - 1) / layout.block_size);
    RETURN_IF_ERROR(WidenFp8Pool<T>(cache, layer, batch, in.total_kv_blocks, stride, workspace,
                                    &widened, &widened_batch, stream));
    return Run<T, T>(q, widened, 0, widened_batch, params, plan, true, out, lse, stream);
  }
  return Run<T, T>(q, cache, layer, batch, params, plan, wgmma, out, lse, stream);
}

template absl::Status PagedPrefillAttention<__nv_bfloat16>(
    const __nv_bfloat16*, const DeviceKvCache&, int64_t, const AttentionBatch&,
    const AttentionParams&, const PagedPrefillPlan&, __nv_bfloat16*, float*, void*, cudaStream_t);
template absl::Status PagedPrefillAttention<__half>(const __half*, const DeviceKvCache&, int64_t,
                                                    const AttentionBatch&, const AttentionParams&,
                                                    const PagedPrefillPlan&, __half*, float*, void*,
                                                    cudaStream_t);

}  // namespace tandem::kernels::cuda
