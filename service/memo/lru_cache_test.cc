#include "service/memo/lru_cache.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

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

TEST(LruCacheTest, SharedBudgetCapsSeveralCaches) {
  const size_t cost = StringCache::EntryCost(1000);
  ByteBudget budget(10 * cost);
  StringCache a({100 * cost, 1, &budget});
  StringCache b({100 * cost, 1, &budget});
  for (uint64_t i = 0; i < 8; ++i) a.Insert(D(i), 0, std::string(1000, 'a'), 1000);
  for (uint64_t i = 0; i < 8; ++i) b.Insert(D(100 + i), 0, std::string(1000, 'b'), 1000);
  EXPECT_LE(budget.used(), budget.capacity());
  EXPECT_EQ(a.Stats().bytes + b.Stats().bytes, budget.used());
  // b had to evict its own oldest entries to fit under the shared cap.
  EXPECT_EQ(a.Stats().entries, 8u);
  EXPECT_EQ(b.Stats().entries, 2u);
  a.Clear();
  EXPECT_EQ(budget.used(), b.Stats().bytes);
}

TEST(LruCacheTest, NoBudgetIsReportedAndEvictOldestMakesRoom) {
  const size_t cost = StringCache::EntryCost(1000);
  ByteBudget budget(2 * cost);
  StringCache a({100 * cost, 1, &budget});
  StringCache b({100 * cost, 1, &budget});
  ASSERT_EQ(a.Insert(D(1), 0, std::string(1000, 'a'), 1000), StringCache::InsertResult::kInserted);
  ASSERT_EQ(a.Insert(D(2), 0, std::string(1000, 'a'), 1000), StringCache::InsertResult::kInserted);
  EXPECT_EQ(b.Insert(D(3), 0, std::string(1000, 'b'), 1000), StringCache::InsertResult::kNoBudget);
  EXPECT_EQ(a.EvictOldest(cost), cost);
  EXPECT_FALSE(Get(a, 1));  // the older one went
  EXPECT_TRUE(Get(a, 2));
  EXPECT_EQ(b.Insert(D(3), 0, std::string(1000, 'b'), 1000), StringCache::InsertResult::kInserted);
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
