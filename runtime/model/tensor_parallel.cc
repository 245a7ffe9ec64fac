#include "runtime/model/tensor_parallel.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::runtime {
namespace {

// Expert parallelism's placement for `shard` (tensor_parallel.h): the one given or the contiguous
// split. INVALID_ARGUMENT naming the numbers for a dense model, N not dividing the experts, or a
// given placement of another number of experts or ranks.
absl::StatusOr<std::shared_ptr<const ExpertPlacement>> ResolvePlacement(const ModelConfig& c,
                                                                        const TpShard& shard) {
  const int64_t n = shard.size;
  if (!c.IsMoe()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--enable_expert_parallel needs a mixture-of-experts model; ", c.architecture,
                     " has no experts (num_experts = 0)"));
  }
  if (shard.expert_placement != nullptr) {
    if (shard.expert_placement->num_experts() != c.num_experts ||
        shard.expert_placement->num_ranks() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert placement of ", shard.expert_placement->num_experts(),
                       " experts over ", shard.expert_placement->num_ranks(),
                       " ranks for a model of ", c.num_experts, " experts at --tp=", n));
    }
    return shard.expert_placement;
  }
  if (c.num_experts % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp=", n, " --enable_expert_parallel: the group's ", n,
                     " ranks do not divide the model's ", c.num_experts,
                     " experts (each rank holds num_experts / tp whole experts)"));
  }
  ASSIGN_OR_RETURN(ExpertPlacement placement, ExpertPlacement::Contiguous(c.num_experts, n));
  return std::make_shared<const ExpertPlacement>(std::move(placement));
}

// What every rank of N holds whatever the attention split: o_proj's input heads (H/N, after DCP's
// all-to-all or directly), the MLP's intermediate rows and the vocabulary rows. INVALID_ARGUMENT
// when the intermediate size does not split.
absl::StatusOr<TpDims> SplitNWays(const ModelConfig& c, TpShard shard) {
  const int64_t n = shard.size, r = shard.rank;
  if (c.intermediate_size % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp=", n, " does not divide the model's ",
                                                   "intermediate size ", c.intermediate_size));
  }
  std::shared_ptr<const ExpertPlacement> placement;
  if (shard.expert_parallel) {
    ASSIGN_OR_RETURN(placement, ResolvePlacement(c, shard));
  }
  for (auto [name, width] :
       {std::pair<const char*, int64_t>{"expert intermediate size",
                                        placement != nullptr ? 0 : c.moe_intermediate_size},
        {"shared expert intermediate size", c.shared_expert_intermediate_size}}) {
    if (c.IsMoe() && width % n != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tp=", n, " does not divide the model's ", name, " ", width));
    }
  }
  TpDims d;
  d.shard = shard;
  d.o_heads = c.num_attention_heads / n;
  d.o_head_begin = r * d.o_heads;
  d.intermediate = c.intermediate_size / n;
  d.intermediate_begin = r * d.intermediate;
  if (c.IsMoe()) {
    d.expert_placement = std::move(placement);  // EP: whole experts, the rank's own
    d.moe_intermediate = c.moe_intermediate_size / (d.expert_placement != nullptr ? 1 : n);
    d.moe_intermediate_begin = d.expert_placement != nullptr ? 0 : r * d.moe_intermediate;
    d.shared_intermediate = c.shared_expert_intermediate_size / n;
    d.shared_intermediate_begin = r * d.shared_intermediate;
  }
  d.vocab_rows = (c.vocab_size + n - 1) / n;
  d.vocab_begin = r * d.vocab_rows;
  d.adds_row_parallel_bias = r == 0;
  return d;
}

// ComputeTpDims for dp_attention (the header comment, "Wide expert parallelism"): the whole model
// on every rank but the routed experts, placed whole.
absl::StatusOr<TpDims> ComputeDpAttentionDims(const ModelConfig& c, TpShard shard) {
  if (!shard.expert_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dp_attention needs --enable_expert_parallel (--tp=", shard.size,
        " data-parallel attention ranks share the experts, placed whole); without it use --tp "
        "alone"));
  }
  if (shard.dcp > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dp_attention keeps each request's KV on one rank; --dcp=", shard.dcp,
                     " would split it over ", shard.dcp, " ranks (use one or the other)"));
  }
  TpDims d;
  ASSIGN_OR_RETURN(d.expert_placement, ResolvePlacement(c, shard));
  d.shard = shard;
  d.q_heads = d.o_heads = c.num_attention_heads;
  d.kv_heads = c.num_key_value_heads;
  d.intermediate = c.intermediate_size;
  d.moe_intermediate = c.moe_intermediate_size;
  d.shared_intermediate = c.shared_expert_intermediate_size;
  d.vocab_rows = c.vocab_size;
  d.adds_row_parallel_bias = true;
  return d;
}

