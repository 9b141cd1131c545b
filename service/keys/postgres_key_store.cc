#include "service/keys/postgres_key_store.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/keys/envelope.h"
#include "service/keys/record_codec.h"

namespace offload::keys {
namespace internal {
void PgConnCloser::operator()(PGconn* conn) const { PQfinish(conn); }
}  // namespace internal

namespace {

using internal::PgConnPtr;

struct PgResultCloser {
  void operator()(PGresult* result) const { PQclear(result); }
};
using PgResultPtr = std::unique_ptr<PGresult, PgResultCloser>;

// "offload1" in ASCII: the advisory lock that serialises schema migrations across replicas.
constexpr char kMigrationLockId[] = "8027216001745642545";

struct Migration {
  int version;
  const char* sql;
};
// Append only: a released migration is never edited, a change is a new migration.
constexpr Migration kMigrations[] = {
    {1,
     "CREATE TABLE offload_keys ("
     "  key_id text COLLATE \"C\" PRIMARY KEY"
     "    CHECK (key_id ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),"
     "  record bytea NOT NULL,"  // envelope(kKeyRecord, key id) of offload.store.v1.KeyRecord
     "  current_version bigint NOT NULL,"
     "  updated_at timestamptz NOT NULL DEFAULT now())"},
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == PostgresKeyStore::kSchemaVersion);

void IgnoreNotice(void*, const char*) {}

// The first line of libpq's message, without the trailing newline.
std::string PgMessage(const char* message) {
  std::string m = message != nullptr ? message : "";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

absl::Status ConnectionError(PGconn* conn, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("postgres: ", what, ": ", PgMessage(PQerrorMessage(conn))));
}

absl::StatusOr<PgConnPtr> Connect(const std::string& dsn) {
  PgConnPtr conn(PQconnectdb(dsn.c_str()));
  if (conn == nullptr) return absl::ResourceExhaustedError("postgres: out of memory");
  if (PQstatus(conn.get()) != CONNECTION_OK) return ConnectionError(conn.get(), "connect");
  PQsetNoticeProcessor(conn.get(), &IgnoreNotice, nullptr);
  return conn;
}

// One query parameter: `length` bytes at `data` in binary format, or a NUL-terminated string.
struct Param {
  const char* data;
  int length;
  bool binary;
};

// Runs `sql` with `params`, expecting a command or rows; results come in binary format when
// `binary_result`. Unavailable when the connection is lost, Internal for other failures.
absl::StatusOr<PgResultPtr> Exec(PGconn* conn, const char* sql, const std::vector<Param>& params,
                                 bool binary_result = false) {
  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;
  for (const Param& p : params) {
    values.push_back(p.data);
    lengths.push_back(p.length);
    formats.push_back(p.binary ? 1 : 0);
  }
  PgResultPtr result(PQexecParams(conn, sql, static_cast<int>(params.size()), nullptr,
                                  values.data(), lengths.data(), formats.data(),
                                  binary_result ? 1 : 0));
  if (result == nullptr) return ConnectionError(conn, "query");
  const ExecStatusType status = PQresultStatus(result.get());
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return result;
  const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
  const std::string message =
      absl::StrCat("postgres: ", PgMessage(PQresultErrorMessage(result.get())),
                   state != nullptr ? absl::StrCat(" (SQLSTATE ", state, ")") : "");
  if (PQstatus(conn) != CONNECTION_OK) return absl::UnavailableError(message);
  // Class 40: serialization failure / deadlock, 57: operator intervention (e.g. shutdown).
  if (state != nullptr && (absl::string_view(state).substr(0, 2) == "40" ||
                           absl::string_view(state).substr(0, 2) == "57")) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status ExecCommand(PGconn* conn, const char* sql) { return Exec(conn, sql, {}).status(); }

// A text-typed parameter, sent in binary format (for text that is the raw bytes, so `s` needs no
// terminating NUL).
Param Text(absl::string_view s) { return {s.data(), static_cast<int>(s.size()), true}; }
// A parameter in text format, e.g. a number cast by the query ($1::bigint).
Param Literal(const char* s) { return {s, 0, false}; }

// A transaction rolled back at scope exit unless committed.
class Transaction {
 public:
  explicit Transaction(PGconn* conn) : conn_(conn) {}
  ~Transaction() {
    if (open_) PgResultPtr(PQexec(conn_, "ROLLBACK"));
  }
  absl::Status Begin() {
    OFFLOAD_RETURN_IF_ERROR(ExecCommand(conn_, "BEGIN"));
    open_ = true;
    return absl::OkStatus();
  }
  absl::Status Commit() {
    open_ = false;
    return ExecCommand(conn_, "COMMIT");
  }

 private:
  PGconn* const conn_;
  bool open_ = false;
};

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

absl::Span<const uint8_t> Cell(const PGresult* result, int row, int column) {
  return {reinterpret_cast<const uint8_t*>(PQgetvalue(result, row, column)),
          static_cast<size_t>(PQgetlength(result, row, column))};
}

}  // namespace

std::string DescribePostgresDsn(const std::string& dsn) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(dsn.c_str(), &error);
  if (error != nullptr) PQfreemem(error);
  if (options == nullptr) return "(unparsable)";
  std::vector<std::string> parts;
  for (const char* keyword : {"host", "hostaddr", "port", "dbname", "user"}) {
    for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
      if (absl::string_view(o->keyword) == keyword && o->val != nullptr && o->val[0] != '\0') {
        parts.push_back(absl::StrCat(keyword, "=", o->val));
      }
    }
  }
  PQconninfoFree(options);
  return absl::StrJoin(parts, " ");
}

