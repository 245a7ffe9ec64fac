// Internals shared by the kernels/mla CUDA sources (include from .cu only): PTX wrappers for the
// tensor-core kernel, the workspace layout and the latent-pool check.
#ifndef TANDEM_KERNELS_MLA_MLA_CUDA_INTERNAL_CUH_
#define TANDEM_KERNELS_MLA_MLA_CUDA_INTERNAL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/cuda/kv_cache_cuda.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/mla/mla_cuda.h"

namespace tandem::kernels::cuda::mla_internal {

// The tensor-core latent kernels' geometry (latent 512 + 64; 64-row tiles) and the plain kernel's
// widths (one warp a row: L <= 32 x 32, L + Dr <= 32 x 36), which PlanMla checks.
inline constexpr int kTensorCoreL = 512, kTensorCoreD = 576, kTensorCoreRows = 64;
inline constexpr int kPlainMaxLPerLane = 32, kPlainMaxDPerLane = 36;

// Byte offsets into the MLA workspace, each 256-byte aligned:
//   workspace_zeroed only: the merge tickets (kMlaMergeCounterBytes, offset 0) |
//   q_cat [T, Hq, D] T | o_lat [T, Hq, L] T | split only: part_o [splits][T * Hq][L] fp32,
//   part_lse [splits][T * Hq] fp32.
struct MlaWorkspace {
  int64_t q_cat = 0, o_lat = 0, part_o = 0, part_lse = 0, total = 0;
  MlaWorkspace(const MlaPlanInput& in, int num_splits) {
    const int64_t rows = in.num_tokens * in.dims.num_heads;
    auto take = [this](int64_t bytes) {
      const int64_t at = total;
      total += (bytes + 255) / 256 * 256;
      return at;
    };
    if (in.workspace_zeroed) take(kMlaMergeCounterBytes);  // counters at offset 0
    q_cat = take(rows * in.dims.LatentDim() * 2);
    o_lat = take(rows * in.dims.kv_lora_rank * 2);
    if (num_splits > 1) {
      part_o = take(num_splits * rows * in.dims.kv_lora_rank * 4);
      part_lse = take(num_splits * rows * 4);
    }
  }
};

// OK iff `cache` is a valid bf16 (T = __nv_bfloat16) or fp16 (T = __half) latent pool of `dims`
// and `layer` is in range, or with `fp8_ok` an FP8 latent pool (mla_fp8_latent.h's format: kFp8E4m3
// codes, token_scales one fp32 scale per row; k_scale / v_scale unused); INVALID_ARGUMENT naming
// `op` otherwise.
template <typename T>
absl::Status CheckLatentPool(const DeviceKvCache& cache, const MlaDims& dims, int64_t layer,
                             const char* op, bool fp8_ok = false) {
  const bool fp8 = fp8_ok && cache.dtype == KvDtype::kFp8E4m3;
  if (fp8) {
    if (absl::Status s = cache.layout.Validate(); !s.ok()) return s;
    if (cache.data == nullptr || cache.token_scales == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": an FP8 latent pool needs data and token_scales"));
    }
    const KvCacheLayout& l = cache.layout;
    const int64_t need = l.BlockElems() + l.BlockElems() / l.head_dim * 4;
    if (cache.latent_block_bytes != 0 &&
        (cache.latent_block_bytes % 4 != 0 || cache.latent_block_bytes < need)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": latent_block_bytes ",
                                                     cache.latent_block_bytes, " (0, or >= ", need,
                                                     " and a multiple of 4)"));
    }
  } else if (absl::Status s = ValidateDeviceKvCache(cache, op); !s.ok()) {
    return s;
  }
  const KvDtype want = fp8                         ? KvDtype::kFp8E4m3
                       : std::is_same_v<T, __half> ? KvDtype::kFp16
                                                   : KvDtype::kBf16;
  const KvCacheLayout& l = cache.layout;
  if (cache.dtype != want || l.num_planes != 1 || l.num_kv_heads != 1 ||
      l.head_dim != dims.LatentDim() || layer < 0 || layer >= l.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": not a ", KvDtypeName(want), " latent cache of width ", dims.LatentDim(), " (dtype ",
        KvDtypeName(cache.dtype), ", planes ", l.num_planes, ", heads ", l.num_kv_heads,
        ", head_dim ", l.head_dim, ") or layer ", layer, " out of range"));
  }
  return absl::OkStatus();
}

