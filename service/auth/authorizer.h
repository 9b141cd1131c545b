// Authorization and audit for every call, whatever the transport (gRPC or HTTP): who the caller
// is (a verified client certificate, a bearer token, or a certificate a trusted proxy forwarded:
// the transport finds it, see Peer), whether the policy lets it do this call's
// operation on every key the request names, and a JSON-lines audit trail of key lifecycle events
// and refusals.
//
//   Authorizer::Options options;
//   options.mtls = true;                       // callers must present a verified certificate
//   options.policy_file = "/etc/offload/policy.json";   // empty: any verified client may do all
//   options.audit_file = "/var/log/offload/audit.jsonl";  // empty: the main log (stderr)
//   OFFLOAD_ASSIGN_OR_RETURN(auto authorizer, Authorizer::Create(options));
//   absl::Status s = authorizer->Authorize({identity, "ipv4:127.0.0.1"}, path, request, "grpc");
//
// Without any source of identities (mTLS, tokens, forwarded identities) and without
// `require_identity`, every call is allowed and key lifecycle events are still audited, with the
// peer address. A call without an identity is refused (UNAUTHENTICATED) under `require_identity`,
// mTLS or a policy; tokens alone leave them optional. Under `require_identity`, key lifecycle
// calls are for the policy's admins only (none without a policy). The policy file is re-read when it changes (looked at
// once per second at most); a policy that does not parse keeps the previous one and logs an
// error. Audit lines carry identities, methods, key ids, codes and reasons: never key material or
// messages. Thread-safety: every method may be called from any thread.
#ifndef SERVICE_AUTH_AUTHORIZER_H_
#define SERVICE_AUTH_AUTHORIZER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "service/auth/audit_chain.h"
#include "service/auth/policy.h"

namespace offload::auth {

struct Peer {
  std::string identity;  // verified identity; empty if none
  std::string address;   // e.g. "ipv4:127.0.0.1:51234", for the audit trail
  // The client a trusted proxy forwarded (X-Forwarded-For, see TrustedProxies); empty if none.
  std::string forwarded_client;
  // Where `identity` came from, for the audit trail: "certificate", "token", "forwarded".
  const char* identity_source = "";
  // The name admission control counts calls under: the identity, else the forwarded client,
  // else the address's host (every connection from one host shares it).
  std::string ClientName() const;
  // The host part of `address` ("127.0.0.1", "::1").
  std::string Host() const;
};

// Every `key_id` string field in `message`, recursively (batch items included), deduplicated.
std::vector<std::string> KeyIdsOf(const google::protobuf::Message& message);

class Authorizer {
 public:
  struct Options {
    bool mtls = false;  // client certificates checked on the handshake
    std::string policy_file;
    std::string audit_file;
    bool tokens = false;            // bearer tokens checked (TokenVerifier)
    bool forwarded = false;         // identities forwarded by trusted proxies
    bool require_identity = false;  // no anonymous calls; key lifecycle for admins only
    // With audit_file: each line carries an HMAC chaining it to the one before (AuditChain),
    // under this key (at least 32 bytes); empty: plain lines.
    std::string audit_chain_key;
  };
  struct Counts {
    uint64_t unauthenticated = 0;
    uint64_t permission_denied = 0;
    uint64_t handshake_refused = 0;
    uint64_t forwarded_ignored = 0;
  };

  // InvalidArgument if the policy file cannot be read or parsed, or is given without a source of
  // identities;
  // Unavailable if the audit file cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(Options options);
  ~Authorizer();

  // OK, Unauthenticated (no identity where one is required) or PermissionDenied; refusals are
  // audited and counted. `path` is "/offload.v1.AeadService/Open".
  absl::Status Authorize(const Peer& peer, absl::string_view path,
                         const google::protobuf::Message& request, absl::string_view transport);

  // Audits a finished key-management call (create, import, rotate, delete), successful or not.
  // Other methods are ignored. `version` is the key's current version after the call, 0 if none.
  void AuditKeyCall(const Peer& peer, absl::string_view path,
                    const google::protobuf::Message& request, const absl::Status& status,
                    uint32_t version, absl::string_view transport);

  // Audits and counts a call refused before Authorize for who it claims to be (a bad token, an
  // unreadable forwarded identity): `status` is the refusal, its message the reason.
  void AuditUnauthenticated(const Peer& peer, absl::string_view path, const absl::Status& status,
                            absl::string_view transport);

  // Audits a request the HTTP engine refused before anyone read who sent it (headers over the
  // bound): `reason` says why. Not counted here (the engine counts it as abuse).
  void AuditRefusedRequest(absl::string_view peer_address, absl::string_view port,
                           absl::string_view reason);

  // Counts a forwarded identity header from a peer that is not a trusted proxy (ignored: anyone
  // can write it) and logs it, once per ten seconds at most.
  void ForwardedIdentityIgnored(const Peer& peer, absl::string_view header);

  // Audits a TLS handshake refused for a bad client certificate (reason from the verifier).
  void AuditHandshakeRefused(absl::string_view transport, absl::string_view claimed_identity,
                             absl::string_view reason);

  bool mtls() const { return options_.mtls; }
  // Whether Authorize has anything to do (else every call is allowed unread).
  bool enforcing() const {
    return options_.mtls || options_.tokens || options_.forwarded || options_.require_identity;
  }
  Counts counts() const;

 private:
  explicit Authorizer(Options options) : options_(std::move(options)) {}
  std::shared_ptr<const Policy> CurrentPolicy();
  void Audit(absl::string_view event, nlohmann::json fields);

  const Options options_;
  std::FILE* audit_ = nullptr;  // null: the main log
  absl::Mutex audit_mu_;
  std::unique_ptr<AuditChain> chain_ ABSL_GUARDED_BY(audit_mu_);  // null: plain lines
  absl::Mutex policy_mu_;
  std::shared_ptr<const Policy> policy_ ABSL_GUARDED_BY(policy_mu_);
  int64_t policy_stamp_ ABSL_GUARDED_BY(policy_mu_) = 0;
  absl::Time policy_look_ ABSL_GUARDED_BY(policy_mu_) = absl::InfinitePast();
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> permission_denied_{0};
  std::atomic<uint64_t> handshake_refused_{0};
  std::atomic<uint64_t> forwarded_ignored_{0};
  std::atomic<int64_t> forwarded_ignored_logged_ns_{0};
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_AUTHORIZER_H_
