// Key lifecycle: disable / enable, scheduled deletion and its cancellation, per-version disable
// and destruction, min_decryption_version, and DestroyDue with a test clock.
#include <sodium.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/file_key_store.h"
#include "service/keys/internal/test_util.h"
#include "service/keys/key_manager.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::TempDir;
using ::testing::HasSubstr;

// A clock the test moves by hand.
class TestClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'900'000'000);
};

v1::CreateKeyRequest CreateReq(const std::string& id, v1::KeyType type) {
  v1::CreateKeyRequest r;
  r.set_key_id(id);
  r.set_type(type);
  return r;
}

v1::KeyVersionRequest VersionReq(const std::string& id, uint32_t version, int64_t wait = 0) {
  v1::KeyVersionRequest r;
  r.set_key_id(id);
  r.set_version(version);
  r.set_wait_seconds(wait);
  return r;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

constexpr absl::Duration kWait = absl::Hours(24 * 7);

class KeyLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    kek_.resize(32);
    randombytes_buf(kek_.data(), kek_.size());
    m_ = Open();
    ASSERT_NE(m_, nullptr);
  }

  std::unique_ptr<KeyManager> Open() {
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    KeyManager::Options options;
    options.deletion_wait = kWait;
    options.clock = [this] { return clock_.Now(); };
    auto manager = KeyManager::Create(std::move(*store), crypto::BackendChoice(), options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? std::move(*manager) : nullptr;
  }

  TempDir dir_;
  SecretBytes kek_;
  TestClock clock_;
  std::unique_ptr<KeyManager> m_;
};

TEST_F(KeyLifecycleTest, DisabledKeyRefusesAndKeepsItsMaterial) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_ED25519)).ok());
  const std::vector<uint8_t> pk = m_->Find("k")->Current()->public_key;
  auto info = m_->DisableKey("k");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), v1::KEY_STATE_DISABLED);
  const absl::Status refused = m_->Find("k")->CheckUsable();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(Msg(refused), HasSubstr("disabled"));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->RotateKey("k").status()));
  EXPECT_TRUE(m_->DisableKey("k").ok()) << "disabling twice is a no-op";

  // Survives a restart, disabled.
  m_.reset();
  m_ = Open();
  EXPECT_EQ(m_->GetKey("k")->state(), v1::KEY_STATE_DISABLED);
  info = m_->EnableKey("k");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), v1::KEY_STATE_ENABLED);
  EXPECT_TRUE(m_->Find("k")->CheckUsable().ok());
  EXPECT_EQ(m_->Find("k")->Current()->public_key, pk);
  EXPECT_TRUE(absl::IsNotFound(m_->DisableKey("nope").status()));
}

TEST_F(KeyLifecycleTest, DeletionWaitsAndCancelBringsTheKeyBackWhole) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_X25519)).ok());
  ASSERT_TRUE(m_->RotateKey("k").ok());
  ASSERT_TRUE(m_->DisableKey("k").ok());
  const v1::KeyInfo before = *m_->GetKey("k");

  v1::DeleteKeyRequest del;
  del.set_key_id("k");
  auto deleted = m_->DeleteKey(del);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->deletion_unix_seconds(), absl::ToUnixSeconds(clock_.Now() + kWait));
  EXPECT_EQ(deleted->key().state(), v1::KEY_STATE_PENDING_DELETION);
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->Find("k")->CheckUsable()));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->DeleteKey(del).status())) << "already scheduled";
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->EnableKey("k").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->RotateKey("k").status()));

  clock_.Advance(kWait - absl::Seconds(1));
  ASSERT_EQ(*m_->DestroyDue(), 0);
  auto back = m_->CancelKeyDeletion("k");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), before.SerializeAsString()) << "back as it was: disabled";
  ASSERT_TRUE(m_->EnableKey("k").ok());
  EXPECT_TRUE(m_->Find("k")->UsableVersion(1, KeyUse::kConsume).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->CancelKeyDeletion("k").status()));

  // Scheduled again, and this time the wait ends: every version is wiped, the id is free.
  ASSERT_TRUE(m_->DeleteKey(del).ok());
  clock_.Advance(kWait);
  auto destroyed = m_->DestroyDue();
  ASSERT_TRUE(destroyed.ok()) << destroyed.status();
  EXPECT_EQ(*destroyed, 1);
  EXPECT_EQ(m_->Find("k"), nullptr);
  EXPECT_TRUE(absl::IsNotFound(m_->GetKey("k").status()));
  EXPECT_TRUE(absl::IsNotFound(m_->CancelKeyDeletion("k").status()));
  m_.reset();
  m_ = Open();
  EXPECT_TRUE(absl::IsNotFound(m_->GetKey("k").status()));
  EXPECT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_X25519)).ok());
}

