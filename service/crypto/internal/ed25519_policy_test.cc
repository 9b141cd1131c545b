#include "service/crypto/internal/ed25519_policy.h"

#include <sodium.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "service/crypto/backend.h"
#include "tests/testing/vectors.h"

namespace offload::crypto::internal {
namespace {

using testvectors::Hex;
using testvectors::Unhex;
using Point = std::array<uint8_t, 32>;

// 2^255 - 19 and L, little-endian, for the boundary tests.
const char kP[] = "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f";
const char kL[] = "edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010";

Point FromHex(const char* hex) {
  auto bytes = Unhex(hex);
  Point p;
  std::copy(bytes.begin(), bytes.end(), p.begin());
  return p;
}

// Little-endian 256-bit add of a small value.
Point Add(Point v, int delta) {
  int carry = delta;
  for (auto& b : v) {
    int x = b + carry;
    b = static_cast<uint8_t>(x & 0xff);
    carry = x >> 8;  // arithmetic shift also propagates borrows
  }
  return v;
}

// libsodium's point arithmetic (not ours) confirms every blocklist entry has order 1, 2, 4 or 8:
// adding it to itself three times (x8) gives the identity.
TEST(Ed25519Policy, BlocklistEntriesHaveSmallOrder) {
  ASSERT_TRUE(InitCrypto().ok());
  const Point identity = FromHex("0100000000000000000000000000000000000000000000000000000000000000");
  for (const auto& entry : kEd25519SmallOrderBlocklist) {
    SCOPED_TRACE(Hex(entry));
    Point q = entry;
    for (int i = 0; i < 3; ++i) {
      Point doubled;
      ASSERT_EQ(crypto_core_ed25519_add(doubled.data(), q.data(), q.data()), 0);
      q = doubled;
    }
    EXPECT_EQ(Hex(q), Hex(identity));
    EXPECT_TRUE(Ed25519HasSmallOrder(entry));
    Point with_sign = entry;
    with_sign[31] |= 0x80;
    EXPECT_TRUE(Ed25519HasSmallOrder(with_sign));
    // libsodium refuses small-order points in its point validation too.
    EXPECT_EQ(crypto_core_ed25519_is_valid_point(entry.data()), 0);
  }
}

TEST(Ed25519Policy, RandomPointsAreNotSmallOrder) {
  ASSERT_TRUE(InitCrypto().ok());
  for (int i = 0; i < 1000; ++i) {
    Point r, p;
    randombytes_buf(r.data(), r.size());
    crypto_core_ed25519_from_uniform(p.data(), r.data());
    ASSERT_EQ(crypto_core_ed25519_is_valid_point(p.data()), 1);
    ASSERT_FALSE(Ed25519HasSmallOrder(p)) << Hex(p);
    ASSERT_TRUE(Ed25519IsCanonicalPoint(p)) << Hex(p);
  }
}

TEST(Ed25519Policy, CanonicalPointBoundary) {
  const Point p = FromHex(kP);
  EXPECT_TRUE(Ed25519IsCanonicalPoint(Add(p, -1)));  // p - 1
  EXPECT_FALSE(Ed25519IsCanonicalPoint(p));
  EXPECT_FALSE(Ed25519IsCanonicalPoint(Add(p, 1)));
  EXPECT_FALSE(Ed25519IsCanonicalPoint(Add(p, 18)));  // 2^255 - 1
  Point signed_p = p;
  signed_p[31] |= 0x80;  // the sign bit is not part of y
  EXPECT_FALSE(Ed25519IsCanonicalPoint(signed_p));
  Point signed_small = Add(p, -1);
  signed_small[31] |= 0x80;
  EXPECT_TRUE(Ed25519IsCanonicalPoint(signed_small));
  EXPECT_TRUE(Ed25519IsCanonicalPoint(Point{}));
}

TEST(Ed25519Policy, CanonicalScalarBoundary) {
  const Point l = FromHex(kL);
  EXPECT_TRUE(Ed25519IsCanonicalScalar(Point{}));
  EXPECT_TRUE(Ed25519IsCanonicalScalar(Add(l, -1)));
  EXPECT_FALSE(Ed25519IsCanonicalScalar(l));
  EXPECT_FALSE(Ed25519IsCanonicalScalar(Add(l, 1)));
  Point max;
  max.fill(0xff);
  EXPECT_FALSE(Ed25519IsCanonicalScalar(max));
  // Random scalars against a plain big-endian comparison.
  std::mt19937 rng(20240611);
  SCOPED_TRACE("random seed 20240611");
  for (int i = 0; i < 10000; ++i) {
    Point s;
    for (auto& b : s) b = rng();
    s[31] &= (i % 2) ? 0x1f : 0x10;  // many values near L
    bool less = false;
    for (int j = 31; j >= 0; --j) {
      if (s[j] != l[j]) {
        less = s[j] < l[j];
        break;
      }
    }
    ASSERT_EQ(Ed25519IsCanonicalScalar(s), less) << Hex(s);
    // libsodium's reduction leaves canonical scalars unchanged.
    uint8_t wide[64] = {0};
    std::copy(s.begin(), s.end(), wide);
    Point reduced;
    crypto_core_ed25519_scalar_reduce(reduced.data(), wide);
    ASSERT_EQ(reduced == s, less) << Hex(s);
  }
}

}  // namespace
}  // namespace offload::crypto::internal
