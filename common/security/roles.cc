#include "common/security/roles.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <array>
#include <memory>
#include <vector>

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

// The role the URI SANs name; nullopt when none does; an error when they disagree.
absl::StatusOr<std::optional<Role>> RoleFromUris(const std::vector<std::string>& uris) {
  std::optional<Role> role;
  for (const std::string& uri : uris) {
    if (!absl::StartsWith(uri, kRoleUriPrefix)) continue;
    std::optional<Role> r = ParseRole(absl::string_view(uri).substr(kRoleUriPrefix.size()));
    if (!r.has_value() || (role.has_value() && *role != *r)) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate role URI '", uri, "' is unknown or conflicts with another"));
    }
    role = r;
  }
  return role;
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

std::string RoleSet::ToString() const {
  std::vector<absl::string_view> names;
  for (const auto& [r, name] : kRoleNames) {
    if (Contains(r)) names.push_back(name);
  }
  return absl::StrJoin(names, "|");
}

std::string PeerIdentity::ToString() const { return absl::StrCat(RoleName(role), ":", name); }

absl::StatusOr<PeerIdentity> IdentityFromCertificatePem(absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf failed");
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return absl::InvalidArgumentError("not a PEM certificate");
  absl::StatusOr<std::optional<Role>> role = RoleFromUris(UriSans(cert.get()));
  if (!role.ok()) return role.status();
  const std::vector<std::string> ous = SubjectEntries(cert.get(), NID_organizationalUnitName);
  for (const std::string& ou : ous) {
    std::optional<Role> r = ParseRole(ou);
    if (!r.has_value()) continue;
    if (role->has_value() && **role != *r) {
      return absl::PermissionDeniedError(
          absl::StrCat("certificate OU '", ou, "' conflicts with its role URI"));
    }
    if (!role->has_value()) *role = r;
  }
  if (!role->has_value()) return absl::PermissionDeniedError("certificate names no tandem role");
  PeerIdentity id;
  id.role = **role;
  const std::vector<std::string> cns = SubjectEntries(cert.get(), NID_commonName);
  if (!cns.empty()) id.name = cns.front();
  return id;
}

}  // namespace tandem::security
