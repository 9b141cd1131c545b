// Unit tests of the client's memos (memo.h): least-recently-used eviction by bytes (a hit moves
// an entry to the newest end), honest charges, the maximum age on a test clock (the integration
// test sleeps past a real one), drops by key id and the generation that keeps answers in flight
// out after a drop, and the keyed digests.
#include "client/cpp/memo.h"

#include <sodium.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

class MemoTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_GE(sodium_init(), 0); }

  // A memo on the test clock `now_`.
  std::unique_ptr<Memo> Make(size_t capacity, absl::Duration max_age = absl::InfiniteDuration()) {
    MemoOptions o;
    o.capacity_bytes = capacity;
    o.max_age = max_age;
    o.clock = [this] {
      absl::MutexLock lock(&clock_mu_);
      return now_;
    };
    return std::make_unique<Memo>(o);
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    now_ += d;
  }
  Memo::Digest D(const std::string& name) const { return digester_.Open("k", name, ""); }
  bool Has(Memo& m, const std::string& name) {
    std::string v;
    return m.Lookup(D(name), &v, nullptr);
  }

  MemoDigester digester_;
  absl::Mutex clock_mu_;
  absl::Duration now_ ABSL_GUARDED_BY(clock_mu_) = absl::Hours(1);
};

TEST_F(MemoTest, LookupReturnsWhatWasInsertedAndCountsHitsAndMisses) {
  auto m = Make(1 << 20);
  std::string value;
  uint32_t version = 0;
  EXPECT_FALSE(m->Lookup(D("a"), &value, &version));
  EXPECT_TRUE(m->Insert(D("a"), "k", std::string("plain\0text", 10), 7, m->generation()));
  EXPECT_TRUE(m->Lookup(D("a"), &value, &version));
  EXPECT_EQ(value, std::string("plain\0text", 10));
  EXPECT_EQ(version, 7u);
  const MemoStats s = m->Stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.inserts, 1);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.capacity_bytes, 1 << 20);
}

TEST_F(MemoTest, ChargesValueKeyIdAndOverhead) {
  auto m = Make(1 << 20);
  EXPECT_GE(Memo::kEntryOverhead, sizeof(Memo::Digest) + 64);  // the digest and the links at least
  ASSERT_TRUE(m->Insert(D("a"), "key-id", std::string(100, 'x'), 1, m->generation()));
  ASSERT_TRUE(m->Insert(D("b"), "", "", 1, m->generation()));
  EXPECT_EQ(m->Stats().bytes,
            static_cast<int64_t>(Memo::EntryCost(100, 6) + Memo::EntryCost(0, 0)));
  EXPECT_EQ(Memo::EntryCost(100, 6), 106 + Memo::kEntryOverhead);
  // Replacing an entry charges the new value only, and is no eviction.
  ASSERT_TRUE(m->Insert(D("a"), "key-id", std::string(10, 'y'), 2, m->generation()));
  EXPECT_EQ(m->Stats().bytes,
            static_cast<int64_t>(Memo::EntryCost(10, 6) + Memo::EntryCost(0, 0)));
  EXPECT_EQ(m->Stats().entries, 2);
  EXPECT_EQ(m->Stats().evictions, 0);
}

