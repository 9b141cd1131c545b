// The answers of gRPC (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) and
// gRPC-Web (doc/PROTOCOL-WEB.md), one mapping with a web flag as connect-go has it: a success is
// one length-prefixed message then the status (in HTTP/2 trailers for gRPC, in a trailer frame
// of the body for gRPC-Web, all of it base64 for gRPC-Web text); an error is Trailers-Only (HTTP
// 200, the status in the only HEADERS). Their request side (content types, grpc-timeout, frames)
// is in protocol.h. Pure functions: answer_test.cc.
//
//   Answer a = GrpcSuccess(type, std::move(message), /*gzip=*/true);
//   Answer e = GrpcError(type, absl::NotFoundError("key k: not found"), 0);
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_GRPC_H_
#define SERVICE_HTTP_GRPC_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "service/http/answer.h"
#include "service/http/protocol.h"

namespace offload::http {

// What the gRPC answers say we take (grpc-accept-encoding).
inline constexpr absl::string_view kGrpcAcceptEncoding = "identity,gzip";

// The trailers that end a gRPC stream with `status`: grpc-status, grpc-message (percent-encoded)
// when there is one, and the status's details (AppendGrpcStatusDetails: when to come back).
HeaderList GrpcTrailers(const absl::Status& status);

// An error as Trailers-Only: HTTP 200, `content_type`, the status in the only HEADERS frame.
Answer TrailersOnly(const absl::Status& status, absl::string_view content_type);
// The same, saying which encodings we take (grpc-accept-encoding): gRPC's own.
Answer GrpcTrailersOnly(const absl::Status& status, absl::string_view content_type);

// A successful unary answer to a request of `type` (gRPC or gRPC-Web): `message` in one frame,
// flagged compressed (and grpc-encoding: gzip) when `gzip`; gRPC's status in trailers,
// gRPC-Web's in a trailer frame after it (never compressed); gRPC-Web text base64 as a whole.
Answer GrpcSuccess(const ContentType& type, std::string message, bool gzip);

// A gRPC answer's message up to this size is copied behind its frame header (cheaper than a
// shared piece of its own); a larger one is sent from its own buffer (Answer::shared_body).
inline constexpr size_t kCopyAtMost = 4096;

// [issue 34] A successful unary answer to a request of `type` (gRPC, or gRPC-Web binary) whose
// message is `head`, `body` (not copied; kept alive by `owner`), then `tail`, uncompressed: the
// frame header and `head` in the body, then `body` and `tail` (and gRPC-Web's trailer frame) as
// shared pieces. The bytes are those GrpcSuccess writes for that message uncompressed.
Answer GrpcSharedSuccess(const ContentType& type, std::string head, absl::string_view body,
                         std::string tail, std::shared_ptr<const void> owner);

// A unary error for a request of `type`: Trailers-Only (gRPC with grpc-accept-encoding).
// `http_status` (gRPC only, 0: none) answers below gRPC in plain HTTP: 505 for HTTP/1.1.
Answer GrpcError(const ContentType& type, const absl::Status& status, int http_status);

}  // namespace offload::http

#endif  // SERVICE_HTTP_GRPC_H_
