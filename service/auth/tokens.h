// Bearer tokens: JWTs (RFC 7519) in JWS compact form, checked against the public keys of a JWKS
// file (RFC 7517). A valid token names the caller: its identity claim (default `sub`) goes
// through the same grants policy as a client-certificate identity.
//
//   TokenVerifier::Options options;
//   options.jwks_file = "/etc/offload/jwks.json";   // re-read when it changes
//   options.issuer = "https://id.example";          // "iss" must equal it
//   options.audience = "crypto-offload";            // "aud" (a string or a list) must hold it
//   OFFLOAD_ASSIGN_OR_RETURN(auto tokens, TokenVerifier::Create(options));
//   if (std::optional<std::string> id = tokens->Remembered(token)) { ... }  // no signature check
//   absl::StatusOr<std::string> identity = tokens->Verify(token);           // a signature check
//
// Algorithms: EdDSA (Ed25519, RFC 8037), ES256 (P-256) and RS256 (RSA of 2,048 bits or more).
// `alg: none`, HMAC algorithms and every other algorithm are refused, and so is a key whose type
// does not fit the token's `alg` (an RSA key for an ES256 token, a public key used as an HMAC
// secret). `kid` selects the key; a token without `kid` is checked only against a JWKS of one
// key. `exp` is required, `nbf` honoured, both with `clock_skew`. ES256 and RS256 signatures are
// checked by cjose (Debian's libcjose, which does not know EdDSA), Ed25519 ones by libsodium.
//
// A verified token is remembered under a keyed hash of the token (SipHash-2-4, 128 bits, with a
// per-process random key), with
// its identity, until its `exp`, in about `remembered_bytes` (each entry is charged 160 bytes
// plus its identity; least recently used first out): a repeated token costs a hash and a lookup.
// A thread of its own looks at the JWKS file every `watch_interval`; when it changed, the keys
// are read again and everything remembered is forgotten, so a token whose key was removed is
// refused within about a second. A key the service cannot use (another curve, PS256, an RSA key
// under 2,048 bits, a malformed or short coordinate such as an EC x or y without its leading zero
// byte, ...) is skipped with a `jwks_key_skipped` warning and counted (Counts::jwks_keys_skipped)
// while the file's other keys load; a file with private or symmetric key material, with a kid
// listed twice, or with no usable key, is refused (at start: an error; later: the previous keys
// stay).
// Refusals are Unauthenticated("token <reason>: <detail>") and never quote the token.
// Thread-safety: every method may be called from any thread.
#ifndef SERVICE_AUTH_TOKENS_H_
#define SERVICE_AUTH_TOKENS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace offload::auth {

namespace internal {
struct KeySet;
}  // namespace internal

class TokenVerifier final {
 public:
  struct Options {
    std::string jwks_file;
    std::string issuer;
    std::string audience;
    std::string identity_claim = "sub";
    // Prepended to every token identity ("jwt:" makes them unlike any certificate identity, so a
    // policy can tell them apart); empty: the claim's value as it is.
    std::string identity_prefix;
    absl::Duration clock_skew = absl::Seconds(60);
    size_t max_token_bytes = 8 << 10;
    size_t remembered_bytes = 4 << 20;
    std::function<absl::Time()> clock;  // tests move time; default absl::Now
    // How often the watcher thread looks at the file; zero: no thread (tests call CheckFile).
    absl::Duration watch_interval = absl::Seconds(1);
  };
  // Why a token was refused; each is counted.
  enum class Refusal {
    kMalformed,    // not three base64url parts, header or claims not JSON objects, crit, exp
                   // missing, exp or nbf not a time in 1970-9999
    kTooLarge,     // over max_token_bytes
    kAlgorithm,    // alg none, HMAC, unknown, or not the algorithm of the selected key
    kUnknownKid,   // no key of that kid in the JWKS (or no kid, and the JWKS has several keys)
    kSignature,    // the signature does not verify
    kExpired,      // exp + skew has passed
    kNotYetValid,  // nbf - skew is still ahead
    kIssuer,       // iss missing or not the configured issuer
    kAudience,     // aud missing or not naming the configured audience
    kIdentity,     // the identity claim missing, not a string, empty or over 256 bytes
  };
  static constexpr int kRefusals = static_cast<int>(Refusal::kIdentity) + 1;
  static const char* RefusalName(Refusal refusal);

