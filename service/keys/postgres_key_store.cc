#include "service/keys/postgres_key_store.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
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

// True once libpq has seen the connection fail. libpq notices a dead socket only when it reads
// or writes it, so this is the verdict after a call, not before one.
bool Lost(PGconn* conn) { return PQstatus(conn) != CONNECTION_OK; }

// True if the server closed idle connection `conn`: a terminated backend sends a FATAL error
// (57P01) and closes its socket, a restart does the same to every session, a pooler or a
// failover's proxy closes or resets the socket. Each leaves the socket readable while we are idle;
// a live idle connection has nothing to read (apart from the odd ParameterStatus or notice,
// which is consumed harmlessly). One poll() without waiting when nothing is pending.
bool ClosedWhileIdle(PGconn* conn) {
  const int fd = PQsocket(conn);
  if (fd < 0) return true;
  // libpq reads the FATAL message and the end of the stream in separate calls: a few rounds.
  for (int round = 0; round < 4; ++round) {
    struct pollfd p = {fd, POLLIN, 0};
    int n;
    while ((n = ::poll(&p, 1, 0)) < 0 && errno == EINTR) {
    }
    if (n <= 0) return false;  // nothing pending (a poll error: let the statement find out)
    if (PQconsumeInput(conn) == 0 || Lost(conn)) return true;
  }
  return false;
}

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

PostgresKeyStore::PostgresKeyStore(std::string dsn, std::shared_ptr<KekRing> keks)
    : dsn_(std::move(dsn)),
      description_(absl::StrCat("postgres:", DescribePostgresDsn(dsn_))),
      keks_(std::move(keks)) {}

absl::StatusOr<std::unique_ptr<PostgresKeyStore>> PostgresKeyStore::Open(const std::string& dsn,
                                                                         SecretBytes kek) {
  if (kek.size() != kKekSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek: expected ", kKekSize, " bytes, got ", kek.size()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<KekRing> keks, KekRing::FromRawKey(std::move(kek)));
  return Open(dsn, std::move(keks));
}

absl::StatusOr<std::unique_ptr<PostgresKeyStore>> PostgresKeyStore::Open(
    const std::string& dsn, std::shared_ptr<KekRing> keks) {
  if (keks == nullptr) return absl::InvalidArgumentError("kek ring: missing");
  if (dsn.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("postgres_dsn: empty (set --postgres_dsn or ", kPostgresDsnEnvVar, ")"));
  }
  std::unique_ptr<PostgresKeyStore> store(new PostgresKeyStore(dsn, std::move(keks)));
  absl::MutexLock lock(&store->mu_);
  OFFLOAD_RETURN_IF_ERROR(store->EnsureConnectedLocked());
  OFFLOAD_RETURN_IF_ERROR(store->MigrateLocked());
  return store;
}

