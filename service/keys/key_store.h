// Persistent storage of managed keys, independent of where the bytes go (file, postgres).
//
//   std::unique_ptr<KeyStore> store = ...;            // e.g. FileKeyStore::Open(dir, kek)
//   OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> all, store->LoadAll());
//   OFFLOAD_RETURN_IF_ERROR(store->Put(record));      // durable when it returns OK
//
// A record carries a key's secrets in locked, wiped buffers (KeyBytes); backends encrypt them under the
// key-encryption key before they leave the process (see envelope.h and record_codec.h, which every
// backend shares). Thread-safety: implementations must allow calls from any thread; KeyManager
// additionally serialises its mutations.
#ifndef SERVICE_KEYS_KEY_STORE_H_
#define SERVICE_KEYS_KEY_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "offload/v1/keys.pb.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"

namespace offload::keys {

// Every secret is 32 bytes: the Ed25519 seed (not the 64-byte seed || public key form), the
// X25519 scalar, or the AEAD key.
inline constexpr size_t kKeySecretSize = 32;

// The message (or its start) of the Unavailable status a store's calls return while it cannot
// be reached, read or written; the detail (addresses, paths, the driver's words) is in the
// server's log only, never in what a caller sees.
inline constexpr char kKeyStoreUnavailable[] = "key store unavailable";

// How a store call failed, for KeyStoreFailureForCaller.
enum class KeyStoreFailure {
  // The store could not be reached, read or written (the system's error, a lost connection)
  // and nothing was changed: worth sending again.
  kUnavailable,
  // A change was made, or may have been, but the store could not confirm it (a COMMIT whose
  // answer was lost, a replaced file whose directory could not be synced): not to be sent
  // again blindly.
  kOutcomeUnknown,
  // Anything else (a record or file the server cannot open, a KEK it does not hold, a file that
  // is not a regular file or too large): the code is kept.
  kOther,
};

// What the caller of a store's call sees of the failure `s`, whose message may begin with
// `hidden` followed by ": " (the store's path or address: for the server's log only). Both
// stores use it, so that both log the same lines:
//   kUnavailable    -> Unavailable "key store unavailable" (+ ": " + `detail` when given),
//                      logged as keystore_unavailable;
//   kOutcomeUnknown -> Unknown "key store unavailable: <detail: what happened> and its outcome
//                      is unknown; read the key before trying again", logged as
//                      keystore_unavailable;
//   kOther          -> the code of `s` and its message without the `hidden` prefix, logged as
//                      keystore_error; a message without that prefix is returned unchanged and
//                      not logged (nothing of the store's is in it: an answer, not a failure).
// Each log line has the store (`store`: its Describe()), the call (`call`) and `s` whole. OK
// stays OK.
absl::Status KeyStoreFailureForCaller(absl::string_view store, absl::string_view hidden,
                                      absl::string_view call,
                                      const absl::Status& s, KeyStoreFailure failure,
                                      absl::string_view detail = "");

struct KeyVersionRecord {
  uint32_t version = 0;
  int64_t created_unix_seconds = 0;
  KeyBytes secret;  // in locked memory (secure_memory.h); empty once the version is DESTROYED
  std::vector<uint8_t> public_key;  // 32 bytes for Ed25519 / X25519, empty for AEAD types
  v1::KeyVersionState state = v1::KEY_VERSION_STATE_ENABLED;
  int64_t destroy_unix_seconds = 0;  // DESTROY_SCHEDULED / DESTROYED: when the secret goes/went
};

struct KeyRecord {
  std::string key_id;
  v1::KeyType type = v1::KEY_TYPE_UNSPECIFIED;
  v1::KeyOptions options;
  uint32_t current_version = 0;
  std::vector<KeyVersionRecord> versions;  // oldest first, versions strictly increasing
  bool disabled = false;
  int64_t deletion_unix_seconds = 0;  // non-zero: scheduled for destruction at this time
  uint32_t min_decryption_version = 0;

  // Every version destroyed: what is left between the wipe of a deleted key and the removal of
  // its record. Never served; the key id counts as free.
  bool IsTombstone() const;
};

class KeyStore {
 public:
  virtual ~KeyStore() = default;

  // Every stored record, sorted by key id. DataLoss / FailedPrecondition if the stored data is
  // corrupted or encrypted under another key-encryption key.
  virtual absl::StatusOr<std::vector<KeyRecord>> LoadAll() = 0;

  // Inserts or replaces the record with `record.key_id`. When OK is returned the change is
  // durable (survives a crash or power loss); on error the store is unchanged.
  // REQUIRES: `record` passes ValidateKeyRecord (record_codec.h), else InvalidArgument.
  virtual absl::Status Put(const KeyRecord& record) = 0;

  // Removes the record with `key_id`, durably. NotFound if there is none.
  virtual absl::Status Delete(absl::string_view key_id) = 0;

  // As Delete, but only if `only_if(stored record)` says so, atomically against every writer of
  // the store (other processes included): FailedPrecondition, and nothing removed, otherwise.
  // For removing what a stale view believes is there (a destroyed key's tombstone) without
  // removing what another replica put there meanwhile.
  using DeletePredicate = std::function<bool(const KeyRecord& stored)>;
  virtual absl::Status DeleteIf(absl::string_view key_id, const DeletePredicate& only_if) = 0;

  // The stored record with `key_id`; NotFound if there is none.
  virtual absl::StatusOr<KeyRecord> Load(absl::string_view key_id) = 0;

  // As Put, but only when no record with `record.key_id` is stored: AlreadyExists otherwise.
  // Atomic against every writer of the store, other processes included (a shared store may be
  // written by several replicas whose in-memory views lag behind it).
  virtual absl::Status Insert(const KeyRecord& record) = 0;

  // Read-modify-write of one record, atomic against every other writer of the store: calls
  // `update` with the stored record and stores what it returns, durably. NotFound if there is no
  // such record; an error from `update` is returned and nothing is written. `update` may be
  // called more than once (a store that retries after a failure that wrote nothing reads the
  // record again): only what its last call returned is stored.
  // REQUIRES: the returned record keeps `key_id` and passes ValidateKeyRecord (InvalidArgument).
  using UpdateFn = std::function<absl::StatusOr<KeyRecord>(KeyRecord stored)>;
  virtual absl::Status Update(absl::string_view key_id, const UpdateFn& update) = 0;

  // A one-line description for logs, e.g. "file:/var/lib/offload/keys.db". Never secrets.
  virtual std::string Describe() const = 0;
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEY_STORE_H_
