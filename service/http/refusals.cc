#include "service/http/refusals.h"

#include <string>

#include "service/ops/retry_delay.h"

namespace offload::http {
namespace {

absl::Status ComeBackSoon(absl::Status status) {
  return ops::WithRetryDelay(std::move(status), ops::JitteredRetryDelay(ops::kDefaultRetryDelay));
}

}  // namespace

absl::Status DrainingRefusal() { return ComeBackSoon(absl::UnavailableError("server is draining")); }

absl::Status AuditUnwritableRefusal() {
  return ComeBackSoon(absl::UnavailableError(
      "audit log unwritable: calls that must be audited are refused (--audit_fail_closed)"));
}

absl::Status BusyRefusal(absl::string_view message) {
  return ComeBackSoon(absl::ResourceExhaustedError(message));
}

}  // namespace offload::http
