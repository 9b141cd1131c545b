#include "service/keys/key_manager.h"

#include <algorithm>
#include <atomic>
#include <limits>
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
  key->versions.reserve(record->versions.size());
  for (size_t i = 0; i < record->versions.size(); ++i) {
    KeyVersionRecord& v = record->versions[i];
    if (i < reuse.size() && reuse[i]->version == v.version) {
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

KeyVersionRecord NewVersion(uint32_t version, SecretBytes secret) {
  KeyVersionRecord v;
  v.version = version;
  v.created_unix_seconds = absl::ToUnixSeconds(absl::Now());
  v.secret = std::move(secret);
  return v;
}

// True iff `a` and `b` hold the same key: same id, type, options, versions and secrets.
bool RecordsEqual(const KeyRecord& a, const KeyRecord& b) {
  if (a.key_id != b.key_id || a.type != b.type || a.current_version != b.current_version ||
      a.versions.size() != b.versions.size() ||
      a.options.SerializeAsString() != b.options.SerializeAsString()) {
    return false;
  }
  for (size_t i = 0; i < a.versions.size(); ++i) {
    const KeyVersionRecord& x = a.versions[i];
    const KeyVersionRecord& y = b.versions[i];
    if (x.version != y.version || x.created_unix_seconds != y.created_unix_seconds ||
        x.public_key != y.public_key || !SecretEquals(x.secret, y.secret)) {
      return false;
    }
  }
  return true;
}

SecretBytes RandomSecret() {
  SecretBytes secret(kKeySecretSize);
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
  }
  return info;
}

KeyManager::KeyManager(std::unique_ptr<KeyStore> store, crypto::BackendChoice backends)
    : store_(std::move(store)), backends_(backends) {}

absl::StatusOr<std::unique_ptr<KeyManager>> KeyManager::Create(std::unique_ptr<KeyStore> store,
                                                                crypto::BackendChoice backends) {
  if (store == nullptr) return absl::InvalidArgumentError("store: must not be null");
  OFFLOAD_RETURN_IF_ERROR(crypto::InitCrypto());
  std::unique_ptr<KeyManager> manager(new KeyManager(std::move(store), backends));
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> records, manager->store_->LoadAll());

  absl::MutexLock write_lock(&manager->write_mu_);
  absl::MutexLock lock(&manager->mu_);
  for (KeyRecord& record : records) {
    if (absl::Status s = ValidateKeyRecord(record); !s.ok()) {
      return absl::DataLossError(absl::StrCat("stored key \"", record.key_id, "\": ", s.message()));
    }
    OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key,
                             PrepareKey(&record, manager->backends_));
    if (!manager->keys_.emplace(record.key_id, std::move(key)).second) {
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
  SecretBytes secret;
  if (request.type() == v1::KEY_TYPE_ED25519) {
    if (given.size() == crypto::kEd25519NaclSecretKeySize) {
      const absl::Span<const uint8_t> seed = given.first(crypto::kEd25519SeedSize);
      OFFLOAD_ASSIGN_OR_RETURN(const auto derived, crypto::Ed25519PublicKeyFromSeed(seed));
      if (!SecretEquals(derived, given.subspan(crypto::kEd25519SeedSize))) {
        return absl::InvalidArgumentError("secret: public half does not match the seed");
      }
      secret = MakeSecret(seed);
    } else if (given.size() == crypto::kEd25519SeedSize) {
      secret = MakeSecret(given);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("secret: expected 32 or 64 bytes, got ", given.size()));
    }
  } else {
    if (given.size() != kKeySecretSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("secret: expected ", kKeySecretSize, " bytes, got ", given.size()));
    }
    secret = MakeSecret(given);
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
  if (records_.contains(record.key_id)) {
    return absl::AlreadyExistsError(absl::StrCat("key_id: \"", record.key_id, "\" already exists"));
  }
  // Prepare first: a key whose crypto objects cannot be built is never persisted.
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key, PrepareKey(&record, backends_));
  // Insert, not Put: with a shared store another replica may have created this id already.
  if (absl::Status inserted = store_->Insert(record); !inserted.ok()) {
    if (absl::IsAlreadyExists(inserted)) {
      // Its change notification has not arrived yet: catch up with the stored key now.
      absl::StatusOr<KeyRecord> stored = store_->Load(record.key_id);
      if (stored.ok()) ApplyStoredLocked(record.key_id, &*stored).IgnoreError();
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

absl::StatusOr<v1::KeyInfo> KeyManager::RotateKey(absl::string_view key_id) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  absl::MutexLock write_lock(&write_mu_);
  if (!records_.contains(key_id)) {
    // Perhaps created through another replica, its notification still on the way.
    absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
    if (!stored.ok()) return absl::IsNotFound(stored.status()) ? NotFound(key_id) : stored.status();
    OFFLOAD_RETURN_IF_ERROR(ApplyStoredLocked(key_id, &*stored).status());
  }
  auto it = records_.find(key_id);
  if (it == records_.end()) return NotFound(key_id);
  std::shared_ptr<const ManagedKey> previous = Find(key_id);
  if (previous == nullptr) return absl::InternalError("key snapshot missing for a stored record");

  // The new version is numbered after the STORED record, read and written atomically, so that two
  // replicas rotating at once make two versions instead of one overwriting the other.
  std::shared_ptr<const ManagedKey> key;
  KeyRecord updated;
  absl::Status written =
      store_->Update(key_id, [&](KeyRecord stored) -> absl::StatusOr<KeyRecord> {
        const uint32_t last = stored.versions.empty() ? 0 : stored.versions.back().version;
        if (last == std::numeric_limits<uint32_t>::max()) {
          return absl::FailedPreconditionError(
              absl::StrCat("key \"", key_id, "\": no version number left to rotate to"));
        }
        // Prepared versions are reused only when the stored record is the one we hold.
        const bool held = RecordsEqual(stored, it->second);
        stored.versions.push_back(NewVersion(last + 1, RandomSecret()));
        stored.current_version = last + 1;
        OFFLOAD_ASSIGN_OR_RETURN(
            key, PrepareKey(&stored, backends_,
                            held ? previous->versions
                                 : std::vector<std::shared_ptr<const ManagedKeyVersion>>{}));
        updated = stored;
        return stored;
      });
  if (absl::IsNotFound(written)) {
    // Deleted through another replica.
    ApplyStoredLocked(key_id, nullptr).IgnoreError();
    return NotFound(key_id);
  }
  OFFLOAD_RETURN_IF_ERROR(written);
  it->second = std::move(updated);
  {
    absl::MutexLock lock(&mu_);
    keys_[key->key_id] = key;
  }
  NotifyListeners(key_id);
  Log(LogLevel::kInfo, "key_rotated",
      {{"key_id", key->key_id}, {"type", v1::KeyType_Name(key->type)},
       {"version", key->current_version}});
  return key->Info();
}

absl::Status KeyManager::DeleteKey(absl::string_view key_id) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  absl::MutexLock write_lock(&write_mu_);
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
  Log(LogLevel::kInfo, "key_deleted", {{"key_id", std::string(key_id)}});
  return absl::OkStatus();
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
  if (it != records_.end() && RecordsEqual(it->second, *stored)) return false;
  // Nothing reused: new instances, so memo entries of the old snapshot can never match.
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const ManagedKey> key, PrepareKey(stored, backends_));
  const bool existed = it != records_.end();
  records_.insert_or_assign(std::string(key_id), std::move(*stored));
  {
    absl::MutexLock lock(&mu_);
    keys_[key->key_id] = key;
  }
  NotifyListeners(key_id);
  Log(LogLevel::kInfo, "key_reloaded",
      {{"key_id", key->key_id}, {"change", existed ? "updated" : "added"},
       {"version", key->current_version}});
  return true;
}

absl::Status KeyManager::ReloadKey(absl::string_view key_id) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(key_id));
  absl::MutexLock write_lock(&write_mu_);
  absl::StatusOr<KeyRecord> stored = store_->Load(key_id);
  if (absl::IsNotFound(stored.status())) return ApplyStoredLocked(key_id, nullptr).status();
  if (!stored.ok()) return stored.status();
  return ApplyStoredLocked(key_id, &*stored).status();
}

absl::Status KeyManager::Resync() {
  absl::MutexLock write_lock(&write_mu_);
  OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> all, store_->LoadAll());
  absl::flat_hash_set<std::string> stored_ids;
  absl::Status first_error;
  int changed = 0;
  for (KeyRecord& record : all) {
    const std::string id = record.key_id;
    stored_ids.insert(id);
    absl::StatusOr<bool> applied = ApplyStoredLocked(id, &record);
    if (!applied.ok()) {
      if (first_error.ok()) first_error = applied.status();
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
