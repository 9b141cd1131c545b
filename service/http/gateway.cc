#include "service/http/gateway.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <civetweb.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "offload/v1/keys.pb.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/http/protocol.h"
#include "service/http/rpc_codec.h"

namespace offload::http {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using Clock = std::chrono::steady_clock;

// Responses at least this large are gzipped when the caller accepts gzip (Connect only).
constexpr size_t kGzipMinBytes = 1024;

std::optional<absl::string_view> Header(mg_connection* conn, const char* name) {
  const char* value = mg_get_header(conn, name);
  if (value == nullptr) return std::nullopt;
  return absl::string_view(value);
}

// How the items of a finished call ended (as the gRPC path counts them): OK with `valid` false
// and INVALID_ARGUMENT are the caller's input; other errors are errors.
metrics::ItemCounts CountOne(absl::StatusCode code, const Message* result) {
  if (code == absl::StatusCode::kOk) {
    if (result != nullptr) {
      const FieldDescriptor* valid = result->GetDescriptor()->FindFieldByName("valid");
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
  const FieldDescriptor* results = response.GetDescriptor()->FindFieldByName("results");
  if (results == nullptr) return counts;
  const auto* reflection = response.GetReflection();
  for (int i = 0; i < reflection->FieldSize(response, results); ++i) {
    const Message& result = reflection->GetRepeatedMessage(response, results, i);
    absl::StatusCode code = absl::StatusCode::kOk;
    if (const FieldDescriptor* status = result.GetDescriptor()->FindFieldByName("status")) {
      const Message& s = result.GetReflection()->GetMessage(result, status);
      if (const FieldDescriptor* c = s.GetDescriptor()->FindFieldByName("code")) {
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
  const FieldDescriptor* items = request.GetDescriptor()->FindFieldByName("items");
  return items == nullptr ? 0 : request.GetReflection()->FieldSize(request, items);
}

thread_local absl::InsecureBitGen bitgen;

}  // namespace

// One RPC request: protocol negotiation, body, decode, run on the pool, encode, respond.
class Gateway::Call {
 public:
  Call(Gateway* gateway, mg_connection* conn, const Method* method)
      : gateway_(gateway), conn_(conn), method_(method), start_(Clock::now()) {}

  int Serve() {
    absl::StatusOr<ContentType> type = ParseContentType(Header(conn_, "Content-Type").value_or(""));
    if (!type.ok()) {
      // Neither protocol: Connect says 415, and tells what it accepts.
      return SendConnectError(415, absl::UnimplementedError(type.status().message()),
                              {{"Accept-Post",
                                "application/proto, application/json, application/grpc-web, "
                                "application/grpc-web+proto"}});
    }
    type_ = *type;
    absl::Status status = Run();
    Record(status);
    if (!status.ok()) return SendError(status);
    return SendResponse();
  }

 private:
  struct State {
    std::unique_ptr<Message> request;
    std::unique_ptr<Message> response;
    absl::Status status;
    absl::Notification done;
    std::atomic<bool> abandoned{false};
    absl::Time deadline = absl::InfiniteFuture();
    ops::Admission* admission = nullptr;  // counts deadline drops
  };

  // Everything up to a response message (or an error).
  absl::Status Run() {
    if (gateway_->draining_.load()) return absl::UnavailableError("server is draining");
    state_ = std::make_shared<State>();
    state_->admission = gateway_->options_.admission;
    absl::StatusOr<CallOptions> options = ParseCallHeaders(
        type_.protocol, [this](const char* name) { return Header(conn_, name); });
    if (!options.ok()) return options.status();
    if (options->timeout.has_value()) state_->deadline = absl::Now() + *options->timeout;
    gzip_response_ = options->gzip_response;

    const int64_t max = gateway_->options_.max_message_bytes;
    const int64_t limit =
        max + (type_.protocol == Protocol::kGrpcWeb ? int64_t{kFrameHeaderBytes} : 0);
    std::string body;
    if (absl::Status s = ReadBody(limit, &body); !s.ok()) return s;

    state_->request.reset(method_->request_prototype->New());
    state_->response.reset(method_->response_prototype->New());
    if (absl::Status s = DecodeRequest(type_, options->encoding, body, max, state_->request.get());
        !s.ok()) {
      return s;
    }
    batch_size_ = method_->batch ? BatchSize(*state_->request) : 0;

    const auth::Peer peer = gateway_->PeerOf(conn_);
    if (auth::Authorizer* authorizer = gateway_->options_.authorizer) {
      OFFLOAD_RETURN_IF_ERROR(
          authorizer->Authorize(peer, method_->path, *state_->request, TransportName()));
    }
    ops::Admission::Ticket ticket;
    if (ops::Admission* admission = gateway_->options_.admission) {
      OFFLOAD_ASSIGN_OR_RETURN(ticket,
                               admission->Admit(peer.ClientName(), std::max(1, batch_size_)));
    }
    absl::Status status = Execute();
    ticket.Release();
    if (auth::Authorizer* authorizer = gateway_->options_.authorizer) {
      const auto* info = dynamic_cast<const v1::KeyInfo*>(state_->response.get());
      authorizer->AuditKeyCall(peer, method_->path, *state_->request, status,
                               status.ok() && info != nullptr ? info->current_version() : 0,
                               TransportName());
    }
    if (!status.ok()) {
      if (method_->batch) state_->response->Clear();
      return status;
    }
    counts_ = method_->batch ? CountBatch(*state_->response)
                             : CountOne(absl::StatusCode::kOk, state_->response.get());
    return Encode();
  }

  // Reads the whole body, refusing one over `limit` bytes: by its Content-Length before
  // reading anything, or (chunked) once the limit is passed.
  absl::Status ReadBody(int64_t limit, std::string* body) {
    const mg_request_info* info = mg_get_request_info(conn_);
    const auto too_large = [&] {
      return absl::ResourceExhaustedError(
          absl::StrCat("request body: expected at most ", limit, " bytes"));
    };
    if (info->content_length > limit) return too_large();
    if (info->content_length > 0) body->reserve(static_cast<size_t>(info->content_length));
    char buffer[16384];
    while (true) {
      const int n = mg_read(conn_, buffer, sizeof(buffer));
      if (n < 0) return absl::InvalidArgumentError("request body: read failed (truncated?)");
      if (n == 0) break;
      body->append(buffer, static_cast<size_t>(n));
      if (static_cast<int64_t>(body->size()) > limit) return too_large();
    }
    if (info->content_length >= 0 && static_cast<int64_t>(body->size()) != info->content_length) {
      return absl::InvalidArgumentError(absl::StrCat("request body: expected ",
                                                     info->content_length, " bytes, got ",
                                                     body->size(), " (truncated)"));
    }
    return absl::OkStatus();
  }

  const char* TransportName() const {
    return type_.protocol == Protocol::kConnect ? "connect" : "grpc-web";
  }

  // Runs the call on the worker pool and waits for it (at most until the deadline).
  absl::Status Execute() {
    std::shared_ptr<State> state = state_;
    const Method* method = method_;
    auto finish = [state](absl::Status s) {
      state->status = std::move(s);
      state->done.Notify();
    };
    if (absl::Now() > state->deadline) {
      return absl::DeadlineExceededError("deadline passed before the call started");
    }
    if (method->batch) {
      // Checks the size here, then spreads the items over the pool.
      method->call(*state->request, state->response.get(), std::move(finish), [state] {
        return !state->abandoned.load() && absl::Now() <= state->deadline;
      });
    } else {
      gateway_->pool_->Submit([state, method, finish = std::move(finish)]() mutable {
        if (state->abandoned.load()) {
          return finish(absl::CancelledError("call abandoned"));
        }
        if (absl::Now() > state->deadline) {
          if (state->admission != nullptr) state->admission->CountDeadlineDrop();
          return finish(absl::DeadlineExceededError("deadline passed while queued"));
        }
        method->call(*state->request, state->response.get(), std::move(finish), nullptr);
      });
    }
    if (!state->done.WaitForNotificationWithDeadline(state->deadline)) {
      state->abandoned.store(true);  // the task, if still queued, will not run
      return absl::DeadlineExceededError("deadline exceeded");
    }
    return state->status;
  }

  absl::Status Encode() {
    return EncodeResponse(type_.codec, *state_->response, gateway_->options_.max_message_bytes,
                          &out_);
  }

  void Record(const absl::Status& status) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    auto it = gateway_->method_metrics_.find(method_->path);
    if (it == gateway_->method_metrics_.end()) return;
    const metrics::ItemCounts counts =
        status.ok() ? counts_
                    : (method_->batch ? metrics::ItemCounts{} : CountOne(status.code(), nullptr));
    it->second->Record(status.code(), seconds, counts, batch_size_);
    const double rate = gateway_->options_.log_sample_rate;
    if (rate > 0 && absl::Bernoulli(bitgen, rate)) {
      // Names, codes and sizes only: never key material, messages or plaintexts.
      Log(LogLevel::kInfo, "request",
          {{"method", it->second->name()},
           {"transport", type_.protocol == Protocol::kConnect ? "connect" : "grpc-web"},
           {"code", absl::StatusCodeToString(status.code())},
           {"seconds", seconds},
           {"items", batch_size_}});
    }
  }

  void Send(int http_status, const std::vector<std::pair<std::string, std::string>>& headers,
            absl::string_view body) {
    mg_response_header_start(conn_, http_status);
    for (const auto& [name, value] : headers) {
      mg_response_header_add(conn_, name.c_str(), value.c_str(), static_cast<int>(value.size()));
    }
    mg_response_header_add(conn_, "Content-Length", std::to_string(body.size()).c_str(), -1);
    gateway_->SendCors(conn_);
    mg_response_header_send(conn_);
    if (!body.empty()) mg_write(conn_, body.data(), body.size());
  }

  int SendConnectError(int http_status, const absl::Status& status,
                       std::vector<std::pair<std::string, std::string>> headers = {}) {
    headers.emplace_back("Content-Type", "application/json");
    Send(http_status, headers, ConnectErrorJson(status));
    return http_status;
  }

  int SendError(const absl::Status& status) {
    if (type_.protocol == Protocol::kConnect) {
      return SendConnectError(ConnectHttpStatus(status.code()), status);
    }
    // gRPC-Web "trailers-only": HTTP 200, the status in the headers, no body.
    std::vector<std::pair<std::string, std::string>> headers = {
        {"Content-Type", "application/grpc-web+proto"},
        {"grpc-status", std::to_string(static_cast<int>(status.code()))}};
    if (!status.message().empty()) {
      headers.emplace_back("grpc-message", PercentEncode(status.message()));
    }
    Send(200, headers, "");
    return 200;
  }

  int SendResponse() {
    if (type_.protocol == Protocol::kGrpcWeb) {
      std::string body = EncodeFrame(0, out_);
      body += EncodeFrame(kFrameTrailer, GrpcWebTrailers(absl::OkStatus()));
      Send(200, {{"Content-Type", "application/grpc-web+proto"}}, body);
      return 200;
    }
    std::vector<std::pair<std::string, std::string>> headers = {
        {"Content-Type", std::string(ConnectContentType(type_.codec))}};
    if (gzip_response_ && out_.size() >= kGzipMinBytes) {
      if (absl::StatusOr<std::string> zipped = Gzip(out_); zipped.ok()) {
        out_ = *std::move(zipped);
        headers.emplace_back("Content-Encoding", "gzip");
      }
    }
    Send(200, headers, out_);
    return 200;
  }

  Gateway* const gateway_;
  mg_connection* const conn_;
  const Method* const method_;
  const Clock::time_point start_;
  ContentType type_;
  std::shared_ptr<State> state_;
  bool gzip_response_ = false;
  int batch_size_ = 0;
  metrics::ItemCounts counts_;
  std::string out_;
};

Gateway::Gateway(const MethodTable* table, ops::WorkerPool* pool, metrics::Metrics* metrics,
                 Options options)
    : table_(table), pool_(pool), options_(std::move(options)) {
  if (metrics != nullptr) {
    for (const Method& m : table_->methods()) {
      method_metrics_[m.path] = metrics->Method(m.service, m.method, m.batch);
    }
  }
}

Gateway::~Gateway() { Stop(); }

absl::Status Gateway::Start() {
  const bool https = options_.tls != nullptr;
  mg_init_library(https ? MG_FEATURES_TLS : 0);
  int threads = options_.threads;
  if (threads <= 0) {
    threads = std::max(16, 4 * static_cast<int>(std::thread::hardware_concurrency()));
  }
  const std::string threads_text = std::to_string(threads);
  // civetweb marks an HTTPS port with a trailing "s".
  const std::string listen = https ? options_.address + "s" : options_.address;
  const char* civet_options[] = {"listening_ports", listen.c_str(),
                                 "num_threads", threads_text.c_str(),
                                 "request_timeout_ms", "30000",
                                 "enable_keep_alive", "yes",
                                 "keep_alive_timeout_ms", "30000",
                                 nullptr};
  mg_callbacks callbacks{};
  // civetweb's own messages (bind failures, bad requests) go to our log, without payloads.
  callbacks.log_message = [](const mg_connection*, const char* message) {
    Log(LogLevel::kWarning, "http_server", {{"message", std::string(message)}});
    return 1;
  };
  if (https) {
    // The certificate and the client check are ours (auth::TlsFiles): files re-read when they
    // change, the same client check and audit as the gRPC port.
    callbacks.init_ssl = [](void* ssl_ctx, void* self) -> int {
      static_cast<Gateway*>(self)->ConfigureTls(static_cast<SSL_CTX*>(ssl_ctx));
      return 1;  // configured: civetweb loads no certificate files itself
    };
  }
  context_ = mg_start(&callbacks, this, civet_options);
  if (context_ == nullptr) {
    mg_exit_library();
    return absl::UnavailableError(
        absl::StrCat("http_address: cannot listen on ", options_.address));
  }
  mg_set_request_handler(context_, "/", &Gateway::HandleRequest, this);
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(context_, 4, ports) > 0) port_ = ports[0].port;
  Log(LogLevel::kInfo, "http_started",
      {{"http_address", options_.address}, {"http_port", port_}, {"threads", threads},
       {"methods", table_->methods().size()}});
  return absl::OkStatus();
}

void Gateway::ConfigureTls(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(
      ctx, [](SSL* ssl, void* self) { return static_cast<Gateway*>(self)->options_.tls->UseOn(ssl) ? 1 : 0; },
      this);
  if (!options_.tls->mtls()) return;
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
          gateway->options_.authorizer->AuditHandshakeRefused("http", auth::IdentityOf(leaf),
                                                              identity.status().message());
        }
        X509_STORE_CTX_set_error(store_ctx, X509_V_ERR_CERT_REJECTED);
        return 0;
      },
      this);
}