// Where block b's codes (bytes) and row scales (floats) of an FP8 latent pool start: planar or
// block-interleaved (DeviceKvCache::latent_block_bytes).
struct Fp8BlockStrides {
  int64_t codes;
  int64_t scales;
};
inline Fp8BlockStrides Fp8Strides(const DeviceKvCache& cache) {
  const int64_t b = cache.latent_block_bytes, elems = cache.layout.BlockElems();
  return b > 0 ? Fp8BlockStrides{b, b / 4} : Fp8BlockStrides{elems, elems / cache.layout.head_dim};
}

// The latent kernels' parameters (mla_decode_cuda.cu, mla_decode_wgmma.cu, mla_decode_tma.cu,
// mla_decode_fp8.cu).
template <typename T>
struct LatentParams {
  const T* q;  // [T, H, D]
  const T* pool;
  int64_t layer_offset;  // TileOffset(0, layer, 0)
  int64_t block_elems;
  int block_size;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int max_blocks;
  int num_seqs;
  int num_tokens;
  int heads;
  int dim;   // D = L + Dr
  int lora;  // L
  float scale_log2;
  int num_splits;  // CTAs per (request, row tile) along the context (SplitChunk)
  int split_min;   // latents a non-last split takes at least (MlaPlan::split_min_latents)
  T* o_lat;        // unsplit: [T, H, L]
  float* lse;
  float* part_o;  // split: [split][T * H][L]
  float* part_lse;
  // An FP8 latent pool (mla_fp8_latent.h): codes in place of `pool`, one scale per row; block b's
  // codes from pool8 + b * code_block_stride, its scales from row_scales + b * scale_block_stride
  // (planar: block_elems and block_elems / dim; block-interleaved: Fp8BlockStrides).
  const uint8_t* pool8;
  const float* row_scales;
  int64_t code_block_stride;
  int64_t scale_block_stride;
  // Decode context parallelism (MlaPlanInput::dcp): the pool holds one latent shard at local
  // indices, seq_lens stay global. Products precomputed (DcpShardValid keeps them in range).
  int dcp_size;  // 1: no DCP
  int dcp_interleave;
  int dcp_cycle;   // interleave * size
  int dcp_offset;  // rank * interleave
  // Non-null (the TMA kernel, MlaPlan::merge_in_kernel): one ticket per (request, row tile) at
  // [request * row_tiles + tile], zero between calls; the last filled split CTA of a group merges
  // the group's partials into o_lat / lse, and a request whose context fills one split writes
  // o_lat / lse directly.
  unsigned int* merge_counters;
  // The TMA kernel (MlaPlanInput::tma_l2_prefetch_tiles): > 0 prefetches the latents of the tile
  // this many tiles past the two stages into L2; 0 off.
  int l2_prefetch_tiles;
  // MlaPlanInput::phase_stamps (null: off; mla_phase_stamps.h's layout).
  unsigned long long* phase_stamps;
};

#ifdef __CUDACC__
// The pool's latents a query sees whose global visibility bound is x (latents at global positions
// < x): x itself without DCP, else the shard's latents before x (dcp_shard.h's DcpLocalCount in
// 32-bit arithmetic). Called outside the kernels' tile loops (a CTA-uniform branch).
template <typename T>
__device__ __forceinline__ int LocalKeyEnd(const LatentParams<T>& p, int x) {
  if (p.dcp_size == 1) return x;
  const int cycles = x / p.dcp_cycle;
  return cycles * p.dcp_interleave +
         min(max(x - cycles * p.dcp_cycle - p.dcp_offset, 0), p.dcp_interleave);
}

