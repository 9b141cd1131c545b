// The client's memos: what a Client remembers of the service's answers so that repeated work
// costs the caller no round trip (client/cpp/README.md, "Memos").
//
//   MemoDigester digester;                                  // a fresh random key per instance
//   Memo memo({.capacity_bytes = 1 << 20, .max_age = absl::Minutes(5)});
//   const Memo::Digest d = digester.Derive("dh-1", 0, v1::DERIVE_OUTPUT_RAW, peer);
//   const uint64_t generation = memo.generation();          // before the RPC is sent
//   ... RPC ...
//   memo.Insert(d, "dh-1", shared_key, key_version, generation);
//   std::string out;
//   uint32_t version = 0;
//   if (memo.Lookup(d, &out, &version)) { ... no RPC ... }
//
// A Memo is one byte-bounded, least-recently-used cache with an optional maximum age, the rules
// of the service's memos (../shared/DESIGN.md, "Memo caches") plus the AWS Encryption SDK's
// thresholds:
// - Entries are keyed by a 32-byte digest (MemoDigester: keyed BLAKE2b under a random key drawn
//   when the digester is made, over length-prefixed inputs), never by raw material.
// - Least recently used by bytes: a hit moves the entry to the newest end; an insert that would
//   pass `capacity_bytes` evicts from the oldest end first. An entry is charged its value's bytes,
//   its owner's (the key id's) bytes and kEntryOverhead for the digest, the lists and the index.
// - `max_age`: counted from the insert (a hit does not renew it). An entry older than that is
//   never returned; it is removed (and wiped) by the first Lookup or Insert that comes after its
//   age has run out, or by Clear.
// - Values live in wiping buffers (sodium_memzero before the memory is freed): shared keys and
//   plaintexts are secrets. Lookup copies the value into the caller's string; that copy is the
//   caller's to wipe.
// - DropOwner drops every entry of one key id at once (a refusal about the key). Every drop and
//   Clear moves `generation()` on, and an Insert carrying a generation read before a drop of its
//   own key id (or before a Clear) is ignored, so an answer that was on its way while a refusal
//   dropped its key is not remembered after the drop. A drop of another key id does not stop
//   it: refusals about one key (an unknown id a caller keeps asking for) do not switch off the
//   memo for the others.
// - `max_age` runs on a clock that counts time the machine spends asleep (CLOCK_BOOTTIME on
//   Linux and Android; steady_clock elsewhere), so an entry does not outlive its age across a
//   suspend.
//
// Thread-safety: thread-safe. One mutex per Memo (a client's memo sees a few threads, not a
// server's cores, and one lock keeps one exact recency order); values are copied under it and
// destroyed after it is released.
#ifndef CLIENT_CPP_MEMO_H_
#define CLIENT_CPP_MEMO_H_

#include <sodium.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "offload/v1/x25519.pb.h"

namespace offload::client {

// std::allocator that wipes memory (sodium_memzero) before freeing it, also when a vector grows.
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

// Secret bytes (shared keys, plaintexts), wiped when freed.
using SecretBytes = std::vector<char, WipingAllocator<char>>;

// Wipes `s` in place (its characters; the string keeps its size).
inline void WipeString(std::string* s) {
  if (!s->empty()) sodium_memzero(s->data(), s->size());
}

// Counters of one memo (a snapshot; entries and bytes are current, the rest monotonic).
struct MemoStats {
  int64_t hits = 0;
  int64_t misses = 0;         // lookups that found nothing usable (expired ones included)
  int64_t inserts = 0;         // new entries (a replacement under the same digest is not one)
  int64_t evictions = 0;      // entries pushed out by the byte bound
  int64_t expired = 0;        // entries removed because their maximum age had run out
  int64_t dropped = 0;        // entries removed by a refusal about their key, or by a reset
  int64_t entries = 0;
  int64_t bytes = 0;          // charged bytes (values, key ids, per-entry overhead)
  int64_t capacity_bytes = 0;
};

// The keyed digests that name memo entries. The key is 32 random bytes drawn at construction and
// wiped at destruction; digests of one MemoDigester are comparable only with each other.
// Thread-safe (const after construction).
class MemoDigester final {
 public:
  MemoDigester();
  ~MemoDigester();
  MemoDigester(const MemoDigester&) = delete;
  MemoDigester& operator=(const MemoDigester&) = delete;

  using Digest = std::array<uint8_t, 32>;

  // (public key, signature, message) of a Verify.
  Digest Verify(absl::string_view public_key, absl::string_view signature,
                absl::string_view message) const;
  // (key id, key version asked (0 = current), output kind, peer public key) of a Derive.
  // DERIVE_OUTPUT_UNSPECIFIED is digested as DERIVE_OUTPUT_RAW, which the service takes it for.
  Digest Derive(absl::string_view key_id, uint32_t key_version, v1::DeriveOutput output,
                absl::string_view peer_public_key) const;
  // (key id, envelope, associated data) of an AeadOpen (and of the AeadSeal that made it).
  Digest Open(absl::string_view key_id, absl::string_view envelope,
              absl::string_view associated_data) const;

