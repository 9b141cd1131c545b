// Byte buffers for secrets: private keys, shared keys, cached plaintexts.
//
// `SecretBytes` is a std::vector whose allocator wipes the memory with sodium_memzero before it is
// freed (also when the vector grows and moves its contents). Compare secrets with
// `SecretEquals`, which runs in constant time for equal lengths.
//
//   SecretBytes seed(32);
//   randombytes_buf(seed.data(), seed.size());
//
// Thread-safety: like std::vector.
#ifndef SERVICE_COMMON_SECRET_BYTES_H_
#define SERVICE_COMMON_SECRET_BYTES_H_

#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"

namespace offload {

template <typename T>
struct WipingAllocator {
  using value_type = T;
  WipingAllocator() noexcept = default;
  template <typename U>
  WipingAllocator(const WipingAllocator<U>&) noexcept {}  // NOLINT(runtime/explicit)

  T* allocate(std::size_t n) { return std::allocator<T>().allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept {
    sodium_memzero(p, n * sizeof(T));
    std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const WipingAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const WipingAllocator<U>&) const noexcept { return false; }
};

using SecretBytes = std::vector<uint8_t, WipingAllocator<uint8_t>>;

inline SecretBytes MakeSecret(absl::Span<const uint8_t> bytes) {
  return SecretBytes(bytes.begin(), bytes.end());
}

// Constant-time equality for equal lengths; different lengths compare unequal at once.
inline bool SecretEquals(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b) {
  return a.size() == b.size() && (a.empty() || sodium_memcmp(a.data(), b.data(), a.size()) == 0);
}

}  // namespace offload

#endif  // SERVICE_COMMON_SECRET_BYTES_H_