// ------------------------------------------------------------------------------------------------
// PostgresKeyStore

PostgresKeyStore::PostgresKeyStore(std::string dsn, SecretBytes kek)
    : dsn_(std::move(dsn)),
      description_(absl::StrCat("postgres:", DescribePostgresDsn(dsn_))),
      kek_(std::move(kek)) {}

absl::StatusOr<std::unique_ptr<PostgresKeyStore>> PostgresKeyStore::Open(const std::string& dsn,
                                                                         SecretBytes kek) {
  if (kek.size() != kKekSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek: expected ", kKekSize, " bytes, got ", kek.size()));
  }
  if (dsn.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("postgres_dsn: empty (set --postgres_dsn or ", kPostgresDsnEnvVar, ")"));
  }
  std::unique_ptr<PostgresKeyStore> store(new PostgresKeyStore(dsn, std::move(kek)));
  absl::MutexLock lock(&store->mu_);
  OFFLOAD_RETURN_IF_ERROR(store->EnsureConnectedLocked());
  OFFLOAD_RETURN_IF_ERROR(store->MigrateLocked());
  return store;
}

absl::Status PostgresKeyStore::EnsureConnectedLocked() {
  // A connection left inside a transaction (a ROLLBACK that could not be sent) is not reused.
  if (conn_ != nullptr && PQstatus(conn_.get()) == CONNECTION_OK &&
      PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) {
    return absl::OkStatus();
  }
  conn_.reset();
  absl::StatusOr<PgConnPtr> conn = Connect(dsn_);
  if (!conn.ok()) {
    return absl::Status(conn.status().code(),
                        absl::StrCat(description_, ": ", conn.status().message()));
  }
  // An acknowledged write must survive a crash whatever the server's default.
  OFFLOAD_RETURN_IF_ERROR(ExecCommand(conn->get(), "SET synchronous_commit TO on"));
  conn_ = *std::move(conn);
  return absl::OkStatus();
}

