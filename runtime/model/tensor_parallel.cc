#include "runtime/model/tensor_parallel.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {

absl::StatusOr<TpDims> ComputeTpDims(const ModelConfig& c, TpShard shard) {
  const int64_t n = shard.size;
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--tp must be >= 1, got ", n));
  if (shard.rank < 0 || shard.rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", shard.rank, " is outside the group of ", n, " ranks"));
  }
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  if (hq % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp=", n, " does not divide the model's ", hq, " attention heads"));
  }
  if (hkv % n != 0 && n % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp=", n, " and the model's ", hkv,
        " KV heads: the KV heads must be divisible by tp (split) or divide it (replicated)"));
  }
  if (c.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp=", n, " does not divide the model's ",
                                                   "intermediate size ", c.intermediate_size));
  }
  const int64_t r = shard.rank;
  TpDims d;
  d.shard = shard;
  d.q_heads = hq / n;
  d.q_head_begin = r * d.q_heads;
  d.kv_replicated = hkv < n;
  d.kv_heads = d.kv_replicated ? 1 : hkv / n;
  d.kv_head_begin = d.kv_replicated ? r / (n / hkv) : r * d.kv_heads;
  d.intermediate = c.intermediate_size / n;
  d.intermediate_begin = r * d.intermediate;
  d.vocab_rows = (c.vocab_size + n - 1) / n;
  d.vocab_begin = r * d.vocab_rows;
  d.adds_row_parallel_bias = r == 0;
  return d;
}

absl::StatusOr<ModelConfig> LocalModelConfig(const ModelConfig& config, TpShard shard) {
  ASSIGN_OR_RETURN(TpDims d, ComputeTpDims(config, shard));
  ModelConfig local = config;
  local.num_attention_heads = d.q_heads;
  local.num_key_value_heads = d.kv_heads;
  local.intermediate_size = d.intermediate;
  return local;
}

std::string DescribeTp(const ModelConfig& c, int tp) {
  absl::StatusOr<TpDims> d = ComputeTpDims(c, TpShard{0, tp});
  if (!d.ok()) return std::string(d.status().message());
  std::string kv = d->kv_replicated ? absl::StrCat(" (KV heads replicated on ",
                                                   tp / c.num_key_value_heads, " ranks each)")
                                    : "";
  return absl::StrCat("tp=", tp, ": ", d->q_heads, " of ", c.num_attention_heads,
                      " query heads and ", d->kv_heads, " of ", c.num_key_value_heads,
                      " KV heads per rank", kv, ", intermediate ", d->intermediate, " of ",
                      c.intermediate_size, ", vocab rows ", d->vocab_rows, " of ", c.vocab_size);
}

}  // namespace tandem::runtime
