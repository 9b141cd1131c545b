// PostgresKeyStore, PostgresChangeListener and KeyManager over them, against a real PostgreSQL
// whose connection string is in OFFLOAD_POSTGRES_DSN (keyword form; ctest runs this binary under
// tests/integration/pg_support.py, which starts a throwaway server). Each test gets a schema of
// its own (first on its connections' search_path), created through that connection.
#include "service/keys/postgres_key_store.h"

#include <libpq-fe.h>
#include <sodium.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/envelope.h"
#include "service/keys/key_manager.h"
#include "service/keys/record_codec.h"

namespace offload::keys {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string BaseDsn() {
  const char* dsn = std::getenv(kPostgresDsnEnvVar);
  return dsn != nullptr ? dsn : "";
}

// Runs `sql` on `dsn`, returns the first cell of the first row ("" if none); fails the test on error.
std::string Sql(const std::string& dsn, const std::string& sql) {
  PGconn* conn = PQconnectdb(dsn.c_str());
  EXPECT_EQ(PQstatus(conn), CONNECTION_OK) << PQerrorMessage(conn);
  PGresult* r = PQexec(conn, sql.c_str());
  const ExecStatusType status = PQresultStatus(r);
  EXPECT_TRUE(status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK)
      << sql << ": " << PQresultErrorMessage(r);
  std::string out;
  if (status == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
  PQclear(r);
  PQfinish(conn);
  return out;
}

SecretBytes RandomKek() {
  SecretBytes kek(kKekSize);
  randombytes_buf(kek.data(), kek.size());
  return kek;
}

KeyRecord AeadRecord(const std::string& id, uint8_t fill, uint32_t versions = 1) {
  KeyRecord r;
  r.key_id = id;
  r.type = v1::KEY_TYPE_XCHACHA20_POLY1305;
  for (uint32_t v = 1; v <= versions; ++v) {
    KeyVersionRecord kv;
    kv.version = v;
    kv.created_unix_seconds = 1700000000 + v;
    kv.secret = KeyBytes(kKeySecretSize, static_cast<uint8_t>(fill + v));
    r.versions.push_back(std::move(kv));
  }
  r.current_version = versions;
  return r;
}

class PostgresKeyStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (BaseDsn().empty()) {
      GTEST_SKIP() << kPostgresDsnEnvVar << " is not set: run under tests/integration/pg_support.py";
    }
    ASSERT_EQ(sodium_init() >= 0, true);
    static std::atomic<int> counter{0};
    schema_ = absl::StrCat("offload_test_", ::getpid(), "_", counter.fetch_add(1));
    Sql(BaseDsn(), absl::StrCat("CREATE SCHEMA ", schema_));
    dsn_ = absl::StrCat(BaseDsn(), " options=-csearch_path=", schema_);
    kek_ = RandomKek();
  }
  void TearDown() override {
    if (!schema_.empty()) Sql(BaseDsn(), absl::StrCat("DROP SCHEMA IF EXISTS ", schema_, " CASCADE"));
  }

  std::unique_ptr<PostgresKeyStore> OpenStore() {
    auto store = PostgresKeyStore::Open(dsn_, kek_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::string schema_;
  std::string dsn_;
  SecretBytes kek_;
};

TEST_F(PostgresKeyStoreTest, ConcurrentOpensMigrateOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto store = PostgresKeyStore::Open(dsn_, kek_);
      if (store.ok()) ok.fetch_add(1);
      else ADD_FAILURE() << store.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(Sql(dsn_, "SELECT count(*) FROM offload_schema_version"), "1");
  EXPECT_EQ(Sql(dsn_, "SELECT max(version) FROM offload_schema_version"),
            absl::StrCat(PostgresKeyStore::kSchemaVersion));
}

TEST_F(PostgresKeyStoreTest, RefusesANewerSchema) {
  ASSERT_NE(OpenStore(), nullptr);
  Sql(dsn_, "INSERT INTO offload_schema_version (version) VALUES (99)");
  auto store = PostgresKeyStore::Open(dsn_, kek_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("99"));
}

TEST_F(PostgresKeyStoreTest, PutLoadDeleteRoundTrip) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(AeadRecord("b", 10, 2)).ok());
  ASSERT_TRUE(store->Put(AeadRecord("a", 20)).ok());
  ASSERT_TRUE(store->Put(AeadRecord("a.1", 30)).ok());

