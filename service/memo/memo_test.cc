#include "service/memo/memo.h"

#include <sodium.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
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
