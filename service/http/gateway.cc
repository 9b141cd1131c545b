#include "service/http/gateway.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.pb.h"
#include "offload/v1/keys.pb.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/api/reflection.h"
#include "service/http/rpc_codec.h"

namespace offload::http {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using Clock = std::chrono::steady_clock;

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

// The answer to a call that must be audited while the audit file cannot be written
// (--audit_fail_closed).
constexpr absl::string_view kAuditUnwritable =
    "audit log unwritable: calls that must be audited are refused (--audit_fail_closed)";

httpd::Response Plain(int status, absl::string_view text, HeaderList headers = {}) {
  headers.emplace_back("content-type", "text/plain; charset=utf-8");
  return httpd::Response(status, std::move(headers), std::string(text));
}

// What the gRPC answers say we take (grpc-accept-encoding).
constexpr absl::string_view kGrpcAcceptEncoding = "identity,gzip";

// The trailers that end a gRPC stream with `status`: grpc-status, and grpc-message when there
// is one.
httpd::Headers GrpcTrailers(const absl::Status& status) {
  httpd::Headers trailers = {{"grpc-status", absl::StrCat(static_cast<int>(status.code()))}};
  if (!status.message().empty()) trailers.emplace_back("grpc-message", PercentEncode(status.message()));
  return trailers;
}

// A gRPC or gRPC-Web error as Trailers-Only: HTTP 200, the status in the only HEADERS frame.
httpd::Response TrailersOnly(const absl::Status& status, absl::string_view content_type) {
  httpd::Response out;
  out.status = 200;
  out.headers = {{"content-type", std::string(content_type)}};
  for (auto& h : GrpcTrailers(status)) out.headers.push_back(std::move(h));
  return out;
}

// A gRPC error as Trailers-Only, saying which encodings we take.
httpd::Response GrpcTrailersOnly(const absl::Status& status, absl::string_view content_type) {
  httpd::Response out = TrailersOnly(status, content_type);
  out.headers.emplace_back("grpc-accept-encoding", std::string(kGrpcAcceptEncoding));
  return out;
}

// The wire of a stream (health Watch, server reflection): gRPC, gRPC-Web (binary) or Connect's
// streaming protocol, as connect-go serves them (buf curl reflects with the protocol of its
// call). All three carry length-prefixed messages both ways; they differ in the content type and
// in how the end and its status are told: trailers, a trailer frame (0x80), or an end-of-stream
// message (0x02) holding Connect's error JSON.
enum class StreamWire { kGrpc, kGrpcWeb, kConnect };

// Connect's end-of-stream message flag.
constexpr uint8_t kConnectEndStream = 0x02;

// The wire of a stream's content type: binary protobuf gRPC or gRPC-Web (as ParseContentType
// reads them), or application/connect+proto (Connect's streaming type, which unary calls never
// carry).
std::optional<StreamWire> StreamWireOf(std::optional<absl::string_view> content_type) {
  if (!content_type.has_value()) return std::nullopt;
  const absl::string_view media =
      absl::StripAsciiWhitespace(content_type->substr(0, content_type->find(';')));
  if (absl::EqualsIgnoreCase(media, "application/connect+proto")) return StreamWire::kConnect;
  const absl::StatusOr<ContentType> type = ParseContentType(media);
  if (!type.ok() || type->codec != Codec::kProto || type->text) return std::nullopt;
  if (type->protocol == Protocol::kGrpc) return StreamWire::kGrpc;
  if (type->protocol == Protocol::kGrpcWeb) return StreamWire::kGrpcWeb;
  return std::nullopt;
}

// The headers that start a stream's answer.
httpd::Headers StreamHeaders(StreamWire wire) {
  switch (wire) {
    case StreamWire::kGrpc:
      return {{"content-type", "application/grpc"},
              {"grpc-accept-encoding", std::string(kGrpcAcceptEncoding)}};
    case StreamWire::kGrpcWeb:
      return {{"content-type", "application/grpc-web+proto"},
              {"grpc-accept-encoding", std::string(kGrpcAcceptEncoding)}};
    case StreamWire::kConnect:
      return {{"content-type", "application/connect+proto"},
              {"connect-accept-encoding", "gzip"}};
  }
  return {};
}

// The encoding of a stream's request messages (compressed ones are flagged per message).
absl::StatusOr<Encoding> StreamEncoding(StreamWire wire, const httpd::Exchange& exchange) {
  if (wire == StreamWire::kConnect) {
    return ParseEncoding(exchange.header("connect-content-encoding").value_or(""));
  }
  OFFLOAD_ASSIGN_OR_RETURN(
      CallOptions options,
      ParseCallHeaders(Protocol::kGrpc, [&exchange](const char* name) { return exchange.header(name); }));
  return options.encoding;
}

// Connect's end-of-stream message: {} when OK, else the error.
std::string ConnectEndStreamJson(const absl::Status& status) {
  if (status.ok()) return "{}";
  return absl::StrCat("{\"error\":", ConnectErrorJson(status), "}");
}

// Ends a started stream with `status`.
void EndStream(httpd::Exchange& exchange, StreamWire wire, const absl::Status& status) {
  switch (wire) {
    case StreamWire::kGrpc:
      exchange.Finish(GrpcTrailers(status));
      return;
    case StreamWire::kGrpcWeb:
      exchange.Finish({}, EncodeFrame(kFrameTrailer, GrpcWebTrailers(status)));
      return;
    case StreamWire::kConnect:
      exchange.Finish({}, EncodeFrame(kConnectEndStream, ConnectEndStreamJson(status)));
      return;
  }
}

// The whole answer of a stream refused before it started.
httpd::Response StreamRefusal(StreamWire wire, const absl::Status& status) {
  switch (wire) {
    case StreamWire::kGrpc:
      return GrpcTrailersOnly(status, "application/grpc");
    case StreamWire::kGrpcWeb:
      return GrpcTrailersOnly(status, "application/grpc-web+proto");
    case StreamWire::kConnect:
      return httpd::Response(200, StreamHeaders(wire),
                             EncodeFrame(kConnectEndStream, ConnectEndStreamJson(status)));
  }
  return GrpcTrailersOnly(status, "application/grpc");
}

// The largest body a request may have: the message, a gRPC-Web frame header, base64 for
// gRPC-Web text (with room for line breaks).
int64_t MaxBody(int64_t max_message) {
  return ((max_message + int64_t{kFrameHeaderBytes} + 2) / 3) * 4 + 4096;
}

}  // namespace

struct Gateway::Shared {
  ops::WorkerPool* pool = nullptr;
  int64_t max_message_bytes = 0;
  CorsPolicy cors;
  double log_sample_rate = 0;
  bool mtls = false;
  auth::Authorizer* authorizer = nullptr;
  ops::Admission* admission = nullptr;
  auth::TrustedProxies trusted_proxies;
  const auth::ForwardedIdentity* forwarded_identity = nullptr;
  auth::TokenVerifier* tokens = nullptr;
  absl::flat_hash_map<const api::Method*, metrics::MethodMetrics*> method_metrics;
  // The methods audited per call (api::Method::data_plane); empty when --audit_data_plane is off.
  absl::flat_hash_set<const api::Method*> data_plane;
  CompressionOptions compression;

  // RPC bodies by encoding (index: Encoding) and compression decisions, read at scrape time.
  // Not counted without metrics.
  struct Bytes {
    std::atomic<uint64_t> received[2] = {};
    std::atomic<uint64_t> sent[2] = {};
    std::atomic<uint64_t> results[5] = {};  // by CompressionResult
    std::atomic<uint64_t> saved{0};
  };
  bool count_bytes = false;
  Bytes bytes;

