#include "service/keys/key_store.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/common/log.h"

namespace offload::keys {

absl::Status KeyStoreFailureForCaller(absl::string_view store, absl::string_view hidden,
                                      absl::string_view call,
                                      const absl::Status& s, KeyStoreFailure failure,
                                      absl::string_view detail) {
  if (s.ok()) return s;
  const auto log = [&](absl::string_view event) {
    Log(LogLevel::kWarning, event,
        {{"store", std::string(store)}, {"call", std::string(call)},
         {"error", std::string(s.message())}});
  };
  switch (failure) {
    case KeyStoreFailure::kUnavailable:
      log("keystore_unavailable");
      return absl::UnavailableError(
          detail.empty() ? std::string(kKeyStoreUnavailable)
                         : absl::StrCat(kKeyStoreUnavailable, ": ", detail));
    case KeyStoreFailure::kOutcomeUnknown:
      log("keystore_unavailable");
      return absl::UnknownError(absl::StrCat(kKeyStoreUnavailable, ": ", detail,
                                             " and its outcome is unknown; read the key before "
                                             "trying again"));
    case KeyStoreFailure::kOther:
      break;
  }
  const std::string prefix = absl::StrCat(hidden, ": ");
  if (!absl::StartsWith(s.message(), prefix)) return s;
  log("keystore_error");
  return absl::Status(s.code(), s.message().substr(prefix.size()));
}

}  // namespace offload::keys
