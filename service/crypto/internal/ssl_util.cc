#include "service/crypto/internal/ssl_util.h"

#include <openssl/err.h>

#include "absl/strings/str_cat.h"

namespace offload::crypto::internal {

absl::Status OpenSslError(absl::string_view what) {
  unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  char buf[256] = "no OpenSSL error queued";
  if (code != 0) ERR_error_string_n(code, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, " failed: ", buf));
}

void ClearOpenSslErrors() { ERR_clear_error(); }

}  // namespace offload::crypto::internal
