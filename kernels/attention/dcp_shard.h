// Decode context parallelism (ARCHITECTURE.md, "Decode context parallelism"): where a request's
// tokens live when its KV is spread over dcp_size ranks (KV shards).
//
// Tokens go to shards in units of `interleave` tokens, round robin, and keep their order within
// a shard: global position g lives on rank (g / I) % size at local index
// (g / (I * size)) * I + g % I, so local index j of rank k holds global position
//
//   g(j) = ((j / I) * size + k) * I + j % I.
//
// g is increasing in j, so the local keys a query at global position p sees (global keys
// [lo, p], lo = 0 or p - window_left) are one contiguous range of local indices:
// [DcpLocalCount(lo), DcpLocalCount(p + 1)).
//
// Header-only and constexpr, so the CUDA kernels use the same arithmetic on the device
// (nvcc --expt-relaxed-constexpr). Thread safety: plain values and pure functions.
#ifndef TANDEM_KERNELS_ATTENTION_DCP_SHARD_H_
#define TANDEM_KERNELS_ATTENTION_DCP_SHARD_H_

#include <cstdint>

namespace tandem::kernels {

// This rank's place in the decode context parallel group. size 1 (the default) means no context
// parallelism: the pool holds every token of a request at its global position.
struct DcpShard {
  int64_t size = 1;        // KVP, the number of KV shards
  int64_t rank = 0;        // k in [0, size)
  int64_t interleave = 1;  // I >= 1 consecutive tokens per unit (usually the block size)
};

// size >= 1, rank in [0, size), interleave >= 1 and size * interleave <= 2^30 (so positions stay
// in 32-bit range on the device).
constexpr bool DcpShardValid(const DcpShard& dcp) {
  return dcp.size >= 1 && dcp.size <= (int64_t{1} << 30) && dcp.interleave >= 1 &&
         dcp.interleave <= (int64_t{1} << 30) / dcp.size && dcp.rank >= 0 && dcp.rank < dcp.size;
}

// The KV shard of tensor-parallel rank `tp_rank` in a group with `dcp_size` shards: the group's
// ranks deal the shards round robin (rank r holds shard r % dcp_size; the ranks of one attention
// slice are contiguous). The one place this rule is written; every DcpShard is built from it.
constexpr int64_t DcpShardOfTpRank(int64_t tp_rank, int64_t dcp_size) { return tp_rank % dcp_size; }

// The rank holding global position g.
constexpr int64_t DcpRankOf(int64_t g, const DcpShard& dcp) {
  return (g / dcp.interleave) % dcp.size;
}

// Global position of local index j on dcp.rank.
constexpr int64_t DcpGlobalPos(int64_t j, const DcpShard& dcp) {
  return ((j / dcp.interleave) * dcp.size + dcp.rank) * dcp.interleave + j % dcp.interleave;
}

// Number of dcp.rank's tokens among global positions [0, global_end) (global_end >= 0): local
// indices [0, DcpLocalCount(x)) are exactly the local tokens with global position < x. The
// identity when size == 1. A request of global length L has DcpLocalCount(L) local tokens.
constexpr int64_t DcpLocalCount(int64_t global_end, const DcpShard& dcp) {
  const int64_t cycle = dcp.interleave * dcp.size;
  const int64_t in_cycle = global_end % cycle - dcp.rank * dcp.interleave;  // into this rank's unit
  const int64_t partial = in_cycle < 0 ? 0 : in_cycle > dcp.interleave ? dcp.interleave : in_cycle;
  return global_end / cycle * dcp.interleave + partial;
}

}  // namespace tandem::kernels

#endif  // TANDEM_KERNELS_ATTENTION_DCP_SHARD_H_
