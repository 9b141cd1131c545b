// The client identity a TLS-terminating proxy forwards in a header, read the way our own mTLS
// reads a client certificate (its first URI SAN, else its first DNS SAN, else its subject CN).
// Only requests from a trusted proxy (TrustedProxies) may be read this way: anyone else can write
// these headers.
//
//   OFFLOAD_ASSIGN_OR_RETURN(ForwardedIdentity fi, ForwardedIdentity::Parse("x-forwarded-client-cert"));
//   fi.IdentityOf("By=spiffe://offload;Hash=ab12;URI=spiffe://offload/app-b")  // "spiffe://offload/app-b"
//
// Headers:
//   x-forwarded-client-cert  Envoy's XFCC: the last element (the nearest proxy's) - its URI,
//                            else DNS, else the CN of Subject. Run Envoy with
//                            forward_client_cert_details SANITIZE_SET, so that nothing the
//                            client wrote is passed on; a value with an open quote or a dangling
//                            backslash is refused either way
//   ssl-client-cert          nginx's $ssl_client_escaped_cert: the URL-encoded PEM certificate
//   x-ssl-client-s-dn        nginx's $ssl_client_s_dn: the CN of an RFC 2253 subject
// Thread-safety: const after Parse; any thread.
#ifndef SERVICE_AUTH_FORWARDED_IDENTITY_H_
#define SERVICE_AUTH_FORWARDED_IDENTITY_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offload::auth {

class ForwardedIdentity final {
 public:
  enum class Kind { kXfcc, kNginxCert, kNginxSubjectDn };
  // `header` is one of the names above (any case); InvalidArgument otherwise.
  static absl::StatusOr<ForwardedIdentity> Parse(absl::string_view header);

  // The lower-case header name to read.
  const std::string& header() const { return header_; }
  // The identity `value` names; InvalidArgument if it names none or does not parse.
  absl::StatusOr<std::string> IdentityOf(absl::string_view value) const;

 private:
  ForwardedIdentity(Kind kind, std::string header) : kind_(kind), header_(std::move(header)) {}
  Kind kind_;
  std::string header_;
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_FORWARDED_IDENTITY_H_
