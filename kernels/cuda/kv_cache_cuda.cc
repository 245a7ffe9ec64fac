#include "kernels/cuda/kv_cache_cuda.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::kernels::cuda {

int64_t KvDtypeBytes(KvDtype dtype) { return dtype == KvDtype::kFp8E4m3 ? 1 : 2; }

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "unknown";
}

absl::Status ValidateDeviceKvCache(const DeviceKvCache& cache, const char* op) {
  RETURN_IF_ERROR(cache.layout.Validate());
  if (cache.data == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache.data is null"));
  if (reinterpret_cast<uintptr_t>(cache.data) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache.data is not 16-byte aligned"));
  }
  const int64_t row_bytes = cache.layout.head_dim * KvDtypeBytes(cache.dtype);
  if (row_bytes % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": head_dim ", cache.layout.head_dim, " x ",
                                                   KvDtypeBytes(cache.dtype),
                                                   " bytes is not a multiple of 16 bytes"));
  }
  if (cache.dtype == KvDtype::kFp8E4m3 && (cache.k_scale == nullptr || cache.v_scale == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": fp8 cache needs k_scale and v_scale"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
