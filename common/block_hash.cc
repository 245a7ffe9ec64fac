#include "common/block_hash.h"

#include <glog/logging.h>
#include <openssl/evp.h>

#include <bit>
#include <cstring>

namespace tandem {
namespace {

static_assert(kBlockHashSaltTag.size() == 16, "the wire format fixes a 16-byte tag");

// SHA-256 fetched once from OpenSSL's default provider. EVP_sha256() would work too, but with
// OpenSSL 3 it makes every digest look the algorithm up again (about 2x slower for our ~100-byte
// inputs). The fetched object is immutable and thread-safe; it lives for the whole process on
// purpose (no teardown-order problems).
const EVP_MD* Sha256() {
  static const EVP_MD* const md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}

// One SHA-256 computation fed in pieces, so tokens go straight from the caller's span to OpenSSL
// without being copied into one buffer. OpenSSL only fails here on allocation failure, which
// the block-hash API (plain values, used on the scheduler's hot path) treats as fatal.
class Sha256Digest {
 public:
  Sha256Digest() : ctx_(EVP_MD_CTX_new()) { CHECK(ctx_ != nullptr) << "EVP_MD_CTX_new failed"; }
  ~Sha256Digest() { EVP_MD_CTX_free(ctx_); }
  Sha256Digest(const Sha256Digest&) = delete;
  Sha256Digest& operator=(const Sha256Digest&) = delete;

  void Begin() { CHECK_EQ(EVP_DigestInit_ex(ctx_, Sha256(), nullptr), 1) << "SHA-256 init failed"; }
  void Update(const void* data, size_t size) {
    CHECK_EQ(EVP_DigestUpdate(ctx_, data, size), 1) << "SHA-256 update failed";
  }
  // Tokens as le32, whatever the host byte order.
  void UpdateTokens(absl::Span<const int32_t> tokens) {
    if constexpr (std::endian::native == std::endian::little) {
      Update(tokens.data(), tokens.size() * sizeof(int32_t));
    } else {
      uint8_t buffer[256];
      size_t used = 0;
      for (const int32_t token : tokens) {
        const uint32_t bits = static_cast<uint32_t>(token);
        for (int byte = 0; byte < 4; ++byte)
          buffer[used++] = static_cast<uint8_t>(bits >> (8 * byte));
        if (used == sizeof(buffer)) {
          Update(buffer, used);
          used = 0;
        }
      }
      Update(buffer, used);
    }
  }
  BlockHash Finish() {
    BlockHash hash;
    unsigned int size = 0;
    CHECK_EQ(EVP_DigestFinal_ex(ctx_, hash.bytes.data(), &size), 1) << "SHA-256 final failed";
    CHECK_EQ(size, hash.bytes.size());
    return hash;
  }

 private:
  EVP_MD_CTX* ctx_;
};

BlockHash HashBlock(Sha256Digest& digest, const BlockHash* prev,
                    absl::Span<const int32_t> block_tokens, absl::string_view salt) {
  digest.Begin();
  if (prev != nullptr) {
    digest.Update(prev->bytes.data(), prev->bytes.size());
  } else {
    digest.Update(kBlockHashSaltTag.data(), kBlockHashSaltTag.size());
    uint8_t salt_size[8];
    const uint64_t size = salt.size();
    for (int byte = 0; byte < 8; ++byte) salt_size[byte] = static_cast<uint8_t>(size >> (8 * byte));
    digest.Update(salt_size, sizeof(salt_size));
    digest.Update(salt.data(), salt.size());
  }
  digest.UpdateTokens(block_tokens);
  return digest.Finish();
}

}  // namespace

uint64_t BlockHash::Short() const {
  uint64_t value = 0;
  for (int byte = 7; byte >= 0; --byte) value = (value << 8) | bytes[byte];
  return value;
}

std::string BlockHash::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (const uint8_t byte : bytes) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xf]);
  }
  return hex;
}

std::vector<BlockHash> ComputeBlockHashes(absl::Span<const int32_t> tokens, int64_t block_size,
                                          absl::string_view salt) {
  std::vector<BlockHash> hashes;
  if (block_size <= 0) return hashes;
  const size_t size = static_cast<size_t>(block_size);
  const size_t num_blocks = tokens.size() / size;
  hashes.reserve(num_blocks);
  Sha256Digest digest;  // one OpenSSL context for the whole chain
  for (size_t i = 0; i < num_blocks; ++i) {
    hashes.push_back(
        HashBlock(digest, i == 0 ? nullptr : &hashes.back(), tokens.subspan(i * size, size), salt));
  }
  return hashes;
}

BlockHash HashNextBlock(const BlockHash* prev, absl::Span<const int32_t> block_tokens,
                        absl::string_view salt) {
  Sha256Digest digest;
  return HashBlock(digest, prev, block_tokens, salt);
}

}  // namespace tandem
