#include "service/keys/key_manager.h"

#include <signal.h>
#include <sodium.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/file_key_store.h"
#include "service/keys/internal/test_util.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::Contains;
using ::offload::keys::testing::ReadBytes;
using ::offload::keys::testing::TempDir;
using ::testing::HasSubstr;

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

v1::CreateKeyRequest CreateReq(const std::string& id, v1::KeyType type) {
  v1::CreateKeyRequest r;
  r.set_key_id(id);
  r.set_type(type);
  return r;
}

v1::ImportKeyRequest ImportReq(const std::string& id, v1::KeyType type, absl::Span<const uint8_t> s) {
  v1::ImportKeyRequest r;
  r.set_key_id(id);
  r.set_type(type);
  r.set_secret(std::string(reinterpret_cast<const char*>(s.data()), s.size()));
  return r;
}

constexpr v1::KeyType kAllTypes[] = {v1::KEY_TYPE_ED25519, v1::KEY_TYPE_X25519,
                                     v1::KEY_TYPE_CHACHA20_POLY1305,
                                     v1::KEY_TYPE_XCHACHA20_POLY1305, v1::KEY_TYPE_AES256_GCM};

size_t NonceSize(v1::KeyType type) { return type == v1::KEY_TYPE_XCHACHA20_POLY1305 ? 24 : 12; }

class KeyManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    kek_.resize(32);
    randombytes_buf(kek_.data(), kek_.size());
  }

  std::unique_ptr<KeyManager> Open(crypto::BackendChoice backends = crypto::BackendChoice()) {
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    // DeleteKey at once, as before lifecycle states (key_lifecycle_test.cc covers the wait).
    KeyManager::Options options;
    options.deletion_wait = absl::ZeroDuration();
    auto manager = KeyManager::Create(std::move(*store), backends, options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? std::move(*manager) : nullptr;
  }

  TempDir dir_;
  SecretBytes kek_;
};

// Exercises the prepared crypto object of `v` and cross-checks it against libsodium.
void ExpectUsable(v1::KeyType type, const ManagedKeyVersion& v) {
  const std::string message = "attack at dawn";
  switch (type) {
    case v1::KEY_TYPE_ED25519: {
      ASSERT_NE(v.signer, nullptr);
      EXPECT_EQ(v.x25519, nullptr);
      EXPECT_EQ(v.aead, nullptr);
      std::array<uint8_t, 64> sig;
      ASSERT_TRUE(v.signer->Sign(Bytes(message), absl::MakeSpan(sig)).ok());
      ASSERT_EQ(v.public_key.size(), 32u);
      EXPECT_EQ(crypto_sign_verify_detached(sig.data(), Bytes(message).data(), message.size(),
                                            v.public_key.data()),
                0);
      EXPECT_TRUE(crypto::Ed25519Verify(crypto::Backend::kOpenSsl, v.public_key, Bytes(message), sig));
      break;
    }
    case v1::KEY_TYPE_X25519: {
      ASSERT_NE(v.x25519, nullptr);
      EXPECT_EQ(v.signer, nullptr);
      uint8_t peer_sk[32], peer_pk[32], expected[32];
      randombytes_buf(peer_sk, 32);
      crypto_scalarmult_base(peer_pk, peer_sk);
      ASSERT_EQ(crypto_scalarmult(expected, peer_sk, v.public_key.data()), 0);
      SecretBytes shared(32);
      ASSERT_TRUE(v.x25519->Derive(peer_pk, false, absl::MakeSpan(shared)).ok());
      EXPECT_TRUE(SecretEquals(shared, absl::MakeConstSpan(expected)));
      break;
    }
    default: {
      ASSERT_NE(v.aead, nullptr);
      EXPECT_EQ(v.signer, nullptr);
      EXPECT_TRUE(v.public_key.empty());
      std::vector<uint8_t> nonce(NonceSize(type), 9);
      std::vector<uint8_t> ct(message.size() + 16);
      ASSERT_TRUE(v.aead->Seal(nonce, Bytes("aad"), Bytes(message), absl::MakeSpan(ct)).ok());
      std::vector<uint8_t> pt(message.size());
      ASSERT_TRUE(v.aead->Open(nonce, Bytes("aad"), ct, absl::MakeSpan(pt)).ok());
      EXPECT_EQ(std::string(pt.begin(), pt.end()), message);
      ct[0] ^= 1;
      EXPECT_FALSE(v.aead->Open(nonce, Bytes("aad"), ct, absl::MakeSpan(pt)).ok());
      const crypto::AeadAlgorithm want = type == v1::KEY_TYPE_CHACHA20_POLY1305
                                             ? crypto::AeadAlgorithm::kChaCha20Poly1305
                                         : type == v1::KEY_TYPE_XCHACHA20_POLY1305
                                             ? crypto::AeadAlgorithm::kXChaCha20Poly1305
                                             : crypto::AeadAlgorithm::kAes256Gcm;
      EXPECT_EQ(v.aead->algorithm(), want);
      break;
    }
  }
}