TEST_F(KeyLifecycleTest, DeletionWaitBounds) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_AES256_GCM)).ok());
  v1::DeleteKeyRequest del;
  del.set_key_id("k");
  del.set_wait_seconds(absl::ToInt64Seconds(kWait) - 1);
  absl::Status s = m_->DeleteKey(del).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("wait_seconds"));
  del.set_wait_seconds(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(m_->DeleteKey(del).status()));
  del.set_wait_seconds(absl::ToInt64Seconds(KeyManager::kMaxDeletionWait) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(m_->DeleteKey(del).status()));
  EXPECT_TRUE(m_->Find("k")->CheckUsable().ok()) << "refused requests change nothing";

  del.set_wait_seconds(absl::ToInt64Seconds(kWait) * 2);  // longer is allowed
  auto deleted = m_->DeleteKey(del);
  ASSERT_TRUE(deleted.ok());
  clock_.Advance(kWait + absl::Hours(1));
  EXPECT_EQ(*m_->DestroyDue(), 0) << "the longer wait is kept";
  clock_.Advance(kWait);
  EXPECT_EQ(*m_->DestroyDue(), 1);
}

TEST_F(KeyLifecycleTest, VersionDisableDestroyAndRestore) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_XCHACHA20_POLY1305)).ok());
  ASSERT_TRUE(m_->RotateKey("k").ok());
  ASSERT_TRUE(m_->RotateKey("k").ok());  // versions 1, 2, 3 (current)

  EXPECT_TRUE(absl::IsFailedPrecondition(m_->DisableKeyVersion(VersionReq("k", 3)).status()))
      << "the current version stays enabled";
  EXPECT_TRUE(absl::IsInvalidArgument(m_->DisableKeyVersion(VersionReq("k", 0)).status()));
  EXPECT_TRUE(absl::IsNotFound(m_->DisableKeyVersion(VersionReq("k", 9)).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->DestroyKeyVersion(VersionReq("k", 1)).status()))
      << "only a disabled version can be destroyed";

  auto info = m_->DisableKeyVersion(VersionReq("k", 1));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DISABLED);
  auto v1_use = m_->Find("k")->UsableVersion(1, KeyUse::kConsume);
  EXPECT_TRUE(absl::IsFailedPrecondition(v1_use.status())) << v1_use.status();
  EXPECT_TRUE(m_->Find("k")->UsableVersion(2, KeyUse::kConsume).ok());
  ASSERT_TRUE(m_->EnableKeyVersion(VersionReq("k", 1)).ok());
  EXPECT_TRUE(m_->Find("k")->UsableVersion(1, KeyUse::kConsume).ok());

  // Destroy version 1 after the wait; restore version 2 before it ends.
  ASSERT_TRUE(m_->DisableKeyVersion(VersionReq("k", 1)).ok());
  ASSERT_TRUE(m_->DisableKeyVersion(VersionReq("k", 2)).ok());
  info = m_->DestroyKeyVersion(VersionReq("k", 1));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DESTROY_SCHEDULED);
  EXPECT_EQ(info->versions(0).destroy_unix_seconds(), absl::ToUnixSeconds(clock_.Now() + kWait));
  ASSERT_TRUE(m_->DestroyKeyVersion(VersionReq("k", 2)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->EnableKeyVersion(VersionReq("k", 2)).status()));
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(m_->RestoreKeyVersion(VersionReq("k", 2)).ok());
  ASSERT_TRUE(m_->EnableKeyVersion(VersionReq("k", 2)).ok());
  clock_.Advance(kWait);
  EXPECT_EQ(*m_->DestroyDue(), 1);

  auto key = m_->Find("k");
  EXPECT_EQ(key->Version(1)->state, v1::KEY_VERSION_STATE_DESTROYED);
  EXPECT_EQ(key->Version(1)->aead, nullptr) << "no crypto object is left";
  EXPECT_TRUE(absl::IsFailedPrecondition(key->UsableVersion(1, KeyUse::kConsume).status()));
  EXPECT_TRUE(key->UsableVersion(2, KeyUse::kConsume).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->EnableKeyVersion(VersionReq("k", 1)).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->RestoreKeyVersion(VersionReq("k", 1)).status()));

  // The wiped secret is gone from the store too: reopened, version 1 is still destroyed and the
  // key still works.
  m_.reset();
  m_ = Open();
  key = m_->Find("k");
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->Version(1)->state, v1::KEY_VERSION_STATE_DESTROYED);
  EXPECT_EQ(m_->GetKey("k")->versions_size(), 3) << "a destroyed version stays listed";
  EXPECT_TRUE(key->UsableVersion(3, KeyUse::kProduce).ok());
}

