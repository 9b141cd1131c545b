// GET /metrics over a real loopback socket (tests/testing/http_client.h).
#include "service/main/metrics_endpoint.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/http_client.h"

namespace offload {
namespace {

using ::testing::HasSubstr;

TEST(MetricsEndpointTest, RefusesABadAddress) {
  metrics::Metrics m;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(&m, "not an address");
  ASSERT_FALSE(endpoint.ok());
  EXPECT_THAT(endpoint.status().message(), HasSubstr("metrics_address: "));
}

TEST(MetricsEndpointTest, ServesTheExpositionAtMetricsOnly) {
  metrics::Metrics m;
  double depth = 3;
  m.AddPullGauge("offload_worker_queue_depth", "Tasks waiting", {}, [&] { return depth; });
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start(&m, "127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  ASSERT_GT(port, 0);

  testhttp::Response r = testhttp::Request(port, "GET /metrics HTTP/1.1");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(r.body, HasSubstr("offload_worker_queue_depth 3"));
  depth = 9;  // rendered at each scrape
  EXPECT_THAT(testhttp::Request(port, "GET /metrics HTTP/1.1").body,
              HasSubstr("offload_worker_queue_depth 9"));

  EXPECT_EQ(testhttp::Request(port, "GET /other HTTP/1.1").status, 404);
  r = testhttp::Request(port, "POST /metrics HTTP/1.1", "x");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.header("allow"), "GET, HEAD");

  (*endpoint)->Stop();
  (*endpoint)->Stop();  // idempotent
  EXPECT_EQ(testhttp::Request(port, "GET /metrics HTTP/1.1").status, 0);
}

}  // namespace
}  // namespace offload
