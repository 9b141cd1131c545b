#include "service/memo/memo.h"

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iterator>
#include <list>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace offload::memo {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t fill) { return std::vector<uint8_t>(n, fill); }

class MemoTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GE(sodium_init(), 0); }
};

TEST_F(MemoTest, VerifyCachesOnlyWhatIsInserted) {
  Memo memo(MemoOptions{});
  auto pk = Bytes(32, 1), sig = Bytes(64, 2), msg = Bytes(64, 3);
  Digest d = memo.VerifyDigest(pk, sig, msg);
  EXPECT_FALSE(memo.VerifyHit(d));
  memo.VerifyInsert(d);
  EXPECT_TRUE(memo.VerifyHit(d));
  // Any change to any input is another digest.
  auto msg2 = msg;
  msg2[63] ^= 1;
  EXPECT_FALSE(memo.VerifyHit(memo.VerifyDigest(pk, sig, msg2)));
  // Moving a byte from one part to the next is another digest too (length prefixes).
  std::vector<uint8_t> a = {1, 2}, b = {3}, c = {1}, e = {2, 3};
  EXPECT_NE(memo.VerifyDigest(a, b, msg), memo.VerifyDigest(c, e, msg));
}

TEST_F(MemoTest, DigestsAreSaltedPerProcessInstance) {
  Memo m1(MemoOptions{}), m2(MemoOptions{});
  auto pk = Bytes(32, 1), sig = Bytes(64, 2), msg = Bytes(8, 3);
  EXPECT_NE(m1.VerifyDigest(pk, sig, msg), m2.VerifyDigest(pk, sig, msg));
}

TEST_F(MemoTest, DeriveIsPerInstanceAndOutput) {
  Memo memo(MemoOptions{});
  auto peer = Bytes(32, 9), shared = Bytes(32, 0x5a);
  Digest raw = memo.DeriveDigest(/*instance=*/1, /*output=*/1, peer);
  memo.DeriveInsert(raw, "k", shared);
  std::vector<uint8_t> out(32);
  EXPECT_TRUE(memo.DeriveLookup(raw, absl::MakeSpan(out)));
  EXPECT_EQ(out, shared);
  EXPECT_FALSE(memo.DeriveLookup(memo.DeriveDigest(2, 1, peer), absl::MakeSpan(out)));
  EXPECT_FALSE(memo.DeriveLookup(memo.DeriveDigest(1, 2, peer), absl::MakeSpan(out)));
  memo.DropKey("k");
  EXPECT_FALSE(memo.DeriveLookup(raw, absl::MakeSpan(out)));
  EXPECT_EQ(memo.derive_stats().entries, 0u);
}

TEST_F(MemoTest, OpenHitNeedsByteIdenticalCiphertext) {
  Memo memo(MemoOptions{});
  auto nonce = Bytes(24, 1), aad = Bytes(3, 7), pt = Bytes(100, 'p');
  auto ct = Bytes(116, 0xc7);
  Digest d = memo.OpenDigest(5, nonce, ct, aad);
  memo.OpenInsert("k", d, ct, pt);
  std::string out;
  ASSERT_TRUE(memo.OpenLookup("k", d, ct, &out));
  EXPECT_EQ(out, std::string(100, 'p'));
  // Same nonce, tag and length but a changed body: same digest, yet no hit.
  auto tampered = ct;
  tampered[10] ^= 1;
  EXPECT_EQ(memo.OpenDigest(5, nonce, tampered, aad), d);
  EXPECT_FALSE(memo.OpenLookup("k", d, tampered, &out));
  // Other AAD or another key version: another digest.
  EXPECT_NE(memo.OpenDigest(5, nonce, ct, Bytes(3, 8)), d);
  EXPECT_NE(memo.OpenDigest(6, nonce, ct, aad), d);
  // Another key id has its own cache, and a lookup there is a counted miss.
  const uint64_t misses = memo.open_stats().misses;
  EXPECT_FALSE(memo.OpenLookup("other", d, ct, &out));
  EXPECT_EQ(memo.open_stats().misses, misses + 1);
}

