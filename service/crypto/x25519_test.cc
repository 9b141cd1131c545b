#include "service/crypto/x25519.h"

#include <sodium.h>

#include <array>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/common/secret_bytes.h"
#include "service/crypto/backend.h"
#include "tests/testing/vectors.h"

namespace offload::crypto {

// Test names and failure messages show "libsodium" / "openssl" rather than raw bytes.
inline void PrintTo(Backend backend, std::ostream* os) { *os << BackendName(backend); }

namespace {

using testvectors::HasFlag;
using testvectors::Hex;
using testvectors::LoadJsonOrDie;
using testvectors::UnhexField;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kSeed = 0x7748;  // fixed seed of the random tests

class X25519Test : public testing::TestWithParam<Backend> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(InitCrypto().ok()); }

  // X25519(`scalar`, `u`) on the backend under test.
  absl::StatusOr<Bytes> Derive(const Bytes& scalar, const Bytes& u, bool allow_zero = false) {
    auto key = X25519PrivateKey::FromBytes(GetParam(), scalar);
    if (!key.ok()) return key.status();
    Bytes out(32, 0xaa);
    absl::Status s = (*key)->Derive(u, allow_zero, absl::MakeSpan(out));
    if (!s.ok()) {
      EXPECT_EQ(Hex(out), std::string(64, '0')) << "output not cleared on error";
      return s;
    }
    return out;
  }
};

std::string BackendParamName(const testing::TestParamInfo<Backend>& info) {
  return std::string(BackendName(info.param));
}

TEST_P(X25519Test, Rfc7748ScalarMult) {
  const auto file = LoadJsonOrDie("rfc_vectors.json");
  const auto& tests = file.at("x25519").at("scalar_mult").at("tests");
  ASSERT_EQ(tests.size(), 2u);
  for (const auto& t : tests) {
    SCOPED_TRACE(t.at("name").get<std::string>());
    auto out = Derive(UnhexField(t.at("scalar")), UnhexField(t.at("u_coordinate")));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Hex(*out), Hex(UnhexField(t.at("output"))));
  }
  // Vector 2 has the top bit of u set: it is ignored (RFC 7748 section 5).
  EXPECT_NE(UnhexField(tests[1].at("u_coordinate"))[31] & 0x80, 0);
}

TEST_P(X25519Test, Rfc7748Iterated) {
  const auto file = LoadJsonOrDie("rfc_vectors.json");
  const auto& iterated = file.at("x25519").at("iterated");
  size_t checked = 0;
  for (const auto& r : iterated.at("results")) {
    const int iterations = r.at("iterations").get<int>();
    if (iterations > 1000) continue;  // the 1,000,000 case takes ~30 s: not on the fast path
    Bytes k = UnhexField(iterated.at("initial_k"));
    Bytes u = UnhexField(iterated.at("initial_u"));
    for (int i = 0; i < iterations; ++i) {
      auto next = Derive(k, u);
      ASSERT_TRUE(next.ok()) << "iteration " << i << ": " << next.status();
      u = k;
      k = *next;
    }
    EXPECT_EQ(Hex(k), Hex(UnhexField(r.at("k")))) << iterations << " iterations";
    ++checked;
  }
  EXPECT_EQ(checked, 2u);
}

TEST_P(X25519Test, Rfc7748DiffieHellman) {
  const auto file = LoadJsonOrDie("rfc_vectors.json");
  const auto& dh = file.at("x25519").at("diffie_hellman");
  const Bytes alice_sk = UnhexField(dh.at("alice_private"));
  const Bytes bob_sk = UnhexField(dh.at("bob_private"));
  const Bytes alice_pk = UnhexField(dh.at("alice_public"));
  const Bytes bob_pk = UnhexField(dh.at("bob_public"));
  auto alice = X25519PrivateKey::FromBytes(GetParam(), alice_sk);
  auto bob = X25519PrivateKey::FromBytes(GetParam(), bob_sk);
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_EQ(Hex((*alice)->public_key()), Hex(alice_pk));
  EXPECT_EQ(Hex((*bob)->public_key()), Hex(bob_pk));
  auto pk = X25519PublicKey(alice_sk);
  ASSERT_TRUE(pk.ok());
  EXPECT_EQ(Hex(*pk), Hex(alice_pk));
  SecretBytes s1(32), s2(32);
  ASSERT_TRUE((*alice)->Derive(bob_pk, false, absl::MakeSpan(s1)).ok());
  ASSERT_TRUE((*bob)->Derive(alice_pk, false, absl::MakeSpan(s2)).ok());
  EXPECT_EQ(Hex(s1), Hex(UnhexField(dh.at("shared_secret"))));
  EXPECT_EQ(Hex(s2), Hex(UnhexField(dh.at("shared_secret"))));
}

