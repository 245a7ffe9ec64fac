// Control-socket wire format of NcclAgent (kvtransfer/nccl/nccl_agent.h). Pure CPU code, so it is
// built and tested in CPU-only builds too.
//
// Every message is a frame: [u32 type][u32 payload_bytes][payload], little-endian.
//   kChallenge source -> reader, first on every accepted connection: kChallengeBytes random
//             bytes (nccl_agent_auth.h).
//   kHello    reader -> source, once, after the challenge: u32 credential_bytes, the credential
//             (proof that the reader holds an access token the source issued in a handshake,
//             bound to this challenge: nccl_auth::Prove; 0 bytes without a token), then the
//             128-byte ncclUniqueIds of the pair's communicators, 1 or 2 (reader = rank 0,
//             source = rank 1). The source reads at most kMaxHelloBytes of it and checks the
//             credential before anything else. Both then join them (non-blocking init
//             with a deadline) and exchange one warm-up message on each: rank 1 ncclSends 1 byte
//             (ncclInt8) to rank 0, so NCCL's lazy p2p connection setup also happens under that
//             deadline. NCCL call k of the pair (nccl_agent_link.h) uses communicator k % count.
//   kRead     reader -> source: u64 transfer id, u64 chunk_bytes, u64 direct_min_bytes (the
//             reader's nccl_plan::PlanParams), u32 op count, then per op (u32 remote_region,
//             u64 remote_offset, u64 row_bytes, u64 rows, u64 remote_stride): a StridedCopyOp,
//             a contiguous CopyOp being one row. Only the source's side of each op travels;
//             the reader keeps its local side. The reader may send further kReads before the
//             ack.
//   kReadAck  source -> reader: u64 transfer id, u64 chunk_bytes the source chose (<= the
//             reader's), u32 absl::StatusCode, then the message bytes. OK means the source has
//             queued the transfer's ncclSends: the messages of nccl_plan::MakePlan(op shapes,
//             {chunk_bytes of the ack, direct_min_bytes of the kRead}), in order, behind those of
//             earlier acked kReads. Acks come in kRead order.
//
// Thread safety: all functions are pure.
#ifndef TANDEM_KVTRANSFER_NCCL_AGENT_WIRE_H_
#define TANDEM_KVTRANSFER_NCCL_AGENT_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvtransfer/nccl/nccl_agent_plan.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer::nccl_wire {

enum class MessageType : uint32_t { kHello = 1, kRead = 2, kReadAck = 3, kChallenge = 4 };

inline constexpr size_t kFrameHeaderBytes = 8;
inline constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)
// Bounds what a peer can make us allocate: 1M ops (36 MiB payload).
inline constexpr uint32_t kMaxOpsPerRead = 1u << 20;
inline constexpr size_t kReadHeaderBytes = 8 + 8 + 8 + 4;
inline constexpr size_t kReadOpBytes = 4 + 8 + 8 + 8 + 8;
inline constexpr uint32_t kMaxPayloadBytes = kReadHeaderBytes + kMaxOpsPerRead * kReadOpBytes;
inline constexpr size_t kChallengeBytes = 32;
inline constexpr size_t kMaxHelloTokenBytes = 256;  // credential; tandem::v1::kMaxAccessTokenBytes
inline constexpr uint32_t kMaxHelloBytes = 4 + kMaxHelloTokenBytes + 2 * kUniqueIdBytes;

// Frame header for `type` with `payload_bytes` following it.
std::string EncodeHeader(MessageType type, uint32_t payload_bytes);
// Parses a kFrameHeaderBytes header. INVALID_ARGUMENT for an unknown type or a payload larger
// than kMaxPayloadBytes.
absl::Status DecodeHeader(absl::string_view header, MessageType* type, uint32_t* payload_bytes);

struct Hello {
  std::string credential;  // nccl_auth::Prove's
  std::string unique_ids;  // 1 or 2 x kUniqueIdBytes
};
// Payload of kHello. INVALID_ARGUMENT for a credential over kMaxHelloTokenBytes or unique ids
// that are not 1 or 2 ids.
absl::StatusOr<std::string> EncodeHello(absl::string_view credential, absl::string_view unique_ids);
// INVALID_ARGUMENT for a truncated payload, a credential over kMaxHelloTokenBytes, or unique ids
// that are not 1 or 2 ids.
absl::StatusOr<Hello> DecodeHello(absl::string_view payload);

struct ReadRequest {
  uint64_t id = 0;
  nccl_plan::PlanParams params;
  std::vector<StridedCopyOp> ops;  // local_* fields are zero after decoding
};
// Payload of kRead (no header). INVALID_ARGUMENT for no ops, more than kMaxOpsPerRead, or a zero
// param.
absl::StatusOr<std::string> EncodeReadRequest(uint64_t id, const nccl_plan::PlanParams& params,
                                              absl::Span<const StridedCopyOp> ops);
// INVALID_ARGUMENT for a truncated or oversized payload, a count that does not match, or a zero
// param. (The ops' geometry is checked by ValidateSourceRanges.)
absl::StatusOr<ReadRequest> DecodeReadRequest(absl::string_view payload);

struct ReadAck {
  uint64_t id = 0;
  uint64_t chunk_bytes = 0;
  absl::Status verdict;  // the source's
};
// Payload of kReadAck.
std::string EncodeReadAck(const ReadAck& ack);
// INVALID_ARGUMENT when the payload does not parse (truncated, unknown status code, zero chunk
// with an OK verdict).
absl::StatusOr<ReadAck> DecodeReadAck(absl::string_view payload);

// Checks the source's side of each op against the source's regions (ValidateStridedCopyOps):
// INVALID_ARGUMENT for no ops, zero rows or row bytes, a stride below the row; OUT_OF_RANGE for
// an unknown region or a last row past its end.
absl::Status ValidateSourceRanges(absl::Span<const StridedCopyOp> ops,
                                  absl::Span<const uint64_t> region_bytes);

// "host:port" <-> parts. INVALID_ARGUMENT for a missing colon, empty host or bad port.
std::string FormatAddress(absl::string_view host, int port);
absl::Status ParseAddress(absl::string_view address, std::string* host, int* port);

}  // namespace tandem::kvtransfer::nccl_wire

#endif  // TANDEM_KVTRANSFER_NCCL_AGENT_WIRE_H_