// The zero-copy insert and lookup: the entry keeps the stored bytes it was given (a whole
// envelope, the ciphertext at an offset) and shares the plaintext buffer; a hit hands out that
// buffer, which outlives the entry while referenced.
TEST_F(MemoTest, SharedOpenEntryHandsOutItsBufferWithoutACopy) {
  Memo memo(MemoOptions{});
  auto nonce = Bytes(12, 1), aad = Bytes(3, 7);
  auto ct = Bytes(1016, 0xc7);
  std::string envelope(17, 'h');
  envelope.append(reinterpret_cast<const char*>(ct.data()), ct.size());
  std::shared_ptr<WipedBuffer> pt = WipedBuffer::Make(1000);
  std::memset(pt->data(), 'p', pt->size());
  const uint8_t* bytes = pt->data();
  Digest d = memo.OpenDigest(5, nonce, ct, aad);
  memo.OpenInsert("k", d, envelope, 17, pt);
  pt.reset();
  EXPECT_EQ(memo.open_stats().bytes, Memo::OpenEntryCost(envelope.size(), 1000));
  SharedPlaintext hit;
  ASSERT_TRUE(memo.OpenLookup("k", d, ct, &hit));
  EXPECT_EQ(hit->data(), bytes);
  EXPECT_EQ(hit->size(), 1000u);
  // The stored header is not part of the compared ciphertext.
  SharedPlaintext other;
  const auto whole =
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(envelope.data()), envelope.size());
  EXPECT_FALSE(memo.OpenLookup("k", d, whole, &other));
  auto tampered = ct;
  tampered[500] ^= 1;
  EXPECT_FALSE(memo.OpenLookup("k", d, tampered, &other));
  EXPECT_EQ(other, nullptr);
  // Dropped from the memo, the plaintext stays readable for the response still holding it.
  memo.DropKey("k");
  EXPECT_FALSE(memo.OpenLookup("k", d, ct, &other));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(hit->data()), hit->size()),
            std::string(1000, 'p'));
}

TEST_F(MemoTest, OpenCacheIsBoundedPerKeyAndInAll) {
  MemoOptions options;
  options.open_bytes_per_key = 1 << 20;
  options.open_bytes_total = 3 << 20;
  options.shards = 4;
  Memo memo(options);
  auto nonce = Bytes(24, 0), aad = Bytes(0, 0), blob = Bytes(40000, 1);
  for (int key = 0; key < 6; ++key) {
    for (uint64_t i = 0; i < 100; ++i) {
      auto ct = blob;
      ct[0] = static_cast<uint8_t>(i);
      ct[1] = static_cast<uint8_t>(key);
      memo.OpenInsert("key" + std::to_string(key), memo.OpenDigest(key * 1000 + i, nonce, ct, aad),
                      ct, blob);
      ASSERT_LE(memo.open_stats().bytes, options.open_bytes_total);
    }
  }
  CacheStats s = memo.open_stats();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_LE(s.bytes, options.open_bytes_total);
}

TEST_F(MemoTest, KeysSeenLaterStillGetRoomInTheSharedOpenBudget) {
  MemoOptions options;
  options.open_bytes_per_key = 1 << 20;
  options.open_bytes_total = 2 << 20;
  Memo memo(options);
  auto nonce = Bytes(24, 0), blob = Bytes(40000, 1);
  auto insert = [&](const std::string& key_id, uint64_t instance) {
    auto ct = blob;
    ct[0] = static_cast<uint8_t>(instance);
    Digest d = memo.OpenDigest(instance, nonce, ct, {});
    memo.OpenInsert(key_id, d, ct, blob);
    std::string out;
    return memo.OpenLookup(key_id, d, ct, &out);
  };
  for (uint64_t i = 0; i < 40; ++i) insert("early-a", 100 + i);
  for (uint64_t i = 0; i < 40; ++i) insert("early-b", 200 + i);
  // The budget is spent by the early keys; a new key still gets its entries in.
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(insert("late", 300 + i)) << i;
  EXPECT_LE(memo.open_stats().bytes, options.open_bytes_total);
}

