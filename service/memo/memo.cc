#include "service/memo/memo.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace offload::memo {
namespace {

// BLAKE2b-256 over length-prefixed parts, so that no two different part lists collide by
// shifting bytes from one part into the next. The 32 per-process random bytes go into BLAKE2b's
// salt and personalisation fields rather than its key: a key costs one more 128-byte compression
// per digest (a third of a verify digest, half of a derive digest), the parameter block none.
class DigestBuilder {
 public:
  DigestBuilder(const uint8_t* salt, uint8_t domain) {
    static_assert(crypto_generichash_blake2b_SALTBYTES + crypto_generichash_blake2b_PERSONALBYTES ==
                  32);
    crypto_generichash_blake2b_init_salt_personal(&state_, nullptr, 0, 32, salt,
                                                  salt + crypto_generichash_blake2b_SALTBYTES);
    crypto_generichash_blake2b_update(&state_, &domain, 1);
  }
  DigestBuilder& Add(absl::Span<const uint8_t> part) {
    AddNumber(part.size());
    crypto_generichash_blake2b_update(&state_, part.data(), part.size());
    return *this;
  }
  DigestBuilder& AddNumber(uint64_t n) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(n >> (8 * i));
    crypto_generichash_blake2b_update(&state_, le, sizeof(le));
    return *this;
  }
  Digest Finish() {
    Digest d;
    crypto_generichash_blake2b_final(&state_, d.data(), d.size());
    return d;
  }

 private:
  crypto_generichash_blake2b_state state_;
};

enum Domain : uint8_t { kVerify = 1, kDerive = 2, kOpen = 3, kOwner = 4 };

void Accumulate(const CacheStats& s, CacheStats* total) {
  total->hits += s.hits;
  total->misses += s.misses;
  total->inserts += s.inserts;
  total->evictions += s.evictions;
  total->entries += s.entries;
  total->bytes += s.bytes;
}

}  // namespace

Memo::Memo(MemoOptions options)
    : options_(options),
      verify_({options.verify_bytes, options.shards, nullptr}),
      derive_({options.derive_bytes, options.shards, nullptr}),
      open_budget_(options.open_bytes_total) {
  randombytes_buf(salt_, sizeof(salt_));
}

Memo::~Memo() { sodium_memzero(salt_, sizeof(salt_)); }

Digest Memo::VerifyDigest(absl::Span<const uint8_t> public_key,
                          absl::Span<const uint8_t> signature,
                          absl::Span<const uint8_t> message) const {
  if (!options_.enabled) return Digest{};  // nothing is looked up or stored: no need to hash
  return DigestBuilder(salt_, kVerify).Add(public_key).Add(signature).Add(message).Finish();
}

bool Memo::VerifyHit(const Digest& digest) {
  if (!options_.enabled) return false;
  return verify_.Lookup(digest, [](const Empty&) { return true; });
}

void Memo::VerifyInsert(const Digest& digest) {
  if (!options_.enabled) return;
  verify_.Insert(digest, /*owner=*/0, Empty{}, /*charge=*/0);
}

Digest Memo::DeriveDigest(uint64_t instance, int output, absl::Span<const uint8_t> peer) const {
  if (!options_.enabled) return Digest{};
  return DigestBuilder(salt_, kDerive)
      .AddNumber(instance)
      .AddNumber(static_cast<uint64_t>(output))
      .Add(peer)
      .Finish();
}

bool Memo::DeriveLookup(const Digest& digest, absl::Span<uint8_t> out) {
  if (!options_.enabled) return false;
  return derive_.Lookup(digest, [out](const SharedKey& shared) {
    if (shared.size() != out.size()) return false;
    std::memcpy(out.data(), shared.data(), out.size());
    return true;
  });
}

void Memo::DeriveInsert(const Digest& digest, absl::string_view key_id,
                        absl::Span<const uint8_t> shared) {
  if (!options_.enabled) return;
  // The 32-byte value sits in a 32-byte slot of a no-dump slab.
  derive_.Insert(digest, OwnerTag(key_id), SharedKey(shared.begin(), shared.end()),
                 secure::AllocationSize(secure::Region::kNoDump, shared.size()));
}

Digest Memo::OpenDigest(uint64_t instance, absl::Span<const uint8_t> nonce,
                        absl::Span<const uint8_t> ciphertext_and_tag,
                        absl::Span<const uint8_t> aad) const {
  if (!options_.enabled) return Digest{};
  // The nonce and the tag identify the ciphertext under one key; the full bytes are compared on
  // a hit, so hashing them all (slower than the decryption itself) is not needed.
  const size_t tag_at = ciphertext_and_tag.size() - std::min<size_t>(16, ciphertext_and_tag.size());
  return DigestBuilder(salt_, kOpen)
      .AddNumber(instance)
      .Add(nonce)
      .Add(ciphertext_and_tag.subspan(tag_at))
      .AddNumber(ciphertext_and_tag.size())
      .Add(aad)
      .Finish();
}