 private:
  uint8_t key_[32];
};

struct MemoOptions {
  // The bound, in charged bytes (Memo::EntryCost). REQUIRES: > 0.
  size_t capacity_bytes = 1 << 20;
  // Entries older than this are never used. InfiniteDuration(): no maximum age.
  // REQUIRES: > 0.
  absl::Duration max_age = absl::InfiniteDuration();
  // A monotonic clock (time since any fixed point). Null: CLOCK_BOOTTIME where there is one
  // (time asleep counts), else std::chrono::steady_clock. For tests.
  std::function<absl::Duration()> clock;
};

class Memo final {
 public:
  using Digest = MemoDigester::Digest;

  explicit Memo(MemoOptions options);
  ~Memo();
  Memo(const Memo&) = delete;
  Memo& operator=(const Memo&) = delete;

  // What an entry costs against the bound besides its value and owner bytes: the Entry in its
  // list node (with a malloc chunk's bookkeeping), its place in the age list, and two index slots
  // (a flat_hash_map keeps 7/16 to 7/8 of its slots full).
  static const size_t kEntryOverhead;
  // Bytes an entry with a `value_bytes` value and an `owner_bytes` key id is charged.
  static size_t EntryCost(size_t value_bytes, size_t owner_bytes) {
    return value_bytes + owner_bytes + kEntryOverhead;
  }

  // The clock `max_age` runs on without MemoOptions::clock: CLOCK_BOOTTIME where there is one
  // (it counts time asleep), else steady_clock.
  static absl::Duration SystemClock();
  // The POSIX clock SystemClock reads (CLOCK_BOOTTIME where defined); -1: steady_clock.
  static int SystemClockId();

  // Read it before the RPC whose answer will be inserted, and pass it to Insert: the insert
  // is ignored if its owner was dropped, or the memo cleared, after it was read.
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);

  // If `key` names an entry younger than the maximum age: copies its value into `*value` (when
  // not null) and its key version into `*key_version` (when not null), moves it to the newest
  // end, and returns true. Otherwise false (a miss; an expired entry is removed).
  bool Lookup(const Digest& key, std::string* value, uint32_t* key_version)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Remembers `value` (copied into a wiping buffer) and `key_version` under `key` for `owner`
  // (the key id; empty for none), replacing an entry of the same key. Evicts the least recently
  // used entries until it fits. Returns false, remembering nothing, when the entry alone is
  // larger than the bound or when a drop of `owner` or a Clear came after the caller read
  // `generation`.
  bool Insert(const Digest& key, absl::string_view owner, absl::string_view value,
              uint32_t key_version, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops (and wipes) every entry of `owner`. Returns how many.
  size_t DropOwner(absl::string_view owner) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops (and wipes) every entry.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  MemoStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry;
  using Iterator = std::list<Entry>::iterator;
  struct Entry {
    Digest key;
    std::string owner;
    SecretBytes value;
    uint32_t key_version = 0;
    size_t cost = 0;
    absl::Duration inserted;                // on options_.clock
    std::list<Iterator>::iterator age_pos;  // this entry's place in by_age_
  };
  struct DigestHash {
    size_t operator()(const Digest& d) const {
      size_t h;
      std::memcpy(&h, d.data(), sizeof(h));  // the digest is uniformly random already
      return h;
    }
  };

  absl::Duration Now() const;
  // True if no drop of `owner` and no Clear came after `generation` was read.
  bool CurrentLocked(absl::string_view owner, uint64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `it` into `*dropped` (destroyed, and its value wiped, after the lock is released).
  void RemoveLocked(Iterator it, std::list<Entry>* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entries whose maximum age has run out at `now`.
  void SweepLocked(absl::Duration now, std::list<Entry>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MemoOptions options_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // newest first
  // Oldest insert first: with one maximum age for every entry, also the order they expire in.
  std::list<Iterator> by_age_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Digest, Iterator, DigestHash> index_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The generation of each key id's last drop, and the one below which no insert is current
  // (the last Clear, or when the map had to be forgotten: kMaxDropsKept key ids, since the ids
  // come from callers).
  static constexpr size_t kMaxDropsKept = 1024;
  absl::flat_hash_map<std::string, uint64_t> dropped_at_ ABSL_GUARDED_BY(mu_);
  uint64_t current_from_ ABSL_GUARDED_BY(mu_) = 0;
  MemoStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::client

#endif  // CLIENT_CPP_MEMO_H_
