// The wire of UcxAgent's source-side gather (kvtransfer/ucx/DESIGN.md,
// "Gathers at the source"): UCX has no strided GET, so a reader that does not map the source's
// memory (another host: TCP, RDMA) sends one active message per request naming the source's rows,
// the source copies them into one contiguous buffer and answers with it. Only the kept bytes cross
// the wire, one message each way per request of up to max_request_bytes.
//
// Both messages are fixed-size active-message headers (host byte order: the two ends run the same
// build). The source trusts nothing in a request: ParseGatherRequest bounds it by its own regions,
// and the request must carry the source's gather key (random, kGatherKeyBytes, sent in the source's
// handshake, which only the authenticated control plane hands out, like the rkeys of its GETs);
// the key is compared in constant time, and a request without it is refused before any byte of the
// pool is read.
#ifndef TANDEM_KVTRANSFER_UCX_UCX_GATHER_WIRE_H_
#define TANDEM_KVTRANSFER_UCX_UCX_GATHER_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tandem/v1/limits.h"

namespace tandem::kvtransfer {

// Active-message ids (UCX indexes its handler table by id: keep them small).
inline constexpr unsigned kGatherRequestAmId = 1;
inline constexpr unsigned kGatherReplyAmId = 2;
inline constexpr uint32_t kGatherWireVersion = 2;
inline constexpr size_t kGatherKeyBytes = tandem::v1::kUcxGatherKeyBytes;
// One request gathers at most this much (a reader's requests are max_request_bytes, 4 MiB by
// default): bounds what one message can make the source allocate.
inline constexpr uint64_t kMaxGatherBytes = uint64_t{64} << 20;

// Reader -> source: gather `rows` rows of `row_bytes`, `stride` apart, from `offset` of the
// source's region `region`, and answer `token`.
struct GatherRequest {
  uint32_t version = kGatherWireVersion;
  uint32_t region = 0;
  uint64_t token = 0;
  uint64_t offset = 0;
  uint64_t stride = 0;
  uint64_t row_bytes = 0;
  uint64_t rows = 0;
  uint8_t key[kGatherKeyBytes] = {};  // the source's TransferHandshake.ucx_gather_key
};
static_assert(sizeof(GatherRequest) == 64);

// Source -> reader: the answer to `token`; `code` is an absl::StatusCode. OK: the message's data
// is the rows packed (rows * row_bytes bytes); otherwise no data, and `reason` says why.
struct GatherReply {
  uint64_t token = 0;
  int32_t code = 0;
  uint32_t reserved = 0;
  char reason[112] = {};  // NUL-terminated
};
static_assert(sizeof(GatherReply) == 128);

// Parses and checks a request header against the source's key and region sizes: exact size and
// version, the key (PERMISSION_DENIED, checked first, in constant time), at least one row of at
// least one byte, at most kMaxGatherBytes in all, a stride no shorter than a row, every row
// inside the region (no overflow). INVALID_ARGUMENT / OUT_OF_RANGE naming the problem.
absl::StatusOr<GatherRequest> ParseGatherRequest(const void* header, size_t header_length,
                                                 absl::string_view key,
                                                 absl::Span<const uint64_t> region_bytes);

// A fresh random gather key (kGatherKeyBytes, from the OS's CSPRNG).
absl::StatusOr<std::string> NewGatherKey();

// A reply carrying `status` (its message cut to fit) for `token`.
GatherReply MakeGatherReply(uint64_t token, const absl::Status& status);

// The status a reply carries (OK, or its code and reason); INTERNAL for a malformed code.
absl::Status GatherReplyStatus(const GatherReply& reply);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_UCX_UCX_GATHER_WIRE_H_
