// POSIX file helpers for the file key store and the KEK file: bounded reads into wiping memory,
// crash-safe replacement of a file (temp file, fsync, rename, fsync of the directory), and
// private directories. Errors carry the path and strerror. Thread-safety: stateless; callers
// serialise writers of one file.
#ifndef SERVICE_KEYS_INTERNAL_FILE_UTIL_H_
#define SERVICE_KEYS_INTERNAL_FILE_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"

namespace offload::keys::internal {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();

 private:
  int fd_ = -1;
};

// `operation` + `path` + strerror(`error_number`), with the matching status code, marked as the
// system's error (IsSystemError).
absl::Status ErrnoError(int error_number, absl::string_view operation, absl::string_view path);

// Whether `s` came from ErrnoError (a system call failed: I/O, not the file's contents or
// kind). The mark is a payload: a status rebuilt around `s` keeps it only if it copies the
// payloads (CopyPayloads).
bool IsSystemError(const absl::Status& s);

// Copies every payload of `from` into `to`.
void CopyPayloads(const absl::Status& from, absl::Status& to);

// Creates `path` and any missing parents with `mode` (umask applies). OK if it already exists
// as a directory.
absl::Status MakeDirs(const std::string& path, mode_t mode);

// Opens the directory `path` for fsync / openat / flock.
absl::StatusOr<UniqueFd> OpenDir(const std::string& path);

// Reads all of the regular file `name` in `dir_fd` (or `name` as a path when `dir_fd` is
// AT_FDCWD). NotFound if absent; ResourceExhausted if larger than `max_size`. When `mode` is not
// null, stores the file's permission bits.
absl::StatusOr<SecretBytes> ReadFileAt(int dir_fd, const std::string& name, size_t max_size,
                                       mode_t* mode = nullptr);

// Replaces `name` in `dir_fd` with `data` so that a crash at any point leaves either the old or the
// new complete file: writes `temp_name` (created with `mode`), fsyncs it, renames it over `name`
// and fsyncs the directory. With `no_replace`, links instead of renaming and fails with
// AlreadyExists if `name` exists. `display_dir` is only used in error messages.
// `committed`, when given, is set to whether `name` holds `data` when the call returns: true
// also when only the final fsync of the directory failed (the new file is in place, but a crash
// may still bring the old one back), so that a caller can tell "not written" from "written,
// durability unknown".
absl::Status WriteFileAtomically(int dir_fd, absl::string_view display_dir, const std::string& name,
                                 const std::string& temp_name, absl::Span<const uint8_t> data,
                                 mode_t mode, bool no_replace = false,
                                 bool* committed = nullptr);

}  // namespace offload::keys::internal

#endif  // SERVICE_KEYS_INTERNAL_FILE_UTIL_H_
