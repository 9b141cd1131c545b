// The encoding checks of the service's Ed25519 verification policy (libsodium 1.0.18's
// crypto_sign_verify_detached), so the OpenSSL backend can apply them before EVP verify.
// They look at encodings only; no curve arithmetic.
//
//   if (!internal::PassesEd25519EncodingPolicy(public_key, signature)) return false;
//
// Internal to service/crypto. All functions are pure and thread-safe.
#ifndef SERVICE_CRYPTO_INTERNAL_ED25519_POLICY_H_
#define SERVICE_CRYPTO_INTERNAL_ED25519_POLICY_H_

#include <array>
#include <cstdint>

#include "absl/types/span.h"

namespace offload::crypto::internal {

// Encodings (sign bit clear) whose y-coordinate, ignoring the sign bit, belongs to a point of
// order 1, 2, 4 or 8, including the non-canonical y = p and y = p + 1. Same list and order as
// libsodium 1.0.18's ge25519_has_small_order.
inline constexpr size_t kEd25519SmallOrderCount = 7;
extern const std::array<std::array<uint8_t, 32>, kEd25519SmallOrderCount> kEd25519SmallOrderBlocklist;

// True iff `s` (32 bytes) matches a blocklist entry, ignoring bit 255 (the sign of x), as
// ge25519_has_small_order does. Constant time.
bool Ed25519HasSmallOrder(absl::Span<const uint8_t> s);

// True iff the y-coordinate of `s` (32 bytes, bit 255 ignored) is < p = 2^255 - 19
// (ge25519_is_canonical).
bool Ed25519IsCanonicalPoint(absl::Span<const uint8_t> s);

// True iff the 32-byte little-endian scalar `s` is < L = 2^252 + 27742317777372353535851937790883648493
// (sc25519_is_canonical).
bool Ed25519IsCanonicalScalar(absl::Span<const uint8_t> s);

// Checks 2-4 of the policy: S < L, A canonical and not small order, R not small order.
// REQUIRES: `public_key.size() == 32`, `signature.size() == 64`.
bool PassesEd25519EncodingPolicy(absl::Span<const uint8_t> public_key,
                                 absl::Span<const uint8_t> signature);

}  // namespace offload::crypto::internal

#endif  // SERVICE_CRYPTO_INTERNAL_ED25519_POLICY_H_
