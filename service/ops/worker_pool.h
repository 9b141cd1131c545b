// A fixed pool of threads that runs CPU work (crypto) off the gRPC and HTTP threads.
//
//   WorkerPool pool(/*threads=*/0);                  // 0 = one per core
//   pool.Submit([&] { DoCrypto(); reactor->Finish(status); });
//
// Tasks run in submission order across the threads. The destructor runs every task already
// submitted, then joins. Thread-safety: Submit may be called from any thread, including a task.
//
// A thread that has decided to run a call's work itself (ops/inline_rule.h) opens a RunHere
// scope: while it lives, what that thread submits to this pool runs at once, on that thread,
// before Submit returns (a batch's items, and the tasks those submit):
//
//   {
//     WorkerPool::RunHere here(&pool);
//     ops.BatchVerify(request, &response, std::move(done));   // done() has run on return
//   }
#ifndef SERVICE_OPS_WORKER_POOL_H_
#define SERVICE_OPS_WORKER_POOL_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace offload::ops {

class WorkerPool final {
 public:
  // `threads` <= 0 means std::thread::hardware_concurrency() (at least 1).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(absl::AnyInvocable<void() &&> task);

  // See the header comment. Scopes nest (the innermost one's pool decides); each is closed on the
  // thread that opened it.
  class RunHere final {
   public:
    explicit RunHere(WorkerPool* pool);
    ~RunHere();
    RunHere(const RunHere&) = delete;
    RunHere& operator=(const RunHere&) = delete;

   private:
    WorkerPool* const previous_;
  };
  // Returns once no task is queued or running (tasks submitted meanwhile are waited for too).
  // Not from a task.
  void WaitIdle();

  int size() const { return static_cast<int>(threads_.size()); }
  // Tasks waiting for a thread (not those running).
  size_t queue_depth() const;
  // Threads running a task right now.
  int busy() const { return busy_.load(std::memory_order_relaxed); }

 private:
  void Run();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> busy_{0};
  std::vector<std::thread> threads_;
};

}  // namespace offload::ops

#endif  // SERVICE_OPS_WORKER_POOL_H_
