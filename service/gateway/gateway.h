// The glue between the engine, the protocols and the call: one httpd::Handler per port that
// routes each request (GET /healthz and /readyz, health Watch and reflection streams, CORS
// preflights, the method table's RPCs and health Check), reads it with the protocol mappings of
// service/http (Connect unary POST and GET, gRPC-Web binary and text, gRPC over HTTP/2), runs it
// as a call::Call (service/call: identity, grants, admission, deadline, memo first, pool, audit,
// metrics) and writes the protocol's answer; plus the port's lifecycle, TLS and engine metrics.
// Requests are decoded on a loop thread; memo hits of Verify, BatchVerify, Derive and AEAD Open
// are answered there (no crypto primitive), every other call runs on the worker pool and its
// answer is handed back to the loop. Responses are gzipped for callers that ask, when it pays
// (CompressResponse, http/rpc_codec.h), where the call finished (the loop for a memo hit).
//
//   api::MethodTable table(&operations, &key_manager);
//   gateway::Gateway::Options options;
//   options.http.address = "127.0.0.1:8080";
//   gateway::Gateway gateway(&table, &pool, &metrics, options);
//   OFFLOAD_RETURN_IF_ERROR(gateway.Start());
//   gateway.SetReady(true);            // /readyz 200
//   ...
//   gateway.Drain();                   // /readyz 503, health NOT_SERVING (Watch streams told
//                                      // and ended), new RPCs UNAVAILABLE, idle connections closed
//   ...                                // e.g. drain the other port meanwhile
//   gateway.Stop(deadline);            // answers in flight (until `deadline`), then closes all
//
// Thread-safety: Start, Drain and Stop from one thread; SetReady from any. The table, pool,
// metrics, authorizer and admission must outlive the gateway, and the pool must still run when
// Stop() is called.
#ifndef SERVICE_GATEWAY_GATEWAY_H_
#define SERVICE_GATEWAY_GATEWAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/api/health.h"
#include "service/api/method_table.h"
#include "service/api/reflection.h"
#include "service/auth/authorizer.h"
#include "service/auth/forwarded_identity.h"
#include "service/auth/tls.h"
#include "service/auth/tokens.h"
#include "service/auth/trusted_proxies.h"
#include "service/http/protocol.h"
#include "service/http/rpc_codec.h"
#include "service/httpd/server.h"
#include "service/metrics/metrics.h"
#include "service/ops/admission.h"
#include "service/ops/inline_rule.h"
#include "service/ops/worker_pool.h"

namespace offload::gateway {

class Gateway final : public httpd::Handler {
 public:
  // The HTTP server options the gateway starts from: port 8080 on loopback.
  static httpd::Server::Options DefaultHttp() {
    httpd::Server::Options o;
    o.address = "127.0.0.1:8080";
    return o;
  }

  struct Options {
    // Largest request or response message (as the gRPC server's limit).
    int64_t max_message_bytes = 16 << 20;
    // Browser origins allowed by CORS (exact); empty: no CORS headers at all.
    http::CorsPolicy cors;
    // The HTTP server: address (IPv6 as [::1]:8080, port 0 picks a free one; see port()),
    // event loop threads, connection bound, timeouts, header limit, HTTP/2 streams. The gateway
    // sets its body limit (from max_message_bytes) and its TLS hooks (from `tls`).
    httpd::Server::Options http = DefaultHttp();
    // When responses are gzipped (for callers that ask: Accept-Encoding, grpc-accept-encoding).
    http::CompressionOptions compression;
    // Fraction of calls logged (method, code, latency, items; never payloads).
    double log_sample_rate = 0;
    // HTTPS when set (mTLS when it has client CAs; see auth::TlsFiles). Not owned.
    auth::TlsFiles* tls = nullptr;
    // Identity, grants and audit; overload protection. Not owned; may be null.
    auth::Authorizer* authorizer = nullptr;
    ops::Admission* admission = nullptr;
    // Proxies whose X-Forwarded-For names the client that admission counts (empty: none), and
    // whose `forwarded_identity` header names the caller (null: no such header is read).
    auth::TrustedProxies trusted_proxies;
    const auth::ForwardedIdentity* forwarded_identity = nullptr;
    // Bearer tokens (`authorization: Bearer <JWT>`) name the caller when set. Not owned.
    auth::TokenVerifier* tokens = nullptr;
    // Which calls run to completion on the loop that read them instead of hopping to the
    // worker pool (ops/inline_rule.h: single operations and small batches, within a budget per
    // input); max_call zero: every call that misses the memo hops.
    ops::InlineRule::Options inline_work;
    // The port's name in metrics (`port` label), logs (`<port>_started`) and audit: "http"
    // counts connections and bodies too; another ("grpc") only its defences and memory.
    std::string port = "http";
  };

  // `metrics` may be null (nothing counted).
  Gateway(const api::MethodTable* table, ops::WorkerPool* pool, metrics::Metrics* metrics,
          Options options);
  ~Gateway() override;  // Stop(now)
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Listens and serves. Unavailable if the address cannot be bound. REQUIRES: called once.
  absl::Status Start();
  // The bound port, after Start.
  int port() const { return server_ != nullptr ? server_->port() : 0; }

  // /readyz answers 200 and health SERVING when true; 503 and NOT_SERVING when false (the
  // initial state). Health Watch streams are told of a change.
  void SetReady(bool ready);

  // /readyz 503 and new calls UNAVAILABLE at once; stops accepting, sends HTTP/2 GOAWAY,
  // closes idle connections; calls in flight finish. Idempotent.
  void Drain();
  // Drain(), then waits until every call in flight is answered (or `deadline`) and closes
  // every connection. Idempotent.
  void Stop(absl::Time deadline);

  // The HTTP server's counters (connections, timeouts).
  httpd::Server::Stats server_stats() const;

  // httpd::Handler: one request, on a loop thread.
  void Handle(std::shared_ptr<httpd::Exchange> exchange) override;
  // httpd::Handler: health Watch over gRPC is a stream; everything else is taken whole.
  bool Streaming(const httpd::Exchange& exchange) override;
  // httpd::Handler: a unary POST's body bound is its protocol's (http::UnaryBodyLimit), so a
  // body over it is refused unread and counted whatever its protocol; -1 (the engine's, what
  // any protocol carries) for anything else.
  int64_t BodyLimit(const httpd::Exchange& exchange) override;
  // Audited (a request refused before anyone read who sent it: a 1 MiB bearer token ends here).
  void HeaderTooLarge(absl::string_view peer_address) override;

  // The paths of the health service.
  static constexpr absl::string_view kHealthCheckPath = api::Health::kCheckPath;
  static constexpr absl::string_view kHealthWatchPath = api::Health::kWatchPath;
  // Server reflection's one method, in both versions.
  static constexpr absl::string_view kReflectionV1Path = api::Reflection::kV1Path;
  static constexpr absl::string_view kReflectionV1alphaPath = api::Reflection::kV1alphaPath;

  // What calls need after the gateway's own methods have returned: shared with every call in
  // flight, so that a call finishing on a worker never touches a destroyed gateway.
  struct Shared;

 private:
  absl::Status ConfigureTls(SSL_CTX* ctx);
  // The method at `path`: the table's, or health Check and Watch.
  const api::Method* FindMethod(absl::string_view path) const;

  const api::MethodTable* const table_;
  const Options options_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<httpd::Server> server_;
};

}  // namespace offload::gateway

#endif  // SERVICE_GATEWAY_GATEWAY_H_
