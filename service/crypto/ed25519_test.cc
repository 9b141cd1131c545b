#include "service/crypto/ed25519.h"

#include <sodium.h>

#include <array>
#include <cstdint>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/crypto/backend.h"
#include "service/crypto/internal/ed25519_policy.h"
#include "service/crypto/internal/ed25519_raw.h"
#include "tests/testing/vectors.h"

namespace offload::crypto {

// Test names and failure messages show "libsodium" / "openssl" rather than raw bytes.
inline void PrintTo(Backend backend, std::ostream* os) { *os << BackendName(backend); }

namespace {

using testvectors::Hex;
using testvectors::LoadJsonOrDie;
using testvectors::UnhexField;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kSeed = 0x0ff10ad1;  // fixed seed of the random tests

class Ed25519Test : public testing::TestWithParam<Backend> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(InitCrypto().ok()); }
};

std::string BackendParamName(const testing::TestParamInfo<Backend>& info) {
  return std::string(BackendName(info.param));
}

Bytes Sign(Backend backend, const Bytes& seed, const Bytes& message) {
  auto signer = Ed25519Signer::FromSeed(backend, seed);
  EXPECT_TRUE(signer.ok()) << signer.status();
  if (!signer.ok()) return {};
  Bytes sig(kEd25519SignatureSize);
  absl::Status s = (*signer)->Sign(message, absl::MakeSpan(sig));
  EXPECT_TRUE(s.ok()) << s;
  return sig;
}

TEST_P(Ed25519Test, Rfc8032Vectors) {
  const auto file = LoadJsonOrDie("rfc_vectors.json");
  const auto& tests = file.at("ed25519").at("tests");
  ASSERT_EQ(tests.size(), 5u);
  for (const auto& t : tests) {
    SCOPED_TRACE(t.at("name").get<std::string>());
    const Bytes seed = UnhexField(t.at("secret_key"));
    const Bytes pk = UnhexField(t.at("public_key"));
    const Bytes msg = UnhexField(t.at("message"));
    const Bytes expected_sig = UnhexField(t.at("signature"));
    ASSERT_EQ(msg.size(), t.at("message_length").get<size_t>());

    auto signer = Ed25519Signer::FromSeed(GetParam(), seed);
    ASSERT_TRUE(signer.ok()) << signer.status();
    EXPECT_EQ(Hex((*signer)->public_key()), Hex(pk));
    auto derived = Ed25519PublicKeyFromSeed(seed);
    ASSERT_TRUE(derived.ok());
    EXPECT_EQ(Hex(*derived), Hex(pk));

    Bytes sig(64);
    ASSERT_TRUE((*signer)->Sign(msg, absl::MakeSpan(sig)).ok());
    EXPECT_EQ(Hex(sig), Hex(expected_sig));
    EXPECT_TRUE(Ed25519Verify(GetParam(), pk, msg, expected_sig));

    // A flipped bit in R, in S or in the message must be rejected.
    for (size_t pos : {size_t{0}, size_t{31}, size_t{32}, size_t{63}}) {
      Bytes bad = expected_sig;
      bad[pos] ^= 0x01;
      EXPECT_FALSE(Ed25519Verify(GetParam(), pk, msg, bad)) << "sig byte " << pos;
    }
    Bytes bad_msg = msg;
    if (bad_msg.empty()) {
      bad_msg.push_back(0);
    } else {
      bad_msg[0] ^= 0x80;
    }
    EXPECT_FALSE(Ed25519Verify(GetParam(), pk, bad_msg, expected_sig));
  }
}

TEST_P(Ed25519Test, WycheproofLabelsMatch) {
  const auto file = LoadJsonOrDie("wycheproof/ed25519_test.json");
  size_t run = 0, valid = 0, wrong_size = 0;
  for (const auto& group : file.at("testGroups")) {
    const Bytes pk = UnhexField(group.at("publicKey").at("pk"));
    for (const auto& t : group.at("tests")) {
      const int id = t.at("tcId").get<int>();
      const std::string result = t.at("result").get<std::string>();
      ASSERT_NE(result, "acceptable") << "tcId " << id << ": the policy has no acceptable case";
      const bool expect_valid = result == "valid";
      const Bytes msg = UnhexField(t.at("msg"));
      const Bytes sig = UnhexField(t.at("sig"));
      if (pk.size() != 32 || sig.size() != 64) {
        ++wrong_size;
        EXPECT_FALSE(expect_valid) << "tcId " << id;
      }
      EXPECT_EQ(Ed25519Verify(GetParam(), pk, msg, sig), expect_valid)
          << "tcId " << id << " (" << t.at("comment").get<std::string>() << ")";
      ++run;
      valid += expect_valid;
    }
  }
  EXPECT_EQ(run, file.at("numberOfTests").get<size_t>());
  EXPECT_EQ(run, 151u);
  EXPECT_EQ(valid, 88u);
  std::printf("[ wycheproof ] ed25519 on %s: %zu cases, %zu valid, %zu with a wrong size\n",
              std::string(BackendName(GetParam())).c_str(), run, valid, wrong_size);
}

