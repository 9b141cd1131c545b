// When a refused caller should come back: a google.rpc.RetryInfo carried as a payload of the
// absl::Status that refuses it, so that whoever made the refusal (admission, the engine's memory
// budgets, a drain) says it, and the protocol mappings (service/http) send it in their terms:
// gRPC's grpc-status-details-bin (a google.rpc.Status), Connect's error details, HTTP
// Retry-After.
//
//   absl::Status s = WithRetryDelay(absl::ResourceExhaustedError("server overloaded"),
//                                   JitteredRetryDelay(absl::Milliseconds(800)));
//   std::optional<absl::Duration> d = RetryDelayOf(s);   // 600..1000 ms, whole milliseconds
//
// The rule (README.md, "Security and overload"): a base delay - the admission queue's expected
// drain time for overload refusals, 1 s for the memory budgets, a drain and an unwritable audit
// log - times a random factor in [0.75, 1.25], then bounded to [kMinRetryDelay, kMaxRetryDelay]
// and rounded to whole milliseconds. The jitter keeps callers refused together from coming back
// together. Thread-safe.
#ifndef SERVICE_OPS_RETRY_DELAY_H_
#define SERVICE_OPS_RETRY_DELAY_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace offload::ops {

// The payload's type URL: an Any's, as google.rpc.Status details carry it.
inline constexpr absl::string_view kRetryInfoTypeUrl = "type.googleapis.com/google.rpc.RetryInfo";

inline constexpr absl::Duration kMinRetryDelay = absl::Milliseconds(100);
inline constexpr absl::Duration kMaxRetryDelay = absl::Seconds(10);
// The base of refusals whose end cannot be foreseen (memory budgets, drain, audit log).
inline constexpr absl::Duration kDefaultRetryDelay = absl::Seconds(1);

// `base` jittered and bounded by the rule above.
absl::Duration JitteredRetryDelay(absl::Duration base);

// `status` with a RetryInfo payload of `delay` (replacing any). An OK status is returned as it is.
absl::Status WithRetryDelay(absl::Status status, absl::Duration delay);

// The RetryInfo delay `status` carries, or nullopt (none, or a payload that does not parse).
std::optional<absl::Duration> RetryDelayOf(const absl::Status& status);

}  // namespace offload::ops

#endif  // SERVICE_OPS_RETRY_DELAY_H_
