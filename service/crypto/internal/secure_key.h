// Builds OpenSSL private keys (X25519, Ed25519) so that their secret half lands in OpenSSL's
// secure heap when it is set up (secure_heap.h). OpenSSL 3.0's EVP_PKEY_new_raw_private_key
// copies the key into ordinary heap memory; its PKCS#8 decoder allocates the ECX private key with
// OPENSSL_secure_zalloc. So the raw key is wrapped in its fixed 48-byte PKCS#8 encoding (on the
// stack, wiped after) and decoded. Costs ~55 us more per key than the raw import (key load only).
#ifndef SERVICE_CRYPTO_INTERNAL_SECURE_KEY_H_
#define SERVICE_CRYPTO_INTERNAL_SECURE_KEY_H_

#include <openssl/evp.h>

#include <cstdint>

#include "absl/types/span.h"
#include "service/crypto/internal/ssl_util.h"

namespace offload::crypto::internal {

// `type`: EVP_PKEY_X25519 or EVP_PKEY_ED25519. REQUIRES: `secret.size() == 32`. nullptr on
// failure (OpenSSL's error queue says why; a full secure heap is one cause).
SslUniquePtr<EVP_PKEY> NewPrivateKey(int type, absl::Span<const uint8_t> secret);

}  // namespace offload::crypto::internal

#endif  // SERVICE_CRYPTO_INTERNAL_SECURE_KEY_H_
