// The Connect protocol's answers (https://connectrpc.com/docs/protocol): unary success (POST and
// GET, with a GET's cache headers), unary errors (the spec's HTTP statuses and error JSON), and
// the end-of-stream message of its streaming protocol. Its request side (content types,
// timeouts, GET queries, error names) is in protocol.h. Pure functions: answer_test.cc.
//
//   Answer a = ConnectSuccess(Codec::kProto, std::move(message), /*gzip=*/false, std::nullopt);
//   Answer e = ConnectError(absl::NotFoundError("key k: not found"), 0, /*get=*/false);  // 404
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_CONNECT_H_
#define SERVICE_HTTP_CONNECT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/http/answer.h"
#include "service/http/protocol.h"

namespace offload::http {

// The Cache-Control of a successful Connect GET answer: an immutable answer (Verify: it depends
// on its request only) is kept a year, `public` unless it is for an identified caller only
// (`private`); any other (keys change) `private, no-cache`.
std::string ConnectCacheControl(const CacheHint& hint);

// A successful unary answer: `message` in `codec`, gzipped when `gzip` (Content-Encoding). A GET
// answer (`get` set) carries its Cache-Control and Vary.
Answer ConnectSuccess(Codec codec, std::string message, bool gzip,
                      const std::optional<CacheHint>& get);

// A successful unary POST answer whose message is `head`, `body` (not copied; kept alive by
// `owner`), then `tail`, sent as it is (no compression): AEAD Open's shared plaintext.
Answer ConnectSharedSuccess(Codec codec, std::string head, absl::string_view body,
                            std::string tail, std::shared_ptr<const void> owner);

// A unary error: the spec's HTTP status for the code (or `http_status` when not 0), the error
// JSON (with the status's details), Retry-After when the status says when to come back. A GET's
// error is `no-store`.
Answer ConnectError(const absl::Status& status, int http_status, bool get);

// The streaming protocol's end-of-stream message flag, and its JSON: {} when OK, else
// {"error": <the error JSON>}.
inline constexpr uint8_t kConnectEndStream = 0x02;
std::string ConnectEndStreamJson(const absl::Status& status);

}  // namespace offload::http

#endif  // SERVICE_HTTP_CONNECT_H_
