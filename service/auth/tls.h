// TLS material read from files and re-read when the files change (certificate rotation without a
// restart), and the client-certificate check that mTLS uses on both the gRPC and HTTP ports.
//
//   TlsFiles files({"server.crt", "server.key", "clients-ca.crt"});
//   OFFLOAD_RETURN_IF_ERROR(files.Load());                   // at start: errors are fatal
//   std::shared_ptr<const TlsFiles::Material> m = files.Current();   // reloads if changed
//   absl::StatusOr<std::string> identity = files.VerifyClient(leaf, untrusted_chain);
//
// A reload that fails (a half-written file) keeps the previous material and logs a warning.
// Files are looked at no more than once per second. Identity of a client certificate: its first
// URI subject alternative name, else its first DNS name, else its subject common name.
// Thread-safety: every method may be called from any thread.
#ifndef SERVICE_AUTH_TLS_H_
#define SERVICE_AUTH_TLS_H_

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace offload::auth {

// The identity a certificate names (see above); empty if it names none.
std::string IdentityOf(X509* cert);

// A number that changes when the file at `path` is replaced or rewritten (mtime, size, inode);
// 0 if it cannot be read. Used to notice changed certificate and policy files.
int64_t FileFingerprint(const std::string& path);

class TlsFiles {
 public:
  struct Paths {
    std::string cert_file;       // PEM: the server certificate, then its chain
    std::string key_file;        // PEM private key
    std::string client_ca_file;  // PEM CA certificates for client certificates; empty: no mTLS
  };
  struct Material {
    std::string cert_pem, key_pem, client_ca_pem;  // as read (gRPC takes PEM)
    X509* cert = nullptr;
    STACK_OF(X509)* chain = nullptr;  // certificates after the first in cert_file
    EVP_PKEY* key = nullptr;
    X509_STORE* client_cas = nullptr;  // null without mTLS
    ~Material();
  };

  explicit TlsFiles(Paths paths) : paths_(std::move(paths)) {}
  const Paths& paths() const { return paths_; }
  bool mtls() const { return !paths_.client_ca_file.empty(); }

  // Reads every file now. InvalidArgument naming the file if one cannot be used (unreadable, not
  // PEM, key not matching the certificate).
  absl::Status Load();
  // The newest good material (re-read first if a file changed since the last look).
  std::shared_ptr<const Material> Current();

  // Checks `leaf` (with `untrusted` intermediates, may be null) against the client CAs for TLS
  // client use. The client's identity, or Unauthenticated with the reason.
  absl::StatusOr<std::string> VerifyClient(X509* leaf, STACK_OF(X509) * untrusted);
  // The same for PEM: the leaf, and any other certificates the client sent (gRPC hands them
  // over so; on the server side OpenSSL's peer chain may or may not repeat the leaf).
  absl::StatusOr<std::string> VerifyClientPem(absl::string_view leaf_pem,
                                              absl::string_view chain_pem);

  // Installs Current()'s certificate and key on `ssl` (an OpenSSL certificate callback).
  bool UseOn(SSL* ssl);

 private:
  absl::StatusOr<std::shared_ptr<const Material>> Read() const;
  int64_t Stamp() const;  // changes when any file changes

  const Paths paths_;
  absl::Mutex mu_;
  std::shared_ptr<const Material> current_ ABSL_GUARDED_BY(mu_);
  int64_t stamp_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_look_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_TLS_H_
