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
// Optionally several caches share a `ByteBudget` (a global cap across per-key caches): an insert
// reserves its charge from the budget too, evicting this cache's oldest entries while the budget
// is short, and is skipped if it still does not fit.
//
// Thread-safety: every method may be called concurrently; each shard has its own mutex, and the
// visitor given to Lookup runs under that shard's lock (keep it short, never call back in).
#ifndef SERVICE_MEMO_LRU_CACHE_H_
#define SERVICE_MEMO_LRU_CACHE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
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
  uint64_t evictions = 0;  // entries pushed out by the bound (not erased by owner or Clear)
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t capacity_bytes = 0;
};

// A byte allowance shared by several caches. Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(size_t capacity) : capacity_(capacity) {}
  // Reserves `n` bytes if they fit.
  bool TryReserve(size_t n) {
    size_t used = used_.load(std::memory_order_relaxed);
    while (used + n <= capacity_) {
      if (used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  void Release(size_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  size_t used() const { return used_.load(std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  std::atomic<size_t> used_{0};
};

template <typename Value>
class LruCache {
 public:
  struct Options {
    size_t capacity_bytes = 16 << 20;
    int shards = 16;                 // rounded up to a power of two, at least 1
    ByteBudget* budget = nullptr;    // optional shared cap; must outlive the cache
    // true: least-recently-used (a hit moves the entry to the newest end). false: oldest-first
    // by insertion, the policy that failed the mobile app; kept only so that tests can show why.
    bool refresh_on_hit = true;
  };

  explicit LruCache(Options options) : options_(options) {
    size_t n = 1;
    while (n < static_cast<size_t>(options.shards > 0 ? options.shards : 1)) n <<= 1;
    shards_ = std::vector<Shard>(n);
    for (Shard& s : shards_) s.capacity = options.capacity_bytes / n;
  }
  ~LruCache() { Clear(); }
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
    if (options_.refresh_on_hit) shard.lru.splice(shard.lru.begin(), shard.lru, it->second);
    ++shard.hits;
    return true;
  }

  enum class InsertResult {
    kInserted,
    kTooLarge,  // larger than a shard's share of the bound: never fits
    kNoBudget,  // the shared budget is spent and this cache's shard had nothing left to evict
  };

  // Inserts (or replaces) `key`. Unless kInserted, `value` is dropped.
  InsertResult Insert(const Digest& key, uint64_t owner, Value value, size_t charge) {
    const size_t cost = EntryCost(charge);
    Shard& shard = ShardFor(key);
    std::list<Entry> dropped;  // destroyed (and wiped) after the lock is released
    absl::MutexLock lock(&shard.mu);
    if (cost > shard.capacity) return InsertResult::kTooLarge;
    if (auto it = shard.index.find(key); it != shard.index.end()) {
      RemoveLocked(shard, it->second, &dropped, /*eviction=*/false);
    }
    while (shard.bytes + cost > shard.capacity) EvictOldestLocked(shard, &dropped);
    if (options_.budget != nullptr) {
      while (!options_.budget->TryReserve(cost)) {
        if (shard.lru.empty()) return InsertResult::kNoBudget;
        EvictOldestLocked(shard, &dropped);
      }
    }
    shard.lru.push_front(Entry{key, owner, cost, std::move(value)});
    shard.index.emplace(key, shard.lru.begin());
    shard.bytes += cost;
    ++shard.inserts;
    return InsertResult::kInserted;
  }

  // Evicts least-recently-used entries (shard by shard) until at least `bytes` are freed or the
  // cache is empty. Returns the bytes freed. Used to make room in a shared budget.
  size_t EvictOldest(size_t bytes) {
    size_t freed = 0;
    for (Shard& shard : shards_) {
      std::list<Entry> dropped;
      absl::MutexLock lock(&shard.mu);
      while (freed < bytes && !shard.lru.empty()) {
        freed += shard.lru.back().cost;
        EvictOldestLocked(shard, &dropped);
      }
      if (freed >= bytes) break;
    }
    return freed;
  }

  size_t bytes() const {
    size_t total = 0;
    for (const Shard& shard : shards_) {
      absl::MutexLock lock(&shard.mu);
      total += shard.bytes;
    }
    return total;
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
    std::list<Entry> lru ABSL_GUARDED_BY(mu);  // newest first
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

  void RemoveLocked(Shard& shard, Iterator it, std::list<Entry>* dropped, bool eviction)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    shard.bytes -= it->cost;
    if (options_.budget != nullptr) options_.budget->Release(it->cost);
    if (eviction) ++shard.evictions;
    shard.index.erase(it->key);
    dropped->splice(dropped->end(), shard.lru, it);
  }

  void EvictOldestLocked(Shard& shard, std::list<Entry>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    RemoveLocked(shard, std::prev(shard.lru.end()), dropped, /*eviction=*/true);
  }

  const Options options_;
  std::vector<Shard> shards_;
};

}  // namespace offload::memo

#endif  // SERVICE_MEMO_LRU_CACHE_H_