absl::Status PostgresKeyStore::EnsureConnectedLocked() {
  if (conn_ != nullptr) {
    // A connection left inside a transaction (a ROLLBACK that could not be sent) is not reused.
    const char* reason = Lost(conn_.get())                               ? "lost"
                         : PQtransactionStatus(conn_.get()) != PQTRANS_IDLE ? "left in a transaction"
                         : ClosedWhileIdle(conn_.get())                    ? "closed by the server"
                                                                          : nullptr;
    if (reason == nullptr) return absl::OkStatus();
    Log(LogLevel::kInfo, "keystore_reconnecting",
        {{"store", description_}, {"reason", reason},
         {"error", PgMessage(PQerrorMessage(conn_.get()))}});
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
  return SealEnvelope(*keks_->Current(), EnvelopeKind::kKeyRecord, Bytes(record.key_id), plain);
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
  absl::StatusOr<SecretBytes> plain = OpenEnvelope(*keks_, EnvelopeKind::kKeyRecord, Bytes(key_id), blob);
  if (!plain.ok()) return annotate(plain.status());
  absl::StatusOr<KeyRecord> record = ParseKeyRecord(*plain);
  if (!record.ok()) return annotate(record.status());
  if (record->key_id != key_id) {
    return annotate(absl::DataLossError(
        absl::StrCat("the row holds the record of \"", record->key_id, "\"")));
  }
  return record;
}

absl::Status PostgresKeyStore::ForCaller(absl::string_view what, absl::Status s,
                                         bool outcome_unknown) const {
  // A change whose COMMIT may have gone through is not UNAVAILABLE (which says "not done, send
  // it again": clients retry that, and a rotation would run twice) but UNKNOWN, with no retry
  // delay: the caller reads the key to learn what happened. A record this server cannot read
  // (another KEK, a damaged row) keeps its code: the caller learns which key and why, not where
  // the store is.
  if (!absl::IsUnavailable(s)) {
    return KeyStoreFailureForCaller(description_, description_, what, s, KeyStoreFailure::kOther);
  }
  if (outcome_unknown) {
    return KeyStoreFailureForCaller(description_, description_, what, s,
                                    KeyStoreFailure::kOutcomeUnknown,
                                    "the connection was lost during the change");
  }
  return KeyStoreFailureForCaller(description_, description_, what, s,
                                  KeyStoreFailure::kUnavailable);
}

absl::Status PostgresKeyStore::ReadLocked(absl::string_view what,
                                          const std::function<absl::Status(PGconn*)>& read) {
  return ForCaller(what, ReadAttemptsLocked(what, read));
}

absl::Status PostgresKeyStore::WriteLocked(absl::string_view what, const WriteBody& body) {
  bool outcome_unknown = false;
  absl::Status s = WriteAttemptsLocked(what, body, &outcome_unknown);
  return ForCaller(what, std::move(s), outcome_unknown);
}

absl::Status PostgresKeyStore::ReadAttemptsLocked(
    absl::string_view what, const std::function<absl::Status(PGconn*)>& read) {
  for (int attempt = 1;; ++attempt) {
    OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
    PGconn* conn = conn_.get();
    const absl::Status s = read(conn);
    // Only a lost connection is worth a second run; a read repeated changes nothing.
    if (s.ok() || attempt > 1 || !absl::IsUnavailable(s) || !Lost(conn)) return s;
    Log(LogLevel::kInfo, "keystore_retry",
        {{"store", description_}, {"call", std::string(what)}, {"error", std::string(s.message())}});
  }
}

// Why a write runs in an explicit transaction (BEGIN, one statement, COMMIT: three round trips
// where one would do) and when it runs again after a lost connection.
//
// A write whose COMMIT may have reached the server must not simply run again: if it committed,
// Insert's second run finds its own row and answers AlreadyExists, Delete's finds nothing and
// answers NotFound, and Update's (a rotation) adds a second new version. With a statement in an
// implicit transaction there is no telling: it commits as it runs, and its answer can be lost
// after that. With an explicit transaction the line is sharp:
//   - a failure before COMMIT was sent (BEGIN, the statement, Update's read, a send that failed)
//     committed nothing: the server rolls back a transaction whose session ends. The write runs
//     again, whole (Update reads the row again and calls `update` on what it finds). A session
//     that survives its client (a network cut) holds its row locks until the server notices, so
//     the second run may wait for them; it still cannot commit twice.
//   - a COMMIT whose answer was lost: the transaction id that the statement returned is asked on
//     a new connection with pg_xact_status (the use PostgreSQL documents for it). "committed":
//     the write happened, and the call answers OK without running again (the statement's answer,
//     rows touched, was already checked before COMMIT). "aborted": nothing happened, it runs
//     again. "in progress" (the old session is still alive somewhere), or no answer: Unavailable,
//     saying the outcome is unknown. (After a failover to an asynchronous standby, a commit that
//     was not replicated is lost whatever the client does; pg_xact_status then answers from the
//     new primary's history.)
// Each call runs at most twice: a second lost connection in a row is returned as Unavailable.
absl::Status PostgresKeyStore::WriteAttemptsLocked(absl::string_view what,
                                                   const WriteBody& body, bool* outcome_unknown) {
  for (int attempt = 1;; ++attempt) {
    OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
    PGconn* conn = conn_.get();
    std::string xid;
    {
      Transaction tx(conn);
      absl::Status s = tx.Begin();
      if (s.ok()) {
        absl::StatusOr<std::string> id = body(conn);
        if (id.ok()) xid = *std::move(id);
        else s = id.status();
      }
      if (!s.ok()) {
        // Not committed (no COMMIT was sent): safe to run again if the connection was the cause.
        if (attempt > 1 || !absl::IsUnavailable(s) || !Lost(conn)) return s;
        Log(LogLevel::kInfo, "keystore_retry",
            {{"store", description_}, {"call", std::string(what)}, {"stage", "before commit"},
             {"error", std::string(s.message())}});
        continue;
      }
      s = tx.Commit();
      // A COMMIT refused by a live server (e.g. a serialization failure) was rolled back.
      if (s.ok() || !Lost(conn)) return s;
    }
    absl::StatusOr<std::string> outcome = CommitOutcomeLocked(xid);
    if (outcome.ok() && *outcome == "committed") {
      Log(LogLevel::kInfo, "keystore_commit_confirmed",
          {{"store", description_}, {"call", std::string(what)}});
      return absl::OkStatus();
    }
    if (outcome.ok() && *outcome == "aborted") {
      if (attempt > 1) {
        return absl::UnavailableError(absl::StrCat(
            description_, ": ", what, ": the connection was lost twice; nothing was written"));
      }
      Log(LogLevel::kInfo, "keystore_retry",
          {{"store", description_}, {"call", std::string(what)}, {"stage", "commit aborted"}});
      continue;
    }
    *outcome_unknown = true;
    return absl::UnavailableError(absl::StrCat(
        description_, ": ", what, ": the connection was lost during COMMIT and its outcome is "
        "unknown (",
        outcome.ok() ? absl::StrCat("transaction ", xid, " is ", *outcome)
                     : std::string(outcome.status().message()),
        "); read the key before trying again"));
  }
}

absl::StatusOr<std::string> PostgresKeyStore::CommitOutcomeLocked(const std::string& xid) {
  if (xid.empty()) return absl::InternalError("no transaction id");
  OFFLOAD_RETURN_IF_ERROR(EnsureConnectedLocked());
  OFFLOAD_ASSIGN_OR_RETURN(
      PgResultPtr result,
      Exec(conn_.get(), "SELECT coalesce(pg_xact_status($1::xid8), 'unknown')",
           {Literal(xid.c_str())}));
  if (PQntuples(result.get()) != 1) return absl::InternalError("pg_xact_status: no row");
  return std::string(PQgetvalue(result.get(), 0, 0));
}

absl::StatusOr<std::vector<KeyRecord>> PostgresKeyStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  std::vector<KeyRecord> records;
  OFFLOAD_RETURN_IF_ERROR(ReadLocked("load all", [&](PGconn* conn) -> absl::Status {
    OFFLOAD_ASSIGN_OR_RETURN(
        PgResultPtr result,
        Exec(conn, "SELECT key_id, record FROM offload_keys ORDER BY key_id", {},
             /*binary_result=*/true));
    records.clear();
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
    return absl::OkStatus();
  }));
  return records;
}

absl::StatusOr<KeyRecord> PostgresKeyStore::Load(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  std::optional<KeyRecord> record;
  OFFLOAD_RETURN_IF_ERROR(ReadLocked("load", [&](PGconn* conn) -> absl::Status {
    OFFLOAD_ASSIGN_OR_RETURN(PgResultPtr result,
                             Exec(conn, "SELECT record FROM offload_keys WHERE key_id = $1",
                                  {Text(key_id)}, /*binary_result=*/true));
    if (PQntuples(result.get()) == 0) {
      return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
    }
    OFFLOAD_ASSIGN_OR_RETURN(record, OpenRecord(key_id, Cell(result.get(), 0, 0)));
    return absl::OkStatus();
  }));
  return *std::move(record);
}

namespace {

// Runs write statement `sql` (parameters: $1 key id, and with `blob` $2 record and $3 current
// version) whose one row is (rows written, transaction id); returns the rows and sets `xid`.
// Every write statement has this shape: the data-modifying CTE returns the key ids it touched,
// pg_notify sends each (delivered to listeners when the transaction commits), and
// pg_current_xact_id() names the transaction for CommitOutcomeLocked.
absl::StatusOr<int> RunWrite(PGconn* conn, const char* sql, absl::string_view key_id,
                             const std::vector<uint8_t>* blob, uint32_t current_version,
                             std::string* xid) {
  std::vector<Param> params = {Text(key_id)};
  const std::string version = absl::StrCat(current_version);
  if (blob != nullptr) {
    params.push_back({reinterpret_cast<const char*>(blob->data()), static_cast<int>(blob->size()),
                      true});
    params.push_back(Literal(version.c_str()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(PgResultPtr result, Exec(conn, sql, params));
  int rows = 0;
  if (PQntuples(result.get()) != 1 || PQnfields(result.get()) != 2 ||
      !absl::SimpleAtoi(PQgetvalue(result.get(), 0, 0), &rows)) {
    return absl::InternalError("postgres: a write statement returned an unexpected result");
  }
  *xid = PQgetvalue(result.get(), 0, 1);
  return rows;
}

// The tail of every write statement (a macro for literal concatenation; #undef after the writes).
#define OFFLOAD_NOTIFY_AND_XID                                       \
  ", n AS (SELECT pg_notify('offload_key_changes', key_id) FROM w)" \
  " SELECT count(*), pg_current_xact_id()::text FROM n"

}  // namespace

absl::Status PostgresKeyStore::Put(const KeyRecord& record) {
  // Sealed under the mutex, as RewrapAll lists the rows: a record sealed under a KEK that a
  // rotation has just replaced is then either in RewrapAll's listing or sealed anew, never
  // written after the listing under the old KEK (and left there once the pass is over).
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(record));
  return WriteLocked("put", [&](PGconn* conn) -> absl::StatusOr<std::string> {
    std::string xid;
    OFFLOAD_RETURN_IF_ERROR(
        RunWrite(conn,
                 "WITH w AS (INSERT INTO offload_keys (key_id, record, current_version)"
                 "  VALUES ($1, $2, $3::bigint) ON CONFLICT (key_id) DO UPDATE SET"
                 "  record = EXCLUDED.record, current_version = EXCLUDED.current_version,"
                 "  updated_at = now() RETURNING key_id)" OFFLOAD_NOTIFY_AND_XID,
                 record.key_id, &blob, record.current_version, &xid)
            .status());
    return xid;
  });
}

absl::Status PostgresKeyStore::Insert(const KeyRecord& record) {
  // Sealed under the mutex, as RewrapAll lists the rows: a record sealed under a KEK that a
  // rotation has just replaced is then either in RewrapAll's listing or sealed anew, never
  // written after the listing under the old KEK (and left there once the pass is over).
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(record));
  return WriteLocked("insert", [&](PGconn* conn) -> absl::StatusOr<std::string> {
    std::string xid;
    OFFLOAD_ASSIGN_OR_RETURN(
        int rows,
        RunWrite(conn,
                 "WITH w AS (INSERT INTO offload_keys (key_id, record, current_version)"
                 "  VALUES ($1, $2, $3::bigint) ON CONFLICT (key_id) DO NOTHING"
                 "  RETURNING key_id)" OFFLOAD_NOTIFY_AND_XID,
                 record.key_id, &blob, record.current_version, &xid));
    if (rows == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("key \"", record.key_id, "\" is already in the store"));
    }
    return xid;
  });
}

