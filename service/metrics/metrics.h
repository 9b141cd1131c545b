// Prometheus metrics of the service: families registered once at start, label sets created once,
// nothing but atomic updates on the request path; values that other components already count
// (memo caches, worker pool, crypto runs) are read when Prometheus scrapes.
//
//   Metrics metrics;
//   MethodMetrics* verify = metrics.Method("offload.v1.Ed25519Service", "BatchVerify", true);
//   verify->Record(absl::StatusCode::kOk, 0.0004, ItemCounts{64, 0, 0}, /*batch_size=*/64);
//   metrics.AddPullGauge("offload_worker_queue_depth", "Tasks waiting", {}, [&] { return q(); });
//   std::string text = metrics.Scrape();   // what GET /metrics answers (service/main)
//
// Names follow Prometheus conventions: `offload_` prefix, `_total` counters, `_seconds`
// histograms, `_bytes` gauges. Labels are low-cardinality (service, method, code, cache, ...):
// never a key id, never key material. Thread-safety: Method/AddPull*/SetInfo at start-up
// only; Record and Scrape from any thread.
#ifndef SERVICE_METRICS_METRICS_H_
#define SERVICE_METRICS_METRICS_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace offload::metrics {

// How the items of one call ended: ok; invalid (a signature that does not verify, a ciphertext
// that does not authenticate, or a malformed item: the caller's input); error (anything else,
// e.g. unknown key, wrong key type, internal failure).
struct ItemCounts {
  int ok = 0;
  int invalid = 0;
  int error = 0;
};

class MethodMetrics {
 public:
  // `seconds` is the server-side latency from receipt to finish; `batch_size` 0 for unary calls.
  void Record(absl::StatusCode code, double seconds, const ItemCounts& items, int batch_size);
  // "Service/Method", for logs.
  const std::string& name() const { return name_; }

 private:
  friend class Metrics;
  std::string name_;
  std::array<prometheus::Counter*, 17> requests_{};  // by gRPC code
  prometheus::Histogram* latency_ = nullptr;
  prometheus::Histogram* batch_size_ = nullptr;      // batch methods only
  std::array<prometheus::Counter*, 3> items_{};      // ok, invalid, error
};

class Metrics final {
 public:
  Metrics();
  ~Metrics();

  // The handle of one RPC method. Start-up only; the handle lives as long as this object.
  MethodMetrics* Method(absl::string_view service, absl::string_view method, bool batch);

  using Labels = std::map<std::string, std::string>;
  // Values read at scrape time. Calls with the same `name` add label sets to one family.
  void AddPullCounter(const std::string& name, const std::string& help, Labels labels,
                      std::function<double()> read);
  void AddPullGauge(const std::string& name, const std::string& help, Labels labels,
                    std::function<double()> read);

  // A gauge fixed at start-up, e.g. offload_build_info{version=...} 1.
  void SetInfo(const std::string& name, const std::string& help, Labels labels);

  // The text exposition of everything, as Prometheus would scrape it (served at GET /metrics
  // by service/main/metrics_endpoint.h: this folder knows no transport).
  std::string Scrape() const;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  class PullCollectable;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<PullCollectable> pull_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Counter>& items_;
  std::vector<std::unique_ptr<MethodMetrics>> methods_;
};

// Latency buckets from 10 us to 10 s.
const std::vector<double>& LatencyBuckets();

}  // namespace offload::metrics

#endif  // SERVICE_METRICS_METRICS_H_
