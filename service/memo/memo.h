// The service's memo caches: repeated work costs a keyed hash and a lookup instead of a curve
// operation or a decryption. Semantics (DESIGN.md, "Memo caches"):
//
//   cache   key (a keyed BLAKE2b-256 digest of...)                 value
//   verify  public key, signature, message                          "valid" (only valid results)
//   derive  key version instance, output kind, peer public key      32-byte shared key (wiped)
//   open    key version instance, nonce, tag, AAD, length           ciphertext copy + plaintext
//
// A digest is computed with a per-process random salt, so cache keys reveal nothing and cannot
// be aimed at from outside. Key versions are named by `instance`, a number the KeyManager never
// reuses in a process: a deleted and re-created key id, or another version, can never hit
// another's entries. An open hit also compares the full ciphertext with the stored copy, so a
// tampered ciphertext that reuses a cached nonce and tag misses, and fails as it would fresh.
// Failed verifications and failed opens are never cached.
//
// The open memo is one cache per key id, each bounded by `open_bytes_per_key`, under one shared
// budget of `open_bytes_total` that keeps a single least-recently-used order across all keys: an
// insert first evicts its own key's oldest entries while that key is over its bound, then the
// least recently used entries of any key while the total is short. A key idle for hours gives up
// its room to the keys in use.
//
//   Memo memo(MemoOptions{});
//   Digest d = memo.VerifyDigest(pk, sig, msg);
//   if (!memo.VerifyHit(d)) { if (Verify(...)) memo.VerifyInsert(d); }
//
// Thread-safety: every method may be called concurrently.
#ifndef SERVICE_MEMO_MEMO_H_
#define SERVICE_MEMO_MEMO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <sodium.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"
#include "service/memo/lru_cache.h"

namespace offload::memo {

// A buffer for a cached plaintext, shared by reference: the open memo's entry, the responses
// being written that came from it, and the fresh open that made it. Its bytes live in no-dump
// memory (secure_memory.h: pages marked MADV_DONTDUMP, pooled in slabs for small sizes), so a
// core dump never holds a cached plaintext; wiped and freed when the last reference goes.
// Read-only once shared.
// Thread-safety: immutable once shared; shared_ptr's count is atomic.
class WipedBuffer final {
 public:
  // REQUIRES: the caller writes all `size` bytes before sharing it.
  static std::shared_ptr<WipedBuffer> Make(size_t size) {
    return std::make_shared<WipedBuffer>(size, Private{});
  }
  struct Private {};  // make_shared needs a public constructor; this keeps it out of reach
  WipedBuffer(size_t size, Private)
      : data_(size > 0 ? static_cast<uint8_t*>(secure::Allocate(kRegion, size)) : nullptr),
        size_(size) {}
  ~WipedBuffer() { secure::Free(kRegion, data_, size_); }  // wipes
  WipedBuffer(const WipedBuffer&) = delete;
  WipedBuffer& operator=(const WipedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }

  // Bytes a buffer of `size` takes in memory (its size class or pages).
  static size_t Footprint(size_t size) {
    return size > 0 ? secure::AllocationSize(kRegion, size) : 0;
  }

 private:
  static constexpr secure::Region kRegion = secure::Region::kNoDump;
  uint8_t* const data_;
  const size_t size_;
};
using SharedPlaintext = std::shared_ptr<const WipedBuffer>;

struct MemoOptions {
  size_t verify_bytes = 32u << 20;
  size_t derive_bytes = 16u << 20;
  size_t open_bytes_per_key = 8u << 20;
  size_t open_bytes_total = 256u << 20;
  int shards = 16;            // verify and derive caches; each key's open cache has one shard
  bool enabled = true;        // false: every lookup misses and nothing is stored
};

class Memo final {
 public:
  explicit Memo(MemoOptions options);
  ~Memo();

  // The *Digest functions return an all-zero digest, unhashed, when the memo is off (`enabled`
  // false): every lookup misses and nothing is stored, so the hash would be wasted work.

  // --- verify ---
  Digest VerifyDigest(absl::Span<const uint8_t> public_key, absl::Span<const uint8_t> signature,
                      absl::Span<const uint8_t> message) const;
  bool VerifyHit(const Digest& digest);
  // REQUIRES: the triple behind `digest` verified as valid.
  void VerifyInsert(const Digest& digest);