namespace {
// Deletes the row of `key_id` (and notifies); returns the transaction id. NotFound if none.
absl::StatusOr<std::string> DeleteRow(PGconn* conn, absl::string_view key_id) {
  std::string xid;
  OFFLOAD_ASSIGN_OR_RETURN(
      int rows, RunWrite(conn,
                         "WITH w AS (DELETE FROM offload_keys WHERE key_id = $1"
                         "  RETURNING key_id)" OFFLOAD_NOTIFY_AND_XID,
                         key_id, nullptr, 0, &xid));
  if (rows == 0) {
    return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  }
  return xid;
}
}  // namespace

absl::StatusOr<KeyRecord> PostgresKeyStore::LockAndOpen(PGconn* conn,
                                                        absl::string_view key_id) const {
  OFFLOAD_ASSIGN_OR_RETURN(
      PgResultPtr result,
      Exec(conn, "SELECT record FROM offload_keys WHERE key_id = $1 FOR UPDATE", {Text(key_id)},
           /*binary_result=*/true));
  if (PQntuples(result.get()) == 0) {
    return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  }
  return OpenRecord(key_id, Cell(result.get(), 0, 0));
}

absl::Status PostgresKeyStore::Delete(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  return WriteLocked("delete", [&](PGconn* conn) { return DeleteRow(conn, key_id); });
}

