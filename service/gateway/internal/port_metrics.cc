// The metrics of a port that its engine and its calls' bodies count, read at scrape time.
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "service/gateway/internal/shared.h"

namespace offload::gateway {

void RegisterPortMetrics(metrics::Metrics* metrics, const std::shared_ptr<Gateway::Shared>& shared,
                         const std::string& port) {
  // Both ports count their connections, defences and memory, by the port's name ("http",
  // "grpc"); only the HTTP port its bodies by encoding.
  const bool http_port = port == "http";
  // The port's engine counters, read at scrape time.
  std::weak_ptr<Gateway::Shared> weak = shared;
  const auto read = [weak](auto field) {
    return [weak, field] {
      std::shared_ptr<Gateway::Shared> s = weak.lock();
      if (s == nullptr) return 0.0;
      absl::MutexLock lock(&s->server_mu);
      return s->server == nullptr ? 0.0 : static_cast<double>(s->server->stats().*field);
    };
  };
  using Stats = httpd::Server::Stats;
  static constexpr char kConnectionsHelp[] =
      "Connections to the port: accepted (every one taken from the listener, the refused "
      "included), and of those refused at accept (--http_max_connections reached)";
  metrics->AddPullGauge("offload_http_connections", "Open connections on the port",
                        {{"port", port}}, read(&Stats::open));
  metrics->AddPullCounter("offload_http_connections_total", kConnectionsHelp,
                          {{"port", port}, {"result", "accepted"}}, read(&Stats::accepted));
  metrics->AddPullCounter("offload_http_connections_total", kConnectionsHelp,
                          {{"port", port}, {"result", "refused"}}, read(&Stats::refused));
  metrics->AddPullCounter("offload_http_read_timeouts_total",
                          "Connections cut for a request that did not arrive in time "
                          "(--http_read_timeout)",
                          {{"port", port}}, read(&Stats::read_timeouts));
  // The front door's defences, by reason (httpd::AbuseReason), and the memory its budgets hold.
  for (int i = 0; i < static_cast<int>(httpd::AbuseReason::kCount); ++i) {
    metrics->AddPullCounter(
        "offload_http_abuse_total",
        "Front-door defences that acted on the port, by reason: a connection closed "
        "(premature_resets, reset_rate, continuations, control_flood, settings, no_progress, "
        "too_many_pings, protocol_error, send_timeout), a request refused or cut short (header_too_large, "
        "body_too_large, stream_refused: request memory budget, answers_unread: answer budget, "
        "drain_body_late: a body still arriving at the drain's deadline for bodies) or a "
        "connection's body held back (read_paused: memory budget)",
        {{"port", port},
         {"reason", httpd::AbuseReasonName(static_cast<httpd::AbuseReason>(i))}},
        [weak, i] {
          std::shared_ptr<Gateway::Shared> s = weak.lock();
          if (s == nullptr) return 0.0;
          absl::MutexLock lock(&s->server_mu);
          return s->server == nullptr ? 0.0 : static_cast<double>(s->server->stats().abuse[i]);
        });
  }
  metrics->AddPullGauge("offload_http_buffered_bytes",
                        "Request body bytes held and answer bytes not yet sent on the port "
                        "(--http_memory_budget_bytes bounds it)",
                        {{"port", port}}, read(&Stats::buffered_bytes));
  if (!http_port) return;
  // RPC bodies by encoding, and what became of the responses callers asked to compress.
  const auto bytes = [weak](auto pick) {
    return [weak, pick] {
      std::shared_ptr<Gateway::Shared> s = weak.lock();
      return s == nullptr ? 0.0 : static_cast<double>(pick(s->bytes).load(std::memory_order_relaxed));
    };
  };
  for (const http::Encoding e : {http::Encoding::kIdentity, http::Encoding::kGzip}) {
    const int i = static_cast<int>(e);
    const std::string name(http::EncodingName(e));
    metrics->AddPullCounter(
        "offload_http_received_bytes_total",
        "Request bodies of Connect and gRPC-Web calls as received, by their declared encoding "
        "(Content-Encoding, grpc-encoding, a Connect GET's compression)",
        {{"encoding", name}}, bytes([i](Gateway::Shared::Bytes& b) -> auto& { return b.received[i]; }));
    metrics->AddPullCounter(
        "offload_http_sent_bytes_total",
        "Response bodies of Connect and gRPC-Web calls as sent, by encoding",
        {{"encoding", name}}, bytes([i](Gateway::Shared::Bytes& b) -> auto& { return b.sent[i]; }));
  }
  for (const http::CompressionResult r : {http::CompressionResult::kCompressed, http::CompressionResult::kTooSmall,
                                    http::CompressionResult::kIncompressible,
                                    http::CompressionResult::kNoGain}) {
    const int i = static_cast<int>(r);
    metrics->AddPullCounter(
        "offload_http_response_compression_total",
        "Responses whose caller accepts gzip, by what the gateway did: compressed, or sent as "
        "they were (too_small: under --http_compression_min_bytes; incompressible: a sample "
        "looked random; no_gain: gzip saved under 1/16)",
        {{"result", std::string(http::CompressionResultName(r))}},
        bytes([i](Gateway::Shared::Bytes& b) -> auto& { return b.results[i]; }));
  }
  metrics->AddPullCounter("offload_http_compression_saved_bytes_total",
                          "Bytes gzip took off the responses it compressed",
                          {}, bytes([](Gateway::Shared::Bytes& b) -> auto& { return b.saved; }));
}

}  // namespace offload::gateway