// ---- Every type on both backends -------------------------------------------------------------

class KeyManagerTypeTest
    : public KeyManagerTest,
      public ::testing::WithParamInterface<std::tuple<v1::KeyType, crypto::Backend>> {};

TEST_P(KeyManagerTypeTest, CreateUseRotateReopen) {
  const auto [type, backend] = GetParam();
  const crypto::BackendChoice backends = crypto::BackendChoice::All(backend);
  std::vector<uint8_t> v1_public;
  {
    auto m = Open(backends);
    ASSERT_NE(m, nullptr);
    auto info = m->CreateKey(CreateReq("k", type));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->current_version(), 1u);
    ASSERT_EQ(info->versions_size(), 1);
    EXPECT_EQ(info->versions(0).public_key().size(), type <= v1::KEY_TYPE_X25519 ? 32u : 0u);
    EXPECT_GT(info->versions(0).created_unix_seconds(), 1600000000);
    auto key = m->Find("k");
    ASSERT_NE(key, nullptr);
    ASSERT_NE(key->Current(), nullptr);
    ExpectUsable(type, *key->Current());
    v1_public = key->Current()->public_key;

    auto rotated = m->RotateKey("k");
    ASSERT_TRUE(rotated.ok()) << rotated.status();
    EXPECT_EQ(rotated->current_version(), 2u);
    EXPECT_EQ(rotated->versions_size(), 2);
    if (type <= v1::KEY_TYPE_X25519) {
      EXPECT_NE(rotated->versions(1).public_key(), rotated->versions(0).public_key());
    }
    auto now = m->Find("k");
    ExpectUsable(type, *now->Version(1));
    ExpectUsable(type, *now->Version(2));
    EXPECT_EQ(now->Version(1), key->Version(1)) << "old versions are shared, not rebuilt";
  }
  auto m = Open(backends);
  ASSERT_NE(m, nullptr);
  auto key = m->Find("k");
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->type, type);
  EXPECT_EQ(key->current_version, 2u);
  ASSERT_EQ(key->versions.size(), 2u);
  EXPECT_EQ(key->Version(1)->public_key, v1_public);
  ExpectUsable(type, *key->Version(1));
  ExpectUsable(type, *key->Current());
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, KeyManagerTypeTest,
    ::testing::Combine(::testing::ValuesIn(kAllTypes),
                       ::testing::Values(crypto::Backend::kLibsodium, crypto::Backend::kOpenSsl)),
    [](const auto& info) {
      return absl::StrCat(v1::KeyType_Name(std::get<0>(info.param)), "_",
                          crypto::BackendName(std::get<1>(info.param)));
    });

// ---- Persistence of secrets -------------------------------------------------------------------

