#include "service/ops/admission.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "service/ops/retry_delay.h"

namespace offload::ops {
namespace {

TEST(AdmissionTest, RefusesItemsOverTheQueueBoundAndTakesThemBackOnRelease) {
  Admission admission({/*max_queued_items=*/100, /*max_client_inflight=*/0});
  absl::StatusOr<Admission::Ticket> a = admission.Admit("c", 64);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Admission::Ticket> b = admission.Admit("c", 36);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(admission.queued_items(), 100);
  absl::StatusOr<Admission::Ticket> c = admission.Admit("c", 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(admission.counts().queue_full, 1u);
  a->Release();
  a->Release();  // idempotent
  EXPECT_EQ(admission.queued_items(), 36);
  EXPECT_TRUE(admission.Admit("c", 64).ok());  // the temporary's ticket returns at once
  EXPECT_EQ(admission.queued_items(), 36);
}

TEST(AdmissionTest, AdmitsACallLargerThanTheBoundOnlyWhenIdle) {
  Admission admission({/*max_queued_items=*/10, /*max_client_inflight=*/0});
  absl::StatusOr<Admission::Ticket> big = admission.Admit("c", 50);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(admission.Admit("c", 1).ok());
  big->Release();
  EXPECT_TRUE(admission.Admit("c", 1).ok());
}

TEST(AdmissionTest, RefusesRequestBytesOverTheirBoundAndTakesThemBackOnRelease) {
  Admission admission({/*max_queued_items=*/100, /*max_client_inflight=*/0,
                       /*max_queued_bytes=*/1000});
  absl::StatusOr<Admission::Ticket> a = admission.Admit("c", 1, 600);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Admission::Ticket> b = admission.Admit("c", 1, 400);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(admission.queued_bytes(), 1000);
  absl::StatusOr<Admission::Ticket> c = admission.Admit("c", 1, 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("1000 bytes of requests queued, limit 1000"),
            absl::string_view::npos);
  EXPECT_TRUE(RetryDelayOf(c.status()).has_value());
  EXPECT_EQ(admission.counts().queue_full, 1u);
  EXPECT_EQ(admission.queued_items(), 2);  // the refused call's item was given back
  a->Release();
  EXPECT_EQ(admission.queued_bytes(), 400);
  absl::StatusOr<Admission::Ticket> d = admission.Admit("c", 1, 600);
  ASSERT_TRUE(d.ok());
  // Moved tickets carry their bytes; destroying the last holder gives them back.
  Admission::Ticket moved = *std::move(d);
  b->Release();
  EXPECT_EQ(admission.queued_bytes(), 600);
  moved = Admission::Ticket();
  EXPECT_EQ(admission.queued_bytes(), 0);
  EXPECT_EQ(admission.queued_items(), 0);
}

TEST(AdmissionTest, AdmitsARequestLargerThanTheByteBoundOnlyWhenIdle) {
  Admission admission({/*max_queued_items=*/0, /*max_client_inflight=*/0,
                       /*max_queued_bytes=*/100});
  absl::StatusOr<Admission::Ticket> big = admission.Admit("c", 1, 5000);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(admission.Admit("c", 1, 1).ok());
  big->Release();
  EXPECT_TRUE(admission.Admit("c", 1, 100).ok());
}

TEST(AdmissionTest, ARefusalByClientGivesTheBytesBack) {
  Admission admission({/*max_queued_items=*/0, /*max_client_inflight=*/1,
                       /*max_queued_bytes=*/1000});
  Admission::Ticket held = *admission.Admit("a", 1, 300);
  EXPECT_FALSE(admission.Admit("a", 1, 300).ok());
  EXPECT_EQ(admission.queued_bytes(), 300);
  EXPECT_EQ(admission.counts().client_limit, 1u);
  EXPECT_EQ(admission.counts().queue_full, 0u);
}

TEST(AdmissionTest, LimitsCallsInFlightPerClient) {
  Admission admission({/*max_queued_items=*/0, /*max_client_inflight=*/2});
  std::vector<Admission::Ticket> held;
  for (int i = 0; i < 2; ++i) held.push_back(*admission.Admit("app-a", 1));
  absl::StatusOr<Admission::Ticket> third = admission.Admit("app-a", 1);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("concurrency limit"), absl::string_view::npos);
  EXPECT_TRUE(admission.Admit("app-b", 1).ok());  // another client is not affected
  EXPECT_EQ(admission.counts().client_limit, 1u);
  EXPECT_EQ(admission.queued_items(), 2);  // the refused call's items were given back
  held.pop_back();
  EXPECT_TRUE(admission.Admit("app-a", 1).ok());
}

TEST(AdmissionTest, RefusalsSayWhenToComeBack) {
  Admission admission({/*max_queued_items=*/10, /*max_client_inflight=*/1});
  Admission::Ticket held = *admission.Admit("a", 10);
  for (const absl::Status& refused :
       {admission.Admit("b", 1).status(), admission.Admit("a", 0).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    // Nothing has finished yet: the drain rate is unknown, the base is 1 s, jittered.
    const std::optional<absl::Duration> delay = RetryDelayOf(refused);
    ASSERT_TRUE(delay.has_value()) << refused;
    EXPECT_GE(*delay, absl::Milliseconds(750));
    EXPECT_LE(*delay, absl::Milliseconds(1250));
  }
}

TEST(AdmissionTest, RetryDelayIsTheQueuesDrainTimeBounded) {
  // The rate is sampled over at least 250 ms and at most 1 s (older samples are stale): 300 ms
  // of sleep makes it F items over 0.25-1 s, so a queue of Q items drains in Q/F x [0.25, 1] s.
  const auto measure = [](int64_t finished, int64_t queued) {
    Admission admission({/*max_queued_items=*/0, /*max_client_inflight=*/0});
    Admission::Ticket done = *admission.Admit("c", finished);
    admission.RetryDelay();  // the first sample: the rate from here on
    done.Release();
    absl::SleepFor(absl::Milliseconds(300));
    Admission::Ticket waiting = *admission.Admit("c", queued);
    return admission.RetryDelay();
  };
  // 8000 queued, 100 done: 20-80 s to drain, bounded to 10 s.
  EXPECT_EQ(measure(100, 8000), kMaxRetryDelay);
  // 100 queued, 10000 done: 2.5-10 ms, bounded to 100 ms.
  EXPECT_EQ(measure(10000, 100), kMinRetryDelay);
  // 1000 queued, 1000 done: 0.25-1 s, jittered by [0.75, 1.25].
  const absl::Duration d = measure(1000, 1000);
  EXPECT_GE(d, absl::Milliseconds(187));
  EXPECT_LE(d, absl::Milliseconds(1250));
}

TEST(RetryDelayTest, PayloadRoundTripsAndTheRuleBoundsIt) {
  const absl::Status s =
      WithRetryDelay(absl::ResourceExhaustedError("busy"), absl::Milliseconds(1234));
  EXPECT_EQ(RetryDelayOf(s), absl::Milliseconds(1234));
  EXPECT_EQ(s.message(), "busy");
  EXPECT_FALSE(RetryDelayOf(absl::ResourceExhaustedError("busy")).has_value());
  EXPECT_TRUE(WithRetryDelay(absl::OkStatus(), absl::Seconds(1)).ok());
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration d = JitteredRetryDelay(absl::Seconds(2));
    EXPECT_GE(d, absl::Milliseconds(1500));
    EXPECT_LE(d, absl::Milliseconds(2500));
    EXPECT_EQ(d, absl::Milliseconds(absl::ToInt64Milliseconds(d)));  // whole milliseconds
  }
  EXPECT_EQ(JitteredRetryDelay(absl::ZeroDuration()), kMinRetryDelay);
  EXPECT_EQ(JitteredRetryDelay(absl::Hours(1)), kMaxRetryDelay);
}

TEST(AdmissionTest, MovedTicketReleasesOnce) {
  Admission admission({/*max_queued_items=*/5, /*max_client_inflight=*/1});
  {
    Admission::Ticket t = *admission.Admit("c", 5);
    Admission::Ticket moved = std::move(t);
    Admission::Ticket assigned;
    assigned = std::move(moved);
    EXPECT_EQ(admission.queued_items(), 5);
  }
  EXPECT_EQ(admission.queued_items(), 0);
  EXPECT_TRUE(admission.Admit("c", 5).ok());
}

TEST(AdmissionTest, ConcurrentAdmitAndReleaseNeverExceedTheBound) {
  Admission admission({/*max_queued_items=*/64, /*max_client_inflight=*/8});
  std::atomic<int64_t> max_seen{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<Admission::Ticket> ticket =
            admission.Admit(t % 2 == 0 ? "even" : "odd", 1 + (i % 16));
        const int64_t q = admission.queued_items();
        int64_t seen = max_seen.load();
        while (q > seen && !max_seen.compare_exchange_weak(seen, q)) {
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(max_seen.load(), 64);
  EXPECT_EQ(admission.queued_items(), 0);
}

}  // namespace
}  // namespace offload::ops
