#include "client/cpp/credentials.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"

namespace offload::client {
namespace {

constexpr size_t kMaxTokenBytes = 16384;
constexpr size_t kMaxPemFileBytes = 1 << 20;

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

void Wipe(std::string* s) {
  if (!s->empty()) OPENSSL_cleanse(s->data(), s->size());
}

// Refuses to prompt for a passphrase (OpenSSL's default would read the terminal).
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return -1; }

// One PEM input: "tls_<name>_file" or "tls_<name>_pem", the one that is set. `*field` names it.
absl::StatusOr<std::string> ReadPem(absl::string_view name, const std::string& file,
                                    const std::string& pem, std::string* field) {
  const std::string file_field = absl::StrCat("tls_", name, "_file");
  const std::string pem_field = absl::StrCat("tls_", name, "_pem");
  if (!file.empty() && !pem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_field, ", ", pem_field, ": expected at most one, got both"));
  }
  if (pem.empty()) {
    *field = file_field;
    if (file.empty()) return std::string();
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_field, ": cannot read '", file, "': ", std::strerror(errno)));
    }
    std::string data;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0 && data.size() <= kMaxPemFileBytes) {
      data.append(buffer, n);
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    OPENSSL_cleanse(buffer, sizeof(buffer));
    if (failed) {
      Wipe(&data);
      return absl::InvalidArgumentError(absl::StrCat(file_field, ": cannot read '", file, "'"));
    }
    if (data.size() > kMaxPemFileBytes) {
      Wipe(&data);
      return absl::InvalidArgumentError(absl::StrCat(
          file_field, ": expected at most ", kMaxPemFileBytes, " bytes, got more in '", file, "'"));
    }
    if (data.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(file_field, ": '", file, "' is empty"));
    }
    return data;
  }
  *field = pem_field;
  return pem;
}

// Where a field's text came from, for messages: " in '<path>'" or "".
std::string Where(const std::string& field, const std::string& file) {
  return absl::EndsWith(field, "_file") ? absl::StrCat(" in '", file, "'") : std::string();
}

// The certificates in `pem`, at least one; InvalidArgument names `field` otherwise.
absl::Status CheckCertificates(const std::string& field, const std::string& where,
                               const std::string& pem, X509Ptr* first) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  int count = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr)) {
    if (count++ == 0 && first != nullptr) {
      first->reset(cert);
    } else {
      X509_free(cert);
    }
  }
  ERR_clear_error();  // the read that ended the loop
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected PEM certificates (-----BEGIN CERTIFICATE-----), got none", where));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsCredentials(
    const TlsFiles& files) {
  grpc::SslCredentialsOptions ssl;
  absl::Cleanup wipe_key = [&ssl] { Wipe(&ssl.pem_private_key); };
  std::string ca_field, cert_field, key_field;

  absl::StatusOr<std::string> ca = ReadPem("ca", files.ca_file, files.ca_pem, &ca_field);
  if (!ca.ok()) return ca.status();
  if (!ca->empty()) {
    absl::Status s = CheckCertificates(ca_field, Where(ca_field, files.ca_file), *ca, nullptr);
    if (!s.ok()) return s;
    ssl.pem_root_certs = *std::move(ca);
  }

  absl::StatusOr<std::string> cert =
      ReadPem("cert", files.cert_file, files.cert_pem, &cert_field);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("key", files.key_file, files.key_pem, &key_field);
  if (!key.ok()) return key.status();
  absl::Cleanup wipe_read_key = [&key] { Wipe(&*key); };
  if (cert->empty() != key->empty()) {
    return absl::InvalidArgumentError(
        cert->empty()
            ? "tls_cert_file, tls_cert_pem: expected the client certificate of the private key "
              "given in tls_key_file / tls_key_pem, got none"
            : "tls_key_file, tls_key_pem: expected the private key of the client certificate "
              "given in tls_cert_file / tls_cert_pem, got none");
  }
  if (!cert->empty()) {
    X509Ptr leaf;
    absl::Status s = CheckCertificates(cert_field, Where(cert_field, files.cert_file), *cert,
                                       &leaf);
    if (!s.ok()) return s;
    BioPtr bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
    if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
    PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
    ERR_clear_error();
    if (pkey == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(key_field, ": expected an unencrypted PEM private key, got none",
                       Where(key_field, files.key_file)));
    }
    if (X509_check_private_key(leaf.get(), pkey.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          key_field, ": expected the private key of the certificate in ", cert_field,
          ", got another key", Where(key_field, files.key_file)));
    }
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

absl::Status CheckBearerToken(absl::string_view field, absl::string_view token) {
  if (token.empty() || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected 1 to ", kMaxTokenBytes, " characters, got ", token.size()));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": expected visible ASCII characters, got byte 0x",
          absl::Hex(c, absl::kZeroPad2), " at position ", i, " of ", token.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace offload::client