TEST_F(KeyManagerTest, SecretsSurviveReopenAcrossBackends) {
  const std::string message = "persist me";
  std::array<uint8_t, 64> sig_before;
  std::vector<uint8_t> sealed(message.size() + 16);
  const std::vector<uint8_t> nonce(24, 1);
  {
    auto m = Open(crypto::BackendChoice::All(crypto::Backend::kLibsodium));
    ASSERT_TRUE(m->CreateKey(CreateReq("sig", v1::KEY_TYPE_ED25519)).ok());
    ASSERT_TRUE(m->CreateKey(CreateReq("box", v1::KEY_TYPE_XCHACHA20_POLY1305)).ok());
    ASSERT_TRUE(m->Find("sig")->Current()->signer->Sign(Bytes(message), absl::MakeSpan(sig_before)).ok());
    ASSERT_TRUE(m->Find("box")->Current()->aead->Seal(nonce, {}, Bytes(message),
                                                       absl::MakeSpan(sealed)).ok());
  }
  auto m = Open(crypto::BackendChoice::All(crypto::Backend::kOpenSsl));
  std::array<uint8_t, 64> sig_after;
  ASSERT_TRUE(m->Find("sig")->Current()->signer->Sign(Bytes(message), absl::MakeSpan(sig_after)).ok());
  EXPECT_EQ(sig_before, sig_after);  // Ed25519 is deterministic: same seed
  std::vector<uint8_t> opened(message.size());
  ASSERT_TRUE(m->Find("box")->Current()->aead->Open(nonce, {}, sealed, absl::MakeSpan(opened)).ok());
  EXPECT_EQ(std::string(opened.begin(), opened.end()), message);
}

TEST_F(KeyManagerTest, WrongKekFailsCleanly) {
  { ASSERT_TRUE(Open()->CreateKey(CreateReq("k", v1::KEY_TYPE_ED25519)).ok()); }
  randombytes_buf(kek_.data(), kek_.size());
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
}

TEST_F(KeyManagerTest, StoredPublicKeyMismatchIsDataLoss) {
  {
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    ASSERT_TRUE(store.ok());
    KeyRecord r;
    r.key_id = "tampered";
    r.type = v1::KEY_TYPE_ED25519;
    r.current_version = 1;
    KeyVersionRecord v;
    v.version = 1;
    v.secret.assign(32, 1);
    v.public_key.assign(32, 2);
    r.versions.push_back(v);
    ASSERT_TRUE((*store)->Put(r).ok());
  }
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  ASSERT_TRUE(store.ok());
  auto m = KeyManager::Create(std::move(*store), crypto::BackendChoice());
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsDataLoss(m.status())) << m.status();
  EXPECT_THAT(Msg(m.status()), HasSubstr("tampered"));
}

// ---- Create / import validation ---------------------------------------------------------------

