#include "service/keys/kek.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "service/common/status_macros.h"
#include "service/keys/envelope.h"
#include "service/keys/file_key_store.h"
#include "service/keys/internal/file_util.h"

namespace offload::keys {
namespace {

constexpr size_t kHexSize = 2 * kKekSize;
constexpr size_t kMaxKekFileSize = 4096;

bool AllHex(absl::Span<const uint8_t> bytes) {
  for (uint8_t c : bytes) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  return true;
}

// `text` holding 64 hex characters with optional surrounding whitespace -> 32 bytes. Messages
// name `what` and sizes, never the content.
absl::StatusOr<SecretBytes> ParseHexKek(absl::Span<const uint8_t> text, absl::string_view what) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && absl::ascii_isspace(text[begin])) ++begin;
  while (end > begin && absl::ascii_isspace(text[end - 1])) --end;
  const absl::Span<const uint8_t> hex = text.subspan(begin, end - begin);
  if (hex.size() != kHexSize) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", kHexSize,
                                                   " hex characters, got ", hex.size()));
  }
  if (!AllHex(hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", kHexSize, " hex characters, found a non-hex character"));
  }
  SecretBytes kek(kKekSize);
  size_t decoded = 0;
  if (sodium_hex2bin(kek.data(), kek.size(), reinterpret_cast<const char*>(hex.data()), hex.size(),
                     nullptr, &decoded, nullptr) != 0 ||
      decoded != kKekSize) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": invalid hex"));
  }
  return kek;
}

absl::Status CheckPrivateMode(mode_t mode, absl::string_view path) {
  if ((mode & 0077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "kek file %s has mode %04o: refusing a KEK file that group or others may access "
        "(chmod 600 it; on Kubernetes set defaultMode: 0400 on the Secret volume)",
        path, mode));
  }
  return absl::OkStatus();
}

// Reads a KEK file: 32 raw bytes or 64 hex characters. `dir_fd` may be AT_FDCWD.
absl::StatusOr<SecretBytes> ReadKekFile(int dir_fd, const std::string& name,
                                        absl::string_view display_path) {
  mode_t mode = 0;
  absl::StatusOr<SecretBytes> content = internal::ReadFileAt(dir_fd, name, kMaxKekFileSize, &mode);
  if (!content.ok()) {
    return absl::Status(content.status().code(),
                        absl::StrCat("kek file: ", content.status().message()));
  }
  OFFLOAD_RETURN_IF_ERROR(CheckPrivateMode(mode, display_path));
  const std::string what = absl::StrCat("kek file ", display_path);
  if (content->size() == kKekSize) {
    // 32 hex digits is almost surely a hex-encoded 16-byte key, not 32 random raw bytes.
    if (AllHex(*content)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": holds 32 hex characters (a 16-byte key); expected 64 hex characters or 32 raw "
                "bytes"));
    }
    return std::move(*content);
  }
  absl::StatusOr<SecretBytes> kek = ParseHexKek(*content, what);
  if (!kek.ok() && content->size() != kKekSize) {
    return absl::InvalidArgumentError(absl::StrCat(kek.status().message(), " (or 32 raw bytes, got ",
                                                   content->size(), " bytes)"));
  }
  return kek;
}

absl::StatusOr<SecretBytes> LoadOrGenerate(const std::string& data_dir, KekOrigin* origin) {
  std::string dir = data_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string path = absl::StrCat(dir, "/", kGeneratedKekFileName);
  OFFLOAD_RETURN_IF_ERROR(internal::MakeDirs(dir, 0700));
  OFFLOAD_ASSIGN_OR_RETURN(internal::UniqueFd dir_fd, internal::OpenDir(dir));

  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<SecretBytes> existing = ReadKekFile(dir_fd.get(), kGeneratedKekFileName, path);
    if (existing.ok() || !absl::IsNotFound(existing.status())) {
      origin->description = absl::StrCat("file ", path, " (generated on an earlier start)");
      return existing;
    }
    if (attempt > 0) break;

    struct stat st;
    if (::fstatat(dir_fd.get(), FileKeyStore::kFileName, &st, 0) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no KEK configured and ", path, " is missing, but ", dir, "/", FileKeyStore::kFileName,
          " exists: it is sealed under a KEK that is no longer available; refusing to generate a "
          "new one (restore the KEK, or move the key store away to start empty)"));
    }
    SecretBytes kek(kKekSize);
    randombytes_buf(kek.data(), kek.size());
    SecretBytes hex(kHexSize + 1);
    sodium_bin2hex(reinterpret_cast<char*>(hex.data()), hex.size(), kek.data(), kek.size());
    hex[kHexSize] = '\n';
    const std::string temp_name = absl::StrCat(kGeneratedKekFileName, ".tmp.", ::getpid());
    absl::Status written = internal::WriteFileAtomically(dir_fd.get(), dir, kGeneratedKekFileName,
                                                         temp_name, hex, 0600, /*no_replace=*/true);
    if (written.ok()) {
      origin->generated = true;
      origin->description = absl::StrCat("file ", path, " (newly generated)");
      return kek;
    }
    if (!absl::IsAlreadyExists(written)) return written;
    // Another process generated it first: loop once to read theirs.
  }
  return absl::InternalError(absl::StrCat("kek file ", path, ": could not be created or read"));
}

}  // namespace

absl::StatusOr<SecretBytes> LoadKek(const KekSource& source, KekOrigin* origin) {
  KekOrigin ignored;
  if (origin == nullptr) origin = &ignored;
  *origin = KekOrigin();

  if (!source.file.empty()) {
    origin->description = absl::StrCat("file ", source.file);
    return ReadKekFile(AT_FDCWD, source.file, source.file);
  }

  const std::string var = source.env_var.empty() ? kDefaultKekEnvVar : source.env_var;
  const char* value = std::getenv(var.c_str());
  if (value != nullptr && *value != '\0') {
    origin->description = absl::StrCat("environment variable ", var);
    const absl::string_view text(value);
    return ParseHexKek(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
                       absl::StrCat("environment variable ", var));
  }
  if (source.data_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no KEK source: give a KEK file, set ", var,
                                                   ", or give a data directory"));
  }
  return LoadOrGenerate(source.data_dir, origin);
}

}  // namespace offload::keys
