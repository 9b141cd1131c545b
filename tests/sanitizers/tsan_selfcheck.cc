// Proves the TSan set-up both ways: `unguarded` and `one_side_locked` must be reported as data
// races, every other mode must run without a report. Each guarded mode orders two threads' writes to
// one plain counter through one of the Abseil primitives that tsan_absl_shim.cc annotates.
// Usage: tsan_selfcheck <mode>; `tsan_selfcheck list` prints the modes.

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

constexpr int kIterations = 1000;

// Not inlined so that the report names it.
__attribute__((noinline)) void UnguardedIncrement(long* counter) { ++*counter; }

int Unguarded() {
  long counter = 0;
  std::thread a([&] { for (int i = 0; i < kIterations; ++i) UnguardedIncrement(&counter); });
  std::thread b([&] { for (int i = 0; i < kIterations; ++i) UnguardedIncrement(&counter); });
  a.join();
  b.join();
  return counter > 0 ? 0 : 1;
}

// One thread increments under an absl::Mutex, the other without it: the annotations must not
// hide a race because one side locks.
__attribute__((noinline)) void OneSideIncrement(long* counter) { ++*counter; }

int OneSideLocked() {
  absl::Mutex mu;
  long counter = 0;
  std::thread a([&] {
    for (int i = 0; i < kIterations; ++i) {
      absl::MutexLock l(&mu);
      OneSideIncrement(&counter);
    }
  });
  std::thread b([&] { for (int i = 0; i < kIterations; ++i) OneSideIncrement(&counter); });
  a.join();
  b.join();
  return counter > 0 ? 0 : 1;
}

// Two threads increment under `mu` taken by `lock` / released by `unlock`.
template <typename Lock, typename Unlock>
int TwoThreads(absl::Mutex& mu, long& counter, Lock lock, Unlock unlock) {
  auto body = [&] {
    for (int i = 0; i < kIterations; ++i) {
      lock();
      ++counter;
      unlock();
    }
  };
  std::thread a(body), b(body);
  a.join();
  b.join();
  return counter == 2 * kIterations ? 0 : 1;
}

int MutexLock() {
  absl::Mutex mu;
  long counter = 0;
  return TwoThreads(mu, counter, [&] { mu.Lock(); }, [&] { mu.Unlock(); });
}

int TryLock() {
  absl::Mutex mu;
  long counter = 0;
  return TwoThreads(
      mu, counter, [&] { while (!mu.TryLock()) std::this_thread::yield(); },
      [&] { mu.Unlock(); });
}

// Writers under Lock, readers under ReaderLock (a read racing a write would be reported).
int ReaderLock() {
  absl::Mutex mu;
  long counter = 0;
  long seen = 0;
  std::thread writer([&] {
    for (int i = 0; i < kIterations; ++i) {
      absl::MutexLock l(&mu);
      ++counter;
    }
  });
  std::thread reader([&] {
    for (int i = 0; i < kIterations; ++i) {
      absl::ReaderMutexLock l(&mu);
      seen = counter;
    }
  });
  writer.join();
  reader.join();
  return seen <= kIterations ? 0 : 1;
}

// A producer/consumer hand-off with Await and LockWhen, as in the worker pool.
int Await() {
  absl::Mutex mu;
  long value = 0;   // written by the producer, read by the consumer
  bool ready = false;
  int consumed = 0;
  std::thread consumer([&] {
    for (int i = 0; i < kIterations; ++i) {
      absl::MutexLock l(&mu);
      mu.Await(absl::Condition(&ready));
      consumed += value > 0;
      ready = false;
    }
  });
  for (int i = 0; i < kIterations; ++i) {
    mu.LockWhen(absl::Condition(
        +[](bool* r) { return !*r; }, &ready));
    value = i + 1;
    ready = true;
    mu.Unlock();
  }
  consumer.join();
  return consumed == kIterations ? 0 : 1;
}

int CondVarWait() {
  absl::Mutex mu;
  absl::CondVar cv;
  long value = 0;
  bool ready = false;
  std::thread producer([&] {
    absl::MutexLock l(&mu);
    value = 42;
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock l(&mu);
    while (!ready) cv.WaitWithTimeout(&mu, absl::Seconds(10));
  }
  producer.join();
  return value == 42 ? 0 : 1;
}

// Plain data handed over by Notification (no Mutex in our code).
int NotificationHandOff() {
  long value = 0;
  absl::Notification done;
  std::thread producer([&] {
    value = 42;
    done.Notify();
  });
  done.WaitForNotification();
  const long seen = value;
  producer.join();
  return seen == 42 ? 0 : 1;
}

int BlockingCounterHandOff() {
  long values[4] = {};
  absl::BlockingCounter done(4);
  std::thread threads[4];
  for (int i = 0; i < 4; ++i) {
    threads[i] = std::thread([&, i] {
      values[i] = i + 1;
      done.DecrementCount();
    });
  }
  done.Wait();
  const long sum = values[0] + values[1] + values[2] + values[3];
  for (std::thread& t : threads) t.join();
  return sum == 10 ? 0 : 1;
}

const std::map<std::string, std::function<int()>>& Modes() {
  static const auto* modes = new std::map<std::string, std::function<int()>>{
      {"unguarded", Unguarded},
      {"one_side_locked", OneSideLocked},
      {"mutex", MutexLock},
      {"trylock", TryLock},
      {"reader", ReaderLock},
      {"await", Await},
      {"condvar", CondVarWait},
      {"notification", NotificationHandOff},
      {"blocking_counter", BlockingCounterHandOff},
  };
  return *modes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "list") == 0) {
    for (const auto& [name, fn] : Modes()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc != 2 || Modes().count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: tsan_selfcheck <mode>; modes: tsan_selfcheck list\n");
    return 64;
  }
  const int rc = Modes().at(argv[1])();
  std::printf("tsan_selfcheck %s: %s\n", argv[1], rc == 0 ? "ran" : "wrong result");
  return rc;
}
