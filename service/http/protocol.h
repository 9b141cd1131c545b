// The wire pieces of the HTTP gateway's protocols, free of any HTTP server: the Connect unary
// protocol (https://connectrpc.com/docs/protocol), gRPC-Web
// (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md) and gRPC itself
// (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md). Pure functions over strings,
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
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace offload::http {

enum class Protocol { kConnect, kGrpcWeb, kGrpc };
enum class Codec { kProto, kJson };

struct ContentType {
  Protocol protocol = Protocol::kConnect;
  Codec codec = Codec::kProto;
  bool text = false;  // gRPC-Web text: the body is base64 (both ways)
};

// Maps a request's Content-Type (parameters such as charset ignored, case-insensitive) to a
// protocol and codec: application/proto, application/json (Connect); application/grpc-web,
// application/grpc-web+proto (gRPC-Web, binary); application/grpc-web-text,
// application/grpc-web-text+proto (gRPC-Web, base64); application/grpc, application/grpc+proto
// (gRPC, protobuf) and application/grpc+json (gRPC, JSON). Anything else: InvalidArgument naming
// it.
absl::StatusOr<ContentType> ParseContentType(absl::string_view content_type);

// True for a gRPC content type (application/grpc, or application/grpc+ anything), so that a
// request of an unknown method or with a codec we lack still gets a gRPC answer.
bool IsGrpcContentType(absl::string_view content_type);

// The Content-Type of a gRPC response to a request of `type`.
absl::string_view GrpcContentType(const ContentType& type);

// The Content-Type of a gRPC-Web response to a request of `type`.
absl::string_view GrpcWebContentType(const ContentType& type);

// A gRPC-Web text body: standard base64, possibly several padded chunks one after another
// (whitespace ignored). InvalidArgument when it is not base64.
absl::StatusOr<std::string> DecodeGrpcWebText(absl::string_view body);
// `bytes` as one padded base64 chunk.
std::string EncodeGrpcWebText(absl::string_view bytes);

// The Content-Type of a successful Connect response in `codec`.
absl::string_view ConnectContentType(Codec codec);

// Connect's name of a code ("invalid_argument", "deadline_exceeded", ...). kOk: "ok".
absl::string_view ConnectCodeName(absl::StatusCode code);

// The HTTP status Connect uses for an error with `code` (the spec's table: 400, 404, 429, ...).
int ConnectHttpStatus(absl::StatusCode code);

// The Connect error body: {"code":"<name>","message":"<message>","details":[...]} (message
// omitted if empty, details when `status` carries payloads: each one
// {"type":"google.rpc.RetryInfo","value":"<unpadded base64 of the message>"}, its type being the
// payload's type URL without "type.googleapis.com/", as the Connect protocol asks).
std::string ConnectErrorJson(const absl::Status& status);

// Error details (absl::Status payloads, e.g. a RetryInfo from ops/retry_delay.h) on each
// protocol:
// - grpc-status-details-bin: a google.rpc.Status (code, message, each payload as an Any) in
//   unpadded base64; empty when `status` has no payload (the header is then left out).
std::string GrpcStatusDetailsBin(const absl::Status& status);
// - the gRPC and gRPC-Web headers or trailers that carry them: grpc-status-details-bin, and with
//   `pushback` (gRPC) grpc-retry-pushback-ms, the RetryInfo delay, which gRPC clients whose retry
//   policy covers the code wait for before retrying. Nothing for a status without payloads.
void AppendGrpcStatusDetails(const absl::Status& status, bool pushback,
                             std::vector<std::pair<std::string, std::string>>* out);
// - HTTP's Retry-After (RFC 9110 10.2.3) of a Connect 429 or 503: the RetryInfo delay in whole
//   seconds, rounded up; nullopt when `status` carries none.
std::optional<std::string> RetryAfterValue(const absl::Status& status);

// Connect-Timeout-Ms: 1 to 10 ASCII digits. Anything else: InvalidArgument.
absl::StatusOr<absl::Duration> ParseConnectTimeout(absl::string_view value);

// grpc-timeout: 1 to 8 digits and a unit (H, M, S, m, u, n). Anything else: InvalidArgument.
absl::StatusOr<absl::Duration> ParseGrpcTimeout(absl::string_view value);

// Checks Connect-Protocol-Version: absent (nullopt) or "1" is fine, anything else is
// InvalidArgument.
absl::Status CheckConnectProtocolVersion(std::optional<absl::string_view> value);

// A content or message encoding the gateway understands.
enum class Encoding { kIdentity, kGzip };

// "identity" or "gzip", as the headers spell them.
absl::string_view EncodingName(Encoding encoding);

// "identity" (or empty) and "gzip"; anything else: Unimplemented, as both specs ask.
absl::StatusOr<Encoding> ParseEncoding(absl::string_view value);

// The response encoding an Accept-Encoding style list asks for, among the ones we implement
// (RFC 9110 section 12.5.3): gzip when the list accepts it (by name, "x-gzip", or "*") with a
// q-value above 0 and not below identity's; identity otherwise. "gzip;q=0", "*;q=0", an empty
// list, an absent header (nullopt) and an entry with a malformed q-value all mean identity: a
// response is compressed only when asked for. Also reads grpc-accept-encoding (a plain list).
Encoding NegotiateEncoding(std::optional<absl::string_view> accept_encoding);

// gzip compression of `data` at zlib `level` (1 fastest .. 9 smallest). Each thread keeps one
// compressor (about 270 KB) and resets it per call. InvalidArgument for a level outside 1..9.
absl::StatusOr<std::string> Gzip(absl::string_view data, int level = 1);

// Decompresses gzip `data` (one member or several, as gzip(1) writes them). The output is
// bounded by `max_bytes` before it is allocated: more is ResourceExhausted, and a stream that
// inflates beyond its own size claim (the gzip trailer's length, or over 1 MiB) is first
// counted through a 16 KiB scratch buffer and then inflated once more into a buffer of exactly
// its size, so that a bomb costs CPU up to `max_bytes` of output but no memory. Malformed or
// truncated data: InvalidArgument.
absl::StatusOr<std::string> Gunzip(absl::string_view data, size_t max_bytes);

// The order-0 entropy of `data` in bits per byte (0 .. 8), estimated on at most 4 KiB: the
// whole of a short input, else 8 slices of 512 bytes spread over it. A cheap guess of what
// gzip can save: random bytes, keys, signatures and ciphertext read ~7.9, text and JSON 4-6,
// base64 6. Costs a few microseconds whatever the size.
double SampledEntropyBits(absl::string_view data);

// A Connect unary GET (https://connectrpc.com/docs/protocol#unary-get-request): the query's
// `encoding` (proto or json, required), `message` (required, percent-encoded; URL-safe base64,
// padding optional, when `base64=1`), `compression` (identity or gzip) and `connect` (v1 when
// present). Other parameters are ignored (cache busters). InvalidArgument names the parameter;
// an unknown compression is Unimplemented. The message is at most `max_bytes` as decoded.
struct ConnectGetQuery {
  Codec codec = Codec::kProto;
  Encoding compression = Encoding::kIdentity;
  std::string message;
};
absl::StatusOr<ConnectGetQuery> ParseConnectGetQuery(absl::string_view query, size_t max_bytes);

// Decodes %XX escapes and '+' (a space, as in HTML forms). InvalidArgument on a bad escape.
absl::StatusOr<std::string> PercentDecode(absl::string_view text);

// Response headers as (lower-case name, value).
using HeaderList = std::vector<std::pair<std::string, std::string>>;

// CORS for browsers (https://fetch.spec.whatwg.org/#http-cors-protocol): a list of exact
// origins. Only a listed origin gets Access-Control-Allow-* headers; an empty list sends none
// anywhere. Preflights are answered here, never by a library.
class CorsPolicy {
 public:
  // `origins`: "scheme://host[:port]" each, no path, no wildcard. InvalidArgument names a bad one.
  static absl::StatusOr<CorsPolicy> Create(std::vector<std::string> origins);
  // A comma-separated flag value (empty items skipped).
  static absl::StatusOr<CorsPolicy> Parse(absl::string_view list);
  CorsPolicy() = default;

  bool enabled() const { return !origins_.empty(); }
  bool Allows(absl::string_view origin) const;
  const std::vector<std::string>& origins() const { return origins_; }

  // Headers for the response to a request carrying `origin` (nullopt: no Origin header).
  void AddResponseHeaders(std::optional<absl::string_view> origin, HeaderList* out) const;

  // A preflight: OPTIONS with Origin and Access-Control-Request-Method. A listed origin asking
  // for GET or POST gets 204 with the allowed methods and headers; anything else 403 with no
  // Access-Control-Allow-* header (the browser then refuses the call).
  struct Answer {
    int status = 204;
    HeaderList headers;
  };
  Answer Preflight(absl::string_view origin, absl::string_view request_method) const;

  // What browsers may send and read (Connect and gRPC-Web headers).
  static constexpr absl::string_view kAllowHeaders =
      "content-type, connect-protocol-version, connect-timeout-ms, connect-accept-encoding, "
      "connect-content-encoding, content-encoding, accept-encoding, grpc-timeout, "
      "grpc-accept-encoding, grpc-encoding, x-grpc-web, x-user-agent, x-offload-key, authorization";
  static constexpr absl::string_view kExposeHeaders =
      "grpc-status, grpc-message, grpc-status-details-bin, grpc-encoding, content-encoding, "
      "connect-content-encoding, content-length, retry-after";

 private:
  explicit CorsPolicy(std::vector<std::string> origins) : origins_(std::move(origins)) {}
  std::vector<std::string> origins_;
};

// gRPC-Web frame flags.
inline constexpr uint8_t kFrameCompressed = 0x01;
inline constexpr uint8_t kFrameTrailer = 0x80;
inline constexpr size_t kFrameHeaderBytes = 5;

// One length-prefixed frame: flag byte, 4-byte big-endian length, payload.
std::string EncodeFrame(uint8_t flags, absl::string_view payload);
// Only the 5-byte header of a frame whose payload is `payload_size` bytes (the payload sent from
// where it lies). REQUIRES: payload_size < 2^32.
std::string EncodeFrameHeader(uint8_t flags, size_t payload_size);

// The single message frame of a unary gRPC or gRPC-Web request `body`. A body that is not
// exactly one complete data frame (truncated, trailing bytes, a trailer flag) is InvalidArgument,
// its message starting with `what`. Sets `*compressed` from the frame's flag.
absl::StatusOr<absl::string_view> ParseUnaryRequestFrame(absl::string_view body, bool* compressed,
                                                         absl::string_view what = "grpc-web request");

// The messages of a gRPC request stream, split out as its bytes arrive (each length-prefixed
// message, its 5-byte header, may come in any number of pieces).
class FrameReader {
 public:
  // Messages over `max_message_bytes` are refused (ResourceExhausted) before they are buffered.
  explicit FrameReader(size_t max_message_bytes) : max_(max_message_bytes) {}
  // Takes `data`; calls `fn(compressed, message)` for each message completed by it, in order.
  // A frame that is not a message (a trailer or unknown flag: InvalidArgument), one too large,
  // or an error from `fn` stops the reading: that error, and every later call returns it.
  absl::Status Feed(absl::string_view data,
                    const std::function<absl::Status(bool compressed, absl::string_view message)>& fn);
  // True when no part of a message is held: the stream may end here.
  bool at_boundary() const { return buffer_.empty(); }

 private:
  const size_t max_;
  std::string buffer_;  // the part of a message (header included) not yet complete
  absl::Status error_;
};

// "%"-encodes a grpc-message value: bytes outside printable ASCII and '%' itself.
std::string PercentEncode(absl::string_view message);

// The gRPC-Web trailer block "grpc-status: N\r\ngrpc-message: ...\r\n" (message omitted if empty),
// and grpc-status-details-bin when `status` carries details.
std::string GrpcWebTrailers(const absl::Status& status);

}  // namespace offload::http

#endif  // SERVICE_HTTP_PROTOCOL_H_