  // The HTTP server, for its counters at scrape time; null once stopped.
  absl::Mutex server_mu;
  const httpd::Server* server ABSL_GUARDED_BY(server_mu) = nullptr;

  // Health: ready (SetReady) and not draining is SERVING; Check and Watch's unary form as
  // methods (Watch as a stream: WatchHealth).
  std::unique_ptr<api::Health> health;
  // Server reflection (v1, v1alpha) over the table's services and health.
  std::unique_ptr<api::Reflection> reflection;
  // Open health Watch streams, each with the status last sent on it, and other open streams
  // (reflection): a drain ends them all.
  struct Watch {
    std::shared_ptr<httpd::Exchange> exchange;
    StreamWire wire = StreamWire::kGrpc;
    std::string service;
    int sent = -1;
  };
  struct OpenStream {
    std::weak_ptr<httpd::Exchange> exchange;
    StreamWire wire = StreamWire::kGrpc;
  };
  absl::Mutex watch_mu;
  std::vector<std::shared_ptr<Watch>> watches ABSL_GUARDED_BY(watch_mu);
  std::vector<OpenStream> streams ABSL_GUARDED_BY(watch_mu);

  // Sends `watch` its service's status if it changed.
  void Push(Watch& watch) {
    const int status = health->StatusOf(watch.service);
    if (status == watch.sent) return;
    watch.sent = status;
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(static_cast<grpc::health::v1::HealthCheckResponse::ServingStatus>(status));
    watch.exchange->Write(EncodeFrame(0, response.SerializeAsString()));
  }
  // Tells every Watch stream of a change; with `end`, ends them and every other open stream
  // (the server is draining).
  void PushAll(bool end) {
    absl::MutexLock lock(&watch_mu);
    Prune();
    for (const std::shared_ptr<Watch>& w : watches) {
      Push(*w);
      if (end) EndStream(*w->exchange, w->wire, absl::UnavailableError("server is draining"));
    }
    if (!end) return;
    watches.clear();
    for (const OpenStream& open : streams) {
      if (std::shared_ptr<httpd::Exchange> e = open.exchange.lock()) {
        EndStream(*e, open.wire, absl::UnavailableError("server is draining"));
      }
    }
    streams.clear();
  }
  // Forgets streams that are over (answered, or their client gone: those are ended here, so
  // that a drain does not wait for them).
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu) {
    watches.erase(std::remove_if(watches.begin(), watches.end(),
                                 [](const auto& w) {
                                   if (!w->exchange->abandoned()) return false;
                                   w->exchange->Finish({});
                                   return true;
                                 }),
                  watches.end());
    streams.erase(std::remove_if(streams.begin(), streams.end(),
                                 [](const OpenStream& open) {
                                   std::shared_ptr<httpd::Exchange> e = open.exchange.lock();
                                   return e == nullptr || e->abandoned();
                                 }),
                  streams.end());
  }
  // Starts the answer of one more stream (its headers), unless the server is draining or
  // kMaxOpenStreams are open (Prune first): then why not, and nothing is sent. The caller then
  // adds it to `watches` or `streams`, under the same lock, so that a drain either ends it or
  // refused it here.
  absl::Status StartStream(httpd::Exchange& exchange, StreamWire wire)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu) {
    if (health->draining()) return absl::UnavailableError("server is draining");
    Prune();
    if (watches.size() + streams.size() >= kMaxOpenStreams) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "at most ", kMaxOpenStreams, " health Watch and reflection streams may be open at once"));
    }
    httpd::Headers headers = StreamHeaders(wire);
    cors.AddResponseHeaders(exchange.header("origin"), &headers);
    exchange.StartResponse(200, std::move(headers));
    return absl::OkStatus();
  }
  // A stream refused before it started, with CORS headers for a listed origin.
  httpd::Response Refusal(const httpd::Exchange& exchange, StreamWire wire,
                          const absl::Status& status) const {
    httpd::Response out = StreamRefusal(wire, status);
    cors.AddResponseHeaders(exchange.header("origin"), &out.headers);
    return out;
  }
  // Health Watch and reflection streams open at once, server-wide: each may hold up to
  // kMaxStreamUnsentBytes of answers its client has not read.
  static constexpr size_t kMaxOpenStreams = 256;
  static constexpr int64_t kMaxStreamUnsentBytes = 256 << 10;
};

namespace {

// One RPC over HTTP: headers and body read on the loop thread, the call run (on the loop for a
// memo hit, else on the pool), the answer encoded where the call finished and handed back.
class Call final : public std::enable_shared_from_this<Call> {
 public:
  Call(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
       const api::Method* method)
      : shared_(std::move(shared)),
        exchange_(std::move(exchange)),
        method_(method),
        start_(Clock::now()) {}

  // A POST (Connect, gRPC-Web binary or text).
  void StartPost() {
    absl::StatusOr<ContentType> type =
        ParseContentType(exchange_->header("content-type").value_or(""));
    if (!type.ok() && IsGrpcContentType(exchange_->header("content-type").value_or(""))) {
      // gRPC with a codec we lack: gRPC's own answer.
      type_ = ContentType{Protocol::kGrpc, Codec::kProto, false};
      if (exchange_->http_version() < 0x200) {
        return Finish(absl::UnimplementedError("gRPC requires HTTP/2"), 505);
      }
      return Finish(absl::UnimplementedError(type.status().message()));
    }
    if (!type.ok()) {
      // Neither protocol: Connect says 415, and tells what it accepts.
      HeaderList headers = {{"accept-post",
                             "application/proto, application/json, application/grpc-web, "
                             "application/grpc-web+proto, application/grpc-web-text, "
                             "application/grpc, application/grpc+proto, application/grpc+json"}};
      Finish(absl::UnimplementedError(type.status().message()), 415, std::move(headers));
      return;
    }
    type_ = *type;
    if (type_.protocol == Protocol::kGrpc && exchange_->http_version() < 0x200) {
      // gRPC is HTTP/2 only (PROTOCOL-HTTP2.md); grpc-go and connect-go answer 505 as well.
      return Finish(absl::UnimplementedError("gRPC requires HTTP/2"), 505);
    }
    absl::StatusOr<CallOptions> options = ParseCallHeaders(
        type_.protocol, [this](const char* name) { return exchange_->header(name); });
    if (!options.ok()) return Finish(options.status());
    options_ = *options;
    const int64_t max = shared_->max_message_bytes;
    int64_t limit = max;
    if (type_.protocol != Protocol::kConnect) limit += kFrameHeaderBytes;
    if (type_.text) limit = MaxBody(max);
    if (exchange_->body_too_large()) {
      // Past what any protocol carries: the HTTP server never read it, the caller gets its
      // protocol's own error (Connect 429 resource_exhausted, gRPC-Web grpc-status 8).
      return Finish(absl::ResourceExhaustedError(absl::StrCat(
          "request body: expected at most ", limit, " bytes, got more than ", MaxBody(max))));
    }
    const absl::string_view body = exchange_->body();
    if (static_cast<int64_t>(body.size()) > limit) {
      return Finish(absl::ResourceExhaustedError(
          absl::StrCat("request body: expected at most ", limit, " bytes, got ", body.size())));
    }
    Decode(options_.encoding, body);
  }