  auto all = store->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].key_id, "a");  // byte order, as the file store
  EXPECT_EQ((*all)[1].key_id, "a.1");
  EXPECT_EQ((*all)[2].key_id, "b");
  EXPECT_EQ((*all)[2].current_version, 2u);
  ASSERT_EQ((*all)[2].versions.size(), 2u);
  EXPECT_TRUE(SecretEquals((*all)[2].versions[1].secret, SecretBytes(32, 12)));

  auto b = store->Load("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->versions[0].created_unix_seconds, 1700000001);
  EXPECT_EQ(store->Load("zz").status().code(), absl::StatusCode::kNotFound);

  // Put replaces.
  ASSERT_TRUE(store->Put(AeadRecord("b", 40, 3)).ok());
  EXPECT_EQ(store->Load("b")->current_version, 3u);
  EXPECT_EQ(Sql(dsn_, "SELECT current_version FROM offload_keys WHERE key_id = 'b'"), "3");

  // DeleteIf decides on the stored record.
  auto never = [](const KeyRecord&) { return false; };
  auto version_3 = [](const KeyRecord& r) { return r.current_version == 3; };
  EXPECT_EQ(store->DeleteIf("b", never).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->Load("b").ok());
  EXPECT_EQ(store->DeleteIf("zz", version_3).code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(store->Delete("a").ok());
  EXPECT_EQ(store->Delete("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->LoadAll()->size(), 2u);
  ASSERT_TRUE(store->DeleteIf("b", version_3).ok());
  EXPECT_EQ(store->LoadAll()->size(), 1u);
  ASSERT_TRUE(store->Put(AeadRecord("b", 40, 3)).ok());

  // A new connection (another replica) sees the same.
  auto other = OpenStore();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->LoadAll()->size(), 2u);
}

TEST_F(PostgresKeyStoreTest, InsertRefusesAnExistingId) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Insert(AeadRecord("k", 1)).ok());
  const absl::Status again = store->Insert(AeadRecord("k", 2));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(SecretEquals(store->Load("k")->versions[0].secret, SecretBytes(32, 2)));
}

TEST_F(PostgresKeyStoreTest, RejectsInvalidRecords) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  KeyRecord bad = AeadRecord("k", 1);
  bad.versions[0].secret = KeyBytes(31, 1);
  EXPECT_EQ(store->Put(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Insert(bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Put(AeadRecord("k", 1)).ok());
  const absl::Status renamed = store->Update("k", [](KeyRecord r) -> absl::StatusOr<KeyRecord> {
    r.key_id = "other";
    return r;
  });
  EXPECT_EQ(renamed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Update("nope", [](KeyRecord r) -> absl::StatusOr<KeyRecord> { return r; }).code(),
            absl::StatusCode::kNotFound);
  // An error from the update function writes nothing.
  const absl::Status failed = store->Update("k", [](KeyRecord) -> absl::StatusOr<KeyRecord> {
    return absl::FailedPreconditionError("no");
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Load("k")->versions.size(), 1u);
}

// Two connections (two replicas) rotating the same key at once: every rotation lands.
TEST_F(PostgresKeyStoreTest, UpdatesFromTwoConnectionsDoNotOverwriteEachOther) {
  auto first = OpenStore();
  auto second = OpenStore();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(first->Put(AeadRecord("k", 1)).ok());
  constexpr int kRotations = 15;
  auto rotate = [](PostgresKeyStore* store) {
    for (int i = 0; i < kRotations; ++i) {
      absl::Status s = store->Update("k", [](KeyRecord r) -> absl::StatusOr<KeyRecord> {
        KeyVersionRecord v;
        v.version = r.versions.back().version + 1;
        v.secret = KeyBytes(32, static_cast<uint8_t>(v.version));
        r.versions.push_back(std::move(v));
        r.current_version = r.versions.back().version;
        return r;
      });
      EXPECT_TRUE(s.ok()) << s;
    }
  };
  std::thread a(rotate, first.get());
  std::thread b(rotate, second.get());
  a.join();
  b.join();
  auto k = first->Load("k");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->versions.size(), 1u + 2 * kRotations);
  EXPECT_EQ(k->current_version, 1u + 2 * kRotations);
}

TEST_F(PostgresKeyStoreTest, RowsAreEncryptedAndBoundToTheirKeyId) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  KeyRecord r = AeadRecord("secret-key", 0x5a);
  ASSERT_TRUE(store->Put(r).ok());
  ASSERT_TRUE(store->Put(AeadRecord("other", 0x11)).ok());
  // The secret bytes (32 x 0x5b) never appear in the table.
  const std::string hex = Sql(dsn_, "SELECT encode(record, 'hex') FROM offload_keys "
                                    "WHERE key_id = 'secret-key'");
  std::string secret_hex;
  for (int i = 0; i < 32; ++i) secret_hex += "5b";
  ASSERT_FALSE(hex.empty());
  EXPECT_THAT(hex, Not(HasSubstr(secret_hex)));
  EXPECT_EQ(hex.substr(0, 8), "4f464b53");  // "OFKS": the shared envelope

  // Another KEK: FailedPrecondition, not corruption.
  auto foreign = PostgresKeyStore::Open(dsn_, RandomKek());
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  const absl::Status foreign_load = (*foreign)->LoadAll().status();
  EXPECT_EQ(foreign_load.code(), absl::StatusCode::kFailedPrecondition);
  // What reaches a caller names the key, never where the store is.
  EXPECT_THAT(std::string(foreign_load.message()), Not(HasSubstr("host=")));
  EXPECT_THAT(std::string(foreign_load.message()), HasSubstr("key \""));

  // A row copied under another key id does not decrypt.
  Sql(dsn_, "UPDATE offload_keys SET record = (SELECT record FROM offload_keys WHERE "
            "key_id = 'secret-key') WHERE key_id = 'other'");
  const absl::Status damaged = store->Load("other").status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.message()), testing::StartsWith("key \"other\": "));
  EXPECT_THAT(damaged.message(), Not(HasSubstr((*foreign)->Describe())));
  EXPECT_EQ(store->LoadAll().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(store->Load("secret-key").ok());
}