auth::Peer Gateway::PeerOf(mg_connection* conn) const {
  const mg_request_info* info = mg_get_request_info(conn);
  auth::Peer peer;
  peer.address = info->remote_addr;
  if (options_.tls != nullptr && options_.tls->mtls() && info->client_cert != nullptr &&
      info->client_cert->peer_cert != nullptr) {
    // Verified in the handshake (ConfigureTls).
    peer.identity = auth::IdentityOf(static_cast<X509*>(info->client_cert->peer_cert));
  }
  return peer;
}

void Gateway::Drain() {
  ready_.store(false);
  draining_.store(true);
  if (context_ == nullptr || stopper_.joinable()) return;
  // mg_stop returns once every civetweb thread has finished its request.
  stopper_ = std::thread([context = context_] { mg_stop(context); });
}

void Gateway::Stop() {
  Drain();
  if (!stopper_.joinable()) return;
  stopper_.join();
  context_ = nullptr;
  mg_exit_library();
  Log(LogLevel::kInfo, "http_stopped");
}

int Gateway::HandleRequest(mg_connection* conn, void* self) {
  return static_cast<Gateway*>(self)->Handle(conn);
}

void Gateway::SendCors(mg_connection* conn) const {
  if (options_.cors_origin.empty()) return;
  const std::optional<absl::string_view> origin = Header(conn, "Origin");
  if (!origin.has_value()) return;
  if (options_.cors_origin == "*") {
    mg_response_header_add(conn, "Access-Control-Allow-Origin", "*", -1);
  } else if (*origin == options_.cors_origin) {
    mg_response_header_add(conn, "Access-Control-Allow-Origin", options_.cors_origin.c_str(), -1);
    mg_response_header_add(conn, "Vary", "Origin", -1);
  } else {
    return;
  }
  mg_response_header_add(conn, "Access-Control-Expose-Headers",
                         "grpc-status, grpc-message, grpc-status-details-bin, "
                         "Content-Encoding, Connect-Content-Encoding",
                         -1);
}

