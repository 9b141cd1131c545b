// Ed25519 signing and verification (RFC 8032) over libsodium or OpenSSL 3.
//
//   auto signer = Ed25519Signer::FromSeed(Backend::kOpenSsl, seed);   // key object built once
//   std::array<uint8_t, 64> sig;
//   OFFLOAD_RETURN_IF_ERROR((*signer)->Sign(message, sig));
//   bool ok = Ed25519Verify(Backend::kLibsodium, (*signer)->public_key(), message, sig);
//
// Verification follows one policy on both backends (see proto/offload/v1/ed25519.proto): S < L,
// canonical non-small-order A, non-small-order R, cofactorless equation. Thread-safety: a signer
// is immutable and may be used from many threads at once.
#ifndef SERVICE_CRYPTO_ED25519_H_
#define SERVICE_CRYPTO_ED25519_H_

#include <array>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/crypto/backend.h"

namespace offload::crypto {

inline constexpr size_t kEd25519SeedSize = 32;
inline constexpr size_t kEd25519PublicKeySize = 32;
inline constexpr size_t kEd25519SignatureSize = 64;
inline constexpr size_t kEd25519NaclSecretKeySize = 64;  // seed || public key

class Ed25519Signer {
 public:
  virtual ~Ed25519Signer() = default;

  // REQUIRES: `seed` is 32 bytes (else InvalidArgument). The seed is copied into wiping memory.
  static absl::StatusOr<std::unique_ptr<Ed25519Signer>> FromSeed(Backend backend,
                                                                 absl::Span<const uint8_t> seed);

  // Writes the 64-byte signature of `message` into `signature`.
  // REQUIRES: `signature.size() == 64`.
  virtual absl::Status Sign(absl::Span<const uint8_t> message, absl::Span<uint8_t> signature) const = 0;

  virtual const std::array<uint8_t, 32>& public_key() const = 0;
};

// The public key for a 32-byte `seed` (libsodium's crypto_sign_seed_keypair).
absl::StatusOr<std::array<uint8_t, 32>> Ed25519PublicKeyFromSeed(absl::Span<const uint8_t> seed);

// True iff `signature` is valid for `message` under `public_key` by the service's policy.
// Wrong sizes return false; callers check sizes first to report them as caller errors.
bool Ed25519Verify(Backend backend, absl::Span<const uint8_t> public_key,
                   absl::Span<const uint8_t> message, absl::Span<const uint8_t> signature);

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_ED25519_H_
