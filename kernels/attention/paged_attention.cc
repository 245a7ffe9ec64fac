// CPU paged attention. The batch is cut into work items of (sequence, kv head, tile of query
// tokens); an item's rows are its tokens x the kv head's GQA group of query heads. An item walks
// the union of its rows' visible keys in chunks of kKeyChunk positions, resolves each position
// through the block table once, and runs an online-softmax update (running max m, running sum
// l, unnormalized output acc) for every row whose causal/window range meets the chunk. Items
// are handed to pool threads one at a time, largest first. Under decode context parallelism the
// pool holds one KV shard at local indices; a query's visible global range maps to one contiguous
// range of local keys (dcp_shard.h), after which nothing differs.
#include "kernels/attention/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/fp8/fp8.h"

namespace tandem::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Keys scored per online-softmax step. A chunk's K and V rows (2 x 64 x head_dim floats) stay
// in L1/L2 while every query row of a work item uses them.
constexpr int64_t kKeyChunk = 64;
// Query rows (tokens x GQA group heads) per work item: enough rows to reuse each loaded K/V
// chunk many times during prefill, few enough that the accumulators stay in L2.
constexpr int64_t kTargetRows = 64;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", args...));
}

// One unit of parallel work: query tokens [q_begin, q_end) of sequence `seq` (indices among its
// new tokens) with all query heads of kv head `kv_head`.
struct WorkItem {
  int64_t seq = 0;
  int64_t kv_head = 0;
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int64_t cost = 0;  // ~ rows x keys, for ordering only
};

// Everything a work item needs, resolved once per call.
struct Plan {
  const float* q = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  const float* k_base = nullptr;  // pool + layer's K tile offset within block 0
  // FP8 pools instead (k_base null): the codes from the same offset, and the layer's scales.
  const uint8_t* k_codes = nullptr;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  int64_t block_elems = 0;  // stride between blocks
  int64_t tile_elems = 0;   // V tile = K tile + tile_elems
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t num_q_heads = 0;
  int64_t head_dim = 0;
  int64_t group = 0;        // query heads per kv head
  int64_t tile_tokens = 0;  // max query tokens per work item
  AttentionBatch batch;
  AttentionParams params;
};

// Keys [lo, hi) of the pool's copy of a sequence that the query at global position pos sees: the
// positions themselves, or under DCP the local indices of this shard's keys in that range (one
// branch per query token; the size-1 path is the plain arithmetic).
struct KeyRange {
  int64_t lo = 0;
  int64_t hi = 0;
};
inline KeyRange VisibleKeys(int64_t pos, const AttentionParams& params) {
  KeyRange r{params.window_left >= 0 ? std::max<int64_t>(0, pos - params.window_left) : 0, pos + 1};
  if (params.dcp_size > 1) {
    r.lo = DcpLocalCount(r.lo, params.Dcp());
    r.hi = DcpLocalCount(r.hi, params.Dcp());
  }
  return r;
}

// Per-thread buffers, sized for the largest work item and reused across items.
struct Scratch {
  explicit Scratch(const Plan& plan)
      : acc(plan.tile_tokens * plan.group * plan.head_dim),
        m(plan.tile_tokens * plan.group),
        l(plan.tile_tokens * plan.group),
        lo(plan.tile_tokens),
        hi(plan.tile_tokens),
        scores(kKeyChunk),
        k_rows(kKeyChunk),
        v_rows(kKeyChunk),
        k_deq(plan.k_codes != nullptr ? kKeyChunk * plan.head_dim : 0),
        v_deq(plan.k_codes != nullptr ? kKeyChunk * plan.head_dim : 0) {}
  std::vector<float> acc;       // [rows][head_dim] unnormalized output
  std::vector<float> m;         // [rows] running max of scores
  std::vector<float> l;         // [rows] running sum of exp(score - m)
  std::vector<int64_t> lo, hi;  // [tokens] visible key positions [lo, hi)
  std::vector<float> scores;
  std::vector<const float*> k_rows, v_rows;  // this chunk's rows for the item's kv head
  std::vector<float> k_deq, v_deq;  // FP8 pools: the chunk's rows dequantized, [kKeyChunk][d]
};

