// A key-encryption key that never leaves a PKCS#11 token (an HSM, a cloud HSM's PKCS#11 library,
// or SoftHSM2): an AES-256 secret key object with CKA_SENSITIVE=true and CKA_EXTRACTABLE=false.
// The envelopes' per-blob data keys (envelope.h) are encrypted and decrypted by the token with
// CKM_AES_GCM; the KEK's bytes are never seen by this process.
//
//   OFFLOAD_ASSIGN_OR_RETURN(auto token, Pkcs11Token::Open({
//       .uri = "pkcs11:token=offload;object=offload-kek?module-path=/usr/lib/softhsm/libsofthsm2.so"
//              "&pin-source=/etc/offload/pin"}));
//   OFFLOAD_ASSIGN_OR_RETURN(auto ring, KekRing::Create(nullptr, {}, token));
//
// The URI (RFC 7512) selects:
//   the module  `module-path` (a library loaded directly), else every module registered with
//               p11-kit (/usr/share/p11-kit/modules), narrowed by `module-name`;
//   the token   `token`, `serial`, `manufacturer`, `model`, `slot-id` (one token must match);
//   the keys    `object` (the label, default "offload-kek"; [A-Za-z0-9._-], at most 64) and,
//               optionally, `id` (pins one key; without it the key with the greatest CKA_ID is
//               current, which is how rotation works: see GenerateKek);
//   the PIN     `pin-value`, or `pin-source` (a file path or file: URI); else the file
//               `pin_file`, else the environment variable `pin_env`.
// A KEK is named "pkcs11:<label>/<CKA_ID in hex>" in the envelopes it wraps; an envelope naming
// another key of the token (an older generation, or another label) is opened with that key.
// Thread-safety: every method may be called from any thread (one session, used under a mutex).
#ifndef SERVICE_KEYS_PKCS11_KEK_H_
#define SERVICE_KEYS_PKCS11_KEK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/common/secure_memory.h"
#include "service/keys/kek.h"

namespace offload::keys {

inline constexpr char kDefaultPkcs11PinEnvVar[] = "OFFLOAD_KEK_PKCS11_PIN";
inline constexpr char kDefaultPkcs11KekLabel[] = "offload-kek";

struct Pkcs11KekOptions {
  std::string uri;       // RFC 7512 PKCS#11 URI, see above
  std::string pin_file;  // used when the URI carries no PIN; trailing newline ignored
  std::string pin_env = kDefaultPkcs11PinEnvVar;  // used when neither the URI nor pin_file does
  // The URI's pin-value, taken out of it (TakePinValue) so that no copy of the URI holds the
  // PIN: it counts as the URI's pin-value (before pin-source, pin_file and pin_env).
  KeyBytes pin;
};

// Takes every `pin-value=` attribute out of the NUL-terminated PKCS#11 URI `uri`, in place: the
// attribute and one separator are removed, the rest moves left, and the freed tail is wiped
// (zeros), so a command-line argument (/proc/PID/cmdline, `ps`) or a string no longer shows the
// PIN. The last value, percent-decoded, goes into `*pin`; `*pin` is untouched when there is none.
// Returns whether one was taken; InvalidArgument (never quoting the PIN) for a bad
// percent-encoding, the URI then left wiped from the attribute on.
absl::StatusOr<bool> TakePinValue(char* uri, KeyBytes* pin);

namespace internal {
class Pkcs11Session;
struct Pkcs11TokenState;
}  // namespace internal

class Pkcs11Token final : public KekResolver {
 public:
  // Loads the module, finds the token and logs in. Errors name the problem, never the PIN:
  // InvalidArgument for a bad URI; NotFound when no token matches (the message lists the tokens
  // present) or the module cannot be loaded; PermissionDenied for a wrong PIN; FailedPrecondition
  // for a locked PIN, several matching tokens, or no PIN.
  static absl::StatusOr<std::shared_ptr<Pkcs11Token>> Open(const Pkcs11KekOptions& options);
  ~Pkcs11Token() override;

  // The key of the URI's label with the greatest CKA_ID (or the URI's `id`). NotFound when the
  // token holds none; FailedPrecondition for a key that is not AES-256, is extractable or is not
  // sensitive.
  absl::StatusOr<std::shared_ptr<const Kek>> ResolveCurrent() override;
  // The key named "pkcs11:<label>/<hex id>" in this token; NotFound if there is none.
  absl::StatusOr<std::shared_ptr<const Kek>> Resolve(absl::string_view name) override;
  std::string Describe() const override;

  // Generates inside the token (C_GenerateKey, CKM_AES_KEY_GEN) a new AES-256 KEK with the URI's
  // label and the next generation's CKA_ID (8 bytes, big-endian: 1 more than the greatest
  // there), persistent, private, sensitive, not extractable. It becomes the current KEK of every
  // process that refreshes (KekRing::Refresh). Returns its name.
  absl::StatusOr<std::string> GenerateKek();

 private:
  explicit Pkcs11Token(std::unique_ptr<internal::Pkcs11Session> session);
  // The session and the keys found so far; shared with the Keks handed out, which may outlive
  // this object.
  const std::shared_ptr<internal::Pkcs11TokenState> state_;
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_PKCS11_KEK_H_
