#include "client/cpp/coalescer.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

struct Item {
  std::string group;
  int value = 0;
};
using IntCoalescer = Coalescer<Item, int>;

// Records every batch it is given and answers value * 2 (or an item error for negatives).
class Recorder {
 public:
  IntCoalescer::SendFn Fn() {
    return [this](const std::string& group, std::vector<Item>& items)
               -> absl::StatusOr<IntCoalescer::Results> {
      {
        absl::MutexLock lock(&mu_);
        sizes_.push_back(static_cast<int>(items.size()));
        for (const Item& i : items) {
          if (i.group != group) mixed_ = true;
        }
      }
      if (!fail_.ok()) return fail_;
      IntCoalescer::Results out;
      for (const Item& i : items) {
        if (i.value < 0) {
          out.emplace_back(absl::InvalidArgumentError("negative"));
        } else {
          out.emplace_back(i.value * 2);
        }
      }
      return out;
    };
  }
  std::vector<int> sizes() {
    absl::MutexLock lock(&mu_);
    return sizes_;
  }
  bool mixed() {
    absl::MutexLock lock(&mu_);
    return mixed_;
  }
  absl::Status fail_;

 private:
  absl::Mutex mu_;
  std::vector<int> sizes_ ABSL_GUARDED_BY(mu_);
  bool mixed_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs `n` threads that each submit one item; returns the results by thread index.
std::vector<absl::StatusOr<int>> RunConcurrently(IntCoalescer& c, int n, int groups) {
  std::vector<absl::StatusOr<int>> results(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string group = "g" + std::to_string(i % groups);
      results[i] = c.Submit(group, Item{group, (i % 7 == 3) ? -i : i});
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// With a window far longer than the test, batches close only by size: 64 callers and a size of
// 8 make exactly 8 full batches, whatever the thread timing.
TEST(CoalescerTest, FullBatchesAreSentAtSizeAndEachCallerGetsItsOwnResult) {
  Recorder rec;
  IntCoalescer c(absl::Hours(1), 8, 0, rec.Fn());
  auto results = RunConcurrently(c, 64, 1);
  for (int i = 0; i < 64; ++i) {
    if (i % 7 == 3) {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kInvalidArgument) << i;
    } else {
      ASSERT_TRUE(results[i].ok()) << i << " " << results[i].status();
      EXPECT_EQ(*results[i], i * 2);
    }
  }
  EXPECT_EQ(rec.sizes(), std::vector<int>(8, 8));
  EXPECT_EQ(c.stats().batches, 8);
  EXPECT_EQ(c.stats().items, 64);
}

TEST(CoalescerTest, GroupsNeverShareABatch) {
  Recorder rec;
  IntCoalescer c(absl::Hours(1), 4, 0, rec.Fn());
  auto results = RunConcurrently(c, 48, 3);  // 16 per group: 4 full batches each
  for (int i = 0; i < 48; ++i) {
    if (i % 7 != 3) {
      EXPECT_EQ(*results[i], i * 2);
    }
  }
  EXPECT_FALSE(rec.mixed());
  EXPECT_EQ(rec.sizes(), std::vector<int>(12, 4));
}

TEST(CoalescerTest, WindowClosesAPartialBatch) {
  Recorder rec;
  IntCoalescer c(absl::Milliseconds(1), 256, 0, rec.Fn());
  auto r = c.Submit("g", Item{"g", 21});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(rec.sizes(), std::vector<int>({1}));
  // Sequential callers each lead their own batch.
  EXPECT_EQ(*c.Submit("g", Item{"g", 1}), 2);
  EXPECT_EQ(c.stats().batches, 2);
}

TEST(CoalescerTest, WholeBatchFailureGoesToEveryCaller) {
  Recorder rec;
  rec.fail_ = absl::UnavailableError("replica gone");
  IntCoalescer c(absl::Hours(1), 10, 0, rec.Fn());
  auto results = RunConcurrently(c, 20, 1);
  for (const auto& r : results) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(r.status().message(), "replica gone");
  }
  EXPECT_EQ(rec.sizes(), std::vector<int>(2, 10));
}

TEST(CoalescerTest, WrongResultCountIsAnInternalErrorForAll) {
  IntCoalescer c(absl::Milliseconds(1), 8, 0,
                 [](const std::string&, std::vector<Item>&) -> absl::StatusOr<IntCoalescer::Results> {
                   return IntCoalescer::Results{};
                 });
  EXPECT_EQ(c.Submit("g", Item{"g", 1}).status().code(), absl::StatusCode::kInternal);
}

// Group commit: with one batch in flight and a limit of 1, later callers keep joining one batch
// past its (zero) window until the first returns.
TEST(CoalescerTest, BatchesGrowWhileTheLimitOfBatchesIsInFlight) {
  absl::Notification release;
  absl::Mutex mu;
  std::vector<int> sizes;
  IntCoalescer c(absl::ZeroDuration(), 256, 1,
                 [&](const std::string&, std::vector<Item>& items)
                     -> absl::StatusOr<IntCoalescer::Results> {
                   {
                     absl::MutexLock lock(&mu);
                     sizes.push_back(static_cast<int>(items.size()));
                   }
                   release.WaitForNotification();
                   return IntCoalescer::Results(items.size(), 1);
                 });
  std::thread first([&] { EXPECT_EQ(*c.Submit("g", Item{"g", 0}), 1); });
  auto first_sent = [&] {
    absl::MutexLock lock(&mu);
    return !sizes.empty();
  };
  while (!first_sent()) absl::SleepFor(absl::Milliseconds(1));
  std::vector<std::thread> rest;
  for (int i = 0; i < 10; ++i) {
    rest.emplace_back([&] { EXPECT_EQ(*c.Submit("g", Item{"g", 1}), 1); });
  }
  while (c.OpenItems("g") < 10) absl::SleepFor(absl::Milliseconds(1));
  release.Notify();
  first.join();
  for (auto& t : rest) t.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(sizes, std::vector<int>({1, 10}));
}

// A batch held back for a send slot still goes by its leader's deadline (the send then finds the
// time up), so a stuck earlier batch cannot keep later callers past their deadlines.
TEST(CoalescerTest, HeldBatchGoesByItsLeadersDeadline) {
  absl::Notification release;
  absl::Mutex mu;
  std::vector<int> sizes;
  IntCoalescer c(absl::ZeroDuration(), 256, 1,
                 [&](const std::string&, std::vector<Item>& items)
                     -> absl::StatusOr<IntCoalescer::Results> {
                   bool first_batch;
                   {
                     absl::MutexLock lock(&mu);
                     first_batch = sizes.empty();
                     sizes.push_back(static_cast<int>(items.size()));
                   }
                   if (first_batch) release.WaitForNotification();  // stuck until the end
                   return IntCoalescer::Results(items.size(), 1);
                 });
  std::thread first([&] { EXPECT_EQ(*c.Submit("g", Item{"g", 0}), 1); });
  auto sent = [&] {
    absl::MutexLock lock(&mu);
    return sizes.size();
  };
  while (sent() < 1) absl::SleepFor(absl::Milliseconds(1));
  // Without the deadline this call would wait for the first batch (released only afterwards).
  EXPECT_EQ(*c.Submit("g", Item{"g", 1}, absl::Now() + absl::Milliseconds(50)), 1);
  EXPECT_EQ(sent(), 2u);
  release.Notify();
  first.join();
}

TEST(CoalescerTest, SizeOneMeansNoWaiting) {
  Recorder rec;
  IntCoalescer c(absl::Hours(1), 1, 0, rec.Fn());  // would hang if the window applied
  auto results = RunConcurrently(c, 16, 2);
  EXPECT_EQ(rec.sizes(), std::vector<int>(16, 1));
  EXPECT_EQ(*results[5], 10);
}

}  // namespace
}  // namespace offload::client
