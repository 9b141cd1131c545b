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

#include <string>

#include "absl/status/statusor.h"
#include "service/common/secret_bytes.h"

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

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEK_H_
