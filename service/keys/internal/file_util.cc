#include "service/keys/internal/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace offload::keys::internal {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

namespace {
constexpr char kSystemErrorPayload[] = "type.offload/keys.errno";
}  // namespace

absl::Status ErrnoError(int error_number, absl::string_view operation, absl::string_view path) {
  absl::Status s = absl::ErrnoToStatus(error_number, absl::StrCat(operation, " ", path));
  s.SetPayload(kSystemErrorPayload, absl::Cord(absl::StrCat(error_number)));
  return s;
}

bool IsSystemError(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kSystemErrorPayload).has_value();
}

void CopyPayloads(const absl::Status& from, absl::Status& to) {
  from.ForEachPayload(
      [&to](absl::string_view url, const absl::Cord& payload) { to.SetPayload(url, payload); });
}

absl::Status MakeDirs(const std::string& path, mode_t mode) {
  if (path.empty()) return absl::InvalidArgumentError("directory path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
    }
    return absl::OkStatus();
  }
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirs(path.substr(0, slash), mode); !s.ok()) return s;
  }
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return ErrnoError(errno, "mkdir", path);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> OpenDir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(errno, "open directory", path);
  return fd;
}

absl::StatusOr<SecretBytes> ReadFileAt(int dir_fd, const std::string& name, size_t max_size,
                                       mode_t* mode) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(errno, "open", name);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "stat", name);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_size) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": expected at most ", max_size,
                                                     " bytes, got ", st.st_size));
  }
  if (mode != nullptr) *mode = st.st_mode & 07777;
  // Read until EOF rather than trusting st_size, which may change under us.
  SecretBytes data;
  data.reserve(static_cast<size_t>(st.st_size) + 1);
  uint8_t chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      sodium_memzero(chunk, sizeof(chunk));
      return ErrnoError(errno, "read", name);
    }
    if (n == 0) break;
    if (data.size() + static_cast<size_t>(n) > max_size) {
      sodium_memzero(chunk, sizeof(chunk));
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ": expected at most ", max_size, " bytes"));
    }
    data.insert(data.end(), chunk, chunk + n);
  }
  sodium_memzero(chunk, sizeof(chunk));
  return data;
}

absl::Status WriteFileAtomically(int dir_fd, absl::string_view display_dir, const std::string& name,
                                 const std::string& temp_name, absl::Span<const uint8_t> data,
                                 mode_t mode, bool no_replace, bool* committed_out) {
  if (committed_out != nullptr) *committed_out = false;
  const std::string temp_path = absl::StrCat(display_dir, "/", temp_name);
  UniqueFd fd(::openat(dir_fd, temp_name.c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd.valid()) return ErrnoError(errno, "create", temp_path);
  bool committed = false;
  absl::Cleanup remove_temp = [&] {
    if (!committed) ::unlinkat(dir_fd, temp_name.c_str(), 0);
  };
  // A pre-existing temp file keeps its old mode through O_CREAT: force ours.
  if (::fchmod(fd.get(), mode) != 0) return ErrnoError(errno, "chmod", temp_path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", temp_path);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync", temp_path);
  if (::close(fd.release()) != 0) return ErrnoError(errno, "close", temp_path);

  const std::string path = absl::StrCat(display_dir, "/", name);
  if (no_replace) {
    if (::linkat(dir_fd, temp_name.c_str(), dir_fd, name.c_str(), 0) != 0) {
      return ErrnoError(errno, "link", path);
    }
    ::unlinkat(dir_fd, temp_name.c_str(), 0);
  } else if (::renameat(dir_fd, temp_name.c_str(), dir_fd, name.c_str()) != 0) {
    return ErrnoError(errno, "rename", path);
  }
  committed = true;
  if (committed_out != nullptr) *committed_out = true;
  if (::fsync(dir_fd) != 0) return ErrnoError(errno, "fsync directory", display_dir);
  return absl::OkStatus();
}

}  // namespace offload::keys::internal
