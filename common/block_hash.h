// Prefix-cache block hashes: one chained SHA-256 per FULL block of tokens, shared by workers (their
// KvCacheManager keys cached KV blocks by it) and the router (it keeps an approximate index of
// which worker holds which prefix), so both sides must compute bit-identical values.
//
// Wire format (version 1). Let B = block_size, t_j the int32 token ids, salt an arbitrary byte
// string (empty = no tenant isolation), le32/le64 little-endian two's-complement encodings:
//
//   h_0 = SHA-256( kBlockHashSaltTag            16 ASCII bytes "tandem-kvhash-v1"
//                  || le64(salt.size())         8 bytes, so salt and tokens cannot run together
//                  || salt                      raw bytes
//                  || le32(t_0) .. le32(t_{B-1}) )
//   h_i = SHA-256( h_{i-1}                      32 bytes
//                  || le32(t_{iB}) .. le32(t_{iB+B-1}) )          for i >= 1
//
// The salt enters only h_0; every later hash inherits it through the chain, so two tenants with
// different salts never share any block. The chain makes h_i identify the WHOLE prefix
// tokens[0, (i+1)B), not just block i: equal hashes mean equal prefixes (up to SHA-256 collisions),
// which is what lets a cache reuse block i's KV. Only full blocks are hashed; a partial tail block
// is still being written and must not be shared.
//
// Golden vectors (for other implementations; checked by block_hash_test.cc, GoldenVectors), B = 4:
//   salt "",         tokens {1, 2, 3, 4}:
//     h_0 = 950fe33ef5adca6ddb00a7ed9ea70ed56a2e739b9fc5cf5ec5e3439e3da4df08
//   salt "",         tokens {1, 2, 3, 4, 5, 6, 7, -1}:
//     h_1 = 0b04f9f7546b7923151553854ab26d1680b761bc2411b447c473c478eb260fda
//   salt "tenant-a", tokens {1, 2, 3, 4}:
//     h_0 = 4f4c38a5208450688c3913ead289251f4642fd3f1df4a7fac35038fe9e3d2c42
// Python: hashlib.sha256(b"tandem-kvhash-v1" + struct.pack("<Q", len(salt)) + salt +
//                        struct.pack("<4i", *tokens)).hexdigest()
//
// Thread safety: all functions are thread-safe (no shared mutable state).
#ifndef TANDEM_COMMON_BLOCK_HASH_H_
#define TANDEM_COMMON_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem {

// Domain-separation tag that starts every chain (see the wire format above). Changing the
// encoding means changing this tag, so old and new hashes can never match.
inline constexpr absl::string_view kBlockHashSaltTag = "tandem-kvhash-v1";

struct BlockHash {
  std::array<uint8_t, 32> bytes{};

  // First 8 bytes as a little-endian integer: the compact form for the wire (proto fixed64) and
  // for routing. Collisions are possible in principle (64 bits), so only approximate indexes
  // (the router's) may key on it; the worker's cache keys on all 32 bytes.
  uint64_t Short() const;

  // 64 lowercase hex digits, for logs and tests.
  std::string ToHex() const;

  bool operator==(const BlockHash&) const = default;

  // SHA-256 output is uniformly distributed, so 8 bytes are as good a hash-table key as 32.
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& hash) {
    return H::combine(std::move(h), hash.Short());
  }
};

// Hashes of the full blocks of `tokens`: floor(tokens.size() / block_size) values, h_0 first,
// chain seeded with `salt`. Returns an empty vector when block_size <= 0.
std::vector<BlockHash> ComputeBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size,
                                          absl::string_view salt);

// One step of the chain: the hash of the block `block_tokens` (exactly one full block) given the
// previous block's hash, or nullptr for the first block. `salt` is used only when prev == nullptr
// (later blocks inherit it through prev).
BlockHash HashNextBlock(const BlockHash* prev, absl::Span<const int32_t> block_tokens,
                        absl::string_view salt);

}  // namespace tandem

#endif  // TANDEM_COMMON_BLOCK_HASH_H_