int Gateway::Handle(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const absl::string_view method = info->request_method;
  const absl::string_view path = info->local_uri != nullptr ? info->local_uri : "";
  const auto plain = [&](int status, absl::string_view text,
                         std::vector<std::pair<const char*, std::string>> headers = {}) {
    mg_response_header_start(conn, status);
    mg_response_header_add(conn, "Content-Type", "text/plain; charset=utf-8", -1);
    mg_response_header_add(conn, "Content-Length", std::to_string(text.size()).c_str(), -1);
    for (const auto& [name, value] : headers) {
      mg_response_header_add(conn, name, value.c_str(), -1);
    }
    mg_response_header_send(conn);
    if (method != "HEAD") mg_write(conn, text.data(), text.size());
    return status;
  };

  if (path == "/healthz" || path == "/readyz") {
    if (method != "GET" && method != "HEAD") {
      return plain(405, "method not allowed\n", {{"Allow", "GET, HEAD"}});
    }
    if (path == "/healthz") return plain(200, "ok\n");
    return ready_.load() ? plain(200, "ready\n") : plain(503, "not ready\n");
  }

  const Method* rpc = table_->Find(path);
  if (method == "OPTIONS") {
    // CORS preflight (headers only when a CORS origin is configured).
    mg_response_header_start(conn, 204);
    mg_response_header_add(conn, "Allow", "POST, OPTIONS", -1);
    SendCors(conn);
    if (!options_.cors_origin.empty() && Header(conn, "Origin").has_value()) {
      mg_response_header_add(conn, "Access-Control-Allow-Methods", "POST, OPTIONS", -1);
      mg_response_header_add(conn, "Access-Control-Allow-Headers",
                             "Content-Type, Connect-Protocol-Version, Connect-Timeout-Ms, "
                             "Content-Encoding, Accept-Encoding, Grpc-Timeout, X-Grpc-Web, "
                             "X-User-Agent, X-Offload-Key",
                             -1);
      mg_response_header_add(conn, "Access-Control-Max-Age", "7200", -1);
    }
    mg_response_header_add(conn, "Content-Length", "0", -1);
    mg_response_header_send(conn);
    return 204;
  }
  if (rpc == nullptr) {
    if (method != "POST") return plain(404, "not found\n");
    // An RPC to a method we do not have: Connect's 404, with its error body.
    const std::string body = ConnectErrorJson(
        absl::UnimplementedError(absl::StrCat("unknown method ", path.substr(0, 128))));
    mg_response_header_start(conn, 404);
    mg_response_header_add(conn, "Content-Type", "application/json", -1);
    mg_response_header_add(conn, "Content-Length", std::to_string(body.size()).c_str(), -1);
    SendCors(conn);
    mg_response_header_send(conn);
    mg_write(conn, body.data(), body.size());
    return 404;
  }
  if (method != "POST") {
    return plain(405, "method not allowed: RPCs are POST\n", {{"Allow", "POST"}});
  }
  return Call(this, conn, rpc).Serve();
}

}  // namespace offload::http