// The split rule of every latent kernel: a CTA whose rows see `keys` latents (its request's own
// local key end, not the plan's bound) takes split `split` of num_splits chunks of
// SplitChunk(keys, num_splits, min_chunk) latents, [split * chunk, min((split + 1) * chunk,
// keys)). So the plan's num_splits is a CTA count and a request's real context spreads over as
// many of them as have whole chunks of at least min_chunk latents (a multiple of kSplitAlign = 64:
// tiles of both tensor-core kernels, and of the TMA boxes); the rest have an empty range
// (EmptySplitDone). keys <= 2^30, num_splits <= 2^16.
constexpr int kSplitAlign = 64;
__host__ __device__ __forceinline__ int SplitChunk(int keys, int num_splits, int min_chunk) {
  const int even = ((keys + num_splits - 1) / num_splits + kSplitAlign - 1) / kSplitAlign;
  return max(even * kSplitAlign, min_chunk);
}

// One CTA of the tensor-core latent kernels (grid: splits, row tiles of `rows`, requests): its
// request's query rows [r0, r0 + rows) of rows_seq = q_len x heads, and the latents [kb, ke) of
// its split that any of those rows sees (SplitChunk over the tile's last row's key end: the
// furthest any of its rows sees).
struct LatentCta {
  int q0, q_len, rows_seq, r0, ctx, kb, ke;
  int keys, chunk;       // the tile's last row's key end and the split chunk (SplitChunk)
  const int32_t* table;  // the request's block-table row
  // How far the CTA's row r sees: min(ke, its causal / DCP bound); 0 past rows_seq.
  template <typename T>
  __device__ __forceinline__ int KeyEnd(const LatentParams<T>& p, int r) const {
    return r0 + r < rows_seq ? min(ke, LocalKeyEnd(p, ctx - q_len + (r0 + r) / p.heads + 1)) : 0;
  }
  __device__ __forceinline__ int Tiles(int keys) const {
    return kb < ke ? (ke - kb + keys - 1) / keys : 0;
  }
  // The splits of the group (request, row tile) with latents, [0, Filled()): at least 1 (split 0
  // of a group without latents stores out 0, lse -inf).
  __device__ __forceinline__ int Filled() const { return max(1, (keys + chunk - 1) / chunk); }
};
template <typename T>
__device__ __forceinline__ LatentCta LatentCtaOf(const LatentParams<T>& p, int rows) {
  LatentCta c;
  const int s = blockIdx.z;
  c.q0 = p.qsl[s];
  c.q_len = p.qsl[s + 1] - c.q0;
  c.rows_seq = c.q_len * p.heads;
  c.r0 = blockIdx.y * rows;
  c.ctx = p.seq_lens[s];
  c.table = p.block_tables + static_cast<int64_t>(s) * p.max_blocks;
  const int last_row = min(c.r0 + rows, c.rows_seq) - 1;
  const int keys = LocalKeyEnd(p, c.ctx - c.q_len + last_row / p.heads + 1);
  const int chunk = SplitChunk(keys, p.num_splits, p.split_min);
  c.kb = blockIdx.x * chunk;
  c.ke = min(c.kb + chunk, keys);
  c.keys = keys;
  c.chunk = chunk;
  return c;
}

// The Hopper kernel for latent 512 + 64 (mla_decode_wgmma.cu): grid (splits, row tiles of 64,
// requests), kMlaWgmmaThreads threads. Runs only on a compute capability 9.0 device.
constexpr int kMlaWgmmaThreads = 256;
template <typename T>
absl::Status LaunchMlaWgmma(const LatentParams<T>& p, dim3 grid, cudaStream_t stream);
// True when the current device is compute capability 9.0 (sm_90a code runs).
absl::StatusOr<bool> DeviceIsSm90();
// The TMA variant (mla_decode_tma.cu): same grid, threads and results as LaunchMlaWgmma, the
// latents loaded by TMA from `cache` (layer `layer`). Only where MlaTmaFits(cache): pages of 8,
// 16, 32 or a multiple of 64 latents, < 2^31 pool rows.
bool MlaTmaFits(const DeviceKvCache& cache);
// hand_off: MlaTmaSchedule::kHandOff, else kSerial.
template <typename T>
absl::Status LaunchMlaTma(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                          dim3 grid, bool hand_off, cudaStream_t stream);
// MlaTmaSchedule::kSeesaw (mla_decode_seesaw.cu): LaunchMlaTma's grid, threads, loading and
// results, the two warpgroups scoring alternate tiles. Same MlaTmaFits condition.
template <typename T>
absl::Status LaunchMlaSeesaw(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                             dim3 grid, cudaStream_t stream);

