// OpenSSL's own Ed25519 verification without the service's policy checks. For the OpenSSL
// backend of Ed25519Verify and for tests that show why the policy checks are needed.
// Internal to service/crypto. Thread-safe.
#ifndef SERVICE_CRYPTO_INTERNAL_ED25519_RAW_H_
#define SERVICE_CRYPTO_INTERNAL_ED25519_RAW_H_

#include <cstdint>

#include "absl/types/span.h"

namespace offload::crypto::internal {

// EVP_DigestVerify with an EVP_PKEY_ED25519 built from `public_key`. False on wrong sizes.
bool OpenSslEd25519VerifyRaw(absl::Span<const uint8_t> public_key,
                             absl::Span<const uint8_t> message,
                             absl::Span<const uint8_t> signature);

}  // namespace offload::crypto::internal

#endif  // SERVICE_CRYPTO_INTERNAL_ED25519_RAW_H_