  // --- derive ---
  // `output` distinguishes raw secrets from box keys (the DeriveOutput enum value).
  Digest DeriveDigest(uint64_t instance, int output, absl::Span<const uint8_t> peer) const;
  // On a hit copies the 32-byte shared key into `out`. REQUIRES: `out.size() == 32`.
  bool DeriveLookup(const Digest& digest, absl::Span<uint8_t> out);
  void DeriveInsert(const Digest& digest, absl::string_view key_id,
                    absl::Span<const uint8_t> shared);

  // --- open (AEAD) ---
  Digest OpenDigest(uint64_t instance, absl::Span<const uint8_t> nonce,
                    absl::Span<const uint8_t> ciphertext_and_tag,
                    absl::Span<const uint8_t> aad) const;
  // On a hit (same digest and byte-identical `ciphertext_and_tag`: the whole stored copy is
  // compared) sets `*out` to the entry's plaintext, by reference: no copy. The buffer stays valid
  // (and unwiped) while `*out` holds it, even if the entry is evicted meanwhile.
  bool OpenLookup(absl::string_view key_id, const Digest& digest,
                  absl::Span<const uint8_t> ciphertext_and_tag, SharedPlaintext* out);
  // The same, copying the plaintext into `out`.
  bool OpenLookup(absl::string_view key_id, const Digest& digest,
                  absl::Span<const uint8_t> ciphertext_and_tag, std::string* out);
  // Records that `ciphertext_and_tag` opens to `plaintext` (after a successful Open or Seal);
  // copies both.
  void OpenInsert(absl::string_view key_id, const Digest& digest,
                  absl::Span<const uint8_t> ciphertext_and_tag,
                  absl::Span<const uint8_t> plaintext);
  // The same without a copy: the entry keeps `stored` (whose bytes from `ciphertext_offset` on
  // are the ciphertext and tag - e.g. a request's whole envelope, moved in) and shares
  // `plaintext`. REQUIRES: `ciphertext_offset <= stored.size()`, `plaintext` non-null.
  void OpenInsert(absl::string_view key_id, const Digest& digest, std::string stored,
                  size_t ciphertext_offset, SharedPlaintext plaintext);

  // Bytes one open entry costs against `open_bytes_per_key`, `open_bytes_total` and in
  // open_stats().bytes: both buffers (`stored_size`: the stored ciphertext, with whatever
  // precedes it), their bookkeeping and the cache's per-entry charge.
  static size_t OpenEntryCost(size_t stored_size, size_t plaintext_size);

  // Drops every derive and open entry of `key_id` (all versions).
  void DropKey(absl::string_view key_id);

  CacheStats verify_stats() const { return verify_.Stats(); }
  CacheStats derive_stats() const { return derive_.Stats(); }
  CacheStats open_stats() const;
  const MemoOptions& options() const { return options_; }

 private:
  struct OpenEntry {
    std::string stored;  // the ciphertext and tag from `ciphertext_offset` on
    size_t ciphertext_offset = 0;
    SharedPlaintext plaintext;
  };
  // Shared so that a hit takes its reference under the shard's lock, and the entry may go
  // meanwhile.
  using OpenCache = LruCache<std::shared_ptr<const OpenEntry>>;
  struct Empty {};

  uint64_t OwnerTag(absl::string_view key_id) const;
  std::shared_ptr<OpenCache> FindOpenCache(absl::string_view key_id);
  std::shared_ptr<OpenCache> OpenCacheFor(absl::string_view key_id);
  static size_t OpenCharge(size_t stored_size, size_t plaintext_size);

  const MemoOptions options_;
  uint8_t salt_[32];
  LruCache<Empty> verify_;
  // Shared keys in no-dump memory (32-byte slots, pooled), wiped on eviction.
  using SharedKey = std::vector<uint8_t, secure::NoDumpAllocator<uint8_t>>;
  LruCache<SharedKey> derive_;
  // Declared before the per-key caches that use it, so that it outlives them.
  OpenCache::SharedBudget open_budget_;

  mutable absl::Mutex open_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<OpenCache>> open_ ABSL_GUARDED_BY(open_mu_);
  // Counters of per-key caches already dropped, so that the totals never go backwards.
  CacheStats open_retired_ ABSL_GUARDED_BY(open_mu_);
};

}  // namespace offload::memo

#endif  // SERVICE_MEMO_MEMO_H_
