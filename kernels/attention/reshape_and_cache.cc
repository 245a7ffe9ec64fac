#include "kernels/attention/reshape_and_cache.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cpu {

namespace {

// The checks both writers share: nothing is written unless they pass.
absl::Status ValidateWrite(const KvCacheLayout& layout, const void* data, const float* k,
                           const float* v, const int64_t* slot_mapping, int64_t num_tokens,
                           int64_t layer) {
  RETURN_IF_ERROR(layout.Validate());
  if (data == nullptr) return absl::InvalidArgumentError("ReshapeAndCache: cache.data is null");
  if (layer < 0 || layer >= layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("ReshapeAndCache: layer ", layer,
                                                   " out of range [0, ", layout.num_layers, ")"));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReshapeAndCache: num_tokens must be >= 0, got ", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (k == nullptr || v == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("ReshapeAndCache: k, v and slot_mapping must be non-null");
  }
  // Check every slot before writing any, so a bad batch leaves the pool untouched.
  const int64_t num_slots = layout.NumSlots();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < -1 || slot >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("ReshapeAndCache: slot_mapping[", t, "] = ",
                                                     slot, " out of range [-1, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

// Calls store(t, k_offset, v_offset) for every token with a slot: the element offsets of its K
// and V rows (all heads) in the pool.
template <typename Store>
void ForEachSlot(const KvCacheLayout& layout, const int64_t* slot_mapping, int64_t num_tokens,
                 int64_t layer, Store store) {
  const int64_t row = layout.num_kv_heads * layout.head_dim;  // one token's K (or V), all heads
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / layout.block_size;
    const int64_t offset = slot % layout.block_size;
    store(t, layout.TileOffset(block, layer, 0) + offset * row,
          layout.TileOffset(block, layer, 1) + offset * row);
  }
}

}  // namespace

absl::Status ReshapeAndCache(const float* k, const float* v, const int64_t* slot_mapping,
                             int64_t num_tokens, int64_t layer, KvCacheView cache) {
  RETURN_IF_ERROR(ValidateWrite(cache.layout, cache.data, k, v, slot_mapping, num_tokens, layer));
  const int64_t row = cache.layout.num_kv_heads * cache.layout.head_dim;
  ForEachSlot(cache.layout, slot_mapping, num_tokens, layer,
              [&](int64_t t, int64_t k_off, int64_t v_off) {
                std::memcpy(cache.data + k_off, k + t * row, sizeof(float) * row);
                std::memcpy(cache.data + v_off, v + t * row, sizeof(float) * row);
              });
  return absl::OkStatus();
}

absl::Status ReshapeAndCacheFp8(const float* k, const float* v, const int64_t* slot_mapping,
                                int64_t num_tokens, int64_t layer, Fp8KvCacheView cache) {
  RETURN_IF_ERROR(ValidateWrite(cache.layout, cache.data, k, v, slot_mapping, num_tokens, layer));
  for (float scale : {cache.k_scale, cache.v_scale}) {
    if (!std::isfinite(scale) || scale <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ReshapeAndCache: FP8 scales must be finite and > 0, got ", scale));
    }
  }
  const int64_t row = cache.layout.num_kv_heads * cache.layout.head_dim;
  ForEachSlot(cache.layout, slot_mapping, num_tokens, layer,
              [&](int64_t t, int64_t k_off, int64_t v_off) {
                for (int64_t i = 0; i < row; ++i) {
                  cache.data[k_off + i] = FloatToFp8E4m3(k[t * row + i] / cache.k_scale);
                  cache.data[v_off + i] = FloatToFp8E4m3(v[t * row + i] / cache.v_scale);
                }
              });
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
