#include "service/keys/file_key_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/keys/envelope.h"
#include "service/keys/record_codec.h"

namespace offload::keys {
namespace {

constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

// `status` with "`path`: " in front of its message (and its payloads: IsSystemError survives).
absl::Status Annotate(const absl::Status& status, absl::string_view path) {
  absl::Status annotated(status.code(), absl::StrCat(path, ": ", status.message()));
  internal::CopyPayloads(status, annotated);
  return annotated;
}

}  // namespace

FileKeyStore::FileKeyStore(std::string data_dir, internal::UniqueFd dir_fd,
                           std::shared_ptr<KekRing> keks)
    : dir_(std::move(data_dir)),
      path_(absl::StrCat(dir_, "/", kFileName)),
      dir_fd_(std::move(dir_fd)),
      keks_(std::move(keks)) {}

absl::StatusOr<std::unique_ptr<FileKeyStore>> FileKeyStore::Open(const std::string& data_dir,
                                                                 SecretBytes kek) {
  if (kek.size() != kKekSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek: expected ", kKekSize, " bytes, got ", kek.size()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<KekRing> keks, KekRing::FromRawKey(std::move(kek)));
  return Open(data_dir, std::move(keks));
}

absl::StatusOr<std::unique_ptr<FileKeyStore>> FileKeyStore::Open(const std::string& data_dir,
                                                                 std::shared_ptr<KekRing> keks) {
  if (keks == nullptr) return absl::InvalidArgumentError("kek ring: missing");
  if (data_dir.empty()) return absl::InvalidArgumentError("data_dir: must not be empty");
  std::string dir = data_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  OFFLOAD_RETURN_IF_ERROR(internal::MakeDirs(dir, kDirMode));
  OFFLOAD_ASSIGN_OR_RETURN(internal::UniqueFd dir_fd, internal::OpenDir(dir));
  if (::flock(dir_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("key store ", dir, " is in use by another process (flock on the directory)"));
    }
    return internal::ErrnoError(errno, "flock", dir);
  }
  // A temp file is only ever a write that did not reach its rename: the old file is authoritative.
  if (::unlinkat(dir_fd.get(), kTempFileName, 0) != 0 && errno != ENOENT) {
    return internal::ErrnoError(errno, "remove leftover", absl::StrCat(dir, "/", kTempFileName));
  }

  std::unique_ptr<FileKeyStore> store(new FileKeyStore(dir, std::move(dir_fd), std::move(keks)));
  absl::MutexLock lock(&store->mu_);
  struct stat st;
  if (::fstatat(store->dir_fd_.get(), kFileName, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return internal::ErrnoError(errno, "stat", store->path_);
    OFFLOAD_RETURN_IF_ERROR(store->WriteLocked({}));
  } else {
    OFFLOAD_RETURN_IF_ERROR(store->ReadLocked().status());
  }
  return store;
}

absl::StatusOr<SecretBytes> FileKeyStore::ReadBlobLocked() {
  absl::StatusOr<SecretBytes> blob =
      internal::ReadFileAt(dir_fd_.get(), kFileName, kMaxFileSize);
  if (blob.ok()) return blob;
  const absl::Status& s = blob.status();
  if (absl::IsNotFound(s)) {
    return absl::DataLossError(absl::StrCat(path_, ": the key store file has disappeared"));
  }
  if (internal::IsSystemError(s)) return Annotate(s, dir_);  // "open keys.db: <strerror>"
  // The file itself: not a regular file, or too large. Said without its name, so that what
  // remains after the path is fit for a caller.
  if (absl::IsResourceExhausted(s)) {
    return absl::Status(s.code(), absl::StrCat(path_, ": the key store file is larger than ",
                                               kMaxFileSize >> 20, " MiB"));
  }
  if (absl::IsFailedPrecondition(s)) {
    return absl::Status(s.code(),
                        absl::StrCat(path_, ": the key store file is not a regular file"));
  }
  return Annotate(s, path_);
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::DecodeLocked(const SecretBytes& blob,
                                                                  std::string* kek_name) {
  const std::string prefix = absl::StrCat(path_, ": the key store file cannot be opened");
  if (kek_name != nullptr) {
    absl::StatusOr<std::string> name = EnvelopeKekName(blob);
    if (!name.ok()) return Annotate(name.status(), prefix);
    *kek_name = *std::move(name);
  }
  absl::StatusOr<SecretBytes> plain =
      OpenEnvelope(*keks_, EnvelopeKind::kKeyStoreContents, {}, blob);
  if (!plain.ok()) return Annotate(plain.status(), prefix);
  absl::StatusOr<std::vector<KeyRecord>> records = ParseKeyStoreContents(*plain);
  if (!records.ok()) return Annotate(records.status(), prefix);
  return records;
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::ReadLocked(std::string* kek_name) {
  OFFLOAD_ASSIGN_OR_RETURN(SecretBytes blob, ReadBlobLocked());
  return DecodeLocked(blob, kek_name);
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::ReadForCallLocked(absl::string_view call,
                                                                       std::string* kek_name) {
  absl::StatusOr<std::vector<KeyRecord>> records = ReadLocked(kek_name);
  if (records.ok()) return records;
  if (internal::IsSystemError(records.status())) {
    return KeyStoreFailureForCaller(Describe(), path_, call, records.status(),
                                    KeyStoreFailure::kUnavailable,
                                    "the key store file could not be read");
  }
  return KeyStoreFailureForCaller(Describe(), path_, call, records.status(),
                                  KeyStoreFailure::kOther);
}

absl::Status FileKeyStore::WriteForCallLocked(absl::string_view call,
                                              absl::Span<const KeyRecord> records) {
  bool committed = false;
  absl::Status written = WriteLocked(records, &committed);
  if (written.ok()) return written;
  if (committed) {
    // keys.db holds the change, but the directory's fsync failed: a crash may still undo it.
    // Not "not written" (a retried rotation would rotate twice): the caller reads the key.
    return KeyStoreFailureForCaller(Describe(), path_, call, written,
                                    KeyStoreFailure::kOutcomeUnknown,
                                    "the change was written to the key store file but could "
                                    "not be made durable");
  }
  if (internal::IsSystemError(written)) {
    return KeyStoreFailureForCaller(Describe(), path_, call, written,
                                    KeyStoreFailure::kUnavailable,
                                    "the change could not be written to the key store file");
  }
  return KeyStoreFailureForCaller(Describe(), path_, call, written, KeyStoreFailure::kOther);
}

absl::Status FileKeyStore::WriteLocked(absl::Span<const KeyRecord> records, bool* committed) {
  if (committed != nullptr) *committed = false;
  absl::StatusOr<SecretBytes> plain = SerializeKeyStoreContents(records);
  if (!plain.ok()) return Annotate(plain.status(), path_);
  absl::StatusOr<std::vector<uint8_t>> blob =
      SealEnvelope(*keks_->Current(), EnvelopeKind::kKeyStoreContents, {}, *plain);
  if (!blob.ok()) {
    return Annotate(blob.status(),
                    absl::StrCat(path_, ": the key store file cannot be sealed"));
  }
  // Errors name the temp file or the directory: the path in front is the store's, for the
  // caller's view to strip.
  absl::Status written = internal::WriteFileAtomically(dir_fd_.get(), dir_, kFileName,
                                                       kTempFileName, *blob, kFileMode,
                                                       /*no_replace=*/false, committed);
  return written.ok() ? written : Annotate(written, path_);
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  return ReadForCallLocked("load_all");
}

absl::Status FileKeyStore::Put(const KeyRecord& record) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(record));
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("put"));
  auto it = std::lower_bound(
      records.begin(), records.end(), record.key_id,
      [](const KeyRecord& r, const std::string& id) { return r.key_id < id; });
  if (it != records.end() && it->key_id == record.key_id) {
    *it = record;
  } else {
    records.insert(it, record);
  }
  return WriteForCallLocked("put", records);
}

namespace {
// The record of `key_id` in `records`, or NotFound.
absl::StatusOr<std::vector<KeyRecord>::iterator> Find(std::vector<KeyRecord>& records,
                                                       absl::string_view key_id) {
  auto it = std::find_if(records.begin(), records.end(),
                         [key_id](const KeyRecord& r) { return r.key_id == key_id; });
  if (it == records.end()) {
    return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
  }
  return it;
}
}  // namespace

absl::Status FileKeyStore::Delete(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("delete"));
  OFFLOAD_ASSIGN_OR_RETURN(auto it, Find(records, key_id));
  records.erase(it);
  return WriteForCallLocked("delete", records);
}

absl::Status FileKeyStore::DeleteIf(absl::string_view key_id, const DeletePredicate& only_if) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("delete_if"));
  OFFLOAD_ASSIGN_OR_RETURN(auto it, Find(records, key_id));
  if (!only_if(*it)) {
    return absl::FailedPreconditionError(
        absl::StrCat("key \"", key_id, "\" changed in the store: not removed"));
  }
  records.erase(it);
  return WriteForCallLocked("delete_if", records);
}

