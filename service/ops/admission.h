// Overload protection: admits a call only while the server has room for it, so that excess load
// is refused at once (RESOURCE_EXHAUSTED) instead of queueing without bound.
//
//   Admission admission({/*max_queued_items=*/16384, /*max_client_inflight=*/256});
//   absl::StatusOr<Admission::Ticket> ticket =
//       admission.Admit("spiffe://app-a", /*items=*/64, /*bytes=*/request.ByteSizeLong());
//   if (!ticket.ok()) return ticket.status();          // RESOURCE_EXHAUSTED, counted
//   ... run the call; destroying (or Release()-ing) the ticket gives the room back ...
//
// Three bounds: the items admitted and not yet finished, over every caller (a batch counts its
// items, so queueing delay stays bounded whatever the mix); the bytes of those calls' requests,
// over every caller (so that the memory calls waiting for a worker hold is bounded whatever
// their size: a few large calls fill it before their count would); and the calls in flight per
// client identity (one caller cannot take the whole queue). 0 disables a bound. A call larger
// than a whole bound is admitted when nothing else is queued (the server keeps the bounds at
// least a batch of the most items and a request of the largest size).
// A refusal says when to come back (a RetryInfo payload, ops/retry_delay.h): the queue's
// expected drain time - the items queued over the items finished per second, measured over the
// last quarter-second or more (1 s when unknown: nothing measured in the last second) - jittered
// and bounded by JitteredRetryDelay.
// Thread-safety: every method may be called from any thread; a Ticket is owned by one call.
#ifndef SERVICE_OPS_ADMISSION_H_
#define SERVICE_OPS_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace offload::ops {

class Admission final {
 public:
  struct Options {
    int64_t max_queued_items = 16384;  // items admitted and not finished, all callers; 0 = no bound
    int max_client_inflight = 256;    // calls in flight per client identity; 0 = no bound
    int64_t max_queued_bytes = int64_t{256} << 20;  // request bytes of those items; 0 = no bound
  };
  // Why calls were refused or dropped, for metrics.
  struct Counts {
    uint64_t queue_full = 0;  // by items or by bytes
    uint64_t client_limit = 0;
    uint64_t deadline = 0;     // see CountDeadlineDrop
    uint64_t client_gone = 0;  // see CountClientGoneDrop
    uint64_t answers_unread = 0;  // see CountAnswersUnreadDrop
  };

  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    // Gives the room back; idempotent.
    void Release();

   private:
    friend class Admission;
    Admission* owner_ = nullptr;
    int64_t items_ = 0;
    int64_t bytes_ = 0;
    uint64_t client_ = 0;  // the client's hash (see inflight_)
  };

  explicit Admission(Options options) : options_(options) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // A ticket for a call of `items` items (1 for a unary call) and `bytes` bytes of request from
  // `client`, or ResourceExhausted naming the bound that is full, with a retry delay
  // (RetryDelay()).
  absl::StatusOr<Ticket> Admit(absl::string_view client, int64_t items, int64_t bytes = 0);

  // The delay a refusal now tells its caller to wait (the rule above); never below
  // kMinRetryDelay nor above kMaxRetryDelay.
  absl::Duration RetryDelay();

  // Counts a call that was admitted but dropped because its deadline passed while it waited.
  void CountDeadlineDrop() { deadline_drops_.fetch_add(1, std::memory_order_relaxed); }
  // Counts a call that was admitted but dropped unrun because its client had gone (its stream
  // reset, its connection closed) before a worker got to it.
  void CountClientGoneDrop() { client_gone_drops_.fetch_add(1, std::memory_order_relaxed); }
  // Counts a call that was admitted but refused before it ran because its connection held more
  // answers its client had not read than the connection's answer budget.
  void CountAnswersUnreadDrop() { answers_unread_drops_.fetch_add(1, std::memory_order_relaxed); }

  int64_t queued_items() const { return queued_items_.load(std::memory_order_relaxed); }
  int64_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  Counts counts() const;
  const Options& options() const { return options_; }

 private:
  void Return(uint64_t client, int64_t items, int64_t bytes);
  // Adds `n` to `queued` unless that passes `max` (0: no bound) while something is queued;
  // false when it would.
  static bool TryAdd(std::atomic<int64_t>& queued, int64_t n, int64_t max);

  const Options options_;
  std::atomic<int64_t> queued_items_{0};
  std::atomic<int64_t> queued_bytes_{0};
  std::atomic<int64_t> finished_items_{0};  // items whose tickets were given back, ever
  // The drain rate's last sample (RetryDelay): when, finished_items_ then, and items per second.
  absl::Mutex rate_mu_;
  absl::Time rate_sampled_ ABSL_GUARDED_BY(rate_mu_) = absl::InfinitePast();
  int64_t rate_finished_ ABSL_GUARDED_BY(rate_mu_) = 0;
  double rate_ ABSL_GUARDED_BY(rate_mu_) = 0;
  std::atomic<uint64_t> queue_full_{0};
  std::atomic<uint64_t> client_limit_{0};
  std::atomic<uint64_t> deadline_drops_{0};
  std::atomic<uint64_t> client_gone_drops_{0};
  std::atomic<uint64_t> answers_unread_drops_{0};
  absl::Mutex mu_;
  // Calls in flight per client, keyed by a 64-bit hash of its name: no string is copied or
  // allocated per call. Two clients whose names collide would share one limit (never a wrong
  // answer, at worst an early RESOURCE_EXHAUSTED; a chance of ~n^2 / 2^65 for n live clients).
  absl::flat_hash_map<uint64_t, int> inflight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::ops

#endif  // SERVICE_OPS_ADMISSION_H_
