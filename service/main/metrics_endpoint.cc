#include "service/main/metrics_endpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace offload {

MetricsEndpoint::MetricsEndpoint(const metrics::Metrics* metrics, const std::string& address)
    : metrics_(metrics) {
  httpd::Server::Options options;
  options.address = address;
  options.threads = 1;
  options.max_connections = 256;
  options.max_body_bytes = 4096;
  server_ = std::make_unique<httpd::Server>(std::move(options), this);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const metrics::Metrics* metrics, const std::string& address) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint(metrics, address));
  if (absl::Status s = endpoint->server_->Start(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("metrics_address: ", s.message()));
  }
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

void MetricsEndpoint::Stop() { server_->Stop(absl::Now() + absl::Seconds(2)); }

void MetricsEndpoint::Handle(std::shared_ptr<httpd::Exchange> exchange) {
  using Headers = httpd::Response::Headers;
  if (exchange->path() != "/metrics") {
    return exchange->Respond(httpd::Response(
        404, Headers{{"content-type", "text/plain; charset=utf-8"}}, "not found: see /metrics\n"));
  }
  if (exchange->method() != "GET" && exchange->method() != "HEAD") {
    return exchange->Respond(httpd::Response(
        405, Headers{{"allow", "GET, HEAD"}, {"content-type", "text/plain; charset=utf-8"}},
        "method not allowed\n"));
  }
  exchange->Respond(httpd::Response(
      200, Headers{{"content-type", "text/plain; version=0.0.4; charset=utf-8"}},
      metrics_->Scrape()));
}

}  // namespace offload
