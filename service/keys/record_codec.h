// Plaintext encoding of key records as offload.store.v1 protobuf, shared by every KeyStore backend.
//
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes plain, SerializeKeyStoreContents(records));
//   ... encrypt `plain` with SealEnvelope (envelope.h), store it ...
//   OFFLOAD_ASSIGN_OR_RETURN(std::vector<KeyRecord> back, ParseKeyStoreContents(plain));
//
// Serialised bytes contain secrets: they are produced into and read from SecretBytes, and the
// intermediate protobuf strings are wiped before they are freed. Parsing validates every record
// (ValidateKeyRecord) and fails with DataLoss on anything malformed. Thread-safety: stateless.
#ifndef SERVICE_KEYS_RECORD_CODEC_H_
#define SERVICE_KEYS_RECORD_CODEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"
#include "service/keys/key_store.h"

namespace offload::keys {

// True for the five concrete key types of offload.v1.KeyType.
bool IsKnownKeyType(v1::KeyType type);
// True for the three AEAD key types (no public key).
bool IsAeadKeyType(v1::KeyType type);

// InvalidArgument unless `record` is well formed: a valid key id, a known type, at least one
// version, versions strictly increasing and non-zero, `current_version` among them, 32-byte
// secrets, 32-byte public keys for Ed25519 / X25519 and none for AEAD types, and
// allow_zero_shared_secret only on X25519 keys. Does not check that a public key matches its
// secret (that needs the crypto library; KeyManager does it on load).
absl::Status ValidateKeyRecord(const KeyRecord& record);

// One record (e.g. one database row) and the whole file-store content. Serialising requires every
// record to pass ValidateKeyRecord; parsing fails with DataLoss unless every record does, and
// (for the contents) unless key ids are unique. Parsed contents are sorted by key id.
absl::StatusOr<SecretBytes> SerializeKeyRecord(const KeyRecord& record);
absl::StatusOr<KeyRecord> ParseKeyRecord(absl::Span<const uint8_t> bytes);
absl::StatusOr<SecretBytes> SerializeKeyStoreContents(absl::Span<const KeyRecord> records);
absl::StatusOr<std::vector<KeyRecord>> ParseKeyStoreContents(absl::Span<const uint8_t> bytes);

}  // namespace offload::keys

#endif  // SERVICE_KEYS_RECORD_CODEC_H_
