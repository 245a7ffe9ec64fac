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

// n bytes, src and dst aligned to sizeof(V), n a multiple of sizeof(V); `lane` of `kLanes`
// threads that copy them together.
template <bool kStreaming, int kLanes, typename V>
__device__ __forceinline__ void CopyVectors(const char* __restrict__ src, char* __restrict__ dst,
                                            uint64_t n, uint32_t lane) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  const uint64_t count = n / sizeof(V);
  uint64_t i = lane;
  for (; i + (kUnroll - 1) * kLanes < count; i += kUnroll * kLanes) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = Load<kStreaming>(s + i + u * kLanes);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Store<kStreaming>(d + i + u * kLanes, v[u]);
  }
  for (; i < count; i += kLanes) Store<kStreaming>(d + i, Load<kStreaming>(s + i));
}

// n bytes from src to dst by kLanes threads (`lane` is this one's index among them).
template <bool kStreaming, int kLanes>
__device__ void CopyBytes(const char* __restrict__ src, char* __restrict__ dst, uint64_t n,
                          uint32_t lane) {
  using Byte = unsigned char;
  const Byte* s = reinterpret_cast<const Byte*>(src);
  Byte* d = reinterpret_cast<Byte*>(dst);
  const uint64_t s_addr = reinterpret_cast<uintptr_t>(src);
  const uint64_t skew = s_addr ^ reinterpret_cast<uintptr_t>(dst);
  // The widest vector both sides can be aligned to at once.
  const uint64_t width = (skew & 15) == 0 ? 16 : (skew & 7) == 0 ? 8 : (skew & 3) == 0 ? 4 : 1;
  const uint64_t head = min(n, (width - (s_addr & (width - 1))) & (width - 1));
  const uint64_t body = (n - head) / width * width;
  for (uint64_t i = lane; i < head; i += kLanes) Store<kStreaming>(d + i, Load<kStreaming>(s + i));
  src += head;
  dst += head;
  switch (width) {
    case 16:
      CopyVectors<kStreaming, kLanes, uint4>(src, dst, body, lane);
      break;
    case 8:
      CopyVectors<kStreaming, kLanes, uint2>(src, dst, body, lane);
      break;
    case 4:
      CopyVectors<kStreaming, kLanes, unsigned int>(src, dst, body, lane);
      break;
    default:
      CopyVectors<kStreaming, kLanes, Byte>(src, dst, body, lane);
      break;
  }
  for (uint64_t i = head + body + lane; i < n; i += kLanes) {
    Store<kStreaming>(d + i, Load<kStreaming>(s + i));
  }
}

constexpr int kWarps = kCopyThreads / 32;

// A tile of rows whose rows, starts and pitches are all multiples of 16 bytes (KV head slices
// always are): the CTA copies it as one flat list of 16-byte vectors, kUnroll loads in flight
// per thread across row boundaries, so short rows (256 B - 1 KiB) keep as many loads in flight
// as long ones. `vectors` = rows * row_vectors < 2^32.
template <bool kStreaming>
__device__ __forceinline__ void CopyAlignedRows(const nccl_plan::CopyTile& tile) {
  const uint32_t row_vectors = static_cast<uint32_t>(tile.bytes / 16);
  const uint32_t vectors = static_cast<uint32_t>(tile.rows) * row_vectors;
  const char* src = reinterpret_cast<const char*>(tile.src);
  char* dst = reinterpret_cast<char*>(tile.dst);
  auto src_at = [&](uint32_t i) {
    return reinterpret_cast<const uint4*>(src + (i / row_vectors) * tile.src_pitch) +
           i % row_vectors;
  };
  auto dst_at = [&](uint32_t i) {
    return reinterpret_cast<uint4*>(dst + (i / row_vectors) * tile.dst_pitch) + i % row_vectors;
  };
  uint32_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kCopyThreads < vectors; i += kUnroll * kCopyThreads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = Load<kStreaming>(src_at(i + u * kCopyThreads));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Store<kStreaming>(dst_at(i + u * kCopyThreads), v[u]);
  }
  for (; i < vectors; i += kCopyThreads) Store<kStreaming>(dst_at(i), Load<kStreaming>(src_at(i)));
}

// One tile per CTA at a time: a one-row tile by the whole CTA; a tile of rows (a head slice of
// KV blocks) as one flat vector list when everything is 16-byte aligned, else one row per warp.
template <bool kStreaming>
__global__ void __launch_bounds__(kCopyThreads)
    CopyTilesKernel(const nccl_plan::CopyTile* __restrict__ tiles, uint32_t num_tiles) {
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t lane = threadIdx.x % 32;
  for (uint32_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const nccl_plan::CopyTile tile = tiles[t];
    const char* src = reinterpret_cast<const char*>(tile.src);
    char* dst = reinterpret_cast<char*>(tile.dst);
    if (tile.rows <= 1) {
      CopyBytes<kStreaming, kCopyThreads>(src, dst, tile.bytes, threadIdx.x);
      continue;
    }
    const bool aligned =
        ((tile.src | tile.dst | tile.bytes | tile.src_pitch | tile.dst_pitch) & 15) == 0;
    if (aligned && tile.rows * (tile.bytes / 16) < (uint64_t{1} << 32)) {
      CopyAlignedRows<kStreaming>(tile);
      continue;
    }
    for (uint64_t r = warp; r < tile.rows; r += kWarps) {
      CopyBytes<kStreaming, 32>(src + r * tile.src_pitch, dst + r * tile.dst_pitch, tile.bytes,
                                lane);
    }
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
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (uint32_t i = 0; i < num_tiles; ++i) {
    const nccl_plan::CopyTile& t = tiles[i];
    if (t.rows > 1) {  // one 2D DMA per tile of rows
      const cudaError_t e = cudaMemcpy2DAsync(reinterpret_cast<void*>(t.dst), t.dst_pitch,
                                              reinterpret_cast<const void*>(t.src), t.src_pitch,
                                              t.bytes, t.rows, cudaMemcpyDeviceToDevice, stream);
      if (e != cudaSuccess) return e;
      continue;
    }
    dsts.push_back(reinterpret_cast<void*>(t.dst));
    srcs.push_back(reinterpret_cast<const void*>(t.src));
    sizes.push_back(t.bytes);
  }
  if (dsts.empty()) return cudaSuccess;
  cudaMemcpyAttributes attrs = {};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;  // copy engines, not an SM kernel
  size_t attrs_index = 0;
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs,
                              &attrs_index, 1, stream);
}

}  // namespace tandem::kvtransfer::nccl_copy
