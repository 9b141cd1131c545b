// Who may use which key for what: the grants of an mTLS deployment, read from a JSON file.
//
//   {
//     "admins": ["ops-admin"],                 // may create, import, rotate, delete, get, list
//     "open_verify": true,                     // Ed25519 Verify of caller-supplied public keys:
//                                              // any authenticated client (default true)
//     "grants": [
//       {"client": "app-a", "keys": ["app-a-*", "shared"], "operations": ["aead.*", "ed25519.sign"]},
//       {"client": "*.edge.example", "keys": ["edge-*"], "operations": ["x25519.derive", "box.*"]}
//     ]
//   }
//
// Clients, key ids and operations are shell-style patterns (fnmatch: `*`, `?`, `[...]`).
// Operations (named per RPC by service/api/methods.h, the one list of methods; this folder lists
// none): keys.create keys.import keys.rotate keys.delete keys.restore keys.disable
// keys.enable keys.configure keys.get keys.list ed25519.sign ed25519.verify x25519.derive box.seal
// box.open aead.seal aead.open aead.rewrap (a batch RPC is its single twin's operation; DeleteKey
// and DestroyKeyVersion are keys.delete, CancelKeyDeletion and RestoreKeyVersion keys.restore,
// DisableKey(Version) keys.disable, EnableKey(Version) keys.enable, SetMinDecryptionVersion
// keys.configure). The key-management operations are for admins; a grant may also give
// keys.get (on its keys) and keys.list.
//
//   auth::OperationMap operations = api::PolicyOperations();   // every RPC's operation
//   absl::StatusOr<Policy> policy = Policy::Parse(json_text, operations);
//   absl::Status s = policy->Check("app-a", operations.at("/offload.v1.AeadService/Open"),
//                                  {"app-a-1"});
//
// Thread-safety: immutable after Parse.
#ifndef SERVICE_AUTH_POLICY_H_
#define SERVICE_AUTH_POLICY_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offload::auth {

// The operation an RPC performs, e.g. {"aead.open", false} for AeadService/BatchOpen.
struct Operation {
  std::string name;
  bool admin = false;       // create, import, rotate, delete
  bool uses_key = true;     // false for keys.list and for Verify without a key id
};

// Every RPC's operation by its path ("/offload.v1.AeadService/BatchOpen" -> aead.open), as
// api::PolicyOperations() builds it from the method list.
using OperationMap = absl::flat_hash_map<std::string, Operation>;

// The operation of the RPC at `path` in `operations`, or NotFound.
absl::StatusOr<Operation> OperationOf(const OperationMap& operations, absl::string_view path);

class Policy {
 public:
  // InvalidArgument naming the offending field for malformed JSON, or for an operation pattern
  // that matches none of `operations`.
  static absl::StatusOr<Policy> Parse(absl::string_view json, const OperationMap& operations);

  // OK if `identity` may perform `op` on every key in `key_ids`; PermissionDenied naming the
  // first key (or the operation) that is not granted otherwise.
  absl::Status Check(absl::string_view identity, const Operation& op,
                     const std::vector<std::string>& key_ids) const;

  size_t grant_count() const { return grants_.size(); }

 private:
  struct Grant {
    std::string client;
    std::vector<std::string> keys;
    std::vector<std::string> operations;
  };
  bool IsAdmin(absl::string_view identity) const;
  bool Allows(const Grant& grant, absl::string_view operation, absl::string_view key_id,
              bool any_key) const;

  std::vector<std::string> admins_;
  bool open_verify_ = true;
  std::vector<Grant> grants_;
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_POLICY_H_
