// How NcclAgent (kvtransfer/nccl/nccl_agent.h) turns one READ's ops into NCCL messages. Pure CPU
// code: the reader and the source each compute the same plan from the op lengths and the negotiated
// PlanParams, so their ncclSend / ncclRecv sequences match message for message.
//
// The transfer is a byte stream: op 0's bytes, then op 1's, ... (ops as the reader posted them,
// coalesced). The stream is cut into messages:
//  * an op of at least `direct_min_bytes` is one message of its own (always contiguous on both
//    sides, so it goes straight from the source pool into the reader pool);
//  * the other ops are packed, in order, into messages of exactly `chunk_bytes` (the last one of
//    a run of packed ops is shorter); an op may straddle two messages.
// Each side then decides alone how to feed a message: if its pieces are adjacent in that side's
// memory (ContiguousAddress) NCCL reads / writes the pool directly, otherwise the side copies
// the pieces through a staging buffer with a gather (source) or scatter (reader) kernel driven
// by CopyTiles (AppendTiles). Only the message sizes must agree, not the staging decisions.
//
// Thread safety: all functions are pure.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_PLAN_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::kvtransfer::nccl_plan {

struct PlanParams {
  uint64_t chunk_bytes = 0;       // largest packed message; > 0
  uint64_t direct_min_bytes = 0;  // ops this long or longer get their own message; > 0
};

// `bytes` of op `op` starting `op_offset` bytes into it.
struct Piece {
  uint32_t op = 0;
  uint64_t op_offset = 0;
  uint64_t bytes = 0;
};

// One ncclSend/ncclRecv: pieces [first_piece, first_piece + num_pieces) of Plan::pieces, in
// stream order; `bytes` is their sum. `direct`: one whole op of at least direct_min_bytes
// (contiguous on both sides). Both sides see the same flags, so they can batch runs of direct
// messages into the same NCCL groups.
struct Message {
  uint64_t bytes = 0;
  uint32_t first_piece = 0;
  uint32_t num_pieces = 0;
  bool direct = false;
};

struct Plan {
  std::vector<Message> messages;
  std::vector<Piece> pieces;
  uint64_t max_packed_bytes = 0;  // largest message that holds more than one piece
};

// INVALID_ARGUMENT for no ops, a zero-length op, or zero params.
absl::StatusOr<Plan> MakePlan(absl::Span<const uint64_t> op_bytes, const PlanParams& params);

// The packed-message size a reader asks for when a transfer of `transfer_bytes` is alone on its
// connection (nothing else posted or running): about an eighth of the transfer, rounded up to a
// MiB, within [min(min_chunk, max_chunk), max_chunk], so its gather, NCCL messages and scatter
// overlap inside it. Returns max_chunk when min_chunk is 0 (off).
uint64_t LoneTransferChunk(uint64_t transfer_bytes, uint64_t max_chunk, uint64_t min_chunk);

// op_addr[i]: the address of op i's first byte on one side. Returns the address of the
// message's first byte when its pieces follow each other in that memory, else nullopt.
std::optional<uint64_t> ContiguousAddress(const Plan& plan, const Message& message,
                                          absl::Span<const uint64_t> op_addr);

// Copy `bytes` bytes from address `src` to address `dst` (device addresses in the agent; the
// kernel is nccl_agent_copy.h). 24 bytes, laid out for the device.
struct CopyTile {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
};

enum class Direction {
  kGather,   // pieces (at op_addr) -> packed staging buffer
  kScatter,  // packed staging buffer -> pieces
};

// Appends tiles of at most `max_tile_bytes` that move `message`'s pieces between their places
// (op_addr, as above) and a packed buffer at `staging` (piece k at the sum of the earlier
// pieces' bytes). Tiles never cross a piece boundary.
void AppendTiles(const Plan& plan, const Message& message, absl::Span<const uint64_t> op_addr,
                 uint64_t staging, Direction direction, uint64_t max_tile_bytes,
                 std::vector<CopyTile>* out);

}  // namespace tandem::kvtransfer::nccl_plan

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_PLAN_H_
