// Managed keys: the in-memory view of every key, with crypto objects prepared once per key version,
// backed by a persistent KeyStore.
//
//   auto manager = KeyManager::Create(std::move(store), backends);      // loads every key
//   auto info = (*manager)->CreateKey(request);                          // persisted before return
//   std::shared_ptr<const ManagedKey> key = (*manager)->Find("payments");
//   const ManagedKeyVersion* v = key->Current();
//   v->signer->Sign(message, sig);
//
// Lifecycle (see offload/v1/keys.proto): a key may be disabled, scheduled for deletion (destroyed
// after Options::deletion_wait unless cancelled), and its older versions disabled, scheduled for
// destruction, or retired for decryption by min_decryption_version. DestroyDue (run by a reaper
// thread, StartReaper) carries out what is due. The operations ask ManagedKey::CheckUsable and
// UsableVersion before they use a key.
//
// Mutations (create, import, rotate, delete and the lifecycle calls) are serialised and written to the store before they
// return; a mutation that was acknowledged survives a crash. Lookups never block on the store: they
// read an immutable snapshot. With a store shared by several processes (the postgres store), the
// store decides: a create is an insert that fails if the id exists anywhere, a rotation numbers
// its version after the stored record in one atomic read-modify-write, a delete removes what is
// stored; changes made elsewhere are applied by ReloadKey / Resync (driven by the store's change
// notification). Thread-safety: every method may be called from any thread.
#ifndef SERVICE_KEYS_KEY_MANAGER_H_
#define SERVICE_KEYS_KEY_MANAGER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "offload/v1/keys.pb.h"
#include "service/common/secret_bytes.h"
#include "service/crypto/aead.h"
#include "service/crypto/backend.h"
#include "service/crypto/ed25519.h"
#include "service/crypto/x25519.h"
#include "service/keys/key_store.h"

namespace offload::keys {

// One version of a key, with the crypto object for its type (exactly one of the three is set,
// none for a DESTROYED version).
struct ManagedKeyVersion {
  uint32_t version = 0;
  // Names this prepared version within the process: never 0, never reused (a deleted and
  // re-created key id, or a reload, gets new numbers). Memo caches key on it instead of
  // (key id, version). Not persisted.
  uint64_t instance = 0;
  int64_t created_unix_seconds = 0;
  std::vector<uint8_t> public_key;  // 32 bytes for Ed25519 / X25519, empty for AEAD
  std::unique_ptr<crypto::Ed25519Signer> signer;
  std::unique_ptr<crypto::X25519PrivateKey> x25519;
  std::unique_ptr<crypto::Aead> aead;
  v1::KeyVersionState state = v1::KEY_VERSION_STATE_ENABLED;
  int64_t destroy_unix_seconds = 0;
};

// What a caller wants a key version for: decrypting-side uses (AEAD and box open, derive with an
// explicit version, rewrap's open) also honour min_decryption_version.
enum class KeyUse { kProduce, kConsume };

// An immutable snapshot of one key. A rotation or deletion makes a new snapshot; holders of the
// old one may finish their work with it.
struct ManagedKey {
  std::string key_id;
  v1::KeyType type = v1::KEY_TYPE_UNSPECIFIED;
  v1::KeyOptions options;
  uint32_t current_version = 0;
  std::vector<std::shared_ptr<const ManagedKeyVersion>> versions;  // oldest first
  bool disabled = false;
  int64_t deletion_unix_seconds = 0;  // non-zero: pending deletion
  uint32_t min_decryption_version = 0;
  // Not OK when the store holds a newer record of this key that this server cannot read (a KEK
  // it does not hold, corruption): the key is refused with this status until it can.
  absl::Status unreadable;

  // The current version; always ENABLED, with its crypto object.
  const ManagedKeyVersion* Current() const { return Version(current_version); }
  // nullptr if `version` does not exist. 0 means the current version.
  const ManagedKeyVersion* Version(uint32_t version) const;
  v1::KeyState State() const;
  // FailedPrecondition naming the key's state unless it is ENABLED; `unreadable` if set.
  absl::Status CheckUsable() const;
  // `version` (0: the current one) if it may serve `use`: NotFound if there is no such version,
  // FailedPrecondition if it is not ENABLED or (kConsume) below min_decryption_version. Does not
  // check the key's own state (CheckUsable).
  absl::StatusOr<const ManagedKeyVersion*> UsableVersion(uint32_t version, KeyUse use) const;
  v1::KeyInfo Info() const;
};

// InvalidArgument unless `key_id` matches [a-z0-9][a-z0-9._-]{0,63}.
absl::Status ValidateKeyId(absl::string_view key_id);

class KeyManager final {
 public:
  // Called after a key is rotated or deleted, with its id, outside the manager's lock. Used by
  // the memo caches to drop the key's entries. Listeners run before the next mutation starts, so
  // they must not call CreateKey / ImportKey / RotateKey / DeleteKey (lookups are fine).
  using ChangeListener = std::function<void(absl::string_view key_id)>;

