#include "service/memo/lru_cache.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace offload::memo {
namespace {

Digest D(uint64_t n) {
  Digest d{};
  // Spread `n` over the bytes the cache reads for its index and shard choice.
  for (int i = 0; i < 8; ++i) {
    d[i] = static_cast<uint8_t>(n >> (8 * i));
    d[8 + i] = static_cast<uint8_t>((n * 0x9E3779B97F4A7C15ull) >> (8 * i));
  }
  return d;
}

using StringCache = LruCache<std::string>;

bool Get(StringCache& cache, uint64_t n, std::string* out = nullptr) {
  return cache.Lookup(D(n), [&](const std::string& v) {
    if (out) *out = v;
    return true;
  });
}

TEST(LruCacheTest, HitMissAndCounters) {
  StringCache cache({1 << 20, 4, nullptr});
  EXPECT_FALSE(Get(cache, 1));
  EXPECT_EQ(cache.Insert(D(1), 7, "one", 3), StringCache::InsertResult::kInserted);
  std::string v;
  EXPECT_TRUE(Get(cache, 1, &v));
  EXPECT_EQ(v, "one");
  CacheStats s = cache.Stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.inserts, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, StringCache::EntryCost(3));
}

TEST(LruCacheTest, VisitorRejectionIsAMiss) {
  StringCache cache({1 << 20, 1, nullptr});
  cache.Insert(D(1), 0, "x", 1);
  EXPECT_FALSE(cache.Lookup(D(1), [](const std::string&) { return false; }));
  EXPECT_EQ(cache.Stats().misses, 1u);
  EXPECT_EQ(cache.Stats().hits, 0u);
}

// The mobile app's lesson: under a bound, a hit must move the entry to the newest end, so that
// a live entry outlasts entries that were inserted after it but never used again.
TEST(LruCacheTest, HitKeepsLiveEntryAheadOfSupersededOnes) {
  const size_t cost = StringCache::EntryCost(100);
  StringCache cache({3 * cost, 1, nullptr});  // room for exactly three entries
  cache.Insert(D(1), 0, std::string(100, 'a'), 100);
  cache.Insert(D(2), 0, std::string(100, 'b'), 100);
  cache.Insert(D(3), 0, std::string(100, 'c'), 100);
  ASSERT_TRUE(Get(cache, 1));                        // 1 is live again: newest
  cache.Insert(D(4), 0, std::string(100, 'd'), 100);  // evicts the oldest: 2, not 1
  EXPECT_TRUE(Get(cache, 1));
  EXPECT_FALSE(Get(cache, 2));
  EXPECT_TRUE(Get(cache, 3));
  EXPECT_TRUE(Get(cache, 4));
  EXPECT_EQ(cache.Stats().evictions, 1u);
}

TEST(LruCacheTest, ReplaceDoesNotDoubleCount) {
  StringCache cache({1 << 20, 1, nullptr});
  cache.Insert(D(1), 0, "aaaa", 4);
  cache.Insert(D(1), 0, "bb", 2);
  std::string v;
  ASSERT_TRUE(Get(cache, 1, &v));
  EXPECT_EQ(v, "bb");
  EXPECT_EQ(cache.Stats().entries, 1u);
  EXPECT_EQ(cache.Stats().bytes, StringCache::EntryCost(2));
}

TEST(LruCacheTest, OversizedEntryIsNotInserted) {
  StringCache cache({1000, 1, nullptr});
  EXPECT_EQ(cache.Insert(D(1), 0, std::string(2000, 'x'), 2000),
            StringCache::InsertResult::kTooLarge);
  EXPECT_EQ(cache.Stats().entries, 0u);
}

TEST(LruCacheTest, EraseOwnerDropsOnlyThatOwner) {
  StringCache cache({1 << 20, 8, nullptr});
  for (uint64_t i = 0; i < 100; ++i) cache.Insert(D(i), i % 2 == 0 ? 10 : 11, "v", 1);
  EXPECT_EQ(cache.EraseOwner(10), 50u);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(Get(cache, i), i % 2 == 1) << i;
  EXPECT_EQ(cache.Stats().entries, 50u);
  EXPECT_EQ(cache.Stats().evictions, 0u);
}

TEST(LruCacheTest, ByteBoundHoldsOverRandomInserts) {
  const uint32_t seed = 20261129;
  std::mt19937_64 rng(seed);
  const size_t capacity = 256 * 1024;
  StringCache cache({capacity, 8, nullptr});
  std::uniform_int_distribution<size_t> size(0, 8192);
  for (int i = 0; i < 10000; ++i) {
    const size_t n = size(rng);
    cache.Insert(D(rng()), 0, std::string(n, 'x'), n);
    CacheStats s = cache.Stats();
    ASSERT_LE(s.bytes, capacity) << "seed " << seed << " insert " << i;
  }
  CacheStats s = cache.Stats();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.inserts, s.entries + s.evictions) << "seed " << seed;
}

using Budget = StringCache::SharedBudget;

