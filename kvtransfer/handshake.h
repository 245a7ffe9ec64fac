// P/D transfer handshake checks (ARCHITECTURE.md, "The P->D handoff"): before any byte moves,
// both sides exchange a TransferHandshake and refuse a peer whose model, KV layout or transport
// differs from their own.
//
// Compatibility hash, canonical encoding version 1. le32/le64 are little-endian unsigned
// integers, str(s) = le64(byte length) || bytes, f32(x) = le32 of the IEEE-754 bits:
//
//   bytes = "tandem-compat-v1"                            16 ASCII bytes (domain tag)
//           || str(model_id) || str(model_dtype)
//           || str(layout.layout_name) || le32(layout.num_layers) || le32(layout.num_kv_heads)
//           || le32(layout.head_dim) || le32(layout.block_size) || le32(layout.kv_dtype)
//           || le32(layout.scale_granularity) || le64(layout.block_bytes)
//           || le32(dcp_size') || le32(dcp_interleave')      0 is read as 1 (proto3 unset)
//           || le64(#k_scales) || f32(k_scales[i])...  || le64(#v_scales) || f32(v_scales[i])...
//   CompatibilityHash = first 8 bytes of SHA-256(bytes), read as le64.
//
// Unlike protobuf serialization, this encoding does not depend on the protobuf version or on
// unknown fields, so workers built at different times agree. Adding a field to
// CompatibilityInfo means a new tag ("tandem-compat-v2") and a new version here.
// Golden vector (handshake_test.cc, GoldenVector): model_id "m", model_dtype "bfloat16",
// layout {"block_major_v1", 2 layers, 4 heads, head_dim 8, block_size 16, BF16, NONE,
// block_bytes 4096}, no scales -> 0x5ffb2a7153405883 (see the test for the Python one-liner).
//
// Thread safety: all functions are thread-safe (no shared state).
#ifndef TANDEM_KVTRANSFER_HANDSHAKE_H_
#define TANDEM_KVTRANSFER_HANDSHAKE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::kvtransfer {

// The canonical byte encoding above (exposed for tests and other implementations).
std::string CanonicalCompatibilityBytes(const tandem::v1::CompatibilityInfo& info);

// First 8 bytes of SHA-256(CanonicalCompatibilityBytes(info)) as a little-endian integer.
uint64_t CompatibilityHash(const tandem::v1::CompatibilityInfo& info);

// Size limits of proto/tandem/v1/limits.h and basic sanity of a received handshake:
// INVALID_ARGUMENT naming the field for worker_id > kMaxIdBytes, worker_address >
// kMaxTransportAddressBytes, > kMaxMemoryRegions regions, a packed_rkey > kMaxPackedRkeyBytes,
// an empty transport, or a region with zero length, unspecified kind or an address range that
// wraps around 2^64.
absl::Status ValidateHandshake(const tandem::v1::TransferHandshake& handshake);

// Decides whether this worker (`local`) may exchange KV blocks with `peer`:
//  * INVALID_ARGUMENT when `peer` fails ValidateHandshake, or its compatibility_hash is not the
//    hash of its own CompatibilityInfo (a corrupt or lying peer).
//  * FAILED_PRECONDITION naming the FIRST differing field, in this order: model_id,
//    model_dtype, kv_dtype, scale_granularity, k_scales, v_scales, layout_name, block_size,
//    num_kv_heads, head_dim, num_layers, block_bytes, dcp_size, dcp_interleave, transport.
//    The message shows both values, e.g. "incompatible peer d0: block_size differs (local 16,
//    peer 32)".
//  * OK otherwise. `local` is trusted (its hash is not re-checked).
absl::Status CheckCompatible(const tandem::v1::TransferHandshake& local,
                             const tandem::v1::TransferHandshake& peer);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_HANDSHAKE_H_
