// NaCl box over X25519: BoxKeyFromShared, BoxSealAfternm, BoxOpenAfternm.
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
#include "service/crypto/x25519.h"
#include "tests/testing/vectors.h"

namespace offload::crypto {

// Test names and failure messages show "libsodium" / "openssl" rather than raw bytes.
inline void PrintTo(Backend backend, std::ostream* os) { *os << BackendName(backend); }

namespace {

using testvectors::Hex;
using testvectors::LoadJsonOrDie;
using testvectors::UnhexField;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kSeed = 0xb0c5;  // fixed seed of the random tests

class BoxTest : public testing::TestWithParam<Backend> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(InitCrypto().ok()); }

  // crypto_box_beforenm through the service: X25519 on the backend under test, then HSalsa20.
  SecretBytes BoxKey(const Bytes& secret, const Bytes& peer_public) {
    auto key = X25519PrivateKey::FromBytes(GetParam(), secret);
    EXPECT_TRUE(key.ok());
    SecretBytes raw(32), box_key(32);
    if (!key.ok()) return box_key;
    EXPECT_TRUE((*key)->Derive(peer_public, false, absl::MakeSpan(raw)).ok());
    BoxKeyFromShared(raw, absl::MakeSpan(box_key));
    return box_key;
  }
};

std::string BackendParamName(const testing::TestParamInfo<Backend>& info) {
  return std::string(BackendName(info.param));
}