// Points s.k_rows / s.v_rows at the rows of keys [c0, c1) of the item's kv head: in the f32 pool,
// or (FP8) at their values code * scale in s.k_deq / s.v_deq, the exact fp32 products, so the
// arithmetic after this is that of an f32 pool holding them.
void LoadChunkRows(const Plan& plan, const int32_t* block_table, int64_t kv_head, int64_t d,
                   int64_t c0, int64_t c1, Scratch& s) {
  const int64_t token_stride = plan.num_kv_heads * d;  // between tokens within a tile
  for (int64_t pos = c0; pos < c1; ++pos) {
    const int64_t off = block_table[pos / plan.block_size] * plan.block_elems +
                        (pos % plan.block_size) * token_stride + kv_head * d;
    if (plan.k_codes == nullptr) {
      s.k_rows[pos - c0] = plan.k_base + off;
      s.v_rows[pos - c0] = plan.k_base + off + plan.tile_elems;
      continue;
    }
    float* k = s.k_deq.data() + (pos - c0) * d;
    float* v = s.v_deq.data() + (pos - c0) * d;
    const uint8_t* k_code = plan.k_codes + off;
    const uint8_t* v_code = k_code + plan.tile_elems;
    for (int64_t j = 0; j < d; ++j) {
      k[j] = Fp8E4m3ToFloat(k_code[j]) * plan.k_scale;
      v[j] = Fp8E4m3ToFloat(v_code[j]) * plan.v_scale;
    }
    s.k_rows[pos - c0] = k;
    s.v_rows[pos - c0] = v;
  }
}

// 4 x fp32 SIMD (SSE on x86-64, NEON on arm64) through GCC/Clang vector extensions: no -march
// flags, so one binary runs everywhere and computes the same bits everywhere.
typedef float F4 __attribute__((vector_size(16)));
inline F4 Load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store4(float* p, F4 v) { std::memcpy(p, &v, sizeof(v)); }
inline float Sum4(F4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// In the helpers below kD > 0 makes the head dimension a compile-time constant (the sizes we
// serve: the loops unroll and the scalar tails vanish); kD == 0 reads it at run time.
template <int64_t kD>
constexpr bool kHasTail = kD == 0 || kD % 4 != 0;

// dots[j] = q . k[j] for 4 keys: q is loaded once and the 4 sums are independent chains.
template <int64_t kD>
inline void Dot4(const float* q, const float* const* k, int64_t head_dim, float* dots) {
  const int64_t d = kD > 0 ? kD : head_dim;
  const float* k0 = k[0];
  const float* k1 = k[1];
  const float* k2 = k[2];
  const float* k3 = k[3];
  F4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) {
    const F4 x = Load4(q + i);
    a0 += x * Load4(k0 + i);
    a1 += x * Load4(k1 + i);
    a2 += x * Load4(k2 + i);
    a3 += x * Load4(k3 + i);
  }
  float s0 = Sum4(a0), s1 = Sum4(a1), s2 = Sum4(a2), s3 = Sum4(a3);
  if constexpr (kHasTail<kD>) {
    for (; i < d; ++i) {
      s0 += q[i] * k0[i];
      s1 += q[i] * k1[i];
      s2 += q[i] * k2[i];
      s3 += q[i] * k3[i];
    }
  }
  dots[0] = s0;
  dots[1] = s1;
  dots[2] = s2;
  dots[3] = s3;
}

template <int64_t kD>
inline float Dot1(const float* q, const float* k, int64_t head_dim) {
  const int64_t d = kD > 0 ? kD : head_dim;
  F4 a = {};
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) a += Load4(q + i) * Load4(k + i);
  float sum = Sum4(a);
  if constexpr (kHasTail<kD>) {
    for (; i < d; ++i) sum += q[i] * k[i];
  }
  return sum;
}

