#include "service/keys/key_manager.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"
#include "service/keys/record_codec.h"

namespace offload::keys {
namespace {

absl::Status Annotate(const absl::Status& status, absl::string_view key_id, uint32_t version) {
  return absl::Status(status.code(), absl::StrCat("key \"", key_id, "\" version ", version, ": ",
                                                  status.message()));
}

absl::StatusOr<crypto::AeadAlgorithm> AeadAlgorithmFor(v1::KeyType type) {
  switch (type) {
    case v1::KEY_TYPE_CHACHA20_POLY1305:
      return crypto::AeadAlgorithm::kChaCha20Poly1305;
    case v1::KEY_TYPE_XCHACHA20_POLY1305:
      return crypto::AeadAlgorithm::kXChaCha20Poly1305;
    case v1::KEY_TYPE_AES256_GCM:
      return crypto::AeadAlgorithm::kAes256Gcm;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("type: ", static_cast<int>(type), " is not an AEAD key type"));
  }
}

crypto::Backend AeadBackendFor(const crypto::BackendChoice& backends,
                               crypto::AeadAlgorithm algorithm) {
  switch (algorithm) {
    case crypto::AeadAlgorithm::kChaCha20Poly1305:
      return backends.chacha20_poly1305;
    case crypto::AeadAlgorithm::kXChaCha20Poly1305:
      return backends.xchacha20_poly1305;
    case crypto::AeadAlgorithm::kAes256Gcm:
      return backends.aes256_gcm;
  }
  return backends.aes256_gcm;
}

crypto::Backend OtherBackend(crypto::Backend b) {
  return b == crypto::Backend::kLibsodium ? crypto::Backend::kOpenSsl : crypto::Backend::kLibsodium;
}

// Builds the crypto object of one version. When `version->public_key` is empty (a new version)
// it is filled from the secret; otherwise (a stored version) it must match the secret.
absl::StatusOr<std::shared_ptr<const ManagedKeyVersion>> PrepareVersion(
    v1::KeyType type, const crypto::BackendChoice& backends, KeyVersionRecord* version) {
  static std::atomic<uint64_t> next_instance{1};
  auto prepared = std::make_shared<ManagedKeyVersion>();
  prepared->version = version->version;
  prepared->instance = next_instance.fetch_add(1, std::memory_order_relaxed);
  prepared->created_unix_seconds = version->created_unix_seconds;
  prepared->state = version->state;
  prepared->destroy_unix_seconds = version->destroy_unix_seconds;
  if (version->state == v1::KEY_VERSION_STATE_DESTROYED) {
    prepared->public_key = version->public_key;  // kept for the record; no secret to check it by
    return std::shared_ptr<const ManagedKeyVersion>(std::move(prepared));
  }
  switch (type) {
    case v1::KEY_TYPE_ED25519: {
      OFFLOAD_ASSIGN_OR_RETURN(prepared->signer,
                               crypto::Ed25519Signer::FromSeed(backends.ed25519_sign, version->secret));
      const auto& pk = prepared->signer->public_key();
      prepared->public_key.assign(pk.begin(), pk.end());
      break;
    }
    case v1::KEY_TYPE_X25519: {
      OFFLOAD_ASSIGN_OR_RETURN(prepared->x25519,
                               crypto::X25519PrivateKey::FromBytes(backends.x25519, version->secret));
      const auto& pk = prepared->x25519->public_key();
      prepared->public_key.assign(pk.begin(), pk.end());
      break;
    }
    case v1::KEY_TYPE_CHACHA20_POLY1305:
    case v1::KEY_TYPE_XCHACHA20_POLY1305:
    case v1::KEY_TYPE_AES256_GCM: {
      OFFLOAD_ASSIGN_OR_RETURN(const crypto::AeadAlgorithm algorithm, AeadAlgorithmFor(type));
      const crypto::Backend backend = AeadBackendFor(backends, algorithm);
      absl::StatusOr<std::unique_ptr<crypto::Aead>> aead =
          crypto::Aead::Create(backend, algorithm, version->secret);
      if (absl::IsUnimplemented(aead.status())) {
        // E.g. libsodium AES-GCM without AES-NI: both backends give the same answers, use the other.
        aead = crypto::Aead::Create(OtherBackend(backend), algorithm, version->secret);
      }
      if (!aead.ok()) return aead.status();
      prepared->aead = std::move(*aead);
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("type: unknown key type ", static_cast<int>(type)));
  }
  if (version->public_key.empty()) {
    version->public_key = prepared->public_key;
  } else if (!SecretEquals(version->public_key, prepared->public_key)) {
    return absl::DataLossError("stored public key does not match the stored secret");
  }
  return std::shared_ptr<const ManagedKeyVersion>(std::move(prepared));
}

// A snapshot of `record`, reusing `reuse` (the already-prepared versions of the previous snapshot,
// oldest first) and preparing the rest. Fills missing public keys in `record`.
absl::StatusOr<std::shared_ptr<const ManagedKey>> PrepareKey(
    KeyRecord* record, const crypto::BackendChoice& backends,
    const std::vector<std::shared_ptr<const ManagedKeyVersion>>& reuse = {}) {
  auto key = std::make_shared<ManagedKey>();
  key->key_id = record->key_id;
  key->type = record->type;
  key->options = record->options;
  key->current_version = record->current_version;
  key->disabled = record->disabled;
  key->deletion_unix_seconds = record->deletion_unix_seconds;
  key->min_decryption_version = record->min_decryption_version;
  key->versions.reserve(record->versions.size());
  for (size_t i = 0; i < record->versions.size(); ++i) {
    KeyVersionRecord& v = record->versions[i];
    if (i < reuse.size() && reuse[i]->version == v.version && reuse[i]->state == v.state &&
        reuse[i]->destroy_unix_seconds == v.destroy_unix_seconds) {
      key->versions.push_back(reuse[i]);
      continue;
    }
    absl::StatusOr<std::shared_ptr<const ManagedKeyVersion>> prepared =
        PrepareVersion(record->type, backends, &v);
    if (!prepared.ok()) return Annotate(prepared.status(), record->key_id, v.version);
    key->versions.push_back(*std::move(prepared));
  }
  return std::shared_ptr<const ManagedKey>(std::move(key));
}

// The options of a new key without the fields this build does not know. A request may carry any
// bytes as unknown fields; stored, they would be persisted, returned to every caller of GetKey
// and ListKeys over gRPC (and dropped over JSON), and cost memory and file size for nothing.
v1::KeyOptions KnownOptions(const v1::KeyOptions& given) {
  v1::KeyOptions options = given;
  options.DiscardUnknownFields();
  return options;
}

absl::Status CheckTypeAndOptions(v1::KeyType type, const v1::KeyOptions& options) {
  if (!IsKnownKeyType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "type: expected KEY_TYPE_ED25519, KEY_TYPE_X25519, KEY_TYPE_CHACHA20_POLY1305, "
        "KEY_TYPE_XCHACHA20_POLY1305 or KEY_TYPE_AES256_GCM, got ",
        v1::KeyType_IsValid(type) ? v1::KeyType_Name(type) : absl::StrCat(static_cast<int>(type))));
  }
  if (options.allow_zero_shared_secret() && type != v1::KEY_TYPE_X25519) {
    return absl::InvalidArgumentError(
        "options.allow_zero_shared_secret: only valid for KEY_TYPE_X25519 keys");
  }
  return absl::OkStatus();
}

