// A sharded, byte-bounded, least-recently-used cache: the building block of every memo cache.
//
//   LruCache<SecretBytes> cache({.capacity_bytes = 16 << 20, .shards = 16});
//   cache.Insert(digest, owner, std::move(shared_key), /*charge=*/32);
//   bool hit = cache.Lookup(digest, [&](const SecretBytes& v) { Copy(v); return true; });
//
// Keys are 32-byte digests that the caller computes with a keyed hash (memo/hasher.h), never raw
// material. Each entry also carries an `owner` tag (a key id's tag) so that all entries of one
// managed key can be dropped at once. The cache keeps, per shard, entries in recency order: a hit
// moves the entry to the newest end; an insert that would exceed the shard's share of the bound
// evicts from the oldest end first. An entry is charged `charge` (the bytes its value holds) plus
// the digest and a fixed per-entry overhead, so the byte bound counts what the entry really costs.
// Values are destroyed on eviction (a SecretBytes value is wiped then).
//
// Optionally several caches share a `SharedBudget`, a global byte cap over all of them (the open
// memo's cap across its per-key caches) that keeps one least-recently-used order across them: an
// entry of a budgeted cache carries a stamp from the budget's clock, taken when it is inserted and
// on every hit, so that the entry with the smallest stamp is the least recently used of all. An
// insert first enforces its own shard's bound (evicting that shard's oldest entries), then, while
// the budget is short, evicts the least recently used entry of any member cache. An idle cache
// therefore never keeps room that an active one needs.
//
// Thread-safety: every method may be called concurrently; each shard has its own mutex, and the
// visitor given to Lookup runs under that shard's lock (keep it short, never call back in). A hit
// in a budgeted cache also takes one stamp (an atomic increment) from the budget's clock; only an
// insert that finds the budget spent takes the budget's mutex (before a shard's, never inside one).
#ifndef SERVICE_MEMO_LRU_CACHE_H_
#define SERVICE_MEMO_LRU_CACHE_H_

#include <array>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <list>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace offload::memo {

using Digest = std::array<uint8_t, 32>;

struct CacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t inserts = 0;
  uint64_t evictions = 0;  // entries pushed out by a bound (not erased by owner or Clear)
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t capacity_bytes = 0;
};

template <typename Value>
class LruCache {
 public:
  class SharedBudget;  // defined below

  struct Options {
    size_t capacity_bytes = 16 << 20;
    int shards = 16;                 // rounded up to a power of two, at least 1
    SharedBudget* budget = nullptr;  // optional global cap over several caches; must outlive them
    // true: least-recently-used (a hit moves the entry to the newest end). false: oldest-first
    // by insertion, the policy that failed the mobile app; kept only so that tests can show why.
    bool refresh_on_hit = true;
  };

  explicit LruCache(Options options) : options_(options) {
    size_t n = 1;
    while (n < static_cast<size_t>(options.shards > 0 ? options.shards : 1)) n <<= 1;
    shards_ = std::vector<Shard>(n);
    for (Shard& s : shards_) {
      s.capacity = options.capacity_bytes / n;
      s.budget = options.budget;
      if (s.budget != nullptr) s.budget->Join(&s);
    }
  }
  ~LruCache() {
    if (options_.budget != nullptr) {
      for (Shard& s : shards_) options_.budget->Leave(&s);
    }
    Clear();
  }
  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // Bytes an entry of `charge` value bytes costs against the bound.
  static constexpr size_t EntryCost(size_t charge) { return charge + kEntryOverhead; }

