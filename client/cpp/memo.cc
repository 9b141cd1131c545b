#include "client/cpp/memo.h"

#include <time.h>

#include <chrono>
#include <iterator>
#include <utility>

namespace offload::client {
namespace {

// Keyed BLAKE2b-256 over a domain byte and length-prefixed parts, so that no two different part
// lists collide by shifting bytes from one part into the next.
class DigestBuilder {
 public:
  DigestBuilder(const uint8_t* key, uint8_t domain) {
    crypto_generichash_init(&state_, key, 32, 32);
    crypto_generichash_update(&state_, &domain, 1);
  }
  ~DigestBuilder() { sodium_memzero(&state_, sizeof(state_)); }
  DigestBuilder& Add(absl::string_view part) {
    AddNumber(part.size());
    crypto_generichash_update(&state_, reinterpret_cast<const unsigned char*>(part.data()),
                              part.size());
    return *this;
  }
  DigestBuilder& AddNumber(uint64_t n) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(n >> (8 * i));
    crypto_generichash_update(&state_, le, sizeof(le));
    return *this;
  }
  MemoDigester::Digest Finish() {
    MemoDigester::Digest d;
    crypto_generichash_final(&state_, d.data(), d.size());
    return d;
  }

 private:
  crypto_generichash_state state_;
};

enum Domain : uint8_t { kVerify = 1, kDerive = 2, kOpen = 3 };

}  // namespace

MemoDigester::MemoDigester() {
  static_assert(sizeof(key_) >= crypto_generichash_KEYBYTES_MIN &&
                sizeof(key_) <= crypto_generichash_KEYBYTES_MAX);
  randombytes_buf(key_, sizeof(key_));
}

MemoDigester::~MemoDigester() { sodium_memzero(key_, sizeof(key_)); }

MemoDigester::Digest MemoDigester::Verify(absl::string_view public_key,
                                          absl::string_view signature,
                                          absl::string_view message) const {
  return DigestBuilder(key_, kVerify).Add(public_key).Add(signature).Add(message).Finish();
}

MemoDigester::Digest MemoDigester::Derive(absl::string_view key_id, uint32_t key_version,
                                          v1::DeriveOutput output,
                                          absl::string_view peer_public_key) const {
  if (output == v1::DERIVE_OUTPUT_UNSPECIFIED) output = v1::DERIVE_OUTPUT_RAW;
  return DigestBuilder(key_, kDerive)
      .Add(key_id)
      .AddNumber(key_version)
      .AddNumber(static_cast<uint64_t>(static_cast<int64_t>(output)))
      .Add(peer_public_key)
      .Finish();
}

MemoDigester::Digest MemoDigester::Open(absl::string_view key_id, absl::string_view envelope,
                                        absl::string_view associated_data) const {
  return DigestBuilder(key_, kOpen).Add(key_id).Add(envelope).Add(associated_data).Finish();
}

// The Entry in a list node with its two links and a malloc chunk's 16 bytes; its iterator in the
// age list's node (likewise); two index slots of digest + iterator.
const size_t Memo::kEntryOverhead = (sizeof(Entry) + 2 * sizeof(void*) + 16) +
                                    (sizeof(Iterator) + 2 * sizeof(void*) + 16) +
                                    2 * (sizeof(Digest) + sizeof(Iterator));

Memo::Memo(MemoOptions options) : options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  stats_.capacity_bytes = static_cast<int64_t>(options_.capacity_bytes);
}

Memo::~Memo() { Clear(); }

absl::Duration Memo::Now() const { return options_.clock ? options_.clock() : SystemClock(); }

int Memo::SystemClockId() {
#ifdef CLOCK_BOOTTIME
  // steady_clock (CLOCK_MONOTONIC) stops while the machine sleeps: a phone or laptop that
  // resumes would find its entries younger than they are.
  return CLOCK_BOOTTIME;
#else
  return -1;
#endif
}