// Room for exactly three entries: a hit on the oldest moves it to the newest end, so the next
// insert evicts the least recently used one, not the first inserted (which an oldest-first memo
// would drop).
TEST_F(MemoTest, EvictsTheLeastRecentlyUsedByBytes) {
  const size_t cost = Memo::EntryCost(1000, 1);
  auto m = Make(3 * cost + cost / 2);
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(m->Insert(D(name), "k", std::string(1000, name[0]), 1, m->generation()));
  }
  EXPECT_TRUE(Has(*m, "a"));  // a is now the most recently used
  ASSERT_TRUE(m->Insert(D("d"), "k", std::string(1000, 'd'), 1, m->generation()));
  EXPECT_EQ(m->Stats().evictions, 1);
  EXPECT_FALSE(Has(*m, "b"));
  EXPECT_TRUE(Has(*m, "a"));
  EXPECT_TRUE(Has(*m, "c"));
  EXPECT_TRUE(Has(*m, "d"));
  // Order now, oldest first: a, c, d. A larger entry pushes out as many as it needs, oldest first.
  ASSERT_TRUE(m->Insert(D("e"), "k", std::string(2000, 'e'), 1, m->generation()));
  EXPECT_FALSE(Has(*m, "a"));
  EXPECT_FALSE(Has(*m, "c"));
  EXPECT_TRUE(Has(*m, "d"));
  EXPECT_TRUE(Has(*m, "e"));
  EXPECT_EQ(m->Stats().evictions, 3);
  EXPECT_LE(m->Stats().bytes, static_cast<int64_t>(3 * cost + cost / 2));
}

TEST_F(MemoTest, AnEntryLargerThanTheBoundIsNotKept) {
  auto m = Make(Memo::EntryCost(100, 1));
  EXPECT_TRUE(m->Insert(D("fits"), "k", std::string(100, 'x'), 1, m->generation()));
  EXPECT_FALSE(m->Insert(D("big"), "k", std::string(101, 'x'), 1, m->generation()));
  EXPECT_TRUE(Has(*m, "fits"));  // nothing was evicted for an entry that could never fit
  EXPECT_FALSE(Has(*m, "big"));
}

// The byte bound holds whatever the sizes: a seeded random workload.
TEST_F(MemoTest, TheBoundHoldsUnderARandomWorkload) {
  const unsigned seed = 20240611;
  std::mt19937 rng(seed);
  const size_t capacity = 64 << 10;
  auto m = Make(capacity);
  for (int i = 0; i < 5000; ++i) {
    const std::string name = absl::StrCat(rng() % 400);
    if (rng() % 3 == 0) {
      Has(*m, name);
    } else {
      m->Insert(D(name), absl::StrCat("key-", rng() % 5), std::string(rng() % 4000, 'v'), 1,
                m->generation());
    }
    ASSERT_LE(m->Stats().bytes, static_cast<int64_t>(capacity)) << "seed " << seed << " step " << i;
  }
  EXPECT_GT(m->Stats().evictions, 0);
}

TEST_F(MemoTest, AnEntryPastItsMaximumAgeIsNeverUsed) {
  auto m = Make(1 << 20, absl::Seconds(10));
  ASSERT_TRUE(m->Insert(D("a"), "k", "x", 1, m->generation()));
  Advance(absl::Seconds(5));
  EXPECT_TRUE(Has(*m, "a"));  // a hit does not renew the age: it counts from the insert
  Advance(absl::Seconds(5) - absl::Nanoseconds(1));
  EXPECT_TRUE(Has(*m, "a"));
  Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(Has(*m, "a"));
  const MemoStats s = m->Stats();
  EXPECT_EQ(s.expired, 1);
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0);
  // Inserted again: a new age.
  ASSERT_TRUE(m->Insert(D("a"), "k", "x", 1, m->generation()));
  EXPECT_TRUE(Has(*m, "a"));
}

// Expired entries are removed (and their secrets wiped) by the next operation, whichever entry it
// is about.
TEST_F(MemoTest, ExpiredEntriesAreSweptByTheNextOperation) {
  auto m = Make(1 << 20, absl::Seconds(10));
  ASSERT_TRUE(m->Insert(D("a"), "k", "x", 1, m->generation()));
  Advance(absl::Seconds(6));
  ASSERT_TRUE(m->Insert(D("b"), "k", "y", 1, m->generation()));
  EXPECT_TRUE(Has(*m, "a"));  // a is now the most recently used, and still the oldest insert
  Advance(absl::Seconds(5));
  ASSERT_TRUE(m->Insert(D("c"), "k", "z", 1, m->generation()));
  MemoStats s = m->Stats();
  EXPECT_EQ(s.expired, 1);
  EXPECT_EQ(s.entries, 2);  // b and c
  Advance(absl::Seconds(10));
  EXPECT_FALSE(Has(*m, "zzz"));
  s = m->Stats();
  EXPECT_EQ(s.expired, 3);
  EXPECT_EQ(s.entries, 0);
}

