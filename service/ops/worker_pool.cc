#include "service/ops/worker_pool.h"

#include <pthread.h>

#include <utility>

#include "absl/time/clock.h"

namespace offload::ops {
namespace {
// The pool whose tasks the calling thread runs itself (WorkerPool::RunHere), or null.
thread_local WorkerPool* run_here = nullptr;
}  // namespace

WorkerPool::RunHere::RunHere(WorkerPool* pool) : previous_(run_here) { run_here = pool; }
WorkerPool::RunHere::~RunHere() { run_here = previous_; }

WorkerPool::WorkerPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads <= 0) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(absl::AnyInvocable<void() &&> task) {
  if (run_here == this) {
    std::move(task)();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void WorkerPool::WaitIdle() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty() && busy_.load(std::memory_order_relaxed) == 0) return;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

size_t WorkerPool::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool WorkerPool::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void WorkerPool::Run() {
  pthread_setname_np(pthread_self(), "worker");  // in profiles and /proc/<pid>/task
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WorkerPool::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, and every submitted task has run
      task = std::move(queue_.front());
      queue_.pop_front();
      // Under the lock, so that WaitIdle never sees an empty queue and no busy worker while a
      // task is between the two.
      busy_.fetch_add(1, std::memory_order_relaxed);
    }
    std::move(task)();
    busy_.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace offload::ops
