#include <algorithm>
#include <vector>

#include "kvtransfer/nccl/nccl_agent_copy.h"

namespace tandem::kvtransfer::nccl_copy {
namespace {

// Loads in flight per thread before the stores: enough bytes in flight per SM to cover HBM
// latency with only a fraction of the SMs.
constexpr int kUnroll = 4;

template <bool kStreaming, typename V>
__device__ __forceinline__ V Load(const V* p) {
  if constexpr (kStreaming) {
    return __ldcs(p);
  } else {
    return *p;
  }
}

template <bool kStreaming, typename V>
__device__ __forceinline__ void Store(V* p, V v) {
  if constexpr (kStreaming) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

// n bytes, src and dst aligned to sizeof(V), n a multiple of sizeof(V).
template <bool kStreaming, typename V>
__device__ __forceinline__ void CopyVectors(const char* __restrict__ src, char* __restrict__ dst,
                                            uint64_t n) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  const uint64_t count = n / sizeof(V);
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kCopyThreads < count; i += kUnroll * kCopyThreads) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = Load<kStreaming>(s + i + u * kCopyThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Store<kStreaming>(d + i + u * kCopyThreads, v[u]);
  }
  for (; i < count; i += kCopyThreads) Store<kStreaming>(d + i, Load<kStreaming>(s + i));
}

template <bool kStreaming>
__device__ void CopyTileBytes(const char* __restrict__ src, char* __restrict__ dst, uint64_t n) {
  using Byte = unsigned char;
  const Byte* s = reinterpret_cast<const Byte*>(src);
  Byte* d = reinterpret_cast<Byte*>(dst);
  const uint64_t s_addr = reinterpret_cast<uintptr_t>(src);
  const uint64_t skew = s_addr ^ reinterpret_cast<uintptr_t>(dst);
  // The widest vector both sides can be aligned to at once.
  const uint64_t width = (skew & 15) == 0 ? 16 : (skew & 7) == 0 ? 8 : (skew & 3) == 0 ? 4 : 1;
  const uint64_t head = min(n, (width - (s_addr & (width - 1))) & (width - 1));
  const uint64_t body = (n - head) / width * width;
  for (uint64_t i = threadIdx.x; i < head; i += kCopyThreads) {
    Store<kStreaming>(d + i, Load<kStreaming>(s + i));
  }
  src += head;
  dst += head;
  switch (width) {
    case 16:
      CopyVectors<kStreaming, uint4>(src, dst, body);
      break;
    case 8:
      CopyVectors<kStreaming, uint2>(src, dst, body);
      break;
    case 4:
      CopyVectors<kStreaming, unsigned int>(src, dst, body);
      break;
    default:
      CopyVectors<kStreaming, Byte>(src, dst, body);
      break;
  }
  for (uint64_t i = head + body + threadIdx.x; i < n; i += kCopyThreads) {
    Store<kStreaming>(d + i, Load<kStreaming>(s + i));
  }
}

template <bool kStreaming>
__global__ void __launch_bounds__(kCopyThreads)
    CopyTilesKernel(const nccl_plan::CopyTile* __restrict__ tiles, uint32_t num_tiles) {
  for (uint32_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const nccl_plan::CopyTile tile = tiles[t];
    CopyTileBytes<kStreaming>(reinterpret_cast<const char*>(tile.src),
                              reinterpret_cast<char*>(tile.dst), tile.bytes);
  }
}

}  // namespace

cudaError_t LaunchCopyTiles(const nccl_plan::CopyTile* tiles, uint32_t num_tiles, int max_ctas,
                            bool streaming, cudaStream_t stream) {
  if (max_ctas < 1) return cudaErrorInvalidValue;
  if (num_tiles == 0) return cudaSuccess;
  const uint32_t grid = std::min<uint32_t>(num_tiles, static_cast<uint32_t>(max_ctas));
  if (streaming) {
    CopyTilesKernel<true><<<grid, kCopyThreads, 0, stream>>>(tiles, num_tiles);
  } else {
    CopyTilesKernel<false><<<grid, kCopyThreads, 0, stream>>>(tiles, num_tiles);
  }
  return cudaGetLastError();
}

cudaError_t CopyTilesWithEngines(const nccl_plan::CopyTile* tiles, uint32_t num_tiles,
                                 cudaStream_t stream) {
  if (num_tiles == 0) return cudaSuccess;
  std::vector<void*> dsts(num_tiles);
  std::vector<const void*> srcs(num_tiles);
  std::vector<size_t> sizes(num_tiles);
  for (uint32_t i = 0; i < num_tiles; ++i) {
    dsts[i] = reinterpret_cast<void*>(tiles[i].dst);
    srcs[i] = reinterpret_cast<const void*>(tiles[i].src);
    sizes[i] = tiles[i].bytes;
  }
  cudaMemcpyAttributes attrs = {};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;  // copy engines, not an SM kernel
  size_t attrs_index = 0;
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), num_tiles, &attrs,
                              &attrs_index, 1, stream);
}

}  // namespace tandem::kvtransfer::nccl_copy
