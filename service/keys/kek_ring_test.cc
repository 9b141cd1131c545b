// The KEK ring and envelope format 2: raw KEKs, several KEKs at once, format 1 still read,
// rotation of a file store (RewrapAll), and malformed blobs.
#include <sodium.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/envelope.h"
#include "service/keys/file_key_store.h"
#include "service/keys/internal/test_util.h"
#include "service/keys/kek.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

SecretBytes RandomSecret() {
  SecretBytes s(32);
  randombytes_buf(s.data(), s.size());
  return s;
}

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::shared_ptr<const Kek> Raw(const SecretBytes& key) {
  auto kek = RawKek::Create(key);
  EXPECT_TRUE(kek.ok()) << kek.status();
  return *kek;
}

std::shared_ptr<KekRing> Ring(std::shared_ptr<const Kek> current,
                              std::vector<std::shared_ptr<const Kek>> previous = {}) {
  auto ring = KekRing::Create(std::move(current), std::move(previous));
  EXPECT_TRUE(ring.ok()) << ring.status();
  return *ring;
}

KeyRecord AesRecord(const std::string& id) {
  KeyRecord r;
  r.key_id = id;
  r.type = v1::KEY_TYPE_AES256_GCM;
  KeyVersionRecord v;
  v.version = 1;
  v.created_unix_seconds = 1700000000;
  { SecretBytes r = RandomSecret(); v.secret.assign(r.begin(), r.end()); }
  r.versions.push_back(std::move(v));
  r.current_version = 1;
  return r;
}

