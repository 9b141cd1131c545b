// Locked memory for key material, set up once at start: one bound (`--locked_memory_bytes`)
// shared by our locked region (service/common/secure_memory.h: libsodium-backend keys, AEAD keys
// and key schedules) and OpenSSL's secure heap (CRYPTO_secure_malloc_init: OpenSSL keeps the
// private half of X25519 and Ed25519 EVP_PKEYs there, built by internal/secure_key.h), checked
// against RLIMIT_MEMLOCK (the soft limit is raised up to the hard one if the bound needs it).
//
//   OFFLOAD_ASSIGN_OR_RETURN(LockedMemoryReport r, SetUpLockedMemory(4 << 20));
//   Log(..., {{"budget", r.budget_bytes}, ...});
//
// When the bound is reached, key material still loads: our region hands out DONTDUMP but
// unlocked pages (secure::GetStats().fallback_bytes), and a key that does not fit OpenSSL's
// secure heap (OpenSSL would refuse it) is built on libsodium instead, whose object lives in our
// region (SecureHeapFallbacks()). Both backends give the same answers (cross-checked by tests).
//
// Thread-safety: SetUpLockedMemory once, before any key is created; the rest is thread-safe.
#ifndef SERVICE_CRYPTO_SECURE_HEAP_H_
#define SERVICE_CRYPTO_SECURE_HEAP_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace offload::crypto {

struct LockedMemoryReport {
  size_t requested_bytes = 0;
  int64_t memlock_soft_before = 0;  // RLIMIT_MEMLOCK; -1 = unlimited
  int64_t memlock_soft = 0;         // after raising it (up to the hard limit)
  int64_t memlock_hard = 0;
  size_t budget_bytes = 0;          // min(requested, soft limit): what we lock at most
  size_t openssl_heap_bytes = 0;    // OpenSSL's secure heap (0: not set up, too small a budget)
  bool openssl_heap_locked = false; // false: set up (DONTDUMP) but mlock refused
  size_t region_budget_bytes = 0;   // the rest, for secure_memory.h's locked region
};

// REQUIRES: called once, before keys are created. 0 = lock nothing (OpenSSL keys then stay on
// OpenSSL's ordinary heap). Errors only if OpenSSL's secure heap cannot be set up at all.
absl::StatusOr<LockedMemoryReport> SetUpLockedMemory(size_t budget_bytes);

// Keys built on libsodium because OpenSSL's secure heap was full, since start.
uint64_t SecureHeapFallbacks();
// Bytes of OpenSSL's secure heap in use (0 if it was not set up).
size_t SecureHeapUsedBytes();

namespace internal {
// For a failed EVP_PKEY_new_raw_private_key: true (counted, OpenSSL's error queue cleared) if
// OpenSSL's secure heap is set up - the likely cause is that it is full, and the caller builds
// the key on libsodium instead; false otherwise.
bool SecureHeapFallback();
}  // namespace internal

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_SECURE_HEAP_H_