// All 518 cases. `valid` and non-zero `acceptable` results must match the listed output; the
// `acceptable` ZeroSharedSecret cases (small-order peer keys) are rejected by default and give
// 32 zeros with allow_zero.
TEST_P(X25519Test, Wycheproof) {
  const auto file = LoadJsonOrDie("wycheproof/x25519_test.json");
  size_t run = 0, zero = 0, acceptable_computed = 0, top_bit = 0;
  for (const auto& group : file.at("testGroups")) {
    ASSERT_EQ(group.at("curve").get<std::string>(), "curve25519");
    for (const auto& t : group.at("tests")) {
      const int id = t.at("tcId").get<int>();
      SCOPED_TRACE("tcId " + std::to_string(id) + " " + t.at("comment").get<std::string>());
      const std::string result = t.at("result").get<std::string>();
      const Bytes priv = UnhexField(t.at("private"));
      const Bytes pub = UnhexField(t.at("public"));
      const Bytes shared = UnhexField(t.at("shared"));
      ASSERT_EQ(priv.size(), 32u);
      ASSERT_EQ(pub.size(), 32u);
      ++run;
      top_bit += (pub[31] & 0x80) != 0;
      const bool zero_expected = HasFlag(t, "ZeroSharedSecret");
      if (zero_expected) {
        ++zero;
        EXPECT_EQ(result, "acceptable");
        EXPECT_EQ(Hex(shared), std::string(64, '0'));
        auto rejected = Derive(priv, pub);
        ASSERT_FALSE(rejected.ok());
        EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(rejected.status().message(), "small-order peer public key");
        auto allowed = Derive(priv, pub, /*allow_zero=*/true);
        ASSERT_TRUE(allowed.ok()) << allowed.status();
        EXPECT_EQ(Hex(*allowed), Hex(shared));
        continue;
      }
      ASSERT_NE(result, "invalid");  // the file has none; an invalid case would need a rule here
      auto out = Derive(priv, pub);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(Hex(*out), Hex(shared));
      acceptable_computed += result == "acceptable";
    }
  }
  EXPECT_EQ(run, 518u);
  EXPECT_EQ(zero, 31u);
  std::printf("[ wycheproof ] x25519 on %s: %zu cases, %zu ZeroSharedSecret rejected (zeros with "
              "allow_zero), %zu other acceptable computed, %zu with the top bit of u set\n",
              std::string(BackendName(GetParam())).c_str(), run, zero, acceptable_computed,
              top_bit);
}

TEST_P(X25519Test, WrongSizesRejected) {
  auto key = X25519PrivateKey::FromBytes(GetParam(), Bytes(31));
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(key.status().message(), "secret: expected 32 bytes, got 31");
  auto good = X25519PrivateKey::FromBytes(GetParam(), Bytes(32, 1));
  ASSERT_TRUE(good.ok());
  Bytes shared(32);
  absl::Status s = (*good)->Derive(Bytes(33, 9), false, absl::MakeSpan(shared));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "peer_public_key: expected 32 bytes, got 33");
  Bytes short_out(16);
  s = (*good)->Derive(Bytes(32, 9), false, absl::MakeSpan(short_out));
  EXPECT_EQ(s.message(), "shared: expected 32 bytes, got 16");
  EXPECT_EQ(X25519PublicKey(Bytes(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, X25519Test,
                         testing::Values(Backend::kLibsodium, Backend::kOpenSsl), BackendParamName);

// Random secrets and random 32-byte peer values (top bit included): identical results.
TEST(X25519CrossBackend, RandomDerive) {
  ASSERT_TRUE(InitCrypto().ok());
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("random seed " + std::to_string(kSeed));
  for (int iter = 0; iter < 2000; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    Bytes secret(32), peer(32);
    for (auto& b : secret) b = rng();
    for (auto& b : peer) b = rng();
    if (iter % 2 == 0) {  // half real public keys, half arbitrary u-coordinates
      auto pk = X25519PublicKey(peer);
      ASSERT_TRUE(pk.ok());
      peer.assign(pk->begin(), pk->end());
      if (iter % 4 == 0) peer[31] |= 0x80;
    }
    auto a = X25519PrivateKey::FromBytes(Backend::kLibsodium, secret);
    auto b = X25519PrivateKey::FromBytes(Backend::kOpenSsl, secret);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(Hex((*a)->public_key()), Hex((*b)->public_key()));
    Bytes sa(32), sb(32);
    absl::Status ra = (*a)->Derive(peer, false, absl::MakeSpan(sa));
    absl::Status rb = (*b)->Derive(peer, false, absl::MakeSpan(sb));
    ASSERT_EQ(ra.ok(), rb.ok()) << ra << " vs " << rb << " peer " << Hex(peer);
    ASSERT_EQ(Hex(sa), Hex(sb)) << "peer " << Hex(peer);
  }
}

}  // namespace
}  // namespace offload::crypto