// acc += w[0] * v[0] + ... + w[3] * v[3]: one load and store of acc per 4 V rows.
template <int64_t kD>
inline void Axpy4(const float* w, const float* const* v, int64_t head_dim, float* acc) {
  const int64_t d = kD > 0 ? kD : head_dim;
  const float* v0 = v[0];
  const float* v1 = v[1];
  const float* v2 = v[2];
  const float* v3 = v[3];
  const F4 w0 = F4{} + w[0], w1 = F4{} + w[1], w2 = F4{} + w[2], w3 = F4{} + w[3];
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) {
    const F4 sum =
        (w0 * Load4(v0 + i) + w1 * Load4(v1 + i)) + (w2 * Load4(v2 + i) + w3 * Load4(v3 + i));
    Store4(acc + i, Load4(acc + i) + sum);
  }
  if constexpr (kHasTail<kD>) {
    for (; i < d; ++i) acc[i] += (w[0] * v0[i] + w[1] * v1[i]) + (w[2] * v2[i] + w[3] * v3[i]);
  }
}

template <int64_t kD>
inline void Axpy1(float w, const float* v, int64_t head_dim, float* acc) {
  const int64_t d = kD > 0 ? kD : head_dim;
  const F4 w4 = F4{} + w;
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) Store4(acc + i, Load4(acc + i) + w4 * Load4(v + i));
  if constexpr (kHasTail<kD>) {
    for (; i < d; ++i) acc[i] += w * v[i];
  }
}

template <int64_t kD>
inline void ScaleRow(float c, int64_t head_dim, float* acc) {
  const int64_t d = kD > 0 ? kD : head_dim;
  const F4 c4 = F4{} + c;
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) Store4(acc + i, Load4(acc + i) * c4);
  if constexpr (kHasTail<kD>) {
    for (; i < d; ++i) acc[i] *= c;
  }
}

