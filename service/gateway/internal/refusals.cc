#include "service/gateway/internal/refusals.h"

#include <string>

#include "absl/strings/str_cat.h"

#include "service/ops/retry_delay.h"

namespace offload::gateway {
namespace {

absl::Status ComeBackSoon(absl::Status status) {
  return ops::WithRetryDelay(std::move(status), ops::JitteredRetryDelay(ops::kDefaultRetryDelay));
}

}  // namespace

absl::Status DrainingRefusal() { return ComeBackSoon(absl::UnavailableError("server is draining")); }

absl::Status EngineRefusal(httpd::Exchange::Refusal why, int64_t max_body) {
  using Refusal = httpd::Exchange::Refusal;
  switch (why) {
    case Refusal::kNone:
      break;
    case Refusal::kBodyTooLarge:
      return absl::ResourceExhaustedError(
          absl::StrCat("request body: expected at most ", max_body, " bytes, got more"));
    case Refusal::kBusy:
      return BusyRefusal(
          "server busy: the memory budget for request bodies is spent (this connection's, "
          "--http_connection_budget_bytes, or the port's, --http_memory_budget_bytes); retry later");
    case Refusal::kAnswersUnread:
      return BusyRefusal(
          "answers unread: this connection holds more answer bytes its client has not taken "
          "than --http_connection_answer_budget_bytes; read them, then retry");
    case Refusal::kDraining:
      return ComeBackSoon(absl::UnavailableError(
          "server is draining: the request body was still arriving at the drain's deadline for "
          "bodies; retry (the call was not run)"));
  }
  return absl::InternalError("engine refusal: none");
}

absl::Status BusyRefusal(absl::string_view message) {
  return ComeBackSoon(absl::ResourceExhaustedError(message));
}

}  // namespace offload::gateway