TEST(LruCacheTest, SharedBudgetCapsSeveralCaches) {
  const size_t cost = StringCache::EntryCost(1000);
  Budget budget(10 * cost);
  StringCache a({100 * cost, 1, &budget});
  StringCache b({100 * cost, 1, &budget});
  for (uint64_t i = 0; i < 8; ++i) a.Insert(D(i), 0, std::string(1000, 'a'), 1000);
  for (uint64_t i = 0; i < 8; ++i) b.Insert(D(100 + i), 0, std::string(1000, 'b'), 1000);
  EXPECT_EQ(budget.used(), 10 * cost);
  EXPECT_EQ(a.Stats().bytes + b.Stats().bytes, budget.used());
  // b's last six inserts took a's six least recently used entries, not b's own.
  EXPECT_EQ(a.Stats().entries, 2u);
  EXPECT_EQ(a.Stats().evictions, 6u);
  EXPECT_EQ(b.Stats().entries, 8u);
  EXPECT_EQ(b.Stats().evictions, 0u);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_FALSE(Get(a, i)) << i;
  EXPECT_TRUE(Get(a, 6));
  EXPECT_TRUE(Get(a, 7));
  a.Clear();
  EXPECT_EQ(budget.used(), b.Stats().bytes);
}

// The budget's order is recency across caches: a hit in one cache keeps its entry ahead of
// entries of other caches that were inserted later but not used since.
TEST(LruCacheTest, SharedBudgetEvictsLeastRecentlyUsedOfAnyCache) {
  const size_t cost = StringCache::EntryCost(100);
  Budget budget(4 * cost);
  StringCache a({100 * cost, 1, &budget});
  StringCache b({100 * cost, 4, &budget});  // several shards in one member cache, too
  a.Insert(D(1), 0, std::string(100, 'a'), 100);
  b.Insert(D(2), 0, std::string(100, 'b'), 100);
  a.Insert(D(3), 0, std::string(100, 'a'), 100);
  b.Insert(D(4), 0, std::string(100, 'b'), 100);
  ASSERT_TRUE(Get(a, 1));  // recency now, oldest first: 2 3 4 1
  b.Insert(D(5), 0, std::string(100, 'b'), 100);  // evicts 2
  a.Insert(D(6), 0, std::string(100, 'a'), 100);  // evicts 3
  ASSERT_TRUE(Get(b, 4));                          // 1 5 6 4
  a.Insert(D(7), 0, std::string(100, 'a'), 100);  // evicts 1
  EXPECT_FALSE(Get(b, 2));
  EXPECT_FALSE(Get(a, 3));
  EXPECT_FALSE(Get(a, 1));
  EXPECT_TRUE(Get(b, 4));
  EXPECT_TRUE(Get(b, 5));
  EXPECT_TRUE(Get(a, 6));
  EXPECT_TRUE(Get(a, 7));
  EXPECT_EQ(a.Stats().evictions + b.Stats().evictions, 3u);
  EXPECT_EQ(budget.used(), 4 * cost);
}

// A cache over its own bound evicts its own oldest entry first, even when another cache holds
// older entries; the budget then has room and nothing else goes.
TEST(LruCacheTest, OwnBoundIsEnforcedBeforeTheSharedBudget) {
  const size_t cost = StringCache::EntryCost(100);
  Budget budget(4 * cost);
  StringCache idle({100 * cost, 1, &budget});
  StringCache busy({2 * cost, 1, &budget});
  idle.Insert(D(1), 0, std::string(100, 'i'), 100);
  idle.Insert(D(2), 0, std::string(100, 'i'), 100);
  busy.Insert(D(3), 0, std::string(100, 'b'), 100);
  busy.Insert(D(4), 0, std::string(100, 'b'), 100);  // budget full
  busy.Insert(D(5), 0, std::string(100, 'b'), 100);  // over busy's bound: 3 goes, not 1
  EXPECT_TRUE(Get(idle, 1));
  EXPECT_TRUE(Get(idle, 2));
  EXPECT_FALSE(Get(busy, 3));
  EXPECT_EQ(busy.Stats().entries, 2u);
  EXPECT_EQ(busy.Stats().evictions, 1u);
  EXPECT_EQ(idle.Stats().evictions, 0u);
  EXPECT_EQ(budget.used(), 4 * cost);
}

TEST(LruCacheTest, EntryLargerThanTheSharedBudgetIsNotInserted) {
  const size_t cost = StringCache::EntryCost(1000);
  Budget budget(2 * cost);
  StringCache a({100 * cost, 1, &budget});
  ASSERT_EQ(a.Insert(D(1), 0, std::string(1000, 'a'), 1000), StringCache::InsertResult::kInserted);
  EXPECT_EQ(a.Insert(D(2), 0, std::string(3000, 'a'), 3000), StringCache::InsertResult::kTooLarge);
  EXPECT_TRUE(Get(a, 1));  // nothing was evicted for it
  EXPECT_EQ(budget.used(), cost);
}