template <int64_t kD>
void RunItem(const Plan& plan, const WorkItem& item, Scratch& s) {
  const int64_t d = kD > 0 ? kD : plan.head_dim;
  const int64_t group = plan.group;
  const AttentionBatch& batch = plan.batch;
  const AttentionParams& params = plan.params;
  const int64_t q_start = batch.query_start_loc[item.seq];
  const int64_t q_len = batch.query_start_loc[item.seq + 1] - q_start;
  const int64_t first_pos = batch.seq_lens[item.seq] - q_len;  // position of new token 0
  const int64_t num_tok = item.q_end - item.q_begin;
  const int32_t* block_table = batch.block_tables + item.seq * batch.max_blocks_per_seq;

  for (int64_t t = 0; t < num_tok; ++t) {
    const KeyRange keys = VisibleKeys(first_pos + item.q_begin + t, params);
    s.lo[t] = keys.lo;
    s.hi[t] = keys.hi;
  }
  const int64_t rows = num_tok * group;
  std::fill(s.m.begin(), s.m.begin() + rows, kNegInf);
  std::fill(s.l.begin(), s.l.begin() + rows, 0.0f);
  std::fill(s.acc.begin(), s.acc.begin() + rows * d, 0.0f);

  const bool softcap = params.softcap > 0;
  const float inv_softcap = softcap ? 1.0f / params.softcap : 0.0f;

  // lo and hi are non-decreasing in t, so [lo[0], hi[last]) covers every row's keys.
  const int64_t key_end = s.hi[num_tok - 1];
  for (int64_t c0 = s.lo[0]; c0 < key_end; c0 += kKeyChunk) {
    const int64_t c1 = std::min(c0 + kKeyChunk, key_end);
    LoadChunkRows(plan, block_table, item.kv_head, d, c0, c1, s);
    for (int64_t t = 0; t < num_tok; ++t) {
      const int64_t vis_begin = std::max(c0, s.lo[t]);
      const int64_t vis_end = std::min(c1, s.hi[t]);
      if (vis_begin >= vis_end) continue;
      const int64_t n = vis_end - vis_begin;
      const float* const* k_rows = s.k_rows.data() + (vis_begin - c0);
      const float* const* v_rows = s.v_rows.data() + (vis_begin - c0);
      // The group's query heads are adjacent: rows [t * group, (t + 1) * group).
      const float* q_tok =
          plan.q + ((q_start + item.q_begin + t) * plan.num_q_heads + item.kv_head * group) * d;
      for (int64_t h = 0; h < group; ++h) {
        const int64_t r = t * group + h;
        const float* q_row = q_tok + h * d;
        float* scores = s.scores.data();
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) Dot4<kD>(q_row, k_rows + i, d, scores + i);
        for (; i < n; ++i) scores[i] = Dot1<kD>(q_row, k_rows[i], d);
        float chunk_max = kNegInf;
        bool has_nan = false;
        for (i = 0; i < n; ++i) {
          float score = scores[i] * params.scale;
          if (softcap) score = params.softcap * std::tanh(score * inv_softcap);
          scores[i] = score;
          chunk_max = std::max(chunk_max, score);
          has_nan |= std::isnan(score);
        }
        // max() drops NaN, so poison the row explicitly: a NaN input must come out as NaN, not
        // as a plausible number or an "empty" 0.
        if (has_nan) s.l[r] = std::numeric_limits<float>::quiet_NaN();
        const float m_old = s.m[r];
        const float m_new = std::max(m_old, chunk_max);
        // All scores -inf (from infinite inputs): skipping avoids (-inf) - (-inf) = NaN.
        if (m_new == kNegInf) continue;
        float* acc = s.acc.data() + r * d;
        if (m_new > m_old) {
          if (m_old != kNegInf) {  // nothing accumulated yet otherwise
            const float correction = std::exp(m_old - m_new);
            s.l[r] *= correction;
            ScaleRow<kD>(correction, d, acc);
          }
          s.m[r] = m_new;
        }
        float sum = 0.0f;
        for (i = 0; i < n; ++i) {
          scores[i] = std::exp(scores[i] - m_new);  // now the softmax weight
          sum += scores[i];
        }
        for (i = 0; i + 4 <= n; i += 4) Axpy4<kD>(scores + i, v_rows + i, d, acc);
        for (; i < n; ++i) Axpy1<kD>(scores[i], v_rows[i], d, acc);
        s.l[r] += sum;
      }
    }
  }

  for (int64_t t = 0; t < num_tok; ++t) {
    const int64_t token = q_start + item.q_begin + t;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t r = t * group + h;
      const int64_t out_row = token * plan.num_q_heads + item.kv_head * group + h;
      float* o = plan.out + out_row * d;
      const float* acc = s.acc.data() + r * d;
      if (s.l[r] == 0.0f) {  // no visible key
        std::fill(o, o + d, 0.0f);
        if (plan.lse != nullptr) plan.lse[out_row] = kNegInf;
      } else {  // l >= 1 (the max term is exp(0)), or NaN which then propagates
        const float inv_l = 1.0f / s.l[r];
        for (int64_t j = 0; j < d; ++j) o[j] = acc[j] * inv_l;
        if (plan.lse != nullptr) plan.lse[out_row] = s.m[r] + std::log(s.l[r]);
      }
    }
  }
}

// The one place where the run-time head_dim becomes a template constant.
void RunItems(const Plan& plan, const std::vector<WorkItem>& items, std::atomic<int64_t>& next) {
  Scratch scratch(plan);
  const int64_t n = static_cast<int64_t>(items.size());
  auto run = [&](auto run_item) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      run_item(plan, items[i], scratch);
    }
  };
  switch (plan.head_dim) {
    case 64:
      run(RunItem<64>);
      break;
    case 128:
      run(RunItem<128>);
      break;
    default:
      run(RunItem<0>);
      break;
  }
}

