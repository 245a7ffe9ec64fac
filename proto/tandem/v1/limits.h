// Size limits of the tandem.v1 wire messages. Receivers enforce them (INVALID_ARGUMENT) and
// servers cap gRPC messages at kMaxGrpcMessageBytes; proto/README.md explains each number.
// proto/roundtrip_test.cc checks that a message at every limit still fits in kMaxGrpcMessageBytes.
#ifndef TANDEM_PROTO_TANDEM_V1_LIMITS_H_
#define TANDEM_PROTO_TANDEM_V1_LIMITS_H_

#include <cstdint>

namespace tandem::v1 {

// Largest serialized message any Tandem gRPC server accepts or sends.
inline constexpr int64_t kMaxGrpcMessageBytes = int64_t{16} << 20;
// request_id, worker_id, cache_salt.
inline constexpr int kMaxIdBytes = 128;
// Prompt length in tokens (a packed uint32 is at most 5 bytes: 5 MiB worst case).
inline constexpr int kMaxPromptTokens = 1 << 20;
inline constexpr int kMaxStopTokenIds = 64;
inline constexpr float kMaxTemperature = 100.0f;
// Blocks in one KvHandle: 2M tokens at block size 16.
inline constexpr int kMaxKvHandleBlocks = 1 << 17;
// UCX worker addresses are a few hundred bytes; packed rkeys well under 1 KiB per region.
inline constexpr int kMaxTransportAddressBytes = 64 << 10;
inline constexpr int kMaxPackedRkeyBytes = 64 << 10;
inline constexpr int kMaxMemoryRegions = 64;
// TransferHandshake.access_token (the NCCL control-socket token is 56 bytes).
inline constexpr int kMaxAccessTokenBytes = 256;
// TransferHandshake.ucx_gather_key: empty, or exactly this many random bytes.
inline constexpr int kUcxGatherKeyBytes = 16;
// Ranks of one worker group in a TransferHandshake (TransferHandshake.ranks).
inline constexpr int kMaxGroupRanks = 64;
// MtpHandoff (worker.proto): latent_rows of at most 4 MiB (runtime/engine MtpProposer::
// kMaxHandoffBytes: ~1,800 prompt tokens of DeepSeek-V3's 576-float rows) and last_hidden of at
// most 64 Ki floats.
inline constexpr int kMaxMtpHandoffRowFloats = 1 << 20;
inline constexpr int kMaxMtpHandoffHiddenFloats = 1 << 16;
// Heartbeat prefix-index deltas (hashes per heartbeat, each list).
inline constexpr int kMaxHeartbeatBlockHashes = 1 << 16;

// One process-group store message (tandem/v1/comm.proto): rendezvous keys and values (transport
// addresses, NCCL unique ids) are small.
inline constexpr int kMaxStoreMessageBytes = 1 << 20;

}  // namespace tandem::v1

#endif  // TANDEM_PROTO_TANDEM_V1_LIMITS_H_
