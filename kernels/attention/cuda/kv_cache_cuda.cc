#include "kernels/attention/cuda/kv_cache_cuda.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::kernels::cuda {

int64_t KvDtypeBytes(KvDtype dtype) {
  return dtype == KvDtype::kFp8E4m3 || dtype == KvDtype::kInt8 ? 1 : 2;
}

const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
    case KvDtype::kInt8:
      return "int8";
  }
  return "unknown";
}

int64_t KvScaleBlockElems(const KvCacheLayout& layout) {
  return layout.num_layers * 2 * layout.block_size * layout.num_kv_heads;
}

int64_t KvScaleBlockBytes(const KvCacheLayout& layout) {
  return KvScaleBlockElems(layout) * int64_t{sizeof(float)};
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
  if (cache.dtype == KvDtype::kInt8 &&
      (cache.token_scales == nullptr || reinterpret_cast<uintptr_t>(cache.token_scales) % 16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": int8 cache needs 16-byte aligned token_scales"));
  }
  return absl::OkStatus();
}

float Int8QuantizeRow(const float* x, int64_t n, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!finite || amax == 0.0f) {
    std::fill(q, q + n, int8_t{0});
    return finite ? 1.0f : std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = amax / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    // nearbyint rounds half to even in the default rounding mode, like __float2int_rn.
    const float r = std::nearbyint(x[i] / scale);
    q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return scale;
}

namespace {

template <typename... Args>
absl::Status InvalidIn(const char* op, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", args...));
}

}  // namespace

absl::Status ValidateAttentionGeometry(const char* op, const DeviceKvCache& cache, int64_t layer,
                                       const AttentionBatch& batch, int64_t plan_kv_heads,
                                       int64_t plan_head_dim, KvDtype plan_kv_dtype,
                                       int64_t plan_num_seqs) {
  const KvCacheLayout& layout = cache.layout;
  if (layer < 0 || layer >= layout.num_layers) {
    return InvalidIn(op, "layer ", layer, " out of range [0, ", layout.num_layers, ")");
  }
  if (layout.num_kv_heads != plan_kv_heads || layout.head_dim != plan_head_dim ||
      cache.dtype != plan_kv_dtype || batch.num_seqs != plan_num_seqs) {
    return InvalidIn(op, "plan (kv_heads ", plan_kv_heads, ", head_dim ", plan_head_dim, ", ",
                     KvDtypeName(plan_kv_dtype), ", num_seqs ", plan_num_seqs,
                     ") does not match the cache/batch (kv_heads ", layout.num_kv_heads,
                     ", head_dim ", layout.head_dim, ", ", KvDtypeName(cache.dtype), ", num_seqs ",
                     batch.num_seqs, ")");
  }
  return absl::OkStatus();
}

absl::Status ValidateAttentionParams(const char* op, const AttentionParams& params) {
  if (!std::isfinite(params.scale) || params.scale <= 0) {
    return InvalidIn(op, "scale must be finite and > 0, got ", params.scale);
  }
  if (!std::isfinite(params.softcap) || params.softcap < 0) {
    return InvalidIn(op, "softcap must be finite and >= 0 (0 = off), got ", params.softcap);
  }
  if (params.window_left < -1 || params.window_left > (int64_t{1} << 30)) {
    return InvalidIn(op, "window_left must be in [-1, 2^30], got ", params.window_left);
  }
  if (!DcpShardValid(params.Dcp())) {
    return InvalidIn(op, "dcp shard (size ", params.dcp_size, ", rank ", params.dcp_rank,
                     ", interleave ", params.dcp_interleave,
                     ") invalid: need size >= 1, 0 <= rank < size, interleave >= 1, "
                     "size * interleave <= 2^30");
  }
  return absl::OkStatus();
}

absl::Status ValidateAttentionPointers(const char* op, const void* q, const void* out,
                                       const AttentionBatch& batch) {
  if (q == nullptr || out == nullptr || batch.query_start_loc == nullptr ||
      batch.seq_lens == nullptr || batch.block_tables == nullptr) {
    return InvalidIn(op, "q, out and the batch's device arrays must be non-null");
  }
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return InvalidIn(op, "q and out must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