TEST_F(KeyManagerTest, CreateValidation) {
  auto m = Open();
  for (int t : {0, 6, 99, -1}) {
    auto s = m->CreateKey(CreateReq("k", static_cast<v1::KeyType>(t))).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << t << " " << s;
    EXPECT_THAT(Msg(s), HasSubstr("type"));
  }
  auto s = m->CreateKey(CreateReq("Bad Id", v1::KEY_TYPE_ED25519)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(Msg(s), HasSubstr("key_id"));

  ASSERT_TRUE(m->CreateKey(CreateReq("k", v1::KEY_TYPE_ED25519)).ok());
  s = m->CreateKey(CreateReq("k", v1::KEY_TYPE_X25519)).status();
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  std::vector<uint8_t> secret(32, 3);
  EXPECT_TRUE(absl::IsAlreadyExists(m->ImportKey(ImportReq("k", v1::KEY_TYPE_X25519, secret)).status()));
  EXPECT_EQ(m->size(), 1u);
}

TEST_F(KeyManagerTest, AllowZeroSharedSecretOnlyForX25519) {
  auto m = Open();
  for (v1::KeyType type : kAllTypes) {
    auto req = CreateReq(absl::StrCat("k", static_cast<int>(type)), type);
    req.mutable_options()->set_allow_zero_shared_secret(true);
    auto info = m->CreateKey(req);
    if (type == v1::KEY_TYPE_X25519) {
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_TRUE(info->options().allow_zero_shared_secret());
    } else {
      EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
      EXPECT_THAT(Msg(info.status()), HasSubstr("allow_zero_shared_secret"));
    }
  }
  m.reset();
  m = Open();
  EXPECT_TRUE(m->Find("k2")->options.allow_zero_shared_secret());
  uint8_t zero_peer[32] = {0};
  SecretBytes shared(32);
  EXPECT_TRUE(m->Find("k2")->Current()->x25519->Derive(zero_peer, true, absl::MakeSpan(shared)).ok());
}

// Found by tests/fuzz (http target): options with unknown fields were stored as given, persisted
// and returned by GetKey / ListKeys over gRPC, while the JSON gateway dropped them.
TEST_F(KeyManagerTest, UnknownOptionFieldsAreNotStored) {
  auto m = Open();
  auto add_unknown = [](v1::KeyOptions* options) {
    auto* unknown = options->GetReflection()->MutableUnknownFields(options);
    unknown->AddLengthDelimited(99, std::string(1000, 'x'));
    unknown->AddVarint(100, 7);
  };
  auto create = CreateReq("created", v1::KEY_TYPE_X25519);
  create.mutable_options()->set_allow_zero_shared_secret(true);
  add_unknown(create.mutable_options());
  ASSERT_FALSE(create.options().GetReflection()->GetUnknownFields(create.options()).empty());
  v1::ImportKeyRequest import;
  import.set_key_id("imported");
  import.set_type(v1::KEY_TYPE_AES256_GCM);
  import.set_secret(std::string(32, 's'));
  add_unknown(import.mutable_options());
  const auto no_unknown = [](const v1::KeyInfo& info) {
    return info.options().GetReflection()->GetUnknownFields(info.options()).empty();
  };
  auto created = m->CreateKey(create);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(no_unknown(*created));
  EXPECT_TRUE(created->options().allow_zero_shared_secret());
  auto imported = m->ImportKey(import);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_TRUE(no_unknown(*imported));
  for (int reopen = 0; reopen < 2; ++reopen) {
    for (const v1::KeyInfo& info : m->ListKeys()) EXPECT_TRUE(no_unknown(info)) << info.key_id();
    EXPECT_TRUE(m->Find("created")->options.allow_zero_shared_secret());
    m.reset();
    m = Open();  // nor were they persisted
  }
}

TEST_F(KeyManagerTest, ImportEd25519SeedAndNaclLayout) {
  auto m = Open();
  uint8_t pk[32], sk[64];
  crypto_sign_keypair(pk, sk);  // sk = seed || pk

  auto info = m->ImportKey(ImportReq("seed", v1::KEY_TYPE_ED25519, absl::MakeConstSpan(sk, 32)));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).public_key(), std::string(reinterpret_cast<char*>(pk), 32));

  info = m->ImportKey(ImportReq("nacl", v1::KEY_TYPE_ED25519, absl::MakeConstSpan(sk, 64)));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).public_key(), std::string(reinterpret_cast<char*>(pk), 32));
  // Same seed: identical signatures.
  std::array<uint8_t, 64> a, b;
  ASSERT_TRUE(m->Find("seed")->Current()->signer->Sign(Bytes("m"), absl::MakeSpan(a)).ok());
  ASSERT_TRUE(m->Find("nacl")->Current()->signer->Sign(Bytes("m"), absl::MakeSpan(b)).ok());
  EXPECT_EQ(a, b);

  uint8_t bad[64];
  std::memcpy(bad, sk, 64);
  bad[63] ^= 0x01;
  auto s = m->ImportKey(ImportReq("bad", v1::KEY_TYPE_ED25519, bad)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(Msg(s), "secret: public half does not match the seed");
  EXPECT_EQ(m->Find("bad"), nullptr);

  for (size_t n : {0, 1, 31, 33, 63, 65, 96}) {
    std::vector<uint8_t> wrong(n, 5);
    s = m->ImportKey(ImportReq("wrong", v1::KEY_TYPE_ED25519, wrong)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << n;
    EXPECT_EQ(Msg(s), absl::StrCat("secret: expected 32 or 64 bytes, got ", n));
  }
}

TEST_F(KeyManagerTest, ImportX25519AndAeadKeys) {
  auto m = Open();
  uint8_t sk[32], pk[32];
  randombytes_buf(sk, 32);
  crypto_scalarmult_base(pk, sk);
  auto info = m->ImportKey(ImportReq("x", v1::KEY_TYPE_X25519, sk));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).public_key(), std::string(reinterpret_cast<char*>(pk), 32));

  // An imported ChaCha20-Poly1305 key opens what libsodium sealed with it.
  uint8_t key[32], nonce[12] = {7};
  randombytes_buf(key, 32);
  ASSERT_TRUE(m->ImportKey(ImportReq("c", v1::KEY_TYPE_CHACHA20_POLY1305, key)).ok());
  const std::string pt = "hello";
  std::vector<uint8_t> ct(pt.size() + 16);
  unsigned long long ct_len;
  crypto_aead_chacha20poly1305_ietf_encrypt(ct.data(), &ct_len, Bytes(pt).data(), pt.size(),
                                            nullptr, 0, nullptr, nonce, key);
  std::vector<uint8_t> out(pt.size());
  ASSERT_TRUE(m->Find("c")->Current()->aead->Open(absl::MakeConstSpan(nonce), {}, ct,
                                                   absl::MakeSpan(out)).ok());
  EXPECT_EQ(std::string(out.begin(), out.end()), pt);

  for (v1::KeyType type : {v1::KEY_TYPE_X25519, v1::KEY_TYPE_CHACHA20_POLY1305,
                           v1::KEY_TYPE_XCHACHA20_POLY1305, v1::KEY_TYPE_AES256_GCM}) {
    for (size_t n : {0, 16, 31, 33, 64}) {
      std::vector<uint8_t> wrong(n, 5);
      auto s = m->ImportKey(ImportReq("wrong", type, wrong)).status();
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << type << " " << n;
      EXPECT_EQ(Msg(s), absl::StrCat("secret: expected 32 bytes, got ", n));
    }
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      m->ImportKey(ImportReq("u", v1::KEY_TYPE_UNSPECIFIED, absl::MakeConstSpan(key))).status()));
}

