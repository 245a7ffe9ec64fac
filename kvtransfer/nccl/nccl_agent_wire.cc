#include "kvtransfer/nccl/nccl_agent_wire.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/copy_ops.h"

namespace tandem::kvtransfer::nccl_wire {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(buf, sizeof(T));
}

// Reads a little-endian T at *pos; false when fewer than sizeof(T) bytes remain.
template <typename T>
bool Get(absl::string_view in, size_t* pos, T* v) {
  if (in.size() - *pos < sizeof(T)) return false;
  T r = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    r |= static_cast<T>(static_cast<unsigned char>(in[*pos + i])) << (8 * i);
  }
  *pos += sizeof(T);
  *v = r;
  return true;
}

}  // namespace

std::string EncodeHeader(MessageType type, uint32_t payload_bytes) {
  std::string out;
  Put(&out, static_cast<uint32_t>(type));
  Put(&out, payload_bytes);
  return out;
}

absl::Status DecodeHeader(absl::string_view header, MessageType* type, uint32_t* payload_bytes) {
  size_t pos = 0;
  uint32_t t = 0;
  if (header.size() != kFrameHeaderBytes || !Get(header, &pos, &t) ||
      !Get(header, &pos, payload_bytes)) {
    return absl::InvalidArgumentError("nccl control frame: bad header size");
  }
  if (t < 1 || t > 4) {
    return absl::InvalidArgumentError(absl::StrCat("nccl control frame: unknown type ", t));
  }
  if (*payload_bytes > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl control frame: payload of ", *payload_bytes, " bytes exceeds ", kMaxPayloadBytes));
  }
  *type = static_cast<MessageType>(t);
  return absl::OkStatus();
}

namespace {

bool ValidHelloParts(size_t token_bytes, size_t ids_bytes) {
  return token_bytes <= kMaxHelloTokenBytes &&
         (ids_bytes == kUniqueIdBytes || ids_bytes == 2 * kUniqueIdBytes);
}

}  // namespace

absl::StatusOr<std::string> EncodeHello(absl::string_view credential,
                                        absl::string_view unique_ids) {
  if (!ValidHelloParts(credential.size(), unique_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat("nccl hello: credential of ", credential.size(),
                                                   " bytes, ", unique_ids.size(),
                                                   " bytes of unique ids"));
  }
  std::string out;
  Put(&out, static_cast<uint32_t>(credential.size()));
  out.append(credential.data(), credential.size());
  out.append(unique_ids.data(), unique_ids.size());
  return out;
}

absl::StatusOr<Hello> DecodeHello(absl::string_view payload) {
  size_t pos = 0;
  uint32_t token_bytes = 0;
  if (!Get(payload, &pos, &token_bytes) || token_bytes > payload.size() - pos ||
      !ValidHelloParts(token_bytes, payload.size() - pos - token_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl hello: malformed payload of ", payload.size(), " bytes"));
  }
  Hello hello;
  hello.credential = std::string(payload.substr(pos, token_bytes));
  hello.unique_ids = std::string(payload.substr(pos + token_bytes));
  return hello;
}

absl::StatusOr<std::string> EncodeReadRequest(uint64_t id, const nccl_plan::PlanParams& params,
                                              absl::Span<const StridedCopyOp> ops) {
  if (ops.empty() || ops.size() > kMaxOpsPerRead) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl read request: ", ops.size(), " ops (need 1..", kMaxOpsPerRead, ")"));
  }
  if (params.chunk_bytes == 0 || params.direct_min_bytes == 0) {
    return absl::InvalidArgumentError("nccl read request: zero chunk_bytes or direct_min_bytes");
  }
  std::string out;
  out.reserve(kReadHeaderBytes + ops.size() * kReadOpBytes);
  Put(&out, id);
  Put(&out, params.chunk_bytes);
  Put(&out, params.direct_min_bytes);
  Put(&out, static_cast<uint32_t>(ops.size()));
  for (const StridedCopyOp& op : ops) {
    Put(&out, op.remote_region);
    Put(&out, op.remote_offset);
    Put(&out, op.row_bytes);
    Put(&out, op.rows);
    Put(&out, op.remote_stride);
  }
  return out;
}

absl::StatusOr<ReadRequest> DecodeReadRequest(absl::string_view payload) {
  ReadRequest req;
  size_t pos = 0;
  uint32_t n = 0;
  if (!Get(payload, &pos, &req.id) || !Get(payload, &pos, &req.params.chunk_bytes) ||
      !Get(payload, &pos, &req.params.direct_min_bytes) || !Get(payload, &pos, &n)) {
    return absl::InvalidArgumentError("nccl read request: truncated header");
  }
  if (req.params.chunk_bytes == 0 || req.params.direct_min_bytes == 0) {
    return absl::InvalidArgumentError("nccl read request: zero chunk_bytes or direct_min_bytes");
  }
  if (n == 0 || n > kMaxOpsPerRead) {
    return absl::InvalidArgumentError(absl::StrCat("nccl read request: bad op count ", n));
  }
  if (payload.size() - pos != static_cast<size_t>(n) * kReadOpBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl read request: ", payload.size() - pos, " op bytes for ", n, " ops"));
  }
  req.ops.resize(n);
  for (StridedCopyOp& op : req.ops) {
    Get(payload, &pos, &op.remote_region);
    Get(payload, &pos, &op.remote_offset);
    Get(payload, &pos, &op.row_bytes);
    Get(payload, &pos, &op.rows);
    Get(payload, &pos, &op.remote_stride);
  }
  return req;
}

std::string EncodeReadAck(const ReadAck& ack) {
  std::string out;
  Put(&out, ack.id);
  Put(&out, ack.chunk_bytes);
  Put(&out, static_cast<uint32_t>(ack.verdict.code()));
  out.append(ack.verdict.message().data(), ack.verdict.message().size());
  return out;
}

absl::StatusOr<ReadAck> DecodeReadAck(absl::string_view payload) {
  ReadAck ack;
  size_t pos = 0;
  uint32_t code = 0;
  if (!Get(payload, &pos, &ack.id) || !Get(payload, &pos, &ack.chunk_bytes) ||
      !Get(payload, &pos, &code)) {
    return absl::InvalidArgumentError("nccl read ack: truncated");
  }
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl read ack: bad status code ", code));
  }
  ack.verdict = absl::Status(static_cast<absl::StatusCode>(code), payload.substr(pos));
  if (ack.verdict.ok() && ack.chunk_bytes == 0) {
    return absl::InvalidArgumentError("nccl read ack: zero chunk_bytes");
  }
  return ack;
}

absl::Status ValidateSourceRanges(absl::Span<const StridedCopyOp> ops,
                                  absl::Span<const uint64_t> region_bytes) {
  // Reuse ValidateStridedCopyOps by making each op's local side mirror its remote side.
  std::vector<StridedCopyOp> mirrored(ops.begin(), ops.end());
  for (StridedCopyOp& op : mirrored) {
    op.local_region = op.remote_region;
    op.local_offset = op.remote_offset;
    op.local_stride = op.remote_stride;
  }
  return ValidateStridedCopyOps(mirrored, region_bytes, region_bytes);
}

std::string FormatAddress(absl::string_view host, int port) {
  return absl::StrCat(host, ":", port);
}

absl::Status ParseAddress(absl::string_view address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p <= 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl worker_address '", address, "' is not host:port"));
  }
  *host = std::string(address.substr(0, colon));
  *port = p;
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::nccl_wire
