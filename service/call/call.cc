#include "service/call/call.h"

#include <sodium.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/keys.pb.h"
#include "service/api/secret_fields.h"
#include "service/common/log.h"
#include "service/ops/retry_delay.h"

namespace offload::call {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// How the items of a finished call ended (as the gRPC path counts them): OK with `valid` false
// and INVALID_ARGUMENT are the caller's input; other errors are errors.
// The field `name` of `message`'s type, or null; the last answers are remembered per thread (a
// name lookup per call costs more than the rest of counting). Eight slots: a batch asks for five
// (items, results, status, code, valid), so none is evicted between calls.
const FieldDescriptor* FieldOf(const Message& message, const char* name) {
  struct Cached {
    const google::protobuf::Descriptor* type = nullptr;
    const char* name = nullptr;
    const FieldDescriptor* field = nullptr;
  };
  thread_local Cached cache[8];
  const google::protobuf::Descriptor* type = message.GetDescriptor();
  for (const Cached& c : cache) {
    if (c.type == type && c.name == name) return c.field;
  }
  thread_local int next = 0;
  Cached& slot = cache[next++ & 7];
  slot = Cached{type, name, type->FindFieldByName(name)};
  return slot.field;
}

metrics::ItemCounts CountOne(absl::StatusCode code, const Message* result) {
  if (code == absl::StatusCode::kOk) {
    if (result != nullptr) {
      const FieldDescriptor* valid = FieldOf(*result, "valid");
      if (valid != nullptr && valid->type() == FieldDescriptor::TYPE_BOOL &&
          !result->GetReflection()->GetBool(*result, valid)) {
        return {0, 1, 0};
      }
    }
    return {1, 0, 0};
  }
  if (code == absl::StatusCode::kInvalidArgument) return {0, 1, 0};
  return {0, 0, 1};
}

metrics::ItemCounts CountBatch(const Message& response) {
  metrics::ItemCounts counts;
  const FieldDescriptor* results = FieldOf(response, "results");
  if (results == nullptr) return counts;
  const auto* reflection = response.GetReflection();
  for (int i = 0; i < reflection->FieldSize(response, results); ++i) {
    const Message& result = reflection->GetRepeatedMessage(response, results, i);
    absl::StatusCode code = absl::StatusCode::kOk;
    if (const FieldDescriptor* status = FieldOf(result, "status")) {
      const Message& s = result.GetReflection()->GetMessage(result, status);
      if (const FieldDescriptor* c = FieldOf(s, "code")) {
        code = static_cast<absl::StatusCode>(s.GetReflection()->GetInt32(s, c));
      }
    }
    const metrics::ItemCounts one = CountOne(code, &result);
    counts.ok += one.ok;
    counts.invalid += one.invalid;
    counts.error += one.error;
  }
  return counts;
}

int BatchSize(const Message& request) {
  const FieldDescriptor* items = FieldOf(request, "items");
  return items == nullptr ? 0 : request.GetReflection()->FieldSize(request, items);
}

thread_local absl::InsecureBitGen bitgen;

// UNAVAILABLE: a call that must be audited while the audit file cannot be written
// (--audit_fail_closed); the writer tries the file again every second, so the caller is told
// to come back in about that (a RetryInfo, ops/retry_delay.h).
absl::Status AuditUnwritableRefusal() {
  return ops::WithRetryDelay(
      absl::UnavailableError(
          "audit log unwritable: calls that must be audited are refused (--audit_fail_closed)"),
      ops::JitteredRetryDelay(ops::kDefaultRetryDelay));
}

// [issue 15, 34] An AeadOpenResponse whose plaintext is `open`'s buffer (a memo entry's, or the
// one the cipher wrote): field 1's tag and length in `head`, then the plaintext buffer (no
// copy, held by `owner` until written), then fields 2-3 in `tail`. The bytes are those
// protobuf's serializer would write.
SharedMessage SharedOpenMessage(const ops::Operations::OpenResult& open) {
  uint8_t prefix[ops::Operations::OpenResult::kMaxWirePrefix];
  uint8_t suffix[ops::Operations::OpenResult::kMaxWireSuffix];
  SharedMessage m;
  m.head.assign(reinterpret_cast<const char*>(prefix), open.WirePrefix(prefix));
  m.body = absl::string_view(reinterpret_cast<const char*>(open.plaintext->data()),
                             open.plaintext->size());
  m.tail.assign(reinterpret_cast<const char*>(suffix), open.WireSuffix(suffix));
  m.owner = open.plaintext;
  return m;
}

}  // namespace