TEST_F(KeyManagerTest, KeyInfoAndFileNeverContainSecrets) {
  auto m = Open();
  std::vector<uint8_t> secret(32);
  randombytes_buf(secret.data(), secret.size());
  ASSERT_TRUE(m->ImportKey(ImportReq("aead", v1::KEY_TYPE_AES256_GCM, secret)).ok());
  ASSERT_TRUE(m->ImportKey(ImportReq("ed", v1::KEY_TYPE_ED25519, secret)).ok());
  ASSERT_TRUE(m->ImportKey(ImportReq("x", v1::KEY_TYPE_X25519, secret)).ok());
  std::string serialized;
  for (const v1::KeyInfo& info : m->ListKeys()) serialized += info.SerializeAsString();
  EXPECT_FALSE(Contains(serialized, std::string(secret.begin(), secret.begin() + 16)));
  EXPECT_FALSE(Contains(serialized, std::string(secret.begin() + 16, secret.end())));
  const std::vector<uint8_t> file = ReadBytes(dir_.Sub(FileKeyStore::kFileName));
  EXPECT_FALSE(Contains(file, std::vector<uint8_t>(secret.begin(), secret.begin() + 16)));
  EXPECT_FALSE(Contains(file, std::vector<uint8_t>(secret.begin() + 16, secret.end())));
}

