// P/D transfer handshake checks (ARCHITECTURE.md, "The P->D handoff"): before any byte moves,
// both sides exchange a TransferHandshake and refuse a peer whose model, KV layout or transport
// differs from their own.
//
// Two kinds of facts (ARCHITECTURE.md, "Worker groups"): what must match EXACTLY for two groups
// to exchange KV (model, dtypes, layers, KV heads in total, head_dim, block size, layout, scales:
// CompatibilityInfo, hashed), and how each side splits that KV over its ranks (RankGeometry: tp
// size and rank, its KV head range, DCP size and interleave, bytes per block), which travels
// beside the hash and is reconciled by the transfer instead of refused. A router may pair any two
// groups whose hashes are equal.
//
// Compatibility hash, canonical encoding version 2. le32/le64 are little-endian unsigned
// integers, str(s) = le64(byte length) || bytes, f32(x) = le32 of the IEEE-754 bits:
//
//   bytes = "tandem-compat-v2"                            16 ASCII bytes (domain tag)
//           || str(model_id) || str(model_dtype)
//           || str(layout.layout_name) || le32(layout.num_layers) || le32(layout.num_kv_heads)
//           || le32(layout.head_dim) || le32(layout.block_size) || le32(layout.kv_dtype)
//           || le32(layout.scale_granularity)
//           || le64(#k_scales) || f32(k_scales[i])...  || le64(#v_scales) || f32(v_scales[i])...
//   CompatibilityHash = first 8 bytes of SHA-256(bytes), read as le64.
// (v1 also hashed block_bytes, dcp_size and dcp_interleave: rank geometry, now RankGeometry.)
//
// Unlike protobuf serialization, this encoding does not depend on the protobuf version or on
// unknown fields, so workers built at different times agree. Adding a field to
// CompatibilityInfo means a new tag ("tandem-compat-v2") and a new version here.
// Golden vector (handshake_test.cc, GoldenVector): model_id "m", model_dtype "bfloat16",
// layout {"block_major_v1", 2 layers, 4 heads, head_dim 8, block_size 16, BF16, NONE}, no
// scales -> see the test (with its Python one-liner).
//
// Thread safety: all functions are thread-safe (no shared state).
#ifndef TANDEM_KVTRANSFER_HANDSHAKE_H_
#define TANDEM_KVTRANSFER_HANDSHAKE_H_

#include <cstdint>
#include <string>
#include <vector>

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
//    num_kv_heads, head_dim, num_layers, transport. The message shows both values, e.g.
//    "incompatible peer d0: block_size differs (local 16, peer 32)".
//  * INVALID_ARGUMENT when the peer's RankGeometry contradicts its layout (ValidateGeometry).
//  * CheckGeometry's answer otherwise. `local` is trusted (its hash is not re-checked).
absl::Status CheckCompatible(const tandem::v1::TransferHandshake& local,
                             const tandem::v1::TransferHandshake& peer);

// What a worker knows of its KV (the hashed facts); CompatibilityFor fills CompatibilityInfo
// from it (layout "block_major_v1" or the MLA latent one; no per-tensor / per-head scales). One
// place builds it, so what enters the hash is pinned by handshake_test.
struct KvCompatibilityFacts {
  std::string model_id;
  std::string model_dtype;  // "float32", "float16", "bfloat16"
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;  // of the model, in total
  uint32_t head_dim = 0;
  uint32_t block_size = 0;
  tandem::v1::KvDtype kv_dtype = tandem::v1::KV_DTYPE_UNSPECIFIED;
  // Quantized KV: where its scales live (an FP8 latent pool: one per token, KV_SCALE_PER_TOKEN_HEAD
  // of its one latent "head", inside the block; a GQA FP8 pool: KV_SCALE_PER_TENSOR, the values
  // in k_scales / v_scales, outside the blocks); unquantized: KV_SCALE_NONE.
  tandem::v1::KvScaleGranularity scale_granularity = tandem::v1::KV_SCALE_NONE;
  // KV_SCALE_PER_TENSOR: the dequantization scales (hashed: P and D must quantize alike).
  std::vector<float> k_scales, v_scales;
  // Multi-head latent attention (DeepSeek MLA): one latent "head" of kv_lora_rank +
  // qk_rope_head_dim per token and layer, no separate V (num_kv_heads 1, head_dim the latent
  // width). The layout is then named kMlaLatentLayout + "(kv_lora_rank=R,qk_rope_head_dim=D)", so
  // MLA and GQA workers, or MLA workers of different latent splits, refuse to pair, naming both.
  uint32_t kv_lora_rank = 0;  // 0: K and V ("block_major_v1")
  uint32_t qk_rope_head_dim = 0;
};
inline constexpr char kMlaLatentLayout[] = "mla_latent_v1";
tandem::v1::CompatibilityInfo CompatibilityFor(const KvCompatibilityFacts& facts);
// The geometry of a worker that is a single rank: all KV heads, no DCP.
tandem::v1::RankGeometry SingleRankGeometry(const tandem::v1::CompatibilityInfo& info,
                                            uint64_t block_bytes);
// Bytes of one KV element of `layout`: of an unquantized dtype, or of a quantized one whose
// scales live outside the blocks (FP8 per tensor: 1); 0 for quantized blocks that carry their
// scales (a block's size is then the backend's to state, and its heads are not re-sharded).
uint64_t KvElementBytes(const tandem::v1::KvLayout& layout);

// INVALID_ARGUMENT when `geometry` cannot describe a rank of `info`'s layout: tp_rank >=
// tp_size, a KV head range outside the model's, or (unquantized KV) block_bytes other than
// layers * 2 * block_size * heads of the rank * head_dim * element size. proto3 zeros are read
// as the single-rank defaults.
absl::Status ValidateGeometry(const tandem::v1::CompatibilityInfo& info,
                              const tandem::v1::RankGeometry& geometry);
// Whether a transfer can move blocks between these two ranks as they are split: OK for the same
// split; UNIMPLEMENTED, naming both splits, for a different one (same model, different group
// shape: the tensor-parallel re-sharding transfer reconciles it once it exists).
absl::Status CheckGeometry(const tandem::v1::TransferHandshake& local,
                           const tandem::v1::TransferHandshake& peer);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_HANDSHAKE_H_
