// Encryption at rest of serialised key records under the key-encryption key (KEK), shared by every
// KeyStore backend: XChaCha20-Poly1305 (libsodium) with a random 24-byte nonce per seal.
//
// Format 2 (what the stores write): the plaintext is sealed under a fresh random 32-byte data key,
// and the data key is wrapped by a Kek (kek.h: a raw 32-byte KEK, or a key inside a PKCS#11
// token), whose name the envelope carries:
//
//   OFFLOAD_ASSIGN_OR_RETURN(auto blob, SealEnvelope(*ring->Current(), kind, context, plain));
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes back, OpenEnvelope(*ring, kind, context, blob));
//
//   0  magic "OFKS"   4  format version (2)   5  kind   6  KEK name size n (1..128)
//   7  wrapped data key size w (1..255)   8  KEK name (n bytes)   8+n  wrapped data key (w bytes)
//   8+n+w  nonce (24 bytes)   then ciphertext || 16-byte tag
// The data key is wrapped with associated data "offload.envelope.v2" || bytes 0..8+n || context;
// the payload's associated data is every byte before the ciphertext || context. OpenEnvelope
// reads formats 1 and 2; a blob under a KEK the ring does not hold is FailedPrecondition naming it.
//
// Format 1 (still read; the span functions below write it):
//   OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> blob,
//                            SealEnvelope(kek, EnvelopeKind::kKeyRecord, key_id_bytes, plain));
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes back,
//                            OpenEnvelope(kek, EnvelopeKind::kKeyRecord, key_id_bytes, blob));
//
// layout (all offsets fixed, 40-byte header, then ciphertext || 16-byte tag):
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
#include "service/keys/kek.h"

namespace offload::keys {

inline constexpr size_t kKekSize = 32;
inline constexpr size_t kEnvelopeHeaderSize = 40;
inline constexpr size_t kEnvelopeTagSize = 16;
inline constexpr uint8_t kEnvelopeFormatVersion = 1;
inline constexpr uint8_t kEnvelopeFormatKekNamed = 2;

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

// Verifies and decrypts a format 1 envelope, or a format 2 one wrapped under the raw KEK `kek`.
// DataLoss for a truncated, corrupted or foreign blob; FailedPrecondition
// for a blob sealed under another KEK or in a format version this build does not read. Never
// crashes on any input; the header is parsed by offsets after one length check.
absl::StatusOr<SecretBytes> OpenEnvelope(absl::Span<const uint8_t> kek, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob);

// Format 2: seals `plaintext` under a fresh data key wrapped by `kek`. Errors come from `kek`
// (e.g. Unavailable when a token cannot be reached).
absl::StatusOr<std::vector<uint8_t>> SealEnvelope(const Kek& kek, EnvelopeKind kind,
                                                  absl::Span<const uint8_t> context,
                                                  absl::Span<const uint8_t> plaintext);

// Opens a format 1 or 2 envelope with whichever KEK of `ring` it names. DataLoss for a truncated,
// corrupted or foreign blob; FailedPrecondition for a KEK the ring does not hold (the message
// names it) or an unknown format version.
absl::StatusOr<SecretBytes> OpenEnvelope(const KekRing& ring, EnvelopeKind kind,
                                         absl::Span<const uint8_t> context,
                                         absl::Span<const uint8_t> blob);

// The name of the KEK `blob` is wrapped under ("raw:<kek id>" for format 1). DataLoss if the
// header is malformed.
absl::StatusOr<std::string> EnvelopeKekName(absl::Span<const uint8_t> blob);

}  // namespace offload::keys

#endif  // SERVICE_KEYS_ENVELOPE_H_