// One blob of the open memo: its ciphertext, plaintext and digest under `instance`.
struct Blob {
  std::vector<uint8_t> ct, pt;
  Digest digest;
};

Blob MakeBlob(const Memo& memo, uint64_t instance, uint64_t id, uint64_t version, size_t size) {
  Blob b;
  std::vector<uint8_t> nonce(12, 0);
  for (int i = 0; i < 4; ++i) {
    nonce[i] = static_cast<uint8_t>(id >> (8 * i));
    nonce[4 + i] = static_cast<uint8_t>(version >> (8 * i));
  }
  b.pt.assign(size, static_cast<uint8_t>(id * 31 + version));
  b.ct.assign(size + 16, static_cast<uint8_t>(id * 7 + version + 1));
  for (int i = 0; i < 8; ++i) b.ct[i] = nonce[i];
  b.digest = memo.OpenDigest(instance, nonce, b.ct, {});
  return b;
}

// Looks `blob` up under `key_id` as the server does, and opens-and-inserts it on a miss.
// Returns whether it was a hit. A hit with another plaintext fails the test.
bool ReadThrough(Memo& memo, const std::string& key_id, const Blob& blob) {
  std::string out;
  if (memo.OpenLookup(key_id, blob.digest, blob.ct, &out)) {
    EXPECT_EQ(out, std::string(blob.pt.begin(), blob.pt.end())) << key_id;
    return true;
  }
  memo.OpenInsert(key_id, blob.digest, blob.ct, blob.pt);
  return false;
}

// Issue 33: an open entry costs at most a page (4 KiB) beyond its ciphertext and plaintext (it
// cost 10,938 bytes more for a 55 KB blob while large no-dump mappings were rounded up to 2^k or
// 3x2^(k-1) pages), and what the memo charges is what the entry holds in no-dump memory.
TEST_F(MemoTest, AnOpenEntryCostsAtMostAPageBeyondItsBytes) {
  // The plaintext's buffer takes less than a page beyond its bytes; the entry's bookkeeping (the
  // shared entry and buffer, the LRU node, the digest) is a fixed few hundred bytes on top.
  for (size_t pt : {size_t{1}, size_t{100}, size_t{4000}, size_t{20000}, size_t{32768},
                    size_t{32769}, size_t{55000}, size_t{65536}, size_t{1} << 20}) {
    const size_t envelope = pt + 16 + 29;  // XChaCha20-Poly1305: header, nonce, tag
    EXPECT_LT(WipedBuffer::Footprint(pt) - pt, 4096u) << pt;
    EXPECT_LE(Memo::OpenEntryCost(envelope, pt), envelope + WipedBuffer::Footprint(pt) + 512)
        << pt;
  }
  EXPECT_LE(Memo::OpenEntryCost(55000 + 45, 55000), (55000 + 45) + 55000 + 4096);
  // The 27 blobs of 55 KB a phone re-reads on every resume fit a budget of 27 x (ciphertext +
  // plaintext + 4 KiB), per key and in all; the no-dump memory they take is what is charged.
  constexpr size_t kBlob = 55000;
  MemoOptions options;
  options.open_bytes_per_key = options.open_bytes_total = 27 * ((kBlob + 16) + kBlob + 4096);
  Memo memo(options);
  const size_t nodump_before = secure::GetStats().nodump_in_use_bytes;
  std::vector<Blob> blobs;
  for (uint64_t i = 0; i < 27; ++i) blobs.push_back(MakeBlob(memo, 7, i, 1, kBlob));
  for (const Blob& b : blobs) EXPECT_FALSE(ReadThrough(memo, "phone", b));
  for (const Blob& b : blobs) EXPECT_TRUE(ReadThrough(memo, "phone", b)) << "second pass";
  const CacheStats s = memo.open_stats();
  EXPECT_EQ(s.entries, 27u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.bytes, 27 * Memo::OpenEntryCost(kBlob + 16, kBlob));
  EXPECT_EQ(secure::GetStats().nodump_in_use_bytes - nodump_before,
            27 * memo::WipedBuffer::Footprint(kBlob));
}

