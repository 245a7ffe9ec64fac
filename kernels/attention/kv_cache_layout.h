// Layout of one worker's paged KV pool and a non-owning view of it.
//
// The pool is block-major across layers, so one block (every layer's K and V for block_size
// tokens) is one contiguous region and one RDMA descriptor when it moves between workers:
//
//   [num_blocks][num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]
//
// A multi-head latent attention model (DeepSeek MLA, kernels/mla) keeps ONE plane per layer
// instead of K and V (num_planes = 1): one latent "head" of kv_lora_rank + qk_rope_head_dim
// values per token, [num_blocks][num_layers][1][block_size][1][latent_dim].
//
// A token's slot is `block_id * block_size + offset`; within a (block, layer, K|V) tile the
// token's row for kv head h starts at `offset * num_kv_heads * head_dim + h * head_dim`.
//
// Thread safety: plain values; views do not synchronize access to the pool they point at.
#ifndef TANDEM_KERNELS_ATTENTION_KV_CACHE_LAYOUT_H_
#define TANDEM_KERNELS_ATTENTION_KV_CACHE_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels {

struct KvCacheLayout {
  int64_t num_blocks = 0;
  int64_t num_layers = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_planes = 2;  // 2: K and V tiles per layer; 1: one latent tile (MLA)

  // Elements of one [block_size][num_kv_heads][head_dim] tile (one layer's K or V of a block).
  int64_t TileElems() const { return block_size * num_kv_heads * head_dim; }
  // num_layers * num_planes * block_size * num_kv_heads * head_dim.
  int64_t BlockElems() const { return num_layers * num_planes * TileElems(); }
  // num_blocks * BlockElems().
  int64_t TotalElems() const { return num_blocks * BlockElems(); }
  // Number of addressable slots, num_blocks * block_size.
  int64_t NumSlots() const { return num_blocks * block_size; }

  // Element offset of K (kv = 0) or V (kv = 1) of (block, layer): the start of a
  // [block_size][num_kv_heads][head_dim] tile.
  // REQUIRES: 0 <= block < num_blocks, 0 <= layer < num_layers, 0 <= kv < num_planes (not
  // checked: hot path). An MLA latent tile is kv = 0.
  int64_t TileOffset(int64_t block, int64_t layer, int kv) const {
    return ((block * num_layers + layer) * num_planes + kv) * TileElems();
  }

  // OK iff every field is positive (num_planes 1 or 2) and TotalElems() fits in int64_t;
  // otherwise INVALID_ARGUMENT naming the offending field.
  absl::Status Validate() const;
};

// Non-owning view of an fp32 pool of layout.TotalElems() floats.
struct KvCacheView {
  float* data = nullptr;
  KvCacheLayout layout;
};

// Non-owning view of an FP8 K / V pool (--kv_cache_dtype=fp8 for K / V heads): the same layout,
// one e4m3fn code a value (layout.TotalElems() bytes), read back as code * scale with one scale
// per tensor: k_scale for the K tiles and v_scale for the V tiles of the layer the view is used
// for (the runtime passes each layer's own: a checkpoint's calibrated scales, else 1).
struct Fp8KvCacheView {
  uint8_t* data = nullptr;
  KvCacheLayout layout;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_ATTENTION_KV_CACHE_LAYOUT_H_
