#include "service/api/health.h"

#include "gtest/gtest.h"

namespace offload::api {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Check as the transports run it: `from_memo` answers at once.
absl::Status Check(const Health& health, const std::string& service,
                   HealthCheckResponse* response) {
  HealthCheckRequest request;
  request.set_service(service);
  Method::Probe probe;
  absl::Status status;
  EXPECT_TRUE(health.check().from_memo(request, response, &probe, &status));
  return status;
}

TEST(Health, ServingOnceReadyUntilTheDrain) {
  const MethodTable table(nullptr, nullptr);
  Health health(table);
  HealthCheckResponse r;
  ASSERT_TRUE(Check(health, "", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  health.SetReady(true);
  ASSERT_TRUE(Check(health, "offload.v1.AeadService", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  health.SetDraining();
  health.SetReady(true);
  ASSERT_TRUE(Check(health, "", &r).ok());
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(health, "offload.v1.Nope", &r).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(health.StatusOf("grpc.health.v1.Health"), HealthCheckResponse::SERVICE_UNKNOWN);
}

TEST(Health, MethodsAreOpenAndWatchIsAStreamOnly) {
  const MethodTable table(nullptr, nullptr);
  const Health health(table);
  EXPECT_EQ(health.Find("/grpc.health.v1.Health/Check"), &health.check());
  EXPECT_EQ(health.Find("/grpc.health.v1.Health/Watch"), &health.watch());
  EXPECT_EQ(health.Find("/grpc.health.v1.Health/Nope"), nullptr);
  EXPECT_TRUE(health.check().open);
  EXPECT_TRUE(health.check().no_side_effects);
  EXPECT_FALSE(health.watch().no_side_effects);
  HealthCheckRequest request;
  HealthCheckResponse response;
  Method::Probe probe;
  absl::Status status;
  EXPECT_TRUE(health.watch().from_memo(request, &response, &probe, &status));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  // Reflection lists the table's services, then health.
  ASSERT_EQ(health.services().size(), 6u);
  EXPECT_EQ(health.services().front(), "offload.v1.KeyService");
  EXPECT_EQ(health.services().back(), "grpc.health.v1.Health");
}

}  // namespace
}  // namespace offload::api
