#include "client/cpp/rendezvous.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

std::vector<std::string> Ids(int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat("key-", i));
  return ids;
}

const std::vector<std::string> kThree = {"10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"};

// The weight is BLAKE2b-64 of a fixed layout, so any process (or language) computes the same.
// Expected values from Python: hashlib.blake2b(b"offload-rendezvous-v1\0" + key + b"\0" +
// endpoint, digest_size=8), read little-endian.
TEST(RendezvousTest, WeightIsPinned) {
  EXPECT_EQ(RendezvousWeight("alice-signing", "127.0.0.1:5001"), 0xea05ee44c957fbedULL);
  EXPECT_EQ(RendezvousWeight("alice-signing", "127.0.0.1:5002"), 0xd0421e7ba682e1fbULL);
  EXPECT_EQ(RendezvousWeight("", "10.0.0.1:50051"), 0x2ce54e238c7e4ccbULL);
}

TEST(RendezvousTest, ChoiceDoesNotDependOnListOrder) {
  std::vector<std::string> reversed(kThree.rbegin(), kThree.rend());
  for (const std::string& id : Ids(1000)) {
    EXPECT_EQ(kThree[PickEndpoint(id, kThree, {})], reversed[PickEndpoint(id, reversed, {})]);
  }
}

TEST(RendezvousTest, BalancedOverThreeEndpoints) {
  std::map<int, int> count;
  const int n = 10000;
  for (const std::string& id : Ids(n)) count[PickEndpoint(id, kThree, {})]++;
  ASSERT_EQ(count.size(), 3u);
  for (const auto& [endpoint, c] : count) {
    // n/3 = 3333, binomial sd ~ 47: +-10% is about 7 sd.
    EXPECT_GT(c, n / 3 * 9 / 10) << kThree[endpoint];
    EXPECT_LT(c, n / 3 * 11 / 10) << kThree[endpoint];
  }
}

TEST(RendezvousTest, RemovingAnEndpointMovesOnlyItsKeys) {
  const std::vector<std::string> two = {kThree[0], kThree[2]};
  int moved = 0, held_by_removed = 0;
  for (const std::string& id : Ids(10000)) {
    const std::string before = kThree[PickEndpoint(id, kThree, {})];
    const std::string after = two[PickEndpoint(id, two, {})];
    if (before == kThree[1]) {
      ++held_by_removed;
      // It goes to its own second choice.
      EXPECT_EQ(after, kThree[RankEndpoints(id, kThree)[1]]);
    } else {
      EXPECT_EQ(before, after) << id;
    }
    if (before != after) ++moved;
  }
  EXPECT_EQ(moved, held_by_removed);
  EXPECT_GT(held_by_removed, 0);
}

TEST(RendezvousTest, AddingAnEndpointTakesKeysOnlyForItself) {
  std::vector<std::string> four = kThree;
  four.push_back("10.0.0.4:50051");
  int moved = 0;
  for (const std::string& id : Ids(10000)) {
    const std::string before = kThree[PickEndpoint(id, kThree, {})];
    const std::string after = four[PickEndpoint(id, four, {})];
    if (before != after) {
      EXPECT_EQ(after, four[3]);
      ++moved;
    }
  }
  EXPECT_GT(moved, 10000 / 4 * 8 / 10);
  EXPECT_LT(moved, 10000 / 4 * 12 / 10);
}

TEST(RendezvousTest, UnusableEndpointsAreSkippedInRankOrder) {
  for (const std::string& id : Ids(200)) {
    const std::vector<int> rank = RankEndpoints(id, kThree);
    ASSERT_EQ(rank.size(), 3u);
    EXPECT_EQ(PickEndpoint(id, kThree, {}), rank[0]);
    std::vector<bool> usable(3, true);
    usable[rank[0]] = false;
    EXPECT_EQ(PickEndpoint(id, kThree, usable), rank[1]);
    usable[rank[1]] = false;
    EXPECT_EQ(PickEndpoint(id, kThree, usable), rank[2]);
    usable[rank[2]] = false;
    EXPECT_EQ(PickEndpoint(id, kThree, usable), -1);
  }
  EXPECT_EQ(PickEndpoint("k", {}, {}), -1);
}

}  // namespace
}  // namespace offload::client