TEST_F(KeyLifecycleTest, DestroyWithoutWaitWhenConfiguredSo) {
  m_.reset();
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  ASSERT_TRUE(store.ok());
  KeyManager::Options options;
  options.deletion_wait = absl::ZeroDuration();
  auto m = KeyManager::Create(std::move(*store), crypto::BackendChoice(), options);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->CreateKey(CreateReq("k", v1::KEY_TYPE_CHACHA20_POLY1305)).ok());
  ASSERT_TRUE((*m)->RotateKey("k").ok());
  ASSERT_TRUE((*m)->DisableKeyVersion(VersionReq("k", 1)).ok());
  auto info = (*m)->DestroyKeyVersion(VersionReq("k", 1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->versions(0).state(), v1::KEY_VERSION_STATE_DESTROYED);
  ASSERT_TRUE((*m)->DeleteKey("k").ok());
  EXPECT_TRUE(absl::IsNotFound((*m)->GetKey("k").status()));
}

TEST_F(KeyLifecycleTest, MinDecryptionVersion) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("a", v1::KEY_TYPE_AES256_GCM)).ok());
  ASSERT_TRUE(m_->CreateKey(CreateReq("s", v1::KEY_TYPE_ED25519)).ok());
  ASSERT_TRUE(m_->RotateKey("a").ok());
  ASSERT_TRUE(m_->RotateKey("a").ok());
  v1::SetMinDecryptionVersionRequest req;
  req.set_key_id("a");
  req.set_min_decryption_version(4);
  EXPECT_TRUE(absl::IsInvalidArgument(m_->SetMinDecryptionVersion(req).status()));
  req.set_min_decryption_version(2);
  auto info = m_->SetMinDecryptionVersion(req);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->min_decryption_version(), 2u);
  auto key = m_->Find("a");
  auto old = key->UsableVersion(1, KeyUse::kConsume);
  EXPECT_TRUE(absl::IsFailedPrecondition(old.status()));
  EXPECT_THAT(Msg(old.status()), HasSubstr("min_decryption_version"));
  EXPECT_TRUE(key->UsableVersion(2, KeyUse::kConsume).ok());
  EXPECT_TRUE(key->UsableVersion(1, KeyUse::kProduce).ok()) << "only decryption is retired";
  req.set_key_id("s");
  req.set_min_decryption_version(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(m_->SetMinDecryptionVersion(req).status()));
  m_.reset();
  m_ = Open();
  EXPECT_EQ(m_->GetKey("a")->min_decryption_version(), 2u);
}

