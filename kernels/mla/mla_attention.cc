// CPU reference MLA (mla_attention.h). Work is cut per sequence into (query token, head) rows
// run on the pool; each row scores its visible latents in one pass (scores kept, then a
// max-subtracted softmax), so the latent rows of a sequence are resolved through the block table
// once per sequence into a pointer list.
#include "kernels/mla/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/gemm/linear.h"

namespace tandem::kernels {

absl::Status MlaDims::Validate() const {
  const struct {
    const char* name;
    int64_t value;
  } fields[] = {{"num_heads", num_heads},
                {"qk_nope_head_dim", qk_nope_head_dim},
                {"qk_rope_head_dim", qk_rope_head_dim},
                {"kv_lora_rank", kv_lora_rank},
                {"v_head_dim", v_head_dim}};
  for (const auto& f : fields) {
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MLA: ", f.name, " must be positive, got ", f.value));
    }
  }
  if (qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLA: qk_rope_head_dim must be even, got ", qk_rope_head_dim));
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels

namespace tandem::kernels::cpu {
namespace {

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("MlaPagedAttention: ", args...));
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

absl::Status CheckLatentCache(const KvCacheView& cache, const MlaDims& dims, int64_t layer) {
  const KvCacheLayout& l = cache.layout;
  if (cache.data == nullptr || l.num_planes != 1 || l.num_kv_heads != 1 ||
      l.head_dim != dims.LatentDim() || layer < 0 || layer >= l.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLA: the cache is not a latent cache of width ", dims.LatentDim(),
                     " (planes ", l.num_planes, ", heads ", l.num_kv_heads, ", head_dim ",
                     l.head_dim, ") or layer ", layer, " is outside [0, ", l.num_layers, ")"));
  }
  return absl::OkStatus();
}

// Softmax of scores[0, n) in place (max-subtracted); returns the log-sum-exp of the inputs.
float SoftmaxInPlace(float* scores, int64_t n) {
  float m = scores[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, scores[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) scores[j] *= inv;
  return m + std::log(sum);
}

struct SeqView {
  const float* q = nullptr;  // [q_len, Hq, Dn + Dr] of this sequence
  float* out = nullptr;      // [q_len, Hq, Dv]
  float* lse = nullptr;      // [q_len, Hq] or null
  int64_t q_len = 0;
  int64_t ctx = 0;                    // seq_lens[s] (global)
  std::vector<const float*> latents;  // the shard's latents (all of them without DCP)
  DcpShard dcp;

  // How many of `latents` query token i (of q_len) sees: those at global positions <= its own.
  int64_t Visible(int64_t i) const {
    const int64_t global_end = ctx - q_len + i + 1;
    return dcp.size > 1 ? DcpLocalCount(global_end, dcp) : global_end;
  }
};

// A query that sees no latent of this shard: an empty partial for MergeAttnStatesN.
void EmptyRow(int64_t dv, float* out, float* lse) {
  std::fill(out, out + dv, 0.0f);
  if (lse != nullptr) *lse = -std::numeric_limits<float>::infinity();
}

// Absorbed: per (query token, head) row, q_lat = W_UK^T q_nope, attention over latent rows,
// out = W_UV o_lat.
void AbsorbedSeq(const SeqView& sv, const float* kv_b, const MlaDims& d, float scale,
                 ThreadPool* pool) {
  const int64_t Hq = d.num_heads, Dn = d.qk_nope_head_dim, Dr = d.qk_rope_head_dim;
  const int64_t L = d.kv_lora_rank, Dv = d.v_head_dim, Dqk = d.QkHeadDim();
  auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> q_lat(L), o_lat(L), scores(sv.latents.size());
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / Hq, h = r % Hq;
      const float* q = sv.q + (i * Hq + h) * Dqk;
      const int64_t visible = sv.Visible(i);
      if (visible == 0) {
        EmptyRow(Dv, sv.out + (i * Hq + h) * Dv, sv.lse == nullptr ? nullptr : sv.lse + i * Hq + h);
        continue;
      }
      const float* w_uk = kv_b + h * (Dn + Dv) * L;  // [Dn, L]
      const float* w_uv = w_uk + Dn * L;             // [Dv, L]
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t n = 0; n < Dn; ++n) {
        const float qn = q[n];
        const float* w = w_uk + n * L;
        for (int64_t c = 0; c < L; ++c) q_lat[c] += qn * w[c];
      }
      for (int64_t j = 0; j < visible; ++j) {
        const float* lat = sv.latents[j];
        scores[j] = (Dot(q_lat.data(), lat, L) + Dot(q + Dn, lat + L, Dr)) * scale;
      }
      const float lse = SoftmaxInPlace(scores.data(), visible);
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float p = scores[j];
        const float* lat = sv.latents[j];
        for (int64_t c = 0; c < L; ++c) o_lat[c] += p * lat[c];
      }
      float* out = sv.out + (i * Hq + h) * Dv;
      for (int64_t v = 0; v < Dv; ++v) out[v] = Dot(w_uv + v * L, o_lat.data(), L);
      if (sv.lse != nullptr) sv.lse[i * Hq + h] = lse;
    }
  };
  const int64_t n = sv.q_len * Hq;
  if (pool == nullptr) {
    rows(0, n);
  } else {
    pool->ParallelFor(n, rows);
  }
}