  struct Options {
    // How long DeleteKey and DestroyKeyVersion wait before the material is wiped, at least. Zero
    // destroys at once (the behaviour before lifecycle states; for tests and throwaway setups).
    absl::Duration deletion_wait = absl::Hours(24 * 7);
    // The time, for tests. Null: absl::Now.
    std::function<absl::Time()> clock;
  };
  // The longest wait a request may ask for.
  static constexpr absl::Duration kMaxDeletionWait = absl::Hours(24 * 366 * 10);

  // Loads every key from `store` and prepares its crypto objects with `backends`.
  static absl::StatusOr<std::unique_ptr<KeyManager>> Create(std::unique_ptr<KeyStore> store,
                                                            crypto::BackendChoice backends);
  static absl::StatusOr<std::unique_ptr<KeyManager>> Create(std::unique_ptr<KeyStore> store,
                                                            crypto::BackendChoice backends,
                                                            Options options);
  ~KeyManager();

  // InvalidArgument for a bad id or type, AlreadyExists if the id is taken.
  absl::StatusOr<v1::KeyInfo> CreateKey(const v1::CreateKeyRequest& request);
  // As CreateKey, plus InvalidArgument for a secret of the wrong size, or a 64-byte Ed25519
  // secret whose public half does not match its seed.
  absl::StatusOr<v1::KeyInfo> ImportKey(const v1::ImportKeyRequest& request);
  // NotFound if there is no such key.
  absl::StatusOr<v1::KeyInfo> GetKey(absl::string_view key_id) const;
  std::vector<v1::KeyInfo> ListKeys() const;  // sorted by key id
  // FailedPrecondition unless the key is enabled.
  absl::StatusOr<v1::KeyInfo> RotateKey(absl::string_view key_id);
  // Schedules destruction after max(options.deletion_wait, request's wait); with both zero the key
  // is removed at once. Errors as described in keys.proto.
  absl::StatusOr<v1::DeleteKeyResponse> DeleteKey(const v1::DeleteKeyRequest& request);
  absl::Status DeleteKey(absl::string_view key_id);  // the default wait
  absl::StatusOr<v1::KeyInfo> CancelKeyDeletion(absl::string_view key_id);
  absl::StatusOr<v1::KeyInfo> DisableKey(absl::string_view key_id);
  absl::StatusOr<v1::KeyInfo> EnableKey(absl::string_view key_id);
  absl::StatusOr<v1::KeyInfo> DisableKeyVersion(const v1::KeyVersionRequest& request);
  absl::StatusOr<v1::KeyInfo> EnableKeyVersion(const v1::KeyVersionRequest& request);
  absl::StatusOr<v1::KeyInfo> DestroyKeyVersion(const v1::KeyVersionRequest& request);
  absl::StatusOr<v1::KeyInfo> RestoreKeyVersion(const v1::KeyVersionRequest& request);
  absl::StatusOr<v1::KeyInfo> SetMinDecryptionVersion(
      const v1::SetMinDecryptionVersionRequest& request);

  // Carries out every deletion and version destruction whose time has come (in the store, then
  // here), and removes tombstones. Returns how many keys and versions it destroyed. Safe with
  // several replicas doing the same: each step re-reads the stored record atomically.
  absl::StatusOr<int> DestroyDue();
  // Runs DestroyDue every `interval` on a thread of its own until the manager is destroyed.
  void StartReaper(absl::Duration interval);
  // Stops and joins the reaper, if it runs (also done by the destructor).
  void StopReaper();