// Issue 33: RewrapAll goes on past a row it cannot read (a KEK this replica does not hold, a
// damaged blob), counts it and names it; the other rows are re-wrapped.
TEST_F(PostgresKeyStoreTest, RewrapAllGoesOnPastUnreadableRowsAndReportsThem) {
  const auto raw = [](SecretBytes key) -> std::shared_ptr<const Kek> {
    return *RawKek::Create(std::move(key));
  };
  const auto ring = [](std::shared_ptr<const Kek> current,
                       std::vector<std::shared_ptr<const Kek>> previous) {
    return *KekRing::Create(std::move(current), std::move(previous));
  };
  const SecretBytes old_key = RandomKek(), new_key = RandomKek(), foreign_key = RandomKek();
  {
    auto store = PostgresKeyStore::Open(dsn_, ring(raw(old_key), {}));
    ASSERT_TRUE(store.ok()) << store.status();
    for (const char* id : {"a", "c", "d", "f"}) ASSERT_TRUE((*store)->Put(AeadRecord(id, 1)).ok());
  }
  {
    auto store = PostgresKeyStore::Open(dsn_, ring(raw(foreign_key), {}));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(AeadRecord("b", 2)).ok());  // under a KEK the rotator lacks
  }
  // "e": a damaged blob (a valid envelope header, then nonsense).
  Sql(dsn_, "INSERT INTO offload_keys (key_id, record, current_version) SELECT 'e', "
            "substring(record from 1 for 40) || '\\x00ff'::bytea, 1 FROM offload_keys "
            "WHERE key_id = 'a'");
  auto store = PostgresKeyStore::Open(dsn_, ring(raw(new_key), {raw(old_key)}));
  ASSERT_TRUE(store.ok()) << store.status();
  auto report = (*store)->RewrapAll();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rewrapped, 4u);
  EXPECT_EQ(report->unreadable, 2u);
  EXPECT_EQ(report->unreadable_keys, (std::vector<std::string>{"b", "e"}));
  EXPECT_THAT(report->first_error, HasSubstr("\"b\""));
  // Every readable row now names the new KEK; the unreadable ones are as they were.
  const std::string new_name = raw(new_key)->name();
  for (const char* id : {"a", "c", "d", "f"}) {
    EXPECT_TRUE((*store)->Load(id).ok()) << id;
    const std::string hex = Sql(dsn_, absl::StrCat("SELECT encode(record, 'hex') FROM "
                                                   "offload_keys WHERE key_id = '", id, "'"));
    const std::string blob = absl::HexStringToBytes(hex);
    auto name = EnvelopeKekName(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(blob.data()), blob.size()));
    ASSERT_TRUE(name.ok()) << name.status();
    EXPECT_EQ(*name, new_name) << id;
  }
  EXPECT_EQ((*store)->Load("b").status().code(), absl::StatusCode::kFailedPrecondition);
  // A second pass: nothing left to move, the same two reported.
  report = (*store)->RewrapAll();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rewrapped, 0u);
  EXPECT_EQ(report->unreadable, 2u);
}

