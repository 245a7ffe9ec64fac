#include "kernels/mla/mla_fp8_latent.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cpu {

float QuantizeLatentRowFp8(const float* x, int64_t n, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  for (int64_t i = 0; i < n; ++i) codes[i] = FloatToFp8E4m3(x[i] / scale);
  return scale;
}

void DequantizeLatentRowFp8(const uint8_t* codes, float scale, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Fp8E4m3ToFloat(codes[i]) * scale;
}

absl::Status WriteLatentCacheFp8(const float* latent, const int64_t* slot_mapping,
                                 int64_t num_tokens, int64_t layer, Fp8LatentCacheView cache) {
  const KvCacheLayout& l = cache.layout;
  if (cache.codes == nullptr || cache.scales == nullptr || l.num_planes != 1 ||
      l.num_kv_heads != 1 || layer < 0 || layer >= l.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteLatentCacheFp8: not an FP8 latent cache (planes ", l.num_planes,
                     ", heads ", l.num_kv_heads, ") or layer ", layer, " out of range"));
  }
  const int64_t width = l.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    if (slot >= l.NumSlots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteLatentCacheFp8: slot ", slot, " outside [0, ", l.NumSlots(), ")"));
    }
    const int64_t e = l.TileOffset(slot / l.block_size, layer, 0) + (slot % l.block_size) * width;
    cache.scales[e / width] = QuantizeLatentRowFp8(latent + t * width, width, cache.codes + e);
  }
  return absl::OkStatus();
}

void DequantizeLatentCacheFp8(const Fp8LatentCacheView& cache, std::vector<float>* out) {
  const int64_t width = cache.layout.head_dim, rows = cache.layout.TotalElems() / width;
  out->resize(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeLatentRowFp8(cache.codes + r * width, cache.scales[r], width,
                           out->data() + r * width);
  }
}

absl::Status MlaPagedAttentionFp8(const float* q, const float* kv_b_proj, const MlaDims& dims,
                                  const Fp8LatentCacheView& cache, int64_t layer,
                                  const AttentionBatch& batch, float scale, MlaMode mode,
                                  float* out, float* lse, ThreadPool* pool, DcpShard dcp) {
  if (cache.codes == nullptr || cache.scales == nullptr) {
    return absl::InvalidArgumentError("MlaPagedAttentionFp8: null codes or scales");
  }
  std::vector<float> pool_f32;
  DequantizeLatentCacheFp8(cache, &pool_f32);
  return MlaPagedAttention(q, kv_b_proj, dims, KvCacheView{pool_f32.data(), cache.layout}, layer,
                           batch, scale, mode, out, lse, pool, dcp);
}

}  // namespace tandem::kernels::cpu