// Issue 14: under a spent shared budget, a key idle since the morning kept its 27 blobs and a
// key in use replaying its own 27 blobs got 0 hits per pass. With one recency order across keys
// the idle key gives way: from the pass after the active set was last loaded, every read hits.
TEST_F(MemoTest, IdleKeyGivesWayToActiveKeyInTheSharedOpenBudget) {
  for (const bool idle_first : {true, false}) {
    SCOPED_TRACE(idle_first ? "idle key arrives first" : "active key arrives first");
    const size_t size = 4000;
    const size_t cost = Memo::OpenEntryCost(size + 16, size);
    MemoOptions options;
    options.open_bytes_per_key = 32 * cost;  // one key's 27 blobs fit its own bound
    options.open_bytes_total = 40 * cost;    // both keys' 54 do not fit the total
    Memo memo(options);
    std::vector<Blob> idle, active;
    for (uint64_t i = 0; i < 27; ++i) {
      idle.push_back(MakeBlob(memo, 1, i, 0, size));
      active.push_back(MakeBlob(memo, 2, i, 0, size));
    }
    auto pass = [&](const std::string& key_id, const std::vector<Blob>& blobs) {
      int hits = 0;
      for (const Blob& b : blobs) hits += ReadThrough(memo, key_id, b);
      return hits;
    };
    std::vector<int> hits;
    if (idle_first) {
      EXPECT_EQ(pass("idle", idle), 0);
      for (int p = 0; p < 5; ++p) hits.push_back(pass("active", active));
      // Pass 0 loads the active set (its last 14 inserts take the idle key's oldest blobs).
      EXPECT_EQ(hits, (std::vector<int>{0, 27, 27, 27, 27}));
    } else {
      hits.push_back(pass("active", active));
      EXPECT_EQ(pass("idle", idle), 0);  // takes the 14 oldest active blobs
      for (int p = 0; p < 4; ++p) hits.push_back(pass("active", active));
      // Pass 1 is LRU's cyclic miss: each reload evicts the oldest active blob, the next one read
      // (the idle key's are newer); once reloaded, the active set stays.
      EXPECT_EQ(hits, (std::vector<int>{0, 0, 27, 27, 27}));
    }
    CacheStats s = memo.open_stats();
    EXPECT_EQ(s.entries, 40u);
    EXPECT_EQ(s.bytes, 40 * cost);
    EXPECT_EQ(s.inserts - s.evictions, 40u);
    // The idle key keeps what the active key did not need: its 13 most recent blobs.
    int idle_left = 0;
    std::string out;
    for (const Blob& b : idle) idle_left += memo.OpenLookup("idle", b.digest, b.ct, &out);
    EXPECT_EQ(idle_left, 13);
  }
}

// A model of the open memo: one recency list over all keys, a byte sum per key and in all.
// Insert: too large for either bound -> skipped; else replace, evict the key's own oldest while
// the key is over its bound, then the oldest of any key while the total is over.
class OpenMemoModel {
 public:
  OpenMemoModel(size_t per_key, size_t total) : per_key_(per_key), total_(total) {}

