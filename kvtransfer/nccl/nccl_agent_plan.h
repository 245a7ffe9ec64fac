// How NcclAgent (kvtransfer/nccl/nccl_agent.h) turns one READ's ops into NCCL messages. Pure CPU
// code: the reader and the source each compute the same plan from the op lengths and the negotiated
// PlanParams, so their ncclSend / ncclRecv sequences match message for message.
//
// The transfer is a byte stream: op 0's bytes, then op 1's, ... (ops as the reader posted them,
// coalesced). An op is `rows` rows of `row_bytes` (OpShape; a contiguous op is one row); each
// side places row i of an op at its own address + i * its own stride (OpPlace), so a strided op
// moves a head slice of KV blocks between tensor-parallel splits (kvtransfer/reshard.h) inside
// the gather / scatter. The stream is cut into messages:
//  * a one-row op of at least `direct_min_bytes` is one message of its own (contiguous on both
//    sides, so it goes straight from the source pool into the reader pool);
//  * the other ops (strided ones always) are packed, in order, into messages of exactly
//    `chunk_bytes` (the last one of a run of packed ops is shorter); an op may straddle two
//    messages, a message boundary may cut a row.
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

// One op: `rows` rows of `row_bytes` bytes, in the stream one after the other.
struct OpShape {
  uint64_t row_bytes = 0;
  uint64_t rows = 1;
};

// Where one side keeps an op: row i at addr + i * stride (stride >= row_bytes; ignored for one
// row). A device address in the agent.
struct OpPlace {
  uint64_t addr = 0;
  uint64_t stride = 0;
};

// `bytes` of op `op` starting `op_offset` bytes into it (stream bytes: row op_offset / row_bytes,
// column op_offset % row_bytes).
struct Piece {
  uint32_t op = 0;
  uint64_t op_offset = 0;
  uint64_t bytes = 0;
};

// One ncclSend/ncclRecv: pieces [first_piece, first_piece + num_pieces) of Plan::pieces, in
// stream order; `bytes` is their sum. `direct`: one whole one-row op of at least
// direct_min_bytes (contiguous on both sides). Both sides see the same flags, so they can batch
// runs of direct messages into the same NCCL groups.
struct Message {
  uint64_t bytes = 0;
  uint32_t first_piece = 0;
  uint32_t num_pieces = 0;
  bool direct = false;
};

struct Plan {
  std::vector<OpShape> ops;
  std::vector<Message> messages;
  std::vector<Piece> pieces;
  uint64_t max_packed_bytes = 0;  // largest message that holds more than one piece
};

// INVALID_ARGUMENT for no ops, an op of zero rows or row bytes, an op of 2^63 bytes or more,
// or zero params.
absl::StatusOr<Plan> MakePlan(absl::Span<const OpShape> ops, const PlanParams& params);

// The packed-message size a reader asks for when a transfer of `transfer_bytes` is alone on its
// connection (nothing else posted or running): about an eighth of the transfer, rounded up to a
// MiB, within [min(min_chunk, max_chunk), max_chunk], so its gather, NCCL messages and scatter
// overlap inside it. Returns max_chunk when min_chunk is 0 (off).
uint64_t LoneTransferChunk(uint64_t transfer_bytes, uint64_t max_chunk, uint64_t min_chunk);

// op_place[i]: where op i lives on one side. Returns the address of the message's first byte
// when all its bytes follow each other in that memory, else nullopt.
std::optional<uint64_t> ContiguousAddress(const Plan& plan, const Message& message,
                                          absl::Span<const OpPlace> op_place);

// Copy `rows` rows of `bytes` bytes, row i from src + i * src_pitch to dst + i * dst_pitch
// (device addresses in the agent; the kernel is nccl_agent_copy.h). One row: the pitches are
// unused. 48 bytes, laid out for the device.
struct CopyTile {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t bytes = 0;
  uint64_t rows = 1;
  uint64_t src_pitch = 0;
  uint64_t dst_pitch = 0;
};

enum class Direction {
  kGather,   // pieces (at op_addr) -> packed staging buffer
  kScatter,  // packed staging buffer -> pieces
};

// Appends tiles that move `message`'s pieces between their places (op_place, as above) and a
// packed buffer at `staging` (piece k at the sum of the earlier pieces' bytes). Tiles never
// cross a piece boundary. A piece contiguous at its place becomes one-row tiles of at most
// `max_tile_bytes`; a strided one a partial first row, tiles of whole rows (at most
// max(1, max_tile_bytes / row_bytes) rows each; pitch row_bytes on the packed side) and a
// partial last row.
void AppendTiles(const Plan& plan, const Message& message, absl::Span<const OpPlace> op_place,
                 uint64_t staging, Direction direction, uint64_t max_tile_bytes,
                 std::vector<CopyTile>* out);

}  // namespace tandem::kvtransfer::nccl_plan

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_PLAN_H_