absl::Status PostgresKeyStore::MigrateLocked() {
  PGconn* conn = conn_.get();
  Transaction tx(conn);
  OFFLOAD_RETURN_IF_ERROR(tx.Begin());
  OFFLOAD_RETURN_IF_ERROR(
      Exec(conn, "SELECT pg_advisory_xact_lock($1::bigint)", {Literal(kMigrationLockId)}).status());
  OFFLOAD_RETURN_IF_ERROR(ExecCommand(
      conn,
      "CREATE TABLE IF NOT EXISTS offload_schema_version ("
      "  version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"));
  OFFLOAD_ASSIGN_OR_RETURN(
      PgResultPtr result,
      Exec(conn, "SELECT coalesce(max(version), 0)::text FROM offload_schema_version", {}));
  int current = 0;
  if (PQntuples(result.get()) != 1 || !absl::SimpleAtoi(PQgetvalue(result.get(), 0, 0), &current)) {
    return absl::InternalError("postgres: cannot read offload_schema_version");
  }
  if (current > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(description_, ": schema version ", current,
                     " is newer than this build's (", kSchemaVersion, "); upgrade the server"));
  }
  for (const Migration& m : kMigrations) {
    if (m.version <= current) continue;
    OFFLOAD_RETURN_IF_ERROR(ExecCommand(conn, m.sql));
    const std::string version = absl::StrCat(m.version);
    OFFLOAD_RETURN_IF_ERROR(
        Exec(conn, "INSERT INTO offload_schema_version (version) VALUES ($1::integer)",
             {Literal(version.c_str())})
            .status());
    Log(LogLevel::kInfo, "keystore_migrated",
        {{"store", description_}, {"schema_version", m.version}});
  }
  return tx.Commit();
}

absl::StatusOr<std::vector<uint8_t>> PostgresKeyStore::SealRecord(const KeyRecord& record) const {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(record));
  OFFLOAD_ASSIGN_OR_RETURN(SecretBytes plain, SerializeKeyRecord(record));
  return SealEnvelope(kek_, EnvelopeKind::kKeyRecord, Bytes(record.key_id), plain);
}

absl::StatusOr<KeyRecord> PostgresKeyStore::OpenRecord(absl::string_view key_id,
                                                       absl::Span<const uint8_t> blob) const {
  auto annotate = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(description_, ": key \"", key_id, "\": ",
                                               s.message()));
  };
  if (blob.size() > kMaxRecordSize) {
    return annotate(absl::DataLossError(absl::StrCat("record of ", blob.size(),
                                                     " bytes, expected at most ", kMaxRecordSize)));
  }
  absl::StatusOr<SecretBytes> plain = OpenEnvelope(kek_, EnvelopeKind::kKeyRecord, Bytes(key_id), blob);
  if (!plain.ok()) return annotate(plain.status());
  absl::StatusOr<KeyRecord> record = ParseKeyRecord(*plain);
  if (!record.ok()) return annotate(record.status());
  if (record->key_id != key_id) {
    return annotate(absl::DataLossError(
        absl::StrCat("the row holds the record of \"", record->key_id, "\"")));
  }
  return record;
}

absl::StatusOr<std::vector<KeyRecord>> PostgresKeyStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  OFFLOAD_ASSIGN_OR_RETURN(
      PgResultPtr result,
      Exec(conn_.get(), "SELECT key_id, record FROM offload_keys ORDER BY key_id", {},
           /*binary_result=*/true));
  std::vector<KeyRecord> records;
  const int rows = PQntuples(result.get());
  records.reserve(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    const absl::Span<const uint8_t> id = Cell(result.get(), i, 0);
    OFFLOAD_ASSIGN_OR_RETURN(
        KeyRecord record,
        OpenRecord(absl::string_view(reinterpret_cast<const char*>(id.data()), id.size()),
                   Cell(result.get(), i, 1)));
    records.push_back(std::move(record));
  }
  return records;
}

absl::StatusOr<KeyRecord> PostgresKeyStore::Load(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  OFFLOAD_ASSIGN_OR_RETURN(PgResultPtr result,
                           Exec(conn_.get(), "SELECT record FROM offload_keys WHERE key_id = $1",
                                {Text(key_id)}, /*binary_result=*/true));
  if (PQntuples(result.get()) == 0) {
    return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  }
  return OpenRecord(key_id, Cell(result.get(), 0, 0));
}