// ---- Lookups, rotation, deletion, listeners ---------------------------------------------------

TEST_F(KeyManagerTest, GetListAndVersionLookup) {
  auto m = Open();
  for (const char* id : {"zeta", "alpha", "mid"}) {
    ASSERT_TRUE(m->CreateKey(CreateReq(id, v1::KEY_TYPE_ED25519)).ok());
  }
  std::vector<std::string> ids;
  for (const auto& info : m->ListKeys()) ids.push_back(info.key_id());
  EXPECT_EQ(ids, (std::vector<std::string>{"alpha", "mid", "zeta"}));
  EXPECT_EQ(m->size(), 3u);

  EXPECT_TRUE(m->GetKey("alpha").ok());
  EXPECT_TRUE(absl::IsNotFound(m->GetKey("nope").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m->GetKey("NOPE").status()));
  EXPECT_EQ(m->Find("nope"), nullptr);
  EXPECT_EQ(m->Find(""), nullptr);

  ASSERT_TRUE(m->RotateKey("mid").ok());
  ASSERT_TRUE(m->RotateKey("mid").ok());
  auto key = m->Find("mid");
  EXPECT_EQ(key->Current()->version, 3u);
  EXPECT_EQ(key->Version(0), key->Current());
  EXPECT_EQ(key->Version(2)->version, 2u);
  EXPECT_EQ(key->Version(4), nullptr);
  auto info = m->GetKey("mid");
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->versions_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(info->versions(i).version(), static_cast<uint32_t>(i + 1));
}

TEST_F(KeyManagerTest, RotateKeepsOldVersionsUsableAndNotifies) {
  auto m = Open();
  std::vector<std::string> notified;
  absl::Mutex notified_mu;
  m->AddChangeListener([&](absl::string_view id) {
    absl::MutexLock lock(&notified_mu);
    notified.emplace_back(id);
    EXPECT_NE(m->Find(id), nullptr);  // lookups from a listener are fine
  });
  ASSERT_TRUE(m->CreateKey(CreateReq("a", v1::KEY_TYPE_CHACHA20_POLY1305)).ok());
  EXPECT_TRUE(notified.empty()) << "create does not notify";
  auto before = m->Find("a");
  const std::vector<uint8_t> nonce(12, 3);
  std::vector<uint8_t> ct(5 + 16);
  ASSERT_TRUE(before->Current()->aead->Seal(nonce, {}, Bytes("hello"), absl::MakeSpan(ct)).ok());

  auto info = m->RotateKey("a");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->current_version(), 2u);
  EXPECT_EQ(notified, std::vector<std::string>{"a"});
  EXPECT_EQ(before->current_version, 1u) << "old snapshot is immutable";

  auto after = m->Find("a");
  std::vector<uint8_t> pt(5);
  ASSERT_TRUE(after->Version(1)->aead->Open(nonce, {}, ct, absl::MakeSpan(pt)).ok());
  EXPECT_FALSE(after->Current()->aead->Open(nonce, {}, ct, absl::MakeSpan(pt)).ok());

  EXPECT_TRUE(absl::IsNotFound(m->RotateKey("missing").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m->RotateKey("-bad").status()));
  EXPECT_EQ(notified.size(), 1u);

  m.reset();
  m = Open();
  EXPECT_EQ(m->Find("a")->current_version, 2u);
  ASSERT_TRUE(m->Find("a")->Version(1)->aead->Open(nonce, {}, ct, absl::MakeSpan(pt)).ok());
}