  // A Connect GET of a side-effect-free method.
  void StartGet() {
    get_ = true;
    type_ = ContentType{Protocol::kConnect, Codec::kProto, false};
    absl::StatusOr<ConnectGetQuery> query =
        ParseConnectGetQuery(exchange_->query(), static_cast<size_t>(shared_->max_message_bytes));
    if (!query.ok()) return Finish(query.status());
    type_.codec = query->codec;
    if (absl::Status s = CheckConnectProtocolVersion(exchange_->header("connect-protocol-version"));
        !s.ok()) {
      return Finish(s);
    }
    if (auto t = exchange_->header("connect-timeout-ms")) {
      absl::StatusOr<absl::Duration> timeout = ParseConnectTimeout(*t);
      if (!timeout.ok()) return Finish(timeout.status());
      options_.timeout = *timeout;
    }
    options_.accept = NegotiateEncoding(exchange_->header("accept-encoding"));
    Decode(query->compression, query->message);
  }

 private:
  const char* TransportName() const {
    switch (type_.protocol) {
      case Protocol::kConnect: return "connect";
      case Protocol::kGrpcWeb: return "grpc-web";
      case Protocol::kGrpc: return "grpc";
    }
    return "connect";
  }

  // The body (or GET message) into the request message, then the call.
  void Decode(Encoding encoding, absl::string_view bytes) {
    if (shared_->count_bytes) {
      shared_->bytes.received[static_cast<int>(encoding)].fetch_add(bytes.size(),
                                                                     std::memory_order_relaxed);
    }
    if (options_.timeout.has_value()) deadline_ = absl::Now() + *options_.timeout;
    if (auto origin = exchange_->header("origin")) origin_ = std::string(*origin);
    request_.reset(method_->request_prototype->New());
    response_.reset(method_->response_prototype->New());
    if (absl::Status s = DecodeRequest(type_, encoding, bytes, shared_->max_message_bytes,
                                       request_.get());
        !s.ok()) {
      return Finish(s);
    }
    batch_size_ = method_->batch ? BatchSize(*request_) : 0;
    peer_.identity = exchange_->peer_identity();
    peer_.identity_source = peer_.identity.empty() ? "" : "certificate";
    peer_.address = exchange_->peer_address();
    if (method_->open) return Run();
    if (absl::Status s = ForwardedIdentity(); !s.ok()) return Refuse(s);
    if (shared_->tokens != nullptr) {
      absl::StatusOr<absl::string_view> token = BearerToken();
      if (!token.ok()) return Refuse(token.status());
      if (!token->empty()) {
        if (std::optional<std::string> identity = shared_->tokens->Remembered(*token)) {
          SetTokenIdentity(*std::move(identity));
        } else {
          // What needs no signature check is refused here; the signature of a token's first use
          // is checked on a worker, admitted as a call of the peer's (so a flood of new tokens
          // waits its turn like any other work) and skipped, as any call is, when its client is
          // gone or its deadline passed while it waited.
          if (absl::Status s = shared_->tokens->Precheck(*token); !s.ok()) return Refuse(s);
          if (absl::Status s = Admit(); !s.ok()) return Finish(s);
          shared_->pool->Submit([self = shared_from_this(), token = std::string(*token)] {
            self->VerifyTokenOnWorker(token);
          });
          return;
        }
      }
    }
    AuthorizeAndRun(/*on_worker=*/false);
  }

  void VerifyTokenOnWorker(const std::string& token) {
    if (DroppedUnrun()) return;
    absl::StatusOr<std::string> identity = shared_->tokens->Verify(token);
    ticket_.Release();  // Run admits the call itself, under the identity's name
    if (!identity.ok()) return Refuse(identity.status());
    SetTokenIdentity(*std::move(identity));
    AuthorizeAndRun(/*on_worker=*/true);
  }

  void AuthorizeAndRun(bool on_worker) {
    if (auth::Authorizer* authorizer = shared_->authorizer; authorizer != nullptr) {
      if (absl::Status s = authorizer->Authorize(peer_, method_->path, *request_, TransportName());
          !s.ok()) {
        return Finish(s);
      }
    }
    Run(on_worker);
  }

  // A refusal for who the caller claims to be: audited and counted as unauthenticated. With
  // tokens on, the answer says how to authenticate (RFC 6750's WWW-Authenticate).
  void Refuse(absl::Status status) {
    if (shared_->authorizer != nullptr) {
      shared_->authorizer->AuditUnauthenticated(peer_, method_->path, status, TransportName());
    }
    HeaderList extra;
    if (shared_->tokens != nullptr) {
      extra.emplace_back("www-authenticate", exchange_->header("authorization").has_value()
                                                 ? "Bearer error=\"invalid_token\""
                                                 : "Bearer");
    }
    Finish(std::move(status), /*http_status=*/0, std::move(extra));
  }

  // The token of `authorization: Bearer <token>`; empty without the header. Unauthenticated for
  // another scheme or an empty token.
  absl::StatusOr<absl::string_view> BearerToken() const {
    std::optional<absl::string_view> header = exchange_->header("authorization");
    if (!header.has_value()) return absl::string_view();
    absl::string_view value = absl::StripAsciiWhitespace(*header);
    constexpr absl::string_view kScheme = "bearer ";
    if (value.size() <= kScheme.size() ||
        !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
      return absl::UnauthenticatedError("authorization: expected \"Bearer <token>\"");
    }
    return absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  }

  void SetTokenIdentity(std::string identity) {
    peer_.identity = std::move(identity);
    peer_.identity_source = "token";
  }

  // The identity a trusted proxy forwarded, in place of the connection's (the proxy's own
  // certificate, if any). From any other peer the header is ignored: anyone can write it.
  absl::Status ForwardedIdentity() {
    const auth::ForwardedIdentity* forwarded = shared_->forwarded_identity;
    if (forwarded == nullptr) return absl::OkStatus();
    std::optional<absl::string_view> value = exchange_->header(forwarded->header());
    const std::string host = peer_.Host();
    const bool trusted = shared_->trusted_proxies.Contains(host);
    if (trusted) {
      // The connection's own certificate is the proxy's, never its caller's: a caller the proxy
      // names no certificate for has no identity (else it would hold the proxy's grants).
      peer_.identity.clear();
      peer_.identity_source = "";
    }
    if (!value.has_value()) return absl::OkStatus();
    if (!trusted) {
      if (shared_->authorizer != nullptr) {
        shared_->authorizer->ForwardedIdentityIgnored(peer_, forwarded->header());
      }
      return absl::OkStatus();
    }
    absl::StatusOr<std::string> identity = forwarded->IdentityOf(*value);
    if (!identity.ok()) return absl::UnauthenticatedError(identity.status().message());
    peer_.identity = *std::move(identity);
    peer_.identity_source = "forwarded";
    return absl::OkStatus();
  }

  absl::Status Admit() {
    ops::Admission* admission = shared_->admission;
    if (admission == nullptr) return absl::OkStatus();
    if (!shared_->trusted_proxies.empty()) {
      // Only admission counts by client: a memo hit never reads X-Forwarded-For.
      peer_.forwarded_client =
          shared_->trusted_proxies.ClientOf(peer_.Host(), exchange_->header("x-forwarded-for"));
    }
    absl::StatusOr<ops::Admission::Ticket> ticket =
        admission->Admit(peer_.ClientName(), std::max(1, batch_size_));
    if (!ticket.ok()) return ticket.status();
    ticket_ = *std::move(ticket);
    return absl::OkStatus();
  }

  ops::Operations::Alive AliveFn() {
    std::weak_ptr<httpd::Exchange> exchange = exchange_;
    const absl::Time deadline = deadline_;
    return [exchange, deadline] {
      std::shared_ptr<httpd::Exchange> e = exchange.lock();
      return e != nullptr && !e->abandoned() && absl::Now() <= deadline;
    };
  }

  ops::Operations::Done DoneFn() {
    return [self = shared_from_this()](absl::Status status) { self->Finish(std::move(status)); };
  }