absl::StatusOr<KeyRecord> FileKeyStore::Load(absl::string_view key_id) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("load"));
  for (KeyRecord& r : records) {
    if (r.key_id == key_id) return std::move(r);
  }
  return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" is not in the store"));
}

absl::Status FileKeyStore::Insert(const KeyRecord& record) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(record));
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("insert"));
  auto it = std::lower_bound(
      records.begin(), records.end(), record.key_id,
      [](const KeyRecord& r, const std::string& id) { return r.key_id < id; });
  if (it != records.end() && it->key_id == record.key_id) {
    return absl::AlreadyExistsError(
        absl::StrCat("key \"", record.key_id, "\" is already in the store"));
  }
  records.insert(it, record);
  return WriteForCallLocked("insert", records);
}

absl::Status FileKeyStore::Update(absl::string_view key_id, const UpdateFn& update) {
  absl::MutexLock lock(&mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, ReadForCallLocked("update"));
  OFFLOAD_ASSIGN_OR_RETURN(auto it, Find(records, key_id));
  OFFLOAD_ASSIGN_OR_RETURN(KeyRecord updated, update(*it));
  if (updated.key_id != key_id) {
    return absl::InvalidArgumentError(absl::StrCat("update: changed the key id from \"", key_id,
                                                   "\" to \"", updated.key_id, "\""));
  }
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(updated));
  *it = std::move(updated);
  return WriteForCallLocked("update", records);
}

absl::StatusOr<RewrapReport> FileKeyStore::RewrapAll() {
  absl::MutexLock lock(&mu_);
  std::string kek_name;
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records,
                           ReadForCallLocked("rewrap_all", &kek_name));
  RewrapReport report;
  if (kek_name == keks_->Current()->name()) return report;
  OFFLOAD_RETURN_IF_ERROR(WriteForCallLocked("rewrap_all", records));
  report.rewrapped = records.size();
  return report;
}

std::string FileKeyStore::Describe() const { return absl::StrCat("file:", path_); }

}  // namespace offload::keys
