#include "service/crypto/secure_heap.h"

#include <openssl/crypto.h>

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "service/common/secure_memory.h"
#include "service/crypto/aead.h"
#include "service/crypto/backend.h"
#include "service/crypto/ed25519.h"
#include "service/crypto/x25519.h"

namespace offload::crypto {
namespace {

std::array<uint8_t, 32> Secret(std::mt19937& rng) {
  std::array<uint8_t, 32> s;
  for (auto& b : s) b = static_cast<uint8_t>(rng());
  return s;
}

// One test per process (gtest_discover_tests): SetUpLockedMemory runs once here.
TEST(SecureHeapTest, KeysPastAFullOpenSslHeapFallBackToLibsodiumWithTheSameAnswers) {
  ASSERT_TRUE(InitCrypto().ok());
  auto report = SetUpLockedMemory(1 << 20);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->openssl_heap_bytes, 256u << 10);
  EXPECT_EQ(CRYPTO_secure_malloc_initialized(), 1);
  EXPECT_EQ(secure::GetStats().locked_budget_bytes,
            report->openssl_heap_locked ? (768u << 10) : (1024u << 10));

  const uint32_t seed = 2600;
  std::mt19937 rng(seed);
  const std::array<uint8_t, 32> peer_secret = Secret(rng);
  auto peer = X25519PublicKey(peer_secret);
  ASSERT_TRUE(peer.ok());
  std::vector<std::unique_ptr<X25519PrivateKey>> keys;
  // Managed keys may take half of the 256 KiB heap, 32 bytes each: about 4096 keys; make more.
  for (int i = 0; i < 5000; ++i) {
    const std::array<uint8_t, 32> secret = Secret(rng);
    auto key = X25519PrivateKey::FromBytes(Backend::kOpenSsl, secret);
    ASSERT_TRUE(key.ok()) << key.status() << " key " << i << " seed " << seed;
    auto same = X25519PrivateKey::FromBytes(Backend::kLibsodium, secret);
    ASSERT_TRUE(same.ok());
    std::array<uint8_t, 32> a, b;
    ASSERT_TRUE((*key)->Derive(*peer, false, absl::MakeSpan(a)).ok());
    ASSERT_TRUE((*same)->Derive(*peer, false, absl::MakeSpan(b)).ok());
    ASSERT_EQ(a, b) << "key " << i << " seed " << seed;
    keys.push_back(std::move(*key));
  }
  EXPECT_GT(SecureHeapFallbacks(), 0u);
  EXPECT_GT(SecureHeapUsedBytes(), 64u << 10);
  // The other half stays free for TLS, whose handshakes take their ephemeral keys from it.
  EXPECT_LE(SecureHeapUsedBytes(), (128u << 10) + 64);

  const uint64_t before = SecureHeapFallbacks();
  const std::array<uint8_t, 32> ed_seed = Secret(rng);
  auto signer = Ed25519Signer::FromSeed(Backend::kOpenSsl, ed_seed);
  ASSERT_TRUE(signer.ok()) << signer.status();
  EXPECT_EQ(SecureHeapFallbacks(), before + 1);
  const std::vector<uint8_t> message = {1, 2, 3};
  std::array<uint8_t, 64> sig;
  ASSERT_TRUE((*signer)->Sign(message, absl::MakeSpan(sig)).ok());
  EXPECT_TRUE(Ed25519Verify(Backend::kOpenSsl, (*signer)->public_key(), message, sig));

  // Freeing keys makes room in OpenSSL's heap again.
  keys.clear();
  EXPECT_LT(SecureHeapUsedBytes(), 1u << 10);
  auto again = X25519PrivateKey::FromBytes(Backend::kOpenSsl, Secret(rng));
  ASSERT_TRUE(again.ok());
  EXPECT_GT(SecureHeapUsedBytes(), 0u);
}

TEST(SecureHeapTest, LibsodiumAndAeadKeysLiveInTheLockedRegion) {
  ASSERT_TRUE(InitCrypto().ok());
  ASSERT_TRUE(SetUpLockedMemory(1 << 20).ok());
  const size_t before = secure::GetStats().locked_region_in_use_bytes;
  std::mt19937 rng(26);
  const auto secret = Secret(rng);
  auto x = X25519PrivateKey::FromBytes(Backend::kLibsodium, secret);
  auto ed = Ed25519Signer::FromSeed(Backend::kLibsodium, secret);
  auto chacha = Aead::Create(Backend::kOpenSsl, AeadAlgorithm::kChaCha20Poly1305, secret);
  ASSERT_TRUE(x.ok() && ed.ok() && chacha.ok());
  // 32 (X25519) + 64 (Ed25519 secret key) + 32 (AEAD key)
  EXPECT_EQ(secure::GetStats().locked_region_in_use_bytes, before + 128);
  auto gcm = Aead::Create(Backend::kLibsodium, AeadAlgorithm::kAes256Gcm, secret);
  if (gcm.ok()) {
    EXPECT_GE(secure::GetStats().locked_region_in_use_bytes, before + 128 + 512);
  }
  x->reset();
  ed->reset();
  chacha->reset();
  if (gcm.ok()) gcm->reset();
  EXPECT_EQ(secure::GetStats().locked_region_in_use_bytes, before);
  const secure::Stats s = secure::GetStats();
  EXPECT_GT(s.locked_bytes + s.fallback_bytes, 0u);
}

}  // namespace
}  // namespace offload::crypto
