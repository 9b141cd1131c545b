#include "service/crypto/aead.h"

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "service/crypto/backend.h"
#include "tests/testing/vectors.h"

namespace offload::crypto {

// Test names and failure messages show "libsodium" / "openssl" rather than raw bytes.
inline void PrintTo(Backend backend, std::ostream* os) { *os << BackendName(backend); }
inline void PrintTo(AeadAlgorithm algorithm, std::ostream* os) { *os << AeadName(algorithm); }

namespace {

using testvectors::HasFlag;
using testvectors::Hex;
using testvectors::LoadJsonOrDie;
using testvectors::UnhexField;
using Bytes = std::vector<uint8_t>;

constexpr uint32_t kSeed = 0xae4d;  // fixed seed of the random tests

const AeadAlgorithm kAlgorithms[] = {AeadAlgorithm::kChaCha20Poly1305,
                                     AeadAlgorithm::kXChaCha20Poly1305, AeadAlgorithm::kAes256Gcm};

const char* WycheproofFile(AeadAlgorithm algorithm) {
  switch (algorithm) {
    case AeadAlgorithm::kChaCha20Poly1305:
      return "wycheproof/chacha20_poly1305_test.json";
    case AeadAlgorithm::kXChaCha20Poly1305:
      return "wycheproof/xchacha20_poly1305_test.json";
    case AeadAlgorithm::kAes256Gcm:
      return "wycheproof/aes_gcm_test.json";
  }
  return "";
}

using Param = std::tuple<Backend, AeadAlgorithm>;

class AeadTest : public testing::TestWithParam<Param> {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(InitCrypto().ok()); }
  Backend backend() const { return std::get<0>(GetParam()); }
  AeadAlgorithm algorithm() const { return std::get<1>(GetParam()); }
  std::unique_ptr<Aead> Make(const Bytes& key) {
    auto aead = Aead::Create(backend(), algorithm(), key);
    EXPECT_TRUE(aead.ok()) << aead.status();
    return aead.ok() ? *std::move(aead) : nullptr;
  }
};

std::string ParamName(const testing::TestParamInfo<Param>& info) {
  std::string name = std::string(BackendName(std::get<0>(info.param))) + "_" +
                     std::string(AeadName(std::get<1>(info.param)));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

TEST_P(AeadTest, Wycheproof) {
  const auto file = LoadJsonOrDie(WycheproofFile(algorithm()));
  size_t run = 0, skipped_key = 0, nonce_rejected = 0, valid = 0, invalid = 0;
  for (const auto& group : file.at("testGroups")) {
    ASSERT_EQ(group.at("tagSize").get<int>(), 128);
    for (const auto& t : group.at("tests")) {
      const int id = t.at("tcId").get<int>();
      SCOPED_TRACE("tcId " + std::to_string(id) + " " + t.at("comment").get<std::string>());
      const std::string result = t.at("result").get<std::string>();
      ASSERT_NE(result, "acceptable");
      const Bytes key = UnhexField(t.at("key"));
      const Bytes iv = UnhexField(t.at("iv"));
      const Bytes aad = UnhexField(t.at("aad"));
      const Bytes msg = UnhexField(t.at("msg"));
      const Bytes ct = UnhexField(t.at("ct"));
      const Bytes tag = UnhexField(t.at("tag"));
      if (key.size() != kAeadKeySize) {
        // Only AES-GCM has 128/192-bit keys: the API takes 32-byte keys and says so.
        auto rejected = Aead::Create(backend(), algorithm(), key);
        ASSERT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
        ++skipped_key;
        continue;
      }
      auto aead = Make(key);
      ASSERT_NE(aead, nullptr);
      Bytes ct_and_tag = ct;
      ct_and_tag.insert(ct_and_tag.end(), tag.begin(), tag.end());
      Bytes out_open(ct.size());
      Bytes out_seal(msg.size() + kAeadTagSize);
      if (iv.size() != AeadNonceSize(algorithm())) {
        // InvalidNonceSize (ChaCha) and AES-GCM IVs other than 96 bits: refused by size.
        EXPECT_TRUE(result == "invalid" || algorithm() == AeadAlgorithm::kAes256Gcm);
        absl::Status s = aead->Open(iv, aad, ct_and_tag, absl::MakeSpan(out_open));
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(s.message(), "nonce: expected " + std::to_string(AeadNonceSize(algorithm())) +
                                   " bytes, got " + std::to_string(iv.size()));
        EXPECT_EQ(aead->Seal(iv, aad, msg, absl::MakeSpan(out_seal)).code(),
                  absl::StatusCode::kInvalidArgument);
        ++nonce_rejected;
        continue;
      }
      ++run;
      absl::Status opened = aead->Open(iv, aad, ct_and_tag, absl::MakeSpan(out_open));
      if (result == "valid") {
        ++valid;
        ASSERT_TRUE(opened.ok()) << opened;
        EXPECT_EQ(Hex(out_open), Hex(msg));
        ASSERT_TRUE(aead->Seal(iv, aad, msg, absl::MakeSpan(out_seal)).ok());
        EXPECT_EQ(Hex(out_seal), Hex(ct_and_tag));
      } else {
        ++invalid;
        EXPECT_EQ(opened.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(opened.message(), "authentication failed");
        EXPECT_EQ(Hex(out_open), std::string(out_open.size() * 2, '0')) << "output not wiped";
      }
    }
  }
  const size_t total = testvectors::CountWycheproofTests(file);
  EXPECT_EQ(total, file.at("numberOfTests").get<size_t>());
  EXPECT_EQ(run + skipped_key + nonce_rejected, total);
  EXPECT_GT(valid, 0u);
  EXPECT_GT(invalid, 0u);
  if (algorithm() == AeadAlgorithm::kAes256Gcm) {
    EXPECT_EQ(run, 66u);
  } else {
    EXPECT_EQ(nonce_rejected, 9u);
  }
  std::printf("[ wycheproof ] %s on %s: %zu of %zu run (%zu valid, %zu invalid); skipped: %zu "
              "non-256-bit keys, %zu nonce sizes refused by the size check\n",
              std::string(AeadName(algorithm())).c_str(),
              std::string(BackendName(backend())).c_str(), run, total, valid, invalid, skipped_key,
              nonce_rejected);
}

TEST_P(AeadTest, TamperingRejectedAndOutputWiped) {
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("random seed " + std::to_string(kSeed));
  Bytes key(32), nonce(AeadNonceSize(algorithm())), aad(13), msg(100);
  for (auto* v : {&key, &nonce, &aad, &msg}) {
    for (auto& b : *v) b = rng();
  }
  auto aead = Make(key);
  ASSERT_NE(aead, nullptr);
  Bytes sealed(msg.size() + kAeadTagSize);
  ASSERT_TRUE(aead->Seal(nonce, aad, msg, absl::MakeSpan(sealed)).ok());
  Bytes out(msg.size());
  ASSERT_TRUE(aead->Open(nonce, aad, sealed, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, msg);

  auto expect_rejected = [&](const Bytes& n, const Bytes& a, const Bytes& c, const char* what) {
    Bytes o(c.size() - kAeadTagSize, 0xaa);
    absl::Status s = aead->Open(n, a, c, absl::MakeSpan(o));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_EQ(s.message(), "authentication failed") << what;
    EXPECT_EQ(Hex(o), std::string(o.size() * 2, '0')) << what << ": output not wiped";
  };
  for (size_t pos = 0; pos < sealed.size(); pos += 7) {
    Bytes bad = sealed;
    bad[pos] ^= 0x40;
    expect_rejected(nonce, aad, bad, "ciphertext or tag bit");
  }
  Bytes bad_nonce = nonce;
  bad_nonce.back() ^= 1;
  expect_rejected(bad_nonce, aad, sealed, "nonce");
  Bytes bad_aad = aad;
  bad_aad[0] ^= 1;
  expect_rejected(nonce, bad_aad, sealed, "aad");
  expect_rejected(nonce, {}, sealed, "missing aad");
  Bytes truncated(sealed.begin(), sealed.end() - 1);
  expect_rejected(nonce, aad, truncated, "truncated");
  auto other = Make(Bytes(32, 0x11));
  Bytes o(msg.size());
  EXPECT_FALSE(other->Open(nonce, aad, sealed, absl::MakeSpan(o)).ok());
}

TEST_P(AeadTest, SizeChecks) {
  auto bad_key = Aead::Create(backend(), algorithm(), Bytes(16));
  EXPECT_EQ(bad_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_key.status().message(), "key: expected 32 bytes, got 16");
  auto aead = Make(Bytes(32, 3));
  ASSERT_NE(aead, nullptr);
  EXPECT_EQ(aead->algorithm(), algorithm());
  const Bytes nonce(AeadNonceSize(algorithm()), 1), msg(20, 2);
  Bytes out(msg.size());  // missing room for the tag
  absl::Status s = aead->Seal(nonce, {}, msg, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "out: expected 36 bytes, got 20");
  Bytes none;
  s = aead->Open(nonce, {}, Bytes(15), absl::MakeSpan(none));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "ciphertext_and_tag: expected at least 16 bytes, got 15");
  // Empty plaintext and empty aad round-trip (the output is the bare tag).
  Bytes tag(kAeadTagSize);
  ASSERT_TRUE(aead->Seal(nonce, {}, {}, absl::MakeSpan(tag)).ok());
  EXPECT_TRUE(aead->Open(nonce, {}, tag, absl::MakeSpan(none)).ok());
}

INSTANTIATE_TEST_SUITE_P(All, AeadTest,
                         testing::Combine(testing::Values(Backend::kLibsodium, Backend::kOpenSsl),
                                          testing::ValuesIn(kAlgorithms)),
                         ParamName);

TEST(AeadNames, NonceSizesAndNames) {
  EXPECT_EQ(AeadNonceSize(AeadAlgorithm::kChaCha20Poly1305), 12u);
  EXPECT_EQ(AeadNonceSize(AeadAlgorithm::kXChaCha20Poly1305), 24u);
  EXPECT_EQ(AeadNonceSize(AeadAlgorithm::kAes256Gcm), 12u);
  EXPECT_EQ(AeadName(AeadAlgorithm::kXChaCha20Poly1305), "xchacha20-poly1305");
}

// Random messages: sealing on one backend gives the same bytes as on the other, and each opens
// the other's output.
TEST(AeadCrossBackend, RandomSealOpen) {
  ASSERT_TRUE(InitCrypto().ok());
  std::mt19937 rng(kSeed + 1);
  SCOPED_TRACE("random seed " + std::to_string(kSeed + 1));
  for (AeadAlgorithm algorithm : kAlgorithms) {
    SCOPED_TRACE(std::string(AeadName(algorithm)));
    for (int iter = 0; iter < 1500; ++iter) {
      SCOPED_TRACE("iteration " + std::to_string(iter));
      // Mostly short sizes around block boundaries, sometimes larger.
      const size_t size = iter % 10 == 0 ? rng() % 20000 : rng() % 300;
      Bytes key(32), nonce(AeadNonceSize(algorithm)), aad(rng() % 40), msg(size);
      for (auto* v : {&key, &nonce, &aad, &msg}) {
        for (auto& b : *v) b = rng();
      }
      auto a = Aead::Create(Backend::kLibsodium, algorithm, key);
      auto b = Aead::Create(Backend::kOpenSsl, algorithm, key);
      ASSERT_TRUE(a.ok() && b.ok());
      Bytes ca(size + kAeadTagSize), cb(size + kAeadTagSize);
      ASSERT_TRUE((*a)->Seal(nonce, aad, msg, absl::MakeSpan(ca)).ok());
      ASSERT_TRUE((*b)->Seal(nonce, aad, msg, absl::MakeSpan(cb)).ok());
      ASSERT_EQ(ca, cb) << "key " << Hex(key) << " nonce " << Hex(nonce) << " size " << size;
      Bytes pa(size), pb(size);
      ASSERT_TRUE((*a)->Open(nonce, aad, cb, absl::MakeSpan(pa)).ok());
      ASSERT_TRUE((*b)->Open(nonce, aad, ca, absl::MakeSpan(pb)).ok());
      ASSERT_EQ(pa, msg);
      ASSERT_EQ(pb, msg);
      ca[rng() % ca.size()] ^= 1 << (rng() % 8);
      ASSERT_FALSE((*a)->Open(nonce, aad, ca, absl::MakeSpan(pa)).ok());
      ASSERT_FALSE((*b)->Open(nonce, aad, ca, absl::MakeSpan(pb)).ok());
    }
  }
}

}  // namespace
}  // namespace offload::crypto