TEST_F(MemoTest, DropOwnerDropsOneKeysEntriesAndKeepsAnswersInFlightOut) {
  auto m = Make(1 << 20);
  const uint64_t before = m->generation();
  ASSERT_TRUE(m->Insert(D("a1"), "alice", "1", 1, before));
  ASSERT_TRUE(m->Insert(D("a2"), "alice", "2", 1, before));
  ASSERT_TRUE(m->Insert(D("b1"), "bob", "3", 1, before));
  EXPECT_EQ(m->DropOwner("alice"), 2u);
  EXPECT_FALSE(Has(*m, "a1"));
  EXPECT_FALSE(Has(*m, "a2"));
  EXPECT_TRUE(Has(*m, "b1"));
  EXPECT_EQ(m->Stats().dropped, 2);
  // An answer whose RPC was sent before the drop is not remembered after it.
  EXPECT_FALSE(m->Insert(D("a3"), "alice", "4", 1, before));
  EXPECT_FALSE(Has(*m, "a3"));
  EXPECT_TRUE(m->Insert(D("a3"), "alice", "4", 1, m->generation()));
  m->Clear();
  EXPECT_FALSE(Has(*m, "b1"));
  EXPECT_FALSE(Has(*m, "a3"));
  EXPECT_EQ(m->Stats().entries, 0);
  EXPECT_EQ(m->Stats().bytes, 0);
  EXPECT_EQ(m->Stats().dropped, 4);
}

// A refusal about one key (say, an unknown id some caller keeps asking for) drops that key's
// entries only: answers for other keys that were on their way are still remembered. Before, one
// generation for the whole memo let such refusals keep every other key's answers out.
TEST_F(MemoTest, ADropOfAnotherKeyDoesNotKeepAnAnswerOut) {
  auto m = Make(1 << 20);
  const uint64_t before = m->generation();
  EXPECT_EQ(m->DropOwner("nokey"), 0u);
  EXPECT_EQ(m->DropOwner("other"), 0u);
  EXPECT_TRUE(m->Insert(D("a1"), "alice", "1", 1, before));
  EXPECT_TRUE(Has(*m, "a1"));
  // ...and a drop of its own key, or a Clear, still does.
  const uint64_t second = m->generation();
  m->DropOwner("alice");
  EXPECT_FALSE(m->Insert(D("a2"), "alice", "2", 1, second));
  EXPECT_TRUE(m->Insert(D("b1"), "bob", "3", 1, second));
  const uint64_t third = m->generation();
  m->Clear();
  EXPECT_FALSE(m->Insert(D("b2"), "bob", "4", 1, third));
  EXPECT_TRUE(m->Insert(D("b2"), "bob", "4", 1, m->generation()));
}

// The drops remembered per key id are bounded (the ids come from callers): past the bound the
// memo forgets them, and then every answer read before that is treated as stale - never one
// remembered across a drop of its own key.
TEST_F(MemoTest, ManyDroppedKeyIdsAreForgottenConservatively) {
  auto m = Make(1 << 20);
  const uint64_t before = m->generation();
  m->DropOwner("alice");
  for (int i = 0; i < 5000; ++i) m->DropOwner(absl::StrCat("unknown-", i));
  EXPECT_FALSE(m->Insert(D("a1"), "alice", "1", 1, before));
  EXPECT_FALSE(m->Insert(D("b1"), "bob", "1", 1, before));  // forgotten: stale too
  const uint64_t now = m->generation();
  m->DropOwner("unknown-x");
  EXPECT_TRUE(m->Insert(D("a1"), "alice", "1", 1, now));
  EXPECT_TRUE(Has(*m, "a1"));
}

