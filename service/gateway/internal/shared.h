// What a gateway's calls and streams share (Gateway::Shared), and the entry points of the
// gateway's two halves: unary calls (unary_call.cc: the engine's exchange as a call::Call) and
// streams (streams.cc: health Watch and server reflection). Internal to service/gateway.
#ifndef SERVICE_GATEWAY_INTERNAL_SHARED_H_
#define SERVICE_GATEWAY_INTERNAL_SHARED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "service/api/health.h"
#include "service/api/reflection.h"
#include "service/call/call.h"
#include "service/gateway/gateway.h"
#include "service/http/answer.h"
#include "service/http/protocol.h"
#include "service/http/rpc_codec.h"
#include "service/http/stream.h"
#include "service/httpd/server.h"

namespace offload::gateway {

struct Gateway::Shared {
  // What every call of the port shares (pool, guards, per-method metrics, audit).
  call::Context call;
  int64_t max_message_bytes = 0;
  http::CorsPolicy cors;
  http::CompressionOptions compression;

  // RPC bodies by encoding (index: http::Encoding) and compression decisions, read at scrape
  // time. Not counted without metrics, nor on a port other than "http".
  struct Bytes {
    std::atomic<uint64_t> received[2] = {};
    std::atomic<uint64_t> sent[2] = {};
    std::atomic<uint64_t> results[5] = {};  // by http::CompressionResult
    std::atomic<uint64_t> saved{0};
  };
  bool count_bytes = false;
  Bytes bytes;

  // The HTTP server, for its counters at scrape time; null once stopped.
  absl::Mutex server_mu;
  const httpd::Server* server ABSL_GUARDED_BY(server_mu) = nullptr;

  // Health (ready, draining; Check and Watch's unary form as methods) and server reflection
  // (v1, v1alpha) over the table's services and health.
  std::unique_ptr<api::Health> health;
  std::unique_ptr<api::Reflection> reflection;

  // Open health Watch streams, each with the status last sent on it, and other open streams
  // (reflection): a drain ends them all.
  struct Watch {
    std::shared_ptr<httpd::Exchange> exchange;
    http::StreamWire wire = http::StreamWire::kGrpc;
    std::string service;
    int sent = -1;
  };
  struct OpenStream {
    std::weak_ptr<httpd::Exchange> exchange;
    http::StreamWire wire = http::StreamWire::kGrpc;
  };
  absl::Mutex watch_mu;
  std::vector<std::shared_ptr<Watch>> watches ABSL_GUARDED_BY(watch_mu);
  std::vector<OpenStream> streams ABSL_GUARDED_BY(watch_mu);
  // Health Watch and reflection streams open at once, server-wide: each may hold up to
  // kMaxStreamUnsentBytes of answers its client has not read.
  static constexpr size_t kMaxOpenStreams = 256;
  static constexpr int64_t kMaxStreamUnsentBytes = 256 << 10;

  // Sends `watch` its service's status if it changed.
  void Push(Watch& watch);
  // Tells every Watch stream of a change; with `end`, ends them and every other open stream
  // (the server is draining).
  void PushAll(bool end);
  // Forgets streams that are over (answered, or their client gone: those are ended here, so
  // that a drain does not wait for them).
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu);
  // Starts the answer of one more stream (its headers), unless the server is draining or
  // kMaxOpenStreams are open (Prune first): then why not, and nothing is sent. The caller then
  // adds it to `watches` or `streams`, under the same lock, so that a drain either ends it or
  // refused it here.
  absl::Status StartStream(httpd::Exchange& exchange, http::StreamWire wire)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_mu);
  // A stream refused before it started, with CORS headers for a listed origin.
  httpd::Response Refusal(const httpd::Exchange& exchange, http::StreamWire wire,
                          const absl::Status& status) const;
};

// The port's engine and body metrics (connections, defences by reason, memory held, bytes by
// encoding, compression decisions), read from `shared` at scrape time.
void RegisterPortMetrics(metrics::Metrics* metrics, const std::shared_ptr<Gateway::Shared>& shared,
                         const std::string& port);

// A protocol's answer as the engine writes it.
httpd::Response ToResponse(http::Answer answer);

// Ends a started stream with `status`, in its wire's terms.
void EndStream(httpd::Exchange& exchange, http::StreamWire wire, const absl::Status& status);

// A unary call of `method` (the table's, or health Check and Watch) on `exchange`: a POST
// (Connect, gRPC-Web binary or text, gRPC), or a Connect GET of a side-effect-free method. On
// the loop thread; the call answers itself.
void StartPost(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
               const api::Method* method);
void StartGet(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange,
              const api::Method* method);

// A health Watch over HTTP/2 (gRPC, gRPC-Web or Connect streaming): the request read as it
// arrives, then the status now and each change. REQUIRES: http::StreamWireOf the request's
// content type has a value (Gateway::Streaming said so).
void WatchHealth(std::shared_ptr<Gateway::Shared> shared,
                 std::shared_ptr<httpd::Exchange> exchange);
// Server reflection (v1 or v1alpha) over HTTP/2: a bidirectional stream. REQUIRES: as
// WatchHealth.
void Reflect(std::shared_ptr<Gateway::Shared> shared, std::shared_ptr<httpd::Exchange> exchange);

}  // namespace offload::gateway

#endif  // SERVICE_GATEWAY_INTERNAL_SHARED_H_
