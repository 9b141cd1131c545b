// Where the key-encryption key (KEK) comes from: a file, an environment variable, or, for a
// single-node setup with neither, a random key generated once into the data directory.
//
//   KekSource source;
//   source.file = flags.kek_file;          // or source.env_var, or neither
//   source.data_dir = flags.data_dir;
//   KekOrigin origin;
//   OFFLOAD_ASSIGN_OR_RETURN(SecretBytes kek, LoadKek(source, &origin));
//   if (origin.generated) LOG(WARNING) << "generated a new KEK in " << origin.description;
//
// Resolution order: `file` if set; else the variable `env_var` (OFFLOAD_KEK when empty) if it is
// set and non-empty; else <data_dir>/kek, generated (random, 64 hex characters, mode 0600, directory 0700) if
// missing and reused afterwards. A KEK file holds 32 raw bytes or 64 hex characters (surrounding
// whitespace allowed); a variable holds 64 hex characters. KEK files readable or writable by group
// or others are refused (use chmod 600, or `defaultMode: 0400` on a Kubernetes Secret volume).
// Thread-safety: LoadKek reads the environment; do not call it while another thread sets variables.
#ifndef SERVICE_KEYS_KEK_H_
#define SERVICE_KEYS_KEK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "service/common/secret_bytes.h"
#include "service/common/secure_memory.h"

namespace offload::keys {

inline constexpr char kDefaultKekEnvVar[] = "OFFLOAD_KEK";
inline constexpr char kGeneratedKekFileName[] = "kek";

struct KekSource {
  std::string file;      // path of a KEK file; takes precedence when set
  std::string env_var;   // variable name; empty means OFFLOAD_KEK
  std::string data_dir;  // where "kek" is generated / reused when neither file nor variable is given
};

// What LoadKek used, for the start-up log. Never contains key material.
struct KekOrigin {
  bool generated = false;   // true iff a new random KEK was written by this call
  std::string description;  // e.g. "file /etc/offload/kek", "environment variable OFFLOAD_KEK"
};

// Returns the 32-byte KEK. InvalidArgument for wrong length or bad hex, or when there is no file,
// no variable and no `data_dir`; NotFound for a missing `file`; PermissionDenied for an unreadable file or
// one accessible by group or others; FailedPrecondition when a KEK would have to be generated but
// <data_dir>/keys.db already exists (it was sealed under the lost KEK).
absl::StatusOr<SecretBytes> LoadKek(const KekSource& source, KekOrigin* origin = nullptr);

// One key-encryption key as the envelopes (envelope.h, format 2) use it: it wraps and unwraps the
// random 32-byte data key of each envelope, and never hands out its own bytes. Its name is public
// and is written into every envelope it wraps, so a blob says which KEK it needs.
// Thread-safety: every method may be called from any thread.
class Kek {
 public:
  // Longest name an envelope can carry.
  static constexpr size_t kMaxNameSize = 128;

  virtual ~Kek() = default;
  // e.g. "raw:1a2b3c4d5e6f7a8b" (a 32-byte KEK, by its KekId) or "pkcs11:offload-kek/01" (label
  // and CKA_ID of a key inside a PKCS#11 token). Printable ASCII, 1..kMaxNameSize characters.
  virtual const std::string& name() const = 0;
  // Size of what Wrap returns for a 32-byte data key.
  virtual size_t wrapped_size() const = 0;
  // Encrypts the 32-byte `data_key`, binding `aad`; returns wrapped_size() bytes.
  virtual absl::StatusOr<std::vector<uint8_t>> Wrap(absl::Span<const uint8_t> data_key,
                                                    absl::Span<const uint8_t> aad) const = 0;
  // Decrypts what Wrap returned under the same `aad`. DataLoss if it does not authenticate.
  virtual absl::StatusOr<SecretBytes> Unwrap(absl::Span<const uint8_t> wrapped,
                                             absl::Span<const uint8_t> aad) const = 0;
};

// The 32-byte KEK of LoadKek: wraps with XChaCha20-Poly1305 (libsodium), named "raw:<KekIdHex>".
class RawKek final : public Kek {
 public:
  // InvalidArgument unless `key` is 32 bytes.
  static absl::StatusOr<std::shared_ptr<const RawKek>> Create(SecretBytes key);