TEST(RawKekTest, WrapsAndBindsAssociatedData) {
  auto kek = Raw(RandomSecret());
  EXPECT_THAT(kek->name(), StartsWith("raw:"));
  EXPECT_EQ(kek->name().size(), 4u + 16u);
  const SecretBytes data_key = RandomSecret();
  auto wrapped = kek->Wrap(data_key, Bytes("aad"));
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_EQ(wrapped->size(), kek->wrapped_size());
  auto back = kek->Unwrap(*wrapped, Bytes("aad"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SecretEquals(*back, data_key));
  EXPECT_TRUE(absl::IsDataLoss(kek->Unwrap(*wrapped, Bytes("other")).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(kek->Wrap(SecretBytes(16), {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(RawKek::Create(SecretBytes(31)).status()));
}

TEST(EnvelopeV2Test, SealsUnderTheCurrentKekAndNamesIt) {
  auto kek = Raw(RandomSecret());
  auto ring = Ring(kek);
  const std::string plain = "record bytes";
  auto blob = SealEnvelope(*ring->Current(), EnvelopeKind::kKeyRecord, Bytes("id-1"), Bytes(plain));
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ((*blob)[4], kEnvelopeFormatKekNamed);
  auto name = EnvelopeKekName(*blob);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(*name, kek->name());
  auto opened = OpenEnvelope(*ring, EnvelopeKind::kKeyRecord, Bytes("id-1"), *blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(std::string(opened->begin(), opened->end()), plain);
  // Bound to the context and the kind.
  EXPECT_TRUE(absl::IsDataLoss(
      OpenEnvelope(*ring, EnvelopeKind::kKeyRecord, Bytes("id-2"), *blob).status()));
  EXPECT_TRUE(absl::IsDataLoss(
      OpenEnvelope(*ring, EnvelopeKind::kKeyStoreContents, Bytes("id-1"), *blob).status()));
  // The span API (a raw KEK) reads format 2 too.
  EXPECT_TRUE(OpenEnvelope(static_cast<const RawKek&>(*kek).key(), EnvelopeKind::kKeyRecord,
                           Bytes("id-1"), *blob)
                  .ok());
}

TEST(EnvelopeV2Test, AKekTheRingDoesNotHoldIsNamed) {
  auto old_kek = Raw(RandomSecret());
  auto blob = SealEnvelope(*old_kek, EnvelopeKind::kKeyRecord, {}, Bytes("x"));
  ASSERT_TRUE(blob.ok());
  auto other = Ring(Raw(RandomSecret()));
  const absl::Status s = OpenEnvelope(*other, EnvelopeKind::kKeyRecord, {}, *blob).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(old_kek->name()));
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not hold"));
  // With the old KEK as a previous one it opens.
  auto both = Ring(Raw(RandomSecret()), {old_kek});
  EXPECT_TRUE(OpenEnvelope(*both, EnvelopeKind::kKeyRecord, {}, *blob).ok());
}

TEST(EnvelopeV2Test, ReadsFormatOneUnderAPreviousRawKek) {
  const SecretBytes old_key = RandomSecret();
  auto v1_blob = SealEnvelope(absl::MakeConstSpan(old_key), EnvelopeKind::kKeyStoreContents, {},
                              Bytes("old"));
  ASSERT_TRUE(v1_blob.ok());
  EXPECT_EQ((*v1_blob)[4], kEnvelopeFormatVersion);
  auto old_kek = Raw(old_key);
  auto name = EnvelopeKekName(*v1_blob);
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(*name, old_kek->name());
  auto ring = Ring(Raw(RandomSecret()), {old_kek});
  auto opened = OpenEnvelope(*ring, EnvelopeKind::kKeyStoreContents, {}, *v1_blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(std::string(opened->begin(), opened->end()), "old");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      OpenEnvelope(*Ring(Raw(RandomSecret())), EnvelopeKind::kKeyStoreContents, {}, *v1_blob)
          .status()));
}

TEST(EnvelopeV2Test, EveryTruncationAndBitFlipFailsCleanly) {
  auto ring = Ring(Raw(RandomSecret()));
  auto blob = SealEnvelope(*ring->Current(), EnvelopeKind::kKeyRecord, {}, Bytes("payload"));
  ASSERT_TRUE(blob.ok());
  for (size_t n = 0; n < blob->size(); ++n) {
    const std::vector<uint8_t> cut(blob->begin(), blob->begin() + n);
    EXPECT_FALSE(OpenEnvelope(*ring, EnvelopeKind::kKeyRecord, {}, cut).ok()) << n;
  }
  for (size_t i = 0; i < blob->size(); ++i) {
    std::vector<uint8_t> bad = *blob;
    bad[i] ^= 0x01;
    const absl::Status s = OpenEnvelope(*ring, EnvelopeKind::kKeyRecord, {}, bad).status();
    EXPECT_FALSE(s.ok()) << i;
  }
  std::vector<uint8_t> future = *blob;
  future[4] = 9;
  EXPECT_THAT(
      std::string(OpenEnvelope(*ring, EnvelopeKind::kKeyRecord, {}, future).status().message()),
      HasSubstr("format version 9"));
}

TEST(KekRingTest, RejectsTwoKeksOfOneName) {
  const SecretBytes key = RandomSecret();
  auto a = Raw(key);
  auto b = Raw(key);  // same bytes, same name, another object
  EXPECT_TRUE(absl::IsInvalidArgument(KekRing::Create(Raw(RandomSecret()), {a, b}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(KekRing::Create(nullptr, {}).status()));
  EXPECT_TRUE(KekRing::Create(a, {a}).ok());  // the current one listed again is harmless
}

TEST(FileKeyStoreRotationTest, RewrapsAFormatOneStoreUnderANewKek) {
  TempDir dir;
  const SecretBytes old_key = RandomSecret();
  {
    // Written with an older build's API: the raw KEK alone.
    auto store = FileKeyStore::Open(dir.path(), old_key);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(AesRecord("a")).ok());
    ASSERT_TRUE((*store)->Put(AesRecord("b")).ok());
  }
  auto new_kek = Raw(RandomSecret());
  {
    auto store = FileKeyStore::Open(dir.path(), Ring(new_kek, {Raw(old_key)}));
    ASSERT_TRUE(store.ok()) << store.status();
    auto all = (*store)->LoadAll();
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->size(), 2u);
    auto rewrapped = (*store)->RewrapAll();
    ASSERT_TRUE(rewrapped.ok()) << rewrapped.status();
    EXPECT_EQ(rewrapped->rewrapped, 2u);
    EXPECT_EQ(rewrapped->unreadable, 0u);
    auto again = (*store)->RewrapAll();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->rewrapped, 0u);
  }
  auto name = EnvelopeKekName(testing::ReadBytes(dir.Sub("keys.db")));
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(*name, new_kek->name());
  {
    auto store = FileKeyStore::Open(dir.path(), Ring(new_kek));
    ASSERT_TRUE(store.ok()) << store.status();
    auto all = (*store)->LoadAll();
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->size(), 2u);
  }
  auto store = FileKeyStore::Open(dir.path(), old_key);
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(new_kek->name()));
}

}  // namespace
}  // namespace offload::keys