absl::Status ValidateParams(int64_t num_q_heads, const KvCacheLayout& layout, const void* data,
                            int64_t layer, const AttentionBatch& batch,
                            const AttentionParams& params) {
  RETURN_IF_ERROR(layout.Validate());
  if (data == nullptr) return Invalid("cache.data is null");
  if (layer < 0 || layer >= layout.num_layers) {
    return Invalid("layer ", layer, " out of range [0, ", layout.num_layers, ")");
  }
  if (num_q_heads <= 0 || num_q_heads % layout.num_kv_heads != 0) {
    return Invalid("num_q_heads ", num_q_heads, " is not a positive multiple of num_kv_heads ",
                   layout.num_kv_heads);
  }
  if (!std::isfinite(params.scale) || params.scale <= 0) {
    return Invalid("scale must be finite and > 0, got ", params.scale);
  }
  if (!std::isfinite(params.softcap) || params.softcap < 0) {
    return Invalid("softcap must be finite and >= 0 (0 = off), got ", params.softcap);
  }
  if (params.window_left < -1) {
    return Invalid("window_left must be >= -1 (-1 = off), got ", params.window_left);
  }
  if (!DcpShardValid(params.Dcp())) {
    return Invalid("dcp shard (size ", params.dcp_size, ", rank ", params.dcp_rank, ", interleave ",
                   params.dcp_interleave,
                   ") invalid: need size >= 1, 0 <= rank < size, interleave >= 1, "
                   "size * interleave <= 2^30");
  }
  if (batch.num_seqs < 0) return Invalid("num_seqs must be >= 0, got ", batch.num_seqs);
  if (batch.max_blocks_per_seq < 0) {
    return Invalid("max_blocks_per_seq must be >= 0, got ", batch.max_blocks_per_seq);
  }
  return absl::OkStatus();
}

// Checks the per-sequence metadata, reading only the block-table entries some query needs
// (blocks that slid out of a window may already be freed).
absl::Status ValidateBatch(const AttentionBatch& batch, const KvCacheLayout& layout,
                           const AttentionParams& params) {
  if (batch.num_seqs == 0) return absl::OkStatus();
  if (batch.query_start_loc == nullptr || batch.seq_lens == nullptr) {
    return Invalid("query_start_loc and seq_lens must be non-null when num_seqs > 0");
  }
  const bool dcp = params.dcp_size > 1;
  if (dcp && batch.local_seq_lens == nullptr) {
    return Invalid("local_seq_lens must be non-null under decode context parallelism");
  }
  if (batch.query_start_loc[0] != 0) {
    return Invalid("query_start_loc[0] must be 0, got ", batch.query_start_loc[0]);
  }
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t q_len = int64_t{batch.query_start_loc[s + 1]} - batch.query_start_loc[s];
    const int64_t seq_len = batch.seq_lens[s];
    if (q_len < 0) {
      return Invalid("query_start_loc decreases at ", s + 1, ": ", batch.query_start_loc[s], " -> ",
                     batch.query_start_loc[s + 1]);
    }
    if (seq_len < 0) return Invalid("seq_lens[", s, "] = ", seq_len, " is negative");
    if (q_len > seq_len) {
      return Invalid("sequence ", s, " has q_len ", q_len, " > seq_len ", seq_len);
    }
    // Keys in the pool: the whole context, or under DCP this shard's part of it.
    int64_t kv_len = seq_len;
    if (dcp) {
      kv_len = batch.local_seq_lens[s];
      if (kv_len != DcpLocalCount(seq_len, params.Dcp())) {
        return Invalid("local_seq_lens[", s, "] = ", kv_len, " but rank ", params.dcp_rank, " of ",
                       params.dcp_size, " (interleave ", params.dcp_interleave, ") holds ",
                       DcpLocalCount(seq_len, params.Dcp()), " of seq_len ", seq_len);
      }
    }
    const int64_t blocks_used = (kv_len + layout.block_size - 1) / layout.block_size;
    if (blocks_used > batch.max_blocks_per_seq) {
      return Invalid("sequence ", s, " has ", dcp ? "local_seq_len " : "seq_len ", kv_len,
                     " > max_blocks_per_seq ", batch.max_blocks_per_seq, " x block_size ",
                     layout.block_size);
    }
    if (q_len == 0) continue;
    const int64_t first_key = VisibleKeys(seq_len - q_len, params).lo;
    if (batch.block_tables == nullptr) return Invalid("block_tables is null");
    const int32_t* table = batch.block_tables + s * batch.max_blocks_per_seq;
    for (int64_t b = first_key / layout.block_size; b < blocks_used; ++b) {
      if (table[b] < 0 || table[b] >= layout.num_blocks) {
        return Invalid("block_tables[", s, "][", b, "] = ", table[b], " out of range [0, ",
                       layout.num_blocks, ")");
      }
    }
  }
  return absl::OkStatus();
}

