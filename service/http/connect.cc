#include "service/http/connect.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace offload::http {

std::string ConnectCacheControl(const CacheHint& hint) {
  // A verify answer depends only on its request; keys change. [issue 33] An answer to a call
  // that carried or needed an identity is for that caller only: `public` would let a shared
  // cache give it to anyone (RFC 9111 3.5).
  if (!hint.immutable) return "private, no-cache";
  return absl::StrCat(hint.identified ? "private" : "public", ", max-age=31536000, immutable");
}

Answer ConnectSuccess(Codec codec, std::string message, bool gzip,
                      const std::optional<CacheHint>& get) {
  Answer out;
  out.headers.reserve(4);
  out.headers.emplace_back("content-type", std::string(ConnectContentType(codec)));
  if (gzip) out.headers.emplace_back("content-encoding", "gzip");
  if (get.has_value()) {
    out.headers.emplace_back("cache-control", ConnectCacheControl(*get));
    // Vary names Authorization, so that a cached anonymous answer is never reused for a caller
    // that sends a token.
    out.headers.emplace_back("vary", "Accept-Encoding, Authorization");
  }
  out.body = std::move(message);
  return out;
}

Answer ConnectSharedSuccess(Codec codec, std::string head, absl::string_view body,
                            std::string tail, std::shared_ptr<const void> owner) {
  Answer out;
  out.headers.emplace_back("content-type", std::string(ConnectContentType(codec)));
  out.body = std::move(head);
  SetSharedBody(body, std::move(tail), std::move(owner), &out);
  return out;
}

Answer ConnectError(const absl::Status& status, int http_status, bool get) {
  Answer out;
  out.status = http_status != 0 ? http_status : ConnectHttpStatus(status.code());
  out.headers = {{"content-type", "application/json"}};
  if (std::optional<std::string> after = RetryAfterValue(status)) {
    out.headers.emplace_back("retry-after", *std::move(after));  // a 429 or 503 refusal
  }
  if (get) out.headers.emplace_back("cache-control", "no-store");
  out.body = ConnectErrorJson(status);
  return out;
}

std::string ConnectEndStreamJson(const absl::Status& status) {
  if (status.ok()) return "{}";
  return absl::StrCat("{\"error\":", ConnectErrorJson(status), "}");
}

}  // namespace offload::http
