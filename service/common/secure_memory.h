// Memory for secrets that must stay out of swap and core dumps (issue 26).
//
// Two process-wide regions, both made of mmap'd pages marked MADV_DONTDUMP (a core dump skips
// them, whatever the dumpable setting) and wiped on free:
//
//   kLocked  key material (private keys, AEAD keys and key schedules). Pages are also mlock'ed
//            (never swapped) while the locked-memory budget (SetLockedBudget) and the process's
//            RLIMIT_MEMLOCK allow. Past either, new pages are DONTDUMP but unlocked: counted in
//            Stats().fallback_bytes, and the hook of SetFallbackHook runs once (the server logs
//            a warning). Never an allocation failure.
//   kNoDump  memo payloads (cached plaintexts, shared keys): DONTDUMP, never locked (they can be
//            hundreds of MiB; their bound is the memo's).
//
// Small sizes come from slabs (one mmap per 8 KiB locked / 256 KiB no-dump slab, one size class
// per slab, a free list per slab, one mutex per class), so an allocation is a lock and a pop,
// never a system call; an empty slab is unmapped unless it is its class's last. Larger sizes get
// pages of their own, no header (MAP_POPULATE: the pages are faulted in by one call). No
// allocation takes a page or more beyond its bytes: size classes step by at most 4 KiB, and a
// large allocation is its bytes rounded up to pages. Freed large no-dump mappings (up to 32 MiB)
// are kept, wiped, for the next allocation of as many pages or fewer (the unused tail pages of
// a larger one are unmapped then).
//
//   void* p = secure::Allocate(secure::Region::kNoDump, n);
//   ...
//   secure::Free(secure::Region::kNoDump, p, n);   // wipes n bytes, then frees
//
//   KeyBytes seed(32);                              // a std::vector in locked memory
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_COMMON_SECURE_MEMORY_H_
#define SERVICE_COMMON_SECURE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace offload::secure {

enum class Region { kLocked, kNoDump };

// `size` bytes (0 allowed: a unique non-null pointer of a 16-byte slot), 16-byte aligned. Fresh
// memory reads as zeros; reused memory was wiped. Throws std::bad_alloc if mmap fails (as
// operator new would).
void* Allocate(Region region, size_t size);
// Wipes `size` bytes at `p` and returns them. REQUIRES: `p` came from Allocate(region, size)
// with the same `region` and `size`. `p == nullptr` is a no-op.
void Free(Region region, void* p, size_t size) noexcept;
// Bytes Allocate(region, size) really takes while in use: its size class, or its pages (less
// than a page beyond `size`, whether the pages are fresh or reused). For byte bounds.
size_t AllocationSize(Region region, size_t size);

// The most bytes of kLocked pages to mlock (the rest fall back, see above). Called at start-up
// (before keys load); 0 turns locking off. Default: 0 (a process that never calls it, e.g. a
// unit test, locks nothing). Does not unlock pages locked already.
void SetLockedBudget(size_t bytes);

struct Stats {
  size_t locked_budget_bytes = 0;
  size_t locked_bytes = 0;      // kLocked pages mlock'ed now (slabs and large mappings)
  size_t fallback_bytes = 0;    // kLocked pages DONTDUMP but not locked (budget or limit reached)
  uint64_t lock_failures = 0;   // mlock refusals (RLIMIT_MEMLOCK) since start
  size_t nodump_bytes = 0;      // kNoDump pages mapped now
  // Bytes handed out now: the sum of AllocationSize over live allocations (size classes and
  // large mappings).
  size_t locked_region_in_use_bytes = 0;
  size_t nodump_in_use_bytes = 0;
};
Stats GetStats();

// `hook` runs once, on the thread whose allocation first got unlocked pages, with the budget,
// the bytes locked then, and whether mlock itself refused (RLIMIT_MEMLOCK) rather than the
// budget. It runs under an allocator lock: it must not allocate from these regions or call
// GetStats. This library does not log; the server's hook does. nullptr: none.
using FallbackHook = void (*)(size_t budget_bytes, size_t locked_bytes, bool mlock_refused);
void SetFallbackHook(FallbackHook hook);

// A std allocator over a region: wipes on deallocate (also when a vector grows).
template <typename T, Region kRegion>
struct RegionAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = RegionAllocator<U, kRegion>;
  };
  RegionAllocator() noexcept = default;
  template <typename U>
  RegionAllocator(const RegionAllocator<U, kRegion>&) noexcept {}  // NOLINT(runtime/explicit)

  T* allocate(size_t n) { return static_cast<T*>(Allocate(kRegion, n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { Free(kRegion, p, n * sizeof(T)); }

  template <typename U>
  bool operator==(const RegionAllocator<U, kRegion>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const RegionAllocator<U, kRegion>&) const noexcept { return false; }
};

template <typename T>
using LockedAllocator = RegionAllocator<T, Region::kLocked>;
template <typename T>
using NoDumpAllocator = RegionAllocator<T, Region::kNoDump>;

}  // namespace offload::secure

namespace offload {

// Key material: a byte vector in locked, DONTDUMP memory, wiped on free.
using KeyBytes = std::vector<uint8_t, secure::LockedAllocator<uint8_t>>;

}  // namespace offload

#endif  // SERVICE_COMMON_SECURE_MEMORY_H_