  bool Lookup(int key, uint64_t blob) {
    auto it = index_.find({key, blob});
    if (it == index_.end()) {
      ++stats_.misses;
      return false;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    ++stats_.hits;
    return true;
  }
  void Miss() { ++stats_.misses; }  // a digest that matched but whose ciphertext did not
  void Insert(int key, uint64_t blob, size_t cost) {
    if (cost > per_key_ || cost > total_) return;
    if (auto it = index_.find({key, blob}); it != index_.end()) Remove(it->second, false);
    while (key_bytes_[key] + cost > per_key_) {
      auto oldest = std::prev(lru_.end());
      while (oldest->key != key) --oldest;
      Remove(oldest, true);
      ++own_evictions_;
    }
    while (stats_.bytes + cost > total_) Remove(std::prev(lru_.end()), true);
    lru_.push_front({key, blob, cost});
    index_[{key, blob}] = lru_.begin();
    key_bytes_[key] += cost;
    stats_.bytes += cost;
    ++stats_.entries;
    ++stats_.inserts;
  }
  void Drop(int key) {
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto next = std::next(it);
      if (it->key == key) Remove(it, false);
      it = next;
    }
  }
  const CacheStats& stats() const { return stats_; }
  uint64_t own_evictions() const { return own_evictions_; }

 private:
  struct Item {
    int key;
    uint64_t blob;
    size_t cost;
  };
  void Remove(std::list<Item>::iterator it, bool eviction) {
    key_bytes_[it->key] -= it->cost;
    stats_.bytes -= it->cost;
    --stats_.entries;
    if (eviction) ++stats_.evictions;
    index_.erase({it->key, it->blob});
    lru_.erase(it);
  }

  const size_t per_key_, total_;
  std::list<Item> lru_;  // newest first
  std::map<std::pair<int, uint64_t>, std::list<Item>::iterator> index_;
  std::map<int, size_t> key_bytes_;
  CacheStats stats_;
  uint64_t own_evictions_ = 0;
};

// Replays a random trace of 10,000 open-memo operations over 12 keys (reads that insert on a
// miss, Seal records of new versions, re-inserts, tampered reads, key drops) on the memo and on
// the model, comparing every hit and all counters and bytes after every operation.
void CompareWithModel(uint32_t seed, size_t per_key, size_t total) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", per key " + std::to_string(per_key) +
               ", total " + std::to_string(total));
  std::mt19937_64 rng(seed);
  MemoOptions options;
  options.open_bytes_per_key = per_key;
  options.open_bytes_total = total;
  Memo memo(options);
  OpenMemoModel model(per_key, total);
  constexpr int kKeys = 12, kBlobsPerKey = 16;
  std::vector<std::vector<uint64_t>> version(kKeys, std::vector<uint64_t>(kBlobsPerKey, 0));
  auto blob_of = [&](int key, uint64_t id) {
    const uint64_t v = version[key][id];
    const size_t size = 1 + (id * 977 + v * 131 + key * 59) % 1500;
    return MakeBlob(memo, 100 + key, id, v, size);
  };
  auto model_id = [&](int key, uint64_t id) { return id * 1000000 + version[key][id]; };
  auto cost_of = [](const Blob& b) { return Memo::OpenEntryCost(b.ct.size(), b.pt.size()); };
  for (int op = 0; op < 10000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    // Three hot keys get half the traffic; low blob ids are read more often.
    const int key = rng() % 2 == 0 ? static_cast<int>(rng() % 3) : static_cast<int>(rng() % kKeys);
    const uint64_t id = std::min(rng() % kBlobsPerKey, rng() % kBlobsPerKey);
    const std::string key_id = "k" + std::to_string(key);
    const unsigned what = rng() % 100;
    if (what < 80) {
      const Blob b = blob_of(key, id);
      const bool expected = model.Lookup(key, model_id(key, id));
      ASSERT_EQ(ReadThrough(memo, key_id, b), expected);
      if (!expected) model.Insert(key, model_id(key, id), cost_of(b));
    } else if (what < 90) {  // Seal of a new version records its ciphertext
      ++version[key][id];
      const Blob b = blob_of(key, id);
      memo.OpenInsert(key_id, b.digest, b.ct, b.pt);
      model.Insert(key, model_id(key, id), cost_of(b));
    } else if (what < 95) {  // two requests missed at once: the second insert replaces
      const Blob b = blob_of(key, id);
      memo.OpenInsert(key_id, b.digest, b.ct, b.pt);
      model.Insert(key, model_id(key, id), cost_of(b));
    } else if (what < 99) {  // same digest, other ciphertext bytes: a miss that moves nothing
      Blob b = blob_of(key, id);
      b.ct[b.ct.size() / 2] ^= 0x80;
      std::string out;
      ASSERT_FALSE(memo.OpenLookup(key_id, b.digest, b.ct, &out));
      model.Miss();
    } else {
      memo.DropKey(key_id);
      model.Drop(key);
    }
    const CacheStats got = memo.open_stats(), want = model.stats();
    ASSERT_EQ(got.hits, want.hits);
    ASSERT_EQ(got.misses, want.misses);
    ASSERT_EQ(got.inserts, want.inserts);
    ASSERT_EQ(got.evictions, want.evictions);
    ASSERT_EQ(got.entries, want.entries);
    ASSERT_EQ(got.bytes, want.bytes);
    ASSERT_LE(got.bytes, total);
  }
  // The trace exercised what it claims to: hits, evictions, and (with a binding per-key bound)
  // evictions by a key's own bound.
  const CacheStats s = memo.open_stats();
  EXPECT_GT(s.hits, 1000u);
  EXPECT_GT(s.evictions, 1000u);
  if (per_key < total) {
    EXPECT_GT(model.own_evictions(), 100u);
  }
  std::printf("seed %u, per key %zu, total %zu: %llu hits, %llu misses, %llu evictions "
              "(%llu by a key's own bound)\n",
              seed, per_key, total, static_cast<unsigned long long>(s.hits),
              static_cast<unsigned long long>(s.misses),
              static_cast<unsigned long long>(s.evictions),
              static_cast<unsigned long long>(model.own_evictions()));
}

