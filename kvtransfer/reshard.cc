#include "kvtransfer/reshard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer {
namespace {

absl::Status CheckSlice(const BlockShape& shape, int64_t pool_blocks,
                        absl::Span<const int32_t> blocks, int local_head_begin, int head_count,
                        int64_t staging_bytes) {
  if (shape.num_layers <= 0 || shape.block_size <= 0 || shape.num_kv_heads <= 0 ||
      shape.head_bytes <= 0) {
    return absl::InvalidArgumentError("reshard: empty pool shape");
  }
  if (head_count <= 0 || local_head_begin < 0 ||
      local_head_begin + head_count > shape.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: heads [", local_head_begin, ", ",
                                                   local_head_begin + head_count,
                                                   ") outside the pool's ", shape.num_kv_heads));
  }
  for (int32_t b : blocks) {
    if (b < 0 || b >= pool_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshard: block ", b, " outside the pool of ", pool_blocks));
    }
  }
  const int64_t want = StagingBytes(shape, static_cast<int64_t>(blocks.size()), head_count);
  if (staging_bytes != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: staging of ", staging_bytes, " bytes, the slice needs ", want));
  }
  return absl::OkStatus();
}

// Calls copy(pool_offset, staging_offset, bytes) for every contiguous run of the slice.
template <typename Copy>
void ForEachRun(const BlockShape& shape, absl::Span<const int32_t> blocks, int local_head_begin,
                int head_count, Copy copy) {
  const int64_t row = shape.num_kv_heads * shape.head_bytes;  // one token's heads in the pool
  const int64_t run = head_count * shape.head_bytes;
  const int64_t rows_per_block = shape.num_layers * 2 * shape.block_size;
  int64_t staged = 0;
  for (int32_t b : blocks) {
    const int64_t base = b * shape.BlockBytes() + local_head_begin * shape.head_bytes;
    for (int64_t r = 0; r < rows_per_block; ++r) {
      copy(base + r * row, staged, run);
      staged += run;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<ReshardPiece>> PlanReshard(absl::Span<const RankHeads> src,
                                                      RankHeads dst, int dst_rank) {
  std::vector<ReshardPiece> pieces;
  for (int h = dst.head_begin; h < dst.head_begin + dst.head_count; ++h) {
    std::vector<int> holders;
    for (int r = 0; r < static_cast<int>(src.size()); ++r) {
      if (h >= src[r].head_begin && h < src[r].head_begin + src[r].head_count) {
        holders.push_back(r);
      }
    }
    if (holders.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reshard: KV head ", h, " is held by none of the ", src.size(), " source ranks"));
    }
    const int r = holders[dst_rank % holders.size()];
    if (!pieces.empty() && pieces.back().src_rank == r &&
        pieces.back().head_begin + pieces.back().head_count == h) {
      ++pieces.back().head_count;
    } else {
      pieces.push_back({r, h, 1});
    }
  }
  return pieces;
}

bool IsDirect(const ReshardPiece& piece, const RankHeads& src, const RankHeads& dst) {
  return piece.head_begin == src.head_begin && piece.head_count == src.head_count &&
         piece.head_begin == dst.head_begin && piece.head_count == dst.head_count;
}

int64_t StagingBytes(const BlockShape& shape, int64_t num_blocks, int head_count) {
  return num_blocks * shape.num_layers * 2 * shape.block_size * head_count * shape.head_bytes;
}

absl::Status GatherHeads(const char* pool, const BlockShape& shape, int64_t pool_blocks,
                         absl::Span<const int32_t> blocks, int local_head_begin, int head_count,
                         char* staging, int64_t staging_bytes) {
  absl::Status s =
      CheckSlice(shape, pool_blocks, blocks, local_head_begin, head_count, staging_bytes);
  if (!s.ok()) return s;
  ForEachRun(shape, blocks, local_head_begin, head_count,
             [&](int64_t pool_at, int64_t staged_at, int64_t bytes) {
               std::memcpy(staging + staged_at, pool + pool_at, bytes);
             });
  return absl::OkStatus();
}

absl::Status ScatterHeads(const char* staging, int64_t staging_bytes, char* pool,
                          const BlockShape& shape, int64_t pool_blocks,
                          absl::Span<const int32_t> blocks, int local_head_begin, int head_count) {
  absl::Status s =
      CheckSlice(shape, pool_blocks, blocks, local_head_begin, head_count, staging_bytes);
  if (!s.ok()) return s;
  ForEachRun(shape, blocks, local_head_begin, head_count,
             [&](int64_t pool_at, int64_t staged_at, int64_t bytes) {
               std::memcpy(pool + pool_at, staging + staged_at, bytes);
             });
  return absl::OkStatus();
}

std::vector<StridedCopyOp> StridedHeadOps(absl::Span<const std::pair<int32_t, int32_t>> blocks,
                                          const BlockShape& src, int src_local_head,
                                          const BlockShape& dst, int dst_local_head, int head_count,
                                          uint32_t local_region, uint32_t remote_region) {
  const uint64_t rows = static_cast<uint64_t>(src.num_layers * 2 * src.block_size);
  std::vector<StridedCopyOp> ops;
  ops.reserve(blocks.size());
  for (const auto& [from, to] : blocks) {
    ops.push_back(StridedCopyOp{
        .local_region = local_region,
        .local_offset =
            static_cast<uint64_t>(to * dst.BlockBytes() + dst_local_head * dst.head_bytes),
        .local_stride = static_cast<uint64_t>(dst.num_kv_heads * dst.head_bytes),
        .remote_region = remote_region,
        .remote_offset =
            static_cast<uint64_t>(from * src.BlockBytes() + src_local_head * src.head_bytes),
        .remote_stride = static_cast<uint64_t>(src.num_kv_heads * src.head_bytes),
        .row_bytes = static_cast<uint64_t>(head_count * src.head_bytes),
        .rows = rows});
  }
  return CoalesceStridedCopyOps(ops);
}

}  // namespace tandem::kvtransfer