bool Memo::OpenLookup(absl::string_view key_id, const Digest& digest,
                      absl::Span<const uint8_t> ciphertext_and_tag, SharedPlaintext* out) {
  if (!options_.enabled) return false;
  // The key's cache is made on first use, so that this lookup's miss is counted too.
  std::shared_ptr<OpenCache> cache = OpenCacheFor(key_id);
  return cache->Lookup(digest, [&](const std::shared_ptr<const OpenEntry>& entry) {
    const size_t stored = entry->stored.size() - entry->ciphertext_offset;
    if (stored != ciphertext_and_tag.size() ||
        std::memcmp(entry->stored.data() + entry->ciphertext_offset, ciphertext_and_tag.data(),
                    stored) != 0) {
      return false;
    }
    *out = entry->plaintext;
    return true;
  });
}

bool Memo::OpenLookup(absl::string_view key_id, const Digest& digest,
                      absl::Span<const uint8_t> ciphertext_and_tag, std::string* out) {
  SharedPlaintext hit;
  if (!OpenLookup(key_id, digest, ciphertext_and_tag, &hit)) return false;
  out->assign(reinterpret_cast<const char*>(hit->data()), hit->size());
  return true;
}

void Memo::OpenInsert(absl::string_view key_id, const Digest& digest,
                      absl::Span<const uint8_t> ciphertext_and_tag,
                      absl::Span<const uint8_t> plaintext) {
  if (!options_.enabled) return;
  std::shared_ptr<WipedBuffer> copy = WipedBuffer::Make(plaintext.size());
  if (!plaintext.empty()) std::memcpy(copy->data(), plaintext.data(), plaintext.size());
  OpenInsert(key_id, digest,
             std::string(reinterpret_cast<const char*>(ciphertext_and_tag.data()),
                         ciphertext_and_tag.size()),
             0, std::move(copy));
}

void Memo::OpenInsert(absl::string_view key_id, const Digest& digest, std::string stored,
                      size_t ciphertext_offset, SharedPlaintext plaintext) {
  if (!options_.enabled) return;
  const size_t charge = OpenCharge(stored.size(), plaintext->size());
  auto entry = std::make_shared<const OpenEntry>(
      OpenEntry{std::move(stored), ciphertext_offset, std::move(plaintext)});
  // Makes room in the key's own bound first, then takes the least recently used entries of any
  // key while the shared budget is short (LruCache::SharedBudget).
  OpenCacheFor(key_id)->Insert(digest, OwnerTag(key_id), std::move(entry), charge);
}

size_t Memo::OpenCharge(size_t stored_size, size_t plaintext_size) {
  // Both buffers (the plaintext's as laid out in no-dump memory); the shared entry and the
  // shared plaintext buffer, each with its control block; and the malloc bookkeeping of the
  // three malloc chunks.
  return stored_size + WipedBuffer::Footprint(plaintext_size) + sizeof(OpenEntry) +
         sizeof(WipedBuffer) + 2 * 16 + 3 * 16;
}

size_t Memo::OpenEntryCost(size_t stored_size, size_t plaintext_size) {
  return OpenCache::EntryCost(OpenCharge(stored_size, plaintext_size));
}

void Memo::DropKey(absl::string_view key_id) {
  derive_.EraseOwner(OwnerTag(key_id));
  std::shared_ptr<OpenCache> dropped;
  {
    absl::MutexLock lock(&open_mu_);
    auto it = open_.find(key_id);
    if (it == open_.end()) return;
    dropped = std::move(it->second);
    open_.erase(it);
    CacheStats s = dropped->Stats();
    s.entries = 0;
    s.bytes = 0;
    Accumulate(s, &open_retired_);
  }
  dropped->Clear();  // wipes now, even if a request still holds the cache
}

CacheStats Memo::open_stats() const {
  CacheStats total;
  absl::MutexLock lock(&open_mu_);
  total = open_retired_;
  for (const auto& [key_id, cache] : open_) Accumulate(cache->Stats(), &total);
  total.capacity_bytes = options_.open_bytes_total;
  return total;
}

uint64_t Memo::OwnerTag(absl::string_view key_id) const {
  Digest d = DigestBuilder(salt_, kOwner)
                 .Add(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(key_id.data()),
                                          key_id.size()))
                 .Finish();
  uint64_t tag;
  std::memcpy(&tag, d.data(), sizeof(tag));
  return tag;
}

std::shared_ptr<Memo::OpenCache> Memo::FindOpenCache(absl::string_view key_id) {
  absl::ReaderMutexLock lock(&open_mu_);
  auto it = open_.find(key_id);
  return it == open_.end() ? nullptr : it->second;
}

std::shared_ptr<Memo::OpenCache> Memo::OpenCacheFor(absl::string_view key_id) {
  if (auto cache = FindOpenCache(key_id)) return cache;
  absl::MutexLock lock(&open_mu_);
  auto& slot = open_[key_id];
  if (slot == nullptr) {
    // One shard: a key's hot set up to its whole bound stays (shards would each get a slice),
    // and the lock is held only for the ciphertext comparison.
    slot = std::make_shared<OpenCache>(
        OpenCache::Options{options_.open_bytes_per_key, 1, &open_budget_});
  }
  return slot;
}

}  // namespace offload::memo