  // If `key` is present, calls `visit(const Value&)`; a visitor returning true makes it a hit
  // (the entry moves to the newest end), false a miss (the entry is left where it is: e.g. the
  // caller found that the full input differs). Returns whether it was a hit.
  template <typename Visit>
  bool Lookup(const Digest& key, Visit&& visit) {
    Shard& shard = ShardFor(key);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end() || !visit(static_cast<const Value&>(it->second->value))) {
      ++shard.misses;
      return false;
    }
    if (options_.refresh_on_hit) {
      shard.lru.splice(shard.lru.begin(), shard.lru, it->second);
      if (shard.budget != nullptr) it->second->stamp = shard.budget->NextStamp();
    }
    ++shard.hits;
    return true;
  }

  enum class InsertResult {
    kInserted,
    kTooLarge,  // larger than a shard's share of the bound, or than the shared budget: never fits
    kNoBudget,  // the shared budget is held by inserts still in flight: nothing left to evict
  };

  // Inserts (or replaces) `key`. Unless kInserted, `value` is dropped. Makes room by evicting
  // this shard's oldest entries while the shard is over its bound, then, with a shared budget,
  // the least recently used entries of any member cache while the budget is short.
  InsertResult Insert(const Digest& key, uint64_t owner, Value value, size_t charge) {
    const size_t cost = EntryCost(charge);
    Shard& shard = ShardFor(key);
    SharedBudget* const budget = shard.budget;
    std::list<Entry> dropped;  // destroyed (and wiped) after every lock is released
    if (cost > shard.capacity || (budget != nullptr && cost > budget->capacity())) {
      return InsertResult::kTooLarge;
    }
    {
      absl::MutexLock lock(&shard.mu);
      MakeRoomLocked(shard, key, cost, &dropped);  // this shard's own bound first
      if (budget == nullptr || budget->TryReserve(cost)) {
        PushLocked(shard, key, owner, cost, std::move(value));
        return InsertResult::kInserted;
      }
    }
    // The total is spent. The shard's lock is released: evicting takes the budget's lock, then
    // the lock of the shard that holds the least recently used entry (maybe this one).
    do {
      if (!budget->EvictOldest(&dropped)) return InsertResult::kNoBudget;
    } while (!budget->TryReserve(cost));
    absl::MutexLock lock(&shard.mu);
    // Again: another insert may have come into this shard meanwhile (a no-op otherwise). The
    // budget is already reserved, so only the shard's own bound is checked.
    MakeRoomLocked(shard, key, cost, &dropped);
    PushLocked(shard, key, owner, cost, std::move(value));
    return InsertResult::kInserted;
  }

  // Drops every entry tagged `owner`. Returns how many.
  size_t EraseOwner(uint64_t owner) {
    size_t erased = 0;
    for (Shard& shard : shards_) {
      std::list<Entry> dropped;
      absl::MutexLock lock(&shard.mu);
      for (auto it = shard.lru.begin(); it != shard.lru.end();) {
        auto next = std::next(it);
        if (it->owner == owner) {
          RemoveLocked(shard, it, &dropped, /*eviction=*/false);
          ++erased;
        }
        it = next;
      }
    }
    return erased;
  }

  void Clear() {
    for (Shard& shard : shards_) {
      std::list<Entry> dropped;
      absl::MutexLock lock(&shard.mu);
      while (!shard.lru.empty()) RemoveLocked(shard, std::prev(shard.lru.end()), &dropped, false);
    }
  }

  CacheStats Stats() const {
    CacheStats total;
    for (const Shard& shard : shards_) {
      absl::MutexLock lock(&shard.mu);
      total.hits += shard.hits;
      total.misses += shard.misses;
      total.inserts += shard.inserts;
      total.evictions += shard.evictions;
      total.entries += shard.lru.size();
      total.bytes += shard.bytes;
    }
    total.capacity_bytes = options_.capacity_bytes;
    return total;
  }

  size_t shard_count() const { return shards_.size(); }

 private:
  struct Entry {
    Digest key;
    uint64_t owner;
    size_t cost;
    uint64_t stamp;  // the budget's clock at insert or last hit; 0 without a budget
    Value value;
  };
  using Iterator = typename std::list<Entry>::iterator;

  struct DigestHash {
    size_t operator()(const Digest& d) const {
      size_t h;
      std::memcpy(&h, d.data(), sizeof(h));
      return h;
    }
  };

  struct Shard {
    mutable absl::Mutex mu;
    size_t capacity = 0;
    SharedBudget* budget = nullptr;  // set at construction, then constant
    // Newest first. With a budget, stamps decrease from front to back: every stamp is taken
    // under `mu` from one clock, so a later push or hit always has a larger one.
    std::list<Entry> lru ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<Digest, Iterator, DigestHash> index ABSL_GUARDED_BY(mu);
    size_t bytes ABSL_GUARDED_BY(mu) = 0;
    uint64_t hits ABSL_GUARDED_BY(mu) = 0;
    uint64_t misses ABSL_GUARDED_BY(mu) = 0;
    uint64_t inserts ABSL_GUARDED_BY(mu) = 0;
    uint64_t evictions ABSL_GUARDED_BY(mu) = 0;
  };

  // What an entry costs besides its value's own heap bytes: the list node (the Entry and two
  // links) in a malloc chunk (16 bytes of bookkeeping), and index slots (digest + iterator; a
  // flat_hash_map keeps between 7/16 and 7/8 of its slots full, so count two per entry).
  // Measured with memo_flood (tests/bench): RSS growth / bound close to 1 with this charge.
  static constexpr size_t kEntryOverhead =
      sizeof(Entry) + 2 * sizeof(void*) + 16 + 2 * (sizeof(Digest) + sizeof(Iterator));

  Shard& ShardFor(const Digest& key) {
    uint64_t h;
    std::memcpy(&h, key.data() + 8, sizeof(h));
    return shards_[h & (shards_.size() - 1)];
  }

  static void RemoveLocked(Shard& shard, Iterator it, std::list<Entry>* dropped, bool eviction)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    shard.bytes -= it->cost;
    if (shard.budget != nullptr) shard.budget->Release(it->cost);
    if (eviction) ++shard.evictions;
    shard.index.erase(it->key);
    dropped->splice(dropped->end(), shard.lru, it);
  }

  static void EvictOldestLocked(Shard& shard, std::list<Entry>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    RemoveLocked(shard, std::prev(shard.lru.end()), dropped, /*eviction=*/true);
  }

  // Removes `key` if present (a replacement, not an eviction), then evicts the shard's oldest
  // entries until `cost` more bytes fit its bound. REQUIRES: `cost <= shard.capacity`.
  static void MakeRoomLocked(Shard& shard, const Digest& key, size_t cost,
                             std::list<Entry>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    if (auto it = shard.index.find(key); it != shard.index.end()) {
      RemoveLocked(shard, it->second, dropped, /*eviction=*/false);
    }
    while (shard.bytes + cost > shard.capacity) EvictOldestLocked(shard, dropped);
  }

  static void PushLocked(Shard& shard, const Digest& key, uint64_t owner, size_t cost, Value value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    const uint64_t stamp = shard.budget != nullptr ? shard.budget->NextStamp() : 0;
    shard.lru.push_front(Entry{key, owner, cost, stamp, std::move(value)});
    shard.index.emplace(key, shard.lru.begin());
    shard.bytes += cost;
    ++shard.inserts;
  }

  const Options options_;
  std::vector<Shard> shards_;
};