namespace {
void* NewArenaBlock(size_t size) { return ::operator new(size); }
void FreeArenaBlock(void* block, size_t size) {
  sodium_memzero(block, size);
  ::operator delete(block);
}

google::protobuf::ArenaOptions BatchArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 4096;  // a batch of a few items in one block
  options.max_block_size = 64 << 10;
  options.block_alloc = &NewArenaBlock;
  options.block_dealloc = &FreeArenaBlock;
  return options;
}
}  // namespace

Call::Call(std::shared_ptr<const Context> context, const api::Method* method)
    : context_(std::move(context)),
      method_(method),
      start_(Clock::now()),
      secret_request_(method->secret_request),
      secret_response_(method->secret_response) {}

Call::~Call() {
  // The bytes of secret fields are the fields' own buffers: zeroed before the messages go. (The
  // flags are the call's own: the last reference may go on a worker after the method table.)
  if (secret_request_ && request_ != nullptr) api::WipeSecretFields(request_);
  if (secret_response_ && response_ != nullptr) api::WipeSecretFields(response_);
  if (!arena_.has_value()) {  // else the arena frees them, after this
    delete request_;
    delete response_;
  }
}

Message* Call::NewRequest() {
  // A single call's messages are few and small: an arena's set-up would cost more than it saves.
  google::protobuf::Arena* arena = nullptr;
  if (method_->batch) arena = &arena_.emplace(BatchArenaOptions());
  request_ = method_->request_prototype->New(arena);
  response_ = method_->response_prototype->New(arena);
  return request_;
}

// [issue 34] AEAD Open answered from its buffer: the protocol side takes shared bytes.
bool Call::SharedOpen() const {
  return method_->from_memo_shared != nullptr && TakesSharedMessage();
}

bool Call::TakesOpenInPlace() const {
  return SharedOpen() && request_ != nullptr &&
         request_->GetDescriptor() == v1::AeadOpenRequest::descriptor();
}

const std::string& Call::KeepBody(std::string body) {
  body_ = std::move(body);
  return body_;
}

void Call::SetOpenInPlace(absl::string_view key_id, absl::string_view envelope,
                          absl::string_view associated_data) {
  auto* open = static_cast<v1::AeadOpenRequest*>(request_);
  open->set_key_id(key_id.data(), key_id.size());
  open->set_associated_data(associated_data.data(), associated_data.size());
  open_view_ = {open->key_id(), envelope, open->associated_data()};
  open_owner_ = &body_;
}

void Call::Start(Caller caller, absl::Time deadline) {
  deadline_ = deadline;
  if (open_owner_ == nullptr && TakesOpenInPlace()) {
    // Decoded into the message: the envelope lies in it.
    auto* open = static_cast<v1::AeadOpenRequest*>(request_);
    open_view_ = {open->key_id(), open->envelope(), open->associated_data()};
    open_owner_ = open->mutable_envelope();
  }
  batch_size_ = method_->batch ? BatchSize(*request_) : 0;
  SetCaller(std::move(caller));
  if (method_->open) return Run();
  if (absl::Status s = ForwardedIdentity(); !s.ok()) return Refuse(s);
  if (context_->tokens != nullptr) {
    absl::StatusOr<absl::string_view> token = BearerToken();
    if (!token.ok()) return Refuse(token.status());
    if (!token->empty()) {
      if (std::optional<std::string> identity = context_->tokens->Remembered(*token)) {
        SetTokenIdentity(*std::move(identity));
      } else {
        // What needs no signature check is refused here; the signature of a token's first use
        // is checked on a worker, admitted as a call of the peer's (so a flood of new tokens
        // waits its turn like any other work) and skipped, as any call is, when its client is
        // gone or its deadline passed while it waited.
        if (absl::Status s = context_->tokens->Precheck(*token); !s.ok()) return Refuse(s);
        if (absl::Status s = Admit(); !s.ok()) return Finish(s);
        context_->pool->Submit([self = shared_from_this(), token = std::string(*token)] {
          self->VerifyTokenOnWorker(token);
        });
        return;
      }
    }
  }
  AuthorizeAndRun(/*on_worker=*/false);
}

