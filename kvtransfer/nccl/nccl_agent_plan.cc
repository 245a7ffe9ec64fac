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

absl::StatusOr<Plan> MakePlan(absl::Span<const uint64_t> op_bytes, const PlanParams& params) {
  if (op_bytes.empty()) return absl::InvalidArgumentError("nccl plan: no ops");
  if (params.chunk_bytes == 0 || params.direct_min_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl plan: chunk_bytes ", params.chunk_bytes,
                                                   ", direct_min_bytes ", params.direct_min_bytes));
  }
  Plan plan;
  Message open;  // the packed message being filled; bytes == 0: none
  auto close_open = [&] {
    if (open.bytes == 0) return;
    if (open.num_pieces > 1) plan.max_packed_bytes = std::max(plan.max_packed_bytes, open.bytes);
    plan.messages.push_back(open);
    open = Message{};
  };
  for (uint32_t op = 0; op < op_bytes.size(); ++op) {
    const uint64_t len = op_bytes[op];
    if (len == 0) return absl::InvalidArgumentError(absl::StrCat("nccl plan: op ", op, " empty"));
    if (len >= params.direct_min_bytes) {
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
                                          absl::Span<const uint64_t> op_addr) {
  const Piece* p = &plan.pieces[message.first_piece];
  const uint64_t start = op_addr[p->op] + p->op_offset;
  uint64_t end = start + p->bytes;
  for (uint32_t i = 1; i < message.num_pieces; ++i) {
    ++p;
    if (op_addr[p->op] + p->op_offset != end) return std::nullopt;
    end += p->bytes;
  }
  return start;
}

void AppendTiles(const Plan& plan, const Message& message, absl::Span<const uint64_t> op_addr,
                 uint64_t staging, Direction direction, uint64_t max_tile_bytes,
                 std::vector<CopyTile>* out) {
  uint64_t packed = staging;
  for (uint32_t i = 0; i < message.num_pieces; ++i) {
    const Piece& p = plan.pieces[message.first_piece + i];
    const uint64_t place = op_addr[p.op] + p.op_offset;
    for (uint64_t off = 0; off < p.bytes; off += max_tile_bytes) {
      const uint64_t n = std::min(max_tile_bytes, p.bytes - off);
      if (direction == Direction::kGather) {
        out->push_back({place + off, packed + off, n});
      } else {
        out->push_back({packed + off, place + off, n});
      }
    }
    packed += p.bytes;
  }
}

}  // namespace tandem::kvtransfer::nccl_plan