absl::Status NotFound(absl::string_view key_id) {
  return absl::NotFoundError(absl::StrCat("key \"", key_id, "\" not found"));
}

KeyVersionRecord NewVersion(uint32_t version, KeyBytes secret) {
  KeyVersionRecord v;
  v.version = version;
  v.created_unix_seconds = absl::ToUnixSeconds(absl::Now());
  v.secret = std::move(secret);
  return v;
}

// True iff `a` and `b` hold the same key: same id, type, options, versions and secrets.
bool RecordsEqual(const KeyRecord& a, const KeyRecord& b) {
  if (a.key_id != b.key_id || a.type != b.type || a.current_version != b.current_version ||
      a.versions.size() != b.versions.size() || a.disabled != b.disabled ||
      a.deletion_unix_seconds != b.deletion_unix_seconds ||
      a.min_decryption_version != b.min_decryption_version ||
      a.options.SerializeAsString() != b.options.SerializeAsString()) {
    return false;
  }
  for (size_t i = 0; i < a.versions.size(); ++i) {
    const KeyVersionRecord& x = a.versions[i];
    const KeyVersionRecord& y = b.versions[i];
    if (x.version != y.version || x.created_unix_seconds != y.created_unix_seconds ||
        x.state != y.state || x.destroy_unix_seconds != y.destroy_unix_seconds ||
        x.public_key != y.public_key || !SecretEquals(x.secret, y.secret)) {
      return false;
    }
  }
  return true;
}

// Wipes and frees `v`'s secret and marks it destroyed at `now` (kept if it was set already).
void DestroyVersion(KeyVersionRecord* v, int64_t now) {
  KeyBytes().swap(v->secret);
  v->state = v1::KEY_VERSION_STATE_DESTROYED;
  if (v->destroy_unix_seconds == 0) v->destroy_unix_seconds = now;
}

