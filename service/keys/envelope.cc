#include "service/keys/envelope.h"

#include <sodium.h>

#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "service/common/status_macros.h"

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

namespace {

constexpr size_t kV2NameSizeOffset = 6;
constexpr size_t kV2WrappedSizeOffset = 7;
constexpr size_t kV2NameOffset = 8;
constexpr char kV2WrapLabel[] = "offload.envelope.v2";
constexpr size_t kDataKeySize = crypto_aead_xchacha20poly1305_ietf_KEYBYTES;

absl::Status V2Error(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("key store envelope (format version 2): ", what));
}

// "offload.envelope.v2" || `prefix` (bytes 0..8+n) || `context`: what the data key is bound to.
std::vector<uint8_t> WrapAad(absl::Span<const uint8_t> prefix, absl::Span<const uint8_t> context) {
  std::vector<uint8_t> aad;
  aad.reserve(sizeof(kV2WrapLabel) - 1 + prefix.size() + context.size());
  aad.insert(aad.end(), kV2WrapLabel, kV2WrapLabel + sizeof(kV2WrapLabel) - 1);
  aad.insert(aad.end(), prefix.begin(), prefix.end());
  aad.insert(aad.end(), context.begin(), context.end());
  return aad;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > Kek::kMaxNameSize) return false;
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// The parsed offsets of a format 2 header.
struct V2Header {
  absl::string_view kek_name;
  size_t wrapped_offset = 0;
  size_t wrapped_size = 0;
  size_t nonce_offset = 0;
  size_t payload_offset = 0;
};

absl::StatusOr<V2Header> ParseV2(absl::Span<const uint8_t> blob) {
  if (blob.size() < kV2NameOffset) return V2Error("truncated header");
  const size_t n = blob[kV2NameSizeOffset];
  const size_t w = blob[kV2WrappedSizeOffset];
  V2Header h;
  h.wrapped_offset = kV2NameOffset + n;
  h.wrapped_size = w;
  h.nonce_offset = h.wrapped_offset + w;
  h.payload_offset = h.nonce_offset + kNonceSize;
  if (n == 0 || w == 0) return V2Error("empty KEK name or wrapped data key");
  if (blob.size() < h.payload_offset + kEnvelopeTagSize) {
    return V2Error(absl::StrCat("expected at least ", h.payload_offset + kEnvelopeTagSize,
                                " bytes, got ", blob.size(), " (truncated?)"));
  }
  h.kek_name = absl::string_view(reinterpret_cast<const char*>(blob.data() + kV2NameOffset), n);
  if (!ValidName(h.kek_name)) return V2Error("the KEK name is not printable ASCII");
  return h;
}

absl::Status CheckMagic(absl::Span<const uint8_t> blob) {
  if (blob.size() < kVersionOffset + 2) {
    return absl::DataLossError(absl::StrCat("key store envelope: expected at least ",
                                            kVersionOffset + 2, " bytes, got ", blob.size(),
                                            " (truncated?)"));
  }
  if (std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("key store envelope: bad magic, not an offload key store");
  }
  return absl::OkStatus();
}

absl::Status UnsupportedVersion(uint8_t version) {
  return absl::FailedPreconditionError(absl::StrCat(
      "key store envelope: format version ", version, " is not supported (this build reads ",
      "versions ", kEnvelopeFormatVersion, " and ", kEnvelopeFormatKekNamed, ")"));
}

