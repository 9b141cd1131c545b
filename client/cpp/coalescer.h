// Coalescer: turns concurrent single calls into batch calls, without a thread of its own.
//
// Callers of `Submit` that name the same group (here: an endpoint) within `window` of each other
// share one batch, sent when the window closes or when `max_items` have joined:
//
//   Coalescer<VerifyRequest, VerifyResponse> c(absl::Milliseconds(2), 256, /*max_in_flight=*/2,
//       [](const std::string& group, std::vector<VerifyRequest>& items)
//           -> absl::StatusOr<std::vector<absl::StatusOr<VerifyResponse>>> { ... one RPC ... });
//   absl::StatusOr<VerifyResponse> r = c.Submit("10.0.0.1:50051", request);   // blocks
//
// Leader design: the first caller of a batch becomes its leader. It waits until the window has
// passed or the batch is full, takes the batch out of the open slot (later callers start the next
// one), runs `send` on its own thread without holding the lock, stores one result per item and
// wakes the followers, who each take their own item's result. No flusher thread, no thread per
// call, nothing to stop on shutdown: the work is done by threads that are blocked in a call
// anyway, and a lone caller pays at most `window`. A whole-batch failure (the Status returned by
// `send`) is given to every caller of that batch.
//
// Group commit: when `max_in_flight` batches of a group are already being sent, a leader whose
// window has passed keeps its batch open (still collecting) until one of them returns or the
// batch fills. Under load, batches grow instead of multiplying, and the waiting costs nothing
// since the server is busy with the earlier batches; a full batch is always sent at once.
// `max_in_flight` = 0 means no limit (the window alone decides). A leader never holds its batch
// past its own `deadline` (that of the batch's first item, the one that waited longest): then
// the batch goes at once, and `send` sees that the time is up.
//
// Thread-safe. The Coalescer must outlive every `Submit` in progress. `send` is called with no
// lock held, from caller threads, possibly for several groups (and several batches of one group)
// at once; it must return exactly one result per item.
#ifndef CLIENT_CPP_COALESCER_H_
#define CLIENT_CPP_COALESCER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace offload::client {

// Counters of a Coalescer (monotonic).
struct CoalescerStats {
  int64_t batches = 0;  // calls of `send`
  int64_t items = 0;    // items sent in them
};

template <typename Item, typename Result>
class Coalescer final {
 public:
  using Results = std::vector<absl::StatusOr<Result>>;
  using SendFn = std::function<absl::StatusOr<Results>(const std::string& group,
                                                       std::vector<Item>& items)>;

  // REQUIRES: `max_items` >= 1, `max_in_flight` >= 0.
  Coalescer(absl::Duration window, int max_items, int max_in_flight, SendFn send)
      : window_(window),
        max_items_(max_items < 1 ? 1 : max_items),
        max_in_flight_(max_in_flight < 0 ? 0 : max_in_flight),
        send_(std::move(send)) {}

  Coalescer(const Coalescer&) = delete;
  Coalescer& operator=(const Coalescer&) = delete;

  // Adds `item` to the open batch of `group` (opening one if needed) and blocks until that batch
  // has been sent; returns this item's result or the batch's failure. `deadline`: the caller's;
  // a leader waits for a send slot no later than that.
  absl::StatusOr<Result> Submit(const std::string& group, Item item,
                                absl::Time deadline = absl::InfiniteFuture()) {
    std::shared_ptr<Batch> batch;
    size_t index = 0;
    {
      absl::MutexLock lock(&mu_);
      std::unique_ptr<Group>& slot = groups_[group];
      if (slot == nullptr) slot = std::make_unique<Group>();
      Group* g = slot.get();  // stable while this caller's batch has a leader (see Group)
      const bool leader = g->open == nullptr;
      if (leader) {
        g->open = std::make_shared<Batch>();
        ++g->leaders;
      }
      batch = g->open;
      index = batch->items.size();
      batch->items.push_back(std::move(item));
      if (static_cast<int>(batch->items.size()) >= max_items_) {
        batch->closed = true;  // the next caller of this group leads a new batch
        g->open = nullptr;
        batch->wake.Signal();
      }
      if (!leader) {
        while (!batch->done) batch->done_cv.Wait(&mu_);
        return std::move(batch->results[index]);
      }
      const absl::Time window_end = std::min(absl::Now() + window_, deadline);
      while (!batch->closed) {
        const absl::Time now = absl::Now();
        const bool window_open = now < window_end;
        if (!window_open &&
            (max_in_flight_ == 0 || g->in_flight < max_in_flight_ || now >= deadline)) {
          break;
        }
        // While the window is open: until it closes or the batch fills. After: until a send slot
        // frees up, the batch fills or the deadline passes.
        batch->wake.WaitWithDeadline(&mu_, window_open ? window_end : deadline);
      }
      if (!batch->closed) {
        batch->closed = true;
        g->open = nullptr;
      }
      ++g->in_flight;
      ++stats_.batches;
      stats_.items += static_cast<int64_t>(batch->items.size());
    }
    // Leader, lock released: the batch is closed, so nobody else touches `items`.
    const size_t n = batch->items.size();
    absl::StatusOr<Results> sent = send_(group, batch->items);
    Results results;
    if (!sent.ok()) {
      results.assign(n, absl::StatusOr<Result>(sent.status()));
    } else if (sent->size() != n) {
      results.assign(n, absl::StatusOr<Result>(absl::InternalError(absl::StrCat(
                            "batch answer: expected ", n, " results, got ", sent->size()))));
    } else {
      results = std::move(*sent);
    }
    absl::MutexLock lock(&mu_);
    batch->results = std::move(results);
    batch->done = true;
    batch->done_cv.SignalAll();
    auto it = groups_.find(group);  // still there: this leader kept it
    Group& g = *it->second;
    --g.in_flight;
    --g.leaders;
    if (g.open != nullptr) {
      g.open->wake.Signal();
    } else if (g.leaders == 0) {
      groups_.erase(it);
    }
    return std::move(batch->results[index]);
  }

  // Items waiting in the open batch of `group` (for tests).
  int OpenItems(const std::string& group) const {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group);
    if (it == groups_.end() || it->second->open == nullptr) return 0;
    return static_cast<int>(it->second->open->items.size());
  }

  CoalescerStats stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // Batch fields are guarded by mu_ (items: until closed; then only the leader reads them).
  struct Batch {
    std::vector<Item> items;
    Results results;  // written once, with done
    bool closed = false;
    bool done = false;
    absl::CondVar wake;     // leader waits: batch full, or a send slot freed
    absl::CondVar done_cv;  // followers wait: results ready
  };
  // A group lives while it has a leader that has not finished (an open batch has one), so the
  // pointer a leader holds stays valid; it is erased when the last leader finishes.
  struct Group {
    std::shared_ptr<Batch> open;  // collecting items; null between batches
    int in_flight = 0;            // batches being sent
    int leaders = 0;              // batches opened and not yet answered
  };

  const absl::Duration window_;
  const int max_items_;
  const int max_in_flight_;
  const SendFn send_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  CoalescerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::client

#endif  // CLIENT_CPP_COALESCER_H_
