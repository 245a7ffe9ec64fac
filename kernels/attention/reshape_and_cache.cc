#include "kernels/attention/reshape_and_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::kernels::cpu {

absl::Status ReshapeAndCache(const float* k, const float* v, const int64_t* slot_mapping,
                             int64_t num_tokens, int64_t layer, KvCacheView cache) {
  const KvCacheLayout& layout = cache.layout;
  RETURN_IF_ERROR(layout.Validate());
  if (cache.data == nullptr)
    return absl::InvalidArgumentError("ReshapeAndCache: cache.data is null");
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

  const int64_t row = layout.num_kv_heads * layout.head_dim;  // one token's K (or V), all heads
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / layout.block_size;
    const int64_t offset = slot % layout.block_size;
    float* k_dst = cache.data + layout.TileOffset(block, layer, 0) + offset * row;
    float* v_dst = cache.data + layout.TileOffset(block, layer, 1) + offset * row;
    std::memcpy(k_dst, k + t * row, sizeof(float) * row);
    std::memcpy(v_dst, v + t * row, sizeof(float) * row);
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