// ComputeTpDims for dcp > 1 (the header comment): attention over TP_A = N / dcp slices.
absl::StatusOr<TpDims> ComputeDcpDims(const ModelConfig& c, TpShard shard) {
  const int64_t n = shard.size, kvp = shard.dcp;
  if (n % kvp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dcp=", kvp, " does not divide the group of --tp=", n, " ranks"));
  }
  const int64_t tp_a = n / kvp, hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  if (hkv % tp_a != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp=", n, " --dcp=", kvp, ": the attention split TP_A = tp / dcp = ", tp_a,
        " does not divide the model's ", hkv, " KV heads (DCP needs whole KV heads per rank)"));
  }
  if (hq % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp=", n, " --dcp=", kvp, ": the model's ", hq, " attention heads do not split over ", n,
        " ranks after the all-to-all (heads per rank = heads / tp)"));
  }
  const int64_t t = shard.rank / kvp;
  ASSIGN_OR_RETURN(TpDims d, SplitNWays(c, shard));
  d.q_heads = hq / tp_a;
  d.q_head_begin = t * d.q_heads;
  d.kv_heads = hkv / tp_a;
  d.kv_head_begin = t * d.kv_heads;
  return d;
}

}  // namespace

absl::StatusOr<TpDims> ComputeTpDims(const ModelConfig& c, TpShard shard) {
  const int64_t n = shard.size;
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--tp must be >= 1, got ", n));
  if (shard.dcp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--dcp must be >= 1, got ", shard.dcp));
  }
  if (shard.rank < 0 || shard.rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", shard.rank, " is outside the group of ", n, " ranks"));
  }
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  if (shard.dp_attention) return ComputeDpAttentionDims(c, shard);
  if (shard.dcp > 1) return ComputeDcpDims(c, shard);
  if (hq % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp=", n, " does not divide the model's ", hq, " attention heads"));
  }
  if (hkv % n != 0 && n % hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp=", n, " and the model's ", hkv,
        " KV heads: the KV heads must be divisible by tp (split) or divide it (replicated)"));
  }
  const int64_t r = shard.rank;
  ASSIGN_OR_RETURN(TpDims d, SplitNWays(c, shard));
  d.q_heads = hq / n;
  d.q_head_begin = r * d.q_heads;
  d.kv_replicated = hkv < n;
  d.kv_heads = d.kv_replicated ? 1 : hkv / n;
  d.kv_head_begin = d.kv_replicated ? r / (n / hkv) : r * d.kv_heads;
  return d;
}

absl::StatusOr<ModelConfig> LocalModelConfig(const ModelConfig& config, TpShard shard) {
  ASSIGN_OR_RETURN(TpDims d, ComputeTpDims(config, shard));
  ModelConfig local = config;
  local.num_attention_heads = d.q_heads;
  local.num_key_value_heads = d.kv_heads;
  local.intermediate_size = d.intermediate;
  local.moe_intermediate_size = d.moe_intermediate;
  local.shared_expert_intermediate_size = d.shared_intermediate;
  local.expert_placement = d.expert_placement;
  local.expert_rank = d.expert_placement != nullptr ? shard.rank : 0;
  local.dp_attention = shard.dp_attention;
  return local;
}

std::string DescribeTp(const ModelConfig& c, int tp, int dcp) {
  absl::StatusOr<TpDims> d = ComputeTpDims(c, TpShard{0, tp, dcp});
  if (!d.ok()) return std::string(d.status().message());
  if (dcp > 1) {
    return absl::StrCat("tp=", tp, " dcp=", dcp, ": ", tp / dcp, " attention slice(s) of ",
                        d->q_heads, " query / ", d->kv_heads, " KV heads, each over ", dcp,
                        " KV shards; o_proj ", d->o_heads, " heads, intermediate ", d->intermediate,
                        " of ", c.intermediate_size, ", vocab rows ", d->vocab_rows, " of ",
                        c.vocab_size, " per rank");
  }
  std::string kv = d->kv_replicated ? absl::StrCat(" (KV heads replicated on ",
                                                   tp / c.num_key_value_heads, " ranks each)")
                                    : "";
  return absl::StrCat("tp=", tp, ": ", d->q_heads, " of ", c.num_attention_heads,
                      " query heads and ", d->kv_heads, " of ", c.num_key_value_heads,
                      " KV heads per rank", kv, ", intermediate ", d->intermediate, " of ",
                      c.intermediate_size, ", vocab rows ", d->vocab_rows, " of ", c.vocab_size);
}

}  // namespace tandem::runtime
