#include "kvtransfer/nccl/nccl_agent_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl/nccl_agent_socket.h"
#include "kvtransfer/nccl/nccl_agent_wire.h"

namespace tandem::kvtransfer::nccl_auth {
namespace {

constexpr absl::string_view kTokenDomain = "tandem-nccl-control-v1";
constexpr absl::string_view kHelloDomain = "tandem-nccl-hello-v1";

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(absl::string_view in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// HMAC-SHA256(key, domain | message); "" if OpenSSL fails (matches nothing: no credential or
// token is empty where a MAC belongs).
std::string Hmac(absl::string_view key, absl::string_view domain, absl::string_view message) {
  std::string data(domain);
  data.append(message.data(), message.size());
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
           &length) == nullptr ||
      length != kMacBytes) {
    return std::string();
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return std::string();
  }
  return out;
}

}  // namespace

std::string Prove(absl::string_view token, absl::string_view challenge) {
  if (token.size() != kTokenBytes) return std::string();
  const absl::string_view id = token.substr(0, kNonceBytes + 8);
  const std::string proof = Hmac(token.substr(kNonceBytes + 8), kHelloDomain, challenge);
  if (proof.empty()) return std::string();
  return absl::StrCat(id, proof);
}

ControlTokenAuthority::ControlTokenAuthority(std::string key, absl::Duration lifetime, Clock clock)
    : key_(std::move(key)), lifetime_(lifetime), clock_(std::move(clock)) {}

absl::Status ControlTokenAuthority::Validate() const {
  if (!key_.empty() && key_.size() < kMinKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl control token key of ", key_.size(), " bytes < ", kMinKeyBytes));
  }
  if (lifetime_ <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl control token lifetime must be positive");
  }
  return absl::OkStatus();
}

std::string ControlTokenAuthority::Secret(absl::string_view nonce_and_expiry) const {
  return Hmac(key_, kTokenDomain, nonce_and_expiry);
}

std::string ControlTokenAuthority::Issue() const {
  if (!enabled()) return std::string();
  std::string token = RandomBytes(kNonceBytes);
  if (token.empty()) return std::string();
  PutU64(&token, static_cast<uint64_t>(absl::ToUnixMillis(clock_() + lifetime_)));
  const std::string secret = Secret(token);
  if (secret.empty()) return std::string();
  return token + secret;
}

absl::Status ControlTokenAuthority::Verify(absl::string_view credential,
                                           absl::string_view challenge) const {
  if (!enabled()) return absl::OkStatus();
  if (credential.size() != kCredentialBytes) {
    return absl::PermissionDeniedError(
        absl::StrCat("nccl control credential of ", credential.size(), " bytes"));
  }
  const absl::string_view id = credential.substr(0, kNonceBytes + 8);
  const std::string expected = Hmac(Secret(id), kHelloDomain, challenge);
  if (expected.size() != kMacBytes ||
      CRYPTO_memcmp(expected.data(), credential.data() + id.size(), kMacBytes) != 0) {
    return absl::PermissionDeniedError("nccl control credential: bad proof");
  }
  const absl::Time expiry =
      absl::FromUnixMillis(static_cast<int64_t>(GetU64(id.substr(kNonceBytes, 8))));
  if (clock_() >= expiry) return absl::PermissionDeniedError("nccl control token: expired");
  return absl::OkStatus();
}

absl::StatusOr<std::string> AcceptHello(int fd, const ControlTokenAuthority& auth,
                                        const std::atomic<bool>& stop, absl::Duration timeout) {
  const std::string challenge = RandomBytes(nccl_wire::kChallengeBytes);
  if (challenge.empty()) return absl::InternalError("nccl control socket: no random challenge");
  if (absl::Status s = nccl_socket::SendFrame(fd, nccl_wire::MessageType::kChallenge, challenge);
      !s.ok()) {
    return s;
  }
  nccl_wire::MessageType type;
  std::string payload;
  // At most kMaxHelloBytes from a peer nobody has vouched for yet.
  absl::Status s =
      nccl_socket::RecvFrame(fd, stop, timeout, &type, &payload, nccl_wire::kMaxHelloBytes);
  if (!s.ok()) return s;
  if (type != nccl_wire::MessageType::kHello) {
    return absl::InvalidArgumentError("nccl control socket: the first frame is not a hello");
  }
  absl::StatusOr<nccl_wire::Hello> hello = nccl_wire::DecodeHello(payload);
  if (!hello.ok()) return hello.status();
  if (absl::Status verified = auth.Verify(hello->credential, challenge); !verified.ok()) {
    return verified;
  }
  return std::move(hello->unique_ids);
}

absl::Status SendHello(int fd, absl::string_view token, absl::string_view unique_ids,
                       const std::atomic<bool>& stop, absl::Duration timeout) {
  nccl_wire::MessageType type;
  std::string challenge;
  absl::Status s = nccl_socket::RecvFrame(fd, stop, timeout, &type, &challenge,
                                          static_cast<uint32_t>(nccl_wire::kChallengeBytes));
  if (!s.ok()) return s;
  if (type != nccl_wire::MessageType::kChallenge ||
      challenge.size() != nccl_wire::kChallengeBytes) {
    return absl::UnavailableError("nccl control socket: the source sent no challenge");
  }
  absl::StatusOr<std::string> hello = nccl_wire::EncodeHello(Prove(token, challenge), unique_ids);
  if (!hello.ok()) return hello.status();
  return nccl_socket::SendFrame(fd, nccl_wire::MessageType::kHello, *hello);
}

}  // namespace tandem::kvtransfer::nccl_auth
