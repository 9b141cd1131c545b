// ThreadSanitizer annotations for Debian's prebuilt Abseil synchronization library.
//
// Debian ships libabsl_synchronization.so uninstrumented, so TSan never sees absl::Mutex lock or
// unlock and reports every access that a Mutex guards as a race. This file is linked (only) into
// executables of an OFFLOAD_SANITIZER=thread build, together with `-Wl,--wrap=<symbol>` for each
// function below (tests/sanitizers/CMakeLists.txt): the linker sends our calls to __wrap_<symbol>,
// which tells TSan what the call does (the same __tsan_mutex_* calls Abseil itself makes when it
// is built with TSan) and calls the library through __real_<symbol>.
//
// Scope: only calls from our instrumented code are wrapped; calls inside the .so are not, which is
// why Notification and BlockingCounter (built on Mutex inside the .so) get their own
// happens-before edges here, as their headers promise. Not annotated: absl::Barrier (unused), and
// the inline Notification::HasBeenNotified() (use WaitForNotification* in code TSan checks).
// Nothing here hides a race between accesses that the real Mutex does not order.

#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

// The mangled names below (and in CMakeLists.txt) are for Debian's inline namespace.
static_assert(std::is_same_v<absl::Mutex, absl::debian3::Mutex>,
              "expected Abseil's inline namespace debian3 (Debian 12 libabsl-dev 20220623)");

namespace {

using absl::BlockingCounter;
using absl::CondVar;
using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

constexpr unsigned kRead = __tsan_mutex_read_lock;

// Annotations for a blocking acquire of `mu` around the real call.
struct LockScope {
  LockScope(Mutex* mu, unsigned flags) : mu(mu), flags(flags) { __tsan_mutex_pre_lock(mu, flags); }
  ~LockScope() { __tsan_mutex_post_lock(mu, flags, 0); }
  Mutex* mu;
  unsigned flags;
};

// For calls that enter with `mu` held, release it while waiting and return with it held again
// (Await, CondVar::Wait): TSan sees an unlock before the call and a lock after it. Accesses made
// inside the call (the Condition is evaluated there, under the real lock) are ignored by TSan
// between pre_unlock and post_unlock.
struct RelockScope {
  RelockScope(Mutex* mu, unsigned flags) : mu(mu), flags(flags) {
    __tsan_mutex_pre_unlock(mu, flags);
  }
  ~RelockScope() {
    __tsan_mutex_post_unlock(mu, flags);
    __tsan_mutex_pre_lock(mu, flags);
    __tsan_mutex_post_lock(mu, flags, 0);
  }
  Mutex* mu;
  unsigned flags;
};

// The mode in which the calling thread holds `mu` (REQUIRES: it holds it): Await and CondVar::Wait
// re-acquire in the mode they were entered in. absl::Mutex is one word whose kMuWriter bit
// (0x0008 in Abseil 20220623's mutex.cc) is set exactly while a writer holds it.
unsigned HeldFlags(const Mutex* mu) {
  static_assert(sizeof(Mutex) == sizeof(std::atomic<intptr_t>), "absl::Mutex layout changed");
  constexpr intptr_t kMuWriter = 0x0008;
  const intptr_t word =
      reinterpret_cast<const std::atomic<intptr_t>*>(mu)->load(std::memory_order_relaxed);
  return (word & kMuWriter) != 0 ? 0 : kRead;
}

}  // namespace

#define OFFLOAD_TSAN_WRAP(ret, sym, ...) \
  extern "C" ret __real_##sym(__VA_ARGS__); \
  extern "C" ret __wrap_##sym(__VA_ARGS__)

