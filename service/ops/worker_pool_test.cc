#include "service/ops/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

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

TEST(WorkerPoolTest, RunHereRunsTasksOnTheCallingThreadBeforeSubmitReturns) {
  WorkerPool pool(2);
  WorkerPool other(1);
  const auto caller = std::this_thread::get_id();
  std::vector<std::thread::id> ran;
  {
    WorkerPool::RunHere here(&pool);
    pool.Submit([&] {
      ran.push_back(std::this_thread::get_id());
      // What a task submits runs here too, at once (a batch calling in helpers).
      pool.Submit([&] { ran.push_back(std::this_thread::get_id()); });
      ran.push_back(std::this_thread::get_id());
    });
    ASSERT_EQ(ran.size(), 3u);
    for (const auto& id : ran) EXPECT_EQ(id, caller);
    // Another pool is not this scope's: its task runs on its own thread.
    absl::BlockingCounter done(1);
    std::thread::id other_ran;
    other.Submit([&] {
      other_ran = std::this_thread::get_id();
      done.DecrementCount();
    });
    done.Wait();
    EXPECT_NE(other_ran, caller);
  }
  // Once the scope is closed, tasks go to the workers again.
  absl::BlockingCounter done(1);
  std::thread::id after;
  pool.Submit([&] {
    after = std::this_thread::get_id();
    done.DecrementCount();
  });
  done.Wait();
  EXPECT_NE(after, caller);
  EXPECT_EQ(pool.queue_depth(), 0u);
}

TEST(WorkerPoolTest, RunHereScopesNest) {
  WorkerPool a(1), b(1);
  const auto caller = std::this_thread::get_id();
  WorkerPool::RunHere outer(&a);
  {
    WorkerPool::RunHere inner(&b);
    std::thread::id ran;
    b.Submit([&] { ran = std::this_thread::get_id(); });
    EXPECT_EQ(ran, caller);
  }
  std::thread::id ran;
  a.Submit([&] { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, caller);  // the outer scope again
}

TEST(WorkerPoolTest, DefaultSizeIsCoreCount) {
  WorkerPool pool(0);
  EXPECT_GE(pool.size(), 1);
}

}  // namespace
}  // namespace offload::ops
