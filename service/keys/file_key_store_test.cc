#include "service/keys/file_key_store.h"

#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/envelope.h"
#include "service/keys/internal/test_util.h"
#include "service/keys/record_codec.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::Contains;
using ::offload::keys::testing::ModeOf;
using ::offload::keys::testing::ReadBytes;
using ::offload::keys::testing::TempDir;
using ::offload::keys::testing::WriteBytes;
using ::testing::HasSubstr;

SecretBytes RandomSecret() {
  SecretBytes s(32);
  randombytes_buf(s.data(), s.size());
  return s;
}

KeyRecord MakeRecord(const std::string& id, v1::KeyType type, int versions) {
  KeyRecord r;
  r.key_id = id;
  r.type = type;
  r.options.set_allow_zero_shared_secret(type == v1::KEY_TYPE_X25519);
  for (int i = 1; i <= versions; ++i) {
    KeyVersionRecord v;
    v.version = static_cast<uint32_t>(i * 2 - 1);  // 1, 3, 5: gaps are allowed
    v.created_unix_seconds = 1700000000 + i;
    { SecretBytes r = RandomSecret(); v.secret.assign(r.begin(), r.end()); }
    if (type == v1::KEY_TYPE_ED25519 || type == v1::KEY_TYPE_X25519) {
      v.public_key.resize(32);
      randombytes_buf(v.public_key.data(), 32);
    }
    r.versions.push_back(std::move(v));
  }
  r.current_version = r.versions.back().version;
  return r;
}

std::vector<KeyRecord> AllTypes() {
  return {MakeRecord("aes", v1::KEY_TYPE_AES256_GCM, 2),
          MakeRecord("chacha", v1::KEY_TYPE_CHACHA20_POLY1305, 1),
          MakeRecord("ed", v1::KEY_TYPE_ED25519, 3),
          MakeRecord("x", v1::KEY_TYPE_X25519, 2),
          MakeRecord("xchacha", v1::KEY_TYPE_XCHACHA20_POLY1305, 1)};
}

void ExpectSameRecords(const std::vector<KeyRecord>& got, const std::vector<KeyRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(want[i].key_id);
    EXPECT_EQ(got[i].key_id, want[i].key_id);
    EXPECT_EQ(got[i].type, want[i].type);
    EXPECT_EQ(got[i].options.allow_zero_shared_secret(), want[i].options.allow_zero_shared_secret());
    EXPECT_EQ(got[i].current_version, want[i].current_version);
    ASSERT_EQ(got[i].versions.size(), want[i].versions.size());
    for (size_t j = 0; j < got[i].versions.size(); ++j) {
      EXPECT_EQ(got[i].versions[j].version, want[i].versions[j].version);
      EXPECT_EQ(got[i].versions[j].created_unix_seconds, want[i].versions[j].created_unix_seconds);
      EXPECT_TRUE(SecretEquals(got[i].versions[j].secret, want[i].versions[j].secret));
      EXPECT_EQ(got[i].versions[j].public_key, want[i].versions[j].public_key);
    }
  }
}

class FileKeyStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    kek_ = RandomSecret();
  }

  std::unique_ptr<FileKeyStore> OpenOrDie() {
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  std::string db() const { return dir_.Sub(FileKeyStore::kFileName); }

  // Writes every record of AllTypes() and closes the store.
  std::vector<KeyRecord> Populate() {
    std::vector<KeyRecord> records = AllTypes();
    auto store = OpenOrDie();
    for (const KeyRecord& r : records) EXPECT_TRUE(store->Put(r).ok());
    return records;
  }

  TempDir dir_;
  SecretBytes kek_;
};

TEST_F(FileKeyStoreTest, EmptyStoreCreatesFileAndLoadsEmpty) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto all = store->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->empty());
  EXPECT_EQ(ModeOf(db()), 0600);
  EXPECT_EQ(store->Describe(), absl::StrCat("file:", db()));
}

TEST_F(FileKeyStoreTest, RoundTripAllTypesAndVersionsAcrossReopen) {
  const std::vector<KeyRecord> records = Populate();
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  auto all = store->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ExpectSameRecords(*all, records);  // AllTypes() is sorted by id
}

