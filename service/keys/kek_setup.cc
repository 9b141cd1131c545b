#include "service/keys/kek_setup.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"

namespace offload::keys {
namespace {

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<KekRing>> BuildKekRing(const KekConfig& config, KekOrigin* origin) {
  KekOrigin ignored;
  if (origin == nullptr) origin = &ignored;
  *origin = KekOrigin();
  std::vector<std::shared_ptr<const Kek>> previous;
  std::vector<std::string> files = config.previous_files;
  if (!config.pkcs11.uri.empty() && !config.raw.file.empty()) files.push_back(config.raw.file);
  for (const std::string& file : files) {
    if (file.empty()) continue;
    absl::StatusOr<SecretBytes> key = LoadKek({file, "", ""});
    if (!key.ok()) return Prefixed(key.status(), "previous KEK");
    OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const RawKek> kek, RawKek::Create(*std::move(key)));
    previous.push_back(std::move(kek));
  }
  if (!config.pkcs11.uri.empty()) {
    absl::StatusOr<std::shared_ptr<Pkcs11Token>> token = Pkcs11Token::Open(config.pkcs11);
    if (!token.ok()) return Prefixed(token.status(), "kek_pkcs11");
    absl::StatusOr<std::shared_ptr<KekRing>> ring =
        KekRing::Create(nullptr, std::move(previous), *token);
    if (!ring.ok()) return Prefixed(ring.status(), "kek_pkcs11");
    origin->description = (*token)->Describe();
    return ring;
  }
  OFFLOAD_ASSIGN_OR_RETURN(SecretBytes key, LoadKek(config.raw, origin));
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<const RawKek> kek, RawKek::Create(std::move(key)));
  return KekRing::Create(std::move(kek), std::move(previous));
}

absl::StatusOr<std::string> CreatePkcs11Kek(const Pkcs11KekOptions& options) {
  absl::StatusOr<std::shared_ptr<Pkcs11Token>> token = Pkcs11Token::Open(options);
  if (!token.ok()) return Prefixed(token.status(), "kek_pkcs11");
  return (*token)->GenerateKek();
}

std::unique_ptr<KekRotator> KekRotator::Start(std::shared_ptr<KekRing> ring, Rewrap rewrap,
                                              absl::Duration interval) {
  std::unique_ptr<KekRotator> rotator(
      new KekRotator(std::move(ring), std::move(rewrap), interval));
  rotator->thread_ = std::thread([r = rotator.get()] { r->Run(); });
  return rotator;
}

KekRotator::KekRotator(std::shared_ptr<KekRing> ring, Rewrap rewrap, absl::Duration interval)
    : ring_(std::move(ring)), rewrap_(std::move(rewrap)), interval_(interval) {}

KekRotator::~KekRotator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void KekRotator::Run() {
  bool rewrap_due = true;  // at start: records left under a previous KEK
  for (;;) {
    absl::StatusOr<bool> changed = ring_->Refresh();
    if (!changed.ok()) {
      Log(LogLevel::kWarning, "kek_refresh_failed", {{"error", changed.status().ToString()}});
    } else if (*changed) {
      Log(LogLevel::kInfo, "kek_rotated", {{"current", ring_->Current()->name()}});
      rewrap_due = true;
    }
    if (rewrap_due) {
      const std::string target = ring_->Current()->name();
      const absl::Time start = absl::Now();
      absl::StatusOr<RewrapReport> rewrapped = rewrap_();
      if (rewrapped.ok()) {
        rewrap_due = false;
        if (rewrapped->rewrapped > 0 || rewrapped->unreadable > 0) {
          Log(LogLevel::kInfo, "kek_rewrapped",
              {{"kek", target}, {"records", rewrapped->rewrapped},
               {"unreadable", rewrapped->unreadable},
               {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
        }
        if (rewrapped->unreadable > 0) {
          Log(LogLevel::kWarning, "kek_rewrap_unreadable",
              {{"kek", target}, {"records", rewrapped->unreadable},
               {"key_ids", rewrapped->unreadable_keys}, {"error", rewrapped->first_error},
               {"effect", "left under the KEK they name; the others were re-wrapped"}});
        }
      } else {
        Log(LogLevel::kWarning, "kek_rewrap_failed",
            {{"kek", target}, {"error", rewrapped.status().ToString()}});
      }
    }
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) return;
  }
}

}  // namespace offload::keys
