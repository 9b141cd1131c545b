// Where a call's work runs: to completion on the thread that read the request (an event loop),
// or on the worker pool after a hop (a queue push, a worker woken, the answer handed back). A hop
// costs more than a memo hit or a single signature check's bookkeeping: two or more context
// switches and the sleeps and wake-ups around them. STYLE.md rule 7 allows bounded work on an
// engine thread; the rule here states the bound:
//
//   - a call runs where it was read when its estimated CPU cost (EstimateNanos: a per-operation
//     constant plus a per-KiB term, over every item of a batch) is at most `max_call`, and
//   - the work already run on that loop for the input at hand (httpd::LoopLoad::charged: one
//     turn of one connection - its reads the loop makes in a row before it serves another
//     connection - which may carry many HTTP/2 streams), plus this call, stays within
//     `turn_budget` - or within `max_call` when answers from other threads wait on that loop
//     (LoopLoad::waiting): they are delayed by what runs there.
//
// Everything else goes to the pool: large batches, so that one big call never holds small ones
// behind it on a loop; the calls of an input past its budget, so that the loop's other
// connections get their turn; key management (it writes the key store) and anything without an
// estimate.
//
//   InlineRule rule({});                                       // the defaults
//   const int64_t cost = InlineRule::EstimateNanos(request);
//   httpd::LoopLoad load = httpd::CurrentLoopLoad();
//   if (load.on_loop && rule.RunHere(cost, load.charged, load.waiting)) {
//     httpd::ChargeLoop(cost);
//     ... run the call here ...
//   }
//
// Thread-safety: immutable; any thread.
#ifndef SERVICE_OPS_INLINE_RULE_H_
#define SERVICE_OPS_INLINE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/time/time.h"
#include "google/protobuf/message.h"

namespace offload::ops {

class InlineRule final {
 public:
  struct Options {
    // A call estimated above this always goes to the pool; zero: every call does (the hop of
    // old, e.g. to compare).
    absl::Duration max_call = absl::Microseconds(250);
    // Estimated work a loop runs for one input before the rest of its calls go to the pool.
    absl::Duration turn_budget = absl::Milliseconds(2);
  };

  // An estimate that never runs inline (no estimate: key management, health, unknown types).
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  explicit InlineRule(Options options);

  // The CPU nanoseconds computing `request` afresh costs on the build machine (tests/bench/
  // README.md, crypto_bench: libsodium Ed25519 verify ~45 us, X25519 ~35 us, ChaCha20-Poly1305
  // ~0.25 ns a byte), rounded up: a batch is the sum of its items. kNever for a request type
  // without an estimate. Memo hits cost less; the estimate does not count on them.
  static int64_t EstimateNanos(const google::protobuf::Message& request);
  // An AEAD Open of `bytes` (envelope and associated data), as EstimateNanos would give for its
  // AeadOpenRequest (a request read where it lies has no message to ask).
  static int64_t EstimateAeadOpenNanos(size_t bytes);

  // Whether a call of `cost_ns` runs here, on a loop that has run `charged_ns` for the input at
  // hand and has `waiting` answers from other threads queued.
  bool RunHere(int64_t cost_ns, int64_t charged_ns, int64_t waiting) const;

  const Options& options() const { return options_; }

 private:
  const Options options_;
  const int64_t max_call_ns_;
  const int64_t turn_budget_ns_;
};

}  // namespace offload::ops

#endif  // SERVICE_OPS_INLINE_RULE_H_
