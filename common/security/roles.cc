#include "common/security/roles.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <array>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::security {
namespace {

constexpr std::array<std::pair<Role, absl::string_view>, 6> kRoleNames = {{
    {Role::kRouter, "router"},
    {Role::kPrefill, "prefill"},
    {Role::kDecode, "decode"},
    {Role::kMixed, "mixed"},
    {Role::kAdmin, "admin"},
    {Role::kClient, "client"},
}};

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct GeneralNamesFree {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};

std::string Asn1String(const ASN1_STRING* s) {
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                     static_cast<size_t>(ASN1_STRING_length(s)));
}

// The subject's entries with `nid` (CN, OU).
std::vector<std::string> SubjectEntries(X509* cert, int nid) {
  std::vector<std::string> out;
  X509_NAME* subject = X509_get_subject_name(cert);
  for (int i = X509_NAME_get_index_by_NID(subject, nid, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(subject, nid, i)) {
    out.push_back(Asn1String(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i))));
  }
  return out;
}

std::vector<std::string> UriSans(X509* cert) {
  std::vector<std::string> out;
  std::unique_ptr<GENERAL_NAMES, GeneralNamesFree> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names == nullptr) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_URI) out.push_back(Asn1String(name->d.uniformResourceIdentifier));
  }
  return out;
}

// What the role URIs of a certificate name: a role and maybe a worker id.
struct UriIdentity {
  std::optional<Role> role;
  std::string worker_id;
};

// The role (and worker id) the URI SANs name; no role when none does; an error when they
// disagree or one is malformed.
absl::StatusOr<UriIdentity> IdentityFromUris(const std::vector<std::string>& uris) {
  UriIdentity out;
  for (const std::string& uri : uris) {
    if (!absl::StartsWith(uri, kRoleUriPrefix)) continue;
    absl::string_view rest = absl::string_view(uri).substr(kRoleUriPrefix.size());
    std::string worker_id;
    if (const size_t at = rest.find(kWorkerUriInfix); at != absl::string_view::npos) {
      worker_id = std::string(rest.substr(at + kWorkerUriInfix.size()));
      rest = rest.substr(0, at);
      if (!IsValidWorkerId(worker_id)) {
        return absl::PermissionDeniedError(
            absl::StrCat("certificate URI '", uri, "' names a malformed worker id"));
      }
    }
    std::optional<Role> r = ParseRole(rest);
    if (!r.has_value() || (out.role.has_value() && *out.role != *r)) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate role URI '", uri, "' is unknown or conflicts with another"));
    }
    if (!worker_id.empty() && !out.worker_id.empty() && worker_id != out.worker_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate URI '", uri, "' names a second worker id"));
    }
    out.role = r;
    if (!worker_id.empty()) out.worker_id = std::move(worker_id);
  }
  return out;
}

}  // namespace

absl::string_view RoleName(Role role) {
  for (const auto& [r, name] : kRoleNames) {
    if (r == role) return name;
  }
  return "unknown";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (const auto& [r, n] : kRoleNames) {
    if (n == name) return r;
  }
  return std::nullopt;
}

bool IsWorkerRole(Role role) { return RoleSet::Workers().Contains(role); }

std::string IdentityUri(Role role, absl::string_view worker_id) {
  if (worker_id.empty()) return absl::StrCat(kRoleUriPrefix, RoleName(role));
  return absl::StrCat(kRoleUriPrefix, RoleName(role), kWorkerUriInfix, worker_id);
}

bool IsValidWorkerId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxWorkerIdBytes) return false;
  for (char c : id) {
    const bool ok =
        absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string RoleSet::ToString() const {
  std::vector<absl::string_view> names;
  for (const auto& [r, name] : kRoleNames) {
    if (Contains(r)) names.push_back(name);
  }
  return absl::StrJoin(names, "|");
}

std::string PeerIdentity::ToString() const {
  if (worker_id.empty()) return absl::StrCat(RoleName(role), ":", name);
  return absl::StrCat(RoleName(role), ":", name, kWorkerUriInfix, worker_id);
}

absl::StatusOr<PeerIdentity> IdentityFromCertificatePem(absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf failed");
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return absl::InvalidArgumentError("not a PEM certificate");
  absl::StatusOr<UriIdentity> from_uris = IdentityFromUris(UriSans(cert.get()));
  if (!from_uris.ok()) return from_uris.status();
  std::optional<Role> role = from_uris->role;
  const std::vector<std::string> ous = SubjectEntries(cert.get(), NID_organizationalUnitName);
  for (const std::string& ou : ous) {
    std::optional<Role> r = ParseRole(ou);
    if (!r.has_value()) continue;
    if (role.has_value() && *role != *r) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate OU '", ou, "' conflicts with its role URI"));
    }
    if (!role.has_value()) role = r;
  }
  if (!role.has_value()) return absl::PermissionDeniedError("certificate names no tandem role");
  PeerIdentity id;
  id.role = *role;
  id.worker_id = std::move(from_uris->worker_id);
  const std::vector<std::string> cns = SubjectEntries(cert.get(), NID_commonName);
  if (!cns.empty()) id.name = cns.front();
  return id;
}

}  // namespace tandem::security
