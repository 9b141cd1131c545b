// Floods the memo caches with unique entries far beyond their bounds and prints the caches' own
// counters and the process's resident memory before and after: memory must grow by about the
// bound, not by the flood.
//
//   build-bench/bin/memo_flood                       # the service's default bounds
//   build-bench/bin/memo_flood --verify_entries=1000000 --open_keys=48 --open_per_key=150
//
// Entries go in through memo::Memo's public API, as the operations put them. The verify flood
// inserts digests of random (public key, signature, 64-byte message) triples without verifying
// them: the memory an entry takes does not depend on the signature being valid, and 10^6 real
// signatures would cost a minute of signing. RSS is VmRSS of /proc/self/status (VmHWM = peak).
// Freed memory is not always handed back to the kernel by malloc, so "after" is close to the peak.
// "inserted" below is what the cache accepted: an open insert is refused (not counted) when the
// global budget is spent and the key's own shard has nothing left to evict.
#include <sodium.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "service/crypto/backend.h"
#include "service/memo/memo.h"

namespace offload {
namespace {

struct Args {
  long verify_entries = 1000000;
  long derive_entries = 1000000;
  long open_keys = 48;       // more than open_bytes_total / open_bytes_per_key (32 by default)
  long open_per_key = 150;   // about twice what 8 MB holds at 55 KB
  long open_size = 55 * 1024;
};

long StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtol(line.c_str() + n + 1, nullptr, 10);
    }
  }
  return -1;
}

double Mb(double bytes) { return bytes / (1024.0 * 1024.0); }

void PrintRow(const char* cache, const char* offered_text, double offered_bytes,
              const memo::CacheStats& s, long rss_before_kb, long rss_after_kb) {
  const double growth = (rss_after_kb - rss_before_kb) * 1024.0;
  std::printf("| %s | %s (%.1f MB) | %llu | %llu | %llu | %.1f MB | %.1f MB | %s | %.1f MB -> "
              "%.1f MB (+%.1f MB) | %.2f |\n",
              cache, offered_text, Mb(offered_bytes),
              static_cast<unsigned long long>(s.inserts), static_cast<unsigned long long>(s.entries),
              static_cast<unsigned long long>(s.evictions), Mb(s.bytes), Mb(s.capacity_bytes),
              s.bytes <= s.capacity_bytes ? "yes" : "NO", rss_before_kb / 1024.0,
              rss_after_kb / 1024.0, Mb(growth), growth / static_cast<double>(s.capacity_bytes));
}

int Run(const Args& args) {
  if (!crypto::InitCrypto().ok()) return 1;
  memo::MemoOptions options;  // the service's defaults
  memo::Memo memo(options);
  std::printf("memo bounds: verify %.0f MB, derive %.0f MB, open %.0f MB per key / %.0f MB total\n",
              Mb(options.verify_bytes), Mb(options.derive_bytes), Mb(options.open_bytes_per_key),
              Mb(options.open_bytes_total));
  std::printf("entry cost = charge + %zu bytes (LruCache::EntryCost)\n\n",
              memo::LruCache<int>::EntryCost(0));
  std::printf("| cache | offered (unique entries, charged bytes) | inserted | entries kept | evictions | "
              "bytes kept | bound | kept <= bound | VmRSS before -> after | RSS growth / "
              "bound |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n");
  const long rss_start = StatusKb("VmRSS");

  // Verify: 32 + 64 + 64 input bytes per entry, charge 0.
  {
    const long before = StatusKb("VmRSS");
    uint8_t pk[32], sig[64], msg[64];
    randombytes_buf(pk, sizeof(pk));
    randombytes_buf(sig, sizeof(sig));
    randombytes_buf(msg, sizeof(msg));
    for (long i = 0; i < args.verify_entries; ++i) {
      std::memcpy(msg, &i, sizeof(i));  // unique message per entry
      memo.VerifyInsert(memo.VerifyDigest(pk, sig, msg));
    }
    char offered[64];
    std::snprintf(offered, sizeof(offered), "%ld", args.verify_entries);
    PrintRow("verify", offered,
             static_cast<double>(args.verify_entries) * memo::LruCache<int>::EntryCost(0),
             memo.verify_stats(), before, StatusKb("VmRSS"));
  }

  // Derive: unique peers, 32-byte shared keys.
  {
    const long before = StatusKb("VmRSS");
    uint8_t peer[32], shared[32];
    randombytes_buf(peer, sizeof(peer));
    randombytes_buf(shared, sizeof(shared));
    for (long i = 0; i < args.derive_entries; ++i) {
      std::memcpy(peer, &i, sizeof(i));
      memo.DeriveInsert(memo.DeriveDigest(/*instance=*/1, /*output=*/1, peer), "flood-dh",
                        shared);
    }
    char offered[64];
    std::snprintf(offered, sizeof(offered), "%ld", args.derive_entries);
    PrintRow("derive", offered,
             static_cast<double>(args.derive_entries) * memo::LruCache<int>::EntryCost(32),
             memo.derive_stats(), before, StatusKb("VmRSS"));
  }

  // Open: `open_keys` keys, `open_per_key` unique ciphertexts of `open_size` bytes each.
  {
    const long before = StatusKb("VmRSS");
    std::vector<uint8_t> ct(args.open_size + 16), pt(args.open_size), nonce(24), aad(16);
    randombytes_buf(ct.data(), ct.size());
    randombytes_buf(pt.data(), pt.size());
    randombytes_buf(nonce.data(), nonce.size());
    for (long k = 0; k < args.open_keys; ++k) {
      const std::string key_id = "flood-blobs-" + std::to_string(k);
      for (long i = 0; i < args.open_per_key; ++i) {
        std::memcpy(nonce.data(), &i, sizeof(i));
        std::memcpy(ct.data(), &i, sizeof(i));
        memo.OpenInsert(key_id, memo.OpenDigest(/*instance=*/100 + k, nonce, ct, aad), ct, pt);
      }
    }
    char offered[96];
    const long total = args.open_keys * args.open_per_key;
    std::snprintf(offered, sizeof(offered), "%ld x %ld KB in %ld keys", total,
                  args.open_size / 1024, args.open_keys);
    PrintRow("open", offered,
             static_cast<double>(total) * memo::LruCache<int>::EntryCost(ct.size() + pt.size()),
             memo.open_stats(), before, StatusKb("VmRSS"));
  }
  const long rss_end = StatusKb("VmRSS");
  const double bounds = static_cast<double>(options.verify_bytes + options.derive_bytes +
                                            options.open_bytes_total);
  std::printf("\nprocess: VmRSS %.1f MB at start, %.1f MB at end (+%.1f MB; the three bounds "
              "add up to %.0f MB), VmHWM (peak) %.1f MB\n",
              rss_start / 1024.0, rss_end / 1024.0, (rss_end - rss_start) / 1024.0, Mb(bounds),
              StatusKb("VmHWM") / 1024.0);
  return 0;
}

}  // namespace
}  // namespace offload

int main(int argc, char** argv) {
  offload::Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto take = [&](const char* name, long* out) {
      const std::string prefix = std::string("--") + name + "=";
      if (a.compare(0, prefix.size(), prefix) != 0) return false;
      *out = std::strtol(a.c_str() + prefix.size(), nullptr, 10);
      return true;
    };
    if (!take("verify_entries", &args.verify_entries) &&
        !take("derive_entries", &args.derive_entries) && !take("open_keys", &args.open_keys) &&
        !take("open_per_key", &args.open_per_key) && !take("open_size", &args.open_size)) {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return offload::Run(args);
}
