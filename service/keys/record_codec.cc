#include "service/keys/record_codec.h"

#include <sodium.h>

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "offload/store/v1/keystore.pb.h"
#include "service/common/status_macros.h"
#include "service/keys/key_id.h"

namespace offload::keys {
namespace {

namespace pb = ::offload::store::v1;

void WipeString(std::string* s) {
  if (!s->empty()) sodium_memzero(&(*s)[0], s->size());
}

void WipeSecrets(pb::KeyRecord* record) {
  for (pb::KeyVersionRecord& v : *record->mutable_versions()) WipeString(v.mutable_secret());
}

void WipeSecrets(pb::KeyStoreContents* contents) {
  for (pb::KeyRecord& r : *contents->mutable_keys()) WipeSecrets(&r);
}

void ToProto(const KeyRecord& record, pb::KeyRecord* out) {
  out->set_key_id(record.key_id);
  out->set_type(record.type);
  *out->mutable_options() = record.options;
  out->set_current_version(record.current_version);
  for (const KeyVersionRecord& v : record.versions) {
    pb::KeyVersionRecord* pv = out->add_versions();
    pv->set_version(v.version);
    pv->set_created_unix_seconds(v.created_unix_seconds);
    pv->set_secret(v.secret.data(), v.secret.size());
    pv->set_public_key(v.public_key.data(), v.public_key.size());
    pv->set_state(v.state);
    pv->set_destroy_unix_seconds(v.destroy_unix_seconds);
  }
  out->set_disabled(record.disabled);
  out->set_deletion_unix_seconds(record.deletion_unix_seconds);
  out->set_min_decryption_version(record.min_decryption_version);
}

// Moves `in` into a KeyRecord; the caller wipes `in` afterwards.
absl::StatusOr<KeyRecord> FromProto(const pb::KeyRecord& in) {
  KeyRecord record;
  record.key_id = in.key_id();
  record.type = in.type();
  record.options = in.options();
  record.current_version = in.current_version();
  record.versions.reserve(in.versions_size());
  for (const pb::KeyVersionRecord& pv : in.versions()) {
    KeyVersionRecord v;
    v.version = pv.version();
    v.created_unix_seconds = pv.created_unix_seconds();
    v.secret.assign(pv.secret().begin(), pv.secret().end());
    v.public_key.assign(pv.public_key().begin(), pv.public_key().end());
    v.state = pv.state() == v1::KEY_VERSION_STATE_UNSPECIFIED ? v1::KEY_VERSION_STATE_ENABLED
                                                              : pv.state();
    v.destroy_unix_seconds = pv.destroy_unix_seconds();
    record.versions.push_back(std::move(v));
  }
  record.disabled = in.disabled();
  record.deletion_unix_seconds = in.deletion_unix_seconds();
  record.min_decryption_version = in.min_decryption_version();
  absl::Status valid = ValidateKeyRecord(record);
  if (!valid.ok()) return absl::DataLossError(absl::StrCat("stored key record: ", valid.message()));
  return record;
}

template <typename Message>
absl::StatusOr<SecretBytes> SerializeToSecret(const Message& message) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat("key records: ", size, " bytes is too large"));
  }
  SecretBytes out(size);
  if (size > 0) message.SerializeWithCachedSizesToArray(out.data());
  return out;
}

template <typename Message>
absl::Status ParseFromSecret(absl::Span<const uint8_t> bytes, Message* message) {
  if (bytes.size() > static_cast<size_t>(INT_MAX) ||
      !message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("stored key records: not a valid offload.store.v1 message");
  }
  return absl::OkStatus();
}

}  // namespace

bool KeyRecord::IsTombstone() const {
  if (versions.empty()) return false;
  for (const KeyVersionRecord& v : versions) {
    if (v.state != v1::KEY_VERSION_STATE_DESTROYED) return false;
  }
  return true;
}

bool IsKnownKeyType(v1::KeyType type) {
  switch (type) {
    case v1::KEY_TYPE_ED25519:
    case v1::KEY_TYPE_X25519:
    case v1::KEY_TYPE_CHACHA20_POLY1305:
    case v1::KEY_TYPE_XCHACHA20_POLY1305:
    case v1::KEY_TYPE_AES256_GCM:
      return true;
    default:
      return false;
  }
}

bool IsAeadKeyType(v1::KeyType type) {
  return type == v1::KEY_TYPE_CHACHA20_POLY1305 || type == v1::KEY_TYPE_XCHACHA20_POLY1305 ||
         type == v1::KEY_TYPE_AES256_GCM;
}

