#include "service/common/secure_memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace offload::secure {
namespace {

// The VmFlags line of the /proc/self/smaps mapping that holds `p` ("" if none).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(' ') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      inside = lo <= a && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool HasFlag(const std::string& vmflags, const std::string& flag) {
  std::istringstream in(vmflags);
  std::string word;
  while (in >> word) {
    if (word == flag) return true;
  }
  return false;
}

bool AllZero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

TEST(SecureMemoryTest, NoDumpSmallAndLargeAreDontDumpAndUnlocked) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{32}, size_t{1000}, size_t{32768}, size_t{40000},
                   size_t{3} << 20}) {
    SCOPED_TRACE(n);
    auto* p = static_cast<uint8_t*>(Allocate(Region::kNoDump, n));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    EXPECT_TRUE(AllZero(p, n));
    std::memset(p, 0xAB, n);
    const std::string flags = VmFlagsOf(p);
    EXPECT_TRUE(HasFlag(flags, "dd")) << flags;
    EXPECT_FALSE(HasFlag(flags, "lo")) << flags;
    EXPECT_GE(AllocationSize(Region::kNoDump, n), std::max<size_t>(n, 16));
    Free(Region::kNoDump, p, n);
  }
}

// Issue 33: no allocation takes a page or more beyond its bytes (size classes and large
// mappings), and what is in use is exactly the sum of AllocationSize, whether a large allocation
// got fresh pages, a kept mapping of its size, or a larger kept one cut to size.
TEST(SecureMemoryTest, AtMostOnePageBeyondItsBytesAndInUseIsAllocationSize) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t n = 1; n <= (2u << 20); n += (n < 70000 ? 1 : 977)) {
    const size_t got = AllocationSize(Region::kNoDump, n);
    ASSERT_GE(got, n);
    ASSERT_LT(got - n, page) << n;
  }
  // 55 KB, as a cached plaintext of the phone's 27 blobs: 14 pages.
  EXPECT_EQ(AllocationSize(Region::kNoDump, 55000), 14 * page);

  const auto in_use = [] { return GetStats().nodump_in_use_bytes; };
  const size_t base = in_use();
  // A 40-page allocation, freed (kept for reuse), then a 30-page one: served from the kept
  // mapping cut to 30 pages, or from a kept one of 30 pages; in use either way: 30 pages.
  const size_t big = 40 * page - 100, small = 30 * page - 100;
  auto* a = static_cast<uint8_t*>(Allocate(Region::kNoDump, big));
  EXPECT_EQ(in_use(), base + 40 * page);
  std::memset(a, 0x5A, big);
  Free(Region::kNoDump, a, big);
  EXPECT_EQ(in_use(), base);
  const size_t mapped_before = GetStats().nodump_bytes;
  auto* b = static_cast<uint8_t*>(Allocate(Region::kNoDump, small));
  EXPECT_EQ(in_use(), base + 30 * page);
  EXPECT_LE(GetStats().nodump_bytes, mapped_before) << "a kept mapping was reused, not a new one";
  EXPECT_TRUE(AllZero(b, small)) << "reused memory reads as zeros";
  std::memset(b, 0xA5, small);  // all of it is ours (a cut mapping's head)
  EXPECT_TRUE(HasFlag(VmFlagsOf(b), "dd"));
  Free(Region::kNoDump, b, small);
  EXPECT_EQ(in_use(), base);
}

TEST(SecureMemoryTest, LockedWithinBudgetIsLockedAndDontDump) {
  SetLockedBudget(1 << 20);
  const Stats before = GetStats();
  KeyBytes key(32, 7);
  const std::string flags = VmFlagsOf(key.data());
  EXPECT_TRUE(HasFlag(flags, "dd")) << flags;
  // mlock may be refused (RLIMIT_MEMLOCK without CAP_IPC_LOCK): then it fell back, counted.
  const Stats after = GetStats();
  if (HasFlag(flags, "lo")) {
    EXPECT_GT(after.locked_bytes, 0u);
  } else {
    EXPECT_GT(after.lock_failures + after.fallback_bytes, 0u);
  }
  EXPECT_GE(after.locked_region_in_use_bytes, before.locked_region_in_use_bytes + 32);
  auto* large = static_cast<uint8_t*>(Allocate(Region::kLocked, 10000));
  EXPECT_TRUE(HasFlag(VmFlagsOf(large), "dd"));
  Free(Region::kLocked, large, 10000);
}

