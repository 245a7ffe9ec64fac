#include "kvtransfer/ucx/ucx_gather_wire.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer {

absl::StatusOr<GatherRequest> ParseGatherRequest(const void* header, size_t header_length,
                                                 absl::string_view key,
                                                 absl::Span<const uint64_t> region_bytes) {
  if (header == nullptr || header_length != sizeof(GatherRequest)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather request of ", header_length, " bytes, want ", sizeof(GatherRequest)));
  }
  GatherRequest request;
  std::memcpy(&request, header, sizeof(request));
  // The key first: nothing else of an unauthenticated request is looked at.
  if (key.size() != kGatherKeyBytes ||
      CRYPTO_memcmp(request.key, key.data(), kGatherKeyBytes) != 0) {
    return absl::PermissionDeniedError("gather request without this source's gather key");
  }
  if (request.version != kGatherWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat("gather request version ", request.version,
                                                   ", this source speaks ", kGatherWireVersion));
  }
  if (request.rows == 0 || request.row_bytes == 0 ||
      request.rows > kMaxGatherBytes / request.row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("gather request of ", request.rows, " rows of ",
                                                   request.row_bytes, " bytes: want 1 to ",
                                                   kMaxGatherBytes, " bytes in all"));
  }
  // The rows as a strided copy op whose local side is the packed answer.
  const StridedCopyOp op{.local_region = 0,
                         .local_offset = 0,
                         .local_stride = request.row_bytes,
                         .remote_region = request.region,
                         .remote_offset = request.offset,
                         .remote_stride = request.stride,
                         .row_bytes = request.row_bytes,
                         .rows = request.rows};
  const uint64_t packed = request.rows * request.row_bytes;
  if (absl::Status s = ValidateStridedCopyOps({op}, {packed}, region_bytes); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("gather request: ", s.message()));
  }
  return request;
}

absl::StatusOr<std::string> NewGatherKey() {
  std::string key(kGatherKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1) {
    return absl::InternalError("RAND_bytes failed: no gather key");
  }
  return key;
}

GatherReply MakeGatherReply(uint64_t token, const absl::Status& status) {
  GatherReply reply;
  reply.token = token;
  reply.code = static_cast<int32_t>(status.code());
  const size_t n = std::min(status.message().size(), sizeof(reply.reason) - 1);
  std::memcpy(reply.reason, status.message().data(), n);
  reply.reason[n] = '\0';
  return reply;
}

absl::Status GatherReplyStatus(const GatherReply& reply) {
  if (reply.code == 0) return absl::OkStatus();
  if (reply.code < 0 || reply.code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("gather reply with status code ", reply.code));
  }
  const size_t n = strnlen(reply.reason, sizeof(reply.reason));
  return absl::Status(static_cast<absl::StatusCode>(reply.code),
                      absl::StrCat("KV source: ", std::string(reply.reason, n)));
}

}  // namespace tandem::kvtransfer
