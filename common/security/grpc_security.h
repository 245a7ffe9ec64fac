// gRPC credentials and caller identity from a SecurityConfig: the only part of common/security
// that sees gRPC types.
//
// Internal plane (router's WorkerRegistry/admin port, workers' WorkerService and
// KvTransferService): InternalServerCredentials requires a client certificate that chains to the
// cluster CA (the TLS handshake fails otherwise) and attaches an AuthMetadataProcessor that runs
// before any handler: a caller whose certificate names no role, or a role internal_policy.h does
// not allow for the called method, gets PERMISSION_DENIED. Public plane (router's Router port):
// PublicServerCredentials is server-side TLS, with client certificates required only when a
// client CA is given; API keys are checked by the handlers (ApiKeyOf), which also need the name.
//
// Insecure configs give plain-text credentials and no checks (ApiKeyOf still checks keys when the
// config has some).
//
// No process-wide default: each daemon loads its SecurityConfig in main and passes it down in
// its configs (RouterOptions, WorkerConfig, PeerLinks, RouterRegistration, the CLI's commands).
//
// Thread safety: all functions are thread-safe.
#ifndef TANDEM_COMMON_SECURITY_GRPC_SECURITY_H_
#define TANDEM_COMMON_SECURITY_GRPC_SECURITY_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/api_keys.h"
#include "common/security/roles.h"
#include "common/security/security_config.h"

namespace tandem::security {

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials(const SecurityConfig& config);
// `client_ca_pem` non-empty: clients must present a certificate from it.
std::shared_ptr<grpc::ServerCredentials> PublicServerCredentials(const SecurityConfig& config,
                                                                 const std::string& client_ca_pem);

// TLS trusting the config's CA, presenting its certificate when it has one.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const SecurityConfig& config);
std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             const SecurityConfig& config,
                                             grpc::ChannelArguments args = {});

// A TLS channel whose every call also carries `authorization: Bearer <api_key>` (public-port
// clients that build their own ClientContexts). Plain-text configs cannot carry call credentials:
// there the key is not attached (use AttachApiKey per call).
std::shared_ptr<grpc::Channel> CreateChannelWithApiKey(const std::string& target,
                                                       const SecurityConfig& config,
                                                       const std::string& api_key,
                                                       grpc::ChannelArguments args = {});

// The verified peer certificate's identity: UNAUTHENTICATED (generic) when the connection has no
// client certificate, PERMISSION_DENIED (generic) when it names no role.
absl::StatusOr<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& auth);
// The caller's API key from `authorization` metadata; UNAUTHENTICATED (generic) when absent or
// unknown.
absl::StatusOr<ApiKeyIdentity> ApiKeyOf(const grpc::ServerContextBase& ctx, const ApiKeySet& keys);
// Client side: sends `authorization: Bearer <key>` with the call (no-op for an empty key).
void AttachApiKey(grpc::ClientContext* ctx, const std::string& key);

}  // namespace tandem::security

#endif  // TANDEM_COMMON_SECURITY_GRPC_SECURITY_H_