  // The call, once its caller is known and allowed: a memo hit answered at once, else a task
  // for the workers (run here when this is already a worker: the token check's).
  void Run(bool on_worker = false) {
    if (absl::Now() > deadline_) {
      // Dropped unrun, as one that expires in the workers' queue is (a batch is counted by
      // Finish).
      if (!method_->batch && shared_->admission != nullptr) shared_->admission->CountDeadlineDrop();
      return Finish(absl::DeadlineExceededError("deadline passed before the call started"));
    }
    const api::Method* m = method_;
    if (auth::Authorizer* authorizer = shared_->authorizer; authorizer != nullptr) {
      // Decided per call, before any work: whether it is audited (a draw at
      // --audit_data_plane), and, fail-closed, refused while its line could not be written.
      audit_data_ = !shared_->data_plane.empty() && shared_->data_plane.contains(m) &&
                    authorizer->SampleDataPlane();
      if ((audit_data_ || m->key_lifecycle) && authorizer->AuditUnwritable()) {
        audit_data_ = false;
        audit_skip_ = true;
        authorizer->CountAuditRefusal();
        return Finish(absl::UnavailableError(kAuditUnwritable));
      }
    }
    if (m->batch) {
      if (absl::Status s = Admit(); !s.ok()) return Finish(s);
      if (m->from_memo) {
        api::Method::Probe probe;
        absl::Status status;
        if (m->from_memo(*request_, response_.get(), &probe, &status)) return Finish(status);
        m->fresh(*request_, response_.get(), std::move(probe), DoneFn(), AliveFn());
      } else {
        m->call(*request_, response_.get(), DoneFn(), AliveFn());
      }
      return;
    }
    api::Method::Probe probe;
    if (m->from_memo) {
      // A hit (or a malformed request) is answered here, on the loop: no crypto, no queue.
      absl::Status status;
      if (SharedOpenBody()) {
        // [issue 15] AEAD Open over Connect proto: the hit's plaintext is written from the
        // memo's buffer (EncodeSharedOpen), never copied into the response message.
        if (m->from_memo_shared(*request_, &shared_open_, &probe, &status)) return Finish(status);
      } else if (m->from_memo(*request_, response_.get(), &probe, &status)) {
        return Finish(status);
      }
    }
    if (absl::Status s = Admit(); !s.ok()) return Finish(s);
    if (on_worker) return RunOnWorker(std::move(probe));
    shared_->pool->Submit([self = shared_from_this(), probe = std::move(probe)]() mutable {
      self->RunOnWorker(std::move(probe));
    });
  }

  // Work for nobody is not done: a call whose deadline passed while queued (its client has
  // usually reset it at that deadline: counted as a deadline drop, as the gRPC port counts it),
  // or whose client went away (a reset stream, a closed connection: Rapid Reset), is finished
  // here, unrun. Whether it was.
  bool DroppedUnrun() {
    if (absl::Now() > deadline_) {
      if (shared_->admission != nullptr) shared_->admission->CountDeadlineDrop();
      Finish(absl::DeadlineExceededError("deadline passed while queued"));
      return true;
    }
    if (exchange_->abandoned()) {
      if (shared_->admission != nullptr) shared_->admission->CountClientGoneDrop();
      Finish(absl::CancelledError("client went away"));
      return true;
    }
    return false;
  }

  void RunOnWorker(api::Method::Probe probe) {
    if (DroppedUnrun()) return;
    if (probe != nullptr) {
      method_->fresh(*request_, response_.get(), std::move(probe), DoneFn(), nullptr);
    } else {
      method_->call(*request_, response_.get(), DoneFn(), nullptr);
    }
  }

  // Ends the call with `status` (and the response message when OK): audit, metrics, encoding,
  // the answer to the loop. Any thread, once.
  void Finish(absl::Status status, int http_status = 0, HeaderList extra = {}) {
    ticket_.Release();
    if (status.ok() && absl::Now() > deadline_) {
      status = absl::DeadlineExceededError("deadline exceeded");
    }
    if (method_->batch && status.code() == absl::StatusCode::kDeadlineExceeded &&
        shared_->admission != nullptr && request_ != nullptr) {
      shared_->admission->CountDeadlineDrop();
    }
    metrics::ItemCounts counts;
    httpd::Response out;
    if (status.ok()) {
      counts = method_->batch ? CountBatch(*response_) : CountOne(absl::StatusCode::kOk,
                                                                   response_.get());
      absl::Status encoded = EncodeSuccess(&out);
      if (!encoded.ok()) status = encoded;
    }
    if (!status.ok()) {
      if (response_ != nullptr && method_->batch) response_->Clear();
      counts = method_->batch ? metrics::ItemCounts{} : CountOne(status.code(), nullptr);
      out = EncodeError(status, http_status);
    }
    for (auto& h : extra) out.headers.push_back(std::move(h));
    AddCors(&out);
    auth::Authorizer* authorizer = shared_->authorizer;
    if (authorizer != nullptr && request_ != nullptr && !audit_skip_ &&
        (audit_data_ || method_->key_lifecycle)) {
      const bool fail_closed = authorizer->audit_fail_closed();
      if (fail_closed || method_->key_lifecycle) {
        // The answer waits for its line (a key lifecycle call's always; every audited call's
        // when fail-closed): sent once the line is written; UNAVAILABLE in its place when it
        // could not be and fail-closed is on. The writer thread calls back: nothing here waits
        // for the disk.
        auto held = std::make_shared<httpd::Response>(std::move(out));
        return AuditCall(status, [self = shared_from_this(), held, status, counts,
                                  fail_closed](bool written) {
          self->Deliver(written || !fail_closed, std::move(*held), status, counts);
        });
      }
      AuditCall(status, nullptr);
    }
    Deliver(true, std::move(out), status, counts);
  }

  // The call's audit line (a data-plane call, or a key lifecycle call); `done` as
  // auth::AuditSink::Done.
  void AuditCall(const absl::Status& status, auth::AuditSink::Done done) {
    auth::Authorizer* authorizer = shared_->authorizer;
    if (method_->key_lifecycle) {
      const auto* info = dynamic_cast<const v1::KeyInfo*>(response_.get());
      return authorizer->AuditKeyCall(peer_, method_->path, *request_, status,
                                      status.ok() && info != nullptr ? info->current_version() : 0,
                                      TransportName(), std::move(done));
    }
    auth::DataPlaneCall call = auth::DescribeDataPlaneCall(
        *request_, status.ok() ? response_.get() : nullptr, method_->batch);
    if (shared_open_.plaintext != nullptr && !call.keys.empty()) {
      // [issue 15] a memo hit answered from the memo's buffer: the response message is empty.
      call.keys.front().version = shared_open_.key_version;
      call.memo_hits = shared_open_.memo_hit ? 1 : 0;
    }
    authorizer->AuditDataPlane(peer_, method_->path, TransportName(), call, status.code(),
                               std::move(done));
  }

  void AddCors(httpd::Response* out) {
    shared_->cors.AddResponseHeaders(
        origin_.has_value() ? std::optional<absl::string_view>(*origin_) : std::nullopt,
        &out->headers);
  }

  // Sends `out` (the answer for `status`), or, when its audit line was not `written`
  // (fail-closed), UNAVAILABLE in its place. Any thread.
  void Deliver(bool written, httpd::Response out, absl::Status status,
               metrics::ItemCounts counts) {
    if (!written) {
      status = absl::UnavailableError(kAuditUnwritable);
      counts = method_->batch ? metrics::ItemCounts{} : CountOne(status.code(), nullptr);
      out = EncodeError(status, 0);
      AddCors(&out);
    }
    Record(status, counts);
    if (shared_->count_bytes) {
      shared_->bytes.sent[static_cast<int>(sent_encoding_)].fetch_add(out.body_size(),
                                                                       std::memory_order_relaxed);
    }
    exchange_->Respond(std::move(out));
  }

