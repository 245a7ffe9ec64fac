#include "kernels/attention/kv_cache_layout.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem::kernels {

absl::Status KvCacheLayout::Validate() const {
  const struct {
    const char* name;
    int64_t value;
  } fields[] = {{"num_blocks", num_blocks},
                {"num_layers", num_layers},
                {"block_size", block_size},
                {"num_kv_heads", num_kv_heads},
                {"head_dim", head_dim}};
  if (num_planes != 1 && num_planes != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCacheLayout: num_planes must be 1 (MLA latent) or 2 (K, V), got ", num_planes));
  }
  int64_t total = num_planes;  // K and V, or one latent
  for (const auto& field : fields) {
    if (field.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCacheLayout: ", field.name, " must be positive, got ", field.value));
    }
    // Offsets are computed in int64_t everywhere, so the whole pool must be addressable.
    if (total > std::numeric_limits<int64_t>::max() / field.value) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCacheLayout: pool of ", num_blocks, " x ", num_layers, " x ", num_planes,
                       " x ", block_size, " x ", num_kv_heads, " x ", head_dim,
                       " elements overflows int64 (", field.name, " too large)"));
    }
    total *= field.value;
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels
