// AEAD ciphers over libsodium or OpenSSL 3: ChaCha20-Poly1305 (RFC 8439), XChaCha20-Poly1305 and
// AES-256-GCM, all with 32-byte keys and 16-byte tags.
//
//   auto aead = Aead::Create(Backend::kOpenSsl, AeadAlgorithm::kXChaCha20Poly1305, key32);
//   std::vector<uint8_t> out(pt.size() + kAeadTagSize);
//   OFFLOAD_RETURN_IF_ERROR((*aead)->Seal(nonce, aad, pt, absl::MakeSpan(out)));
//
// XChaCha20-Poly1305 on OpenSSL runs libsodium's HChaCha20 to derive the subkey, then OpenSSL's
// ChaCha20-Poly1305. Thread-safety: an Aead object is immutable and may be used from many threads.
#ifndef SERVICE_CRYPTO_AEAD_H_
#define SERVICE_CRYPTO_AEAD_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "service/crypto/backend.h"

namespace offload::crypto {

enum class AeadAlgorithm { kChaCha20Poly1305, kXChaCha20Poly1305, kAes256Gcm };

inline constexpr size_t kAeadKeySize = 32;
inline constexpr size_t kAeadTagSize = 16;

// 12 for ChaCha20-Poly1305 and AES-256-GCM, 24 for XChaCha20-Poly1305.
size_t AeadNonceSize(AeadAlgorithm algorithm);
absl::string_view AeadName(AeadAlgorithm algorithm);

class Aead {
 public:
  virtual ~Aead() = default;

  // REQUIRES: `key` is 32 bytes (else InvalidArgument). Copied into wiping memory.
  // Unimplemented if the backend cannot run `algorithm` on this CPU (libsodium AES-GCM without
  // AES-NI).
  static absl::StatusOr<std::unique_ptr<Aead>> Create(Backend backend, AeadAlgorithm algorithm,
                                                      absl::Span<const uint8_t> key);

  // Writes ciphertext || tag to `out`.
  // REQUIRES: `nonce.size() == AeadNonceSize()`, `out.size() == plaintext.size() + 16`.
  virtual absl::Status Seal(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                            absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out) const = 0;

  // Verifies and decrypts ciphertext || tag into `out`. InvalidArgument("authentication failed")
  // when the tag does not verify; `out` is then wiped.
  // REQUIRES: `nonce.size() == AeadNonceSize()`, `ciphertext_and_tag.size() >= 16`,
  // `out.size() == ciphertext_and_tag.size() - 16`.
  virtual absl::Status Open(absl::Span<const uint8_t> nonce, absl::Span<const uint8_t> aad,
                            absl::Span<const uint8_t> ciphertext_and_tag,
                            absl::Span<uint8_t> out) const = 0;

  virtual AeadAlgorithm algorithm() const = 0;
};

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_AEAD_H_