  // [issue 15] Whether an AEAD Open memo hit may be answered by EncodeSharedOpen: a Connect POST
  // in binary proto (EncodeSharedOpen still compresses a plaintext that pays for it).
  bool SharedOpenBody() const {
    return method_->from_memo_shared != nullptr && type_.protocol == Protocol::kConnect &&
           type_.codec == Codec::kProto && !get_;
  }

  // [issue 15] The AeadOpenResponse of a memo hit in Connect proto: field 1's tag and length in
  // `body`, then the memo's plaintext buffer and fields 2-3 as shared pieces (no copy), held by
  // `owner` until written. The bytes are those protobuf's serializer would write.
  void EncodeSharedOpen(httpd::Response* out) {
    const absl::string_view plaintext(reinterpret_cast<const char*>(shared_open_.plaintext->data()),
                                      shared_open_.plaintext->size());
    const CompressionOptions& compression = shared_->compression;
    if (options_.accept != Encoding::kIdentity && compression.level > 0 &&
        static_cast<int64_t>(plaintext.size()) >= compression.min_bytes &&
        SampledEntropyBits(plaintext) <= kMaxCompressibleEntropyBits) {
      // The caller takes gzip and the plaintext would shrink: compress a contiguous copy (the
      // copy costs a fraction of the deflate pass).
      uint8_t prefix[ops::Operations::OpenResult::kMaxWirePrefix];
      uint8_t suffix[ops::Operations::OpenResult::kMaxWireSuffix];
      std::string message(reinterpret_cast<const char*>(prefix), shared_open_.WirePrefix(prefix));
      message.append(plaintext.data(), plaintext.size());
      message.append(reinterpret_cast<const char*>(suffix), shared_open_.WireSuffix(suffix));
      const bool gzip = Compress(&message);
      out->status = 200;
      out->headers.emplace_back("content-type", std::string(ConnectContentType(type_.codec)));
      if (gzip) out->headers.emplace_back("content-encoding", "gzip");
      out->body = std::move(message);
      return;
    }
    if (options_.accept != Encoding::kIdentity && compression.level > 0 && shared_->count_bytes) {
      // Counted as CompressResponse would have counted it.
      const CompressionResult result =
          static_cast<int64_t>(plaintext.size()) < compression.min_bytes
              ? CompressionResult::kTooSmall
              : CompressionResult::kIncompressible;
      shared_->bytes.results[static_cast<int>(result)].fetch_add(1, std::memory_order_relaxed);
    }
    struct Owned {
      memo::SharedPlaintext plaintext;
      uint8_t suffix[ops::Operations::OpenResult::kMaxWireSuffix];
      size_t suffix_size = 0;
    };
    auto owned = std::make_shared<Owned>();
    owned->plaintext = shared_open_.plaintext;
    owned->suffix_size = shared_open_.WireSuffix(owned->suffix);
    uint8_t prefix[ops::Operations::OpenResult::kMaxWirePrefix];
    out->status = 200;
    out->headers.emplace_back("content-type", std::string(ConnectContentType(type_.codec)));
    out->body.assign(reinterpret_cast<const char*>(prefix), shared_open_.WirePrefix(prefix));
    out->shared_body = {
        absl::string_view(reinterpret_cast<const char*>(owned->plaintext->data()),
                          owned->plaintext->size()),
        absl::string_view(reinterpret_cast<const char*>(owned->suffix), owned->suffix_size)};
    out->owner = std::move(owned);
  }

  absl::Status EncodeSuccess(httpd::Response* out) {
    if (shared_open_.plaintext != nullptr) {  // [issue 15] see EncodeSharedOpen
      EncodeSharedOpen(out);
      return absl::OkStatus();
    }
    std::string message;
    OFFLOAD_RETURN_IF_ERROR(
        EncodeResponse(type_.codec, *response_, shared_->max_message_bytes, &message));
    const bool gzip = Compress(&message);
    out->status = 200;
    if (type_.protocol == Protocol::kGrpc) {
      // HEADERS, one DATA frame with the message (compressed: its flag and grpc-encoding say
      // so), trailers with the status.
      out->headers.emplace_back("content-type", std::string(GrpcContentType(type_)));
      if (gzip) out->headers.emplace_back("grpc-encoding", "gzip");
      out->headers.emplace_back("grpc-accept-encoding", std::string(kGrpcAcceptEncoding));
      out->body = EncodeFrame(gzip ? kFrameCompressed : 0, message);
      out->trailers = GrpcTrailers(absl::OkStatus());
      return absl::OkStatus();
    }
    if (type_.protocol == Protocol::kGrpcWeb) {
      // The message frame's flag and grpc-encoding say it is compressed; trailers never are.
      std::string body = EncodeFrame(gzip ? kFrameCompressed : 0, message);
      body += EncodeFrame(kFrameTrailer, GrpcWebTrailers(absl::OkStatus()));
      out->headers.emplace_back("content-type", std::string(GrpcWebContentType(type_)));
      if (gzip) out->headers.emplace_back("grpc-encoding", "gzip");
      out->body = type_.text ? EncodeGrpcWebText(body) : std::move(body);
      return absl::OkStatus();
    }
    out->headers.emplace_back("content-type", std::string(ConnectContentType(type_.codec)));
    if (gzip) out->headers.emplace_back("content-encoding", "gzip");
    if (get_) {
      // A verify answer depends only on its request; keys change. Behind mTLS the answer is
      // for the authenticated caller only.
      const bool immutable = method_->service == "offload.v1.Ed25519Service";
      out->headers.emplace_back(
          "cache-control", immutable ? absl::StrCat(shared_->mtls ? "private" : "public",
                                                    ", max-age=31536000, immutable")
                                     : std::string("private, no-cache"));
      out->headers.emplace_back("vary", "Accept-Encoding");
    }
    out->body = std::move(message);
    return absl::OkStatus();
  }

  // Compresses the response `*message` when the caller asked and it pays (CompressResponse);
  // true if it did. Counts the decision.
  bool Compress(std::string* message) {
    const size_t before = message->size();
    const Compression c = CompressResponse(options_.accept, shared_->compression, message);
    sent_encoding_ = c.encoding;
    if (shared_->count_bytes && c.result != CompressionResult::kNotAsked) {
      Gateway::Shared::Bytes& b = shared_->bytes;
      b.results[static_cast<int>(c.result)].fetch_add(1, std::memory_order_relaxed);
      if (c.encoding != Encoding::kIdentity) {
        b.saved.fetch_add(before - message->size(), std::memory_order_relaxed);
      }
    }
    return c.encoding == Encoding::kGzip;
  }

  httpd::Response EncodeError(const absl::Status& status, int http_status) {
    httpd::Response out;
    if (type_.protocol == Protocol::kGrpc) {
      // An answer below gRPC (HTTP/1.1): plain HTTP. Else Trailers-Only: one HEADERS frame with
      // the status and END_STREAM.
      if (http_status != 0) return Plain(http_status, absl::StrCat(status.message(), "\n"));
      return GrpcTrailersOnly(status, GrpcContentType(type_));
    }
    if (type_.protocol == Protocol::kGrpcWeb) {
      // gRPC-Web "trailers-only": HTTP 200, the status in the headers, no body.
      return TrailersOnly(status, GrpcWebContentType(type_));
    }
    out.status = http_status != 0 ? http_status : ConnectHttpStatus(status.code());
    out.headers = {{"content-type", "application/json"}};
    if (get_) out.headers.emplace_back("cache-control", "no-store");
    out.body = ConnectErrorJson(status);
    return out;
  }

