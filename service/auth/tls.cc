#include "service/auth/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "service/common/log.h"

namespace offload::auth {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

BioPtr MemBio(absl::string_view data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Every certificate in `pem`, in order.
STACK_OF(X509) * ReadCerts(absl::string_view pem) {
  STACK_OF(X509)* certs = sk_X509_new_null();
  BioPtr bio = MemBio(pem);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(certs, cert);
  }
  ERR_clear_error();  // the end of the file reads as an error
  return certs;
}

}  // namespace

int64_t FileFingerprint(const std::string& path) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0) return 0;
  // Unsigned: a fingerprint of mtime, size and inode that may wrap (signed overflow is UB).
  const uint64_t v = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000u +
                     static_cast<uint64_t>(st.st_mtim.tv_nsec) +
                     static_cast<uint64_t>(st.st_size) * 7u + static_cast<uint64_t>(st.st_ino) * 13u;
  return static_cast<int64_t>(v >> 1);
}


std::string IdentityOf(X509* cert) {
  if (cert == nullptr) return "";
  std::string dns;
  if (auto* names = static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr))) {
    std::string uri;
    for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type != GEN_URI && name->type != GEN_DNS) continue;
      const ASN1_IA5STRING* s = name->type == GEN_URI ? name->d.uniformResourceIdentifier
                                                      : name->d.dNSName;
      std::string value(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                        static_cast<size_t>(ASN1_STRING_length(s)));
      if (name->type == GEN_URI && uri.empty()) uri = std::move(value);
      if (name->type == GEN_DNS && dns.empty()) dns = std::move(value);
    }
    GENERAL_NAMES_free(names);
    if (!uri.empty()) return uri;
    if (!dns.empty()) return dns;
  }
  X509_NAME* subject = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0) return "";
  const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, cn);
  if (n < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

TlsFiles::Material::~Material() {
  X509_free(cert);
  sk_X509_pop_free(chain, X509_free);
  EVP_PKEY_free(key);
  X509_STORE_free(client_cas);
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
}

int64_t TlsFiles::Stamp() const {
  const uint64_t stamp = static_cast<uint64_t>(FileFingerprint(paths_.cert_file)) ^
                         (static_cast<uint64_t>(FileFingerprint(paths_.key_file)) * 31u) ^
                         (static_cast<uint64_t>(FileFingerprint(paths_.client_ca_file)) * 1009u);
  return static_cast<int64_t>(stamp >> 1);
}

absl::StatusOr<std::shared_ptr<const TlsFiles::Material>> TlsFiles::Read() const {
  auto m = std::make_shared<Material>();
  absl::StatusOr<std::string> cert = ReadFile(paths_.cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(paths_.key_file);
  if (!key.ok()) return key.status();
  m->cert_pem = *std::move(cert);
  m->key_pem = *std::move(key);
  OPENSSL_cleanse(key->data(), key->size());
  STACK_OF(X509)* certs = ReadCerts(m->cert_pem);
  if (sk_X509_num(certs) == 0) {
    sk_X509_free(certs);
    return absl::InvalidArgumentError(absl::StrCat(paths_.cert_file, ": no PEM certificate"));
  }
  m->cert = sk_X509_shift(certs);
  m->chain = certs;
  BioPtr bio = MemBio(m->key_pem);
  m->key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (m->key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(paths_.key_file, ": no PEM private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(m->cert, m->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(paths_.key_file, ": does not match ",
                                                   paths_.cert_file));
  }
  if (mtls()) {
    absl::StatusOr<std::string> ca = ReadFile(paths_.client_ca_file);
    if (!ca.ok()) return ca.status();
    m->client_ca_pem = *std::move(ca);
    STACK_OF(X509)* cas = ReadCerts(m->client_ca_pem);
    const int n = sk_X509_num(cas);
    m->client_cas = X509_STORE_new();
    for (int i = 0; i < n; ++i) X509_STORE_add_cert(m->client_cas, sk_X509_value(cas, i));
    sk_X509_pop_free(cas, X509_free);
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(paths_.client_ca_file, ": no PEM certificate"));
    }
  }
  return std::shared_ptr<const Material>(std::move(m));
}

absl::Status TlsFiles::Load() {
  const int64_t stamp = Stamp();
  absl::StatusOr<std::shared_ptr<const Material>> m = Read();
  if (!m.ok()) return m.status();
  absl::MutexLock lock(&mu_);
  current_ = *std::move(m);
  stamp_ = stamp;
  last_look_ = absl::Now();
  return absl::OkStatus();
}

std::shared_ptr<const TlsFiles::Material> TlsFiles::Current() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_look_ < absl::Seconds(1)) return current_;
    last_look_ = now;
    if (Stamp() == stamp_) return current_;
  }
  const int64_t stamp = Stamp();
  absl::StatusOr<std::shared_ptr<const Material>> m = Read();
  absl::MutexLock lock(&mu_);
  if (!m.ok()) {
    if (stamp != stamp_) {
      Log(LogLevel::kWarning, "tls_reload_failed",
          {{"error", std::string(m.status().message())}, {"kept", "previous certificates"}});
      stamp_ = stamp;  // warn once per change
    }
    return current_;
  }
  current_ = *std::move(m);
  stamp_ = stamp;
  Log(LogLevel::kInfo, "tls_reloaded", {{"cert_file", paths_.cert_file}});
  return current_;
}

absl::StatusOr<std::string> TlsFiles::VerifyClient(X509* leaf, STACK_OF(X509) * untrusted) {
  if (leaf == nullptr) return absl::UnauthenticatedError("no client certificate");
  std::shared_ptr<const Material> m = Current();
  if (m == nullptr || m->client_cas == nullptr) {
    return absl::UnauthenticatedError("client certificates are not configured");
  }
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  if (ctx == nullptr || X509_STORE_CTX_init(ctx, m->client_cas, leaf, untrusted) != 1) {
    X509_STORE_CTX_free(ctx);
    return absl::InternalError("cannot set up certificate verification");
  }
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_CLIENT);
  const int ok = X509_verify_cert(ctx);
  const int error = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  ERR_clear_error();
  if (ok != 1) {
    return absl::UnauthenticatedError(absl::StrCat("client certificate of ", IdentityOf(leaf),
                                                   " refused: ",
                                                   X509_verify_cert_error_string(error)));
  }
  std::string identity = IdentityOf(leaf);
  if (identity.empty()) {
    return absl::UnauthenticatedError("client certificate names no identity (SAN or CN)");
  }
  return identity;
}

absl::StatusOr<std::string> TlsFiles::VerifyClientPem(absl::string_view leaf_pem,
                                                      absl::string_view chain_pem) {
  STACK_OF(X509)* leaves = ReadCerts(leaf_pem);
  STACK_OF(X509)* chain = ReadCerts(chain_pem);
  X509* leaf = sk_X509_num(leaves) > 0 ? sk_X509_value(leaves, 0) : nullptr;
  absl::StatusOr<std::string> identity = VerifyClient(leaf, chain);
  sk_X509_pop_free(leaves, X509_free);
  sk_X509_pop_free(chain, X509_free);
  return identity;
}

bool TlsFiles::UseOn(SSL* ssl) {
  std::shared_ptr<const Material> m = Current();
  if (m == nullptr) return false;
  return SSL_use_cert_and_key(ssl, m->cert, m->key, m->chain, /*override=*/1) == 1;
}

}  // namespace offload::auth