std::string TimeText(int64_t unix_seconds) {
  return absl::FormatTime(absl::RFC3339_sec, absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

absl::Status PendingDeletion(absl::string_view key_id, int64_t when) {
  return absl::FailedPreconditionError(absl::StrCat("key \"", key_id,
                                                    "\" is scheduled for deletion at ",
                                                    TimeText(when), " (CancelKeyDeletion keeps it)"));
}

// Returned by a change that finds nothing to do (DestroyDue's steps): nothing is written.
absl::Status NothingDue() { return absl::AbortedError("nothing due"); }

KeyBytes RandomSecret() {
  KeyBytes secret(kKeySecretSize);
  randombytes_buf(secret.data(), secret.size());
  return secret;
}

}  // namespace

const ManagedKeyVersion* ManagedKey::Version(uint32_t version) const {
  if (version == 0) version = current_version;
  auto it = std::lower_bound(versions.begin(), versions.end(), version,
                             [](const std::shared_ptr<const ManagedKeyVersion>& v, uint32_t want) {
                               return v->version < want;
                             });
  return it != versions.end() && (*it)->version == version ? it->get() : nullptr;
}

v1::KeyState ManagedKey::State() const {
  if (deletion_unix_seconds != 0) return v1::KEY_STATE_PENDING_DELETION;
  return disabled ? v1::KEY_STATE_DISABLED : v1::KEY_STATE_ENABLED;
}

absl::Status ManagedKey::CheckUsable() const {
  if (!unreadable.ok()) return unreadable;
  if (deletion_unix_seconds != 0) return PendingDeletion(key_id, deletion_unix_seconds);
  if (disabled) {
    return absl::FailedPreconditionError(
        absl::StrCat("key \"", key_id, "\" is disabled (EnableKey makes it usable)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const ManagedKeyVersion*> ManagedKey::UsableVersion(uint32_t version,
                                                                   KeyUse use) const {
  const ManagedKeyVersion* v = Version(version);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("key_version: key '", key_id, "' has no version ", version));
  }
  switch (v->state) {
    case v1::KEY_VERSION_STATE_ENABLED:
      break;
    case v1::KEY_VERSION_STATE_DESTROYED:
      return absl::FailedPreconditionError(absl::StrCat(
          "key_version: version ", v->version, " of key '", key_id, "' was destroyed at ",
          TimeText(v->destroy_unix_seconds)));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("key_version: version ", v->version, " of key '", key_id,
                       "' is disabled (EnableKeyVersion makes it usable)"));
  }
  if (use == KeyUse::kConsume && v->version < min_decryption_version) {
    return absl::FailedPreconditionError(
        absl::StrCat("key_version: version ", v->version, " of key '", key_id,
                     "' is below its min_decryption_version ", min_decryption_version,
                     " (Rewrap moves envelopes to the current version)"));
  }
  return v;
}

v1::KeyInfo ManagedKey::Info() const {
  v1::KeyInfo info;
  info.set_key_id(key_id);
  info.set_type(type);
  info.set_current_version(current_version);
  *info.mutable_options() = options;
  for (const auto& v : versions) {
    v1::KeyVersionInfo* vi = info.add_versions();
    vi->set_version(v->version);
    vi->set_public_key(v->public_key.data(), v->public_key.size());
    vi->set_created_unix_seconds(v->created_unix_seconds);
    vi->set_state(v->state);
    vi->set_destroy_unix_seconds(v->destroy_unix_seconds);
  }
  info.set_state(State());
  info.set_deletion_unix_seconds(deletion_unix_seconds);
  info.set_min_decryption_version(min_decryption_version);
  return info;
}

struct KeyManager::Reaper {
  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

KeyManager::KeyManager(std::unique_ptr<KeyStore> store, crypto::BackendChoice backends,
                       Options options)
    : store_(std::move(store)), backends_(backends), options_(std::move(options)) {}

KeyManager::~KeyManager() { StopReaper(); }

void KeyManager::StopReaper() {
  if (reaper_ == nullptr) return;
  {
    absl::MutexLock lock(&reaper_->mu);
    reaper_->stop = true;
  }
  reaper_->thread.join();
  reaper_.reset();
}

void KeyManager::StartReaper(absl::Duration interval) {
  if (reaper_ != nullptr) return;
  reaper_ = std::make_unique<Reaper>();
  reaper_->thread = std::thread([this, interval] {
    Reaper& r = *reaper_;
    while (true) {
      {
        absl::MutexLock lock(&r.mu);
        auto stopped = [&r]() ABSL_SHARED_LOCKS_REQUIRED(r.mu) { return r.stop; };
        if (r.mu.AwaitWithTimeout(absl::Condition(&stopped), interval)) return;
      }
      absl::StatusOr<int> destroyed = DestroyDue();
      if (!destroyed.ok()) {
        Log(LogLevel::kWarning, "key_destruction_failed",
            {{"error", std::string(destroyed.status().message())}});
      }
    }
  });
}

absl::StatusOr<std::unique_ptr<KeyManager>> KeyManager::Create(std::unique_ptr<KeyStore> store,
                                                                crypto::BackendChoice backends) {
  return Create(std::move(store), backends, Options());
}

absl::StatusOr<std::unique_ptr<KeyManager>> KeyManager::Create(std::unique_ptr<KeyStore> store,
                                                                crypto::BackendChoice backends,
                                                                Options options) {
  if (store == nullptr) return absl::InvalidArgumentError("store: must not be null");
  if (options.deletion_wait < absl::ZeroDuration() ||
      options.deletion_wait > kMaxDeletionWait) {
    return absl::InvalidArgumentError("deletion_wait: expected 0 to 10 years");
  }
  OFFLOAD_RETURN_IF_ERROR(crypto::InitCrypto());
  std::unique_ptr<KeyManager> manager(
      new KeyManager(std::move(store), backends, std::move(options)));
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, manager->store_->LoadAll());

  absl::MutexLock write_lock(&manager->write_mu_);
  absl::MutexLock lock(&manager->mu_);
  for (KeyRecord& record : records) {
    if (absl::Status s = ValidateKeyRecord(record); !s.ok()) {
      return absl::DataLossError(absl::StrCat("stored key \"", record.key_id, "\": ", s.message()));
    }
    OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key,
                             PrepareKey(&record, manager->backends_));
    if (manager->records_.contains(record.key_id) ||
        (!record.IsTombstone() && !manager->keys_.emplace(record.key_id, std::move(key)).second)) {
      return absl::DataLossError(
          absl::StrCat("stored key \"", record.key_id, "\" appears more than once"));
    }
    std::string id = record.key_id;
    manager->records_.emplace(std::move(id), std::move(record));
  }
  return manager;
}

absl::StatusOr<v1::KeyInfo> KeyManager::CreateKey(const v1::CreateKeyRequest& request) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(request.key_id()));
  OFFLOAD_RETURN_IF_ERROR(CheckTypeAndOptions(request.type(), request.options()));
  KeyRecord record;
  record.key_id = request.key_id();
  record.type = request.type();
  record.options = KnownOptions(request.options());
  record.current_version = 1;
  record.versions.push_back(NewVersion(1, RandomSecret()));
  return AddKey(std::move(record));
}