// A byte allowance shared by several LruCache<Value> (their Options.budget), with one
// least-recently-used order across all their shards. Each member shard is listed under a stamp
// that is never larger than the stamp of its oldest entry (the stamps of a shard's oldest entry
// only grow: a hit gives a larger one, a removal uncovers a newer entry, and an empty shard's next
// entry takes a stamp from the clock's future), so the smallest listed stamp is a lower bound of
// every entry's stamp. Evicting takes the shard listed first: if its oldest entry carries the
// listed stamp, that entry is the least recently used of all and goes; otherwise the shard is
// listed again under its true stamp and the next one is tried. Hits never touch the list.
//
// Thread-safety: thread-safe. Lock order: the budget's mutex, then one shard's mutex.
// REQUIRES: every cache that uses the budget is destroyed before it.
template <typename Value>
class LruCache<Value>::SharedBudget {
 public:
  explicit SharedBudget(size_t capacity) : capacity_(capacity) {}
  ~SharedBudget() { assert(members_.empty()); }
  SharedBudget(const SharedBudget&) = delete;
  SharedBudget& operator=(const SharedBudget&) = delete;

  // Bytes held by member caches' entries, plus those reserved by inserts in flight.
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

 private:
  friend class LruCache<Value>;

  // Reserves `n` bytes if they fit.
  bool TryReserve(size_t n) {
    size_t used = used_.load(std::memory_order_relaxed);
    while (used + n <= capacity_) {
      if (used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  void Release(size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }

  // Called under a member shard's lock, so that a shard's stamps grow in its recency order
  // (one atomic variable: later read-modify-writes always return larger values).
  uint64_t NextStamp() { return clock_.fetch_add(1, std::memory_order_relaxed); }

  // REQUIRES: `shard` is empty, not yet reachable by other threads, and not a member.
  void Join(Shard* shard) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const uint64_t stamp = clock_.load(std::memory_order_relaxed);
    members_[shard] = stamp;
    order_.emplace(stamp, shard);
  }

  // After this returns, the budget never touches `shard` again.
  void Leave(Shard* shard) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(shard);
    if (it == members_.end()) return;
    order_.erase({it->second, shard});
    members_.erase(it);
  }

  // Evicts the least recently used entry of all member shards into `dropped`. Returns false if
  // every member shard was found empty. REQUIRES: the caller holds no shard's lock.
  bool EvictOldest(std::list<Entry>* dropped) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    size_t empty_in_a_row = 0;
    while (!order_.empty() && empty_in_a_row < order_.size()) {
      // Taken out and put back under the shard's stamp now; the node is reused (no allocation).
      auto node = order_.extract(order_.begin());
      const uint64_t listed = node.value().first;
      Shard* const shard = node.value().second;
      bool evicted = false;
      uint64_t stamp;
      {
        absl::MutexLock shard_lock(&shard->mu);
        if (shard->lru.empty()) {
          ++empty_in_a_row;
        } else {
          empty_in_a_row = 0;
          // No listed stamp is smaller, and each is a lower bound of its shard's entries.
          if (shard->lru.back().stamp <= listed) {
            EvictOldestLocked(*shard, dropped);
            evicted = true;
          }
        }
        // An empty shard's next entry will take a stamp of at least the clock's value now.
        stamp = shard->lru.empty() ? clock_.load(std::memory_order_relaxed)
                                   : shard->lru.back().stamp;
      }
      node.value().first = members_[shard] = stamp;
      order_.insert(std::move(node));
      if (evicted) return true;
    }
    return false;
  }

  const size_t capacity_;
  std::atomic<size_t> used_{0};
  std::atomic<uint64_t> clock_{1};
  absl::Mutex mu_;
  // Member shards by listed stamp (ties broken by address), and each member's listed stamp.
  std::set<std::pair<uint64_t, Shard*>> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Shard*, uint64_t> members_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::memo

#endif  // SERVICE_MEMO_LRU_CACHE_H_
