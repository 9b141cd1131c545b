// The HTTP face of the service: every unary RPC of offload.v1 over the Connect protocol
// (application/proto and application/json) and gRPC-Web (binary), plus GET /healthz and
// GET /readyz, on a civetweb server. Requests are decoded on civetweb's threads; the calls run on
// the worker pool (never on an HTTP thread), with the same operations, limits and metrics as the
// gRPC path.
//
//   MethodTable table(&operations, &key_manager);
//   Gateway::Options options;
//   options.address = "127.0.0.1:8080";
//   Gateway gateway(&table, &pool, &metrics, options);
//   OFFLOAD_RETURN_IF_ERROR(gateway.Start());
//   gateway.SetReady(true);            // /readyz 200
//   ...
//   gateway.Drain();                   // /readyz 503, new RPCs UNAVAILABLE, stopping in background
//   ...                                // e.g. drain the gRPC server meanwhile
//   gateway.Stop();                    // waits until the requests in flight are answered
//
// Thread-safety: Start, Drain and Stop from one thread; SetReady from any. The table, pool and metrics
// must outlive the gateway (or its Stop).
#ifndef SERVICE_HTTP_GATEWAY_H_
#define SERVICE_HTTP_GATEWAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "service/auth/authorizer.h"
#include "service/auth/tls.h"
#include "service/http/method_table.h"
#include "service/metrics/metrics.h"
#include "service/ops/admission.h"
#include "service/ops/worker_pool.h"

struct mg_context;
struct mg_connection;

namespace offload::http {

class Gateway final {
 public:
  struct Options {
    // host:port (port 0 picks a free one; see port()). IPv6 as [::1]:8080.
    std::string address = "127.0.0.1:8080";
    // Largest request body or response message (as the gRPC server's limit).
    int64_t max_message_bytes = 16 << 20;
    // Access-Control-Allow-Origin for browsers: empty sends no CORS headers; "*" any origin;
    // otherwise only requests whose Origin equals it.
    std::string cors_origin;
    // civetweb threads (each holds one request while its call runs); 0 = max(16, 4 * cores).
    int threads = 0;
    // Fraction of calls logged (method, code, latency, items; never payloads).
    double log_sample_rate = 0;
    // HTTPS when set (mTLS when it has client CAs; see auth::TlsFiles). Not owned.
    auth::TlsFiles* tls = nullptr;
    // Identity, grants and audit; overload protection. Not owned; may be null.
    auth::Authorizer* authorizer = nullptr;
    ops::Admission* admission = nullptr;
  };

  // `metrics` may be null (nothing counted).
  Gateway(const MethodTable* table, ops::WorkerPool* pool, metrics::Metrics* metrics,
          Options options);
  ~Gateway();  // Stop()
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Listens and serves. Unavailable if the address cannot be bound. REQUIRES: called once.
  absl::Status Start();
  // The bound port, after Start.
  int port() const { return port_; }

  // /readyz answers 200 when true, 503 when false (the initial state).
  void SetReady(bool ready) { ready_.store(ready); }

  // /readyz 503 and new calls UNAVAILABLE at once; stops listening in the background (civetweb
  // takes up to 2 s to notice) while the requests being served finish. Idempotent.
  void Drain();
  // Drain(), then waits until civetweb has stopped (every request answered). Idempotent.
  void Stop();

 private:
  class Call;
  static int HandleRequest(mg_connection* conn, void* self);
  void ConfigureTls(SSL_CTX* ctx);
  auth::Peer PeerOf(mg_connection* conn) const;
  int Handle(mg_connection* conn);
  void SendCors(mg_connection* conn) const;

  const MethodTable* const table_;
  ops::WorkerPool* const pool_;
  const Options options_;
  // Metrics handles by path (same series as the gRPC path's); empty without metrics.
  absl::flat_hash_map<std::string, metrics::MethodMetrics*> method_metrics_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  mg_context* context_ = nullptr;
  std::thread stopper_;  // runs mg_stop(context_) after Drain()
  int port_ = 0;
};

}  // namespace offload::http

#endif  // SERVICE_HTTP_GATEWAY_H_