// Per-key bounds far above the total: the memo of many keys must be exactly one LRU of that size.
TEST_F(MemoTest, ManyKeysUnderASmallTotalBehaveAsOneLru) {
  CompareWithModel(/*seed=*/20261130, /*per_key=*/1 << 20, /*total=*/40 * 1024);
}

// Per-key bounds that bind too: a key's own bound first, then the least recently used of all.
TEST_F(MemoTest, PerKeyAndTotalBoundsMatchTheModel) {
  CompareWithModel(/*seed=*/20261201, /*per_key=*/12 * 1024, /*total=*/40 * 1024);
}

// Threads read through, Seal, and drop keys at once under a tight total, so that most inserts
// evict another key's entries. Run under ThreadSanitizer too. Every hit returns its plaintext,
// the bounds hold, and once every key is dropped nothing is left.
TEST_F(MemoTest, SharedOpenBudgetUnderConcurrency) {
  MemoOptions options;
  options.open_bytes_per_key = 8 * 1024;
  options.open_bytes_total = 24 * 1024;
  Memo memo(options);
  const uint32_t seed = 5150;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < 2000; ++i) {
        const int key = static_cast<int>(rng() % 8);
        const uint64_t id = rng() % 12;
        const Blob b = MakeBlob(memo, 100 + key, id, 0, 100 + id * 40);
        const std::string key_id = "k" + std::to_string(key);
        if (rng() % 100 == 0) {
          memo.DropKey(key_id);
        } else {
          ReadThrough(memo, key_id, b);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CacheStats s = memo.open_stats();
  EXPECT_LE(s.bytes, options.open_bytes_total) << "seed " << seed;
  EXPECT_GT(s.hits, 0u) << "seed " << seed;
  EXPECT_GT(s.evictions, 0u) << "seed " << seed;
  for (int key = 0; key < 8; ++key) memo.DropKey("k" + std::to_string(key));
  s = memo.open_stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
}

TEST_F(MemoTest, DropKeyKeepsCountersMonotonic) {
  Memo memo(MemoOptions{});
  auto nonce = Bytes(12, 0), ct = Bytes(20, 1), pt = Bytes(4, 2);
  Digest d = memo.OpenDigest(1, nonce, ct, {});
  memo.OpenInsert("k", d, ct, pt);
  std::string out;
  ASSERT_TRUE(memo.OpenLookup("k", d, ct, &out));
  memo.DropKey("k");
  CacheStats s = memo.open_stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.inserts, 1u);
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_FALSE(memo.OpenLookup("k", d, ct, &out));
}

