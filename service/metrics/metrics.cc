#include "service/metrics/metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace offload::metrics {
namespace {

const char* CodeName(int code) {
  static const char* const kNames[17] = {
      "OK",        "CANCELLED",          "UNKNOWN",          "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",      "DATA_LOSS",
      "UNAUTHENTICATED"};
  return kNames[code];
}

std::vector<double> BatchBuckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}; }

}  // namespace

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};
  return kBuckets;
}

void MethodMetrics::Record(absl::StatusCode code, double seconds, const ItemCounts& items,
                           int batch_size) {
  const int c = static_cast<int>(code);
  requests_[(c >= 0 && c < 17) ? c : 2]->Increment();
  latency_->Observe(seconds);
  if (batch_size_ != nullptr && batch_size > 0) batch_size_->Observe(batch_size);
  if (items.ok > 0) items_[0]->Increment(items.ok);
  if (items.invalid > 0) items_[1]->Increment(items.invalid);
  if (items.error > 0) items_[2]->Increment(items.error);
}

// Families whose values are read from callbacks at scrape time.
class Metrics::PullCollectable final : public prometheus::Collectable {
 public:
  void Add(const std::string& name, const std::string& help, prometheus::MetricType type,
           Labels labels, std::function<double()> read) {
    absl::MutexLock lock(&mu_);
    for (Family& f : families_) {
      if (f.name == name) {
        f.series.push_back({std::move(labels), std::move(read)});
        return;
      }
    }
    families_.push_back(Family{name, help, type, {{std::move(labels), std::move(read)}}});
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> out;
    for (const Family& f : families_) {
      prometheus::MetricFamily family;
      family.name = f.name;
      family.help = f.help;
      family.type = f.type;
      for (const Series& s : f.series) {
        prometheus::ClientMetric metric;
        for (const auto& [k, v] : s.labels) metric.label.push_back({k, v});
        const double value = s.read();
        if (f.type == prometheus::MetricType::Counter) {
          metric.counter.value = value;
        } else {
          metric.gauge.value = value;
        }
        family.metric.push_back(std::move(metric));
      }
      out.push_back(std::move(family));
    }
    return out;
  }

 private:
  struct Series {
    Labels labels;
    std::function<double()> read;
  };
  struct Family {
    std::string name;
    std::string help;
    prometheus::MetricType type;
    std::vector<Series> series;
  };
  mutable absl::Mutex mu_;
  std::vector<Family> families_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      pull_(std::make_shared<PullCollectable>()),
      requests_(prometheus::BuildCounter()
                    .Name("offload_requests_total")
                    .Help("RPCs finished, by service, method and gRPC status code")
                    .Register(*registry_)),
      latency_(prometheus::BuildHistogram()
                   .Name("offload_request_duration_seconds")
                   .Help("Server-side latency of RPCs, from receipt to finish, by method")
                   .Register(*registry_)),
      batch_size_(prometheus::BuildHistogram()
                      .Name("offload_batch_items")
                      .Help("Items per batch RPC, by method")
                      .Register(*registry_)),
      items_(prometheus::BuildCounter()
                 .Name("offload_items_total")
                 .Help("Items processed (1 per unary call), by method and result: ok, invalid "
                       "(signature or ciphertext rejected, malformed input), error (other)")
                 .Register(*registry_)) {}

Metrics::~Metrics() = default;

MethodMetrics* Metrics::Method(absl::string_view service, absl::string_view method, bool batch) {
  auto m = std::make_unique<MethodMetrics>();
  const std::string s(service), me(method);
  m->name_ = absl::StrCat(service, "/", method);
  for (int code = 0; code < 17; ++code) {
    m->requests_[code] =
        &requests_.Add({{"service", s}, {"method", me}, {"code", CodeName(code)}});
  }
  m->latency_ = &latency_.Add({{"service", s}, {"method", me}}, LatencyBuckets());
  if (batch) m->batch_size_ = &batch_size_.Add({{"service", s}, {"method", me}}, BatchBuckets());
  const char* results[3] = {"ok", "invalid", "error"};
  for (int i = 0; i < 3; ++i) {
    m->items_[i] = &items_.Add({{"service", s}, {"method", me}, {"result", results[i]}});
  }
  methods_.push_back(std::move(m));
  return methods_.back().get();
}

void Metrics::AddPullCounter(const std::string& name, const std::string& help, Labels labels,
                             std::function<double()> read) {
  pull_->Add(name, help, prometheus::MetricType::Counter, std::move(labels), std::move(read));
}

void Metrics::AddPullGauge(const std::string& name, const std::string& help, Labels labels,
                           std::function<double()> read) {
  pull_->Add(name, help, prometheus::MetricType::Gauge, std::move(labels), std::move(read));
}

void Metrics::SetInfo(const std::string& name, const std::string& help, Labels labels) {
  AddPullGauge(name, help, std::move(labels), [] { return 1.0; });
}

std::string Metrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& f : pull_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace offload::metrics