// --- Mutex: lock and unlock -----------------------------------------------------------------

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex4LockEv, Mutex* mu) {
  LockScope s(mu, 0);
  __real__ZN4absl7debian35Mutex4LockEv(mu);
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex10ReaderLockEv, Mutex* mu) {
  LockScope s(mu, kRead);
  __real__ZN4absl7debian35Mutex10ReaderLockEv(mu);
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex6UnlockEv, Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(mu);
  __tsan_mutex_post_unlock(mu, 0);
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex12ReaderUnlockEv, Mutex* mu) {
  __tsan_mutex_pre_unlock(mu, kRead);
  __real__ZN4absl7debian35Mutex12ReaderUnlockEv(mu);
  __tsan_mutex_post_unlock(mu, kRead);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex7TryLockEv, Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool locked = __real__ZN4absl7debian35Mutex7TryLockEv(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex13ReaderTryLockEv, Mutex* mu) {
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_read_lock);
  const bool locked = __real__ZN4absl7debian35Mutex13ReaderTryLockEv(mu);
  __tsan_mutex_post_lock(
      mu, __tsan_mutex_try_read_lock | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35MutexD1Ev, Mutex* mu) {
  __tsan_mutex_destroy(mu, 0);
  __real__ZN4absl7debian35MutexD1Ev(mu);
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35MutexD2Ev, Mutex* mu) {
  __tsan_mutex_destroy(mu, 0);
  __real__ZN4absl7debian35MutexD2Ev(mu);
}

// --- Mutex: conditional locking. LockWhen* return with the lock held, even on timeout. -----

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE, Mutex* mu,
                  const Condition& c) {
  LockScope s(mu, 0);
  __real__ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE(mu, c);
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE, Mutex* mu,
                  const Condition& c) {
  LockScope s(mu, kRead);
  __real__ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE(mu, c);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE,
                  Mutex* mu, const Condition& c, Duration d) {
  LockScope s(mu, 0);
  return __real__ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(mu, c,
                                                                                            d);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
                  Mutex* mu, const Condition& c, Time t) {
  LockScope s(mu, 0);
  return __real__ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(mu, c, t);
}

OFFLOAD_TSAN_WRAP(bool,
                  _ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE,
                  Mutex* mu, const Condition& c, Duration d) {
  LockScope s(mu, kRead);
  return __real__ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE(
      mu, c, d);
}

OFFLOAD_TSAN_WRAP(bool,
                  _ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE,
                  Mutex* mu, const Condition& c, Time t) {
  LockScope s(mu, kRead);
  return __real__ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE(
      mu, c, t);
}

// --- Mutex: Await* (entered and left holding the lock, released while waiting) ------------

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, Mutex* mu,
                  const Condition& c) {
  RelockScope s(mu, HeldFlags(mu));
  __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(mu, c);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE,
                  Mutex* mu, const Condition& c, Duration d) {
  RelockScope s(mu, HeldFlags(mu));
  return __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(mu, c, d);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE,
                  Mutex* mu, const Condition& c, Time t) {
  RelockScope s(mu, HeldFlags(mu));
  return __real__ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE(mu, c, t);
}

// --- CondVar::Wait* (release `mu` while waiting, re-acquire it in the same mode) ----------

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE, CondVar* cv, Mutex* mu) {
  RelockScope s(mu, HeldFlags(mu));
  __real__ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(cv, mu);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE,
                  CondVar* cv, Mutex* mu, Duration d) {
  RelockScope s(mu, HeldFlags(mu));
  return __real__ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(cv, mu, d);
}

OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE,
                  CondVar* cv, Mutex* mu, Time t) {
  RelockScope s(mu, HeldFlags(mu));
  return __real__ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(cv, mu, t);
}

// --- Notification, BlockingCounter: the happens-before their headers promise ------

// Everything before Notify() happens before a WaitForNotification*() that sees the notification.
OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian312Notification6NotifyEv, Notification* n) {
  __tsan_release(n);
  __real__ZN4absl7debian312Notification6NotifyEv(n);
}

OFFLOAD_TSAN_WRAP(void, _ZNK4absl7debian312Notification19WaitForNotificationEv,
                  const Notification* n) {
  __real__ZNK4absl7debian312Notification19WaitForNotificationEv(n);
  __tsan_acquire(const_cast<Notification*>(n));
}

OFFLOAD_TSAN_WRAP(bool, _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE,
                  const Notification* n, Duration d) {
  const bool notified =
      __real__ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE(n, d);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}

OFFLOAD_TSAN_WRAP(bool, _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE,
                  const Notification* n, Time t) {
  const bool notified =
      __real__ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE(n, t);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}

// Everything before each DecrementCount() happens before Wait() returns, and before the
// DecrementCount() that returns true returns.
OFFLOAD_TSAN_WRAP(bool, _ZN4absl7debian315BlockingCounter14DecrementCountEv, BlockingCounter* b) {
  __tsan_release(b);
  const bool last = __real__ZN4absl7debian315BlockingCounter14DecrementCountEv(b);
  if (last) __tsan_acquire(b);
  return last;
}

OFFLOAD_TSAN_WRAP(void, _ZN4absl7debian315BlockingCounter4WaitEv, BlockingCounter* b) {
  __real__ZN4absl7debian315BlockingCounter4WaitEv(b);
  __tsan_acquire(b);
}