TEST_F(KeyManagerTest, DeleteRemovesEverythingAndNotifies) {
  auto m = Open();
  std::vector<std::string> notified;
  m->AddChangeListener([&](absl::string_view id) { notified.emplace_back(id); });
  ASSERT_TRUE(m->CreateKey(CreateReq("gone", v1::KEY_TYPE_X25519)).ok());
  ASSERT_TRUE(m->RotateKey("gone").ok());
  ASSERT_TRUE(m->CreateKey(CreateReq("kept", v1::KEY_TYPE_X25519)).ok());
  auto held = m->Find("gone");
  const std::vector<uint8_t> old_pk = held->Current()->public_key;

  ASSERT_TRUE(m->DeleteKey("gone").ok());
  EXPECT_EQ(m->Find("gone"), nullptr);
  EXPECT_TRUE(absl::IsNotFound(m->GetKey("gone").status()));
  EXPECT_EQ(notified, (std::vector<std::string>{"gone", "gone"}));  // rotate, delete
  ExpectUsable(v1::KEY_TYPE_X25519, *held->Current());  // holders finish their work
  EXPECT_TRUE(absl::IsNotFound(m->DeleteKey("gone")));
  EXPECT_TRUE(absl::IsInvalidArgument(m->DeleteKey("")));
  EXPECT_EQ(m->size(), 1u);

  m.reset();
  m = Open();
  EXPECT_EQ(m->Find("gone"), nullptr);
  EXPECT_NE(m->Find("kept"), nullptr);
  // The id can be reused; it gets a fresh version 1, with a new instance number.
  auto info = m->CreateKey(CreateReq("gone", v1::KEY_TYPE_X25519));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->current_version(), 1u);
  EXPECT_NE(m->Find("gone")->Current()->public_key, old_pk);
  EXPECT_NE(m->Find("gone")->Version(1)->instance, held->Version(1)->instance);
}

TEST_F(KeyManagerTest, InstancesAreUniqueAndStableAcrossRotation) {
  auto m = Open();
  ASSERT_TRUE(m->CreateKey(CreateReq("a", v1::KEY_TYPE_ED25519)).ok());
  ASSERT_TRUE(m->CreateKey(CreateReq("b", v1::KEY_TYPE_ED25519)).ok());
  const uint64_t a1 = m->Find("a")->Current()->instance;
  ASSERT_TRUE(m->RotateKey("a").ok());
  auto a = m->Find("a");
  EXPECT_EQ(a->Version(1)->instance, a1) << "an unchanged version keeps its instance";
  std::set<uint64_t> seen = {a->Version(1)->instance, a->Version(2)->instance,
                             m->Find("b")->Current()->instance};
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.count(0), 0u);
  ASSERT_TRUE(m->DeleteKey("a").ok());
  ASSERT_TRUE(m->CreateKey(CreateReq("a", v1::KEY_TYPE_ED25519)).ok());
  EXPECT_EQ(seen.count(m->Find("a")->Current()->instance), 0u);
}

TEST_F(KeyManagerTest, ConcurrentCreatesAllPersist) {
  constexpr int kThreads = 6;
  constexpr int kPerThread = 10;
  {
    auto m = Open();
    std::atomic<bool> stop{false};
    std::thread reader([&] {
      while (!stop.load()) {
        for (const auto& info : m->ListKeys()) EXPECT_NE(m->Find(info.key_id()), nullptr);
      }
    });
    std::vector<std::thread> writers;
    for (int t = 0; t < kThreads; ++t) {
      writers.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const v1::KeyType type = kAllTypes[(t + i) % 5];
          auto info = m->CreateKey(CreateReq(absl::StrCat("t", t, "-", i), type));
          EXPECT_TRUE(info.ok()) << info.status();
          if (i % 3 == 0) {
            EXPECT_TRUE(m->RotateKey(absl::StrCat("t", t, "-", i)).ok());
          }
        }
      });
    }
    // Racing creates of one id: exactly one wins.
    std::atomic<int> won{0};
    std::vector<std::thread> racers;
    for (int r = 0; r < 4; ++r) {
      racers.emplace_back([&] {
        if (m->CreateKey(CreateReq("contested", v1::KEY_TYPE_ED25519)).ok()) ++won;
      });
    }
    for (auto& w : writers) w.join();
    for (auto& r : racers) r.join();
    stop = true;
    reader.join();
    EXPECT_EQ(won.load(), 1);
    EXPECT_EQ(m->size(), static_cast<size_t>(kThreads * kPerThread + 1));
  }
  auto m = Open();
  EXPECT_EQ(m->size(), static_cast<size_t>(kThreads * kPerThread + 1));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto key = m->Find(absl::StrCat("t", t, "-", i));
      ASSERT_NE(key, nullptr) << t << "-" << i;
      EXPECT_EQ(key->current_version, i % 3 == 0 ? 2u : 1u);
    }
  }
}