// MlaTmaSchedule::kRows16 (mla_decode_rows16.cu): LaunchMlaTma's grid, loading (MlaTmaFits),
// results and in-kernel merge for row tiles of <= 16 rows (the plan's rows), mma.sync, 256 threads.
// prewait: MlaPlanInput::prewait (a PDL launch, the prologue before griddepcontrol.wait).
// cluster: MlaPlan::cluster_merge (grid.x CTAs a cluster, the splits merged through DSMEM).
template <typename T>
absl::Status LaunchMlaRows16(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                             dim3 grid, bool prewait, bool cluster, cudaStream_t stream);
// How many clusters of `cluster_size` kRows16 CTAs (its cluster-merge instantiation, its shared
// memory) the current device runs at once (cudaOccupancyMaxActiveClusters); 0 on any error (no
// device, not sm_90, a size it cannot place).
int MlaRows16MaxActiveClusters(int cluster_size);

// kRows16 over an FP8 latent pool (mla_decode_rows16_fp8.cu): LaunchMlaRows16's grid, plan,
// workspace, merges and results, the codes read by TMA (a 3-D tensor map over the blocks) and
// multiplied on the fp16 tensor cores. Only where MlaRows16Fp8Fits: MlaTmaFits, pages of >= 8
// latents, codes and scales 16-byte aligned block by block, < 2^31 pool rows.
template <typename T>
bool MlaRows16Fp8Fits(const LatentParams<T>& p, const DeviceKvCache& cache);
template <typename T>
absl::Status LaunchMlaRows16Fp8(const LatentParams<T>& p, const DeviceKvCache& cache, int64_t layer,
                                dim3 grid, bool prewait, bool cluster, cudaStream_t stream);

// The decode-sized W_UK / W_UV GEMVs (mla_absorb_gemv_cuda.cu; MlaAbsorbOptions). They apply
// to steps of <= max_tokens tokens with L % 8 == 0, Dn <= 256 and 16-byte aligned operands (`a`:
// q_cat or o_lat, `w`: kv_b_proj); pdl: a programmatic dependent launch, the first weight loads
// before griddepcontrol.wait.
bool AbsorbGemvApplies(const MlaDims& dims, int64_t num_tokens, int64_t max_tokens, const void* a,
                       const void* w);
template <typename T>
absl::Status AbsorbQueryGemv(const T* q, const T* kv_b, const MlaDims& dims, int64_t num_tokens,
                             T* q_cat, bool pdl, cudaStream_t stream);
template <typename T>
absl::Status UnabsorbOutputGemv(const T* o_lat, const T* kv_b, const MlaDims& dims,
                                int64_t num_tokens, T* out, bool pdl, cudaStream_t stream);

// The FP8 variant (mla_decode_fp8.cu): same grid, threads and results as LaunchMlaWgmma, over an
// FP8 latent pool (p.pool8 / p.row_scales), dequantized into bf16 / fp16 tiles in shared memory.
// Only where MlaFp8TileFits: codes 16-byte aligned, block by block.
template <typename T>
bool MlaFp8TileFits(const LatentParams<T>& p) {
  return reinterpret_cast<uintptr_t>(p.pool8) % 16 == 0 && p.code_block_stride % 16 == 0 &&
         p.layer_offset % 16 == 0;
}
template <typename T>
absl::Status LaunchMlaFp8(const LatentParams<T>& p, dim3 grid, cudaStream_t stream);

// PTX wrappers shared with kernels/cuda (device_utils.cuh).
using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::LdMatrixX4;
using internal::LdMatrixX4Trans;
using internal::Mma16816;
using internal::SmemAddr;

// 16-byte global -> shared copy; zero-fills the destination when !pred (src not read).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(pred ? 16 : 0));
}

// dst[0..1] = (a, b) rounded to T, one 4-byte store.
template <typename T>
__device__ __forceinline__ void StoreTwo(T* dst, float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
  } else {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
  }
}