absl::Status PostgresKeyStore::DeleteIf(absl::string_view key_id,
                                        const DeletePredicate& only_if) {
  absl::MutexLock lock(&mu_);
  return WriteLocked("delete", [&](PGconn* conn) -> absl::StatusOr<std::string> {
    // Read, decide and delete under the row lock: no other writer changes the row in between.
    OFFLOAD_ASSIGN_OR_RETURN(KeyRecord stored, LockAndOpen(conn, key_id));
    if (!only_if(stored)) {
      return absl::FailedPreconditionError(
          absl::StrCat("key \"", key_id, "\" changed in the store: not removed"));
    }
    // The row is locked and there: Delete's statement removes exactly it.
    return DeleteRow(conn, key_id);
  });
}

absl::Status PostgresKeyStore::Update(absl::string_view key_id, const UpdateFn& update) {
  absl::MutexLock lock(&mu_);
  return WriteLocked("update", [&](PGconn* conn) -> absl::StatusOr<std::string> {
    // The row lock makes concurrent updates of one key (from any replica) take turns.
    OFFLOAD_ASSIGN_OR_RETURN(KeyRecord stored, LockAndOpen(conn, key_id));
    OFFLOAD_ASSIGN_OR_RETURN(KeyRecord updated, update(std::move(stored)));
    if (updated.key_id != key_id) {
      return absl::InvalidArgumentError(absl::StrCat("update: changed the key id from \"", key_id,
                                                     "\" to \"", updated.key_id, "\""));
    }
    OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, SealRecord(updated));
    std::string xid;
    OFFLOAD_ASSIGN_OR_RETURN(
        int rows, RunWrite(conn,
                           "WITH w AS (UPDATE offload_keys SET record = $2,"
                           "  current_version = $3::bigint, updated_at = now()"
                           "  WHERE key_id = $1 RETURNING key_id)" OFFLOAD_NOTIFY_AND_XID,
                           key_id, &blob, updated.current_version, &xid));
    if (rows != 1) return absl::InternalError("postgres: locked row vanished during the update");
    return xid;
  });
}

#undef OFFLOAD_NOTIFY_AND_XID

