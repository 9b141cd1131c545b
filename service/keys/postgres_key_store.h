// The shared key store: one PostgreSQL table that every replica reads and writes, with change
// notification (LISTEN/NOTIFY) so that a change made through one replica reaches all of them.
//
//   OFFLOAD_ASSIGN_OR_RETURN(auto store, PostgresKeyStore::Open(dsn, std::move(kek)));
//   OFFLOAD_ASSIGN_OR_RETURN(auto manager, KeyManager::Create(std::move(store), backends));
//   OFFLOAD_ASSIGN_OR_RETURN(auto listener, PostgresChangeListener::Start(dsn, {
//       .on_change = [&](absl::string_view id) { return manager->ReloadKey(id); },
//       .on_resync = [&] { return manager->Resync(); }}));
//
// Rows of offload_keys hold one record each, in the same format and at-rest encryption as the
// file store: an envelope (envelope.h, kind kKeyRecord, the key id as associated data so rows
// cannot be swapped) around the serialised offload.store.v1.KeyRecord (record_codec.h). Only the
// key id, the current version number and the update time are in clear.
// Schema migrations run in Open, in one transaction under an advisory lock, so replicas starting
// together apply each migration once; offload_schema_version records what was applied.
// Every write is one transaction that also NOTIFYs channel offload_key_changes with the key id;
// synchronous_commit is forced on for the session, so a write that returned OK is durable.
//
// Lost connections (PostgreSQL restarted, the session terminated by pg_terminate_backend, a
// failover, a pooler's idle timeout) cost no call: before each use, one poll() finds a connection
// that the server closed while it was idle, and the store reconnects. A connection lost during a
// call (the race the poll cannot see) is replaced and the call runs once more when that cannot
// repeat a committed change: reads always; writes when the failure came before their COMMIT was
// sent (an explicit transaction commits nothing without it), and after a failed COMMIT only when
// pg_xact_status on the new connection says the transaction aborted (if it committed, the call
// returns OK without running again). Needs PostgreSQL 13 or later (pg_current_xact_id).
// Thread-safety: every method may be called from any thread (one connection, used under a mutex).
#ifndef SERVICE_KEYS_POSTGRES_KEY_STORE_H_
#define SERVICE_KEYS_POSTGRES_KEY_STORE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/common/secret_bytes.h"
#include "service/keys/kek.h"
#include "service/keys/key_store.h"

typedef struct pg_conn PGconn;

namespace offload::keys {

inline constexpr char kPostgresDsnEnvVar[] = "OFFLOAD_POSTGRES_DSN";
inline constexpr char kPostgresNotifyChannel[] = "offload_key_changes";
// kKeyStoreUnavailable (key_store.h) is the message of the Unavailable status the store's calls
// return while PostgreSQL cannot be reached; the detail is in the server's log
// (keystore_unavailable).

// "host=... port=... dbname=... user=..." from a libpq connection string (keyword or URI form),
// for logs: never the password or any other option. "(unparsable)" if libpq cannot parse it.
std::string DescribePostgresDsn(const std::string& dsn);

namespace internal {
struct PgConnCloser {
  void operator()(PGconn* conn) const;
};
using PgConnPtr = std::unique_ptr<PGconn, PgConnCloser>;
}  // namespace internal

class PostgresKeyStore final : public KeyStore {
 public:
  // The schema version this build creates and reads.
  static constexpr int kSchemaVersion = 1;
  // A stored record larger than this is reported as DataLoss before it is decrypted.
  static constexpr size_t kMaxRecordSize = size_t{1} << 20;

  // Connects with libpq connection string `dsn` and brings the schema up to kSchemaVersion.
  // InvalidArgument if `kek` is not 32 bytes or `dsn` is empty; Unavailable if the server
  // cannot be reached; FailedPrecondition if the database has a newer schema than this build.
  static absl::StatusOr<std::unique_ptr<PostgresKeyStore>> Open(const std::string& dsn,
                                                                SecretBytes kek);
  // As above with the KEKs of `keks` (kek.h): rows are written under its current KEK and read
  // under whichever KEK they name. Every replica must hold every KEK a row may name.
  static absl::StatusOr<std::unique_ptr<PostgresKeyStore>> Open(const std::string& dsn,
                                                                std::shared_ptr<KekRing> keks);

  // KEK rotation: re-wraps, one transaction per row (SELECT ... FOR UPDATE, so it is atomic
  // against every writer, other replicas included), each row wrapped under another KEK than the
  // ring's current one. The record inside is unchanged, so no change is notified. Safe to run on
  // several replicas at once. A row this process cannot read (a KEK it does not hold, a damaged
  // blob) is left as it is, counted and named in the report, and the other rows go on; an error
  // of the database (the connection) stops the pass. Returns what this call did.
  absl::StatusOr<RewrapReport> RewrapAll();

  absl::StatusOr<std::vector<KeyRecord>> LoadAll() override;
  absl::Status Put(const KeyRecord& record) override;
  absl::Status Delete(absl::string_view key_id) override;
  absl::Status DeleteIf(absl::string_view key_id, const DeletePredicate& only_if) override;
  absl::StatusOr<KeyRecord> Load(absl::string_view key_id) override;
  absl::Status Insert(const KeyRecord& record) override;
  absl::Status Update(absl::string_view key_id, const UpdateFn& update) override;
  std::string Describe() const override;

 private:
  PostgresKeyStore(std::string dsn, std::shared_ptr<KekRing> keks);

