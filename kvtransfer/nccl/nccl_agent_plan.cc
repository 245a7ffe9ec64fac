#include "kvtransfer/nccl/nccl_agent_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::nccl_plan {

uint64_t LoneTransferChunk(uint64_t transfer_bytes, uint64_t max_chunk, uint64_t min_chunk) {
  if (min_chunk == 0) return max_chunk;
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint64_t eighth = (transfer_bytes / 8 + kMiB - 1) / kMiB * kMiB;
  return std::clamp(eighth, std::min(min_chunk, max_chunk), max_chunk);
}

namespace {

// Where stream byte `offset` of op `shape` lies at `place`.
uint64_t AddressOf(const OpShape& shape, const OpPlace& place, uint64_t offset) {
  if (shape.rows == 1) return place.addr + offset;
  return place.addr + offset / shape.row_bytes * place.stride + offset % shape.row_bytes;
}

// Rows with gaps between them at `place`.
bool Strided(const OpShape& shape, const OpPlace& place) {
  return shape.rows > 1 && place.stride != shape.row_bytes;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(absl::Span<const OpShape> ops, const PlanParams& params) {
  if (ops.empty()) return absl::InvalidArgumentError("nccl plan: no ops");
  if (params.chunk_bytes == 0 || params.direct_min_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl plan: chunk_bytes ", params.chunk_bytes,
                                                   ", direct_min_bytes ", params.direct_min_bytes));
  }
  Plan plan;
  plan.ops.assign(ops.begin(), ops.end());
  Message open;  // the packed message being filled; bytes == 0: none
  auto close_open = [&] {
    if (open.bytes == 0) return;
    if (open.num_pieces > 1) plan.max_packed_bytes = std::max(plan.max_packed_bytes, open.bytes);
    plan.messages.push_back(open);
    open = Message{};
  };
  for (uint32_t op = 0; op < ops.size(); ++op) {
    const OpShape& shape = ops[op];
    if (shape.rows == 0 || shape.row_bytes == 0 ||
        shape.rows > (uint64_t{1} << 63) / shape.row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("nccl plan: op ", op, " of ", shape.rows,
                                                     " rows of ", shape.row_bytes, " bytes"));
    }
    const uint64_t len = shape.rows * shape.row_bytes;
    if (shape.rows == 1 && len >= params.direct_min_bytes) {
      close_open();
      plan.messages.push_back({len, static_cast<uint32_t>(plan.pieces.size()), 1, true});
      plan.pieces.push_back({op, 0, len});
      continue;
    }
    for (uint64_t done = 0; done < len;) {
      if (open.bytes == 0) open.first_piece = static_cast<uint32_t>(plan.pieces.size());
      const uint64_t take = std::min(len - done, params.chunk_bytes - open.bytes);
      plan.pieces.push_back({op, done, take});
      ++open.num_pieces;
      open.bytes += take;
      done += take;
      if (open.bytes == params.chunk_bytes) close_open();
    }
  }
  close_open();
  return plan;
}

std::optional<uint64_t> ContiguousAddress(const Plan& plan, const Message& message,
                                          absl::Span<const OpPlace> op_place) {
  uint64_t start = 0;
  uint64_t end = 0;
  for (uint32_t i = 0; i < message.num_pieces; ++i) {
    const Piece& p = plan.pieces[message.first_piece + i];
    const OpShape& shape = plan.ops[p.op];
    const OpPlace& place = op_place[p.op];
    if (Strided(shape, place) &&
        p.op_offset / shape.row_bytes != (p.op_offset + p.bytes - 1) / shape.row_bytes) {
      return std::nullopt;  // spans a gap between rows
    }
    const uint64_t at = AddressOf(shape, place, p.op_offset);
    if (i == 0) {
      start = at;
    } else if (at != end) {
      return std::nullopt;
    }
    end = at + p.bytes;
  }
  return start;
}

void AppendTiles(const Plan& plan, const Message& message, absl::Span<const OpPlace> op_place,
                 uint64_t staging, Direction direction, uint64_t max_tile_bytes,
                 std::vector<CopyTile>* out) {
  const bool gather = direction == Direction::kGather;
  // `rows` rows of `bytes`: at `at` (rows `pitch` apart) <-> packed at `packed`.
  auto tile = [&](uint64_t at, uint64_t packed, uint64_t bytes, uint64_t rows, uint64_t pitch) {
    if (rows == 1) {
      out->push_back(gather ? CopyTile{at, packed, bytes} : CopyTile{packed, at, bytes});
    } else if (gather) {
      out->push_back({at, packed, bytes, rows, pitch, bytes});
    } else {
      out->push_back({packed, at, bytes, rows, bytes, pitch});
    }
  };
  // Contiguous bytes, in tiles of at most max_tile_bytes.
  auto linear = [&](uint64_t at, uint64_t packed, uint64_t bytes) {
    for (uint64_t off = 0; off < bytes; off += max_tile_bytes) {
      tile(at + off, packed + off, std::min(max_tile_bytes, bytes - off), 1, 0);
    }
  };
  uint64_t packed = staging;
  for (uint32_t i = 0; i < message.num_pieces; ++i) {
    const Piece& p = plan.pieces[message.first_piece + i];
    const OpShape& shape = plan.ops[p.op];
    const OpPlace& place = op_place[p.op];
    if (!Strided(shape, place)) {
      linear(AddressOf(shape, place, p.op_offset), packed, p.bytes);
      packed += p.bytes;
      continue;
    }
    const uint64_t row = shape.row_bytes;
    uint64_t off = p.op_offset;
    const uint64_t end = p.op_offset + p.bytes;
    if (off % row != 0) {  // the rest of a row a message boundary cut
      const uint64_t n = std::min(end, (off / row + 1) * row) - off;
      linear(AddressOf(shape, place, off), packed, n);
      off += n;
      packed += n;
    }
    const uint64_t per_tile = std::max<uint64_t>(1, max_tile_bytes / row);
    for (uint64_t rows = (end - off) / row; rows > 0;) {
      const uint64_t n = std::min(rows, per_tile);
      if (n == 1) {
        linear(AddressOf(shape, place, off), packed, row);
      } else {
        tile(AddressOf(shape, place, off), packed, row, n, place.stride);
      }
      off += n * row;
      packed += n * row;
      rows -= n;
    }
    if (off < end) {  // the start of a row the next message carries on
      linear(AddressOf(shape, place, off), packed, end - off);
      packed += end - off;
    }
  }
}

}  // namespace tandem::kvtransfer::nccl_plan
