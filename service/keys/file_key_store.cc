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

absl::Status Annotate(const absl::Status& status, absl::string_view path) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
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
  if (!blob.ok()) {
    if (absl::IsNotFound(blob.status())) {
      return absl::DataLossError(absl::StrCat(path_, ": the key store file has disappeared"));
    }
    return Annotate(blob.status(), dir_);
  }
  return blob;
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::DecodeLocked(const SecretBytes& blob,
                                                                  std::string* kek_name) {
  if (kek_name != nullptr) {
    absl::StatusOr<std::string> name = EnvelopeKekName(blob);
    if (!name.ok()) return Annotate(name.status(), path_);
    *kek_name = *std::move(name);
  }
  absl::StatusOr<SecretBytes> plain =
      OpenEnvelope(*keks_, EnvelopeKind::kKeyStoreContents, {}, blob);
  if (!plain.ok()) return Annotate(plain.status(), path_);
  absl::StatusOr<std::vector<KeyRecord>> records = ParseKeyStoreContents(*plain);
  if (!records.ok()) return Annotate(records.status(), path_);
  return records;
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::ReadLocked(std::string* kek_name) {
  OFFLOAD_ASSIGN_OR_RETURN(SecretBytes blob, ReadBlobLocked());
  return DecodeLocked(blob, kek_name);
}

absl::Status FileKeyStore::Logged(absl::string_view call, const absl::Status& detail,
                                  absl::Status for_caller) const {
  Log(LogLevel::kWarning, "keystore_error",
      {{"store", Describe()}, {"call", std::string(call)}, {"error", detail.ToString()}});
  return for_caller;
}

absl::StatusOr<std::vector<KeyRecord>> FileKeyStore::ReadForCallLocked(absl::string_view call,
                                                                       std::string* kek_name) {
  absl::StatusOr<SecretBytes> blob = ReadBlobLocked();
  if (!blob.ok()) {
    return Logged(call, blob.status(),
                  absl::UnavailableError(absl::StrCat(
                      kKeyStoreUnavailable, ": the key store file could not be read")));
  }
  absl::StatusOr<std::vector<KeyRecord>> records = DecodeLocked(*blob, kek_name);
  if (!records.ok()) {
    return Logged(call, records.status(),
                  absl::DataLossError("the key store file cannot be opened: it is damaged, or "
                                      "sealed under a KEK this server does not hold"));
  }
  return records;
}

absl::Status FileKeyStore::WriteForCallLocked(absl::string_view call,
                                              absl::Span<const KeyRecord> records) {
  absl::Status written = WriteLocked(records);
  if (written.ok()) return written;
  return Logged(call, written,
                absl::UnavailableError(absl::StrCat(
                    kKeyStoreUnavailable, ": the change could not be written to the key store "
                                          "file")));
}

absl::Status FileKeyStore::WriteLocked(absl::Span<const KeyRecord> records) {
  OFFLOAD_ASSIGN_OR_RETURN(SecretBytes plain, SerializeKeyStoreContents(records));
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob,
                           SealEnvelope(*keks_->Current(), EnvelopeKind::kKeyStoreContents, {},
                                        plain));
  return internal::WriteFileAtomically(dir_fd_.get(), dir_, kFileName, kTempFileName, blob,
                                       kFileMode);
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