void Call::SetCaller(Caller caller) {
  peer_.identity = std::move(caller.certificate_identity);
  peer_.identity_source = peer_.identity.empty() ? "" : "certificate";
  peer_.address = std::move(caller.address);
}

void Call::VerifyTokenOnWorker(const std::string& token) {
  if (DroppedUnrun()) return;
  absl::StatusOr<std::string> identity = context_->tokens->Verify(token);
  ticket_.Release();  // Run admits the call itself, under the identity's name
  if (!identity.ok()) return Refuse(identity.status());
  SetTokenIdentity(*std::move(identity));
  AuthorizeAndRun(/*on_worker=*/true);
}

void Call::AuthorizeAndRun(bool on_worker) {
  if (auth::Authorizer* authorizer = context_->authorizer; authorizer != nullptr) {
    // [issue 33] Fail-closed, a refusal waits for its audit line as every audited answer does.
    const bool hold = authorizer->audit_fail_closed();
    auth::Authorizer::RefusalDone held;
    if (hold) {
      held = [self = shared_from_this()](absl::Status refusal, bool written) {
        self->HeldRefusal(std::move(refusal), Challenge::kNone)(written);
      };
    }
    if (absl::Status s = authorizer->Authorize(peer_, method_->path, *request_, Transport(),
                                               std::move(held));
        !s.ok()) {
      if (hold) return;  // finished by `held`, once the refusal's line is written
      return Finish(s);
    }
  }
  Run(on_worker);
}

// [issue 33] The `done` of a refusal's audit line under --audit_fail_closed: the refusal once
// its line is written, UNAVAILABLE in its place when it could not be.
auth::AuditSink::Done Call::HeldRefusal(absl::Status status, Challenge challenge) {
  return [self = shared_from_this(), status = std::move(status), challenge](bool written) mutable {
    if (!written) {
      self->context_->authorizer->CountAuditRefusal();
      return self->Finish(AuditUnwritableRefusal());
    }
    self->Finish(std::move(status), challenge);
  };
}

// A refusal for who the caller claims to be: audited and counted as unauthenticated. With
// tokens on, the answer says how to authenticate (RFC 6750's WWW-Authenticate).
void Call::Refuse(absl::Status status) {
  Challenge challenge = Challenge::kNone;
  if (context_->tokens != nullptr) {
    challenge = Metadata("authorization").has_value() ? Challenge::kInvalidToken
                                                      : Challenge::kBearer;
  }
  if (auth::Authorizer* authorizer = context_->authorizer; authorizer != nullptr) {
    if (authorizer->audit_fail_closed()) {
      return authorizer->AuditUnauthenticated(peer_, method_->path, status, Transport(),
                                              HeldRefusal(status, challenge));
    }
    authorizer->AuditUnauthenticated(peer_, method_->path, status, Transport());
  }
  Finish(std::move(status), challenge);
}

// The token of `authorization: Bearer <token>`; empty without the metadata. Unauthenticated for
// another scheme or an empty token.
absl::StatusOr<absl::string_view> Call::BearerToken() const {
  std::optional<absl::string_view> header = Metadata("authorization");
  if (!header.has_value()) return absl::string_view();
  absl::string_view value = absl::StripAsciiWhitespace(*header);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError("authorization: expected \"Bearer <token>\"");
  }
  return absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
}

void Call::SetTokenIdentity(std::string identity) {
  peer_.identity = std::move(identity);
  peer_.identity_source = "token";
}