  const std::string& name() const override { return name_; }
  size_t wrapped_size() const override;
  absl::StatusOr<std::vector<uint8_t>> Wrap(absl::Span<const uint8_t> data_key,
                                            absl::Span<const uint8_t> aad) const override;
  absl::StatusOr<SecretBytes> Unwrap(absl::Span<const uint8_t> wrapped,
                                     absl::Span<const uint8_t> aad) const override;
  // The key itself, for envelopes of format 1 (sealed directly under it).
  const KeyBytes& key() const { return key_; }

 private:
  RawKek(const SecretBytes& key, std::string name)
      : key_(key.begin(), key.end()), name_(std::move(name)) {}
  const KeyBytes key_;  // locked memory (secure_memory.h)
  const std::string name_;
};

// Finds KEKs on demand, e.g. the keys of one label inside a PKCS#11 token (pkcs11_kek.h).
class KekResolver {
 public:
  virtual ~KekResolver() = default;
  // The KEK that new envelopes should be wrapped under now (e.g. the newest key in the token).
  virtual absl::StatusOr<std::shared_ptr<const Kek>> ResolveCurrent() = 0;
  // The KEK called `name`: NotFound if this resolver has none by that name.
  virtual absl::StatusOr<std::shared_ptr<const Kek>> Resolve(absl::string_view name) = 0;
  // For logs: e.g. "pkcs11 token offload (serial 1234), label offload-kek". Never a PIN.
  virtual std::string Describe() const = 0;
};

// What a store's RewrapAll did: records moved under the ring's current KEK, and those it could not
// read (wrapped under a KEK this process does not hold, or damaged), which stay as they are and
// are reported; the other records are re-wrapped all the same.
struct RewrapReport {
  static constexpr size_t kMaxNamed = 20;
  size_t rewrapped = 0;
  size_t unreadable = 0;
  std::vector<std::string> unreadable_keys;  // key ids of the first kMaxNamed unreadable ones
  std::string first_error;                   // why the first one could not be read
};

// The KEKs one process holds: the current one, which wraps every new envelope, and the others it
// can still open (previous raw KEKs, and any key the resolver finds by the name an envelope
// carries). Rotation: Refresh() asks the resolver for its current KEK; stores then re-wrap what
// they hold (FileKeyStore::RewrapAll, PostgresKeyStore::RewrapAll).
//
//   OFFLOAD_ASSIGN_OR_RETURN(auto ring, KekRing::Create(nullptr, {}, token));  // current from token
//   ring->Current()->name();     // "pkcs11:offload-kek/02"
//
// Thread-safety: every method may be called from any thread.
class KekRing {
 public:
  // `current` (or, when null, `resolver->ResolveCurrent()`) wraps; `previous` and whatever
  // `resolver` finds only unwrap. InvalidArgument when there is neither a current KEK nor a
  // resolver, or two different KEKs share a name.
  static absl::StatusOr<std::shared_ptr<KekRing>> Create(
      std::shared_ptr<const Kek> current, std::vector<std::shared_ptr<const Kek>> previous,
      std::shared_ptr<KekResolver> resolver = nullptr);
  // A ring of one raw 32-byte KEK (what the stores' SecretBytes constructors use).
  static absl::StatusOr<std::shared_ptr<KekRing>> FromRawKey(SecretBytes key);

  std::shared_ptr<const Kek> Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // The KEK named `name`. FailedPrecondition naming it (and the current KEK) if this process does
  // not hold it; another status if the resolver failed (e.g. Unavailable from a token).
  absl::StatusOr<std::shared_ptr<const Kek>> Find(absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the resolver for its current KEK and makes it current; true if that changed it. False
  // without a resolver.
  absl::StatusOr<bool> Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  // e.g. "current pkcs11:offload-kek/02 (pkcs11 token ...), 1 previous". Never key material.
  std::string Describe() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit KekRing(std::shared_ptr<KekResolver> resolver) : resolver_(std::move(resolver)) {}
  absl::Status AddLocked(std::shared_ptr<const Kek> kek) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<KekResolver> resolver_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Kek> current_ ABSL_GUARDED_BY(mu_);
  size_t previous_count_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const Kek>> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEK_H_