absl::Status ValidateKeyRecord(const KeyRecord& record) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyId(record.key_id));
  if (!IsKnownKeyType(record.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("type: unknown key type ", static_cast<int>(record.type)));
  }
  if (record.options.allow_zero_shared_secret() && record.type != v1::KEY_TYPE_X25519) {
    return absl::InvalidArgumentError(
        "options.allow_zero_shared_secret: only valid for KEY_TYPE_X25519 keys");
  }
  if (record.versions.empty()) return absl::InvalidArgumentError("versions: expected at least one");
  const size_t public_size = IsAeadKeyType(record.type) ? 0 : 32;
  uint32_t previous = 0;
  bool has_current = false;
  const bool tombstone = record.IsTombstone();
  if (tombstone && record.deletion_unix_seconds == 0) {
    return absl::InvalidArgumentError(
        "versions: every version is destroyed, but the key is not scheduled for deletion");
  }
  if (record.deletion_unix_seconds < 0) {
    return absl::InvalidArgumentError("deletion_unix_seconds: must not be negative");
  }
  if (record.min_decryption_version > record.current_version) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_decryption_version: ", record.min_decryption_version,
                     " is above the current version ", record.current_version));
  }
  for (const KeyVersionRecord& v : record.versions) {
    if (v.version <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(
          "versions: expected non-zero, strictly increasing versions, got ", v.version, " after ",
          previous));
    }
    previous = v.version;
    has_current |= v.version == record.current_version;
    switch (v.state) {
      case v1::KEY_VERSION_STATE_ENABLED:
      case v1::KEY_VERSION_STATE_DISABLED:
        if (v.destroy_unix_seconds != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "version ", v.version, " destroy_unix_seconds: set on a version not being destroyed"));
        }
        break;
      case v1::KEY_VERSION_STATE_DESTROY_SCHEDULED:
      case v1::KEY_VERSION_STATE_DESTROYED:
        if (v.destroy_unix_seconds <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("version ", v.version, " destroy_unix_seconds: expected a time"));
        }
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("version ", v.version, " state: unknown ",
                                                       static_cast<int>(v.state)));
    }
    if (!tombstone && v.version == record.current_version &&
        v.state != v1::KEY_VERSION_STATE_ENABLED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "version ", v.version, " state: the current version must be enabled"));
    }
    const size_t secret_size =
        v.state == v1::KEY_VERSION_STATE_DESTROYED ? 0 : kKeySecretSize;
    if (v.secret.size() != secret_size) {
      return absl::InvalidArgumentError(absl::StrCat("version ", v.version, " secret: expected ",
                                                     secret_size, " bytes, got ",
                                                     v.secret.size()));
    }
    if (v.public_key.size() != public_size) {
      return absl::InvalidArgumentError(absl::StrCat("version ", v.version,
                                                     " public_key: expected ", public_size,
                                                     " bytes, got ", v.public_key.size()));
    }
  }
  if (!has_current) {
    return absl::InvalidArgumentError(absl::StrCat("current_version: ", record.current_version,
                                                   " is not among the versions"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SecretBytes> SerializeKeyRecord(const KeyRecord& record) {
  OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(record));
  pb::KeyRecord message;
  absl::Cleanup wipe = [&message] { WipeSecrets(&message); };
  ToProto(record, &message);
  return SerializeToSecret(message);
}

absl::StatusOr<KeyRecord> ParseKeyRecord(absl::Span<const uint8_t> bytes) {
  pb::KeyRecord message;
  absl::Cleanup wipe = [&message] { WipeSecrets(&message); };
  OFFLOAD_RETURN_IF_ERROR(ParseFromSecret(bytes, &message));
  return FromProto(message);
}

absl::StatusOr<SecretBytes> SerializeKeyStoreContents(absl::Span<const KeyRecord> records) {
  pb::KeyStoreContents message;
  absl::Cleanup wipe = [&message] { WipeSecrets(&message); };
  for (const KeyRecord& record : records) {
    OFFLOAD_RETURN_IF_ERROR(ValidateKeyRecord(record));
    ToProto(record, message.add_keys());
  }
  return SerializeToSecret(message);
}

absl::StatusOr<std::vector<KeyRecord>> ParseKeyStoreContents(absl::Span<const uint8_t> bytes) {
  pb::KeyStoreContents message;
  absl::Cleanup wipe = [&message] { WipeSecrets(&message); };
  OFFLOAD_RETURN_IF_ERROR(ParseFromSecret(bytes, &message));
  std::vector<KeyRecord> records;
  records.reserve(message.keys_size());
  absl::flat_hash_set<std::string> ids;
  for (const pb::KeyRecord& r : message.keys()) {
    OFFLOAD_ASSIGN_OR_RETURN(KeyRecord record, FromProto(r));
    if (!ids.insert(record.key_id).second) {
      return absl::DataLossError(absl::StrCat("stored key records: key id \"", record.key_id,
                                              "\" appears twice"));
    }
    records.push_back(std::move(record));
  }
  std::sort(records.begin(), records.end(),
            [](const KeyRecord& a, const KeyRecord& b) { return a.key_id < b.key_id; });
  return records;
}

}  // namespace offload::keys
