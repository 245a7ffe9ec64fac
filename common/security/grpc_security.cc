#include "common/security/grpc_security.h"

#include <grpcpp/security/auth_metadata_processor.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/security/auth_status.h"
#include "common/security/internal_policy.h"

namespace tandem::security {
namespace {

// Runs before every call on an internal server: the method's policy against the role of the
// (already CA-verified) client certificate.
class InternalPlaneProcessor final : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }  // a table lookup and a certificate parse

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* auth, OutputMetadata*,
                       OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path == metadata.end()) {
      return ToGrpcStatus(PermissionDenied("internal call without a :path"));
    }
    absl::StatusOr<PeerIdentity> peer = PeerIdentityOf(*auth);
    if (!peer.ok()) return ToGrpcStatus(peer.status());
    const absl::string_view method(path->second.data(), path->second.size());
    return ToGrpcStatus(AuthorizeInternalCall(method, *peer));
  }
};

grpc::SslServerCredentialsOptions SslOptions(const SecurityConfig& config,
                                             grpc_ssl_client_certificate_request_type request,
                                             const std::string& client_ca_pem) {
  grpc::SslServerCredentialsOptions options(request);
  options.pem_root_certs = client_ca_pem;
  options.pem_key_cert_pairs.push_back({config.tls.key_pem, config.tls.cert_pem});
  return options;
}

class ApiKeyPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit ApiKeyPlugin(std::string key) : value_(absl::StrCat("Bearer ", key)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", value_});
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials(const SecurityConfig& config) {
  if (config.insecure) return grpc::InsecureServerCredentials();
  auto creds = grpc::SslServerCredentials(SslOptions(
      config, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY, config.tls.ca_pem));
  creds->SetAuthMetadataProcessor(std::make_shared<InternalPlaneProcessor>());
  return creds;
}

std::shared_ptr<grpc::ServerCredentials> PublicServerCredentials(const SecurityConfig& config,
                                                                 const std::string& client_ca_pem) {
  if (config.insecure) return grpc::InsecureServerCredentials();
  return grpc::SslServerCredentials(
      SslOptions(config,
                 client_ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
                 client_ca_pem));
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const SecurityConfig& config) {
  if (config.insecure) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = config.tls.ca_pem;
  options.pem_private_key = config.tls.key_pem;
  options.pem_cert_chain = config.tls.cert_pem;
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& target,
                                             const SecurityConfig& config,
                                             grpc::ChannelArguments args) {
  if (!config.insecure && !config.server_name_override.empty()) {
    args.SetSslTargetNameOverride(config.server_name_override);
  }
  return grpc::CreateCustomChannel(target, ChannelCredentials(config), args);
}

std::shared_ptr<grpc::Channel> CreateChannelWithApiKey(const std::string& target,
                                                       const SecurityConfig& config,
                                                       const std::string& api_key,
                                                       grpc::ChannelArguments args) {
  if (config.insecure || api_key.empty()) return CreateChannel(target, config, std::move(args));
  if (!config.server_name_override.empty()) {
    args.SetSslTargetNameOverride(config.server_name_override);
  }
  auto creds = grpc::CompositeChannelCredentials(
      ChannelCredentials(config),
      grpc::MetadataCredentialsFromPlugin(std::make_unique<ApiKeyPlugin>(api_key)));
  return grpc::CreateCustomChannel(target, creds, args);
}

absl::StatusOr<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& auth) {
  std::vector<grpc::string_ref> pems = auth.FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pems.empty()) return Unauthenticated("no client certificate");
  absl::StatusOr<PeerIdentity> id =
      IdentityFromCertificatePem(absl::string_view(pems.front().data(), pems.front().size()));
  if (!id.ok()) return Opaque(id.status());
  return id;
}

absl::StatusOr<ApiKeyIdentity> ApiKeyOf(const grpc::ServerContextBase& ctx, const ApiKeySet& keys) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return Unauthenticated("no authorization metadata");
  return keys.Authenticate(absl::string_view(it->second.data(), it->second.size()));
}

void AttachApiKey(grpc::ClientContext* ctx, const std::string& key) {
  if (!key.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", key));
}

}  // namespace tandem::security
