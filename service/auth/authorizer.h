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
// messages.
//
// Data plane (issue 26): with `audit_data_plane` > 0, that fraction of the calls of the methods
// that use a key (api::Method::data_plane: Sign, Derive, Box, AEAD...) is audited, one
// "data_plane" line per call (AuditDataPlane): identity, peer, method, key id and the version
// the call used, code, batch items, memo hits. With `audit_fail_closed`, a call that must be
// audited is refused (UNAVAILABLE) while the audit file is known unwritable (AuditUnwritable),
// and the transport holds a call's answer until its line is written (the `done` of the Audit*
// calls), answering UNAVAILABLE instead when it could not be. Lines go through an AuditSink: no
// thread that audits waits for the disk.
// Thread-safety: every method may be called from any thread.
#ifndef SERVICE_AUTH_AUTHORIZER_H_
#define SERVICE_AUTH_AUTHORIZER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
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
#include "service/auth/audit_sink.h"
#include "service/auth/policy.h"
#include "service/common/secure_memory.h"

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

// What a data-plane audit line says about a finished call: read from its request and response.
struct DataPlaneCall {
  struct Key {
    std::string key_id;
    uint32_t version = 0;  // 0: not known (the response names none and the request asked for 0)
  };
  std::vector<Key> keys;   // distinct (key id, version), in the request's order, at most kMaxKeys
  size_t more_keys = 0;    // distinct pairs beyond kMaxKeys
  int items = -1;          // a batch's items; -1 for a single call
  int memo_hits = 0;       // results served from a memo
  int failed_items = 0;    // batch items that ended with an error of their own
  static constexpr size_t kMaxKeys = 256;
};
// The key ids (`key_id`), the versions used (the response's `key_version`, else the request's),
// and memo hits (`memo_hit`) of a call; for a batch (`batch`), per item of `items` and
// `results` (each {status, response}).
// `response` may be null (the call failed: versions are the requested ones).
DataPlaneCall DescribeDataPlaneCall(const google::protobuf::Message& request,
                                    const google::protobuf::Message* response, bool batch);

class Authorizer {
 public:
  struct Options {
    bool mtls = false;  // client certificates checked on the handshake
    std::string policy_file;
    std::string audit_file;
    // Every RPC's operation by path (api::PolicyOperations()): what Authorize checks a call
    // against and what a policy's operation patterns must match. A path not in it is refused
    // (UNIMPLEMENTED) when anything is enforced.
    OperationMap operations;
    bool tokens = false;            // bearer tokens checked (TokenVerifier)
    bool forwarded = false;         // identities forwarded by trusted proxies
    bool require_identity = false;  // no anonymous calls; key lifecycle for admins only
    // With audit_file: each line carries an HMAC chaining it to the one before (AuditChain),
    // under this key (at least 32 bytes); empty: plain lines. Create moves it into the chain:
    // no copy stays in the options it keeps.
    KeyBytes audit_chain_key;
    // With a chain key: audit_checkpoint lines (AuditSink) every this long (zero: only when the
    // file changes and at the stop), also appended to this file when set.
    absl::Duration audit_checkpoint_interval = absl::ZeroDuration();
    std::string audit_checkpoint_file;
    // The fraction of data-plane calls audited: 0 none, 1 every one.
    double audit_data_plane = 0;
    // Refuse calls that must be audited while the audit file is unwritable (needs audit_file).
    bool audit_fail_closed = false;
  };
  struct AuditStats {
    uint64_t data_plane_lines = 0;  // data-plane lines handed to the audit file (or main log)
    uint64_t refused = 0;           // calls refused (fail-closed) for an unwritable audit file
    AuditSink::Stats sink;          // all zero without an audit file
  };
  struct Counts {
    uint64_t unauthenticated = 0;
    uint64_t permission_denied = 0;
    uint64_t handshake_refused = 0;
    uint64_t forwarded_ignored = 0;
  };