TEST(PostgresDsnTest, DescriptionNeverShowsThePassword) {
  const std::string d = DescribePostgresDsn(
      "host=127.0.0.1 port=5433 dbname=offload user=svc password=hunter2 sslmode=disable");
  EXPECT_EQ(d, "host=127.0.0.1 port=5433 dbname=offload user=svc");
  const std::string uri = DescribePostgresDsn("postgresql://svc:hunter2@db.example:5432/keys");
  EXPECT_THAT(uri, Not(HasSubstr("hunter2")));
  EXPECT_THAT(uri, HasSubstr("user=svc"));
  EXPECT_EQ(DescribePostgresDsn("host='unterminated"), "(unparsable)");
}

// Collects what a listener reports.
struct Heard {
  absl::Mutex mu;
  std::vector<std::string> changes ABSL_GUARDED_BY(mu);
  int resyncs ABSL_GUARDED_BY(mu) = 0;

  PostgresChangeListener::Callbacks Callbacks() {
    return {[this](absl::string_view id) {
              absl::MutexLock lock(&mu);
              changes.emplace_back(id);
              return absl::OkStatus();
            },
            [this] {
              absl::MutexLock lock(&mu);
              ++resyncs;
              return absl::OkStatus();
            }};
  }
  // Waits up to 5 s for `pred` (evaluated under the lock).
  bool WaitFor(const std::function<bool()>& pred) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu);
        if (pred()) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
};

TEST_F(PostgresKeyStoreTest, ListenerHearsEveryCommittedChangeAndResyncsAfterReconnect) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  Heard heard;
  auto listener = PostgresChangeListener::Start(dsn_, heard.Callbacks(), absl::Milliseconds(50));
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_TRUE(heard.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heard.resyncs == 1; }));

  ASSERT_TRUE(store->Insert(AeadRecord("a", 1)).ok());
  ASSERT_TRUE(store->Put(AeadRecord("b", 1)).ok());
  ASSERT_TRUE(store->Update("a", [](KeyRecord r) -> absl::StatusOr<KeyRecord> { return r; }).ok());
  ASSERT_TRUE(store->Delete("b").ok());
  // Failed writes notify nobody.
  ASSERT_FALSE(store->Insert(AeadRecord("a", 2)).ok());
  ASSERT_FALSE(store->Delete("nope").ok());
  ASSERT_FALSE(store->Update("a", [](KeyRecord) -> absl::StatusOr<KeyRecord> {
                      return absl::AbortedError("x");
                    }).ok());
  ASSERT_TRUE(store->Put(AeadRecord("c", 1)).ok());
  EXPECT_TRUE(heard.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return heard.changes == std::vector<std::string>{"a", "b", "a", "b", "c"};
  }));

  // Kill the listener's backend: it reconnects and asks for a full resync.
  Sql(dsn_, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'");
  EXPECT_TRUE(heard.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heard.resyncs == 2; }));
  EXPECT_EQ((*listener)->connections(), 2u);
  ASSERT_TRUE(store->Put(AeadRecord("d", 1)).ok());
  EXPECT_TRUE(heard.WaitFor(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heard.changes.size() == 6; }));
}

