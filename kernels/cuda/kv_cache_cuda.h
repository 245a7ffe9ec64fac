// Device-side view of the paged KV pool (kernels/attention/kv_cache_layout.h) for the CUDA
// kernels: same block-major layout [num_blocks][num_layers][2][block_size][num_kv_heads][head_dim],
// with the element type chosen at run time.
//
// Thread safety: plain values; views do not synchronize access to the pool they point at.
#ifndef TANDEM_KERNELS_CUDA_KV_CACHE_CUDA_H_
#define TANDEM_KERNELS_CUDA_KV_CACHE_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/kv_cache_layout.h"

namespace tandem::kernels::cuda {

// Element type of the pool. kFp8E4m3 stores round(x / scale) saturated to +-448 and reads back
// stored * scale, the scale per tensor or per kv head (DeviceKvCache::k_scale / v_scale).
enum class KvDtype { kBf16, kFp16, kFp8E4m3 };

int64_t KvDtypeBytes(KvDtype dtype);
const char* KvDtypeName(KvDtype dtype);

// Non-owning view of a device pool of layout.TotalElems() elements of `dtype`.
struct DeviceKvCache {
  void* data = nullptr;  // device, 16-byte aligned
  KvCacheLayout layout;
  KvDtype dtype = KvDtype::kBf16;
  // fp8 only (ignored otherwise): device fp32 dequantization scales, [num_kv_heads] when
  // per_head_scale, else [1]. Must be finite and > 0.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  bool per_head_scale = false;
};

// OK iff the layout is valid, data is non-null and 16-byte aligned, head_dim * element size is a
// multiple of 16 bytes, and fp8 pools have both scales. INVALID_ARGUMENT naming `op` otherwise.
absl::Status ValidateDeviceKvCache(const DeviceKvCache& cache, const char* op);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_CUDA_KV_CACHE_CUDA_H_