  // InvalidArgument if the policy file cannot be read or parsed, or is given without a source of
  // identities, or audit_fail_closed / audit_chain_key without audit_file, or
  // audit_checkpoint_file without audit_chain_key;
  // Unavailable if the audit file cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(Options options);
  ~Authorizer();

  // Called once for a refused call: the refusal, and whether its audit line was written (as
  // AuditSink::Done: on the audit writer's thread, or at once).
  using RefusalDone = std::function<void(absl::Status refusal, bool written)>;
  // OK, Unauthenticated (no identity where one is required) or PermissionDenied; refusals are
  // audited and counted. `path` is "/offload.v1.AeadService/Open". `refusal_done`, when given, is
  // called once if and only if the call is refused (maybe before Authorize returns), so that a
  // fail-closed transport holds the refusal until its line is written.
  absl::Status Authorize(const Peer& peer, absl::string_view path,
                         const google::protobuf::Message& request, absl::string_view transport,
                         RefusalDone refusal_done = nullptr);

  // Audits a finished key-management call (create, import, rotate, delete), successful or not.
  // Other methods are ignored. `version` is the key's current version after the call, 0 if none.
  // `done` (may be null) hears whether the line was written (see AuditSink::Done).
  // Audits key material wiped when its wait ended (the key manager's reaper): a whole key
  // (`versions` empty) or some versions of it. Not a call: no identity.
  void AuditKeyDestroyed(absl::string_view key_id, const std::vector<uint32_t>& versions);
  void AuditKeyCall(const Peer& peer, absl::string_view path,
                    const google::protobuf::Message& request, const absl::Status& status,
                    uint32_t version, absl::string_view transport,
                    AuditSink::Done done = nullptr);

  // Whether this data-plane call is to be audited: a draw at `audit_data_plane` (none at 0 or 1).
  bool SampleDataPlane() const;
  // Audits a finished data-plane call whose `code` is its outcome. `done` as for AuditKeyCall.
  void AuditDataPlane(const Peer& peer, absl::string_view path, absl::string_view transport,
                      const DataPlaneCall& call, absl::StatusCode code,
                      AuditSink::Done done = nullptr);
  // Fail-closed and the audit file known unwritable: calls that must be audited are refused
  // (each refusal counted by CountAuditRefusal).
  bool AuditUnwritable() const {
    return options_.audit_fail_closed && sink_ != nullptr && !sink_->healthy();
  }
  void CountAuditRefusal() { audit_refused_.fetch_add(1, std::memory_order_relaxed); }
  bool audit_fail_closed() const { return options_.audit_fail_closed; }
  double audit_data_plane() const { return options_.audit_data_plane; }
  // Waits until every line audited so far is written (or lost).
  void FlushAudit();
  AuditStats audit_stats() const;

  // Audits and counts a call refused before Authorize for who it claims to be (a bad token, an
  // unreadable forwarded identity): `status` is the refusal, its message the reason. `done` as
  // for AuditKeyCall.
  void AuditUnauthenticated(const Peer& peer, absl::string_view path, const absl::Status& status,
                            absl::string_view transport, AuditSink::Done done = nullptr);

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
  // Whether Authorize refuses a call without an identity (require_identity, mTLS or a policy).
  bool RequiresIdentity() const {
    return options_.require_identity || options_.mtls || !options_.policy_file.empty();
  }
  // Whether Authorize has anything to do (else every call is allowed unread).
  bool enforcing() const {
    return options_.mtls || options_.tokens || options_.forwarded || options_.require_identity;
  }
  Counts counts() const;

 private:
  explicit Authorizer(Options options) : options_(std::move(options)) {}
  std::shared_ptr<const Policy> CurrentPolicy();
  void Audit(absl::string_view event, nlohmann::json fields, AuditSink::Done done = nullptr);
  void AuditOrdered(nlohmann::ordered_json line, AuditSink::Done done);

  const Options options_;
  std::unique_ptr<AuditSink> sink_;  // null: the main log
  std::atomic<uint64_t> data_plane_lines_{0};
  std::atomic<uint64_t> audit_refused_{0};
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