absl::StatusOr<SecretBytes> OpenV1(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                   absl::Span<const uint8_t> context,
                                   absl::Span<const uint8_t> blob) {
  if (absl::Status s = CheckKek(kek); !s.ok()) return s;
  constexpr size_t kMinSize = kEnvelopeHeaderSize + kEnvelopeTagSize;
  if (blob.size() < kMinSize) {
    return absl::DataLossError(absl::StrCat("key store envelope: expected at least ", kMinSize,
                                            " bytes, got ", blob.size(), " (truncated?)"));
  }
  if (blob[kKindOffset] != static_cast<uint8_t>(kind) || blob[kReservedOffset] != 0 ||
      blob[kReservedOffset + 1] != 0) {
    return absl::DataLossError(absl::StrCat("key store envelope: unexpected kind ",
                                            blob[kKindOffset], " or reserved bytes (expected kind ",
                                            static_cast<int>(kind), ")"));
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

}  // namespace

absl::StatusOr<std::string> EnvelopeKekName(absl::Span<const uint8_t> blob) {
  if (absl::Status s = CheckMagic(blob); !s.ok()) return s;
  if (blob[kVersionOffset] == kEnvelopeFormatVersion) {
    if (blob.size() < kNonceOffset) {
      return absl::DataLossError("key store envelope: truncated header");
    }
    return absl::StrCat("raw:", Hex(blob.subspan(kKekIdOffset, 8)));
  }
  if (blob[kVersionOffset] != kEnvelopeFormatKekNamed) return UnsupportedVersion(blob[kVersionOffset]);
  if (absl::StatusOr<V2Header> h = ParseV2(blob); h.ok()) {
    return std::string(h->kek_name);
  } else {
    return h.status();
  }
}

absl::StatusOr<std::vector<uint8_t>> SealEnvelope(const Kek& kek, EnvelopeKind kind,
                                                  absl::Span<const uint8_t> context,
                                                  absl::Span<const uint8_t> plaintext) {
  const std::string& name = kek.name();
  const size_t w = kek.wrapped_size();
  if (!ValidName(name) || w == 0 || w > 255) {
    return absl::InternalError(absl::StrCat("key store envelope: KEK \"", name,
                                            "\" has an unusable name or wrapped size ", w));
  }
  const size_t nonce_offset = kV2NameOffset + name.size() + w;
  const size_t payload_offset = nonce_offset + kNonceSize;
  std::vector<uint8_t> blob(payload_offset + plaintext.size() + kEnvelopeTagSize);
  std::memcpy(blob.data(), kMagic, sizeof(kMagic));
  blob[kVersionOffset] = kEnvelopeFormatKekNamed;
  blob[kKindOffset] = static_cast<uint8_t>(kind);
  blob[kV2NameSizeOffset] = static_cast<uint8_t>(name.size());
  blob[kV2WrappedSizeOffset] = static_cast<uint8_t>(w);
  std::memcpy(blob.data() + kV2NameOffset, name.data(), name.size());

  SecretBytes data_key(kDataKeySize);
  randombytes_buf(data_key.data(), data_key.size());
  const absl::Span<const uint8_t> prefix(blob.data(), kV2NameOffset + name.size());
  absl::StatusOr<std::vector<uint8_t>> wrapped = kek.Wrap(data_key, WrapAad(prefix, context));
  if (!wrapped.ok()) {
    return absl::Status(wrapped.status().code(),
                        absl::StrCat("key store envelope: ", wrapped.status().message()));
  }
  if (wrapped->size() != w) {
    return absl::InternalError(absl::StrCat("key store envelope: KEK \"", name, "\" wrapped ",
                                            wrapped->size(), " bytes, expected ", w));
  }
  std::memcpy(blob.data() + kV2NameOffset + name.size(), wrapped->data(), w);
  randombytes_buf(blob.data() + nonce_offset, kNonceSize);

  const std::vector<uint8_t> aad =
      AssociatedData(absl::MakeConstSpan(blob.data(), payload_offset), context);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_encrypt(
          blob.data() + payload_offset, &written, plaintext.data(), plaintext.size(), aad.data(),
          aad.size(), nullptr, blob.data() + nonce_offset, data_key.data()) != 0 ||
      written != plaintext.size() + kEnvelopeTagSize) {
    return absl::InternalError("key store envelope: encryption failed");
  }
  return blob;
}

absl::StatusOr<SecretBytes> OpenEnvelope(const KekRing& ring, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob) {
  if (absl::Status s = CheckMagic(blob); !s.ok()) return s;
  const uint8_t version = blob[kVersionOffset];
  if (version == kEnvelopeFormatVersion) {
    if (blob.size() < kEnvelopeHeaderSize + kEnvelopeTagSize) {
      return OpenV1(SecretBytes(kKekSize), kind, context, blob);  // reports the size
    }
    const std::string name = absl::StrCat("raw:", Hex(blob.subspan(kKekIdOffset, 8)));
    absl::StatusOr<std::shared_ptr<const Kek>> kek = ring.Find(name);
    if (!kek.ok()) {
      return absl::Status(kek.status().code(),
                          absl::StrCat("key store envelope: ", kek.status().message()));
    }
    const auto* raw = dynamic_cast<const RawKek*>(kek->get());
    if (raw == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key store envelope: format 1 needs the raw 32-byte KEK ", name));
    }
    return OpenV1(raw->key(), kind, context, blob);
  }
  if (version != kEnvelopeFormatKekNamed) return UnsupportedVersion(version);
  OFFLOAD_ASSIGN_OR_RETURN(V2Header h, ParseV2(blob));
  if (blob[kKindOffset] != static_cast<uint8_t>(kind)) {
    return V2Error(absl::StrCat("unexpected kind ", blob[kKindOffset], " (expected kind ",
                                static_cast<int>(kind), ")"));
  }
  absl::StatusOr<std::shared_ptr<const Kek>> kek = ring.Find(h.kek_name);
  if (!kek.ok()) {
    return absl::Status(kek.status().code(),
                        absl::StrCat("key store envelope: ", kek.status().message()));
  }
  absl::StatusOr<SecretBytes> data_key =
      (*kek)->Unwrap(blob.subspan(h.wrapped_offset, h.wrapped_size),
                     WrapAad(blob.first(h.wrapped_offset), context));
  if (!data_key.ok()) {
    return absl::Status(data_key.status().code(),
                        absl::StrCat("key store envelope: ", data_key.status().message()));
  }
  if (data_key->size() != kDataKeySize) {
    return V2Error(absl::StrCat("unwrapped data key of ", data_key->size(), " bytes"));
  }
  const std::vector<uint8_t> aad = AssociatedData(blob.first(h.payload_offset), context);
  const size_t ciphertext_size = blob.size() - h.payload_offset;
  SecretBytes plaintext(ciphertext_size - kEnvelopeTagSize);
  unsigned long long written = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(
          plaintext.data(), &written, nullptr, blob.data() + h.payload_offset, ciphertext_size,
          aad.data(), aad.size(), blob.data() + h.nonce_offset, data_key->data()) != 0) {
    sodium_memzero(plaintext.data(), plaintext.size());
    return V2Error("authentication failed (the data is corrupted or was modified)");
  }
  return plaintext;
}

absl::StatusOr<SecretBytes> OpenEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob) {
  if (absl::Status s = CheckKek(kek); !s.ok()) return s;
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<KekRing> ring,
                           KekRing::FromRawKey(SecretBytes(kek.begin(), kek.end())));
  return OpenEnvelope(*ring, kind, context, blob);
}

}  // namespace offload::keys
