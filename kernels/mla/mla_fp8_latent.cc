#include "kernels/mla/mla_fp8_latent.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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

namespace {

// Where block b's codes and scales start in either pool form (mla_fp8_latent.h).
int64_t CodeBlockStride(const Fp8LatentCacheView& c) {
  return c.block_bytes > 0 ? c.block_bytes : c.layout.BlockElems();
}
int64_t ScaleBlockStride(const Fp8LatentCacheView& c) {
  return c.block_bytes > 0 ? c.block_bytes / 4 : c.layout.BlockElems() / c.layout.head_dim;
}

// Dequantizes row `e / width` of block b (e: its in-block code offset) into out[width].
void DequantizeRow(const Fp8LatentCacheView& c, int64_t b, int64_t e, float* out) {
  const int64_t width = c.layout.head_dim;
  DequantizeLatentRowFp8(c.codes + b * CodeBlockStride(c) + e,
                         c.scales[b * ScaleBlockStride(c) + e / width], width, out);
}

// INVALID_ARGUMENT naming `op` unless `c` has both pointers and a block_bytes that holds a block.
absl::Status CheckView(const Fp8LatentCacheView& c, const char* op) {
  const KvCacheLayout& l = c.layout;
  const int64_t need = l.BlockElems() + l.BlockElems() / std::max<int64_t>(1, l.head_dim) * 4;
  if (c.codes == nullptr || c.scales == nullptr ||
      (c.block_bytes != 0 && (c.block_bytes % 4 != 0 || c.block_bytes < need))) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null codes or scales, or block_bytes ",
                                                   c.block_bytes, " (0, or >= ", need,
                                                   " and a multiple of 4)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteLatentCacheFp8(const float* latent, const int64_t* slot_mapping,
                                 int64_t num_tokens, int64_t layer, Fp8LatentCacheView cache) {
  const KvCacheLayout& l = cache.layout;
  RETURN_IF_ERROR(CheckView(cache, "WriteLatentCacheFp8"));
  if (l.num_planes != 1 || l.num_kv_heads != 1 || layer < 0 || layer >= l.num_layers) {
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
    const int64_t b = slot / l.block_size;
    const int64_t e = l.TileOffset(0, layer, 0) + (slot % l.block_size) * width;  // in block b
    cache.scales[b * ScaleBlockStride(cache) + e / width] = QuantizeLatentRowFp8(
        latent + t * width, width, cache.codes + b * CodeBlockStride(cache) + e);
  }
  return absl::OkStatus();
}

void DequantizeLatentCacheFp8(const Fp8LatentCacheView& cache, std::vector<float>* out) {
  const KvCacheLayout& l = cache.layout;
  out->resize(static_cast<size_t>(l.TotalElems()));
  for (int64_t b = 0; b < l.num_blocks; ++b) {
    for (int64_t e = 0; e < l.BlockElems(); e += l.head_dim) {
      DequantizeRow(cache, b, e, out->data() + l.TileOffset(b, 0, 0) + e);
    }
  }
}

absl::Status MlaPagedAttentionFp8(const float* q, const float* kv_b_proj, const MlaDims& dims,
                                  const Fp8LatentCacheView& cache, int64_t layer,
                                  const AttentionBatch& batch, float scale, MlaMode mode,
                                  float* out, float* lse, ThreadPool* pool, DcpShard dcp) {
  const KvCacheLayout& l = cache.layout;
  RETURN_IF_ERROR(CheckView(cache, "MlaPagedAttentionFp8"));
  if (layer < 0 || layer >= l.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("MlaPagedAttentionFp8: layer ", layer));
  }
  // Only the blocks the batch reads, this layer's rows, dequantized into a one-layer float pool
  // (the block tables renumbered to it): the same attention as over the whole dequantized pool.
  const int64_t width = l.head_dim, bs = l.block_size, mb = batch.max_blocks_per_seq;
  std::vector<int32_t> slot_of(static_cast<size_t>(l.num_blocks), -1),
      tables(batch.num_seqs * mb, 0), blocks;
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t tokens = dcp.size > 1 && batch.local_seq_lens != nullptr ? batch.local_seq_lens[s]
                                                                           : batch.seq_lens[s];
    for (int64_t j = 0; j < std::min(mb, (tokens + bs - 1) / bs); ++j) {
      const int32_t b = batch.block_tables[s * mb + j];
      if (b < 0 || b >= l.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("MlaPagedAttentionFp8: block ", b, " outside [0, ", l.num_blocks, ")"));
      }
      if (slot_of[b] < 0) {
        slot_of[b] = static_cast<int32_t>(blocks.size());
        blocks.push_back(b);
      }
      tables[s * mb + j] = slot_of[b];
    }
  }
  KvCacheLayout one = l;
  one.num_layers = 1;
  one.num_blocks = std::max<int64_t>(1, static_cast<int64_t>(blocks.size()));
  std::vector<float> rows(static_cast<size_t>(one.TotalElems()), 0.0f);
  for (size_t k = 0; k < blocks.size(); ++k) {
    const int64_t src = l.TileOffset(0, layer, 0);  // this layer's rows within the block
    for (int64_t r = 0; r < bs; ++r) {
      DequantizeRow(cache, blocks[k], src + r * width,
                    rows.data() + one.TileOffset(static_cast<int64_t>(k), 0, 0) + r * width);
    }
  }
  AttentionBatch local = batch;
  local.block_tables = tables.data();
  return MlaPagedAttention(q, kv_b_proj, dims, KvCacheView{rows.data(), one}, /*layer=*/0, local,
                           scale, mode, out, lse, pool, dcp);
}

}  // namespace tandem::kernels::cpu