// Without a test clock the maximum age runs on a clock that counts time asleep: on Linux,
// CLOCK_BOOTTIME (CLOCK_MONOTONIC, steady_clock's, stops during a suspend, so a resumed device
// would find its entries younger than they are). The clock chosen, and what it reads.
#ifdef CLOCK_BOOTTIME
TEST(MemoClockTest, TheDefaultClockIsTheBootClock) {
  EXPECT_EQ(Memo::SystemClockId(), CLOCK_BOOTTIME);
  timespec boot{};
  ASSERT_EQ(clock_gettime(CLOCK_BOOTTIME, &boot), 0);
  const absl::Duration memo = Memo::SystemClock();
  EXPECT_LT(absl::AbsDuration(memo - absl::DurationFromTimespec(boot)), absl::Milliseconds(100));
}
#endif

TEST_F(MemoTest, DigestsSeparateTheirInputs) {
  MemoDigester other;
  EXPECT_EQ(digester_.Open("k", "env", "ad"), digester_.Open("k", "env", "ad"));
  EXPECT_NE(digester_.Open("k", "env", "ad"), other.Open("k", "env", "ad"));  // keyed
  EXPECT_NE(digester_.Open("k", "env", "ad"), digester_.Open("k", "env", "ad2"));
  EXPECT_NE(digester_.Open("k", "enva", "d"), digester_.Open("k", "env", "ad"));  // lengths
  EXPECT_NE(digester_.Open("k", "env", ""), digester_.Open("k2", "env", ""));
  const std::string peer(32, '\7');
  EXPECT_NE(digester_.Derive("x", 0, v1::DERIVE_OUTPUT_RAW, peer),
            digester_.Derive("x", 1, v1::DERIVE_OUTPUT_RAW, peer));
  EXPECT_NE(digester_.Derive("x", 0, v1::DERIVE_OUTPUT_RAW, peer),
            digester_.Derive("x", 0, v1::DERIVE_OUTPUT_BOX_BEFORENM, peer));
  EXPECT_EQ(digester_.Derive("x", 0, v1::DERIVE_OUTPUT_RAW, peer),
            digester_.Derive("x", 0, v1::DERIVE_OUTPUT_UNSPECIFIED, peer));
  EXPECT_NE(digester_.Verify("pk", "sig", "m"), digester_.Verify("pk", "si", "gm"));
  // Domains: the same bytes as another operation's inputs name another entry.
  EXPECT_NE(digester_.Verify("k", "env", "ad"), digester_.Open("k", "env", "ad"));
}

// Many threads on one small memo (for the sanitizer builds): the bound and the counters hold.
TEST_F(MemoTest, ConcurrentUseKeepsTheBound) {
  const size_t capacity = 16 << 10;
  auto m = Make(capacity, absl::Seconds(30));
  std::atomic<int64_t> lookups{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      for (int i = 0; i < 3000; ++i) {
        const std::string name = absl::StrCat(rng() % 64);
        switch (rng() % 8) {
          case 0: m->DropOwner(absl::StrCat("key-", rng() % 4)); break;
          case 1: Advance(absl::Milliseconds(10)); break;
          case 2:
          case 3:
          case 4: {
            std::string v;
            m->Lookup(D(name), &v, nullptr);
            ++lookups;
            break;
          }
          default:
            m->Insert(D(name), absl::StrCat("key-", rng() % 4), std::string(rng() % 1500, 'v'),
                      1, m->generation());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const MemoStats s = m->Stats();
  EXPECT_LE(s.bytes, static_cast<int64_t>(capacity));
  EXPECT_EQ(s.hits + s.misses, lookups.load());
  EXPECT_EQ(s.inserts - s.evictions - s.expired - s.dropped, s.entries)
      << "every insert is either still there or was removed for one of the counted reasons";
}

}  // namespace
}  // namespace offload::client