absl::StatusOr<v1::KeyInfo> KeyManager::ImportKey(const v1::ImportKeyRequest& request) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(request.key_id()));
  OFFLOAD_RETURN_IF_ERROR(CheckTypeAndOptions(request.type(), request.options()));
  const absl::Span<const uint8_t> given(reinterpret_cast<const uint8_t*>(request.secret().data()),
                                        request.secret().size());
  KeyBytes secret;
  if (request.type() == v1::KEY_TYPE_ED25519) {
    if (given.size() == crypto::kEd25519NaclSecretKeySize) {
      const absl::Span<const uint8_t> seed = given.first(crypto::kEd25519SeedSize);
      OFFLOAD_ASSIGN_OR_RETURN(const auto derived, crypto::Ed25519PublicKeyFromSeed(seed));
      if (!SecretEquals(derived, given.subspan(crypto::kEd25519SeedSize))) {
        return absl::InvalidArgumentError("secret: public half does not match the seed");
      }
      secret.assign(seed.begin(), seed.end());
    } else if (given.size() == crypto::kEd25519SeedSize) {
      secret.assign(given.begin(), given.end());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("secret: expected 32 or 64 bytes, got ", given.size()));
    }
  } else {
    if (given.size() != kKeySecretSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("secret: expected ", kKeySecretSize, " bytes, got ", given.size()));
    }
    secret.assign(given.begin(), given.end());
  }
  KeyRecord record;
  record.key_id = request.key_id();
  record.type = request.type();
  record.options = KnownOptions(request.options());
  record.current_version = 1;
  record.versions.push_back(NewVersion(1, std::move(secret)));
  return AddKey(std::move(record));
}

absl::StatusOr<v1::KeyInfo> KeyManager::AddKey(KeyRecord record) {
  absl::MutexLock write_lock(&write_mu_);
  // A destroyed key's tombstone does not hold its id: remove it now rather than at the reaper's
  // next round.
  if (auto held = records_.find(record.key_id);
      held != records_.end() && held->second.IsTombstone()) {
    OFFLOAD_RETURN_IF_ERROR(RemoveLocked(record.key_id));
  }
  if (records_.contains(record.key_id)) {
    return absl::AlreadyExistsError(absl::StrCat("key_id: \"", record.key_id, "\" already exists"));
  }
  // Prepare first: a key whose crypto objects cannot be built is never persisted.
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key, PrepareKey(&record, backends_));
  // Insert, not Put: with a shared store another replica may have created this id already.
  absl::Status inserted = store_->Insert(record);
  if (absl::IsAlreadyExists(inserted)) {
    // Its change notification has not arrived yet: catch up with the stored key now.
    absl::StatusOr<KeyRecord> stored = store_->Load(record.key_id);
    const bool tombstone = stored.ok() && stored->IsTombstone();
    if (stored.ok()) ApplyStoredLocked(record.key_id, &*stored).IgnoreError();
    if (tombstone && RemoveLocked(record.key_id).ok()) inserted = store_->Insert(record);
  }
  if (!inserted.ok()) {
    if (absl::IsAlreadyExists(inserted)) {
      return absl::AlreadyExistsError(
          absl::StrCat("key_id: \"", record.key_id, "\" already exists"));
    }
    return inserted;
  }
  const std::string id = record.key_id;
  records_.emplace(id, std::move(record));
  {
    absl::MutexLock lock(&mu_);
    keys_[id] = key;
  }
  Log(LogLevel::kInfo, "key_added",
      {{"key_id", id}, {"type", v1::KeyType_Name(key->type)}, {"version", key->current_version}});
  return key->Info();
}

absl::StatusOr<v1::KeyInfo> KeyManager::GetKey(absl::string_view key_id) const {
  std::shared_ptr<const ManagedKey> key = Find(key_id);
  if (key == nullptr) {
    OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
    return NotFound(key_id);
  }
  return key->Info();
}

std::vector<v1::KeyInfo> KeyManager::ListKeys() const {
  std::vector<std::shared_ptr<const ManagedKey>> keys;
  {
    absl::MutexLock lock(&mu_);
    keys.reserve(keys_.size());
    for (const auto& [id, key] : keys_) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end(),
            [](const auto& a, const auto& b) { return a->key_id < b->key_id; });
  std::vector<v1::KeyInfo> infos;
  infos.reserve(keys.size());
  for (const auto& key : keys) infos.push_back(key->Info());
  return infos;
}

absl::StatusOr<v1::KeyInfo> KeyManager::MutateKey(absl::string_view key_id,
                                                   absl::string_view event, bool reuse_prepared,
                                                   const ChangeFn& change) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  absl::MutexLock write_lock(&write_mu_);
  return MutateKeyLocked(key_id, event, reuse_prepared, change);
}