// Two key managers on one database, as two replicas: changes made through one reach the other
// through ReloadKey / Resync, with new version instances and change listeners run.
TEST_F(PostgresKeyStoreTest, KeyManagersShareKeysThroughTheStore) {
  const crypto::BackendChoice backends = crypto::BackendChoice::All(crypto::Backend::kLibsodium);
  KeyManager::Options at_once;  // DeleteKey destroys at once (the wait: the lifecycle test below)
  at_once.deletion_wait = absl::ZeroDuration();
  auto a = KeyManager::Create(OpenStore(), backends, at_once);
  auto b = KeyManager::Create(OpenStore(), backends, at_once);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  KeyManager& ka = **a;
  KeyManager& kb = **b;
  std::vector<std::string> b_changes;
  kb.AddChangeListener([&](absl::string_view id) { b_changes.emplace_back(id); });

  v1::CreateKeyRequest create;
  create.set_key_id("shared");
  create.set_type(v1::KEY_TYPE_XCHACHA20_POLY1305);
  ASSERT_TRUE(ka.CreateKey(create).ok());
  EXPECT_EQ(kb.Find("shared"), nullptr);  // no listener in this test: B has not heard yet
  // Creating the same id through B fails (the store decides) and B catches up.
  EXPECT_EQ(kb.CreateKey(create).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_NE(kb.Find("shared"), nullptr);
  EXPECT_TRUE(SecretEquals(ka.Find("shared")->Current()->public_key,
                           kb.Find("shared")->Current()->public_key));

  // Rotation through B from B's view; A reloads and gets version 2 with new instances.
  const uint64_t a_instance_v1 = ka.Find("shared")->Version(1)->instance;
  auto rotated = kb.RotateKey("shared");
  ASSERT_TRUE(rotated.ok()) << rotated.status();
  EXPECT_EQ(rotated->current_version(), 2u);
  EXPECT_EQ(ka.Find("shared")->current_version, 1u);
  ASSERT_TRUE(ka.ReloadKey("shared").ok());
  EXPECT_EQ(ka.Find("shared")->current_version, 2u);
  EXPECT_NE(ka.Find("shared")->Version(1)->instance, a_instance_v1);
  // Reloading an unchanged key changes nothing.
  const uint64_t a_instance_v2 = ka.Find("shared")->Version(2)->instance;
  ASSERT_TRUE(ka.ReloadKey("shared").ok());
  EXPECT_EQ(ka.Find("shared")->Version(2)->instance, a_instance_v2);

  // A rotates while B is stale by one rotation: the stored record decides the next number.
  ASSERT_TRUE(ka.RotateKey("shared").ok());  // version 3 (A is current)
  ASSERT_TRUE(ka.RotateKey("shared").ok());  // version 4
  auto from_stale_b = kb.RotateKey("shared");
  ASSERT_TRUE(from_stale_b.ok()) << from_stale_b.status();
  EXPECT_EQ(from_stale_b->current_version(), 5u);
  EXPECT_EQ(from_stale_b->versions_size(), 5);

  // Deletion through A; B's Resync drops it and runs its change listeners.
  b_changes.clear();
  ASSERT_TRUE(ka.DeleteKey("shared").ok());
  ASSERT_TRUE(kb.Resync().ok());
  EXPECT_EQ(kb.Find("shared"), nullptr);
  EXPECT_EQ(b_changes, std::vector<std::string>{"shared"});
  // Rotating or deleting what another replica deleted is NotFound.
  ASSERT_TRUE(kb.CreateKey(create).ok());
  ASSERT_TRUE(ka.ReloadKey("shared").ok());
  ASSERT_TRUE(kb.DeleteKey("shared").ok());
  EXPECT_EQ(ka.RotateKey("shared").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ka.Find("shared"), nullptr);
}

// The wiring the server uses: a listener driving a key manager, end to end through NOTIFY.
TEST_F(PostgresKeyStoreTest, ListenerKeepsAKeyManagerCurrent) {
  const crypto::BackendChoice backends = crypto::BackendChoice::All(crypto::Backend::kLibsodium);
  KeyManager::Options at_once;
  at_once.deletion_wait = absl::ZeroDuration();
  auto a = KeyManager::Create(OpenStore(), backends, at_once);
  auto b = KeyManager::Create(OpenStore(), backends, at_once);
  ASSERT_TRUE(a.ok() && b.ok());
  KeyManager* kb = b->get();
  auto listener = PostgresChangeListener::Start(
      dsn_, {[kb](absl::string_view id) { return kb->ReloadKey(id); },
             [kb] { return kb->Resync(); }},
      absl::Milliseconds(50));
  ASSERT_TRUE(listener.ok()) << listener.status();
  v1::CreateKeyRequest create;
  create.set_key_id("k1");
  create.set_type(v1::KEY_TYPE_ED25519);
  ASSERT_TRUE((*a)->CreateKey(create).ok());
  auto wait = [&](const std::function<bool()>& pred) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!pred() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return pred();
  };
  EXPECT_TRUE(wait([&] { return kb->Find("k1") != nullptr; }));
  ASSERT_TRUE((*a)->RotateKey("k1").ok());
  EXPECT_TRUE(wait([&] {
    auto k = kb->Find("k1");
    return k != nullptr && k->current_version == 2;
  }));
  ASSERT_TRUE((*a)->DeleteKey("k1").ok());
  EXPECT_TRUE(wait([&] { return kb->Find("k1") == nullptr; }));
}

