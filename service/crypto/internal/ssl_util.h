// OpenSSL ownership helpers: every OpenSSL object the crypto library creates is held by a
// `SslUniquePtr<T>` whose deleter is the matching `*_free` function (as Tink's ssl_unique_ptr.h).
//
//   SslUniquePtr<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
//   if (ctx == nullptr) return OpenSslError("EVP_MD_CTX_new");
//
// Internal to service/crypto; not for other components.
#ifndef SERVICE_CRYPTO_INTERNAL_SSL_UTIL_H_
#define SERVICE_CRYPTO_INTERNAL_SSL_UTIL_H_

#include <openssl/evp.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace offload::crypto::internal {

template <typename T>
struct SslDeleter;

template <>
struct SslDeleter<EVP_PKEY> {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
template <>
struct SslDeleter<EVP_PKEY_CTX> {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
template <>
struct SslDeleter<EVP_MD_CTX> {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
template <>
struct SslDeleter<EVP_CIPHER_CTX> {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
template <>
struct SslDeleter<EVP_CIPHER> {
  void operator()(EVP_CIPHER* p) const { EVP_CIPHER_free(p); }
};

template <typename T>
using SslUniquePtr = std::unique_ptr<T, SslDeleter<T>>;

// Internal("<what> failed: <first OpenSSL error>") and clears this thread's OpenSSL error queue.
// Never include secrets in `what`.
absl::Status OpenSslError(absl::string_view what);

// Clears this thread's OpenSSL error queue (after an expected failure, e.g. a bad signature).
void ClearOpenSslErrors();

// `s.data()`, or a pointer to a static byte when `s` is empty: some OpenSSL paths dislike NULL
// even with length 0.
inline const uint8_t* NonNull(absl::Span<const uint8_t> s) {
  static const uint8_t kEmpty = 0;
  return s.empty() ? &kEmpty : s.data();
}

// True iff `n` fits OpenSSL's `int` length parameters.
inline bool FitsInt(size_t n) { return n <= static_cast<size_t>(INT_MAX); }

}  // namespace offload::crypto::internal

#endif  // SERVICE_CRYPTO_INTERNAL_SSL_UTIL_H_