  // A statement run inside a write's transaction, on `conn`, that returns the transaction's id
  // (pg_current_xact_id() as text, the same statement that writes returns it). It may be called
  // again, on a new connection, after a failure that left nothing committed.
  using WriteBody = std::function<absl::StatusOr<std::string>(PGconn* conn)>;

  // Makes conn_ a live, idle connection: reconnects if it is missing, known broken, inside a
  // transaction, or was closed by the server while idle (found by a poll() without waiting).
  absl::Status EnsureConnectedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `read` on a live connection; if the connection is lost during it, once more on a new
  // one (a read changes nothing, so running it twice is always safe). As ReadAttemptsLocked,
  // through ForCaller.
  absl::Status ReadLocked(absl::string_view what, const std::function<absl::Status(PGconn*)>& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BEGIN, `body`, COMMIT on a live connection, with at most one more run after a lost
  // connection when that is safe (see the file comment). An error from `body` other than a lost
  // connection is returned after a rollback. `what` names the call in logs. As
  // WriteAttemptsLocked, through ForCaller.
  absl::Status WriteLocked(absl::string_view what, const WriteBody& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadAttemptsLocked(absl::string_view what,
                                  const std::function<absl::Status(PGconn*)>& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `*outcome_unknown` when a COMMIT's answer was lost and its outcome could not be learnt.
  absl::Status WriteAttemptsLocked(absl::string_view what, const WriteBody& body,
                                   bool* outcome_unknown) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the callers of the store's calls (and through KeyManager, the service's callers) see
  // of `s`: an Unavailable status becomes kKeyStoreUnavailable (Unknown instead, with a word,
  // for a change whose outcome is unknown: it must not be sent again blindly), and its detail - the store's address, libpq's message - goes to the
  // server's log only (keystore_unavailable, naming the call `what`). Other codes keep their
  // message without the store's description in front (logged whole: keystore_error).
  absl::Status ForCaller(absl::string_view what, absl::Status s, bool outcome_unknown = false) const;
  // After a COMMIT whose answer was lost: the status of transaction `xid` ("committed",
  // "aborted", "in progress") asked on a new connection.
  absl::StatusOr<std::string> CommitOutcomeLocked(const std::string& xid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seals `record` for its row.
  absl::StatusOr<std::vector<uint8_t>> SealRecord(const KeyRecord& record) const;
  absl::StatusOr<KeyRecord> OpenRecord(absl::string_view key_id,
                                       absl::Span<const uint8_t> blob) const;
  // In a write transaction: the row of `key_id`, locked (SELECT ... FOR UPDATE) until the
  // transaction ends, opened. NotFound if there is none.
  absl::StatusOr<KeyRecord> LockAndOpen(PGconn* conn, absl::string_view key_id) const;

  const std::string dsn_;
  const std::string description_;
  const std::shared_ptr<KekRing> keks_;
  absl::Mutex mu_;
  internal::PgConnPtr conn_ ABSL_GUARDED_BY(mu_);
};

// A connection that LISTENs on offload_key_changes and reports each changed key id, on a thread
// of its own. After every (re)connection - the first included, since changes made between the
// key manager's load and the LISTEN would otherwise be missed - it asks for a full resync: while
// disconnected, notifications are lost. A lost connection is replaced at once; while the server
// cannot be reached, attempts follow at kReconnectBackoffMin doubling up to the smaller of
// kReconnectBackoffMax and `retry_delay` (a restarted server is heard within that bound, at a
// cost of a few refused connection attempts a second during an outage). Callbacks run on the
// listener thread, one at a time; a callback that fails makes the listener resync after
// `retry_delay`.
// Thread-safety: Start and the destructor from one thread; callbacks must be thread-safe.
class PostgresChangeListener {
 public:
  static constexpr absl::Duration kReconnectBackoffMin = absl::Milliseconds(25);
  static constexpr absl::Duration kReconnectBackoffMax = absl::Milliseconds(250);

  struct Callbacks {
    std::function<absl::Status(absl::string_view key_id)> on_change;
    std::function<absl::Status()> on_resync;
  };

  // Connects (Unavailable if it cannot), LISTENs and starts the thread.
  static absl::StatusOr<std::unique_ptr<PostgresChangeListener>> Start(
      const std::string& dsn, Callbacks callbacks, absl::Duration retry_delay = absl::Seconds(1));
  // Stops the thread (waits for a running callback to return) and closes the connection.
  ~PostgresChangeListener();

  PostgresChangeListener(const PostgresChangeListener&) = delete;
  PostgresChangeListener& operator=(const PostgresChangeListener&) = delete;

  // Connections established so far (1 after Start; more after reconnects).
  uint64_t connections() const { return connections_.load(); }
  // Notifications received so far.
  uint64_t notifications() const { return notifications_.load(); }

 private:
  PostgresChangeListener(std::string dsn, Callbacks callbacks, absl::Duration retry_delay);
  absl::StatusOr<internal::PgConnPtr> ConnectAndListen();
  void Run(internal::PgConnPtr conn);
  // Waits up to `timeout` for `fd` to be readable (-1: only the stop pipe). False when stopping.
  bool Wait(int fd, absl::Duration timeout);

  const std::string dsn_;
  const Callbacks callbacks_;
  const absl::Duration retry_delay_;
  int wake_fds_[2] = {-1, -1};  // a pipe written by the destructor
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> notifications_{0};
  std::thread thread_;
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_POSTGRES_KEY_STORE_H_
