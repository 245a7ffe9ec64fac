#include "common/security/security_config.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem::security {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

std::unique_ptr<BIO, BioFree> Bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The key matches the leaf, and the leaf chains to one of the CA bundle's certificates.
absl::Status CheckMaterial(const TlsMaterial& m, const TlsFiles& files) {
  auto cert_bio = Bio(m.cert_pem);
  std::unique_ptr<X509, X509Free> leaf(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (leaf == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(files.cert, ": not a PEM certificate"));
  auto key_bio = Bio(m.key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(files.key, ": not a PEM private key"));
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.key, " is not the key of the certificate ", files.cert));
  }
  if (m.ca_pem.empty()) return absl::OkStatus();
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  auto ca_bio = Bio(m.ca_pem);
  int cas = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store.get(), ca);
    X509_free(ca);
    ++cas;
  }
  if (cas == 0) return absl::InvalidArgumentError(absl::StrCat(files.ca, ": no PEM certificate"));
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), leaf.get(), nullptr);
  if (X509_verify_cert(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.cert, " does not chain to the CA in ", files.ca, ": ",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<SecurityConfig> LoadSecurityConfig(const SecurityOptions& o) {
  SecurityConfig config;
  config.server_name_override = o.server_name_override;
  const bool any_tls = !o.files.cert.empty() || !o.files.key.empty() || !o.files.ca.empty();
  if (o.insecure && any_tls) {
    return absl::InvalidArgumentError("--insecure contradicts --tls_cert/--tls_key/--tls_ca");
  }
  if (!o.api_key_file.empty()) {
    absl::StatusOr<ApiKeySet> keys = ApiKeySet::LoadFile(o.api_key_file);
    if (!keys.ok()) return keys.status();
    config.api_keys = *std::move(keys);
  }
  if (o.insecure) return config;
  config.insecure = false;
  if (o.files.cert.empty() != o.files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if ((o.require_cert && o.files.cert.empty()) || (o.require_ca && o.files.ca.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS needs ", o.require_cert ? "--tls_cert, --tls_key and " : "",
        "--tls_ca (deploy/certs/make_certs.sh makes them), or pass --insecure for plain text"));
  }
  if (!o.files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(o.files.ca, "--tls_ca");
    if (!ca.ok()) return ca.status();
    config.tls.ca_pem = *std::move(ca);
  }
  if (o.files.cert.empty()) return config;
  absl::StatusOr<std::string> cert = ReadPemFile(o.files.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(o.files.key, "--tls_key");
  if (!key.ok()) return key.status();
  config.tls.cert_pem = *std::move(cert);
  config.tls.key_pem = *std::move(key);
  if (absl::Status s = CheckMaterial(config.tls, o.files); !s.ok()) return s;
  absl::StatusOr<PeerIdentity> self = IdentityFromCertificatePem(config.tls.cert_pem);
  if (!self.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(o.files.cert, ": ", self.status().message(),
                                                   " (see common/security/README.md)"));
  }
  config.self = *self;
  return config;
}

std::string DeriveSecret(const SecurityConfig& config, absl::string_view purpose) {
  if (config.insecure || config.tls.key_pem.empty()) return std::string();
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const std::string& key = config.tls.key_pem;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(purpose.data()), purpose.size(), mac,
           &length) == nullptr) {
    return std::string();
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

std::string Describe(const SecurityConfig& c) {
  const std::string keys =
      c.api_keys.empty() ? "no API keys" : absl::StrCat(c.api_keys.size(), " API keys");
  if (c.insecure) {
    return absl::StrCat(
        "INSECURE: plain-text gRPC/HTTP, peers are not authenticated (--insecure); ", keys);
  }
  return absl::StrCat("TLS", c.self.has_value() ? absl::StrCat(" as ", c.self->ToString()) : "",
                      c.tls.ca_pem.empty() ? "" : ", mutual TLS with the cluster CA", "; ", keys);
}

}  // namespace tandem::security
