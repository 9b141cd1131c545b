#include "client/cpp/retry_info.h"

#include <algorithm>
#include <cstdint>

#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace offload::client {

std::optional<absl::Duration> RetryDelayFromDetails(absl::string_view details) {
  if (details.empty()) return std::nullopt;
  google::rpc::Status status;
  if (!status.ParseFromArray(details.data(), static_cast<int>(details.size()))) {
    return std::nullopt;
  }
  for (const google::protobuf::Any& any : status.details()) {
    if (!any.Is<google::rpc::RetryInfo>()) continue;
    google::rpc::RetryInfo info;
    if (!any.UnpackTo(&info) || !info.has_retry_delay()) return std::nullopt;
    const int64_t seconds = info.retry_delay().seconds();
    const int32_t nanos = info.retry_delay().nanos();
    // google.protobuf.Duration: nanos in (-1e9, 1e9) with the sign of seconds; a delay is >= 0.
    if (seconds < 0 || nanos < 0 || nanos >= 1000000000) return std::nullopt;
    return absl::Seconds(seconds) + absl::Nanoseconds(nanos);
  }
  return std::nullopt;
}

std::optional<absl::Duration> RetryDelay(const grpc::Status& status) {
  if (status.ok()) return std::nullopt;
  return RetryDelayFromDetails(status.error_details());
}

absl::Duration RetryPause(absl::Duration delay, absl::Duration initial_backoff, double u) {
  u = std::clamp(u, 0.0, 1.0);
  return delay + u * (std::max(delay, initial_backoff) / 5);
}

}  // namespace offload::client