TEST_F(KeyLifecycleTest, MinDecryptionVersionIsNotLoweredOverADestroyedVersion) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("a", v1::KEY_TYPE_CHACHA20_POLY1305)).ok());
  ASSERT_TRUE(m_->RotateKey("a").ok());
  ASSERT_TRUE(m_->RotateKey("a").ok());
  v1::SetMinDecryptionVersionRequest req;
  req.set_key_id("a");
  req.set_min_decryption_version(3);
  ASSERT_TRUE(m_->SetMinDecryptionVersion(req).ok());
  ASSERT_TRUE(m_->DisableKeyVersion(VersionReq("a", 1)).ok());
  ASSERT_TRUE(m_->DestroyKeyVersion(VersionReq("a", 1)).ok());
  clock_.Advance(kWait);
  ASSERT_EQ(*m_->DestroyDue(), 1);
  ASSERT_EQ(m_->GetKey("a")->versions(0).state(), v1::KEY_VERSION_STATE_DESTROYED);
  // Down to 2 takes back only version 2 (not destroyed): allowed.
  req.set_min_decryption_version(2);
  ASSERT_TRUE(m_->SetMinDecryptionVersion(req).ok());
  // Down to 1 or 0 would take back version 1, destroyed: refused, nothing changed.
  for (uint32_t lowest : {1u, 0u}) {
    req.set_min_decryption_version(lowest);
    const absl::Status refused = m_->SetMinDecryptionVersion(req).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_THAT(Msg(refused), HasSubstr("version 1 of key \"a\", which was destroyed"));
  }
  EXPECT_EQ(m_->GetKey("a")->min_decryption_version(), 2u);
  // Raising it stays allowed.
  req.set_min_decryption_version(3);
  EXPECT_TRUE(m_->SetMinDecryptionVersion(req).ok());
}

TEST_F(KeyLifecycleTest, MinDecryptionVersionRefusesAKeyPendingDeletion) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("a", v1::KEY_TYPE_XCHACHA20_POLY1305)).ok());
  ASSERT_TRUE(m_->RotateKey("a").ok());
  const v1::KeyInfo before = *m_->GetKey("a");
  v1::DeleteKeyRequest del;
  del.set_key_id("a");
  ASSERT_TRUE(m_->DeleteKey(del).ok());
  v1::SetMinDecryptionVersionRequest req;
  req.set_key_id("a");
  req.set_min_decryption_version(2);
  const absl::Status refused = m_->SetMinDecryptionVersion(req).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(Msg(refused), HasSubstr("scheduled for deletion"));
  auto back = m_->CancelKeyDeletion("a");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), before.SerializeAsString()) << "back as it was";
  EXPECT_TRUE(m_->Find("a")->UsableVersion(1, KeyUse::kConsume).ok());
}

TEST_F(KeyLifecycleTest, EveryChangeNotifiesWithNewInstances) {
  std::vector<std::string> notified;
  m_->AddChangeListener([&](absl::string_view id) { notified.emplace_back(id); });
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_X25519)).ok());
  ASSERT_TRUE(m_->RotateKey("k").ok());
  const uint64_t before = m_->Find("k")->Version(2)->instance;
  ASSERT_TRUE(m_->DisableKeyVersion(VersionReq("k", 1)).ok());
  ASSERT_TRUE(m_->DisableKey("k").ok());
  ASSERT_TRUE(m_->EnableKey("k").ok());
  EXPECT_EQ(notified.size(), 4u);
  EXPECT_NE(m_->Find("k")->Version(2)->instance, before)
      << "memo entries of the old snapshot can never match again";
}

TEST_F(KeyLifecycleTest, DestroyedKeyLeavesNoSecretInTheStore) {
  ASSERT_TRUE(m_->CreateKey(CreateReq("k", v1::KEY_TYPE_AES256_GCM)).ok());
  ASSERT_TRUE(m_->DeleteKey("k").ok());
  clock_.Advance(kWait);
  ASSERT_EQ(*m_->DestroyDue(), 1);
  m_.reset();  // the store is held by one process at a time
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  ASSERT_TRUE(store.ok());
  auto all = (*store)->LoadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << "the tombstone is removed too";
}

}  // namespace
}  // namespace offload::keys
