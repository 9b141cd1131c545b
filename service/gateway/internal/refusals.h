// The statuses the front door refuses a call or a stream with when coming back later may succeed,
// each with the delay to wait (a RetryInfo payload, service/ops/retry_delay.h), which the
// protocol mappings send as grpc-status-details-bin, Connect error details and Retry-After
// (service/http/protocol.h). The admission's own refusals (ops::Admission) and the call's
// (an unwritable audit log: service/call) carry theirs already. Internal to service/gateway.
//
//   return exchange->Respond(Refusal(DrainingRefusal()));
//
// Thread-safe.
#ifndef SERVICE_GATEWAY_INTERNAL_REFUSALS_H_
#define SERVICE_GATEWAY_INTERNAL_REFUSALS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/httpd/server.h"

namespace offload::gateway {

// UNAVAILABLE "server is draining" (a stream ended or refused by a drain): come back in about
// a second, when the load balancer has taken this replica out.
absl::Status DrainingRefusal();

// The status of a request the engine refused before reading its body (`why` is not kNone):
// kBodyTooLarge RESOURCE_EXHAUSTED "request body: expected at most `max_body` bytes" (no retry
// delay: no wait cures it); kBusy and kAnswersUnread RESOURCE_EXHAUSTED, kDraining UNAVAILABLE,
// each to come back in about a second.
absl::Status EngineRefusal(httpd::Exchange::Refusal why, int64_t max_body);

// RESOURCE_EXHAUSTED with `message`, to come back in about a second (a per-server cap on open
// streams).
absl::Status BusyRefusal(absl::string_view message);

}  // namespace offload::gateway

#endif  // SERVICE_GATEWAY_INTERNAL_REFUSALS_H_