TEST_F(FileKeyStoreTest, PutReplacesAndDeleteRemoves) {
  std::vector<KeyRecord> records = Populate();
  {
    auto store = OpenOrDie();
    KeyRecord rotated = MakeRecord("ed", v1::KEY_TYPE_ED25519, 4);
    ASSERT_TRUE(store->Put(rotated).ok());
    records[2] = rotated;
    EXPECT_TRUE(absl::IsFailedPrecondition(
        store->DeleteIf("chacha", [](const KeyRecord&) { return false; })));
    ASSERT_TRUE(store->Load("chacha").ok()) << "a refused DeleteIf removes nothing";
    ASSERT_TRUE(store->Delete("chacha").ok());
    records.erase(records.begin() + 1);
    EXPECT_TRUE(absl::IsNotFound(store->Delete("chacha")));
    EXPECT_TRUE(absl::IsNotFound(store->Delete("never-there")));
  }
  auto store = OpenOrDie();
  auto all = store->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ExpectSameRecords(*all, records);
}

TEST_F(FileKeyStoreTest, InvalidRecordIsRejectedAndFileUnchanged) {
  Populate();
  const std::vector<uint8_t> before = ReadBytes(db());
  auto store = OpenOrDie();
  KeyRecord bad = MakeRecord("bad", v1::KEY_TYPE_AES256_GCM, 1);
  bad.versions[0].secret.resize(31);
  absl::Status s = store->Put(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected 32 bytes, got 31"));
  bad = MakeRecord("Bad", v1::KEY_TYPE_AES256_GCM, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put(bad)));
  bad = MakeRecord("bad", v1::KEY_TYPE_UNSPECIFIED, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put(bad)));
  EXPECT_EQ(ReadBytes(db()), before);
}

TEST_F(FileKeyStoreTest, WrongKekFailsCleanly) {
  Populate();
  auto store = FileKeyStore::Open(dir_.path(), RandomSecret());
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("different key-encryption key"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(db()));
}

TEST_F(FileKeyStoreTest, WrongKekSizeIsInvalidArgument) {
  auto store = FileKeyStore::Open(dir_.path(), SecretBytes(16));
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
}

TEST_F(FileKeyStoreTest, EveryFlippedBitFailsCleanly) {
  Populate();
  const std::vector<uint8_t> good = ReadBytes(db());
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= static_cast<uint8_t>(1u << (i % 8));
    WriteBytes(db(), bad);
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    ASSERT_FALSE(store.ok()) << "flipped byte " << i;
    EXPECT_TRUE(absl::IsDataLoss(store.status()) || absl::IsFailedPrecondition(store.status()))
        << "flipped byte " << i << ": " << store.status();
  }
  WriteBytes(db(), good);
  EXPECT_NE(OpenOrDie(), nullptr);
}