absl::Duration Memo::SystemClock() {
  timespec ts;
  if (const int id = SystemClockId(); id >= 0 && clock_gettime(id, &ts) == 0) {
    return absl::DurationFromTimespec(ts);
  }
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

bool Memo::CurrentLocked(absl::string_view owner, uint64_t generation) const {
  if (generation < current_from_) return false;
  auto it = dropped_at_.find(owner);
  return it == dropped_at_.end() || it->second <= generation;
}

uint64_t Memo::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void Memo::RemoveLocked(Iterator it, std::list<Entry>* dropped) {
  bytes_ -= it->cost;
  index_.erase(it->key);
  by_age_.erase(it->age_pos);
  dropped->splice(dropped->end(), lru_, it);
}

void Memo::SweepLocked(absl::Duration now, std::list<Entry>* dropped) {
  if (options_.max_age == absl::InfiniteDuration()) return;
  while (!by_age_.empty() && now - by_age_.front()->inserted >= options_.max_age) {
    RemoveLocked(by_age_.front(), dropped);
    ++stats_.expired;
  }
}

bool Memo::Lookup(const Digest& key, std::string* value, uint32_t* key_version) {
  std::list<Entry> dropped;  // destroyed (values wiped) after the lock is released
  absl::MutexLock lock(&mu_);
  SweepLocked(Now(), &dropped);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return false;
  }
  const Entry& e = *it->second;
  if (value != nullptr) value->assign(e.value.data(), e.value.size());
  if (key_version != nullptr) *key_version = e.key_version;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.hits;
  return true;
}

bool Memo::Insert(const Digest& key, absl::string_view owner, absl::string_view value,
                  uint32_t key_version, uint64_t generation) {
  const size_t cost = EntryCost(value.size(), owner.size());
  if (cost > options_.capacity_bytes) return false;
  // The value's wiping copy is made before the lock is taken.
  Entry entry{key, std::string(owner), SecretBytes(value.begin(), value.end()), key_version, cost,
              absl::ZeroDuration(), {}};
  std::list<Entry> dropped;
  absl::MutexLock lock(&mu_);
  if (!CurrentLocked(owner, generation)) return false;  // `entry` is wiped after the unlock
  const absl::Duration now = Now();
  SweepLocked(now, &dropped);
  bool replaced = false;
  if (auto it = index_.find(key); it != index_.end()) {
    RemoveLocked(it->second, &dropped);
    replaced = true;
  }
  while (bytes_ + cost > options_.capacity_bytes) {
    RemoveLocked(std::prev(lru_.end()), &dropped);
    ++stats_.evictions;
  }
  entry.inserted = now;
  lru_.push_front(std::move(entry));
  by_age_.push_back(lru_.begin());
  lru_.front().age_pos = std::prev(by_age_.end());
  index_.emplace(key, lru_.begin());
  bytes_ += cost;
  if (!replaced) ++stats_.inserts;
  return true;
}

size_t Memo::DropOwner(absl::string_view owner) {
  std::list<Entry> dropped;
  absl::MutexLock lock(&mu_);
  ++generation_;
  if (dropped_at_.size() >= kMaxDropsKept && !dropped_at_.contains(owner)) {
    dropped_at_.clear();  // forgotten: every insert read before now is stale, not only owner's
    current_from_ = generation_;
  }
  dropped_at_[std::string(owner)] = generation_;
  size_t n = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->owner == owner) {
      RemoveLocked(it, &dropped);
      ++n;
    }
    it = next;
  }
  stats_.dropped += static_cast<int64_t>(n);
  return n;
}

void Memo::Clear() {
  std::list<Entry> dropped;
  absl::MutexLock lock(&mu_);
  ++generation_;
  current_from_ = generation_;
  dropped_at_.clear();
  stats_.dropped += static_cast<int64_t>(lru_.size());
  index_.clear();
  by_age_.clear();
  dropped.swap(lru_);
  bytes_ = 0;
}

MemoStats Memo::Stats() const {
  absl::MutexLock lock(&mu_);
  MemoStats s = stats_;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = static_cast<int64_t>(bytes_);
  return s;
}

}  // namespace offload::client
