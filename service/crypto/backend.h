// The two crypto libraries the service can run each primitive on, and the per-operation choice.
//
//   BackendChoice choice = BackendChoice::Measure();   // times each primitive on both, picks faster
//   LOG(INFO) << choice.ToString();                     // "ed25519_sign=libsodium ..."
//
// Both backends implement every shared primitive with one behaviour (the tests cross-check them);
// the choice is about speed only. Thread-safety: immutable after construction.
#ifndef SERVICE_CRYPTO_BACKEND_H_
#define SERVICE_CRYPTO_BACKEND_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offload::crypto {

enum class Backend { kLibsodium, kOpenSsl };

absl::string_view BackendName(Backend backend);
absl::StatusOr<Backend> ParseBackend(absl::string_view name);  // "libsodium" | "openssl"

// Initialises libsodium (sodium_init). Call once before any other function of this library;
// safe to call again.
absl::Status InitCrypto();

// Which backend runs each operation.
struct BackendChoice {
  Backend ed25519_sign = Backend::kLibsodium;
  Backend ed25519_verify = Backend::kLibsodium;
  Backend x25519 = Backend::kOpenSsl;
  Backend chacha20_poly1305 = Backend::kOpenSsl;
  Backend xchacha20_poly1305 = Backend::kOpenSsl;
  Backend aes256_gcm = Backend::kOpenSsl;

  // Times each operation on both backends (a few milliseconds in all) and keeps the faster.
  static BackendChoice Measure();
  // All operations on one backend; for tests.
  static BackendChoice All(Backend backend);
  // One line, e.g. "ed25519_sign=libsodium ed25519_verify=libsodium x25519=openssl ...".
  std::string ToString() const;
};

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_BACKEND_H_
