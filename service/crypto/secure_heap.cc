#include "service/crypto/secure_heap.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <sodium.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "service/common/secure_memory.h"
#include "service/crypto/internal/secure_key.h"
#include "service/crypto/internal/ssl_util.h"

namespace offload::crypto {
namespace {

std::atomic<uint64_t> secure_heap_fallbacks{0};
std::atomic<size_t> secure_heap_size{0};  // set by SetUpLockedMemory; 0: none of ours

int64_t AsInt(rlim_t v) { return v == RLIM_INFINITY ? -1 : static_cast<int64_t>(v); }

size_t FloorPowerOfTwo(size_t n) {
  size_t p = 1;
  while (p <= n / 2) p <<= 1;
  return p;
}

// OpenSSL's secure heap: a quarter of the budget, a power of two, 256 KiB to 1 MiB. None under a
// 1 MiB budget: the heap is process-wide and TLS takes its handshakes' ephemeral keys from it
// (OpenSSL 3 allocates X25519 key shares there and never falls back to the ordinary heap), so a
// small heap filled by managed keys would fail handshakes. Managed keys take at most half of it
// (kManagedKeysShare); past that they are built on libsodium, in our own locked region.
constexpr size_t kMinBudgetForOpenSslHeap = 1 << 20;
constexpr size_t kMaxOpenSslHeap = 1 << 20;
constexpr size_t kOpenSslHeapMinAllocation = 32;

}  // namespace

absl::StatusOr<LockedMemoryReport> SetUpLockedMemory(size_t budget_bytes) {
  LockedMemoryReport r;
  r.requested_bytes = budget_bytes;
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  r.memlock_soft_before = AsInt(lim.rlim_cur);
  if (budget_bytes > 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < budget_bytes) {
    const rlim_t want = lim.rlim_max == RLIM_INFINITY
                            ? budget_bytes
                            : std::min<rlim_t>(budget_bytes, lim.rlim_max);
    if (want > lim.rlim_cur) {
      rlimit raised = lim;
      raised.rlim_cur = want;
      if (setrlimit(RLIMIT_MEMLOCK, &raised) == 0) lim = raised;
    }
  }
  r.memlock_soft = AsInt(lim.rlim_cur);
  r.memlock_hard = AsInt(lim.rlim_max);
  r.budget_bytes = lim.rlim_cur == RLIM_INFINITY
                       ? budget_bytes
                       : std::min<size_t>(budget_bytes, static_cast<size_t>(lim.rlim_cur));
  size_t region = r.budget_bytes;
  if (r.budget_bytes >= kMinBudgetForOpenSslHeap && CRYPTO_secure_malloc_initialized() == 0) {
    const size_t heap = std::min(kMaxOpenSslHeap, FloorPowerOfTwo(r.budget_bytes / 4));
    const int rc = CRYPTO_secure_malloc_init(heap, kOpenSslHeapMinAllocation);
    if (rc == 0) {
      return internal::OpenSslError("CRYPTO_secure_malloc_init");
    }
    r.openssl_heap_bytes = heap;
    secure_heap_size.store(heap, std::memory_order_relaxed);
    r.openssl_heap_locked = rc == 1;
    if (r.openssl_heap_locked) region -= heap;
  }
  r.region_budget_bytes = region;
  secure::SetLockedBudget(region);
  return r;
}

uint64_t SecureHeapFallbacks() { return secure_heap_fallbacks.load(std::memory_order_relaxed); }

size_t SecureHeapUsedBytes() {
  return CRYPTO_secure_malloc_initialized() != 0 ? CRYPTO_secure_used() : 0;
}

namespace internal {

SslUniquePtr<EVP_PKEY> NewPrivateKey(int type, absl::Span<const uint8_t> secret) {
  if (CRYPTO_secure_malloc_initialized() == 0 || secret.size() != 32 ||
      (type != EVP_PKEY_X25519 && type != EVP_PKEY_ED25519)) {
    return SslUniquePtr<EVP_PKEY>(
        EVP_PKEY_new_raw_private_key(type, nullptr, secret.data(), secret.size()));
  }
  // Half of the heap stays for TLS (see kMinBudgetForOpenSslHeap): past it, the caller's
  // fallback builds the key on libsodium.
  const size_t heap = secure_heap_size.load(std::memory_order_relaxed);
  if (heap == 0 || CRYPTO_secure_used() + 64 > heap / 2) return nullptr;
  // PrivateKeyInfo { version 0, AlgorithmIdentifier { OID 1.3.101.110 (X25519) or 1.3.101.112
  // (Ed25519) }, privateKey OCTET STRING { OCTET STRING (32 bytes) } } (RFC 8410).
  uint8_t der[48] = {0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65,
                     static_cast<uint8_t>(type == EVP_PKEY_X25519 ? 0x6e : 0x70),
                     0x04, 0x22, 0x04, 0x20};
  std::copy(secret.begin(), secret.end(), der + 16);
  const unsigned char* p = der;
  SslUniquePtr<EVP_PKEY> key(d2i_PrivateKey_ex(type, nullptr, &p, sizeof(der), nullptr, nullptr));
  sodium_memzero(der, sizeof(der));
  return key;
}

bool SecureHeapFallback() {
  if (CRYPTO_secure_malloc_initialized() == 0) return false;
  ClearOpenSslErrors();
  secure_heap_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return true;
}
}  // namespace internal

}  // namespace offload::crypto