TEST_P(BoxTest, NaclKnownAnswer) {
  const auto v = LoadJsonOrDie("nacl_box_vectors.json");
  ASSERT_EQ(v.at("tests").size(), 1u);
  const auto& t = v.at("tests")[0];
  const Bytes alice_sk = UnhexField(t.at("alice_secret_key"));
  const Bytes alice_pk = UnhexField(t.at("alice_public_key"));
  const Bytes bob_sk = UnhexField(t.at("bob_secret_key"));
  const Bytes bob_pk = UnhexField(t.at("bob_public_key"));
  const Bytes nonce = UnhexField(t.at("nonce"));
  const Bytes plaintext = UnhexField(t.at("plaintext"));
  const Bytes combined = UnhexField(t.at("ciphertext_combined"));

  auto alice = X25519PrivateKey::FromBytes(GetParam(), alice_sk);
  ASSERT_TRUE(alice.ok());
  SecretBytes raw(32);
  ASSERT_TRUE((*alice)->Derive(bob_pk, false, absl::MakeSpan(raw)).ok());
  EXPECT_EQ(Hex(raw), Hex(UnhexField(t.at("x25519_shared_secret"))));

  const SecretBytes alice_key = BoxKey(alice_sk, bob_pk);
  const SecretBytes bob_key = BoxKey(bob_sk, alice_pk);
  EXPECT_EQ(Hex(alice_key), Hex(UnhexField(t.at("beforenm_shared_key"))));
  EXPECT_EQ(Hex(bob_key), Hex(alice_key));

  Bytes sealed(plaintext.size() + kBoxTagSize);
  ASSERT_TRUE(BoxSealAfternm(alice_key, nonce, plaintext, absl::MakeSpan(sealed)).ok());
  EXPECT_EQ(Hex(sealed), Hex(combined));

  Bytes opened(combined.size() - kBoxTagSize);
  ASSERT_TRUE(BoxOpenAfternm(bob_key, nonce, combined, absl::MakeSpan(opened)).ok());
  EXPECT_EQ(Hex(opened), Hex(plaintext));

  for (size_t pos : {size_t{0}, size_t{15}, size_t{16}, combined.size() - 1}) {
    Bytes bad = combined;
    bad[pos] ^= 0x01;
    Bytes out(bad.size() - kBoxTagSize, 0xaa);
    absl::Status s = BoxOpenAfternm(bob_key, nonce, bad, absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << pos;
    EXPECT_EQ(s.message(), "authentication failed");
    EXPECT_EQ(Hex(out), std::string(out.size() * 2, '0')) << "output not wiped";
  }
  Bytes bad_nonce = nonce;
  bad_nonce[23] ^= 1;
  EXPECT_FALSE(BoxOpenAfternm(bob_key, bad_nonce, combined, absl::MakeSpan(opened)).ok());
}

// The service's box interoperates with plain libsodium crypto_box_easy / crypto_box_open_easy.
TEST_P(BoxTest, InteropWithLibsodiumBox) {
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("random seed " + std::to_string(kSeed));
  for (int iter = 0; iter < 300; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    std::array<uint8_t, 32> a_pk, a_sk, b_pk, b_sk;
    crypto_box_keypair(a_pk.data(), a_sk.data());
    crypto_box_keypair(b_pk.data(), b_sk.data());
    Bytes nonce(kBoxNonceSize), msg(rng() % 2000);
    for (auto& b : nonce) b = rng();
    for (auto& b : msg) b = rng();

    // Service (Alice) seals, libsodium (Bob) opens.
    const SecretBytes key = BoxKey(Bytes(a_sk.begin(), a_sk.end()), Bytes(b_pk.begin(), b_pk.end()));
    Bytes sealed(msg.size() + kBoxTagSize);
    ASSERT_TRUE(BoxSealAfternm(key, nonce, msg, absl::MakeSpan(sealed)).ok());
    Bytes opened(msg.size());
    ASSERT_EQ(crypto_box_open_easy(opened.data(), sealed.data(), sealed.size(), nonce.data(),
                                   a_pk.data(), b_sk.data()),
              0);
    ASSERT_EQ(opened, msg);

    // libsodium (Bob) seals, service (Alice) opens.
    Bytes from_bob(msg.size() + crypto_box_MACBYTES);
    ASSERT_EQ(crypto_box_easy(from_bob.data(), msg.data(), msg.size(), nonce.data(), a_pk.data(),
                              b_sk.data()),
              0);
    Bytes got(msg.size());
    ASSERT_TRUE(BoxOpenAfternm(key, nonce, from_bob, absl::MakeSpan(got)).ok());
    ASSERT_EQ(got, msg);
    from_bob[rng() % from_bob.size()] ^= 1 << (rng() % 8);
    ASSERT_FALSE(BoxOpenAfternm(key, nonce, from_bob, absl::MakeSpan(got)).ok());
  }
}

TEST_P(BoxTest, WrongSizesRejected) {
  const Bytes key(32, 1), nonce(24, 2), msg(10, 3);
  Bytes out(msg.size() + kBoxTagSize);
  EXPECT_EQ(BoxSealAfternm(Bytes(31), nonce, msg, absl::MakeSpan(out)).message(),
            "box_key: expected 32 bytes, got 31");
  EXPECT_EQ(BoxSealAfternm(key, Bytes(12), msg, absl::MakeSpan(out)).message(),
            "nonce: expected 24 bytes, got 12");
  Bytes short_out(msg.size());
  EXPECT_EQ(BoxSealAfternm(key, nonce, msg, absl::MakeSpan(short_out)).message(),
            "out: expected 26 bytes, got 10");
  Bytes tiny(15), none;
  EXPECT_EQ(BoxOpenAfternm(key, nonce, tiny, absl::MakeSpan(none)).code(),
            absl::StatusCode::kInvalidArgument);
  // An empty plaintext round-trips.
  Bytes sealed(kBoxTagSize);
  ASSERT_TRUE(BoxSealAfternm(key, nonce, {}, absl::MakeSpan(sealed)).ok());
  EXPECT_TRUE(BoxOpenAfternm(key, nonce, sealed, absl::MakeSpan(none)).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, BoxTest, testing::Values(Backend::kLibsodium, Backend::kOpenSsl),
                         BackendParamName);

}  // namespace
}  // namespace offload::crypto
