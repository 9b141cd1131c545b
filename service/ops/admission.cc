#include "service/ops/admission.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "service/ops/retry_delay.h"

namespace offload::ops {

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    items_ = std::exchange(other.items_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    client_ = std::exchange(other.client_, 0);
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (owner_ == nullptr) return;
  std::exchange(owner_, nullptr)->Return(client_, items_, bytes_);
}

bool Admission::TryAdd(std::atomic<int64_t>& queued, int64_t n, int64_t max) {
  if (max <= 0) {
    queued.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
  // A call larger than the whole bound is still admitted when nothing else waits, so that a
  // batch of max_batch_items (a message of max_message_bytes) can always run on an idle server.
  int64_t now = queued.load(std::memory_order_relaxed);
  do {
    if (now > 0 && now + n > max) return false;
  } while (!queued.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
  return true;
}

absl::StatusOr<Admission::Ticket> Admission::Admit(absl::string_view client, int64_t items,
                                                   int64_t bytes) {
  if (items < 1) items = 1;
  if (bytes < 0) bytes = 0;
  // A full queue (by items or by bytes) refuses the call, counted, saying which bound it met.
  const auto queue_full = [&](const std::atomic<int64_t>& queued, absl::string_view what,
                              int64_t max) {
    queue_full_.fetch_add(1, std::memory_order_relaxed);
    return WithRetryDelay(absl::ResourceExhaustedError(absl::StrCat(
                              "server overloaded: ", queued.load(std::memory_order_relaxed),
                              what, " queued, limit ", max, "; retry later")),
                          RetryDelay());
  };
  if (!TryAdd(queued_items_, items, options_.max_queued_items)) {
    return queue_full(queued_items_, " items", options_.max_queued_items);
  }
  if (!TryAdd(queued_bytes_, bytes, options_.max_queued_bytes)) {
    queued_items_.fetch_sub(items, std::memory_order_relaxed);
    return queue_full(queued_bytes_, " bytes of requests", options_.max_queued_bytes);
  }
  Ticket ticket;
  ticket.owner_ = this;
  ticket.items_ = items;
  ticket.bytes_ = bytes;
  if (options_.max_client_inflight > 0) {
    const uint64_t key = absl::HashOf(client);
    bool over = false;
    {
      absl::MutexLock lock(&mu_);
      int& inflight = inflight_[key];
      over = inflight >= options_.max_client_inflight;
      if (!over) ++inflight;
    }
    if (over) {
      ticket.owner_ = nullptr;
      queued_items_.fetch_sub(items, std::memory_order_relaxed);
      queued_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
      client_limit_.fetch_add(1, std::memory_order_relaxed);
      return WithRetryDelay(absl::ResourceExhaustedError(absl::StrCat(
                                "client over its concurrency limit: ",
                                options_.max_client_inflight, " calls in flight; retry later")),
                            RetryDelay());
    }
    ticket.client_ = key;
  }
  return ticket;
}

absl::Duration Admission::RetryDelay() {
  constexpr absl::Duration kMinSample = absl::Milliseconds(250);
  constexpr absl::Duration kStaleSample = absl::Seconds(1);
  const absl::Time now = absl::Now();
  double rate;
  {
    absl::MutexLock lock(&rate_mu_);
    const absl::Duration since = now - rate_sampled_;
    if (since >= kMinSample) {
      const int64_t finished = finished_items_.load(std::memory_order_relaxed);
      // A sample over more than a second says little of the pace now (an idle hour averages
      // low): start again, the rate unknown until the next one.
      rate_ = since > kStaleSample
                  ? 0
                  : static_cast<double>(finished - rate_finished_) / absl::ToDoubleSeconds(since);
      rate_sampled_ = now;
      rate_finished_ = finished;
    }
    rate = rate_;
  }
  const int64_t queued = queued_items_.load(std::memory_order_relaxed);
  const absl::Duration base = rate > 0 ? absl::Seconds(static_cast<double>(queued) / rate)
                                       : kDefaultRetryDelay;
  return JitteredRetryDelay(base);
}

void Admission::Return(uint64_t client, int64_t items, int64_t bytes) {
  queued_items_.fetch_sub(items, std::memory_order_relaxed);
  queued_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  finished_items_.fetch_add(items, std::memory_order_relaxed);
  if (options_.max_client_inflight <= 0) return;
  absl::MutexLock lock(&mu_);
  auto it = inflight_.find(client);
  if (it == inflight_.end()) return;
  if (--it->second <= 0) inflight_.erase(it);
}

Admission::Counts Admission::counts() const {
  return {queue_full_.load(std::memory_order_relaxed),
          client_limit_.load(std::memory_order_relaxed),
          deadline_drops_.load(std::memory_order_relaxed),
          client_gone_drops_.load(std::memory_order_relaxed),
          answers_unread_drops_.load(std::memory_order_relaxed)};
}

}  // namespace offload::ops
