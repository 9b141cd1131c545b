#include "service/api/health.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace offload::api {
namespace {

using google::protobuf::Message;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// A health method: open, no side effects, answered by `from_memo` wherever it is read (`call`
// is the same answer, for a transport that runs every call on the pool).
void InitMethod(Method* m, absl::string_view name) {
  m->service = std::string(Health::kService);
  m->method = std::string(name);
  m->path = absl::StrCat("/", m->service, "/", name);
  m->no_side_effects = true;
  m->open = true;
  m->request_prototype = &HealthCheckRequest::default_instance();
  m->response_prototype = &HealthCheckResponse::default_instance();
  m->call = [m](const Message& request, Message* response, ops::Operations::Done done,
                ops::Operations::Alive) {
    Method::Probe probe;
    absl::Status status;
    m->from_memo(request, response, &probe, &status);
    std::move(done)(std::move(status));
  };
}

}  // namespace

Health::Health(const MethodTable& table) {
  known_.insert("");
  for (const Method& m : table.methods()) {
    if (known_.insert(m.service).second) services_.push_back(m.service);
  }
  services_.push_back(std::string(kService));

  InitMethod(&check_, "Check");
  check_.from_memo = [this](const Message& request, Message* response, Method::Probe*,
                            absl::Status* status) {
    const std::string& service = static_cast<const HealthCheckRequest&>(request).service();
    const ServingStatus s = StatusOf(service);
    if (s == HealthCheckResponse::SERVICE_UNKNOWN) {
      *status = absl::NotFoundError(absl::StrCat("health: unknown service \"",
                                                 absl::CHexEscape(service.substr(0, 128)), "\""));
      return true;
    }
    static_cast<HealthCheckResponse*>(response)->set_status(s);
    *status = absl::OkStatus();
    return true;
  };
  InitMethod(&watch_, "Watch");
  watch_.no_side_effects = false;
  watch_.from_memo = [](const Message&, Message*, Method::Probe*, absl::Status* status) {
    *status = absl::UnimplementedError(
        "grpc.health.v1.Health/Watch is a server stream: a POST over HTTP/2 of application/grpc, "
        "application/grpc-web+proto or application/connect+proto (Check answers on every "
        "protocol)");
    return true;
  };
}

Health::ServingStatus Health::StatusOf(absl::string_view service) const {
  if (!known_.contains(service)) return HealthCheckResponse::SERVICE_UNKNOWN;
  return ready_.load() && !draining_.load() ? HealthCheckResponse::SERVING
                                            : HealthCheckResponse::NOT_SERVING;
}

const Method* Health::Find(absl::string_view path) const {
  if (path == kCheckPath) return &check_;
  if (path == kWatchPath) return &watch_;
  return nullptr;
}

}  // namespace offload::api