absl::StatusOr<int> PostgresKeyStore::WriteLocked(const char* sql, absl::string_view key_id,
                                                  const std::vector<uint8_t>* blob,
                                                  uint32_t current_version) {
  std::vector<Param> params = {Text(key_id)};
  const std::string version = absl::StrCat(current_version);
  if (blob != nullptr) {
    params.push_back({reinterpret_cast<const char*>(blob->data()), static_cast<int>(blob->size()),
                      true});
    params.push_back(Literal(version.c_str()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(PgResultPtr result, Exec(conn_.get(), sql, params));
  return PQntuples(result.get());
}

// Each write is one statement (so one transaction): the data-modifying CTE returns the key id
// it touched and pg_notify sends it, delivered to listeners when the statement commits.
absl::Status PostgresKeyStore::Put(const KeyRecord& record) {
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(record));
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  return WriteLocked(
             "WITH w AS (INSERT INTO offload_keys (key_id, record, current_version)"
             "  VALUES ($1, $2, $3::bigint) ON CONFLICT (key_id) DO UPDATE SET"
             "  record = EXCLUDED.record, current_version = EXCLUDED.current_version,"
             "  updated_at = now() RETURNING key_id)"
             " SELECT pg_notify('offload_key_changes', key_id) FROM w",
             record.key_id, &blob, record.current_version)
      .status();
}

absl::Status PostgresKeyStore::Insert(const KeyRecord& record) {
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(record));
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  OFFLOAD_ASSIGN_OR_RETURN(
      int rows, WriteLocked("WITH w AS (INSERT INTO offload_keys (key_id, record, current_version)"
                            "  VALUES ($1, $2, $3::bigint) ON CONFLICT (key_id) DO NOTHING"
                            "  RETURNING key_id)"
                            " SELECT pg_notify('offload_key_changes', key_id) FROM w",
                            record.key_id, &blob, record.current_version));
  if (rows == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("key \"", record.key_id, "\" is already in the store"));
  }
  return absl::OkStatus();
}

absl::Status PostgresKeyStore::Delete(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  OFFLOAD_ASSIGN_OR_RETURN(
      int rows, WriteLocked("WITH w AS (DELETE FROM offload_keys WHERE key_id = $1"
                            "  RETURNING key_id)"
                            " SELECT pg_notify('offload_key_changes', key_id) FROM w",
                            key_id, nullptr, 0));
  if (rows == 0) return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  return absl::OkStatus();
}

absl::Status PostgresKeyStore::Update(absl::string_view key_id, const UpdateFn& update) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  PGconn* conn = conn_.get();
  Transaction tx(conn);
  OFFLOAD_RETURN_IF_ERROR(tx.Begin());
  // The row lock makes concurrent updates of one key (from any replica) take turns.
  OFFLOAD_ASSIGN_OR_RETURN(
      PgResultPtr result,
      Exec(conn, "SELECT record FROM offload_keys WHERE key_id = $1 FOR UPDATE", {Text(key_id)},
           /*binary_result=*/true));
  if (PQntuples(result.get()) == 0) {
    return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  }
  OFFLOAD_ASSIGN_OR_RETURN(KeyRecord stored, OpenRecord(key_id, Cell(result.get(), 0, 0)));
  result.reset();
  OFFLOAD_ASSIGN_OR_RETURN(KeyRecord updated, update(std::move(stored)));
  if (updated.key_id != key_id) {
    return absl::InvalidArgumentError(absl::StrCat("update: changed the key id from \"", key_id,
                                                   "\" to \"", updated.key_id, "\""));
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(updated));
  OFFLOAD_ASSIGN_OR_RETURN(
      int rows, WriteLocked("WITH w AS (UPDATE offload_keys SET record = $2,"
                            "  current_version = $3::bigint, updated_at = now()"
                            "  WHERE key_id = $1 RETURNING key_id)"
                            " SELECT pg_notify('offload_key_changes', key_id) FROM w",
                            key_id, &blob, updated.current_version));
  if (rows != 1) return absl::InternalError("postgres: locked row vanished during the update");
  return tx.Commit();
}

std::string PostgresKeyStore::Describe() const { return description_; }

// ------------------------------------------------------------------------------------------------
// PostgresChangeListener

PostgresChangeListener::PostgresChangeListener(std::string dsn, Callbacks callbacks,
                                               absl::Duration retry_delay)
    : dsn_(std::move(dsn)), callbacks_(std::move(callbacks)), retry_delay_(retry_delay) {}

