// GET /metrics: Prometheus's text exposition of a metrics::Metrics, served on an engine of its
// own (service/httpd, one event-loop thread) so that a scrape never waits behind the call ports.
// metrics/ renders the text (Metrics::Scrape) and knows no transport; this is the wiring.
//
//   metrics::Metrics metrics;
//   OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> endpoint,
//                            MetricsEndpoint::Start(&metrics, "127.0.0.1:9464"));
//   ...
//   endpoint->Stop();   // also done by the destructor
//
// GET and HEAD of /metrics answer 200 with the exposition; any other path 404, any other method
// 405. Thread-safety: Start and Stop from one thread; `metrics` must outlive the endpoint.
#ifndef SERVICE_MAIN_METRICS_ENDPOINT_H_
#define SERVICE_MAIN_METRICS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "service/httpd/server.h"
#include "service/metrics/metrics.h"

namespace offload {

class MetricsEndpoint final : public httpd::Handler {
 public:
  // Listens on `address` (host:port; port 0 picks a free one). Unavailable or InvalidArgument,
  // prefixed "metrics_address: ", when it cannot.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const metrics::Metrics* metrics,
                                                                const std::string& address);
  ~MetricsEndpoint() override;  // Stop()
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound port.
  int port() const { return server_->port(); }
  // Answers the scrapes in flight (for up to 2 s), then closes every connection. Idempotent.
  void Stop();

  // httpd::Handler: one request, on the endpoint's loop thread.
  void Handle(std::shared_ptr<httpd::Exchange> exchange) override;

 private:
  MetricsEndpoint(const metrics::Metrics* metrics, const std::string& address);

  const metrics::Metrics* const metrics_;
  std::unique_ptr<httpd::Server> server_;
};

}  // namespace offload

#endif  // SERVICE_MAIN_METRICS_ENDPOINT_H_