// The service's policy accepts only case 3 of ed25519-speccheck, whatever the backend.
TEST_P(Ed25519Test, SpeccheckCasesPinned) {
  const auto cases = LoadJsonOrDie("ed25519_speccheck_cases.json");
  ASSERT_EQ(cases.size(), 12u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Bytes msg = UnhexField(cases[i].at("message"));
    const Bytes pk = UnhexField(cases[i].at("pub_key"));
    const Bytes sig = UnhexField(cases[i].at("signature"));
    EXPECT_EQ(Ed25519Verify(GetParam(), pk, msg, sig), i == 3) << "speccheck case " << i;
  }
}

TEST_P(Ed25519Test, WrongSizesRejected) {
  const Bytes seed(32, 7);
  auto signer = Ed25519Signer::FromSeed(GetParam(), Bytes(31, 7));
  ASSERT_FALSE(signer.ok());
  EXPECT_EQ(signer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(signer.status().message(), "seed: expected 32 bytes, got 31");
  EXPECT_EQ(Ed25519PublicKeyFromSeed(Bytes(33)).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto good = Ed25519Signer::FromSeed(GetParam(), seed);
  ASSERT_TRUE(good.ok());
  Bytes short_sig(63);
  absl::Status s = (*good)->Sign(Bytes{1, 2, 3}, absl::MakeSpan(short_sig));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "signature: expected 64 bytes, got 63");

  Bytes sig(64);
  ASSERT_TRUE((*good)->Sign(Bytes{1, 2, 3}, absl::MakeSpan(sig)).ok());
  const auto& pk = (*good)->public_key();
  EXPECT_TRUE(Ed25519Verify(GetParam(), pk, Bytes{1, 2, 3}, sig));
  Bytes long_sig = sig;
  long_sig.push_back(0);
  EXPECT_FALSE(Ed25519Verify(GetParam(), pk, Bytes{1, 2, 3}, long_sig));
  EXPECT_FALSE(Ed25519Verify(GetParam(), absl::MakeConstSpan(pk).subspan(0, 31), Bytes{1, 2, 3}, sig));
}

TEST_P(Ed25519Test, EmptyMessage) {
  const Bytes seed(32, 9);
  const Bytes sig = Sign(GetParam(), seed, {});
  auto pk = Ed25519PublicKeyFromSeed(seed);
  ASSERT_TRUE(pk.ok());
  EXPECT_TRUE(Ed25519Verify(GetParam(), *pk, {}, sig));
  EXPECT_TRUE(Ed25519Verify(Backend::kLibsodium, *pk, {}, sig));
}

INSTANTIATE_TEST_SUITE_P(Backends, Ed25519Test,
                         testing::Values(Backend::kLibsodium, Backend::kOpenSsl), BackendParamName);

// OpenSSL's own verify, without the policy checks, accepts more of the speccheck cases: that is
// why the OpenSSL backend runs them first. Printed, and checked to include case 3.
TEST(Ed25519OpenSslRaw, SpeccheckWithoutPolicy) {
  const auto cases = LoadJsonOrDie("ed25519_speccheck_cases.json");
  std::string accepted;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Bytes msg = UnhexField(cases[i].at("message"));
    const Bytes pk = UnhexField(cases[i].at("pub_key"));
    const Bytes sig = UnhexField(cases[i].at("signature"));
    const bool raw = internal::OpenSslEd25519VerifyRaw(pk, msg, sig);
    if (raw) accepted += " " + std::to_string(i);
    if (i == 3) {
      EXPECT_TRUE(raw);
    } else if (raw) {
      // Whatever OpenSSL accepts beyond case 3, the policy checks are what reject it.
      EXPECT_FALSE(internal::PassesEd25519EncodingPolicy(pk, sig)) << i;
    }
  }
  std::printf("[ openssl raw ] EVP Ed25519 verify accepts speccheck cases:%s\n", accepted.c_str());
}

// Random cross-checks: each backend's signature is byte-identical to the other's and verifies on
// both; mutated signatures get the same answer from both backends.
TEST(Ed25519CrossBackend, RandomSignVerify) {
  ASSERT_TRUE(InitCrypto().ok());
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("random seed " + std::to_string(kSeed));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(0, 300);
  for (int iter = 0; iter < 2000; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    Bytes seed(32), msg(length(rng));
    for (auto& b : seed) b = byte(rng);
    for (auto& b : msg) b = byte(rng);
    const Bytes sig_sodium = Sign(Backend::kLibsodium, seed, msg);
    const Bytes sig_openssl = Sign(Backend::kOpenSsl, seed, msg);
    ASSERT_EQ(Hex(sig_sodium), Hex(sig_openssl));
    auto pk = Ed25519PublicKeyFromSeed(seed);
    ASSERT_TRUE(pk.ok());
    ASSERT_TRUE(Ed25519Verify(Backend::kLibsodium, *pk, msg, sig_openssl));
    ASSERT_TRUE(Ed25519Verify(Backend::kOpenSsl, *pk, msg, sig_sodium));

    // A mutation: a flipped bit anywhere in (pk, sig, msg).
    Bytes pk2(pk->begin(), pk->end()), sig2 = sig_sodium, msg2 = msg;
    const int where = byte(rng) % 3;
    const int bit = byte(rng) % 8;
    if (where == 0) pk2[byte(rng) % 32] ^= 1 << bit;
    if (where == 1) sig2[byte(rng) % 64] ^= 1 << bit;
    if (where == 2 && !msg2.empty()) msg2[byte(rng) % msg2.size()] ^= 1 << bit;
    const bool sodium = Ed25519Verify(Backend::kLibsodium, pk2, msg2, sig2);
    ASSERT_EQ(sodium, Ed25519Verify(Backend::kOpenSsl, pk2, msg2, sig2));
    if (where != 2 || !msg2.empty()) {
      ASSERT_FALSE(sodium);
    }
  }
}

