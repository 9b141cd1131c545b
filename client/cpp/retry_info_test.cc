// Decoding of the server's retry delay (retry_info.h): a google.rpc.Status with a RetryInfo
// detail, as the grpc-status-details-bin trailer carries it, and what does not count as one.
#include "client/cpp/retry_info.h"

#include <string>

#include "gtest/gtest.h"
#include "google/protobuf/duration.pb.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace offload::client {
namespace {

// The bytes of a google.rpc.Status with `code` and a RetryInfo of (`seconds`, `nanos`).
std::string DetailsWithDelay(int64_t seconds, int32_t nanos, int code = 8) {
  google::rpc::Status status;
  status.set_code(code);
  status.set_message("overloaded: queue full");
  google::rpc::RetryInfo info;
  info.mutable_retry_delay()->set_seconds(seconds);
  info.mutable_retry_delay()->set_nanos(nanos);
  status.add_details()->PackFrom(info);
  return status.SerializeAsString();
}

TEST(RetryInfoTest, DecodesTheDelay) {
  EXPECT_EQ(RetryDelayFromDetails(DetailsWithDelay(1, 500000000)), absl::Milliseconds(1500));
  EXPECT_EQ(RetryDelayFromDetails(DetailsWithDelay(0, 0)), absl::ZeroDuration());
  const grpc::Status refused(grpc::StatusCode::RESOURCE_EXHAUSTED, "overloaded",
                             DetailsWithDelay(0, 250000000));
  EXPECT_EQ(RetryDelay(refused), absl::Milliseconds(250));
}

TEST(RetryInfoTest, FindsTheRetryInfoAmongOtherDetails) {
  google::rpc::Status status;
  status.set_code(14);
  google::protobuf::Duration unrelated;  // a detail of another type comes first
  unrelated.set_seconds(99);
  status.add_details()->PackFrom(unrelated);
  google::rpc::RetryInfo info;
  info.mutable_retry_delay()->set_seconds(2);
  status.add_details()->PackFrom(info);
  EXPECT_EQ(RetryDelayFromDetails(status.SerializeAsString()), absl::Seconds(2));
}

TEST(RetryInfoTest, NoDelayWithoutAValidRetryInfo) {
  EXPECT_EQ(RetryDelayFromDetails(""), std::nullopt);
  EXPECT_EQ(RetryDelayFromDetails("\xff\xff\xff garbage"), std::nullopt);
  google::rpc::Status bare;
  bare.set_code(8);
  bare.set_message("overloaded");
  EXPECT_EQ(RetryDelayFromDetails(bare.SerializeAsString()), std::nullopt);
  EXPECT_EQ(RetryDelayFromDetails(DetailsWithDelay(-1, 0)), std::nullopt);
  EXPECT_EQ(RetryDelayFromDetails(DetailsWithDelay(0, -5)), std::nullopt);
  EXPECT_EQ(RetryDelayFromDetails(DetailsWithDelay(0, 1000000000)), std::nullopt);
  google::rpc::Status empty_info;
  empty_info.add_details()->PackFrom(google::rpc::RetryInfo());  // no retry_delay in it
  EXPECT_EQ(RetryDelayFromDetails(empty_info.SerializeAsString()), std::nullopt);
  EXPECT_EQ(RetryDelay(grpc::Status::OK), std::nullopt);
  EXPECT_EQ(RetryDelay(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no details")),
            std::nullopt);
}

TEST(RetryInfoTest, ThePauseIsAtLeastTheDelayWithBoundedJitter) {
  const absl::Duration backoff = absl::Milliseconds(25);
  EXPECT_EQ(RetryPause(absl::Seconds(1), backoff, 0.0), absl::Seconds(1));
  EXPECT_EQ(RetryPause(absl::Seconds(1), backoff, 1.0), absl::Milliseconds(1200));
  EXPECT_EQ(RetryPause(absl::Seconds(1), backoff, 0.5), absl::Milliseconds(1100));
  // A zero delay still spreads retries over a fifth of the initial backoff.
  EXPECT_EQ(RetryPause(absl::ZeroDuration(), backoff, 1.0), absl::Milliseconds(5));
  EXPECT_EQ(RetryPause(absl::Seconds(1), backoff, -3.0), absl::Seconds(1));  // u is clamped
}

}  // namespace
}  // namespace offload::client
