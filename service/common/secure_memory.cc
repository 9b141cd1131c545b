#include "service/common/secure_memory.h"

#include <sodium.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <new>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace offload::secure {
namespace {

// Size classes, all multiples of 16 from 32 on (so every slot is 16-byte aligned): a slot wastes
// at most a third of itself, and less than a page (4 KiB steps from 8 KiB on), so that no
// allocation takes a page or more beyond its bytes (issue 33).
constexpr size_t kClassSizes[] = {16,   32,   48,    64,    96,    128,   192,   256,
                                  384,  512,  768,   1024,  1536,  2048,  3072,  4096,
                                  6144, 8192, 12288, 16384, 20480, 24576, 28672, 32768};
constexpr int kClassCount = sizeof(kClassSizes) / sizeof(kClassSizes[0]);
constexpr size_t kSlabHeader = 64;  // a Slab, then the slots

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes mapped for a large allocation of `n`: its own pages, no header (less than a page beyond
// its bytes). A freed mapping kept for reuse serves a later allocation of as many pages or, cut
// to size, fewer (Arena::AllocateLarge).
size_t LargeMapping(size_t n) { return RoundUp(n, PageSize()); }

// Process-wide page accounting. Never destroyed: memory may be freed during exit.
struct Pages {
  std::atomic<size_t> budget{0};
  std::atomic<size_t> locked{0};
  std::atomic<size_t> fallback{0};
  std::atomic<size_t> nodump{0};
  std::atomic<uint64_t> lock_failures{0};
  std::atomic<bool> fell_back{false};
  std::atomic<FallbackHook> hook{nullptr};
};
Pages& pages() {
  static Pages* const p = new Pages;
  return *p;
}

// Locks `size` bytes at `p` if the budget has room and mlock agrees. Returns whether locked;
// counts the pages either way.
bool TryLock(void* p, size_t size) {
  Pages& pg = pages();
  size_t used = pg.locked.load(std::memory_order_relaxed);
  bool reserved = false;
  while (used + size <= pg.budget.load(std::memory_order_relaxed)) {
    if (pg.locked.compare_exchange_weak(used, used + size, std::memory_order_relaxed)) {
      reserved = true;
      break;
    }
  }
  bool refused = false;
  if (reserved) {
    // The system call itself: AddressSanitizer's mlock interceptor does nothing and says yes.
    if (syscall(SYS_mlock, p, size) == 0) return true;
    pg.locked.fetch_sub(size, std::memory_order_relaxed);
    pg.lock_failures.fetch_add(1, std::memory_order_relaxed);
    refused = true;
  }
  pg.fallback.fetch_add(size, std::memory_order_relaxed);
  // A zero budget (--locked_memory_bytes=0) is a choice, already logged at start: no warning.
  if (pg.budget.load(std::memory_order_relaxed) > 0 &&
      !pg.fell_back.exchange(true, std::memory_order_relaxed)) {
    if (FallbackHook hook = pg.hook.load(std::memory_order_acquire); hook != nullptr) {
      hook(pg.budget.load(std::memory_order_relaxed), pg.locked.load(std::memory_order_relaxed),
           refused);
    }
  }
  return false;
}

// `size` bytes aligned to `align` (a power of two, at least a page), DONTDUMP; locked if `lock`
// and TryLock agrees (`*locked`). nullptr if mmap fails.
void* MapPages(size_t size, size_t align, bool lock, bool populate, bool* locked) {
  const size_t page = PageSize();
  const size_t extra = align > page ? align - page : 0;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (populate && extra == 0) flags |= MAP_POPULATE;
  void* raw = mmap(nullptr, size + extra, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + align - 1) & ~(static_cast<uintptr_t>(align) - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + extra;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* p = reinterpret_cast<void*>(aligned);
  madvise(p, size, MADV_DONTDUMP);
  *locked = lock && TryLock(p, size);
  if (!lock) pages().nodump.fetch_add(size, std::memory_order_relaxed);
  return p;
}

void UnmapPages(void* p, size_t size, bool lock_region, bool locked) {
  munmap(p, size);  // also unlocks
  Pages& pg = pages();
  if (!lock_region) {
    pg.nodump.fetch_sub(size, std::memory_order_relaxed);
  } else if (locked) {
    pg.locked.fetch_sub(size, std::memory_order_relaxed);
  } else {
    pg.fallback.fetch_sub(size, std::memory_order_relaxed);
  }
}

int ClassOf(size_t n) {
  int c = 0;
  while (kClassSizes[c] < n) ++c;  // REQUIRES: n <= the largest class
  return c;
}

struct Slab {
  Slab* prev = nullptr;  // in its class's list of slabs with a free slot
  Slab* next = nullptr;
  void* free_list = nullptr;  // freed slots, linked through their first 8 bytes
  uint32_t used = 0;
  uint32_t bump = 0;  // slots from here on were never handed out
  uint32_t capacity = 0;
  bool listed = false;
  bool locked = false;
};
static_assert(sizeof(Slab) <= kSlabHeader, "slab header");

class Arena {
 public:
  Arena(bool lock, size_t slab_bytes, size_t large_cache_bytes)
      : lock_(lock), slab_bytes_(slab_bytes), large_cache_bytes_(large_cache_bytes) {
    max_class_ = ClassOf(slab_bytes / 8);
  }

  size_t max_small() const { return kClassSizes[max_class_]; }

  size_t AllocationSize(size_t n) const {
    if (n <= max_small()) return kClassSizes[ClassOf(n)];
    return LargeMapping(n);
  }

  void* Allocate(size_t n) {
    if (n > max_small()) return AllocateLarge(n);
    const int c = ClassOf(n);
    const size_t size = kClassSizes[c];
    Class& cls = classes_[c];
    void* p = nullptr;
    {
      absl::MutexLock lock(&cls.mu);
      Slab* s = cls.partial;
      if (s == nullptr) {
        s = NewSlab(size);
        if (s == nullptr) throw std::bad_alloc();
        PushLocked(cls, s);
      }
      if (s->free_list != nullptr) {
        p = s->free_list;
        s->free_list = *static_cast<void**>(p);
        *static_cast<void**>(p) = nullptr;  // the slot reads as zeros again
      } else {
        p = reinterpret_cast<char*>(s) + kSlabHeader + size_t{s->bump} * size;
        ++s->bump;
      }
      if (++s->used == s->capacity) UnlistLocked(cls, s);
      cls.in_use += size;
    }
    return p;
  }

  void Free(void* p, size_t n) {
    if (n > max_small()) return FreeLarge(p, n);
    const int c = ClassOf(n);
    const size_t size = kClassSizes[c];
    sodium_memzero(p, size);  // the slot is still ours alone
    Class& cls = classes_[c];
    Slab* s = reinterpret_cast<Slab*>(reinterpret_cast<uintptr_t>(p) &
                                      ~(static_cast<uintptr_t>(slab_bytes_) - 1));
    Slab* release = nullptr;
    {
      absl::MutexLock lock(&cls.mu);
      *static_cast<void**>(p) = s->free_list;
      s->free_list = p;
      cls.in_use -= size;
      if (!s->listed) PushLocked(cls, s);
      // An empty slab goes back to the system unless it is the class's only one with room.
      if (--s->used == 0 && !(cls.partial == s && s->next == nullptr)) {
        UnlistLocked(cls, s);
        release = s;
      }
    }
    if (release != nullptr) {
      const bool locked = release->locked;
      sodium_memzero(release, kSlabHeader);
      UnmapPages(release, slab_bytes_, lock_, locked);
    }
  }

  size_t InUse() {
    size_t total = large_in_use_.load(std::memory_order_relaxed);
    for (Class& cls : classes_) {
      absl::MutexLock lock(&cls.mu);
      total += cls.in_use;
    }
    return total;
  }

 private:
  struct Class {
    absl::Mutex mu;
    Slab* partial ABSL_GUARDED_BY(mu) = nullptr;  // slabs with a free slot
    size_t in_use ABSL_GUARDED_BY(mu) = 0;
  };

  Slab* NewSlab(size_t size) {
    bool locked = false;
    void* p = MapPages(slab_bytes_, slab_bytes_, lock_, /*populate=*/false, &locked);
    if (p == nullptr) return nullptr;
    Slab* s = new (p) Slab;
    s->capacity = static_cast<uint32_t>((slab_bytes_ - kSlabHeader) / size);
    s->locked = locked;
    return s;
  }

  static void PushLocked(Class& cls, Slab* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cls.mu) {
    s->prev = nullptr;
    s->next = cls.partial;
    if (cls.partial != nullptr) cls.partial->prev = s;
    cls.partial = s;
    s->listed = true;
  }

  static void UnlistLocked(Class& cls, Slab* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cls.mu) {
    if (s->prev != nullptr) s->prev->next = s->next;
    else cls.partial = s->next;
    if (s->next != nullptr) s->next->prev = s->prev;
    s->prev = s->next = nullptr;
    s->listed = false;
  }

  // A mapping of LargeMapping(n) bytes: a kept one of that size, else the smallest larger kept
  // one with its tail pages unmapped, else a fresh one. Either way it takes exactly
  // LargeMapping(n) bytes while in use (what AllocationSize says and the memo charges).
  void* AllocateLarge(size_t n) {
    const size_t mapped = LargeMapping(n);
    void* reused = nullptr;
    size_t reused_size = 0;
    {
      absl::MutexLock lock(&large_mu_);
      auto it = large_cache_.lower_bound(mapped);
      if (it != large_cache_.end()) {
        reused = it->second.back();
        reused_size = it->first;
        it->second.pop_back();
        if (it->second.empty()) large_cache_.erase(it);
        large_cached_ -= reused_size;
      }
    }
    if (reused != nullptr) {
      if (reused_size > mapped) {
        // Page-aligned, wiped when freed: the tail goes back to the system.
        UnmapPages(static_cast<char*>(reused) + mapped, reused_size - mapped, lock_,
                   IsLockedLarge(reused));
      }
      large_in_use_.fetch_add(mapped, std::memory_order_relaxed);
      return reused;
    }
    bool locked = false;
    void* p = MapPages(mapped, PageSize(), lock_, /*populate=*/true, &locked);
    if (p == nullptr) throw std::bad_alloc();
    if (locked) {
      absl::MutexLock lock(&large_mu_);
      locked_large_.insert(p);
    }
    large_in_use_.fetch_add(mapped, std::memory_order_relaxed);
    return p;
  }

  void FreeLarge(void* p, size_t n) {
    const size_t mapped = LargeMapping(n);
    sodium_memzero(p, mapped);  // the whole mapping: a reuse may hand out all of it
    large_in_use_.fetch_sub(mapped, std::memory_order_relaxed);
    bool locked = false;
    {
      // Kept for the next allocation of this many pages (or fewer), within a bound: a request
      // path that opens 55 KB envelopes must not pay an mmap and its page faults each time.
      absl::MutexLock lock(&large_mu_);
      if (large_cached_ + mapped <= large_cache_bytes_) {
        large_cache_[mapped].push_back(p);
        large_cached_ += mapped;
        return;
      }
      locked = locked_large_.erase(p) > 0;
    }
    UnmapPages(p, mapped, lock_, locked);
  }

  bool IsLockedLarge(void* p) {
    if (!lock_) return false;
    absl::MutexLock lock(&large_mu_);
    return locked_large_.contains(p);
  }

  const bool lock_;
  const size_t slab_bytes_;
  const size_t large_cache_bytes_;
  int max_class_ = 0;
  Class classes_[kClassCount];
  absl::Mutex large_mu_;
  // Freed large mappings (wiped) by mapping size, at most large_cache_bytes_ in all.
  std::map<size_t, std::vector<void*>> large_cache_ ABSL_GUARDED_BY(large_mu_);
  size_t large_cached_ ABSL_GUARDED_BY(large_mu_) = 0;
  // Large mappings that were mlock'ed (the locked region's; none in the no-dump region).
  absl::flat_hash_set<void*> locked_large_ ABSL_GUARDED_BY(large_mu_);
  std::atomic<size_t> large_in_use_{0};  // bytes of large mappings handed out
};

// Key material is small and few: 8 KiB slabs keep the locked minimum low (RLIMIT_MEMLOCK is
// 64 KiB in some containers), no cache of large mappings. Memo payloads: 256 KiB slabs, up to
// 32 KiB per slot; up to 32 MiB of freed larger mappings kept for reuse.
Arena& ArenaFor(Region region) {
  static Arena* const locked = new Arena(/*lock=*/true, 8 << 10, 0);
  static Arena* const nodump = new Arena(/*lock=*/false, 256 << 10, 32 << 20);
  return region == Region::kLocked ? *locked : *nodump;
}

}  // namespace

void* Allocate(Region region, size_t size) { return ArenaFor(region).Allocate(size); }

void Free(Region region, void* p, size_t size) noexcept {
  if (p != nullptr) ArenaFor(region).Free(p, size);
}

size_t AllocationSize(Region region, size_t size) {
  return ArenaFor(region).AllocationSize(size);
}

void SetLockedBudget(size_t bytes) { pages().budget.store(bytes, std::memory_order_relaxed); }

Stats GetStats() {
  Pages& pg = pages();
  Stats s;
  s.locked_budget_bytes = pg.budget.load(std::memory_order_relaxed);
  s.locked_bytes = pg.locked.load(std::memory_order_relaxed);
  s.fallback_bytes = pg.fallback.load(std::memory_order_relaxed);
  s.lock_failures = pg.lock_failures.load(std::memory_order_relaxed);
  s.nodump_bytes = pg.nodump.load(std::memory_order_relaxed);
  s.locked_region_in_use_bytes = ArenaFor(Region::kLocked).InUse();
  s.nodump_in_use_bytes = ArenaFor(Region::kNoDump).InUse();
  return s;
}

void SetFallbackHook(FallbackHook hook) { pages().hook.store(hook, std::memory_order_release); }

}  // namespace offload::secure