absl::StatusOr<RewrapReport> PostgresKeyStore::RewrapAll() {
  std::vector<std::string> key_ids;
  {
    absl::MutexLock lock(&mu_);
    OFFLOAD_RETURN_IF_ERROR(ReadLocked("rewrap: list", [&](PGconn* conn) -> absl::Status {
      OFFLOAD_ASSIGN_OR_RETURN(
          PgResultPtr result,
          Exec(conn, "SELECT key_id FROM offload_keys ORDER BY key_id", {}, /*binary_result=*/true));
      key_ids.clear();
      for (int i = 0; i < PQntuples(result.get()); ++i) {
        const absl::Span<const uint8_t> id = Cell(result.get(), i, 0);
        key_ids.emplace_back(reinterpret_cast<const char*>(id.data()), id.size());
      }
      return absl::OkStatus();
    }));
  }
  RewrapReport report;
  for (const std::string& key_id : key_ids) {
    // One row at a time, the mutex released in between, so that calls keep flowing.
    absl::MutexLock lock(&mu_);
    bool changed = false;
    absl::Status unreadable;
    OFFLOAD_RETURN_IF_ERROR(WriteLocked("rewrap", [&](PGconn* conn) -> absl::StatusOr<std::string> {
      changed = false;
      unreadable = absl::OkStatus();
      OFFLOAD_ASSIGN_OR_RETURN(
          PgResultPtr result,
          Exec(conn,
               "SELECT record, pg_current_xact_id()::text FROM offload_keys WHERE key_id = $1 "
               "FOR UPDATE",
               {Text(key_id)}, /*binary_result=*/true));
      if (PQntuples(result.get()) == 0) {
        // Deleted since the listing: nothing to re-wrap. The transaction commits nothing.
        OFFLOAD_ASSIGN_OR_RETURN(PgResultPtr xid,
                                 Exec(conn, "SELECT pg_current_xact_id()::text", {}));
        return std::string(PQgetvalue(xid.get(), 0, 0));
      }
      const absl::Span<const uint8_t> blob = Cell(result.get(), 0, 0);
      // The transaction id arrives as binary text (no terminator to trust): copy by length.
      const absl::Span<const uint8_t> xid_cell = Cell(result.get(), 0, 1);
      std::string xid(reinterpret_cast<const char*>(xid_cell.data()), xid_cell.size());
      // [issue 33] A row this process cannot read (a KEK it does not hold, a damaged blob) is
      // left as it is and reported; the transaction commits nothing for it, and the others go on.
      const auto unreadable_row = [](const absl::Status& s) {
        return absl::IsFailedPrecondition(s) || absl::IsDataLoss(s) ||
               absl::IsInvalidArgument(s) || absl::IsNotFound(s) || absl::IsPermissionDenied(s);
      };
      absl::StatusOr<std::string> name = EnvelopeKekName(blob);
      if (!name.ok()) {
        const absl::Status s(name.status().code(), absl::StrCat(description_, ": key \"", key_id,
                                                                "\": ", name.status().message()));
        if (!unreadable_row(s)) return s;
        unreadable = s;
        return xid;
      }
      if (*name == keks_->Current()->name()) return xid;
      absl::StatusOr<KeyRecord> opened = OpenRecord(key_id, blob);
      if (!opened.ok()) {
        if (!unreadable_row(opened.status())) return opened.status();
        unreadable = opened.status();
        return xid;
      }
      KeyRecord record = *std::move(opened);
      result.reset();
      OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> sealed, SealRecord(record));
      OFFLOAD_RETURN_IF_ERROR(
          Exec(conn, "UPDATE offload_keys SET record = $2 WHERE key_id = $1",
               {Text(key_id), Param{reinterpret_cast<const char*>(sealed.data()),
                                    static_cast<int>(sealed.size()), true}})
              .status());
      changed = true;
      return xid;
    }));
    if (changed) ++report.rewrapped;
    if (!unreadable.ok()) {
      if (report.unreadable++ == 0) report.first_error = std::string(unreadable.message());
      if (report.unreadable_keys.size() < RewrapReport::kMaxNamed) {
        report.unreadable_keys.push_back(key_id);
      }
    }
  }
  return report;
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
  // Before the next connection attempt: none after a loss (the server is usually back already,
  // e.g. a terminated session), then growing while the server cannot be reached.
  const absl::Duration max_backoff = std::min(kReconnectBackoffMax, retry_delay_);
  absl::Duration backoff = absl::ZeroDuration();
  while (!stopping_.load()) {
    if (conn == nullptr) {
      if (backoff > absl::ZeroDuration() && !Wait(-1, backoff)) break;
      absl::StatusOr<PgConnPtr> reconnected = ConnectAndListen();
      if (!reconnected.ok()) {
        backoff = backoff == absl::ZeroDuration()
                      ? std::min(kReconnectBackoffMin, max_backoff)
                      : std::min(2 * backoff, max_backoff);
        // Logged on attempts 1, 2, 4, 8...: an outage does not flood the log.
        ++failed_attempts;
        if ((failed_attempts & (failed_attempts - 1)) == 0) {
          Log(LogLevel::kWarning, "keystore_listener_reconnect_failed",
              {{"store", where},
               {"attempts", failed_attempts},
               {"error", std::string(reconnected.status().message())}});
        }
        continue;
      }
      failed_attempts = 0;
      backoff = absl::ZeroDuration();
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
      conn.reset();  // reconnects at once
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
