// Encryption at rest of serialised key records under the key-encryption key (KEK), shared by every
// KeyStore backend: XChaCha20-Poly1305 (libsodium) with a random 24-byte nonce per seal.
//
//   OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob,
//                            SealEnvelope(kek, EnvelopeKind::kKeyRecord, key_id_bytes, plain));
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes back,
//                            OpenEnvelope(kek, EnvelopeKind::kKeyRecord, key_id_bytes, blob));
//
// Layout (all offsets fixed, 40-byte header, then ciphertext || 16-byte tag):
//   0  magic "OFKS"      4  format version (1)   5  kind   6  two zero bytes
//   8  KEK id: first 8 bytes of BLAKE2b-128 keyed by the KEK over "offload.kek-id.v1"
//   16 nonce (24 bytes)  40 ciphertext || tag
// The AEAD's associated data is the whole header followed by `context` (e.g. the key id of a
// database row, so rows cannot be swapped); the KEK id lets a wrong KEK be reported as such
// instead of as corruption. Thread-safety: stateless.
#ifndef SERVICE_KEYS_ENVELOPE_H_
#define SERVICE_KEYS_ENVELOPE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"

namespace offload::keys {

inline constexpr size_t kKekSize = 32;
inline constexpr size_t kEnvelopeHeaderSize = 40;
inline constexpr size_t kEnvelopeTagSize = 16;
inline constexpr uint8_t kEnvelopeFormatVersion = 1;

enum class EnvelopeKind : uint8_t {
  kKeyStoreContents = 1,  // a whole file store (offload.store.v1.KeyStoreContents)
  kKeyRecord = 2,         // one record (offload.store.v1.KeyRecord), e.g. one database row
};

// A public 8-byte fingerprint of `kek`, for error messages and logs ("kek id 1a2b...").
// REQUIRES: `kek` is 32 bytes.
std::array<uint8_t, 8> KekId(absl::Span<const uint8_t> kek);
std::string KekIdHex(absl::Span<const uint8_t> kek);

// Encrypts `plaintext`. InvalidArgument if `kek` is not 32 bytes.
absl::StatusOr<std::vector<uint8_t>> SealEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                                  absl::Span<const uint8_t> context,
                                                  absl::Span<const uint8_t> plaintext);

// Verifies and decrypts. DataLoss for a truncated, corrupted or foreign blob; FailedPrecondition
// for a blob sealed under another KEK or in a format version this build does not read. Never
// crashes on any input; the header is parsed by offsets after one length check.
absl::StatusOr<SecretBytes> OpenEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob);

}  // namespace offload::keys

#endif  // SERVICE_KEYS_ENVELOPE_H_