TEST_F(FileKeyStoreTest, EveryTruncationAndTrailingGarbageFailCleanly) {
  Populate();
  const std::vector<uint8_t> good = ReadBytes(db());
  for (size_t n = 0; n < good.size(); ++n) {
    WriteBytes(db(), good.data(), n);
    auto store = FileKeyStore::Open(dir_.path(), kek_);
    ASSERT_FALSE(store.ok()) << "truncated to " << n;
    EXPECT_TRUE(absl::IsDataLoss(store.status())) << "truncated to " << n << ": " << store.status();
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  WriteBytes(db(), longer);
  EXPECT_TRUE(absl::IsDataLoss(FileKeyStore::Open(dir_.path(), kek_).status()));
}

TEST_F(FileKeyStoreTest, ForeignFileFailsCleanly) {
  testing::WriteText(db(), "this is not a key store, just some text that is long enough......");
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  EXPECT_TRUE(absl::IsDataLoss(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("bad magic"));
}

TEST_F(FileKeyStoreTest, LeftoverTempFileIsIgnoredAndRemoved) {
  const std::vector<KeyRecord> records = Populate();
  const std::string temp = dir_.Sub(FileKeyStore::kTempFileName);
  testing::WriteText(temp, "half-written garbage");
  ::chmod(temp.c_str(), 0644);
  {
    auto store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    EXPECT_NE(::access(temp.c_str(), F_OK), 0) << "temp file should be removed on open";
    auto all = store->LoadAll();
    ASSERT_TRUE(all.ok()) << all.status();
    ExpectSameRecords(*all, records);
  }
  // A temp file that is a complete, valid store (crash after fsync, before rename) is ignored too:
  // the rename had not happened, so the write was never acknowledged.
  std::vector<uint8_t> newer_bytes;
  {
    TempDir other;
    auto other_store = FileKeyStore::Open(other.path(), kek_);
    ASSERT_TRUE(other_store.ok());
    ASSERT_TRUE((*other_store)->Put(MakeRecord("unacknowledged", v1::KEY_TYPE_AES256_GCM, 1)).ok());
    newer_bytes = ReadBytes(other.Sub(FileKeyStore::kFileName));
  }
  WriteBytes(temp, newer_bytes);
  auto store = OpenOrDie();
  auto all = store->LoadAll();
  ASSERT_TRUE(all.ok());
  ExpectSameRecords(*all, records);
}

TEST_F(FileKeyStoreTest, FileIsPrivateAndDirectoryCreated0700) {
  const std::string nested = dir_.Sub("a/b/data");
  auto store = FileKeyStore::Open(nested, kek_);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put(MakeRecord("k", v1::KEY_TYPE_ED25519, 1)).ok());
  EXPECT_EQ(ModeOf(nested + "/keys.db"), 0600);
  EXPECT_EQ(ModeOf(nested) & 0077, 0);
}

TEST_F(FileKeyStoreTest, OnDiskBytesDoNotContainSecretsOrIds) {
  const std::vector<KeyRecord> records = Populate();
  const std::vector<uint8_t> bytes = ReadBytes(db());
  for (const KeyRecord& r : records) {
    for (const KeyVersionRecord& v : r.versions) {
      // Any 8 consecutive secret bytes would be a leak.
      for (size_t off = 0; off + 8 <= v.secret.size(); off += 8) {
        std::vector<uint8_t> piece(v.secret.begin() + off, v.secret.begin() + off + 8);
        EXPECT_FALSE(Contains(bytes, piece)) << r.key_id << " v" << v.version;
      }
    }
  }
  EXPECT_FALSE(Contains(bytes, std::string("xchacha")));
  EXPECT_FALSE(Contains(bytes, std::string(reinterpret_cast<const char*>(kek_.data()), 8)));
}

TEST_F(FileKeyStoreTest, SecondOpenOfTheSameDirectoryIsRefused) {
  auto first = OpenOrDie();
  ASSERT_NE(first, nullptr);
  auto second = FileKeyStore::Open(dir_.path(), kek_);
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  first.reset();
  EXPECT_NE(OpenOrDie(), nullptr);
}

TEST_F(FileKeyStoreTest, DuplicateIdsInTheFileAreDataLoss) {
  // Craft a file with two records of one id, sealed under the right KEK.
  const KeyRecord r = MakeRecord("dup", v1::KEY_TYPE_AES256_GCM, 1);
  auto plain = SerializeKeyStoreContents(std::vector<KeyRecord>{r, r});
  ASSERT_TRUE(plain.ok());
  auto blob = SealEnvelope(kek_, EnvelopeKind::kKeyStoreContents, {}, *plain);
  ASSERT_TRUE(blob.ok());
  WriteBytes(db(), *blob);
  auto store = FileKeyStore::Open(dir_.path(), kek_);
  EXPECT_TRUE(absl::IsDataLoss(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("appears twice"));
}

// The calls' failures reach the service's callers (KeyManager passes them on): they say what
// failed, with the code a caller can act on, and name no path. Made as root can't undo: a
// directory where the temp file goes, then where keys.db is, then keys.db overwritten.
// Each failure is made for real (as root too: no mode bits). Only a system call that failed is
// Unavailable (a retry may help); the file's own faults keep their code, so that clients do not
// retry them forever. No message names a path of the server's.
TEST_F(FileKeyStoreTest, CallFailuresNameNoPath) {
  auto store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(MakeRecord("ed", v1::KEY_TYPE_ED25519, 1)).ok());
  const auto expect_no_path = [&](const absl::Status& s) {
    EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr(dir_.path()))) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("/"))) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("keys.db"))) << s;
  };
  const auto expect_load_fails = [&](absl::StatusCode code, const std::string& words) {
    absl::StatusOr<KeyRecord> load = store->Load("ed");
    EXPECT_EQ(load.status().code(), code) << load.status();
    EXPECT_THAT(std::string(load.status().message()), HasSubstr(words));
    expect_no_path(load.status());
  };

  // create keys.db.tmp: EISDIR.
  const std::string temp = dir_.Sub(FileKeyStore::kTempFileName);
  ASSERT_EQ(::mkdir(temp.c_str(), 0700), 0);
  absl::Status put = store->Put(MakeRecord("x", v1::KEY_TYPE_X25519, 1));
  EXPECT_TRUE(absl::IsUnavailable(put)) << put;
  EXPECT_THAT(std::string(put.message()), HasSubstr("key store unavailable: the change could not "
                                                    "be written"));
  expect_no_path(put);
  ASSERT_EQ(::rmdir(temp.c_str()), 0);
  EXPECT_TRUE(absl::IsNotFound(store->Load("x").status()));  // nothing was written

  const std::string aside = db() + ".aside";
  ASSERT_EQ(::rename(db().c_str(), aside.c_str()), 0);
  // open keys.db: ELOOP (a symlink to itself).
  ASSERT_EQ(::symlink(FileKeyStore::kFileName, db().c_str()), 0);
  expect_load_fails(absl::StatusCode::kUnavailable,
                    "key store unavailable: the key store file could not be read");
  ASSERT_EQ(::unlink(db().c_str()), 0);
  // Gone: no retry brings it back.
  expect_load_fails(absl::StatusCode::kDataLoss, "the key store file has disappeared");
  ASSERT_EQ(::mkdir(db().c_str(), 0700), 0);
  expect_load_fails(absl::StatusCode::kFailedPrecondition,
                    "the key store file is not a regular file");
  ASSERT_EQ(::rmdir(db().c_str()), 0);
  testing::WriteText(db(), "");
  ASSERT_EQ(::truncate(db().c_str(), FileKeyStore::kMaxFileSize + 1), 0);  // sparse
  expect_load_fails(absl::StatusCode::kResourceExhausted,
                    "the key store file is larger than 64 MiB");
  ASSERT_EQ(::rename(aside.c_str(), db().c_str()), 0);
  EXPECT_TRUE(store->Load("ed").ok());

  const std::vector<uint8_t> good = ReadBytes(db());
  testing::WriteText(db(), "this is not a key store, just some text that is long enough......");
  absl::Status update = store->Update("ed", [](KeyRecord r) { return r; });
  EXPECT_TRUE(absl::IsDataLoss(update)) << update;
  EXPECT_THAT(std::string(update.message()), HasSubstr("the key store file cannot be opened"));
  expect_no_path(update);

  // Sealed under a KEK this store does not hold: FailedPrecondition naming it.
  TempDir other_dir;
  SecretBytes other_kek = RandomSecret();
  std::string other_name;
  {
    absl::StatusOr<std::shared_ptr<KekRing>> ring = KekRing::FromRawKey(SecretBytes(other_kek));
    ASSERT_TRUE(ring.ok()) << ring.status();
    other_name = (*ring)->Current()->name();
    auto other = FileKeyStore::Open(other_dir.path(), *std::move(ring));
    ASSERT_TRUE(other.ok()) << other.status();
  }
  WriteBytes(db(), ReadBytes(other_dir.Sub(FileKeyStore::kFileName)));
  absl::Status foreign = store->Update("ed", [](KeyRecord r) { return r; });
  EXPECT_TRUE(absl::IsFailedPrecondition(foreign)) << foreign;
  EXPECT_THAT(std::string(foreign.message()), HasSubstr(other_name));
  EXPECT_THAT(std::string(foreign.message()), HasSubstr("does not hold"));
  expect_no_path(foreign);

  WriteBytes(db(), good);
  EXPECT_TRUE(store->Update("ed", [](KeyRecord r) { return r; }).ok());
}

}  // namespace
}  // namespace offload::keys