TEST_F(MemoTest, DisabledMemoNeverHits) {
  MemoOptions options;
  options.enabled = false;
  Memo memo(options);
  Digest d = memo.VerifyDigest(Bytes(32, 1), Bytes(64, 1), Bytes(1, 1));
  memo.VerifyInsert(d);
  EXPECT_FALSE(memo.VerifyHit(d));
  EXPECT_EQ(d, Digest{});  // not hashed: nothing would use it
  const Digest shared = memo.DeriveDigest(1, 1, Bytes(32, 2));
  uint8_t out[32];
  memo.DeriveInsert(shared, "k", Bytes(32, 3));
  EXPECT_FALSE(memo.DeriveLookup(shared, absl::MakeSpan(out)));
  EXPECT_EQ(memo.derive_stats().entries, 0u);
}

// Many threads insert, look up and drop keys at once; run under ThreadSanitizer in CI
// (scripts/test.sh builds build-tsan). Checks the counters add up and the bounds hold.
TEST_F(MemoTest, ConcurrentStress) {
  MemoOptions options;
  options.verify_bytes = 64 * 1024;
  options.derive_bytes = 64 * 1024;
  options.open_bytes_per_key = 256 * 1024;
  options.open_bytes_total = 512 * 1024;
  options.shards = 4;
  Memo memo(options);
  const uint32_t seed = 424242;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int i = 0; i < 3000; ++i) {
        const uint8_t v = static_cast<uint8_t>(rng() % 64);
        const std::string key_id = "k" + std::to_string(rng() % 4);
        auto peer = Bytes(32, v), pt = Bytes(100 + v, v), ct = Bytes(116 + v, v ^ 0x55);
        auto nonce = Bytes(12, v);
        switch (rng() % 5) {
          case 0: {
            Digest d = memo.VerifyDigest(peer, peer, peer);
            if (!memo.VerifyHit(d)) memo.VerifyInsert(d);
            break;
          }
          case 1: {
            Digest d = memo.DeriveDigest(v, 1, peer);
            std::vector<uint8_t> out(32);
            if (memo.DeriveLookup(d, absl::MakeSpan(out))) {
              if (out != Bytes(32, v)) wrong.fetch_add(1);
            } else {
              memo.DeriveInsert(d, key_id, Bytes(32, v));
            }
            break;
          }
          case 2:
          case 3: {
            Digest d = memo.OpenDigest(v, nonce, ct, {});
            std::string out;
            if (memo.OpenLookup(key_id, d, ct, &out)) {
              if (out != std::string(pt.begin(), pt.end())) wrong.fetch_add(1);
            } else {
              memo.OpenInsert(key_id, d, ct, pt);
            }
            break;
          }
          case 4:
            if (rng() % 50 == 0) memo.DropKey(key_id);
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "seed " << seed;
  EXPECT_LE(memo.verify_stats().bytes, options.verify_bytes);
  EXPECT_LE(memo.derive_stats().bytes, options.derive_bytes);
  EXPECT_LE(memo.open_stats().bytes, options.open_bytes_total);
  EXPECT_GT(memo.verify_stats().hits + memo.derive_stats().hits + memo.open_stats().hits, 0u);
}

}  // namespace
}  // namespace offload::memo
