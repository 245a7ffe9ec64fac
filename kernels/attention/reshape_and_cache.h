// KV write: stores the K and V of new tokens into their slots of the paged pool (vLLM's
// reshape_and_cache). The attention kernels read them back through block tables.
//
// Thread safety: writes the pool; callers must not run it concurrently with readers or writers
// of the same slots.
#ifndef TANDEM_KERNELS_ATTENTION_RESHAPE_AND_CACHE_H_
#define TANDEM_KERNELS_ATTENTION_RESHAPE_AND_CACHE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/kv_cache_layout.h"

namespace tandem::kernels::cpu {

// Writes each token's K and V of `layer` into the pool at its slot:
// slot = block_id * block_size + offset.
//
// k, v: [num_tokens, num_kv_heads, head_dim] (cache.layout's heads and head_dim);
// slot_mapping: [num_tokens]; slot -1 means skip (padding, or a token owned by another DCP rank).
//
// INVALID_ARGUMENT, with nothing written, if the layout is invalid, cache.data is null, `layer`
// is out of range, num_tokens < 0, an input pointer is null while num_tokens > 0, or any slot is
// < -1 or >= num_blocks * block_size. Two tokens mapped to one slot is a caller bug: here the
// later token wins, but the CUDA kernel makes no such promise.
absl::Status ReshapeAndCache(const float* k, const float* v, const int64_t* slot_mapping,
                             int64_t num_tokens, int64_t layer, KvCacheView cache);

// The same into an FP8 K / V pool: each value stored as FloatToFp8E4m3(x / scale) (fp32
// division, nearest e4m3fn code, saturated to +-448, NaN kept NaN), scale = cache.k_scale for K
// and cache.v_scale for V: the codes the CUDA writers (ReshapeAndCache, RopeQkvToCache) store.
// INVALID_ARGUMENT as above, and for a scale that is not finite and > 0.
absl::Status ReshapeAndCacheFp8(const float* k, const float* v, const int64_t* slot_mapping,
                                int64_t num_tokens, int64_t layer, Fp8KvCacheView cache);

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_KERNELS_ATTENTION_RESHAPE_AND_CACHE_H_
