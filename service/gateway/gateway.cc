#include "service/gateway/gateway.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "service/common/log.h"
#include "service/gateway/internal/refusals.h"
#include "service/gateway/internal/shared.h"
#include "service/http/answer.h"

namespace offload::gateway {

using http::PlainText;

Gateway::Gateway(const api::MethodTable* table, ops::WorkerPool* pool, metrics::Metrics* metrics,
                 Options options)
    : table_(table), options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  call::Context& c = shared_->call;
  c.pool = pool;
  c.log_sample_rate = options_.log_sample_rate;
  c.mtls = options_.tls != nullptr && options_.tls->mtls();
  c.authorizer = options_.authorizer;
  c.admission = options_.admission;
  c.trusted_proxies = options_.trusted_proxies;
  c.forwarded_identity = options_.forwarded_identity;
  c.tokens = options_.tokens;
  c.inline_rule.emplace(options_.inline_work);
  shared_->max_message_bytes = options_.max_message_bytes;
  shared_->cors = options_.cors;
  shared_->compression = options_.compression;
  shared_->health = std::make_unique<api::Health>(*table_);
  shared_->reflection = std::make_unique<api::Reflection>(shared_->health->services());
  if (options_.authorizer != nullptr && options_.authorizer->audit_data_plane() > 0) {
    for (const api::Method& m : table_->methods()) {
      if (m.data_plane) c.data_plane.insert(&m);
    }
  }
  if (metrics == nullptr) return;
  // Calls are counted by method on every port alike; bodies on the HTTP port only.
  shared_->count_bytes = options_.port == "http";
  for (const api::Method& m : table_->methods()) {
    c.method_metrics[&m] = metrics->Method(m.service, m.method, m.batch);
  }
  RegisterPortMetrics(metrics, shared_, options_.port);
}

Gateway::~Gateway() { Stop(absl::Now()); }

absl::Status Gateway::Start() {
  httpd::Server::Options o = options_.http;
  o.max_body_bytes = http::MaxBody(options_.max_message_bytes);
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
  return http::StreamWireOf(exchange.header("content-type")).has_value();
}

int64_t Gateway::BodyLimit(const httpd::Exchange& exchange) {
  if (exchange.method() != "POST") return -1;
  absl::StatusOr<http::ContentType> type =
      http::ParseContentType(exchange.header("content-type").value_or(""));
  if (!type.ok()) return -1;  // refused for its content type, whatever its body
  return http::UnaryBodyLimit(*type, options_.max_message_bytes);
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
  const auto respond = [&](http::Answer a) {
    shared_->cors.AddResponseHeaders(origin, &a.headers);
    exchange->Respond(ToResponse(std::move(a)));
  };

  if (path == "/healthz" || path == "/readyz") {
    if (method != "GET" && method != "HEAD") {
      return respond(PlainText(405, "method not allowed\n", {{"allow", "GET, HEAD"}}));
    }
    if (path == "/healthz") return respond(PlainText(200, "ok\n", {{"cache-control", "no-store"}}));
    return respond(shared_->health->ready()
                       ? PlainText(200, "ready\n", {{"cache-control", "no-store"}})
                       : PlainText(503, "not ready\n", {{"cache-control", "no-store"}}));
  }

  if (Streaming(*exchange)) {
    if (exchange->refusal() != httpd::Exchange::Refusal::kNone) {  // refused unread
      return respond(http::StreamRefusal(*http::StreamWireOf(exchange->header("content-type")),
                                         EngineRefusal(exchange->refusal(), 0)));
    }
    if (path == kHealthWatchPath) return WatchHealth(shared_, std::move(exchange));
    return Reflect(shared_, std::move(exchange));
  }
  const bool http2 = exchange->http_version() >= 0x200;
  if (path == kReflectionV1Path || path == kReflectionV1alphaPath) {
    // Not a stream (HTTP/1.1, not a protobuf POST, a unary content type): each protocol
    // answers in its own terms.
    return respond(http::ReflectionNotAStream(exchange->header("content-type"), http2));
  }
  const api::Method* rpc = FindMethod(path);
  if (method == "OPTIONS") {
    const std::optional<absl::string_view> request_method =
        exchange->header("access-control-request-method");
    if (origin.has_value() && request_method.has_value()) {
      // A CORS preflight: answered here, and only for a listed origin.
      http::CorsPolicy::Answer answer = shared_->cors.Preflight(*origin, *request_method);
      httpd::Response r(answer.status, std::move(answer.headers),
                        answer.status == 204 ? "" : "CORS: origin or method not allowed\n");
      return exchange->Respond(std::move(r));
    }
    http::Answer allow;
    allow.status = 204;
    allow.headers = {{"allow", rpc != nullptr && rpc->no_side_effects ? "GET, POST, OPTIONS"
                                                                      : "POST, OPTIONS"}};
    return respond(std::move(allow));
  }
  if (rpc == nullptr) {
    if (method != "POST") return respond(PlainText(404, "not found\n"));
    // A gRPC request the table does not answer: over HTTP/1.1 gRPC's 505 for any path, as
    // grpc-go answers, else gRPC's UNIMPLEMENTED; Connect's 404 otherwise.
    return respond(
        http::UnknownMethod(path, exchange->header("content-type").value_or(""), http2));
  }
  if (method == "GET" && rpc->no_side_effects) {
    return StartGet(shared_, std::move(exchange), rpc);
  }
  if (method != "POST") {
    const std::string allow = rpc->no_side_effects ? "GET, POST" : "POST";
    return respond(PlainText(
        405,
        absl::StrCat("method not allowed: ", rpc->path,
                     rpc->no_side_effects ? " takes POST, or a Connect GET\n"
                                          : " has side effects: POST only\n"),
        {{"allow", allow}}));
  }
  StartPost(shared_, std::move(exchange), rpc);
}

}  // namespace offload::gateway
