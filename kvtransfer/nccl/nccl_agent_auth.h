// Authentication of NcclAgent's control socket (kvtransfer/nccl/nccl_agent.h). Pure CPU code.
//
// The control socket is raw TCP (nccl_agent_wire.h): a reader connects, sends kHello with the
// ncclUniqueIds, the source joins the communicators and then serves every kRead that passes the
// range checks, i.e. any byte of its KV pool. Unauthenticated, whoever reaches the port reads the
// pool. So a connection opens with a challenge-response over an access token that the source
// handed out on the authenticated control plane, checked before anything else happens on the
// connection (before NCCL sees a byte):
//
//  * Token: the source's KvTransferService answers a handshake only for an mTLS-authenticated
//    reader that a live lease is bound to, and puts TransferAgent::IssueAccessToken() into the
//    answer (TransferHandshake.access_token, copied into every rank's entry). A token
//    (kTokenBytes = 56) is nonce[16] | expiry, Unix ms, u64 little-endian | secret[32], where
//    secret = HMAC-SHA256(key, "tandem-nccl-control-v1" | nonce | expiry). The key comes from
//    the worker's TLS private key (security::DeriveSecret), so every rank of a worker group, which
//    runs with the worker's certificate, recomputes the secret of a token rank 0 issued, with no
//    exchange between the ranks.
//  * Connection: the source sends a random challenge (kChallenge, 32 bytes); the reader answers
//    with its hello, whose credential is nonce | expiry | HMAC-SHA256(secret,
//    "tandem-nccl-hello-v1" | challenge) (Prove). The source recomputes the secret, compares the
//    proof in constant time (CRYPTO_memcmp) and checks the expiry. The secret itself never
//    crosses the plain-text socket, and a proof is good for one challenge only: what a sniffer on
//    the wire sees cannot open another connection. Within its lifetime (60 s) one token opens
//    any number of connections, because every rank of a reading group links to the source ranks
//    holding its heads (several readers per source rank when the splits differ).
//  * Anything else (no or a bad credential, an expired token, a first frame that is not a hello,
//    more than kMaxHelloBytes from a peer nobody vouched for) closes the connection.
//  * No key (an --insecure worker): the challenge is still sent (one protocol), nothing is
//    checked; the socket still binds only options.control_host (loopback by default).
//
// Not covered: the frames after the hello are neither encrypted nor integrity-protected (TLS on
// the socket would be), so an attacker on the path between two workers could take over an
// established connection; the credential only decides who may open one. A token is a bearer
// secret for its lifetime: a reader could hand it on, as it could hand on the KV it read.
//
// Thread safety: ControlTokenAuthority is immutable after construction (thread-safe);
// AcceptHello / SendHello work on one fd.
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_AGENT_AUTH_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_AGENT_AUTH_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::nccl_auth {

inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kTokenBytes = kNonceBytes + 8 + kMacBytes;
inline constexpr size_t kCredentialBytes = kNonceBytes + 8 + kMacBytes;
// A key shorter than this is refused (DeriveSecret gives 32 bytes).
inline constexpr size_t kMinKeyBytes = 16;

// The reader's credential for `challenge` from `token` ("" for an empty token: the source then
// accepts only when it checks nothing).
std::string Prove(absl::string_view token, absl::string_view challenge);

class ControlTokenAuthority {
 public:
  using Clock = std::function<absl::Time()>;
  // `key` empty: authentication off (Issue returns "", Verify accepts anything).
  explicit ControlTokenAuthority(std::string key, absl::Duration lifetime = absl::Seconds(60),
                                 Clock clock = absl::Now);
  // INVALID_ARGUMENT for a key that is set but shorter than kMinKeyBytes, or a lifetime <= 0.
  absl::Status Validate() const;
  bool enabled() const { return !key_.empty(); }
  // A fresh token ("" when disabled, or when OpenSSL cannot give random bytes).
  std::string Issue() const;
  // OK when `credential` proves, for `challenge`, a token of this key that has not expired;
  // PERMISSION_DENIED saying which check failed. OK for anything when disabled.
  absl::Status Verify(absl::string_view credential, absl::string_view challenge) const;

 private:
  // The secret of the token (nonce, expiry); "" if HMAC fails.
  std::string Secret(absl::string_view nonce_and_expiry) const;

  const std::string key_;
  const absl::Duration lifetime_;
  const Clock clock_;
};

// Source side of a freshly accepted connection: sends a challenge, reads the kHello (waiting up
// to `timeout`; a frame of another type or over kMaxHelloBytes is refused before its payload is
// read), checks its credential with `auth` and returns the ncclUniqueId bytes (1 or 2 ids). Any
// error means: close the connection (PERMISSION_DENIED for a bad credential, INVALID_ARGUMENT
// for a bad hello).
absl::StatusOr<std::string> AcceptHello(int fd, const ControlTokenAuthority& auth,
                                        const std::atomic<bool>& stop, absl::Duration timeout);

// Reader side of a fresh connection: waits up to `timeout` for the source's challenge, then sends
// the kHello with the credential for `token` and `unique_ids`.
absl::Status SendHello(int fd, absl::string_view token, absl::string_view unique_ids,
                       const std::atomic<bool>& stop, absl::Duration timeout);

}  // namespace tandem::kvtransfer::nccl_auth

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_AGENT_AUTH_H_