// ---- Crash safety -----------------------------------------------------------------------------

// Child: opens the store and mutates it in a loop (creates, and rotations of earlier keys),
// writing one line per acknowledged mutation to `fd`: "C <id>" or "R <id> <version>". Never
// returns.
[[noreturn]] void MutateUntilKilled(const std::string& dir, const SecretBytes& kek, int round, int fd) {
  auto store = FileKeyStore::Open(dir, kek);
  if (!store.ok()) _exit(2);
  auto m = KeyManager::Create(std::move(*store), crypto::BackendChoice());
  if (!m.ok()) _exit(3);
  for (int i = 0;; ++i) {
    std::string line;
    const std::string id = absl::StrCat("r", round, "-", i);
    if (i % 4 == 3) {
      const std::string target = absl::StrCat("r", round, "-", i - 3);
      auto info = (*m)->RotateKey(target);
      if (!info.ok()) _exit(4);
      line = absl::StrCat("R ", target, " ", info->current_version(), "\n");
    } else {
      if (!(*m)->CreateKey(CreateReq(id, kAllTypes[i % 5])).ok()) _exit(5);
      line = absl::StrCat("C ", id, "\n");
    }
    // One write() of < PIPE_BUF bytes: the parent sees the whole line or none of it.
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(6);
  }
}

TEST_F(KeyManagerTest, AcknowledgedMutationsSurviveSigkill) {
  constexpr uint32_t kSeed = 20240611;
  constexpr int kRounds = 8;
  SCOPED_TRACE(absl::StrCat("seed ", kSeed));
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int> delay_ms(5, 80);
  { ASSERT_NE(Open(), nullptr); }  // creates the (empty) store before the first child

  std::set<std::string> created;
  std::map<std::string, uint32_t> rotated;  // id -> highest acknowledged version
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      MutateUntilKilled(dir_.path(), kek_, round, fds[1]);
    }
    ::close(fds[1]);
    // Wait for the first acknowledgement so that every kill lands among mutations, even on a
    // loaded machine, then let it run for a random while.
    std::string acks;
    char buf[4096];
    while (acks.find('\n') == std::string::npos) {
      const ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;  // the child died: reported below
      acks.append(buf, n);
    }
    ::usleep(static_cast<useconds_t>(delay_ms(rng)) * 1000);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);

    for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) acks.append(buf, n);
    ::close(fds[0]);
    for (absl::string_view line : absl::StrSplit(acks, '\n', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts[0] == "C") {
        created.insert(parts[1]);
      } else {
        uint32_t v = 0;
        ASSERT_TRUE(absl::SimpleAtoi(parts[2], &v));
        rotated[parts[1]] = std::max(rotated[parts[1]], v);
      }
    }

    auto m = Open();  // must always load, whatever the moment of the kill
    ASSERT_NE(m, nullptr);
    for (const std::string& id : created) EXPECT_NE(m->Find(id), nullptr) << id;
    for (const auto& [id, version] : rotated) {
      auto key = m->Find(id);
      ASSERT_NE(key, nullptr) << id;
      EXPECT_GE(key->current_version, version) << id;
    }
  }
  EXPECT_GE(created.size(), static_cast<size_t>(kRounds));
  std::cerr << "crash test: " << created.size() << " acknowledged creates, " << rotated.size()
            << " acknowledged rotations over " << kRounds << " kills\n";
}

}  // namespace
}  // namespace offload::keys