  // Applies a change made to the store by someone else (another replica sharing a postgres
  // store): reloads `key_id`'s record and, if it differs from the one held, publishes a new
  // snapshot with new version instances (or drops the key if the store no longer has it) and
  // runs the change listeners, so memo entries of the old snapshot go. Unchanged records are
  // left alone. Errors are the store's. An unreachable store leaves the old snapshot serving;
  // a record that cannot be read (FailedPrecondition, DataLoss: another KEK, corruption) fails
  // closed - the key is refused UNAVAILABLE until a reload reads it - since the change may have
  // been a disable or a deletion.
  absl::Status ReloadKey(absl::string_view key_id);
  // As ReloadKey for every key: loads the whole store, applies every difference (new, changed
  // and vanished keys). For when change notifications may have been missed (a reconnect). When
  // some record cannot be read, goes key by key over the held keys (OK, unreadable ones
  // refused).
  absl::Status Resync();

  // The current snapshot of `key_id`, or nullptr. Never blocks on I/O.
  std::shared_ptr<const ManagedKey> Find(absl::string_view key_id) const;

  void AddChangeListener(ChangeListener listener);
  // Called by DestroyDue for what it destroyed: a whole key (`versions` empty) or some of its
  // versions, after the store has it. For the audit trail. Same rules as change listeners.
  using DestroyListener =
      std::function<void(absl::string_view key_id, const std::vector<uint32_t>& versions)>;
  void AddDestroyListener(DestroyListener listener);
  size_t size() const;

 private:
  KeyManager(std::unique_ptr<KeyStore> store, crypto::BackendChoice backends, Options options);

  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  // The wait a request asks for (seconds, 0 = the default), checked against the bounds.
  absl::StatusOr<absl::Duration> WaitFor(int64_t requested_seconds) const;
  // A read-modify-write of the stored record of `key_id`: `change` edits it (or refuses with an
  // error, and nothing is written), then the new snapshot is published and listeners run.
  // `reuse_prepared` keeps the prepared versions when the stored record is the one held
  // (rotation); otherwise every version is prepared anew, so that memo entries of the old
  // snapshot can never match again. `event` names the change in the log.
  using ChangeFn = std::function<absl::Status(KeyRecord* stored)>;
  absl::StatusOr<v1::KeyInfo> MutateKey(absl::string_view key_id, absl::string_view event,
                                        bool reuse_prepared, const ChangeFn& change)
      ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  absl::StatusOr<v1::KeyInfo> MutateKeyLocked(absl::string_view key_id, absl::string_view event,
                                              bool reuse_prepared, const ChangeFn& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::KeyInfo> MutateVersion(const v1::KeyVersionRequest& request,
                                            absl::string_view event,
                                            const std::function<absl::Status(
                                                KeyRecord*, KeyVersionRecord*)>& change);
  // ReloadKey without the lock. A record that cannot be read quarantines the held snapshot.
  absl::Status ReloadOneLocked(absl::string_view key_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes the held snapshot of `key_id` marked unreadable (`why`), and drops its memo entries.
  void QuarantineLocked(absl::string_view key_id, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the tombstone of `key_id` from the store and from here; if the store holds something
  // else under that id now (created anew through another replica), applies that instead.
  absl::Status RemoveLocked(absl::string_view key_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Persists a new key (version 1 built by CreateKey / ImportKey) and publishes its snapshot.
  absl::StatusOr<v1::KeyInfo> AddKey(KeyRecord record) ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  // Runs every listener with `key_id`. Called with write_mu_ held (so a delete's listeners finish
  // before the same id can be created again) but never with mu_ held.
  void NotifyListeners(absl::string_view key_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  void NotifyDestroyed(absl::string_view key_id, const std::vector<uint32_t>& versions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes the held state of `key_id` match `stored` (nullptr: the store has no such key).
  // Returns whether anything changed (listeners have then run).
  absl::StatusOr<bool> ApplyStoredLocked(absl::string_view key_id, KeyRecord* stored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<KeyStore> store_;
  const crypto::BackendChoice backends_;
  const Options options_;
  struct Reaper;
  std::unique_ptr<Reaper> reaper_;
  absl::Mutex write_mu_;  // serialises mutations, held across store writes
  // The stored form of every key (with secrets), needed to write a whole record on rotation.
  // Tombstones are held here (so DestroyDue removes them) but never in keys_.
  absl::flat_hash_map<std::string, KeyRecord> records_ ABSL_GUARDED_BY(write_mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const ManagedKey>> keys_ ABSL_GUARDED_BY(mu_);
  std::vector<ChangeListener> listeners_ ABSL_GUARDED_BY(mu_);
  std::vector<DestroyListener> destroy_listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEY_MANAGER_H_