  void Record(const absl::Status& status, const metrics::ItemCounts& counts) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    auto it = shared_->method_metrics.find(method_);
    if (it != shared_->method_metrics.end()) {
      it->second->Record(status.code(), seconds, counts, batch_size_);
    }
    const absl::StatusCode code = status.code();
    if (code == absl::StatusCode::kInternal || code == absl::StatusCode::kDataLoss ||
        code == absl::StatusCode::kUnknown) {
      // A fault of ours, always logged. Messages name fields and sizes, never payloads or key
      // material.
      Log(LogLevel::kError, "request_failed",
          {{"method", method_->path},
           {"transport", TransportName()},
           {"code", absl::StatusCodeToString(code)},
           {"message", std::string(status.message())}});
    }
    const double rate = shared_->log_sample_rate;
    if (rate > 0 && absl::Bernoulli(bitgen, rate)) {
      // Names, codes and sizes only: never key material, messages or plaintexts.
      Log(LogLevel::kInfo, "request",
          {{"method", method_->path},
           {"transport", TransportName()},
           {"http_method", get_ ? "GET" : "POST"},
           {"http_version", exchange_->http_version() >= 0x200 ? "2" : "1.1"},
           {"code", absl::StatusCodeToString(status.code())},
           {"seconds", seconds},
           {"items", batch_size_}});
    }
  }

  const std::shared_ptr<Gateway::Shared> shared_;
  const std::shared_ptr<httpd::Exchange> exchange_;
  const api::Method* const method_;
  const Clock::time_point start_;
  ContentType type_;
  bool get_ = false;
  CallOptions options_;
  Encoding sent_encoding_ = Encoding::kIdentity;  // of the response body
  absl::Time deadline_ = absl::InfiniteFuture();
  std::optional<std::string> origin_;  // the request's Origin header, for CORS
  std::unique_ptr<Message> request_;
  std::unique_ptr<Message> response_;
  ops::Operations::OpenResult shared_open_;  // [issue 15] a Connect proto AEAD Open memo hit
  int batch_size_ = 0;
  bool audit_data_ = false;  // a data-plane call drawn for the audit (Run)
  bool audit_skip_ = false;  // refused for an unwritable audit file: no line
  auth::Peer peer_;
  ops::Admission::Ticket ticket_;
};

}  // namespace

Gateway::Gateway(const api::MethodTable* table, ops::WorkerPool* pool, metrics::Metrics* metrics,
                 Options options)
    : table_(table), options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  shared_->pool = pool;
  shared_->max_message_bytes = options_.max_message_bytes;
  shared_->cors = options_.cors;
  shared_->log_sample_rate = options_.log_sample_rate;
  shared_->mtls = options_.tls != nullptr && options_.tls->mtls();
  shared_->authorizer = options_.authorizer;
  shared_->admission = options_.admission;
  shared_->trusted_proxies = options_.trusted_proxies;
  shared_->forwarded_identity = options_.forwarded_identity;
  shared_->tokens = options_.tokens;
  shared_->compression = options_.compression;
  shared_->health = std::make_unique<api::Health>(*table_);
  shared_->reflection = std::make_unique<api::Reflection>(shared_->health->services());
  if (options_.authorizer != nullptr && options_.authorizer->audit_data_plane() > 0) {
    for (const api::Method& m : table_->methods()) {
      if (m.data_plane) shared_->data_plane.insert(&m);
    }
  }
  if (metrics == nullptr) return;
  // The HTTP port counts its connections and bodies; another port (gRPC) only its defences and
  // memory, by its name. Calls are counted by method on every port alike.
  const bool http_port = options_.port == "http";
  shared_->count_bytes = http_port;
  for (const api::Method& m : table_->methods()) {
    shared_->method_metrics[&m] = metrics->Method(m.service, m.method, m.batch);
  }
  // Connection counters of the HTTP port, read at scrape time.
  std::weak_ptr<Shared> weak = shared_;
  const auto read = [weak](auto field) {
    return [weak, field] {
      std::shared_ptr<Shared> s = weak.lock();
      if (s == nullptr) return 0.0;
      absl::MutexLock lock(&s->server_mu);
      return s->server == nullptr ? 0.0 : static_cast<double>(s->server->stats().*field);
    };
  };
  using Stats = httpd::Server::Stats;
  if (http_port) {
    metrics->AddPullGauge("offload_http_connections", "Open connections on the HTTP port", {},
                          read(&Stats::open));
    metrics->AddPullCounter("offload_http_connections_total",
                            "Connections to the HTTP port: accepted, or refused at accept "
                            "(--http_max_connections reached)",
                            {{"result", "accepted"}}, read(&Stats::accepted));
    metrics->AddPullCounter("offload_http_connections_total",
                            "Connections to the HTTP port: accepted, or refused at accept "
                            "(--http_max_connections reached)",
                            {{"result", "refused"}}, read(&Stats::refused));
  }
  // The front door's defences, by reason (httpd::AbuseReason), and the memory its budgets hold.
  for (int i = 0; i < static_cast<int>(httpd::AbuseReason::kCount); ++i) {
    metrics->AddPullCounter(
        "offload_http_abuse_total",
        "Front-door defences that acted on the HTTP port, by reason: a connection closed "
        "(premature_resets, reset_rate, continuations, control_flood, settings, no_progress, "
        "too_many_pings, protocol_error, send_timeout), a request refused or cut short (header_too_large, "
        "body_too_large, stream_refused: memory budget) or a connection's body held back "
        "(read_paused: memory budget)",
        {{"port", options_.port},
         {"reason", httpd::AbuseReasonName(static_cast<httpd::AbuseReason>(i))}},
        [weak, i] {
          std::shared_ptr<Shared> s = weak.lock();
          if (s == nullptr) return 0.0;
          absl::MutexLock lock(&s->server_mu);
          return s->server == nullptr ? 0.0 : static_cast<double>(s->server->stats().abuse[i]);
        });
  }
  metrics->AddPullGauge("offload_http_buffered_bytes",
                        "Request body bytes held and answer bytes not yet sent on the HTTP port "
                        "(--http_memory_budget_bytes bounds it)",
                        {{"port", options_.port}}, read(&Stats::buffered_bytes));
  if (!http_port) return;
  metrics->AddPullCounter("offload_http_read_timeouts_total",
                          "HTTP connections cut for a request that did not arrive in time "
                          "(--http_read_timeout)",
                          {}, read(&Stats::read_timeouts));
  // RPC bodies by encoding, and what became of the responses callers asked to compress.
  const auto bytes = [weak](auto pick) {
    return [weak, pick] {
      std::shared_ptr<Shared> s = weak.lock();
      return s == nullptr ? 0.0 : static_cast<double>(pick(s->bytes).load(std::memory_order_relaxed));
    };
  };
  for (const Encoding e : {Encoding::kIdentity, Encoding::kGzip}) {
    const int i = static_cast<int>(e);
    const std::string name(EncodingName(e));
    metrics->AddPullCounter(
        "offload_http_received_bytes_total",
        "Request bodies of Connect and gRPC-Web calls as received, by their declared encoding "
        "(Content-Encoding, grpc-encoding, a Connect GET's compression)",
        {{"encoding", name}}, bytes([i](Shared::Bytes& b) -> auto& { return b.received[i]; }));
    metrics->AddPullCounter(
        "offload_http_sent_bytes_total",
        "Response bodies of Connect and gRPC-Web calls as sent, by encoding",
        {{"encoding", name}}, bytes([i](Shared::Bytes& b) -> auto& { return b.sent[i]; }));
  }
  for (const CompressionResult r : {CompressionResult::kCompressed, CompressionResult::kTooSmall,
                                    CompressionResult::kIncompressible,
                                    CompressionResult::kNoGain}) {
    const int i = static_cast<int>(r);
    metrics->AddPullCounter(
        "offload_http_response_compression_total",
        "Responses whose caller accepts gzip, by what the gateway did: compressed, or sent as "
        "they were (too_small: under --http_compression_min_bytes; incompressible: a sample "
        "looked random; no_gain: gzip saved under 1/16)",
        {{"result", std::string(CompressionResultName(r))}},
        bytes([i](Shared::Bytes& b) -> auto& { return b.results[i]; }));
  }
  metrics->AddPullCounter("offload_http_compression_saved_bytes_total",
                          "Bytes gzip took off the responses it compressed",
                          {}, bytes([](Shared::Bytes& b) -> auto& { return b.saved; }));
}

