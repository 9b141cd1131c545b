#include "service/ops/retry_delay.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "google/rpc/error_details.pb.h"

namespace offload::ops {

absl::Duration JitteredRetryDelay(absl::Duration base) {
  thread_local absl::InsecureBitGen bitgen;
  const double factor = absl::Uniform(bitgen, 0.75, 1.25);
  absl::Duration d = std::clamp(base * factor, kMinRetryDelay, kMaxRetryDelay);
  return absl::Milliseconds(absl::ToInt64Milliseconds(d));
}

absl::Status WithRetryDelay(absl::Status status, absl::Duration delay) {
  if (status.ok()) return status;
  google::rpc::RetryInfo info;
  const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(delay));
  info.mutable_retry_delay()->set_seconds(ms / 1000);
  info.mutable_retry_delay()->set_nanos(static_cast<int32_t>((ms % 1000) * 1000000));
  status.SetPayload(kRetryInfoTypeUrl, absl::Cord(info.SerializeAsString()));
  return status;
}

std::optional<absl::Duration> RetryDelayOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kRetryInfoTypeUrl);  // absl::optional<absl::Cord>
  if (!payload.has_value()) return std::nullopt;
  google::rpc::RetryInfo info;
  if (!info.ParseFromString(std::string(*payload))) return std::nullopt;
  return absl::Seconds(info.retry_delay().seconds()) +
         absl::Nanoseconds(info.retry_delay().nanos());
}

}  // namespace offload::ops