// The pool row of latent `key` of the request whose block-table row is `table`.
template <typename T>
__device__ __forceinline__ const T* LatentRow(const LatentParams<T>& p, const int32_t* table,
                                              int key) {
  const int64_t block = table[key / p.block_size];
  return p.pool + block * p.block_elems + p.layer_offset +
         static_cast<int64_t>(key % p.block_size) * p.dim;
}

// Stores one finished row: the final o_lat / lse (direct), or this split's fp32 partial.
template <typename T>
__device__ __forceinline__ void StorePair(const LatentParams<T>& p, int split, int64_t row, int col,
                                          float a, float b, bool direct) {
  if (direct) {
    StoreTwo(p.o_lat + row * p.lora + col, a, b);
  } else {
    float2* o = reinterpret_cast<float2*>(
        p.part_o + (static_cast<int64_t>(split) * p.num_tokens * p.heads + row) * p.lora + col);
    *o = make_float2(a, b);
  }
}
template <typename T>
__device__ __forceinline__ void StorePair(const LatentParams<T>& p, int split, int64_t row, int col,
                                          float a, float b) {
  StorePair(p, split, row, col, a, b, p.num_splits == 1);
}

template <typename T>
__device__ __forceinline__ void StoreLse(const LatentParams<T>& p, int split, int64_t row,
                                         float lse, bool direct) {
  if (direct) {
    if (p.lse != nullptr) p.lse[row] = lse;
  } else {
    p.part_lse[static_cast<int64_t>(split) * p.num_tokens * p.heads + row] = lse;
  }
}
template <typename T>
__device__ __forceinline__ void StoreLse(const LatentParams<T>& p, int split, int64_t row,
                                         float lse) {
  StoreLse(p, split, row, lse, p.num_splits == 1);
}

// A split CTA with no latents in its range (its request's context ends before its chunk): the
// rows' partial LSE -inf and nothing else, true (the kernel returns before loading anything).
// MergeAttnStatesN treats a partial with a non-finite LSE as empty and never reads its out, so
// the out rows are left unwritten (neither garbage nor 0 * NaN can reach a result). Unsplit, or
// with latents: false (an unsplit CTA without latents runs on and stores out 0, lse -inf).
// CTA-uniform: call before the first barrier.
template <typename T>
__device__ __forceinline__ bool EmptySplitDone(const LatentParams<T>& p, const LatentCta& c,
                                               int rows) {
  if (p.num_splits == 1 || c.kb < c.ke) return false;
  const int n = min(rows, c.rows_seq - c.r0);
  for (int r = threadIdx.x; r < n; r += blockDim.x) {
    StoreLse(p, blockIdx.x, static_cast<int64_t>(c.q0) * p.heads + c.r0 + r, -INFINITY);
  }
  return true;
}

// Sums each of a thread's two row values over the quad of lanes sharing the rows (the m16n8
// accumulator layout of the tensor-core kernels).
__device__ __forceinline__ void QuadSum2(float (&v)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
    v[h] += __shfl_xor_sync(0xffffffffu, v[h], 2);
  }
}

// Online softmax's state update for a thread's two rows of an m16n8 accumulator tile (the mma.sync
// and wgmma decode kernels): mx, the rows' maxima over this thread's scores, is reduced over the
// quad of lanes sharing the rows; the running maxima m_run and sums l_run are rescaled by alpha =
// exp2(m_run_old - m_use), and m_use (the new max, 0 where every score so far is masked) is the
// base the tile's exponents take.
__device__ __forceinline__ void UpdateRunningMax2(float (&mx)[2], float (&m_run)[2],
                                                  float (&l_run)[2], float (&alpha)[2],
                                                  float (&m_use)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m_run[h], mx[h]);
    // All scores so far masked: keep the exponent base finite (exp2(-inf - 0) = 0).
    m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = exp2f(m_run[h] - m_use[h]);
    m_run[h] = m_new;
    l_run[h] *= alpha[h];
  }
}
#endif  // __CUDACC__

}  // namespace tandem::kernels::cuda::mla_internal

#endif  // TANDEM_KERNELS_MLA_MLA_CUDA_INTERNAL_CUH_
