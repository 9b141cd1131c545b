// One call's steps, the same for every protocol and port: who the caller is (certificate,
// forwarded identity, bearer token), whether it may (grants), admission, the deadline, the memo
// first (answered where the request was read: no crypto, no queue), the run on the loop that
// read it (ops/inline_rule.h: a single operation, a small batch) or on the worker pool, then
// the finish: audit (held answers for key lifecycle calls and fail-closed auditing),
// metrics, the request log. No protocol knowledge: the protocol side derives from Call, decodes
// the request into it, and fills the narrow interface below (metadata by name, whether the
// caller is gone, how to encode and send an answer).
//
//   class HttpCall final : public call::Call { ... Metadata, Gone, Encode, Send ... };
//   auto c = std::make_shared<HttpCall>(context, method, exchange);
//   absl::Status s = Decode(body, c->NewRequest());   // the protocol's decoding
//   if (!s.ok()) return c->Fail(s);                    // answered, counted, logged
//   c->Start({peer_address, certificate_identity}, deadline);
//
// The call then answers exactly once, through Encode (then Send), from the thread where it
// finished: the loop thread for a memo hit, a refusal or a call run there (ops::InlineRule), a
// worker otherwise, the audit writer's
// thread for an answer held for its audit line.
// Refusals a later try may get past carry when to come back (ops/retry_delay.h), which the
// protocol side sends in its terms.
// Thread-safety: a call runs one step at a time (it hands itself from thread to thread); the
// context and method must outlive every call (held by shared_ptr / the method table).
#ifndef SERVICE_CALL_CALL_H_
#define SERVICE_CALL_CALL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/message.h"
#include "service/api/method_table.h"
#include "service/auth/authorizer.h"
#include "service/auth/forwarded_identity.h"
#include "service/auth/tokens.h"
#include "service/auth/trusted_proxies.h"
#include "service/metrics/metrics.h"
#include "service/ops/admission.h"
#include "service/ops/inline_rule.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload::call {

// What every call of a port shares. Not owned pointers may be null (nothing done for them),
// except `pool`.
struct Context {
  ops::WorkerPool* pool = nullptr;
  // Identity, grants and audit; overload protection.
  auth::Authorizer* authorizer = nullptr;
  ops::Admission* admission = nullptr;
  // Proxies whose forwarded client admission counts (x-forwarded-for), and whose forwarded
  // identity header names the caller (null: no such header is read).
  auth::TrustedProxies trusted_proxies;
  const auth::ForwardedIdentity* forwarded_identity = nullptr;
  // Bearer tokens (`authorization: Bearer <JWT>`) name the caller when set.
  auth::TokenVerifier* tokens = nullptr;
  // [issue 34] Which calls run to completion on the loop that read them instead of hopping to
  // the pool (the protocol side says what the loop has run: Call::CurrentLoop); unset: none.
  std::optional<ops::InlineRule> inline_rule;
  // Client certificates are required (mTLS): every caller is identified.
  bool mtls = false;
  // Fraction of calls logged (method, code, latency, items; never payloads).
  double log_sample_rate = 0;
  // Per-method metrics (empty: nothing counted) and the methods drawn for the data-plane audit
  // (api::Method::data_plane; empty when --audit_data_plane is off).
  absl::flat_hash_map<const api::Method*, metrics::MethodMetrics*> method_metrics;
  absl::flat_hash_set<const api::Method*> data_plane;
};

// The caller as its connection shows it.
struct Caller {
  std::string address;               // "ipv4:127.0.0.1:51234", as gRPC names peers
  std::string certificate_identity;  // the verified TLS client certificate's; empty: none
};

// A response message answered without a copy of its bulk: its serialized bytes are `head`, then
// `body` (a buffer of the memo's, or the one the cipher wrote, which the memo then shares), then
// `tail`; `owner` keeps `body` valid until the answer is written (the protocol side keeps it,
// and may move `head` and `tail`).
struct SharedMessage {
  std::string head;
  absl::string_view body;
  std::string tail;
  std::shared_ptr<const void> owner;
};

// What the loop thread a call was read on has run (the protocol side's engine's count), for
// ops::InlineRule.
struct LoopLoad {
  bool on_loop = false;  // the calling thread is one of the engine's loops
  int64_t charged = 0;   // estimated work run for the input at hand (ns)
  int64_t waiting = 0;   // answers from other threads waiting on that loop
};

// How a refusal for who the caller claims to be says how to authenticate (RFC 6750), when
// tokens are on.
enum class Challenge { kNone, kBearer, kInvalidToken };

// What the protocol side encodes: a result, or a status.
struct Reply {
  absl::Status status;
  // When OK: the response message, or (shared != null) its bytes as the memo holds them.
  const google::protobuf::Message* response = nullptr;
  SharedMessage* shared = nullptr;  // the protocol side may move from it
  Challenge challenge = Challenge::kNone;
};

