// grpc.health.v1.Health over a method table's services: the serving status of the whole server
// ("") and of each offload.v1 service, and its two methods as method-table entries (open to every
// caller, also while draining): Check, answered where it is read (no crypto, as a memo hit is),
// and Watch's unary form, UNIMPLEMENTED (Watch is a server stream: the transport serves it,
// reading WatchStatus and told of changes by whoever calls SetReady / SetDraining).
//
//   api::Health health(table);
//   health.SetReady(true);                        // SERVING
//   health.StatusOf("offload.v1.AeadService");   // SERVING; "nope": SERVICE_UNKNOWN
//   health.SetDraining();                         // NOT_SERVING from now on
//
// Thread-safety: every method from any thread; the table must outlive the health service.
#ifndef SERVICE_API_HEALTH_H_
#define SERVICE_API_HEALTH_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "grpc/health/v1/health.pb.h"
#include "service/api/method_table.h"

namespace offload::api {

class Health final {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
  static constexpr absl::string_view kService = "grpc.health.v1.Health";
  static constexpr absl::string_view kCheckPath = "/grpc.health.v1.Health/Check";
  static constexpr absl::string_view kWatchPath = "/grpc.health.v1.Health/Watch";

  explicit Health(const MethodTable& table);
  Health(const Health&) = delete;
  Health& operator=(const Health&) = delete;

  // Ready (the initial state is not) and not draining is SERVING.
  void SetReady(bool ready) { ready_.store(ready); }
  bool ready() const { return ready_.load(); }
  // NOT_SERVING from now on, whatever SetReady says later.
  void SetDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // The status of `service` now: SERVICE_UNKNOWN for a name the server does not serve.
  ServingStatus StatusOf(absl::string_view service) const;

  // The services reflection lists: the table's, then health itself.
  const std::vector<std::string>& services() const { return services_; }

  // Check and Watch as method-table entries; `Find` of their paths, else null.
  const Method* Find(absl::string_view path) const;
  const Method& check() const { return check_; }
  const Method& watch() const { return watch_; }

 private:
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  absl::flat_hash_set<std::string> known_;  // "" and the table's services
  std::vector<std::string> services_;
  Method check_;
  Method watch_;
};

}  // namespace offload::api

#endif  // SERVICE_API_HEALTH_H_