absl::StatusOr<v1::KeyInfo> KeyManager::MutateKeyLocked(absl::string_view key_id,
                                                         absl::string_view event,
                                                         bool reuse_prepared,
                                                         const ChangeFn& change) {
  if (!records_.contains(key_id)) {
    // Perhaps created through another replica, its notification still on the way.
    absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
    if (!stored.ok()) return absl::IsNotFound(stored.status()) ? NotFound(key_id) : stored.status();
    OFFLOAD_RETURN_IF_ERROR(ApplyStoredLocked(key_id, &*stored).status());
  }
  auto it = records_.find(key_id);
  if (it == records_.end()) return NotFound(key_id);
  std::shared_ptr<const ManagedKey> previous = Find(key_id);

  // The change is made to the STORED record, read and written atomically, so that two replicas
  // changing a key at once (two rotations: two versions) never overwrite each other.
  std::shared_ptr<const ManagedKey> key;
  KeyRecord updated;
  bool gone = false;  // the store holds no live key of this id
  absl::Status written =
      store_->Update(key_id, [&](KeyRecord stored) -> absl::StatusOr<KeyRecord> {
        if (stored.IsTombstone()) {
          gone = true;
          return NotFound(key_id);
        }
        // Prepared versions are reused only when the stored record is the one we hold.
        const bool held =
            reuse_prepared && previous != nullptr && RecordsEqual(stored, it->second);
        OFFLOAD_RETURN_IF_ERROR(change(&stored));
        OFFLOAD_ASSIGN_OR_RETURN(
            key, PrepareKey(&stored, backends_,
                            held ? previous->versions
                                 : std::vector<std::shared_ptr<const ManagedKeyVersion>>{}));
        updated = stored;
        return stored;
      });
  if (absl::IsNotFound(written) && (gone || key == nullptr)) {
    // Deleted through another replica (or destroyed): catch up.
    absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
    if (stored.ok()) {
      ApplyStoredLocked(key_id, &*stored).IgnoreError();
    } else if (absl::IsNotFound(stored.status())) {
      ApplyStoredLocked(key_id, nullptr).IgnoreError();
    }
    if (gone || !stored.ok()) return NotFound(key_id);
  }
  OFFLOAD_RETURN_IF_ERROR(written);
  it = records_.find(key_id);
  if (it == records_.end()) return absl::InternalError("key record vanished during a change");
  it->second = std::move(updated);
  {
    absl::MutexLock lock(&mu_);
    if (it->second.IsTombstone()) {
      keys_.erase(key_id);
    } else {
      keys_[key->key_id] = key;
    }
  }
  NotifyListeners(key_id);
  Log(LogLevel::kInfo, event,
      {{"key_id", key->key_id}, {"type", v1::KeyType_Name(key->type)},
       {"version", key->current_version}, {"state", v1::KeyState_Name(key->State())}});
  return key->Info();
}

absl::StatusOr<v1::KeyInfo> KeyManager::RotateKey(absl::string_view key_id) {
  return MutateKey(key_id, "key_rotated", /*reuse_prepared=*/true, [&](KeyRecord* stored) {
    if (stored->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, stored->deletion_unix_seconds);
    }
    if (stored->disabled) {
      return absl::FailedPreconditionError(
          absl::StrCat("key \"", key_id, "\" is disabled: enable it before rotating"));
    }
    const uint32_t last = stored->versions.empty() ? 0 : stored->versions.back().version;
    if (last == std::numeric_limits<uint32_t>::max()) {
      return absl::FailedPreconditionError(
          absl::StrCat("key \"", key_id, "\": no version number left to rotate to"));
    }
    stored->versions.push_back(NewVersion(last + 1, RandomSecret()));
    stored->current_version = last + 1;
    return absl::OkStatus();
  });
}

absl::StatusOr<absl::Duration> KeyManager::WaitFor(int64_t requested_seconds) const {
  if (requested_seconds < 0) {
    return absl::InvalidArgumentError("wait_seconds: must not be negative");
  }
  const absl::Duration wait =
      requested_seconds == 0 ? options_.deletion_wait : absl::Seconds(requested_seconds);
  if (wait < options_.deletion_wait) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait_seconds: ", requested_seconds, " is shorter than this server's ",
                     absl::ToInt64Seconds(options_.deletion_wait),
                     " (--key_deletion_wait); ask for that or more, or 0 for it"));
  }
  if (wait > kMaxDeletionWait) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_seconds: ", requested_seconds, " is more than 10 years (",
        absl::ToInt64Seconds(kMaxDeletionWait), " seconds)"));
  }
  return wait;
}

absl::StatusOr<v1::DeleteKeyResponse> KeyManager::DeleteKey(const v1::DeleteKeyRequest& request) {
  const std::string& key_id = request.key_id();
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  OFFLOAD_ASSIGN_OR_RETURN(const absl::Duration wait, WaitFor(request.wait_seconds()));
  v1::DeleteKeyResponse response;
  if (wait == absl::ZeroDuration()) {
    // No waiting period configured: destroyed at once.
    absl::MutexLock write_lock(&write_mu_);
    std::shared_ptr<const ManagedKey> key = Find(key_id);
    if (key != nullptr && key->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, key->deletion_unix_seconds);
    }
    // The store decides, not the held view: with a shared store the key may have been created or
    // deleted through another replica a moment ago.
    if (absl::Status deleted = store_->Delete(key_id); !deleted.ok()) {
      if (!absl::IsNotFound(deleted)) return deleted;
      ApplyStoredLocked(key_id, nullptr).IgnoreError();
      return NotFound(key_id);
    }
    records_.erase(key_id);
    {
      absl::MutexLock lock(&mu_);
      keys_.erase(key_id);
    }
    NotifyListeners(key_id);
    Log(LogLevel::kInfo, "key_deleted", {{"key_id", key_id}});
    response.set_deletion_unix_seconds(absl::ToUnixSeconds(Now()));
    return response;
  }
  const int64_t when = absl::ToUnixSeconds(Now() + wait + absl::Seconds(1) - absl::Nanoseconds(1));
  OFFLOAD_ASSIGN_OR_RETURN(
      *response.mutable_key(),
      MutateKey(key_id, "key_deletion_scheduled", false, [&](KeyRecord* stored) {
        if (stored->deletion_unix_seconds != 0) {
          return PendingDeletion(key_id, stored->deletion_unix_seconds);
        }
        stored->deletion_unix_seconds = when;
        return absl::OkStatus();
      }));
  response.set_deletion_unix_seconds(when);
  return response;
}

absl::Status KeyManager::DeleteKey(absl::string_view key_id) {
  v1::DeleteKeyRequest request;
  request.set_key_id(std::string(key_id));
  return DeleteKey(request).status();
}