class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(std::shared_ptr<const Context> context, const api::Method* method);
  virtual ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  const api::Method& method() const { return *method_; }

  // A new empty request (and response) of the method's types: what the protocol side decodes
  // into. REQUIRES: called once, before Start.
  google::protobuf::Message* NewRequest();

  // [issue 34] AEAD Open read where it lies (TakesOpenInPlace): the protocol side hands the
  // request's bytes to the call (KeepBody: the call keeps them, so that a fresh open moves them
  // into the memo entry without a copy), finds the request's fields in them, and says where
  // they are (SetOpenInPlace: AeadOpenRequest's fields 1-3, views into the kept bytes; the key
  // id and associated data are copied into NewRequest()'s message, for grants and audit).
  // Otherwise it decodes into NewRequest() as for any method.
  bool TakesOpenInPlace() const;
  const std::string& KeepBody(std::string body);
  void SetOpenInPlace(absl::string_view key_id, absl::string_view envelope,
                      absl::string_view associated_data);
  // Frees what KeepBody kept (the request was decoded into its message instead).
  void DropBody() { std::string().swap(body_); }

  // Runs the call for `caller`, to end by `deadline` (infinite: none). REQUIRES: NewRequest()
  // was decoded into (or SetOpenInPlace called); called once, on the thread that read the
  // request.
  void Start(Caller caller, absl::Time deadline);

  // Ends a call that never ran (a request the protocol side could not read) for `caller`:
  // answered, counted, logged and audited as any call, under its peer. REQUIRES: Start was not
  // called.
  void Fail(absl::Status status, Caller caller) {
    SetCaller(std::move(caller));
    Finish(std::move(status));
  }

 protected:
  // The protocol side. Metadata (HTTP headers, gRPC metadata) by lower-case name: nullopt when
  // absent. The view stays valid while the call lives.
  virtual std::optional<absl::string_view> Metadata(absl::string_view name) const = 0;
  // True once nobody waits for the answer (a reset stream, a closed connection): work for it is
  // not done. Any thread.
  virtual bool Gone() const = 0;
  // Not OK when the caller is not reading the answers it already has (its connection's answer
  // budget is spent): the refusal to answer with; a call that has not run yet is then dropped
  // unrun and counted (ops::Admission's answers_unread). Any thread.
  virtual absl::Status Unread() const { return absl::OkStatus(); }
  // The transport's name in audit lines and logs ("grpc", "grpc-web", "connect").
  virtual absl::string_view Transport() const = 0;
  // Whether an answer may carry shared bytes (Reply::shared): AEAD Open's plaintext, from the
  // memo or written by the cipher.
  virtual bool TakesSharedMessage() const { return false; }
  // [issue 34] The load of the calling thread's loop (on_loop false on any other thread), and
  // `cost` more charged to it when a call runs there: where ops::InlineRule decides.
  virtual LoopLoad CurrentLoop() const { return {}; }
  virtual void ChargeLoop(int64_t cost) {}
  // Makes the answer to `reply` (and forgets any made before). Returns `reply.status`, or the
  // error met encoding its response (too large: then nothing was made, and the call encodes
  // that error next).
  virtual absl::Status Encode(const Reply& reply) = 0;
  // Sends the answer Encode made last. Once, from any thread.
  virtual void Send() = 0;
  // Adds the transport's own fields to the sampled request log line.
  virtual void AddLogFields(nlohmann::json& line) const {}

  // Whether the call carried or needed an identity (a certificate required, a token or any
  // authorization metadata, a forwarded identity, a server that requires one): its answer is for
  // that caller only (a cache must not give it to another). For Encode.
  bool Identified() const;

 private:
  using Clock = std::chrono::steady_clock;

  void VerifyTokenOnWorker(const std::string& token);
  void AuthorizeAndRun(bool on_worker);
  // The peer's address and certificate identity, from `caller`.
  void SetCaller(Caller caller);
  void Refuse(absl::Status status);
  auth::AuditSink::Done HeldRefusal(absl::Status status, Challenge challenge);
  absl::StatusOr<absl::string_view> BearerToken() const;
  void SetTokenIdentity(std::string identity);
  absl::Status ForwardedIdentity();
  absl::Status Admit();
  ops::Operations::Alive AliveFn();
  ops::Operations::Done DoneFn();
  void Run(bool on_worker = false);
  bool DroppedUnrun();
  void RunOnWorker(api::Method::Probe probe);
  bool SharedOpen() const;
  int64_t Cost() const;
  bool RunsOnLoop(int64_t cost);
  void Finish(absl::Status status, Challenge challenge = Challenge::kNone);
  void AuditCall(const absl::Status& status, auth::AuditSink::Done done);
  void Deliver(bool written, absl::Status status, metrics::ItemCounts counts);
  void Record(const absl::Status& status, const metrics::ItemCounts& counts);

  const std::shared_ptr<const Context> context_;
  const api::Method* const method_;
  const Clock::time_point start_;
  absl::Time deadline_ = absl::InfiniteFuture();
  // The request and response messages. [issue 34] A batch's live in arena_ with their items
  // (one allocation per block instead of several per item; blocks zeroed before they are
  // freed); a single call's on the heap. Secret fields (api::Method::secret_request, secret_response) are zeroed
  // before either is freed.
  const bool secret_request_;   // method_->secret_request
  const bool secret_response_;  // method_->secret_response
  std::optional<google::protobuf::Arena> arena_;
  google::protobuf::Message* request_ = nullptr;
  google::protobuf::Message* response_ = nullptr;
  ops::Operations::OpenResult shared_open_;  // [issue 15] an AEAD Open answered from its buffer
  // [issue 34] AEAD Open (SharedOpen): its fields, and the buffer the envelope lies in (the
  // body, body_, when read in place; else request_'s envelope).
  std::string body_;
  ops::Operations::OpenRequestView open_view_;
  std::string* open_owner_ = nullptr;
  int batch_size_ = 0;
  bool audit_data_ = false;  // a data-plane call drawn for the audit (Run)
  bool audit_skip_ = false;  // refused for an unwritable audit file: no line
  auth::Peer peer_;
  ops::Admission::Ticket ticket_;
};

}  // namespace offload::call

#endif  // SERVICE_CALL_CALL_H_