TEST(SecureMemoryTest, PastTheBudgetFallsBackUnlockedButDontDump) {
  SetLockedBudget(GetStats().locked_bytes);  // no room for one more page
  const Stats before = GetStats();
  const size_t n = 100000;  // a mapping of its own: new pages
  auto* p = static_cast<uint8_t*>(Allocate(Region::kLocked, n));
  std::memset(p, 1, n);
  const std::string flags = VmFlagsOf(p);
  EXPECT_TRUE(HasFlag(flags, "dd")) << flags;
  EXPECT_FALSE(HasFlag(flags, "lo")) << flags;
  EXPECT_GE(GetStats().fallback_bytes, before.fallback_bytes + n);
  EXPECT_EQ(GetStats().locked_bytes, before.locked_bytes);
  Free(Region::kLocked, p, n);
  EXPECT_EQ(GetStats().fallback_bytes, before.fallback_bytes);
  SetLockedBudget(1 << 20);
}

TEST(SecureMemoryTest, FreedSlotsAreWipedAndReused) {
  std::vector<uint8_t*> slots;
  for (int i = 0; i < 1000; ++i) {
    auto* p = static_cast<uint8_t*>(Allocate(Region::kNoDump, 48));
    std::memset(p, 0x5A, 48);
    slots.push_back(p);
  }
  std::set<uint8_t*> distinct(slots.begin(), slots.end());
  EXPECT_EQ(distinct.size(), slots.size());
  uint8_t* freed = slots[500];
  Free(Region::kNoDump, freed, 48);
  // The slot holds a free-list link in its first 8 bytes, zeros after.
  EXPECT_TRUE(AllZero(freed + 8, 40));
  auto* again = static_cast<uint8_t*>(Allocate(Region::kNoDump, 48));
  EXPECT_EQ(again, freed);
  EXPECT_TRUE(AllZero(again, 48));
  slots[500] = again;
  for (uint8_t* p : slots) Free(Region::kNoDump, p, 48);
}

TEST(SecureMemoryTest, EmptySlabsGoBackToTheSystem) {
  const size_t mapped_before = GetStats().nodump_bytes;
  std::vector<void*> slots;
  for (int i = 0; i < 200; ++i) slots.push_back(Allocate(Region::kNoDump, 20000));  // many slabs
  EXPECT_GT(GetStats().nodump_bytes, mapped_before + (2u << 20));
  for (void* p : slots) Free(Region::kNoDump, p, 20000);
  // At most one slab (256 KiB) stays for the class.
  EXPECT_LE(GetStats().nodump_bytes, mapped_before + (256u << 10));
}

TEST(SecureMemoryTest, KeyBytesGrowsAndCopies) {
  KeyBytes a;
  for (int i = 0; i < 5000; ++i) a.push_back(static_cast<uint8_t>(i));
  KeyBytes b = a;
  ASSERT_EQ(b.size(), 5000u);
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(b[i], static_cast<uint8_t>(i));
}

TEST(SecureMemoryTest, ConcurrentAllocateFreeKeepsContents) {
  const uint32_t seed = 26;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, seed, &bad] {
      std::mt19937 rng(seed + t);
      std::vector<std::pair<uint8_t*, size_t>> held;
      for (int i = 0; i < 20000; ++i) {
        if (held.size() < 64 && (rng() & 1)) {
          const size_t n = rng() % 5000;
          const Region r = (rng() & 3) == 0 ? Region::kLocked : Region::kNoDump;
          if (r == Region::kLocked && n > 2000) continue;
          auto* p = static_cast<uint8_t*>(Allocate(r, n));
          std::memset(p, static_cast<int>(n & 0xFF), n);
          held.emplace_back(p, n | (r == Region::kLocked ? size_t{1} << 62 : 0));
        } else if (!held.empty()) {
          const size_t k = rng() % held.size();
          auto [p, tagged] = held[k];
          const bool locked = tagged >> 62;
          const size_t n = tagged & ~(size_t{1} << 62);
          for (size_t j = 0; j < n; ++j) {
            if (p[j] != static_cast<uint8_t>(n & 0xFF)) {
              ++bad;
              break;
            }
          }
          Free(locked ? Region::kLocked : Region::kNoDump, p, n);
          held.erase(held.begin() + k);
        }
      }
      for (auto [p, tagged] : held) {
        Free(tagged >> 62 ? Region::kLocked : Region::kNoDump, p, tagged & ~(size_t{1} << 62));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0) << "seed " << seed;
}

}  // namespace
}  // namespace offload::secure