absl::StatusOr<std::unique_ptr<PostgresChangeListener>> PostgresChangeListener::Start(
    const std::string& dsn, Callbacks callbacks, absl::Duration retry_delay) {
  if (!callbacks.on_change || !callbacks.on_resync) {
    return absl::InvalidArgumentError("callbacks: on_change and on_resync are both required");
  }
  std::unique_ptr<PostgresChangeListener> listener(
      new PostgresChangeListener(dsn, std::move(callbacks), retry_delay));
  if (::pipe2(listener->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: errno ", errno));
  }
  OFFLOAD_ASSIGN_OR_RETURN(PgConnPtr conn, listener->ConnectAndListen());
  listener->thread_ = std::thread(
      [l = listener.get(), c = conn.release()]() mutable { l->Run(PgConnPtr(c)); });
  return listener;
}

PostgresChangeListener::~PostgresChangeListener() {
  stopping_.store(true);
  if (wake_fds_[1] >= 0) {
    const char byte = 0;
    while (::write(wake_fds_[1], &byte, 1) < 0 && errno == EINTR) {
    }
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : wake_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

absl::StatusOr<PgConnPtr> PostgresChangeListener::ConnectAndListen() {
  OFFLOAD_ASSIGN_OR_RETURN(PgConnPtr conn, Connect(dsn_));
  OFFLOAD_RETURN_IF_ERROR(ExecCommand(conn.get(), "LISTEN offload_key_changes"));
  // Non-blocking, so that a half-received message never blocks the thread past a stop request.
  if (PQsetnonblocking(conn.get(), 1) != 0) return ConnectionError(conn.get(), "setnonblocking");
  connections_.fetch_add(1);
  return conn;
}

bool PostgresChangeListener::Wait(int fd, absl::Duration timeout) {
  struct pollfd fds[2] = {{wake_fds_[0], POLLIN, 0}, {fd, POLLIN, 0}};
  const int n = fd >= 0 ? 2 : 1;
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  while (::poll(fds, n, ms) < 0 && errno == EINTR) {
  }
  return !stopping_.load();
}

void PostgresChangeListener::Run(PgConnPtr conn) {
  const std::string where = DescribePostgresDsn(dsn_);
  bool need_resync = true;  // changes before the LISTEN took effect were not heard
  uint64_t failed_attempts = 0;
  while (!stopping_.load()) {
    if (conn == nullptr) {
      absl::StatusOr<PgConnPtr> reconnected = ConnectAndListen();
      if (!reconnected.ok()) {
        // Logged on attempts 1, 2, 4, 8...: an outage does not flood the log.
        ++failed_attempts;
        if ((failed_attempts & (failed_attempts - 1)) == 0) {
          Log(LogLevel::kWarning, "keystore_listener_reconnect_failed",
              {{"store", where},
               {"attempts", failed_attempts},
               {"error", std::string(reconnected.status().message())}});
        }
        if (!Wait(-1, retry_delay_)) break;
        continue;
      }
      failed_attempts = 0;
      conn = *std::move(reconnected);
      Log(LogLevel::kInfo, "keystore_listener_reconnected", {{"store", where}});
      need_resync = true;
    }
    if (need_resync) {
      const absl::Status s = callbacks_.on_resync();
      need_resync = !s.ok();
      if (!s.ok()) {
        Log(LogLevel::kWarning, "keystore_resync_failed",
            {{"store", where}, {"error", std::string(s.message())}});
        if (!Wait(-1, retry_delay_)) break;
        continue;
      }
    }
    if (!Wait(PQsocket(conn.get()), absl::Seconds(1))) break;
    if (PQconsumeInput(conn.get()) == 0 || PQstatus(conn.get()) != CONNECTION_OK) {
      Log(LogLevel::kWarning, "keystore_listener_disconnected",
          {{"store", where}, {"error", PgMessage(PQerrorMessage(conn.get()))}});
      conn.reset();
      if (!Wait(-1, retry_delay_)) break;
      continue;
    }
    while (PGnotify* n = PQnotifies(conn.get())) {
      const std::string key_id = n->extra != nullptr ? n->extra : "";
      PQfreemem(n);
      notifications_.fetch_add(1);
      if (const absl::Status s = callbacks_.on_change(key_id); !s.ok()) {
        Log(LogLevel::kWarning, "keystore_reload_failed",
            {{"store", where}, {"key_id", key_id}, {"error", std::string(s.message())}});
        need_resync = true;
      }
    }
  }
}

}  // namespace offload::keys
