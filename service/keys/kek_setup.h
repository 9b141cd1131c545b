// Start-up wiring of the key-encryption keys: which KEK wraps new records (a raw 32-byte KEK from
// kek.h, or a key inside a PKCS#11 token from pkcs11_kek.h), which older KEKs are still read,
// and the thread that follows a rotation (a newer KEK in the token) by re-wrapping the store.
//
//   KekConfig config;
//   config.pkcs11_uri = flags.kek_pkcs11;           // empty: the raw KEK of config.raw
//   OFFLOAD_ASSIGN_OR_RETURN(auto ring, BuildKekRing(config, &origin));
//   auto store = FileKeyStore::Open(dir, ring);
//   auto rotator = KekRotator::Start(ring, [&] { return store->RewrapAll(); }, absl::Seconds(30));
#ifndef SERVICE_KEYS_KEK_SETUP_H_
#define SERVICE_KEYS_KEK_SETUP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/keys/kek.h"
#include "service/keys/pkcs11_kek.h"

namespace offload::keys {

struct KekConfig {
  KekSource raw;                     // the raw KEK (LoadKek) when pkcs11_uri is empty
  Pkcs11KekOptions pkcs11;           // uri empty: no token
  std::vector<std::string> previous_files;  // raw KEK files still read (never used to wrap)
};

// The ring: current = the token's current key when `config.pkcs11.uri` is set (then `raw.file`,
// if given, is read as one more previous KEK), else LoadKek(`config.raw`); previous = the files
// of `previous_files`. Errors from LoadKek / Pkcs11Token::Open, prefixed with the flag's name.
absl::StatusOr<std::shared_ptr<KekRing>> BuildKekRing(const KekConfig& config, KekOrigin* origin);

// One-shot (offload_server --kek_pkcs11_create): generates the next KEK inside the token of
// `options` and returns its name.
absl::StatusOr<std::string> CreatePkcs11Kek(const Pkcs11KekOptions& options);

// Follows KEK rotation: at start and then every `interval`, asks the ring for its current KEK
// (KekRing::Refresh) and, when it changed or a re-wrap is still due, calls `rewrap` (a store's
// RewrapAll). Failures are logged and retried at the next tick; calls keep being served
// meanwhile (every record stays readable under the KEK it names). Logs kek_rotated and
// kek_rewrapped; records the pass could not read are logged (kek_rewrap_unreadable: how many,
// their key ids, why) and tried again at the next rotation or start. Thread-safety: Start and
// the destructor from one thread.
class KekRotator {
 public:
  using Rewrap = std::function<absl::StatusOr<RewrapReport>()>;
  static std::unique_ptr<KekRotator> Start(std::shared_ptr<KekRing> ring, Rewrap rewrap,
                                           absl::Duration interval);
  // Stops the thread (waits for a running re-wrap).
  ~KekRotator();

  KekRotator(const KekRotator&) = delete;
  KekRotator& operator=(const KekRotator&) = delete;

 private:
  KekRotator(std::shared_ptr<KekRing> ring, Rewrap rewrap, absl::Duration interval);
  void Run();

  const std::shared_ptr<KekRing> ring_;
  const Rewrap rewrap_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEK_SETUP_H_