TEST(LruCacheTest, DestroyedMemberGivesBackItsBytes) {
  const size_t cost = StringCache::EntryCost(10);
  Budget budget(3 * cost);
  StringCache kept({100 * cost, 2, &budget});
  {
    StringCache gone({100 * cost, 2, &budget});
    gone.Insert(D(1), 0, "0123456789", 10);
    gone.Insert(D(2), 0, "0123456789", 10);
    EXPECT_EQ(budget.used(), 2 * cost);
  }
  EXPECT_EQ(budget.used(), 0u);
  for (uint64_t i = 0; i < 5; ++i) kept.Insert(D(10 + i), 0, "0123456789", 10);
  EXPECT_EQ(kept.Stats().entries, 3u);
  EXPECT_EQ(kept.Stats().evictions, 2u);
}

// Threads insert into and look up in caches that share one budget, while other threads clear,
// erase by owner, and destroy and replace whole member caches. Run under ThreadSanitizer too.
// Checks every hit returns its own value, and that at rest the budget equals the entries' bytes.
TEST(LruCacheTest, SharedBudgetUnderConcurrency) {
  const uint32_t seed = 777001;
  const size_t cost = StringCache::EntryCost(64);
  Budget budget(24 * cost);
  absl::Mutex mu;
  std::vector<std::shared_ptr<StringCache>> caches(4);
  for (auto& c : caches) c = std::make_shared<StringCache>(StringCache::Options{10 * cost, 2, &budget});
  auto value_of = [](uint64_t n) { return std::string(64, static_cast<char>('a' + n % 26)); };
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < 4000; ++i) {
        const size_t slot = rng() % caches.size();
        std::shared_ptr<StringCache> cache;
        {
          absl::MutexLock lock(&mu);
          if (t == 0 && rng() % 200 == 0) {
            caches[slot] = std::make_shared<StringCache>(StringCache::Options{10 * cost, 2, &budget});
          }
          cache = caches[slot];
        }
        const uint64_t n = rng() % 64;
        std::string got;
        if (Get(*cache, n, &got)) {
          if (got != value_of(n)) wrong.fetch_add(1);
        } else {
          cache->Insert(D(n), n % 3, value_of(n), 64);
        }
        if (t == 1 && rng() % 500 == 0) cache->Clear();
        if (t == 2 && rng() % 300 == 0) cache->EraseOwner(rng() % 3);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "seed " << seed;
  size_t bytes = 0;
  for (auto& c : caches) bytes += c->Stats().bytes;
  EXPECT_EQ(budget.used(), bytes) << "seed " << seed;
  EXPECT_LE(bytes, budget.capacity());
  caches.clear();
  EXPECT_EQ(budget.used(), 0u);
}

// The replay that sank the mobile app's first memo: 27 slots of 55 KB read round after round
// under a bound that holds all of them. Every round after the first must hit every time.
TEST(LruCacheTest, ReplayOf27SlotsHitsAfterFirstRound) {
  const size_t blob = 55 * 1024;
  StringCache cache({27 * StringCache::EntryCost(blob), 1, nullptr});
  int misses = 0;
  for (int round = 0; round < 5; ++round) {
    for (uint64_t slot = 0; slot < 27; ++slot) {
      if (!Get(cache, slot)) {
        ++misses;
        cache.Insert(D(slot), 0, std::string(blob, 's'), blob);
      }
    }
  }
  EXPECT_EQ(misses, 27);
}

// The mobile app's read-state replay: 27 live slots read on every resume; between resumes the app
// rewrites its 5 busiest slots (Seal records the new ciphertexts; the old ones are superseded and
// never read again), while the other 22 stay as they are. The bound holds the live set plus one round of rewrites. Returns the misses of resumes
// 2..20 (the first resume fills the cache).
int ReplayMisses(bool refresh_on_hit) {
  const size_t blob = 55 * 1024;
  StringCache cache({33 * StringCache::EntryCost(blob), 1, nullptr, refresh_on_hit});
  std::vector<uint64_t> slot_version(27);
  for (uint64_t s = 0; s < 27; ++s) slot_version[s] = s;  // digest id of each slot's ciphertext
  uint64_t next_id = 1000;
  int misses = 0;
  for (int resume = 0; resume < 20; ++resume) {
    for (uint64_t s = 0; s < 27; ++s) {
      if (!Get(cache, slot_version[s])) {
        if (resume > 0) ++misses;
        cache.Insert(D(slot_version[s]), 0, std::string(blob, 'p'), blob);
      }
    }
    for (int w = 0; w < 5; ++w) {
      const uint64_t s = w;
      slot_version[s] = next_id++;
      cache.Insert(D(slot_version[s]), 0, std::string(blob, 'n'), blob);  // Seal's record
    }
  }
  return misses;
}

TEST(LruCacheTest, LruServesEveryResumeFromMemo) { EXPECT_EQ(ReplayMisses(true), 0); }

TEST(LruCacheTest, OldestFirstPolicyFailsTheSameReplay) {
  // Oldest-first evicts live slots that were inserted long ago, while superseded ciphertexts
  // that will never be read again stay: the same trace misses again and again.
  const int misses = ReplayMisses(false);
  EXPECT_GT(misses, 19 * 5) << "oldest-first should miss at least 5 live slots per resume";
}

}  // namespace
}  // namespace offload::memo
