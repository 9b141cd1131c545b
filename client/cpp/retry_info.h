// When the server says to come back: the google.rpc.RetryInfo a refusal may carry.
//
//   std::optional<absl::Duration> delay = RetryDelay(grpc_status);
//   if (delay) absl::SleepFor(RetryPause(*delay, options.initial_backoff, uniform_0_1));
//
// The server sends a serialized google.rpc.Status in the `grpc-status-details-bin` trailer
// (grpc::Status::error_details()) whose details hold a google.rpc.RetryInfo (type URL
// "type.googleapis.com/google.rpc.RetryInfo") when it knows how long a refusal will last:
// RESOURCE_EXHAUSTED under overload, UNAVAILABLE while it drains. The client retries such a
// refusal after at least that delay (client.h, "Retries").
//
// Pure functions; thread-safe. Network input: anything that does not parse, or a negative or
// malformed delay, reads as no delay.
#ifndef CLIENT_CPP_RETRY_INFO_H_
#define CLIENT_CPP_RETRY_INFO_H_

#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace offload::client {

// The retry delay in `details`, the bytes of a serialized google.rpc.Status; nullopt when there
// is none (empty, unparsable, no RetryInfo, or a delay that is negative or not a valid
// google.protobuf.Duration). The first RetryInfo counts.
std::optional<absl::Duration> RetryDelayFromDetails(absl::string_view details);

// The retry delay of a failed RPC's status (its error_details()).
std::optional<absl::Duration> RetryDelay(const grpc::Status& status);

// How long to wait before retrying after the server asked for `delay`: `delay` plus a random
// share (`u` in [0, 1)) of a fifth of max(`delay`, `initial_backoff`), so that callers refused
// together do not all come back at the same instant. Never less than `delay`.
absl::Duration RetryPause(absl::Duration delay, absl::Duration initial_backoff, double u);

}  // namespace offload::client

#endif  // CLIENT_CPP_RETRY_INFO_H_
