// The answers of unary calls in each protocol, as pure functions over a request's content type
// and a call's outcome: what a server writes (status, headers, body, trailers), made before any
// server is involved, so that each mapping is tested without a socket (answer_test.cc). The
// protocol files hold the details: connect.h (Connect), grpc.h (gRPC and gRPC-Web: one mapping
// with a web flag, as connect-go's), stream.h (the streaming wire of health Watch and reflection).
//
//   http::Answer a = http::UnaryError(type, absl::NotFoundError("key k: not found"), {});
//   // Connect: 404 and its error JSON; gRPC: 200 Trailers-Only, grpc-status 5; gRPC-Web: 200,
//   // grpc-status in the headers
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_ANSWER_H_
#define SERVICE_HTTP_ANSWER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/http/protocol.h"

namespace offload::http {

// An answer: status, headers (lower-case names), body, then `shared_body` (more body written
// without a copy: the views stay valid while `owner` lives), then trailers (HTTP/2 trailers, or
// the trailer fields of a chunked HTTP/1.1 body).
struct Answer {
  int status = 200;
  HeaderList headers;
  std::string body;
  std::vector<absl::string_view> shared_body;
  std::shared_ptr<const void> owner;
  HeaderList trailers;
  // `body` holds a secret (httpd::Response::secret): the engine zeroes its copies.
  bool secret = false;
};

// Sets `out`'s shared body: `body` (kept valid by `owner`), then `tail` (kept with it).
void SetSharedBody(absl::string_view body, std::string tail, std::shared_ptr<const void> owner,
                   Answer* out);

// A text/plain answer (the engine's own paths: /healthz, 404, 405, 505).
Answer PlainText(int status, absl::string_view text, HeaderList headers = {});

// What a Connect GET answer tells caches (the other protocols and POST are never cached).
struct CacheHint {
  // The answer depends on the request only (Verify): cacheable for a year, immutable.
  bool immutable = false;
  // The call carried or needed an identity: the answer is for that caller only (`private`).
  bool identified = false;
};

// The answer to a unary call of `type` that succeeded: `message` is the response message as
// EncodeResponse wrote it, gzipped when `gzip` (CompressResponse said so). `get`: a Connect
// GET's cache hint (nullopt for a POST).
Answer UnarySuccess(const ContentType& type, std::string message, bool gzip,
                    const std::optional<CacheHint>& get);

// [issue 15, 34] The answer to a unary POST of `type` in binary proto (Connect, gRPC, gRPC-Web
// binary) that succeeded, whose message is `head`, then `body` (not copied: kept valid by
// `owner` until written; under TLS, not copied before the record), then `tail`; never
// compressed. The bytes are those UnarySuccess would write for that message uncompressed.
Answer UnarySharedSuccess(const ContentType& type, std::string head, absl::string_view body,
                          std::string tail, std::shared_ptr<const void> owner);

// The answer to a unary call of `type` that failed with `status`. `http_status` (0: the
// protocol's own) answers below the protocol: gRPC over HTTP/1.1 (505), a content type nobody
// speaks (415); Connect uses it in place of its status table. `get`: a Connect GET (its errors
// are never cached).
Answer UnaryError(const ContentType& type, const absl::Status& status, int http_status,
                  bool get = false);

// The answer to a request for a method nobody serves at `path` (a POST): gRPC's UNIMPLEMENTED
// (Trailers-Only) for a gRPC content type, 505 for gRPC over HTTP/1.1 (`http2` false), else
// Connect's 404 with its error JSON.
Answer UnknownMethod(absl::string_view path, absl::string_view content_type, bool http2);

// The answer to a server reflection request that is not a stream (HTTP/1.1, not a protobuf
// POST, a unary content type): reflection is a bidirectional stream over HTTP/2 only, and each
// protocol says so in its own terms.
Answer ReflectionNotAStream(std::optional<absl::string_view> content_type, bool http2);

// What a POST of a content type nobody speaks is told it may send (Accept-Post).
inline constexpr absl::string_view kAcceptPost =
    "application/proto, application/json, application/grpc-web, application/grpc-web+proto, "
    "application/grpc-web-text, application/grpc, application/grpc+proto, application/grpc+json";

}  // namespace offload::http

#endif  // SERVICE_HTTP_ANSWER_H_
