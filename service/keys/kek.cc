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


// ------------------------------------------------------------------------------------------------
// RawKek

namespace {
constexpr size_t kRawWrapNonceSize = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
constexpr size_t kRawWrapTagSize = crypto_aead_xchacha20poly1305_ietf_ABYTES;
constexpr size_t kDataKeySize = 32;
}  // namespace

absl::StatusOr<std::shared_ptr<const RawKek>> RawKek::Create(SecretBytes key) {
  if (key.size() != kKekSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek: expected ", kKekSize, " bytes, got ", key.size()));
  }
  std::string name = absl::StrCat("raw:", KekIdHex(key));
  return std::shared_ptr<const RawKek>(new RawKek(std::move(key), std::move(name)));
}

size_t RawKek::wrapped_size() const { return kRawWrapNonceSize + kDataKeySize + kRawWrapTagSize; }

absl::StatusOr<std::vector<uint8_t>> RawKek::Wrap(absl::Span<const uint8_t> data_key,
                                                  absl::Span<const uint8_t> aad) const {
  if (data_key.size() != kDataKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("data key: expected ", kDataKeySize, " bytes, got ", data_key.size()));
  }
  std::vector<uint8_t> out(wrapped_size());
  randombytes_buf(out.data(), kRawWrapNonceSize);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_encrypt(out.data() + kRawWrapNonceSize, &written,
                                                 data_key.data(), data_key.size(), aad.data(),
                                                 aad.size(), nullptr, out.data(), key_.data()) != 0 ||
      written != kDataKeySize + kRawWrapTagSize) {
    return absl::InternalError(absl::StrCat("kek ", name_, ": wrapping failed"));
  }
  return out;
}

absl::StatusOr<SecretBytes> RawKek::Unwrap(absl::Span<const uint8_t> wrapped,
                                           absl::Span<const uint8_t> aad) const {
  if (wrapped.size() != wrapped_size()) {
    return absl::DataLossError(absl::StrCat("kek ", name_, ": wrapped data key of ", wrapped.size(),
                                            " bytes, expected ", wrapped_size()));
  }
  SecretBytes data_key(kDataKeySize);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          data_key.data(), &written, nullptr, wrapped.data() + kRawWrapNonceSize,
          wrapped.size() - kRawWrapNonceSize, aad.data(), aad.size(), wrapped.data(),
          key_.data()) != 0) {
    return absl::DataLossError(absl::StrCat(
        "kek ", name_, ": the wrapped data key does not authenticate (corrupted or modified)"));
  }
  return data_key;
}

// ------------------------------------------------------------------------------------------------
// KekRing

absl::StatusOr<std::shared_ptr<KekRing>> KekRing::Create(
    std::shared_ptr<const Kek> current, std::vector<std::shared_ptr<const Kek>> previous,
    std::shared_ptr<KekResolver> resolver) {
  if (current == nullptr && resolver == nullptr) {
    return absl::InvalidArgumentError("kek ring: needs a current KEK or a resolver");
  }
  if (current == nullptr) {
    OFFLOAD_ASSIGN_OR_RETURN(current, resolver->ResolveCurrent());
  }
  std::shared_ptr<KekRing> ring(new KekRing(std::move(resolver)));
  absl::MutexLock lock(&ring->mu_);
  ring->current_ = current;
  OFFLOAD_RETURN_IF_ERROR(ring->AddLocked(std::move(current)));
  for (std::shared_ptr<const Kek>& kek : previous) {
    if (kek == nullptr) return absl::InvalidArgumentError("kek ring: null previous KEK");
    if (kek->name() == ring->current_->name()) continue;  // the same key given twice
    OFFLOAD_RETURN_IF_ERROR(ring->AddLocked(std::move(kek)));
    ++ring->previous_count_;
  }
  return ring;
}

absl::StatusOr<std::shared_ptr<KekRing>> KekRing::FromRawKey(SecretBytes key) {
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const RawKek> kek, RawKek::Create(std::move(key)));
  return Create(std::move(kek), {});
}

absl::Status KekRing::AddLocked(std::shared_ptr<const Kek> kek) const {
  auto [it, inserted] = held_.try_emplace(kek->name(), kek);
  if (!inserted && it->second != kek) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek ring: two KEKs are named \"", kek->name(), "\""));
  }
  return absl::OkStatus();
}

std::shared_ptr<const Kek> KekRing::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

absl::StatusOr<std::shared_ptr<const Kek>> KekRing::Find(absl::string_view name) const {
  std::string current_name;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = held_.find(name); it != held_.end()) return it->second;
    current_name = current_->name();
  }
  if (resolver_ != nullptr) {
    absl::StatusOr<std::shared_ptr<const Kek>> found = resolver_->Resolve(name);
    if (found.ok()) {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = held_.try_emplace((*found)->name(), *found);
      return it->second;
    }
    if (!absl::IsNotFound(found.status())) return found.status();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "encrypted under a different key-encryption key, \"", name,
      "\", which this process does not hold (current KEK \"", current_name, "\"",
      resolver_ != nullptr ? absl::StrCat(", looked up in ", resolver_->Describe()) : "",
      "; give the KEK it was wrapped under as a previous KEK)"));
}

absl::StatusOr<bool> KekRing::Refresh() {
  if (resolver_ == nullptr) return false;
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const Kek> latest, resolver_->ResolveCurrent());
  absl::MutexLock lock(&mu_);
  if (latest->name() == current_->name()) return false;
  auto [it, inserted] = held_.try_emplace(latest->name(), latest);
  current_ = it->second;
  return true;
}

std::string KekRing::Describe() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat("current ", current_->name());
  if (resolver_ != nullptr) absl::StrAppend(&out, " (", resolver_->Describe(), ")");
  if (previous_count_ > 0) absl::StrAppend(&out, ", ", previous_count_, " previous");
  return out;
}

}  // namespace offload::keys
