#include "service/metrics/metrics.h"

#include <atomic>
#include <string>

#include "gtest/gtest.h"

namespace offload::metrics {
namespace {

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(MetricsTest, RecordsRequestsItemsAndLatency) {
  Metrics m;
  MethodMetrics* verify = m.Method("offload.v1.Ed25519Service", "BatchVerify", true);
  verify->Record(absl::StatusCode::kOk, 0.0003, ItemCounts{60, 3, 1}, 64);
  verify->Record(absl::StatusCode::kInvalidArgument, 0.00001, ItemCounts{}, 2000);
  const std::string text = m.Scrape();
  EXPECT_TRUE(Contains(text, "offload_requests_total{code=\"OK\",method=\"BatchVerify\","
                             "service=\"offload.v1.Ed25519Service\"} 1"))
      << text;
  EXPECT_TRUE(Contains(text, "offload_requests_total{code=\"INVALID_ARGUMENT\","
                             "method=\"BatchVerify\",service=\"offload.v1.Ed25519Service\"} 1"));
  EXPECT_TRUE(Contains(text, "offload_items_total{method=\"BatchVerify\",result=\"ok\","
                             "service=\"offload.v1.Ed25519Service\"} 60"));
  EXPECT_TRUE(Contains(text, "offload_items_total{method=\"BatchVerify\",result=\"invalid\","
                             "service=\"offload.v1.Ed25519Service\"} 3"));
  EXPECT_TRUE(Contains(text, "offload_request_duration_seconds_count{method=\"BatchVerify\","
                             "service=\"offload.v1.Ed25519Service\"} 2"));
  EXPECT_TRUE(Contains(text, "offload_batch_items_bucket{method=\"BatchVerify\","
                             "service=\"offload.v1.Ed25519Service\",le=\"64\"} 1"));
  EXPECT_EQ(verify->name(), "offload.v1.Ed25519Service/BatchVerify");
}

TEST(MetricsTest, PulledValuesAreReadAtScrapeTime) {
  Metrics m;
  std::atomic<int> depth{3};
  m.AddPullGauge("offload_worker_queue_depth", "Tasks waiting", {}, [&] { return depth.load(); });
  m.AddPullCounter("offload_memo_hits_total", "Hits", {{"cache", "verify"}}, [] { return 5.0; });
  m.AddPullCounter("offload_memo_hits_total", "Hits", {{"cache", "open"}}, [] { return 7.0; });
  m.SetInfo("offload_build_info", "Build", {{"version", "1.2.3"}});
  std::string text = m.Scrape();
  EXPECT_TRUE(Contains(text, "offload_worker_queue_depth 3")) << text;
  EXPECT_TRUE(Contains(text, "# TYPE offload_memo_hits_total counter"));
  EXPECT_TRUE(Contains(text, "offload_memo_hits_total{cache=\"verify\"} 5"));
  EXPECT_TRUE(Contains(text, "offload_memo_hits_total{cache=\"open\"} 7"));
  EXPECT_TRUE(Contains(text, "offload_build_info{version=\"1.2.3\"} 1"));
  depth = 9;
  EXPECT_TRUE(Contains(m.Scrape(), "offload_worker_queue_depth 9"));
}

}  // namespace
}  // namespace offload::metrics