// The identity a trusted proxy forwarded, in place of the connection's (the proxy's own
// certificate, if any). From any other peer the metadata is ignored: anyone can write it.
absl::Status Call::ForwardedIdentity() {
  const auth::ForwardedIdentity* forwarded = context_->forwarded_identity;
  if (forwarded == nullptr) return absl::OkStatus();
  std::optional<absl::string_view> value = Metadata(forwarded->header());
  const std::string host = peer_.Host();
  const bool trusted = context_->trusted_proxies.Contains(host);
  if (trusted) {
    // The connection's own certificate is the proxy's, never its caller's: a caller the proxy
    // names no certificate for has no identity (else it would hold the proxy's grants).
    peer_.identity.clear();
    peer_.identity_source = "";
  }
  if (!value.has_value()) return absl::OkStatus();
  if (!trusted) {
    if (context_->authorizer != nullptr) {
      context_->authorizer->ForwardedIdentityIgnored(peer_, forwarded->header());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> identity = forwarded->IdentityOf(*value);
  if (!identity.ok()) return absl::UnauthenticatedError(identity.status().message());
  peer_.identity = *std::move(identity);
  peer_.identity_source = "forwarded";
  return absl::OkStatus();
}

absl::Status Call::Admit() {
  ops::Admission* admission = context_->admission;
  if (admission == nullptr) return absl::OkStatus();
  if (!context_->trusted_proxies.empty()) {
    // Only admission counts by client: a memo hit never reads X-Forwarded-For.
    peer_.forwarded_client =
        context_->trusted_proxies.ClientOf(peer_.Host(), Metadata("x-forwarded-for"));
  }
  // The request's bytes, as its message holds them (an open read in place: the bytes kept).
  const int64_t bytes = !body_.empty() ? static_cast<int64_t>(body_.size())
                        : request_ != nullptr ? static_cast<int64_t>(request_->ByteSizeLong())
                                              : 0;
  absl::StatusOr<ops::Admission::Ticket> ticket =
      admission->Admit(peer_.ClientName(), std::max(1, batch_size_), bytes);
  if (!ticket.ok()) return ticket.status();
  ticket_ = *std::move(ticket);
  return absl::OkStatus();
}

ops::Operations::Alive Call::AliveFn() {
  std::weak_ptr<Call> weak = weak_from_this();
  const absl::Time deadline = deadline_;
  return [weak, deadline] {
    std::shared_ptr<Call> self = weak.lock();
    return self != nullptr && !self->Gone() && absl::Now() <= deadline;
  };
}

ops::Operations::Done Call::DoneFn() {
  return [self = shared_from_this()](absl::Status status) { self->Finish(std::move(status)); };
}

// The call, once its caller is known and allowed: a memo hit answered at once, else a task for
// the workers (run here when this is already a worker: the token check's).
void Call::Run(bool on_worker) {
  if (absl::Now() > deadline_) {
    // Dropped unrun, as one that expires in the workers' queue is (a batch is counted by
    // Finish).
    if (!method_->batch && context_->admission != nullptr) context_->admission->CountDeadlineDrop();
    return Finish(absl::DeadlineExceededError("deadline passed before the call started"));
  }
  const api::Method* m = method_;
  if (auth::Authorizer* authorizer = context_->authorizer; authorizer != nullptr) {
    // Decided per call, before any work: whether it is audited (a draw at
    // --audit_data_plane), and, fail-closed, refused while its line could not be written.
    audit_data_ = !context_->data_plane.empty() && context_->data_plane.contains(m) &&
                  authorizer->SampleDataPlane();
    if ((audit_data_ || m->key_lifecycle) && authorizer->AuditUnwritable()) {
      audit_data_ = false;
      audit_skip_ = true;
      authorizer->CountAuditRefusal();
      return Finish(AuditUnwritableRefusal());
    }
  }
  if (m->batch) {
    if (absl::Status s = Admit(); !s.ok()) return Finish(s);
    // A small batch's items run here, on the loop (the pool's tasks run on this thread).
    std::optional<ops::WorkerPool::RunHere> here;
    if (!on_worker && RunsOnLoop(Cost())) here.emplace(context_->pool);
    if (m->from_memo) {
      api::Method::Probe probe;
      absl::Status status;
      if (m->from_memo(*request_, response_, &probe, &status)) return Finish(status);
      m->fresh(*request_, response_, std::move(probe), DoneFn(), AliveFn());
    } else {
      m->call(*request_, response_, DoneFn(), AliveFn());
    }
    return;
  }
  api::Method::Probe probe;
  if (m->from_memo) {
    // A hit (or a malformed request) is answered here, where it was read: no crypto, no queue.
    absl::Status status;
    if (SharedOpen()) {
      // [issue 15, 34] AEAD Open: the hit's plaintext is answered from the memo's buffer
      // (SharedMessage), never copied into the response message.
      if (m->from_memo_shared(open_view_, &shared_open_, &probe, &status)) return Finish(status);
    } else if (m->from_memo(*request_, response_, &probe, &status)) {
      return Finish(status);
    }
  }
  if (absl::Status s = Admit(); !s.ok()) return Finish(s);
  if (on_worker || RunsOnLoop(Cost())) {
    return RunOnWorker(std::move(probe));  // here: a worker's thread, or the loop (RunsOnLoop)
  }
  context_->pool->Submit([self = shared_from_this(), probe = std::move(probe)]() mutable {
    self->RunOnWorker(std::move(probe));
  });
}

// Work for nobody is not done: a call whose deadline passed while queued (its client has
// usually reset it at that deadline: counted as a deadline drop, as the gRPC port counts it),
// or whose client went away (a reset stream, a closed connection: Rapid Reset), is finished
// here, unrun. Whether it was.
bool Call::DroppedUnrun() {
  if (absl::Now() > deadline_) {
    if (context_->admission != nullptr) context_->admission->CountDeadlineDrop();
    Finish(absl::DeadlineExceededError("deadline passed while queued"));
    return true;
  }
  if (Gone()) {
    if (context_->admission != nullptr) context_->admission->CountClientGoneDrop();
    Finish(absl::CancelledError("client went away"));
    return true;
  }
  if (absl::Status unread = Unread(); !unread.ok()) {
    // The caller is not reading the answers it already has: no more are made for it.
    if (context_->admission != nullptr) context_->admission->CountAnswersUnreadDrop();
    Finish(std::move(unread));
    return true;
  }
  return false;
}

void Call::RunOnWorker(api::Method::Probe probe) {
  if (DroppedUnrun()) return;
  if (probe != nullptr && SharedOpen()) {
    // [issue 34] the fresh open writes a buffer the answer is sent from (SharedMessage).
    return Finish(method_->fresh_shared(open_view_, open_owner_, probe, &shared_open_));
  }
  if (probe != nullptr) {
    method_->fresh(*request_, response_, std::move(probe), DoneFn(), nullptr);
  } else {
    method_->call(*request_, response_, DoneFn(), nullptr);
  }
}

// [issue 34] The call's estimated cost if computed afresh (ops::InlineRule).
int64_t Call::Cost() const {
  if (open_owner_ != nullptr) {
    return ops::InlineRule::EstimateAeadOpenNanos(open_view_.envelope.size() +
                                                  open_view_.associated_data.size());
  }
  return ops::InlineRule::EstimateNanos(*request_);
}

// [issue 34] Whether a call estimated at `cost` ns runs to completion here, on the loop thread
// that read it (Context::inline_rule), rather than on the pool; the estimate is charged to the
// loop when it does. Never on another thread (a worker finishing a token check).
bool Call::RunsOnLoop(int64_t cost) {
  if (!context_->inline_rule.has_value()) return false;
  const LoopLoad load = CurrentLoop();
  if (!load.on_loop) return false;
  if (!context_->inline_rule->RunHere(cost, load.charged, load.waiting)) return false;
  ChargeLoop(cost);
  return true;
}

// [issue 33] A call that carried or needed an identity (mTLS, a token or any authorization, a
// forwarded identity, a server that requires one): its answer is for that caller only.
bool Call::Identified() const {
  return context_->mtls || !peer_.identity.empty() || Metadata("authorization").has_value() ||
         (context_->authorizer != nullptr && context_->authorizer->RequiresIdentity());
}

// Ends the call with `status` (and the response message when OK): the answer encoded, audit,
// metrics, the answer sent. Any thread, once.
void Call::Finish(absl::Status status, Challenge challenge) {
  ticket_.Release();
  if (status.ok() && absl::Now() > deadline_) {
    status = absl::DeadlineExceededError("deadline exceeded");
  }
  if (method_->batch && status.code() == absl::StatusCode::kDeadlineExceeded &&
      context_->admission != nullptr && request_ != nullptr) {
    context_->admission->CountDeadlineDrop();
  }
  metrics::ItemCounts counts;
  if (status.ok()) {
    counts = method_->batch ? CountBatch(*response_) : CountOne(absl::StatusCode::kOk,
                                                                 response_);
    Reply reply;
    SharedMessage shared;
    if (shared_open_.plaintext != nullptr) {
      shared = SharedOpenMessage(shared_open_);
      reply.shared = &shared;
    } else {
      reply.response = response_;
    }
    status = Encode(reply);
  }
  if (!status.ok()) {
    if (response_ != nullptr && method_->batch) response_->Clear();
    counts = method_->batch ? metrics::ItemCounts{} : CountOne(status.code(), nullptr);
    Reply reply;
    reply.status = status;
    reply.challenge = challenge;
    Encode(reply).IgnoreError();
  }
  auth::Authorizer* authorizer = context_->authorizer;
  if (authorizer != nullptr && request_ != nullptr && !audit_skip_ &&
      (audit_data_ || method_->key_lifecycle)) {
    const bool fail_closed = authorizer->audit_fail_closed();
    if (fail_closed || method_->key_lifecycle) {
      // The answer waits for its line (a key lifecycle call's always; every audited call's
      // when fail-closed): sent once the line is written; UNAVAILABLE in its place when it
      // could not be and fail-closed is on. The writer thread calls back: nothing here waits
      // for the disk.
      return AuditCall(status, [self = shared_from_this(), status, counts,
                                fail_closed](bool written) {
        self->Deliver(written || !fail_closed, status, counts);
      });
    }
    AuditCall(status, nullptr);
  }
  Deliver(true, std::move(status), counts);
}

// The call's audit line (a data-plane call, or a key lifecycle call); `done` as
// auth::AuditSink::Done.
void Call::AuditCall(const absl::Status& status, auth::AuditSink::Done done) {
  auth::Authorizer* authorizer = context_->authorizer;
  if (method_->key_lifecycle) {
    const auto* info = dynamic_cast<const v1::KeyInfo*>(response_);
    return authorizer->AuditKeyCall(peer_, method_->path, *request_, status,
                                    status.ok() && info != nullptr ? info->current_version() : 0,
                                    Transport(), std::move(done));
  }
  auth::DataPlaneCall call = auth::DescribeDataPlaneCall(
      *request_, status.ok() ? response_ : nullptr, method_->batch);
  if (shared_open_.plaintext != nullptr && !call.keys.empty()) {
    // [issue 15] a memo hit answered from the memo's buffer: the response message is empty.
    call.keys.front().version = shared_open_.key_version;
    call.memo_hits = shared_open_.memo_hit ? 1 : 0;
  }
  authorizer->AuditDataPlane(peer_, method_->path, Transport(), call, status.code(),
                             std::move(done));
}

// Sends the answer made for `status`, or, when its audit line was not `written` (fail-closed),
// UNAVAILABLE in its place. Any thread.
void Call::Deliver(bool written, absl::Status status, metrics::ItemCounts counts) {
  if (!written) {
    status = AuditUnwritableRefusal();
    counts = method_->batch ? metrics::ItemCounts{} : CountOne(status.code(), nullptr);
    Reply reply;
    reply.status = status;
    Encode(reply).IgnoreError();
  }
  Record(status, counts);
  Send();
}

void Call::Record(const absl::Status& status, const metrics::ItemCounts& counts) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  auto it = context_->method_metrics.find(method_);
  if (it != context_->method_metrics.end()) {
    it->second->Record(status.code(), seconds, counts, batch_size_);
  }
  const absl::StatusCode code = status.code();
  if (code == absl::StatusCode::kInternal || code == absl::StatusCode::kDataLoss ||
      code == absl::StatusCode::kUnknown) {
    // A fault of ours, always logged. Messages name fields and sizes, never payloads or key
    // material.
    Log(LogLevel::kError, "request_failed",
        {{"method", method_->path},
         {"transport", std::string(Transport())},
         {"code", absl::StatusCodeToString(code)},
         {"message", std::string(status.message())}});
  }
  const double rate = context_->log_sample_rate;
  if (rate > 0 && absl::Bernoulli(bitgen, rate)) {
    // Names, codes and sizes only: never key material, messages or plaintexts.
    nlohmann::json line = {{"method", method_->path},
                           {"transport", std::string(Transport())},
                           {"code", absl::StatusCodeToString(status.code())},
                           {"seconds", seconds},
                           {"items", batch_size_}};
    AddLogFields(line);
    Log(LogLevel::kInfo, "request", std::move(line));
  }
}

}  // namespace offload::call