// The entry points' shared body: checks, the plan (k_base or k_codes set by the caller), items.
absl::Status Run(Plan plan, const KvCacheLayout& layout, const void* data, int64_t layer,
                 int64_t num_q_heads, const AttentionBatch& batch, const AttentionParams& params,
                 ThreadPool* pool) {
  RETURN_IF_ERROR(ValidateParams(num_q_heads, layout, data, layer, batch, params));
  RETURN_IF_ERROR(ValidateBatch(batch, layout, params));
  const int64_t num_tokens = batch.num_seqs == 0 ? 0 : batch.query_start_loc[batch.num_seqs];
  if (num_tokens == 0) return absl::OkStatus();
  if (plan.q == nullptr || plan.out == nullptr) return Invalid("q and out must be non-null");

  plan.block_elems = layout.BlockElems();
  plan.tile_elems = layout.TileElems();
  plan.block_size = layout.block_size;
  plan.num_kv_heads = layout.num_kv_heads;
  plan.num_q_heads = num_q_heads;
  plan.head_dim = layout.head_dim;
  plan.group = num_q_heads / layout.num_kv_heads;
  plan.tile_tokens = std::max<int64_t>(1, kTargetRows / plan.group);
  plan.batch = batch;
  plan.params = params;

  std::vector<WorkItem> items;
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int64_t q_len = batch.query_start_loc[s + 1] - batch.query_start_loc[s];
    const int64_t seq_len = batch.seq_lens[s];
    for (int64_t q_begin = 0; q_begin < q_len; q_begin += plan.tile_tokens) {
      const int64_t q_end = std::min(q_len, q_begin + plan.tile_tokens);
      // Keys seen by the tile: from its first token's first to its last token's last.
      const int64_t keys = VisibleKeys(seq_len - q_len + q_end - 1, params).hi -
                           VisibleKeys(seq_len - q_len + q_begin, params).lo;
      for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
        items.push_back({s, h, q_begin, q_end, (q_end - q_begin) * plan.group * keys});
      }
    }
  }

  std::atomic<int64_t> next{0};
  const int64_t num_workers =
      pool == nullptr ? 1 : std::min<int64_t>(pool->num_threads(), items.size());
  if (num_workers <= 1) {
    RunItems(plan, items, next);
    return absl::OkStatus();
  }
  // Largest items first, handed out one at a time: sequences differ wildly in length, so a
  // static split would leave threads idle.
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  pool->ParallelFor(num_workers, [&](int64_t, int64_t) { RunItems(plan, items, next); });
  return absl::OkStatus();
}

}  // namespace

absl::Status PagedAttention(const float* q, int64_t num_q_heads, KvCacheView cache, int64_t layer,
                            const AttentionBatch& batch, const AttentionParams& params, float* out,
                            float* lse, ThreadPool* pool) {
  Plan plan;
  plan.q = q;
  plan.out = out;
  plan.lse = lse;
  if (cache.data != nullptr && layer >= 0 && layer < cache.layout.num_layers) {
    plan.k_base = cache.data + cache.layout.TileOffset(0, layer, 0);
  }
  return Run(plan, cache.layout, cache.data, layer, num_q_heads, batch, params, pool);
}

absl::Status PagedAttention(const float* q, int64_t num_q_heads, Fp8KvCacheView cache,
                            int64_t layer, const AttentionBatch& batch,
                            const AttentionParams& params, float* out, float* lse,
                            ThreadPool* pool) {
  for (float scale : {cache.k_scale, cache.v_scale}) {
    if (!std::isfinite(scale) || scale <= 0) {
      return Invalid("FP8 pool scales must be finite and > 0, got ", scale);
    }
  }
  Plan plan;
  plan.q = q;
  plan.out = out;
  plan.lse = lse;
  if (cache.data != nullptr && layer >= 0 && layer < cache.layout.num_layers) {
    plan.k_codes = cache.data + cache.layout.TileOffset(0, layer, 0);
  }
  plan.k_scale = cache.k_scale;
  plan.v_scale = cache.v_scale;
  return Run(plan, cache.layout, cache.data, layer, num_q_heads, batch, params, pool);
}

}  // namespace tandem::kernels::cpu