// Lifecycle across two replicas with a shared test clock: every change is made to the stored
// record, so a replica acting on a stale view never undoes what the other did.
TEST_F(PostgresKeyStoreTest, LifecycleAcrossManagers) {
  const crypto::BackendChoice backends = crypto::BackendChoice::All(crypto::Backend::kLibsodium);
  absl::Time now = absl::FromUnixSeconds(1'900'000'000);
  KeyManager::Options options;
  options.deletion_wait = absl::Hours(1);
  options.clock = [&now] { return now; };
  auto a = KeyManager::Create(OpenStore(), backends, options);
  auto b = KeyManager::Create(OpenStore(), backends, options);
  ASSERT_TRUE(a.ok() && b.ok());
  KeyManager& ka = **a;
  KeyManager& kb = **b;
  v1::CreateKeyRequest create;
  create.set_key_id("life");
  create.set_type(v1::KEY_TYPE_AES256_GCM);
  ASSERT_TRUE(ka.CreateKey(create).ok());
  ASSERT_TRUE(kb.ReloadKey("life").ok());

  // A disables; B, told by the store, refuses too.
  ASSERT_TRUE(ka.DisableKey("life").ok());
  ASSERT_TRUE(kb.ReloadKey("life").ok());
  EXPECT_EQ(kb.Find("life")->CheckUsable().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(kb.EnableKey("life").ok());
  ASSERT_TRUE(ka.ReloadKey("life").ok());
  EXPECT_TRUE(ka.Find("life")->CheckUsable().ok());

  // A schedules deletion, B (stale: it has not reloaded) cancels: the store has the cancel, and
  // A's reaper, past the time, destroys nothing.
  ASSERT_TRUE(ka.DeleteKey("life").ok());
  auto cancelled = kb.CancelKeyDeletion("life");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  now += absl::Hours(2);
  auto destroyed = ka.DestroyDue();
  ASSERT_TRUE(destroyed.ok()) << destroyed.status();
  EXPECT_EQ(*destroyed, 0);
  ASSERT_NE(ka.Find("life"), nullptr);
  EXPECT_TRUE(ka.Find("life")->CheckUsable().ok()) << "A caught up with the cancel";

  // Scheduled again through B; both reapers run after the wait: the key is destroyed once, and
  // gone from both and from the store.
  ASSERT_TRUE(kb.DeleteKey("life").ok());
  ASSERT_TRUE(ka.ReloadKey("life").ok());
  now += absl::Hours(2);
  auto by_a = ka.DestroyDue();
  auto by_b = kb.DestroyDue();
  ASSERT_TRUE(by_a.ok()) << by_a.status();
  ASSERT_TRUE(by_b.ok()) << by_b.status();
  EXPECT_EQ(*by_a + *by_b, 1);
  ASSERT_TRUE(ka.Resync().ok());
  ASSERT_TRUE(kb.Resync().ok());
  EXPECT_EQ(ka.Find("life"), nullptr);
  EXPECT_EQ(kb.Find("life"), nullptr);
  auto stored = OpenStore()->LoadAll();
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->empty());
  ASSERT_TRUE(kb.CreateKey(create).ok()) << "the id is free again";

  // A change A cannot read (the row re-sealed under a KEK A does not hold): A fails closed for
  // that key instead of serving its old snapshot, and serves it again once it reads it.
  ASSERT_TRUE(ka.ReloadKey("life").ok());
  ASSERT_TRUE(ka.Find("life")->CheckUsable().ok());
  auto stored_life = OpenStore()->Load("life");
  ASSERT_TRUE(stored_life.ok());
  SecretBytes other_kek(32, 0x5a);
  auto foreign = PostgresKeyStore::Open(dsn_, other_kek);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  ASSERT_TRUE((*foreign)->Put(*stored_life).ok());
  const absl::Status unreadable = ka.ReloadKey("life");
  EXPECT_EQ(unreadable.code(), absl::StatusCode::kFailedPrecondition) << unreadable;
  EXPECT_EQ(ka.Find("life")->CheckUsable().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(ka.Resync().ok()) << "done key by key";
  EXPECT_EQ(ka.Find("life")->CheckUsable().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(OpenStore()->Put(*stored_life).ok());
  ASSERT_TRUE(ka.ReloadKey("life").ok());
  EXPECT_TRUE(ka.Find("life")->CheckUsable().ok());
}

// ---- lost connections ----------------------------------------------------------------------
// The store under test connects as application_name "victim" so that the test can end exactly
// its session (pg_terminate_backend waits up to 5 s for the backend to exit).

class PostgresReconnectTest : public PostgresKeyStoreTest {
 protected:
  void SetUp() override {
    PostgresKeyStoreTest::SetUp();
    if (IsSkipped()) return;
    victim_dsn_ = absl::StrCat(dsn_, " application_name=", schema_, "_victim");
  }
  void TearDown() override {
    // Before DROP SCHEMA, whose COMMIT would wait for the standby too.
    if (commits_wait_) SetSynchronousStandby("");
    PostgresKeyStoreTest::TearDown();
  }

  std::unique_ptr<PostgresKeyStore> OpenVictim() {
    auto store = PostgresKeyStore::Open(victim_dsn_, kek_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  // Terminates the victim's sessions; returns how many there were.
  int TerminateVictim() {
    return std::stoi(Sql(BaseDsn(), absl::StrCat(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
        "WHERE application_name = '", schema_, "_victim'")));
  }

  // Waits up to 10 s until the victim's session waits on `wait_event` (pg_stat_activity).
  bool WaitForVictim(const std::string& wait_event) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      if (Sql(BaseDsn(), absl::StrCat("SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name = '", schema_, "_victim' AND "
                                      "wait_event = '", wait_event, "'")) != "0") {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Runs `call` on a thread, ends the victim's session once it waits on `wait_event`, and
  // returns what `call` returned.
  absl::Status TerminateDuring(const std::string& wait_event,
                               const std::function<absl::Status()>& call) {
    absl::Status result = absl::UnknownError("not run");
    std::thread t([&] { result = call(); });
    EXPECT_TRUE(WaitForVictim(wait_event)) << "the call never waited on " << wait_event;
    EXPECT_EQ(TerminateVictim(), 1);
    t.join();
    return result;
  }

  // Makes every COMMIT wait for a synchronous standby that never comes, the setting a primary
  // with synchronous replication has: the commit is durable locally before the wait, so a
  // session ended during the wait loses the COMMIT's answer of a committed transaction.
  // Server-wide, until CommitsNoLongerWait (or TearDown).
  void CommitsWaitForAStandby() {
    commits_wait_ = true;
    SetSynchronousStandby("nobody");
    // A session that was open before the reload takes the new setting only when its backend
    // gets round to the reload signal, which on a busy machine can be after its next COMMIT:
    // end the victim's session, so that the store's next call starts a new one (it notices the
    // closed session before use).
    TerminateVictim();
  }
  void CommitsNoLongerWait() {
    SetSynchronousStandby("");
    commits_wait_ = false;
  }

  void SetSynchronousStandby(const std::string& names) {
    Sql(BaseDsn(), absl::StrCat("ALTER SYSTEM SET synchronous_standby_names = '", names, "'"));
    Sql(BaseDsn(), "SELECT pg_reload_conf()");
    // The reload is asynchronous; sessions started after it see the new value.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Sql(BaseDsn(), "SHOW synchronous_standby_names") != names &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(Sql(BaseDsn(), "SHOW synchronous_standby_names"), names);
  }

  // A deferred trigger that sleeps 30 s in the first COMMIT that writes offload_keys, before the
  // commit record: a session ended there loses the COMMIT's answer of an aborted transaction.
  void FirstCommitSleeps() {
    Sql(dsn_, "CREATE SEQUENCE commit_runs");
    Sql(dsn_,
        "CREATE FUNCTION slow_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF nextval('commit_runs') = 1 THEN PERFORM pg_sleep(30); END IF; RETURN NULL; END $$");
    Sql(dsn_,
        "CREATE CONSTRAINT TRIGGER slow_first_commit AFTER INSERT OR UPDATE OR DELETE ON "
        "offload_keys DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "
        "slow_first_commit()");
  }

  std::string Rows(const std::string& key_id) {
    return Sql(dsn_, absl::StrCat("SELECT count(*) FROM offload_keys WHERE key_id = '", key_id,
                                  "'"));
  }

  std::string victim_dsn_;
  bool commits_wait_ = false;
};

// A rotation as KeyManager does it: one new version numbered after the stored record.
KeyStore::UpdateFn AddVersion(int* calls, const std::function<void()>& on_first_call = {}) {
  return [calls, on_first_call](KeyRecord r) -> absl::StatusOr<KeyRecord> {
    if (++*calls == 1 && on_first_call) on_first_call();
    KeyVersionRecord v;
    v.version = r.versions.back().version + 1;
    v.secret = KeyBytes(32, static_cast<uint8_t>(v.version));
    r.versions.push_back(std::move(v));
    r.current_version = r.versions.back().version;
    return r;
  };
}

// The server closed the idle session (pg_terminate_backend; a restart or a pooler does the
// same): the first call afterwards succeeds, for every kind of call.
TEST_F(PostgresReconnectTest, FirstCallAfterTheSessionWasTerminatedSucceeds) {
  auto store = OpenVictim();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(AeadRecord("k", 1)).ok());
  int calls = 0;
  const std::vector<std::pair<std::string, std::function<absl::Status()>>> steps = {
      {"Load", [&] { return store->Load("k").status(); }},
      {"LoadAll", [&] { return store->LoadAll().status(); }},
      {"Insert", [&] { return store->Insert(AeadRecord("n", 2)); }},
      {"Update", [&] { return store->Update("k", AddVersion(&calls)); }},
      {"Put", [&] { return store->Put(AeadRecord("p", 3)); }},
      {"Delete", [&] { return store->Delete("n"); }},
  };
  for (const auto& [name, step] : steps) {
    ASSERT_EQ(TerminateVictim(), 1) << "before " << name;
    const absl::Status s = step();
    EXPECT_TRUE(s.ok()) << name << ": " << s;
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(store->Load("k")->versions.size(), 2u);
  EXPECT_EQ(Rows("n"), "0");
  EXPECT_EQ(Rows("p"), "1");
}

// Lost before COMMIT: nothing was committed, the update runs again on a new connection, reading
// the row afresh. One new version, not two; the update function ran twice.
TEST_F(PostgresReconnectTest, UpdateLostBeforeCommitRunsAgain) {
  auto store = OpenVictim();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(AeadRecord("k", 1)).ok());
  int calls = 0;
  const absl::Status s =
      store->Update("k", AddVersion(&calls, [&] { EXPECT_EQ(TerminateVictim(), 1); }));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 2);
  auto k = store->Load("k");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->versions.size(), 2u);
  EXPECT_EQ(k->current_version, 2u);
}

// Lost while the INSERT statement waited (here for a table lock another session holds): not
// committed, runs again, and creates the key once.
TEST_F(PostgresReconnectTest, InsertLostDuringTheStatementRunsAgain) {
  auto store = OpenVictim();
  ASSERT_NE(store, nullptr);
  PGconn* locker = PQconnectdb(dsn_.c_str());
  ASSERT_EQ(PQstatus(locker), CONNECTION_OK) << PQerrorMessage(locker);
  PQclear(PQexec(locker, "BEGIN; LOCK TABLE offload_keys IN ACCESS EXCLUSIVE MODE"));
  absl::Status result = absl::UnknownError("not run");
  std::thread t([&] { result = store->Insert(AeadRecord("k", 1)); });
  EXPECT_TRUE(WaitForVictim("relation"));
  EXPECT_EQ(TerminateVictim(), 1);
  EXPECT_TRUE(WaitForVictim("relation"));  // the second run waits for the same lock
  PQclear(PQexec(locker, "COMMIT"));
  t.join();
  PQfinish(locker);
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(Rows("k"), "1");
}

// The COMMIT's answer was lost but the transaction committed (the session ended while the commit
// waited for a synchronous standby): the call answers OK and runs nothing again - not
// AlreadyExists for the key it created, not NotFound for the key it deleted, not a second
// version for a rotation.
TEST_F(PostgresReconnectTest, CommittedWritesWhoseAnswerWasLostAreNotRepeated) {
  auto store = OpenVictim();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(AeadRecord("rotated", 1)).ok());
  ASSERT_TRUE(store->Put(AeadRecord("deleted", 1)).ok());
  int calls = 0;
  CommitsWaitForAStandby();
  {
    const absl::Status inserted =
        TerminateDuring("SyncRep", [&] { return store->Insert(AeadRecord("created", 1)); });
    EXPECT_TRUE(inserted.ok()) << inserted;
    const absl::Status updated =
        TerminateDuring("SyncRep", [&] { return store->Update("rotated", AddVersion(&calls)); });
    EXPECT_TRUE(updated.ok()) << updated;
    const absl::Status deleted =
        TerminateDuring("SyncRep", [&] { return store->Delete("deleted"); });
    EXPECT_TRUE(deleted.ok()) << deleted;
  }
  CommitsNoLongerWait();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(Rows("created"), "1");
  EXPECT_EQ(store->Load("rotated")->versions.size(), 2u);
  EXPECT_EQ(Rows("deleted"), "0");
}

// The COMMIT's answer was lost and the transaction aborted (the session ended in a deferred
// trigger, before the commit record): the write runs again and succeeds.
TEST_F(PostgresReconnectTest, AbortedCommitRunsAgain) {
  auto store = OpenVictim();
  ASSERT_NE(store, nullptr);
  FirstCommitSleeps();
  const absl::Status inserted =
      TerminateDuring("PgSleep", [&] { return store->Insert(AeadRecord("k", 1)); });
  EXPECT_TRUE(inserted.ok()) << inserted;
  EXPECT_EQ(Rows("k"), "1");
  EXPECT_EQ(Sql(dsn_, "SELECT last_value FROM commit_runs"), "2");  // the trigger ran twice
}

TEST_F(PostgresReconnectTest, ListenerReconnectsAtOnce) {
  Heard heard;
  // A retry delay far beyond the wait below: the reconnection must not wait for it.
  auto listener = PostgresChangeListener::Start(victim_dsn_, heard.Callbacks(), absl::Seconds(60));
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_TRUE(heard.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heard.resyncs == 1; }));
  ASSERT_EQ(TerminateVictim(), 1);
  EXPECT_TRUE(heard.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return heard.resyncs == 2; }));
  EXPECT_EQ((*listener)->connections(), 2u);
}

}  // namespace
}  // namespace offload::keys
