// Byte buffers for secrets: private keys, shared keys, cached plaintexts.
//
// `SecretBytes` is a std::vector whose allocator wipes the memory with sodium_memzero before it is
// freed (also when the vector grows and moves its contents). Compare secrets with
// `SecretEquals`, which runs in constant time for equal lengths. Plain std::strings that may hold
// a secret (a request or answer body): `WipeString` zeroes one in place, `AppendWiping` appends
// without leaving a copy in a buffer that growth frees, `WipingDelete` frees a shared one.
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
#include <algorithm>
#include <memory>
#include <string>
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

// Zeroes every byte `s` holds (its size stays).
inline void WipeString(std::string* s) {
  if (!s->empty()) sodium_memzero(s->data(), s->size());
}

// Appends `size` bytes at `data` to `*s`; when that needs a larger buffer, the old one is zeroed
// before it is freed.
inline void AppendWiping(std::string* s, const char* data, std::size_t size) {
  if (s->size() + size > s->capacity()) {
    std::string bigger;
    bigger.reserve(std::max(s->size() + size, 2 * s->capacity()));
    bigger.append(*s);
    WipeString(s);
    s->swap(bigger);
  }
  s->append(data, size);
}

// A shared_ptr deleter that zeroes the string before freeing it.
struct WipingDelete {
  void operator()(const std::string* s) const {
    WipeString(const_cast<std::string*>(s));
    delete s;
  }
};

}  // namespace offload

#endif  // SERVICE_COMMON_SECRET_BYTES_H_
