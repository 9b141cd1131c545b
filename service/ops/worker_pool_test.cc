#include "service/ops/worker_pool.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "gtest/gtest.h"

namespace offload::ops {
namespace {

TEST(WorkerPoolTest, RunsEveryTaskOnPoolThreads) {
  WorkerPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  std::atomic<int> ran{0};
  std::atomic<int> on_caller{0};
  const auto caller = std::this_thread::get_id();
  absl::BlockingCounter done(1000);
  for (int i = 0; i < 1000; ++i) {
    pool.Submit([&] {
      ran.fetch_add(1);
      if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_EQ(on_caller.load(), 0);
}

TEST(WorkerPoolTest, DestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(1);
    for (int i = 0; i < 100; ++i) {
      pool.Submit([&] { ran.fetch_add(1); });
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(WorkerPoolTest, TasksMaySubmitTasks) {
  std::atomic<int> ran{0};
  absl::BlockingCounter done(2);
  WorkerPool pool(2);
  pool.Submit([&] {
    ran.fetch_add(1);
    pool.Submit([&] {
      ran.fetch_add(1);
      done.DecrementCount();
    });
    done.DecrementCount();
  });
  done.Wait();
  EXPECT_EQ(ran.load(), 2);
}

TEST(WorkerPoolTest, DefaultSizeIsCoreCount) {
  WorkerPool pool(0);
  EXPECT_GE(pool.size(), 1);
}

}  // namespace
}  // namespace offload::ops