// Unabsorbed: kv = c_kv kv_b^T for the whole prefix ([ctx, Hq, Dn + Dv]), then plain attention.
void UnabsorbedSeq(const SeqView& sv, const float* kv_b, const MlaDims& d, float scale,
                   ThreadPool* pool) {
  const int64_t Hq = d.num_heads, Dn = d.qk_nope_head_dim, Dr = d.qk_rope_head_dim;
  const int64_t L = d.kv_lora_rank, Dv = d.v_head_dim, Dqk = d.QkHeadDim();
  const int64_t kv_width = Hq * (Dn + Dv);
  const int64_t n_lat = static_cast<int64_t>(sv.latents.size());
  std::vector<float> c_kv(n_lat * L), kv(n_lat * kv_width);
  for (int64_t j = 0; j < n_lat; ++j) std::copy_n(sv.latents[j], L, c_kv.data() + j * L);
  if (n_lat > 0) Linear(c_kv.data(), kv_b, nullptr, n_lat, kv_width, L, kv.data(), pool);
  auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(n_lat);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r / Hq, h = r % Hq;
      const float* q = sv.q + (i * Hq + h) * Dqk;
      const int64_t visible = sv.Visible(i);
      if (visible == 0) {
        EmptyRow(Dv, sv.out + (i * Hq + h) * Dv, sv.lse == nullptr ? nullptr : sv.lse + i * Hq + h);
        continue;
      }
      for (int64_t j = 0; j < visible; ++j) {
        const float* k_nope = kv.data() + j * kv_width + h * (Dn + Dv);
        scores[j] = (Dot(q, k_nope, Dn) + Dot(q + Dn, sv.latents[j] + L, Dr)) * scale;
      }
      const float lse = SoftmaxInPlace(scores.data(), visible);
      float* out = sv.out + (i * Hq + h) * Dv;
      std::fill(out, out + Dv, 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float p = scores[j];
        const float* v = kv.data() + j * kv_width + h * (Dn + Dv) + Dn;
        for (int64_t c = 0; c < Dv; ++c) out[c] += p * v[c];
      }
      if (sv.lse != nullptr) sv.lse[i * Hq + h] = lse;
    }
  };
  const int64_t n = sv.q_len * Hq;
  if (pool == nullptr) {
    rows(0, n);
  } else {
    pool->ParallelFor(n, rows);
  }
}

}  // namespace

void ApplyMlaRope(const int64_t* positions, int64_t num_tokens, const float* inv_freq,
                  int64_t rope_dim, float attention_factor, bool interleave, MlaRopeRows rows) {
  const int64_t half = rope_dim / 2;
  std::vector<float> cos(half), sin(half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // The angle is the fp32 product, as in transformers; cos/sin in fp64 rounded to fp32.
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
      sin[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
    }
    for (int64_t r = 0; r < rows.rows_per_token; ++r) {
      float* x = rows.x + (t * rows.rows_per_token + r) * rows.row_stride + rows.offset;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = interleave ? 2 * i : i;
        const int64_t b = interleave ? 2 * i + 1 : i + half;
        const float x1 = x[a], x2 = x[b];
        x[a] = x1 * cos[i] - x2 * sin[i];
        x[b] = x2 * cos[i] + x1 * sin[i];
      }
    }
  }
}