Gateway::~Gateway() { Stop(absl::Now()); }

absl::Status Gateway::Start() {
  httpd::Server::Options o = options_.http;
  o.max_body_bytes = MaxBody(options_.max_message_bytes);
  if (options_.tls != nullptr) {
    o.configure_tls = [this](SSL_CTX* ctx) { return ConfigureTls(ctx); };
    if (options_.tls->mtls()) {
      o.peer_identity = [](X509* cert) {
        return cert == nullptr ? std::string() : auth::IdentityOf(cert);
      };
    }
  }
  server_ = std::make_unique<httpd::Server>(std::move(o), this);
  if (absl::Status s = server_->Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(options_.port, "_address: ", s.message()));
  }
  {
    absl::MutexLock lock(&shared_->server_mu);
    shared_->server = server_.get();
  }
  Log(LogLevel::kInfo, absl::StrCat(options_.port, "_started"),
      {{"http_address", options_.http.address},
       {"http_port", server_->port()},
       {"tls", options_.tls == nullptr ? "off" : (options_.tls->mtls() ? "mtls" : "tls")},
       {"protocols", options_.tls == nullptr ? "http/1.1, h2c" : "http/1.1, h2 (ALPN)"},
       {"cors_origins", shared_->cors.origins()},
       {"max_connections", options_.http.max_connections},
       {"compression_level", options_.compression.level},
       {"compression_min_bytes", options_.compression.min_bytes},
       {"methods", table_->methods().size()}});
  return absl::OkStatus();
}

absl::Status Gateway::ConfigureTls(SSL_CTX* ctx) {
  auth::TlsFiles* tls = options_.tls;
  // The certificate and the client check are ours (auth::TlsFiles): files re-read when they
  // change, the same client check and audit as the gRPC port.
  SSL_CTX_set_cert_cb(
      ctx, [](SSL* ssl, void* files) { return static_cast<auth::TlsFiles*>(files)->UseOn(ssl) ? 1 : 0; },
      tls);
  if (!tls->mtls()) return absl::OkStatus();
  // Ask for a client certificate; none passes the handshake (the authorizer then answers
  // UNAUTHENTICATED, audited), a bad one fails it (audited here).
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_cert_verify_callback(
      ctx,
      [](X509_STORE_CTX* store_ctx, void* self) -> int {
        auto* gateway = static_cast<Gateway*>(self);
        X509* leaf = X509_STORE_CTX_get0_cert(store_ctx);
        absl::StatusOr<std::string> identity =
            gateway->options_.tls->VerifyClient(leaf, X509_STORE_CTX_get0_untrusted(store_ctx));
        if (identity.ok()) return 1;
        if (gateway->options_.authorizer != nullptr) {
          gateway->options_.authorizer->AuditHandshakeRefused(gateway->options_.port,
                                                              auth::IdentityOf(leaf),
                                                              identity.status().message());
        }
        X509_STORE_CTX_set_error(store_ctx, X509_V_ERR_CERT_REJECTED);
        return 0;
      },
      this);
  return absl::OkStatus();
}

void Gateway::HeaderTooLarge(absl::string_view peer_address) {
  if (options_.authorizer == nullptr) return;
  options_.authorizer->AuditRefusedRequest(
      peer_address, options_.port,
      absl::StrCat("request headers over http_max_header_bytes (",
                   options_.http.max_header_bytes, " bytes): answered 431 unread"));
}

void Gateway::SetReady(bool ready) {
  shared_->health->SetReady(ready);
  shared_->PushAll(/*end=*/false);
}

void Gateway::Drain() {
  shared_->health->SetReady(false);
  shared_->health->SetDraining();
  // Health Watch streams hear NOT_SERVING and end (UNAVAILABLE): nothing holds the drain.
  shared_->PushAll(/*end=*/true);
  if (server_ != nullptr) server_->Drain();
}

void Gateway::Reflect(std::shared_ptr<httpd::Exchange> exchange) {
  // Each request message as it arrives, each answer written at once; the stream ends when the
  // client ends its side (OK), on a malformed message, or when a drain starts (UNAVAILABLE).
  constexpr size_t kMaxRequestBytes = 16 << 10;  // a reflection request is a name or two
  const StreamWire wire = *StreamWireOf(exchange->header("content-type"));  // Streaming() said so
  const absl::StatusOr<Encoding> encoding_or = StreamEncoding(wire, *exchange);
  if (!encoding_or.ok()) {
    return exchange->Respond(shared_->Refusal(*exchange, wire, encoding_or.status()));
  }
  {
    absl::MutexLock lock(&shared_->watch_mu);
    if (absl::Status s = shared_->StartStream(*exchange, wire); !s.ok()) {
      return exchange->Respond(shared_->Refusal(*exchange, wire, s));
    }
    shared_->streams.push_back({exchange, wire});
  }
  struct State {
    explicit State(const api::Reflection* r) : stream(r), reader(kMaxRequestBytes) {}
    api::Reflection::Stream stream;
    FrameReader reader;
    bool over = false;
  };
  auto state = std::make_shared<State>(shared_->reflection.get());
  std::weak_ptr<httpd::Exchange> weak = exchange;
  const Encoding encoding = *encoding_or;
  exchange->ReadBody([state, weak, encoding, wire](absl::string_view data, bool end) {
    std::shared_ptr<httpd::Exchange> ex = weak.lock();
    if (ex == nullptr || state->over) return;
    absl::Status status = state->reader.Feed(data, [&](bool compressed, absl::string_view message) {
      grpc::reflection::v1::ServerReflectionRequest request;
      OFFLOAD_RETURN_IF_ERROR(DecodeMessage(ContentType{Protocol::kGrpc, Codec::kProto}, encoding,
                                            compressed, message, kMaxRequestBytes, &request));
      if (ex->unsent_bytes() > Shared::kMaxStreamUnsentBytes) {
        // Answers pile up unread: the client asks without reading.
        return absl::ResourceExhaustedError("reflection: the answers are not being read");
      }
      ex->Write(EncodeFrame(0, state->stream.Answer(request).SerializeAsString()));
      return absl::OkStatus();
    });
    if (status.ok() && end && !state->reader.at_boundary()) {
      status = absl::InvalidArgumentError("grpc request: the stream ended inside a message");
    }
    if (!status.ok() || end) {
      state->over = true;
      EndStream(*ex, wire, status);
    }
  });
}

const api::Method* Gateway::FindMethod(absl::string_view path) const {
  if (const api::Method* m = table_->Find(path)) return m;
  return shared_->health->Find(path);
}

