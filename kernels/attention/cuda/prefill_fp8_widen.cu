// The fp8 pool widened for the wgmma prefill kernel (prefill_fp8_widen.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/attention/cuda/prefill_fp8_widen.h"
#include "kernels/cuda/device_utils.cuh"

namespace tandem::kernels::cuda::internal::prefill {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct WidenParams {
  const uint8_t* pool;  // fp8 codes
  int64_t block_elems;  // codes of one block (every layer, K and V)
  int64_t layer_off;    // TileOffset(0, layer, 0)
  int64_t tile_elems;   // block_size * num_kv_heads * head_dim
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int64_t src_stride;  // batch.max_blocks_per_seq
  int num_seqs;
  int block_size;
  int row_elems;  // num_kv_heads * head_dim
  int head_dim;
  int num_kv_heads;
  const float* k_scale;
  const float* v_scale;
  bool per_head;
  int32_t* table;  // [num_seqs][dst_stride]
  int64_t dst_stride;
};

using ::tandem::kernels::cuda::internal::FromFloat;

// CTA (s, y): request s's blocks y, y + gridDim.y, ... Every CTA of s computes s's offset.
template <typename T>
__global__ void __launch_bounds__(kThreads) WidenKernel(WidenParams p, T* out) {
  __shared__ int offset;
  const int s = blockIdx.x;
  if (threadIdx.x == 0) offset = 0;
  __syncthreads();
  int mine = 0;
  for (int i = threadIdx.x; i < s; i += kThreads) {
    mine += (p.seq_lens[i] + p.block_size - 1) / p.block_size;
  }
  if (mine != 0) atomicAdd(&offset, mine);
  __syncthreads();
  const int seq_len = p.seq_lens[s];
  const int blocks = (seq_len + p.block_size - 1) / p.block_size;
  const int64_t vecs = p.tile_elems / 8;  // 8 codes each; row_elems is a multiple of 64
  for (int j = blockIdx.y; j < blocks; j += gridDim.y) {
    const int64_t dst_block = offset + j;
    if (threadIdx.x == 0) p.table[s * p.dst_stride + j] = static_cast<int32_t>(dst_block);
    const int64_t src_block = p.block_tables[s * p.src_stride + j];
    const int valid_rows = min(p.block_size, seq_len - j * p.block_size);
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* src = p.pool + src_block * p.block_elems + p.layer_off + kv * p.tile_elems;
      T* dst = out + (dst_block * 2 + kv) * p.tile_elems;
      const float* scale = kv == 0 ? p.k_scale : p.v_scale;
      const float tensor_scale = scale[0];
      for (int64_t v = threadIdx.x; v < vecs; v += kThreads) {
        const int64_t e = v * 8;
        const int row = static_cast<int>(e / p.row_elems);
        alignas(16) T w[8];
        if (row < valid_rows) {
          const float sc = p.per_head ? scale[(e % p.row_elems) / p.head_dim] : tensor_scale;
          const uint2 codes = *reinterpret_cast<const uint2*>(src + e);
          const uint32_t words[2] = {codes.x, codes.y};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const __nv_fp8x2_storage_t pair =
                static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
            const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
            w[2 * i] = FromFloat<T>(f.x * sc);
            w[2 * i + 1] = FromFloat<T>(f.y * sc);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) w[i] = FromFloat<T>(0.0f);
        }
        *reinterpret_cast<uint4*>(dst + e) = *reinterpret_cast<const uint4*>(w);
      }
    }
  }
}

}  // namespace

int64_t Fp8WidenBytes(const KvCacheLayout& layout, int64_t total_blocks, int64_t num_seqs,
                      int64_t table_stride) {
  return AlignUp(total_blocks * 2 * layout.TileElems() * 2) + AlignUp(num_seqs * table_stride * 4);
}

template <typename T>
absl::Status WidenFp8Pool(const DeviceKvCache& cache, int64_t layer, const AttentionBatch& batch,
                          int64_t total_blocks, int64_t table_stride, void* workspace,
                          DeviceKvCache* widened, AttentionBatch* widened_batch,
                          cudaStream_t stream) {
  const KvCacheLayout& layout = cache.layout;
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    return absl::InvalidArgumentError(
        "cuda::PagedPrefillAttention: an fp8 pool on the wgmma kernel needs the plan's "
        "workspace (256-byte aligned)");
  }
  if ((layout.num_kv_heads * layout.head_dim) % 64 != 0 || total_blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("cuda::PagedPrefillAttention: cannot widen ",
                                                   total_blocks, " blocks of kv rows ",
                                                   layout.num_kv_heads, " x ", layout.head_dim));
  }
  auto* pool = static_cast<T*>(workspace);
  auto* table = reinterpret_cast<int32_t*>(static_cast<char*>(workspace) +
                                           AlignUp(total_blocks * 2 * layout.TileElems() * 2));
  WidenParams p{};
  p.pool = static_cast<const uint8_t*>(cache.data);
  p.block_elems = layout.BlockElems();
  p.layer_off = layout.TileOffset(0, layer, 0);
  p.tile_elems = layout.TileElems();
  p.seq_lens = batch.seq_lens;
  p.block_tables = batch.block_tables;
  p.src_stride = batch.max_blocks_per_seq;
  p.num_seqs = static_cast<int>(batch.num_seqs);
  p.block_size = static_cast<int>(layout.block_size);
  p.row_elems = static_cast<int>(layout.num_kv_heads * layout.head_dim);
  p.head_dim = static_cast<int>(layout.head_dim);
  p.num_kv_heads = static_cast<int>(layout.num_kv_heads);
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  p.per_head = cache.per_head_scale;
  p.table = table;
  p.dst_stride = table_stride;
  // About four CTAs an SM of a 132-SM part in all, at most one a block.
  const int64_t y =
      std::clamp<int64_t>((528 + batch.num_seqs - 1) / std::max<int64_t>(1, batch.num_seqs), 1,
                          std::clamp<int64_t>(table_stride, 1, 65535));
  const dim3 grid(static_cast<unsigned>(batch.num_seqs), static_cast<unsigned>(y));
  WidenKernel<T><<<grid, kThreads, 0, stream>>>(p, pool);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());

  *widened = DeviceKvCache{};
  widened->data = pool;
  widened->layout = KvCacheLayout{.num_blocks = std::max<int64_t>(1, total_blocks),
                                  .num_layers = 1,
                                  .block_size = layout.block_size,
                                  .num_kv_heads = layout.num_kv_heads,
                                  .head_dim = layout.head_dim,
                                  .num_planes = 2};
  widened->dtype = std::is_same_v<T, __half> ? KvDtype::kFp16 : KvDtype::kBf16;
  *widened_batch = batch;
  widened_batch->block_tables = table;
  widened_batch->max_blocks_per_seq = table_stride;
  return absl::OkStatus();
}

template absl::Status WidenFp8Pool<__nv_bfloat16>(const DeviceKvCache&, int64_t,
                                                  const AttentionBatch&, int64_t, int64_t, void*,
                                                  DeviceKvCache*, AttentionBatch*, cudaStream_t);
template absl::Status WidenFp8Pool<__half>(const DeviceKvCache&, int64_t, const AttentionBatch&,
                                           int64_t, int64_t, void*, DeviceKvCache*, AttentionBatch*,
                                           cudaStream_t);

}  // namespace tandem::kernels::cuda::internal::prefill
