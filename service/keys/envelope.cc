#include "service/keys/envelope.h"

#include <sodium.h>

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace offload::keys {
namespace {

constexpr uint8_t kMagic[4] = {'O', 'F', 'K', 'S'};
constexpr size_t kVersionOffset = 4;
constexpr size_t kKindOffset = 5;
constexpr size_t kReservedOffset = 6;
constexpr size_t kKekIdOffset = 8;
constexpr size_t kNonceOffset = 16;
constexpr size_t kNonceSize = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
static_assert(kNonceOffset + kNonceSize == kEnvelopeHeaderSize);
static_assert(crypto_aead_xchacha20poly1305_ietf_ABYTES == kEnvelopeTagSize);
static_assert(crypto_aead_xchacha20poly1305_ietf_KEYBYTES == kKekSize);

absl::Status CheckKek(absl::Span<const uint8_t> kek) {
  if (kek.size() != kKekSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek: expected ", kKekSize, " bytes, got ", kek.size()));
  }
  return absl::OkStatus();
}

// header || context, the AEAD's associated data.
std::vector<uint8_t> AssociatedData(absl::Span<const uint8_t> header,
                                    absl::Span<const uint8_t> context) {
  std::vector<uint8_t> aad(header.size() + context.size());
  std::memcpy(aad.data(), header.data(), header.size());
  if (!context.empty()) std::memcpy(aad.data() + header.size(), context.data(), context.size());
  return aad;
}

std::string Hex(absl::Span<const uint8_t> bytes) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace

std::array<uint8_t, 8> KekId(absl::Span<const uint8_t> kek) {
  static constexpr char kLabel[] = "offload.kek-id.v1";
  uint8_t digest[16];
  crypto_generichash(digest, sizeof(digest), reinterpret_cast<const uint8_t*>(kLabel),
                     sizeof(kLabel) - 1, kek.data(), kek.size());
  std::array<uint8_t, 8> id;
  std::memcpy(id.data(), digest, id.size());
  return id;
}

std::string KekIdHex(absl::Span<const uint8_t> kek) { return Hex(KekId(kek)); }

absl::StatusOr<std::vector<uint8_t>> SealEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                                  absl::Span<const uint8_t> context,
                                                  absl::Span<const uint8_t> plaintext) {
  if (absl::Status s = CheckKek(kek); !s.ok()) return s;
  std::vector<uint8_t> blob(kEnvelopeHeaderSize + plaintext.size() + kEnvelopeTagSize);
  std::memcpy(blob.data(), kMagic, sizeof(kMagic));
  blob[kVersionOffset] = kEnvelopeFormatVersion;
  blob[kKindOffset] = static_cast<uint8_t>(kind);
  blob[kReservedOffset] = 0;
  blob[kReservedOffset + 1] = 0;
  const std::array<uint8_t, 8> kek_id = KekId(kek);
  std::memcpy(blob.data() + kKekIdOffset, kek_id.data(), kek_id.size());
  randombytes_buf(blob.data() + kNonceOffset, kNonceSize);

  const std::vector<uint8_t> aad =
      AssociatedData(absl::MakeConstSpan(blob.data(), kEnvelopeHeaderSize), context);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_encrypt(
          blob.data() + kEnvelopeHeaderSize, &written, plaintext.data(), plaintext.size(),
          aad.data(), aad.size(), nullptr, blob.data() + kNonceOffset, kek.data()) != 0 ||
      written != plaintext.size() + kEnvelopeTagSize) {
    return absl::InternalError("key store envelope: encryption failed");
  }
  return blob;
}

absl::StatusOr<SecretBytes> OpenEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob) {
  if (absl::Status s = CheckKek(kek); !s.ok()) return s;
  constexpr size_t kMinSize = kEnvelopeHeaderSize + kEnvelopeTagSize;
  if (blob.size() < kMinSize) {
    return absl::DataLossError(absl::StrCat("key store envelope: expected at least ", kMinSize,
                                            " bytes, got ", blob.size(), " (truncated?)"));
  }
  if (std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("key store envelope: bad magic, not an offload key store");
  }
  if (blob[kVersionOffset] != kEnvelopeFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("key store envelope: format version ", blob[kVersionOffset],
                     " is not supported (this build reads version ", kEnvelopeFormatVersion, ")"));
  }
  if (blob[kKindOffset] != static_cast<uint8_t>(kind) || blob[kReservedOffset] != 0 ||
      blob[kReservedOffset + 1] != 0) {
    return absl::DataLossError(absl::StrCat("key store envelope: unexpected kind ",
                                            blob[kKindOffset], " or reserved bytes (expected kind ",
                                            static_cast<int>(kind), ")"));
  }
  const std::array<uint8_t, 8> kek_id = KekId(kek);
  if (std::memcmp(blob.data() + kKekIdOffset, kek_id.data(), kek_id.size()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key store envelope: encrypted under a different key-encryption key (kek id ",
        Hex(blob.subspan(kKekIdOffset, kek_id.size())), ", the configured KEK has id ",
        Hex(kek_id), ")"));
  }

  const std::vector<uint8_t> aad = AssociatedData(blob.first(kEnvelopeHeaderSize), context);
  const size_t ciphertext_size = blob.size() - kEnvelopeHeaderSize;
  SecretBytes plaintext(ciphertext_size - kEnvelopeTagSize);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          plaintext.data(), &written, nullptr, blob.data() + kEnvelopeHeaderSize, ciphertext_size,
          aad.data(), aad.size(), blob.data() + kNonceOffset, kek.data()) != 0) {
    sodium_memzero(plaintext.data(), plaintext.size());
    return absl::DataLossError(
        "key store envelope: authentication failed (the data is corrupted or was modified)");
  }
  return plaintext;
}

}  // namespace offload::keys