bool Gateway::Streaming(const httpd::Exchange& exchange) {
  // Health Watch and reflection as streams: over HTTP/2, in gRPC, gRPC-Web or Connect's
  // streaming protocol (protobuf).
  const absl::string_view path = exchange.path();
  if ((path != kHealthWatchPath && path != kReflectionV1Path && path != kReflectionV1alphaPath) ||
      exchange.method() != "POST" || exchange.http_version() < 0x200) {
    return false;
  }
  return StreamWireOf(exchange.header("content-type")).has_value();
}

void Gateway::WatchHealth(std::shared_ptr<httpd::Exchange> exchange) {
  // The request (one small message) as it arrives; then the status now, and each change.
  constexpr size_t kMaxRequestBytes = 4096;
  auto body = std::make_shared<std::string>();
  std::weak_ptr<httpd::Exchange> weak = exchange;
  const StreamWire wire = *StreamWireOf(exchange->header("content-type"));  // Streaming() said so
  exchange->ReadBody([shared = shared_, weak, body, wire](absl::string_view data, bool end) {
    std::shared_ptr<httpd::Exchange> ex = weak.lock();
    if (ex == nullptr) return;
    if (body->size() <= kMaxRequestBytes) {
      body->append(data.data(), std::min(data.size(), kMaxRequestBytes + 1 - body->size()));
    }
    if (!end) return;
    const absl::StatusOr<Encoding> encoding = StreamEncoding(wire, *ex);
    grpc::health::v1::HealthCheckRequest request;
    absl::Status status = encoding.status();
    if (status.ok() && body->size() > kMaxRequestBytes) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("health request: expected at most ", kMaxRequestBytes, " bytes"));
    }
    if (status.ok()) {
      status = DecodeRequest(ContentType{Protocol::kGrpc, Codec::kProto}, *encoding, *body,
                             kMaxRequestBytes, &request);
    }
    if (status.ok() && ex->abandoned()) status = absl::CancelledError("client went away");
    if (status.ok()) {
      // Under the lock Drain's PushAll takes: a stream either ends there or is refused here.
      absl::MutexLock lock(&shared->watch_mu);
      status = shared->StartStream(*ex, wire);
      if (status.ok()) {
        auto watch = std::make_shared<Shared::Watch>();
        watch->exchange = std::move(ex);
        watch->wire = wire;
        watch->service = request.service();
        shared->Push(*watch);
        shared->watches.push_back(std::move(watch));
        return;
      }
    }
    ex->Respond(shared->Refusal(*ex, wire, status));
  });
}

void Gateway::Stop(absl::Time deadline) {
  Drain();
  if (server_ == nullptr) return;
  server_->Stop(deadline);
  {
    absl::MutexLock lock(&shared_->server_mu);
    shared_->server = nullptr;
  }
  server_.reset();
  Log(LogLevel::kInfo, absl::StrCat(options_.port, "_stopped"));
}

httpd::Server::Stats Gateway::server_stats() const {
  return server_ != nullptr ? server_->stats() : httpd::Server::Stats{};
}

void Gateway::Handle(std::shared_ptr<httpd::Exchange> exchange) {
  const absl::string_view method = exchange->method();
  const absl::string_view path = exchange->path();
  const std::optional<absl::string_view> origin = exchange->header("origin");
  const auto respond = [&](httpd::Response r) {
    shared_->cors.AddResponseHeaders(origin, &r.headers);
    exchange->Respond(std::move(r));
  };

  if (path == "/healthz" || path == "/readyz") {
    if (method != "GET" && method != "HEAD") {
      return respond(Plain(405, "method not allowed\n", {{"allow", "GET, HEAD"}}));
    }
    if (path == "/healthz") return respond(Plain(200, "ok\n", {{"cache-control", "no-store"}}));
    return respond(shared_->health->ready() ? Plain(200, "ready\n", {{"cache-control", "no-store"}})
                                 : Plain(503, "not ready\n", {{"cache-control", "no-store"}}));
  }

  if (Streaming(*exchange)) {
    if (path == kHealthWatchPath) return WatchHealth(std::move(exchange));
    return Reflect(std::move(exchange));
  }
  // A gRPC request the table does not answer (a known method's call answers for itself, off
  // this path): over HTTP/1.1 gRPC's 505 for any path, as grpc-go answers, else gRPC's errors.
  const auto grpc = [&exchange] {
    return IsGrpcContentType(exchange->header("content-type").value_or(""));
  };
  const auto grpc_over_http1 = [&] { return exchange->http_version() < 0x200 && grpc(); };
  if (path == kReflectionV1Path || path == kReflectionV1alphaPath) {
    // Not a stream (HTTP/1.1, not a protobuf POST, a unary content type): reflection is a
    // bidirectional stream, over HTTP/2 only, each protocol answering in its own terms.
    if (grpc_over_http1()) return respond(Plain(505, "gRPC requires HTTP/2\n"));
    const absl::Status unimplemented = absl::UnimplementedError(
        "server reflection is a bidirectional stream: a POST over HTTP/2 of application/grpc, "
        "application/grpc-web+proto or application/connect+proto");
    const std::optional<absl::string_view> type = exchange->header("content-type");
    if (grpc()) return respond(GrpcTrailersOnly(unimplemented, "application/grpc"));
    if (const std::optional<StreamWire> wire = StreamWireOf(type)) {
      return respond(StreamRefusal(*wire, unimplemented));
    }
    if (type.has_value() && absl::StartsWithIgnoreCase(*type, "application/grpc-web")) {
      return respond(GrpcTrailersOnly(unimplemented, "application/grpc-web+proto"));
    }
    return respond(httpd::Response(415, {{"content-type", "application/json"}},
                                   ConnectErrorJson(unimplemented)));
  }
  const api::Method* rpc = FindMethod(path);
  if (method == "OPTIONS") {
    const std::optional<absl::string_view> request_method =
        exchange->header("access-control-request-method");
    if (origin.has_value() && request_method.has_value()) {
      // A CORS preflight: answered here, and only for a listed origin.
      CorsPolicy::Answer answer = shared_->cors.Preflight(*origin, *request_method);
      httpd::Response r(answer.status, std::move(answer.headers),
                        answer.status == 204 ? "" : "CORS: origin or method not allowed\n");
      return exchange->Respond(std::move(r));
    }
    return respond(httpd::Response(
        204, {{"allow", rpc != nullptr && rpc->no_side_effects ? "GET, POST, OPTIONS" : "POST, OPTIONS"}},
        ""));
  }
  if (rpc == nullptr) {
    if (method != "POST") return respond(Plain(404, "not found\n"));
    if (grpc_over_http1()) return respond(Plain(505, "gRPC requires HTTP/2\n"));
    if (grpc()) {
      // gRPC's answer to a method we do not have: UNIMPLEMENTED, Trailers-Only.
      return respond(GrpcTrailersOnly(
          absl::UnimplementedError(absl::StrCat("unknown method ", path.substr(0, 128))),
          "application/grpc"));
    }
    // An RPC to a method we do not have: Connect's 404, with its error body.
    return respond(httpd::Response(
        404, {{"content-type", "application/json"}},
        ConnectErrorJson(absl::UnimplementedError(
            absl::StrCat("unknown method ", path.substr(0, 128))))));
  }
  if (method == "GET" && rpc->no_side_effects) {
    return std::make_shared<Call>(shared_, std::move(exchange), rpc)->StartGet();
  }
  if (method != "POST") {
    const std::string allow = rpc->no_side_effects ? "GET, POST" : "POST";
    return respond(Plain(
        405,
        absl::StrCat("method not allowed: ", rpc->path,
                     rpc->no_side_effects ? " takes POST, or a Connect GET\n"
                                          : " has side effects: POST only\n"),
        {{"allow", allow}}));
  }
  std::make_shared<Call>(shared_, std::move(exchange), rpc)->StartPost();
}

}  // namespace offload::http
