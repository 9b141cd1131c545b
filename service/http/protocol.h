// The wire pieces of the HTTP gateway's two protocols, free of any HTTP server: the Connect
// unary protocol (https://connectrpc.com/docs/protocol) and gRPC-Web
// (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md). Pure functions over strings,
// so that they can be tested without a socket.
//
//   absl::StatusOr<ContentType> type = ParseContentType("application/json; charset=utf-8");
//   // type->protocol == Protocol::kConnect, type->codec == Codec::kJson
//   std::string body = ConnectErrorJson(absl::NotFoundError("key k: not found"));
//   int http_status = ConnectHttpStatus(absl::StatusCode::kNotFound);   // 404
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_PROTOCOL_H_
#define SERVICE_HTTP_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace offload::http {

enum class Protocol { kConnect, kGrpcWeb };
enum class Codec { kProto, kJson };

struct ContentType {
  Protocol protocol = Protocol::kConnect;
  Codec codec = Codec::kProto;
};

// Maps a request's Content-Type (parameters such as charset ignored, case-insensitive) to a
// protocol and codec: application/proto, application/json (Connect); application/grpc-web,
// application/grpc-web+proto (gRPC-Web, binary). Anything else: InvalidArgument naming it.
absl::StatusOr<ContentType> ParseContentType(absl::string_view content_type);

// The Content-Type of a successful Connect response in `codec`.
absl::string_view ConnectContentType(Codec codec);

// Connect's name of a code ("invalid_argument", "deadline_exceeded", ...). kOk: "ok".
absl::string_view ConnectCodeName(absl::StatusCode code);

// The HTTP status Connect uses for an error with `code` (the spec's table: 400, 404, 429, ...).
int ConnectHttpStatus(absl::StatusCode code);

// The Connect error body: {"code":"<name>","message":"<message>"} (message omitted if empty).
std::string ConnectErrorJson(const absl::Status& status);

// Connect-Timeout-Ms: 1 to 10 ASCII digits. Anything else: InvalidArgument.
absl::StatusOr<absl::Duration> ParseConnectTimeout(absl::string_view value);

// grpc-timeout: 1 to 8 digits and a unit (H, M, S, m, u, n). Anything else: InvalidArgument.
absl::StatusOr<absl::Duration> ParseGrpcTimeout(absl::string_view value);

// Checks Connect-Protocol-Version: absent (nullopt) or "1" is fine, anything else is
// InvalidArgument.
absl::Status CheckConnectProtocolVersion(std::optional<absl::string_view> value);

// A content or message encoding the gateway understands.
enum class Encoding { kIdentity, kGzip };

// "identity" (or empty) and "gzip"; anything else: Unimplemented, as both specs ask.
absl::StatusOr<Encoding> ParseEncoding(absl::string_view value);

// True if an Accept-Encoding style list (`value`, comma separated, q-values ignored) names gzip.
bool AcceptsGzip(absl::string_view value);

// gzip compression of `data`.
absl::StatusOr<std::string> Gzip(absl::string_view data);
// Decompresses gzip `data`; more than `max_bytes` of output is ResourceExhausted, bad data
// InvalidArgument.
absl::StatusOr<std::string> Gunzip(absl::string_view data, size_t max_bytes);

// gRPC-Web frame flags.
inline constexpr uint8_t kFrameCompressed = 0x01;
inline constexpr uint8_t kFrameTrailer = 0x80;
inline constexpr size_t kFrameHeaderBytes = 5;

// One length-prefixed frame: flag byte, 4-byte big-endian length, payload.
std::string EncodeFrame(uint8_t flags, absl::string_view payload);

// The single message frame of a unary gRPC-Web request `body`. A body that is not exactly one
// complete data frame (truncated, trailing bytes, a trailer flag) is InvalidArgument. Sets
// `*compressed` from the frame's flag.
absl::StatusOr<absl::string_view> ParseUnaryRequestFrame(absl::string_view body, bool* compressed);

// "%"-encodes a grpc-message value: bytes outside printable ASCII and '%' itself.
std::string PercentEncode(absl::string_view message);

// The gRPC-Web trailer block "grpc-status: N\r\ngrpc-message: ...\r\n" (message omitted if empty).
std::string GrpcWebTrailers(const absl::Status& status);

}  // namespace offload::http

#endif  // SERVICE_HTTP_PROTOCOL_H_