absl::Status WriteLatentCache(const float* latent, const int64_t* slot_mapping, int64_t num_tokens,
                              int64_t layer, KvCacheView cache) {
  const KvCacheLayout& l = cache.layout;
  if (cache.data == nullptr || l.num_planes != 1 || l.num_kv_heads != 1 || layer < 0 ||
      layer >= l.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("WriteLatentCache: not a latent cache (planes ",
                                                   l.num_planes, ", heads ", l.num_kv_heads,
                                                   ") or layer ", layer, " out of range"));
  }
  const int64_t width = l.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    if (slot >= l.NumSlots()) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteLatentCache: slot ", slot, " outside [0, ", l.NumSlots(), ")"));
    }
    float* dst =
        cache.data + l.TileOffset(slot / l.block_size, layer, 0) + (slot % l.block_size) * width;
    std::copy_n(latent + t * width, width, dst);
  }
  return absl::OkStatus();
}

absl::Status MlaPagedAttention(const float* q, const float* kv_b_proj, const MlaDims& dims,
                               KvCacheView cache, int64_t layer, const AttentionBatch& batch,
                               float scale, MlaMode mode, float* out, float* lse, ThreadPool* pool,
                               DcpShard dcp) {
  RETURN_IF_ERROR(dims.Validate());
  const bool sharded = dcp.size > 1;
  if (sharded && (!DcpShardValid(dcp) || batch.local_seq_lens == nullptr)) {
    return Invalid("DCP needs a valid shard (size ", dcp.size, ", rank ", dcp.rank, ", interleave ",
                   dcp.interleave, ") and batch.local_seq_lens");
  }
  RETURN_IF_ERROR(CheckLatentCache(cache, dims, layer));
  if (!(scale > 0.0f) || !std::isfinite(scale)) return Invalid("scale must be > 0, got ", scale);
  if (batch.num_seqs < 0 ||
      (batch.num_seqs > 0 && (batch.query_start_loc == nullptr || batch.seq_lens == nullptr ||
                              batch.block_tables == nullptr))) {
    return Invalid("batch metadata missing");
  }
  const KvCacheLayout& l = cache.layout;
  const int64_t Hq = dims.num_heads, Dqk = dims.QkHeadDim(), Dv = dims.v_head_dim;
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    SeqView sv;
    const int64_t q0 = batch.query_start_loc[s];
    sv.q_len = batch.query_start_loc[s + 1] - q0;
    sv.ctx = batch.seq_lens[s];
    sv.dcp = dcp;
    if (sv.q_len <= 0) continue;
    const int64_t held = sharded ? batch.local_seq_lens[s] : sv.ctx;
    if (sv.q_len > sv.ctx || held > batch.max_blocks_per_seq * l.block_size ||
        (sharded && held != DcpLocalCount(sv.ctx, dcp))) {
      return Invalid("sequence ", s, ": ", sv.q_len, " new tokens of ", sv.ctx, " (", held,
                     " held here) do not fit its block table of ", batch.max_blocks_per_seq,
                     " blocks");
    }
    const int32_t* table = batch.block_tables + s * batch.max_blocks_per_seq;
    sv.latents.resize(held);
    for (int64_t j = 0; j < held; ++j) {
      const int64_t block = table[j / l.block_size];
      if (block < 0 || block >= l.num_blocks) {
        return Invalid("sequence ", s, " token ", j, ": block ", block, " outside the pool");
      }
      sv.latents[j] = cache.data + l.TileOffset(block, layer, 0) + (j % l.block_size) * l.head_dim;
    }
    sv.q = q + q0 * Hq * Dqk;
    sv.out = out + q0 * Hq * Dv;
    sv.lse = lse == nullptr ? nullptr : lse + q0 * Hq;
    const bool absorbed =
        mode == MlaMode::kAbsorbed || (mode == MlaMode::kAuto && sv.q_len <= kMlaAbsorbMaxQueryLen);
    if (absorbed) {
      AbsorbedSeq(sv, kv_b_proj, dims, scale, pool);
    } else {
      UnabsorbedSeq(sv, kv_b_proj, dims, scale, pool);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cpu
