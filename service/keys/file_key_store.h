// The embedded key store: every key in one file, <data_dir>/keys.db, encrypted under the KEK.
//
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes kek, LoadKek(source));
//   OFFLOAD_ASSIGN_OR_RETURN(auto store, FileKeyStore::Open("/var/lib/offload", std::move(kek)));
//   OFFLOAD_ASSIGN_OR_RETURN(auto manager, KeyManager::Create(std::move(store), backends));
//
// keys.db is one envelope (envelope.h, kind kKeyStoreContents) around the serialised
// offload.store.v1.KeyStoreContents (record_codec.h), mode 0600. Every mutation decrypts the
// current file, applies the change and replaces the file atomically (keys.db.tmp, fsync, rename,
// fsync of the directory): a crash leaves the old or the new complete file, and a leftover temp
// file is removed on open. No plaintext record is kept in memory between calls.
// One process at a time: Open takes an exclusive flock on the data directory, held until the
// store is destroyed. Thread-safety: every method may be called from any thread.
#ifndef SERVICE_KEYS_FILE_KEY_STORE_H_
#define SERVICE_KEYS_FILE_KEY_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"
#include "service/keys/internal/file_util.h"
#include "service/keys/kek.h"
#include "service/keys/key_store.h"

namespace offload::keys {

class FileKeyStore final : public KeyStore {
 public:
  static constexpr char kFileName[] = "keys.db";
  static constexpr char kTempFileName[] = "keys.db.tmp";
  static constexpr size_t kMaxFileSize = size_t{64} << 20;

  // Opens the store in `data_dir` (created with mode 0700 if missing), creating an empty keys.db
  // if there is none, and checks that the existing file decrypts under `kek`.
  // InvalidArgument if `kek` is not 32 bytes; FailedPrecondition if another process has the
  // store open or keys.db was sealed under another KEK; DataLoss if keys.db is corrupted.
  static absl::StatusOr<std::unique_ptr<FileKeyStore>> Open(const std::string& data_dir,
                                                            SecretBytes kek);
  // As above with the KEKs of `keks` (kek.h): keys.db is written under its current KEK and read
  // under whichever KEK it names (FailedPrecondition naming a KEK the ring does not hold).
  static absl::StatusOr<std::unique_ptr<FileKeyStore>> Open(const std::string& data_dir,
                                                            std::shared_ptr<KekRing> keks);

  // KEK rotation: rewrites keys.db under the ring's current KEK if it is wrapped under another
  // one (atomically, as every write). The report's `rewrapped`: the records re-wrapped (0 when
  // keys.db was already under the current KEK). keys.db is one blob: an unreadable one is an
  // error, never a partial re-wrap.
  absl::StatusOr<RewrapReport> RewrapAll();

  absl::StatusOr<std::vector<KeyRecord>> LoadAll() override;
  absl::Status Put(const KeyRecord& record) override;
  absl::Status Delete(absl::string_view key_id) override;
  absl::Status DeleteIf(absl::string_view key_id, const DeletePredicate& only_if) override;
  absl::StatusOr<KeyRecord> Load(absl::string_view key_id) override;
  absl::Status Insert(const KeyRecord& record) override;
  absl::Status Update(absl::string_view key_id, const UpdateFn& update) override;
  std::string Describe() const override;

  // <data_dir>/keys.db
  const std::string& path() const { return path_; }

 private:
  FileKeyStore(std::string data_dir, internal::UniqueFd dir_fd, std::shared_ptr<KekRing> keks);

  // `kek_name`, when given, receives the name of the KEK keys.db is wrapped under. Errors name
  // the file's path (for Open's caller: the server's start-up log).
  absl::StatusOr<std::vector<KeyRecord>> ReadLocked(std::string* kek_name = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // keys.db's bytes (a failure here is I/O: missing, not a file, unreadable) and their contents
  // (a failure here is the file itself: damaged, or sealed under a KEK the ring lacks).
  absl::StatusOr<SecretBytes> ReadBlobLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<KeyRecord>> DecodeLocked(const SecretBytes& blob,
                                                      std::string* kek_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Errors begin with the file's path. `committed`, when given: whether keys.db holds the change
  // despite an error (only its directory's fsync failed).
  absl::Status WriteLocked(absl::Span<const KeyRecord> records, bool* committed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // As ReadLocked / WriteLocked for the store's calls (`call` names one in the log), through
  // KeyStoreFailureForCaller (key_store.h): what their callers - through KeyManager, the
  // service's callers on either port - see of a failure names no path of the server's, and
  // keeps its code, except that
  //   - a system call that failed (open, read, write, rename: errno) is Unavailable
  //     ("key store unavailable: the key store file could not be read" / "...: the change could
  //     not be written to the key store file"), logged as keystore_unavailable;
  //   - a change in keys.db that could not be made durable (the directory's fsync failed after
  //     the rename) is Unknown ("...its outcome is unknown; read the key before trying again").
  // Otherwise (logged as keystore_error): DataLoss "the key store file has disappeared" or
  // "the key store file cannot be opened: <why>" (damaged), FailedPrecondition "...cannot be
  // opened: encrypted under a different key-encryption key, "<name>"..." or "the key store file
  // is not a regular file", ResourceExhausted "the key store file is larger than 64 MiB", and
  // a KEK's own error (a PKCS#11 token that cannot be reached) with its code.
  absl::StatusOr<std::vector<KeyRecord>> ReadForCallLocked(absl::string_view call,
                                                           std::string* kek_name = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteForCallLocked(absl::string_view call, absl::Span<const KeyRecord> records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const std::string path_;
  const internal::UniqueFd dir_fd_;  // holds the flock
  const std::shared_ptr<KekRing> keks_;
  absl::Mutex mu_;  // serialises read-modify-write cycles of the file
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_FILE_KEY_STORE_H_
