// TLS channel credentials from PEM files or buffers, checked before any connection is made, and
// the bearer token rules shared by the C++ client, the C ABI and offloadctl.
//
//   offload::client::TlsFiles tls;
//   tls.ca_file = "/etc/offload/ca.crt";          // the CAs that sign the server's certificate
//   tls.cert_file = "/etc/offload/client.crt";    // mTLS: our certificate (chain) ...
//   tls.key_file = "/etc/offload/client.key";     // ... and its private key
//   absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = MakeTlsCredentials(tls);
//   options.credentials = *creds;                 // ClientOptions
//
// A broken input is found here, as InvalidArgument naming the field, and not at the first
// handshake as an UNAVAILABLE that does not say why: an unreadable file, a field given both as a
// file and as a buffer, text with no PEM certificate, a certificate without its key (or the
// reverse), a key that is not the certificate's. Messages name files, never key material.
// Thread-safe (no state).
#ifndef CLIENT_CPP_CREDENTIALS_H_
#define CLIENT_CPP_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"

namespace offload::client {

// Each PEM input as a file path or as the PEM text itself (at most one of the two); all empty
// means TLS with the system's trusted roots and no client certificate.
struct TlsFiles {
  std::string ca_file;  // PEM CA certificates the server's certificate must chain to
  std::string ca_pem;
  std::string cert_file;  // PEM client certificate (then its chain), for mTLS
  std::string cert_pem;
  std::string key_file;  // PEM private key of the client certificate (unencrypted)
  std::string key_pem;
};

// TLS credentials for `files`, after checking them (see above). InvalidArgument names the field
// as "tls_ca_file", "tls_cert_pem", ... (the names of offload.h and of offloadctl's flags).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsCredentials(
    const TlsFiles& files);

// OK when `token` can be sent as "authorization: Bearer <token>": 1 to 16384 visible ASCII
// characters (a JWT is base64url and dots). InvalidArgument names `field` and the position of a
// bad byte, never the token.
[[nodiscard]] absl::Status CheckBearerToken(absl::string_view field, absl::string_view token);

}  // namespace offload::client

#endif  // CLIENT_CPP_CREDENTIALS_H_
