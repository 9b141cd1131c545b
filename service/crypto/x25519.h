// X25519 key agreement (RFC 7748) over libsodium or OpenSSL 3, and the NaCl box key derived from it.
//
//   auto key = X25519PrivateKey::FromBytes(Backend::kOpenSsl, secret32);   // built once per key
//   SecretBytes shared(32);
//   absl::Status s = (*key)->Derive(peer_public, /*allow_zero=*/false, absl::MakeSpan(shared));
//
// Thread-safety: a key object is immutable and may be used from many threads at once.
#ifndef SERVICE_CRYPTO_X25519_H_
#define SERVICE_CRYPTO_X25519_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/crypto/backend.h"

namespace offload::crypto {

inline constexpr size_t kX25519KeySize = 32;

class X25519PrivateKey {
 public:
  virtual ~X25519PrivateKey() = default;

  // REQUIRES: `secret` is 32 bytes (else InvalidArgument). Copied into wiping memory.
  static absl::StatusOr<std::unique_ptr<X25519PrivateKey>> FromBytes(Backend backend,
                                                                     absl::Span<const uint8_t> secret);

  // Writes X25519(secret, `peer_public_key`) into `shared` (32 bytes). The top bit of the peer's
  // u-coordinate is ignored. If the result is all zeros (a small-order peer key) returns
  // InvalidArgument("small-order peer public key") unless `allow_zero`, then writes the zeros.
  // REQUIRES: `peer_public_key.size() == 32`, `shared.size() == 32`.
  virtual absl::Status Derive(absl::Span<const uint8_t> peer_public_key, bool allow_zero,
                              absl::Span<uint8_t> shared) const = 0;

  virtual const std::array<uint8_t, 32>& public_key() const = 0;
};

// The public key of a 32-byte X25519 secret (crypto_scalarmult_base).
absl::StatusOr<std::array<uint8_t, 32>> X25519PublicKey(absl::Span<const uint8_t> secret);

// crypto_box_beforenm from a raw X25519 shared secret: HSalsa20(raw, zero nonce).
// REQUIRES: both spans 32 bytes.
void BoxKeyFromShared(absl::Span<const uint8_t> raw_shared, absl::Span<uint8_t> box_key);

inline constexpr size_t kBoxNonceSize = 24;
inline constexpr size_t kBoxTagSize = 16;

// crypto_box_easy_afternm: writes tag || ciphertext (plaintext.size() + 16 bytes) to `out`.
// REQUIRES: `box_key` 32 bytes, `nonce` 24 bytes, `out.size() == plaintext.size() + 16`.
absl::Status BoxSealAfternm(absl::Span<const uint8_t> box_key, absl::Span<const uint8_t> nonce,
                            absl::Span<const uint8_t> plaintext, absl::Span<uint8_t> out);

// crypto_box_open_easy_afternm. InvalidArgument("authentication failed") when the tag is wrong.
// REQUIRES: `ciphertext.size() >= 16`, `out.size() == ciphertext.size() - 16`.
absl::Status BoxOpenAfternm(absl::Span<const uint8_t> box_key, absl::Span<const uint8_t> nonce,
                            absl::Span<const uint8_t> ciphertext, absl::Span<uint8_t> out);

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_X25519_H_