// Signatures built to hit each policy check: both backends must agree with libsodium.
TEST(Ed25519CrossBackend, PolicyEdgeEncodings) {
  ASSERT_TRUE(InitCrypto().ok());
  std::mt19937 rng(kSeed + 1);
  SCOPED_TRACE("random seed " + std::to_string(kSeed + 1));
  static const uint8_t kL[32] = {0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7,
                                 0xa2, 0xde, 0xf9, 0xde, 0x14, 0,    0,    0,    0,    0,    0,
                                 0,    0,    0,    0,    0,    0,    0,    0,    0,    0x10};
  size_t cases = 0;
  for (int iter = 0; iter < 200; ++iter) {
    Bytes seed(32), msg(1 + iter % 50);
    for (auto& b : seed) b = rng();
    for (auto& b : msg) b = rng();
    const Bytes sig = Sign(Backend::kLibsodium, seed, msg);
    auto pk_arr = Ed25519PublicKeyFromSeed(seed);
    ASSERT_TRUE(pk_arr.ok());
    const Bytes pk(pk_arr->begin(), pk_arr->end());

    std::vector<std::pair<Bytes, Bytes>> variants;  // (pk, sig)
    // S + L: same value mod L, non-canonical.
    Bytes s_plus_l = sig;
    unsigned carry = 0;
    for (int i = 0; i < 32; ++i) {
      unsigned v = s_plus_l[32 + i] + kL[i] + carry;
      s_plus_l[32 + i] = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
    variants.push_back({pk, s_plus_l});
    for (const auto& entry : internal::kEd25519SmallOrderBlocklist) {
      for (uint8_t sign : {0x00, 0x80}) {
        Bytes enc(entry.begin(), entry.end());
        enc[31] |= sign;
        Bytes small_r = sig;
        std::copy(enc.begin(), enc.end(), small_r.begin());
        variants.push_back({pk, small_r});
        variants.push_back({enc, sig});
      }
    }
    // Sign bit of A flipped (a different point or none).
    Bytes pk_neg = pk;
    pk_neg[31] ^= 0x80;
    variants.push_back({pk_neg, sig});
    for (const auto& [p, s] : variants) {
      const bool sodium = Ed25519Verify(Backend::kLibsodium, p, msg, s);
      ASSERT_EQ(sodium, crypto_sign_verify_detached(s.data(), msg.data(), msg.size(), p.data()) == 0);
      ASSERT_EQ(sodium, Ed25519Verify(Backend::kOpenSsl, p, msg, s))
          << "pk " << Hex(p) << " sig " << Hex(s) << " msg " << Hex(msg);
      ASSERT_FALSE(sodium);
      ++cases;
    }
  }
  std::printf("[ policy ] %zu edge encodings, both backends agree\n", cases);
}

// A 64-byte NaCl secret key (seed || public key) imported through its seed signs exactly as
// libsodium's crypto_sign_detached with the 64-byte key.
TEST(Ed25519CrossBackend, NaclSecretKeyImport) {
  ASSERT_TRUE(InitCrypto().ok());
  std::mt19937 rng(kSeed + 2);
  SCOPED_TRACE("random seed " + std::to_string(kSeed + 2));
  for (int iter = 0; iter < 500; ++iter) {
    std::array<uint8_t, 32> pk;
    std::array<uint8_t, 64> nacl_sk;
    crypto_sign_keypair(pk.data(), nacl_sk.data());
    ASSERT_EQ(Hex(absl::MakeConstSpan(nacl_sk).subspan(32)), Hex(pk));
    Bytes msg(iter % 100);
    for (auto& b : msg) b = rng();
    std::array<uint8_t, 64> expected;
    crypto_sign_detached(expected.data(), nullptr, msg.data(), msg.size(), nacl_sk.data());
    const Bytes seed(nacl_sk.begin(), nacl_sk.begin() + 32);
    for (Backend backend : {Backend::kLibsodium, Backend::kOpenSsl}) {
      auto signer = Ed25519Signer::FromSeed(backend, seed);
      ASSERT_TRUE(signer.ok());
      ASSERT_EQ(Hex((*signer)->public_key()), Hex(pk));
      Bytes sig(64);
      ASSERT_TRUE((*signer)->Sign(msg, absl::MakeSpan(sig)).ok());
      ASSERT_EQ(Hex(sig), Hex(expected)) << BackendName(backend);
    }
  }
}

}  // namespace
}  // namespace offload::crypto