absl::StatusOr<v1::KeyInfo> KeyManager::CancelKeyDeletion(absl::string_view key_id) {
  return MutateKey(key_id, "key_deletion_cancelled", false, [&](KeyRecord* stored) {
    if (stored->deletion_unix_seconds == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("key \"", key_id, "\" is not scheduled for deletion"));
    }
    stored->deletion_unix_seconds = 0;
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::DisableKey(absl::string_view key_id) {
  return MutateKey(key_id, "key_disabled", false, [&](KeyRecord* stored) {
    if (stored->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, stored->deletion_unix_seconds);
    }
    stored->disabled = true;
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::EnableKey(absl::string_view key_id) {
  return MutateKey(key_id, "key_enabled", false, [&](KeyRecord* stored) {
    if (stored->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, stored->deletion_unix_seconds);
    }
    stored->disabled = false;
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::MutateVersion(
    const v1::KeyVersionRequest& request, absl::string_view event,
    const std::function<absl::Status(KeyRecord*, KeyVersionRecord*)>& change) {
  if (request.version() == 0) {
    return absl::InvalidArgumentError(
        "version: expected an explicit version (the current one cannot be disabled or destroyed)");
  }
  const std::string& key_id = request.key_id();
  return MutateKey(key_id, event, false, [&](KeyRecord* stored) {
    if (stored->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, stored->deletion_unix_seconds);
    }
    for (KeyVersionRecord& v : stored->versions) {
      if (v.version != request.version()) continue;
      if (v.state == v1::KEY_VERSION_STATE_DESTROYED) {
        return absl::FailedPreconditionError(absl::StrCat(
            "version: version ", v.version, " of key \"", key_id, "\" was destroyed"));
      }
      return change(stored, &v);
    }
    return absl::NotFoundError(
        absl::StrCat("version: key \"", key_id, "\" has no version ", request.version()));
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::DisableKeyVersion(const v1::KeyVersionRequest& request) {
  return MutateVersion(request, "key_version_disabled",
                       [&](KeyRecord* stored, KeyVersionRecord* v) {
                         if (v->version == stored->current_version) {
                           return absl::FailedPreconditionError(absl::StrCat(
                               "version: ", v->version,
                               " is the current version; rotate the key first"));
                         }
                         if (v->state == v1::KEY_VERSION_STATE_ENABLED) {
                           v->state = v1::KEY_VERSION_STATE_DISABLED;
                         }
                         return absl::OkStatus();
                       });
}

absl::StatusOr<v1::KeyInfo> KeyManager::EnableKeyVersion(const v1::KeyVersionRequest& request) {
  return MutateVersion(request, "key_version_enabled", [&](KeyRecord*, KeyVersionRecord* v) {
    if (v->state == v1::KEY_VERSION_STATE_DESTROY_SCHEDULED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "version: ", v->version,
          " is scheduled for destruction; RestoreKeyVersion first"));
    }
    v->state = v1::KEY_VERSION_STATE_ENABLED;
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::DestroyKeyVersion(const v1::KeyVersionRequest& request) {
  OFFLOAD_ASSIGN_OR_RETURN(const absl::Duration wait, WaitFor(request.wait_seconds()));
  const int64_t now = absl::ToUnixSeconds(Now());
  const int64_t when = absl::ToUnixSeconds(Now() + wait + absl::Seconds(1) - absl::Nanoseconds(1));
  return MutateVersion(request, "key_version_destruction_scheduled",
                       [&](KeyRecord*, KeyVersionRecord* v) {
                         if (v->state != v1::KEY_VERSION_STATE_DISABLED) {
                           return absl::FailedPreconditionError(absl::StrCat(
                               "version: ", v->version, " is ", v1::KeyVersionState_Name(v->state),
                               "; only a disabled version can be destroyed"));
                         }
                         if (wait == absl::ZeroDuration()) {
                           DestroyVersion(v, now);
                         } else {
                           v->state = v1::KEY_VERSION_STATE_DESTROY_SCHEDULED;
                           v->destroy_unix_seconds = when;
                         }
                         return absl::OkStatus();
                       });
}

absl::StatusOr<v1::KeyInfo> KeyManager::RestoreKeyVersion(const v1::KeyVersionRequest& request) {
  return MutateVersion(request, "key_version_restored", [&](KeyRecord*, KeyVersionRecord* v) {
    if (v->state != v1::KEY_VERSION_STATE_DESTROY_SCHEDULED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "version: ", v->version, " is not scheduled for destruction"));
    }
    v->state = v1::KEY_VERSION_STATE_DISABLED;
    v->destroy_unix_seconds = 0;
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::KeyInfo> KeyManager::SetMinDecryptionVersion(
    const v1::SetMinDecryptionVersionRequest& request) {
  const std::string& key_id = request.key_id();
  return MutateKey(key_id, "key_min_decryption_version_set", false, [&](KeyRecord* stored) {
    // As every other changing call: CancelKeyDeletion must bring the key back as it was.
    if (stored->deletion_unix_seconds != 0) {
      return PendingDeletion(key_id, stored->deletion_unix_seconds);
    }
    if (stored->type == v1::KEY_TYPE_ED25519) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key \"", key_id, "\" is an Ed25519 key: min_decryption_version is for AEAD and "
          "X25519 keys"));
    }
    if (request.min_decryption_version() > stored->current_version) {
      return absl::InvalidArgumentError(absl::StrCat(
          "min_decryption_version: ", request.min_decryption_version(),
          " is above the current version ", stored->current_version));
    }
    // Lowering it is allowed while the versions it takes back in are not destroyed (the proto):
    // a destroyed version's secret is gone, and a minimum below it would promise otherwise.
    const uint32_t lowest = request.min_decryption_version();
    if (lowest < stored->min_decryption_version) {
      for (const KeyVersionRecord& v : stored->versions) {
        if (v.version >= lowest && v.version < stored->min_decryption_version &&
            v.state == v1::KEY_VERSION_STATE_DESTROYED) {
          return absl::FailedPreconditionError(absl::StrCat(
              "min_decryption_version: lowering it to ", lowest, " would take back version ",
              v.version, " of key \"", key_id, "\", which was destroyed"));
        }
      }
    }
    stored->min_decryption_version = lowest;
    return absl::OkStatus();
  });
}

absl::Status KeyManager::RemoveLocked(absl::string_view key_id) {
  // Only a tombstone, decided on the stored record: another replica may have created the id
  // anew since this one last heard of it.
  absl::Status deleted =
      store_->DeleteIf(key_id, [](const KeyRecord& stored) { return stored.IsTombstone(); });
  if (absl::IsFailedPrecondition(deleted)) {
    absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
    if (stored.ok()) return ApplyStoredLocked(key_id, &*stored).status();
    return stored.status();
  }
  if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
  records_.erase(key_id);
  {
    absl::MutexLock lock(&mu_);
    keys_.erase(key_id);
  }
  NotifyListeners(key_id);
  return absl::OkStatus();
}

absl::StatusOr<int> KeyManager::DestroyDue() {
  const int64_t now = absl::ToUnixSeconds(Now());
  absl::MutexLock write_lock(&write_mu_);
  std::vector<std::string> keys_due, versions_due, tombstones;
  for (const auto& [id, record] : records_) {
    if (record.IsTombstone()) {
      tombstones.push_back(id);
    } else if (record.deletion_unix_seconds != 0 && record.deletion_unix_seconds <= now) {
      keys_due.push_back(id);
    } else {
      for (const KeyVersionRecord& v : record.versions) {
        if (v.state == v1::KEY_VERSION_STATE_DESTROY_SCHEDULED && v.destroy_unix_seconds <= now) {
          versions_due.push_back(id);
          break;
        }
      }
    }
  }
  int destroyed = 0;
  absl::Status first_error;
  const auto note = [&first_error](const absl::Status& s) {
    if (!s.ok() && !absl::IsAborted(s) && !absl::IsNotFound(s) && first_error.ok()) {
      first_error = s;
    }
  };
  for (const std::string& id : keys_due) {
    // Wipe first (an atomic re-check of the stored record: a cancel through another replica
    // wins), then remove the tombstone.
    absl::StatusOr<v1::KeyInfo> wiped =
        MutateKeyLocked(id, "key_destroyed", false, [&](KeyRecord* stored) {
          if (stored->deletion_unix_seconds == 0 || stored->deletion_unix_seconds > now) {
            return NothingDue();
          }
          for (KeyVersionRecord& v : stored->versions) DestroyVersion(&v, now);
          return absl::OkStatus();
        });
    note(wiped.status());
    if (wiped.ok()) {
      ++destroyed;
      tombstones.push_back(id);
      NotifyDestroyed(id, {});
    } else if (absl::IsAborted(wiped.status())) {
      // The stored record differs from the held one: catch up.
      absl::StatusOr<KeyRecord> stored = store_->Load(id);
      if (stored.ok()) ApplyStoredLocked(id, &*stored).IgnoreError();
    }
  }
  for (const std::string& id : versions_due) {
    std::vector<uint32_t> versions;
    absl::StatusOr<v1::KeyInfo> wiped =
        MutateKeyLocked(id, "key_version_destroyed", false, [&](KeyRecord* stored) {
          versions.clear();
          for (KeyVersionRecord& v : stored->versions) {
            if (v.state == v1::KEY_VERSION_STATE_DESTROY_SCHEDULED &&
                v.destroy_unix_seconds <= now) {
              DestroyVersion(&v, v.destroy_unix_seconds);
              versions.push_back(v.version);
            }
          }
          return versions.empty() ? NothingDue() : absl::OkStatus();
        });
    note(wiped.status());
    if (wiped.ok()) {
      ++destroyed;
      NotifyDestroyed(id, versions);
    }
  }
  for (const std::string& id : tombstones) note(RemoveLocked(id));
  return first_error.ok() ? absl::StatusOr<int>(destroyed) : first_error;
}

absl::StatusOr<bool> KeyManager::ApplyStoredLocked(absl::string_view key_id, KeyRecord* stored) {
  auto it = records_.find(key_id);
  if (stored == nullptr) {
    if (it == records_.end()) return false;
    records_.erase(it);
    {
      absl::MutexLock lock(&mu_);
      keys_.erase(key_id);
    }
    NotifyListeners(key_id);
    Log(LogLevel::kInfo, "key_reloaded", {{"key_id", std::string(key_id)}, {"change", "deleted"}});
    return true;
  }
  if (stored->key_id != key_id) {
    return absl::DataLossError(absl::StrCat("stored key \"", key_id, "\" carries the id \"",
                                            stored->key_id, "\""));
  }
  if (absl::Status s = ValidateKeyRecord(*stored); !s.ok()) {
    return absl::DataLossError(absl::StrCat("stored key \"", key_id, "\": ", s.message()));
  }
  if (it != records_.end() && RecordsEqual(it->second, *stored)) {
    std::shared_ptr<const ManagedKey> held = Find(key_id);
    if (held == nullptr || held->unreadable.ok()) return false;
    // Readable again (the KEK is back, say): the same key, served again.
    auto copy = std::make_shared<ManagedKey>(*held);
    copy->unreadable = absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      keys_[key_id] = std::move(copy);
    }
    Log(LogLevel::kInfo, "key_readable_again", {{"key_id", std::string(key_id)}});
    return true;
  }
  // Nothing reused: new instances, so memo entries of the old snapshot can never match.
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key, PrepareKey(stored, backends_));
  const bool existed = it != records_.end();
  const bool tombstone = stored->IsTombstone();
  records_.insert_or_assign(std::string(key_id), std::move(*stored));
  {
    absl::MutexLock lock(&mu_);
    if (tombstone) {
      keys_.erase(key_id);
    } else {
      keys_[key->key_id] = key;
    }
  }
  NotifyListeners(key_id);
  Log(LogLevel::kInfo, "key_reloaded",
      {{"key_id", key->key_id}, {"change", existed ? "updated" : "added"},
       {"version", key->current_version}});
  return true;
}

namespace {
// A stored record this process cannot read (sealed under a KEK it does not hold, or corrupted),
// as opposed to a store it cannot reach for now.
bool Unreadable(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) || absl::IsDataLoss(s) || absl::IsInvalidArgument(s);
}
}  // namespace

void KeyManager::QuarantineLocked(absl::string_view key_id, const absl::Status& why) {
  std::shared_ptr<const ManagedKey> held = Find(key_id);
  if (held == nullptr || !held->unreadable.ok()) return;
  auto copy = std::make_shared<ManagedKey>(*held);
  copy->unreadable = absl::UnavailableError(
      absl::StrCat("key \"", key_id, "\" changed in the store and this server cannot read the "
                   "new record (", why.message(), "); refused until it can"));
  {
    absl::MutexLock lock(&mu_);
    keys_[key_id] = std::move(copy);
  }
  NotifyListeners(key_id);
  Log(LogLevel::kError, "key_unreadable",
      {{"key_id", std::string(key_id)}, {"error", std::string(why.message())}});
}

absl::Status KeyManager::ReloadOneLocked(absl::string_view key_id) {
  absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
  if (absl::IsNotFound(stored.status())) return ApplyStoredLocked(key_id, nullptr).status();
  if (stored.ok()) {
    absl::StatusOr<bool> applied = ApplyStoredLocked(key_id, &*stored);
    if (applied.ok() || !Unreadable(applied.status())) return applied.status();
    stored = applied.status();
  }
  // Fail closed: a change this server cannot read may be a disable or a deletion. An
  // unreachable store is not that: the held snapshot serves until the store is back.
  if (Unreadable(stored.status())) QuarantineLocked(key_id, stored.status());
  return stored.status();
}

absl::Status KeyManager::ReloadKey(absl::string_view key_id) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  absl::MutexLock write_lock(&write_mu_);
  return ReloadOneLocked(key_id);
}

absl::Status KeyManager::Resync() {
  absl::MutexLock write_lock(&write_mu_);
  absl::StatusOr<std::vector<KeyRecord>> loaded = store_->LoadAll();
  if (!loaded.ok()) {
    if (!Unreadable(loaded.status())) return loaded.status();
    // Some record cannot be read: key by key, so that only the unreadable ones are refused.
    std::vector<std::string> held;
    for (const auto& [id, record] : records_) held.push_back(id);
    // Done as far as it can be (the unreadable keys are refused): OK, so that the store's
    // listener goes on applying notifications instead of retrying this.
    for (const std::string& id : held) ReloadOneLocked(id).IgnoreError();
    Log(LogLevel::kWarning, "keys_resync_partial",
        {{"error", std::string(loaded.status().message())}});
    return absl::OkStatus();
  }
  std::vector<KeyRecord>& all = *loaded;
  absl::flat_hash_set<std::string> stored_ids;
  absl::Status first_error;
  int changed = 0;
  for (KeyRecord& record : all) {
    const std::string id = record.key_id;
    stored_ids.insert(id);
    absl::StatusOr<bool> applied = ApplyStoredLocked(id, &record);
    if (!applied.ok()) {
      if (first_error.ok()) first_error = applied.status();
      if (Unreadable(applied.status())) QuarantineLocked(id, applied.status());
    } else if (*applied) {
      ++changed;
    }
  }
  std::vector<std::string> gone;
  for (const auto& [id, record] : records_) {
    if (!stored_ids.contains(id)) gone.push_back(id);
  }
  for (const std::string& id : gone) {
    if (ApplyStoredLocked(id, nullptr).value_or(false)) ++changed;
  }
  Log(LogLevel::kInfo, "keys_resynced", {{"keys", records_.size()}, {"changed", changed}});
  return first_error;
}

std::shared_ptr<const ManagedKey> KeyManager::Find(absl::string_view key_id) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key_id);
  return it == keys_.end() ? nullptr : it->second;
}

void KeyManager::AddChangeListener(ChangeListener listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(std::move(listener));
}

void KeyManager::AddDestroyListener(DestroyListener listener) {
  absl::MutexLock lock(&mu_);
  destroy_listeners_.push_back(std::move(listener));
}

void KeyManager::NotifyDestroyed(absl::string_view key_id, const std::vector<uint32_t>& versions) {
  std::vector<DestroyListener> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = destroy_listeners_;
  }
  for (const DestroyListener& listener : listeners) listener(key_id, versions);
}

void KeyManager::NotifyListeners(absl::string_view key_id) {
  std::vector<ChangeListener> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = listeners_;
  }
  for (const ChangeListener& listener : listeners) listener(key_id);
}

size_t KeyManager::size() const {
  absl::MutexLock lock(&mu_);
  return keys_.size();
}

}  // namespace offload::keys
