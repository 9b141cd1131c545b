#include "service/ops/admission.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

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