  struct Counts {
    uint64_t remembered = 0;        // tokens answered from memory
    uint64_t signature_checks = 0;  // signatures checked (valid or not)
    std::array<uint64_t, kRefusals> refused{};
    uint64_t jwks_keys_skipped = 0;  // JWKS keys passed over as unusable, summed over every read
  };

  // InvalidArgument naming the flag or the JWKS entry that cannot be used: a missing issuer or
  // audience, an unreadable file, a key that is private or symmetric, a kid listed twice, or no
  // usable key at all (unusable keys alone are skipped).
  static absl::StatusOr<std::unique_ptr<TokenVerifier>> Create(Options options);
  ~TokenVerifier();

  // The identity of `token` if it is remembered as verified and not expired; nullopt otherwise
  // (Verify it). A keyed hash and a lookup, no file access: may run on a transport thread.
  std::optional<std::string> Remembered(absl::string_view token);

  // What can be refused without a signature check: size, form, header, algorithm, kid and key
  // type. OK, or Unauthenticated (counted). Cheap: may run on a transport thread.
  absl::Status Precheck(absl::string_view token);

  // The whole check; a valid token is remembered. Its identity, or Unauthenticated (counted by
  // reason). Runs a signature check: for a worker thread.
  absl::StatusOr<std::string> Verify(absl::string_view token);

  // Looks at the JWKS file now and re-reads it if it changed (the watcher thread does this every
  // watch_interval).
  void CheckFile();

  Counts counts() const;
  size_t remembered_bytes() const;

 private:
  using Digest = std::array<uint8_t, 16>;
  struct Entry {
    std::string identity;
    absl::Time not_after;
    uint64_t generation = 0;
    std::list<Digest>::iterator lru;
  };

  // A token's parts, its header read and its key chosen (no signature checked yet).
  struct Parsed;

  explicit TokenVerifier(Options options);
  absl::Time Now() const;
  Digest DigestOf(absl::string_view token) const;
  absl::StatusOr<Parsed> Parse(absl::string_view token);
  void Watch();
  std::shared_ptr<const internal::KeySet> CurrentKeys();
  absl::Status Refuse(Refusal refusal, absl::string_view detail);
  void Remember(const Digest& digest, std::string identity, absl::Time not_after,
                uint64_t generation);
  void EraseLocked(absl::flat_hash_map<Digest, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(memo_mu_);

  const Options options_;
  std::array<uint8_t, 16> hash_key_{};  // SipHash key of the memo's digests

  absl::Mutex keys_mu_;
  std::shared_ptr<const internal::KeySet> keys_ ABSL_GUARDED_BY(keys_mu_);
  int64_t keys_stamp_ ABSL_GUARDED_BY(keys_mu_) = 0;
  // The generation of keys_, for a lookup that races with a reload.
  std::atomic<uint64_t> keys_generation_{0};

  absl::Mutex watch_mu_;
  bool stopping_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;

  mutable absl::Mutex memo_mu_;
  absl::flat_hash_map<Digest, Entry> memo_ ABSL_GUARDED_BY(memo_mu_);
  std::list<Digest> lru_ ABSL_GUARDED_BY(memo_mu_);  // front: most recently used
  size_t memo_bytes_ ABSL_GUARDED_BY(memo_mu_) = 0;
  uint64_t memo_generation_ ABSL_GUARDED_BY(memo_mu_) = 0;

  std::atomic<uint64_t> remembered_{0};
  std::atomic<uint64_t> signature_checks_{0};
  std::array<std::atomic<uint64_t>, kRefusals> refused_{};
  std::atomic<uint64_t> keys_skipped_{0};
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_TOKENS_H_
