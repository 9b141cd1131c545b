// The transport-free middle of one HTTP RPC: a request's content type, headers and body size
// read into what it asks for (ReadUnaryPost, ReadConnectGet), its body decoded into the request
// message, the response message encoded. The gateway (service/gateway) calls these on the HTTP
// server's loop threads; the HTTP fuzz target (tests/fuzz) calls the same functions without a
// socket.
//
//   UnaryPost post = ReadUnaryPost(content_type, http2, header_lookup, body.size(), false, max);
//   if (!post.refusal.ok()) ... answer UnaryError(post.type, post.refusal, post.http_status) ...
//   absl::StatusOr<CallOptions> options = ParseCallHeaders(type->protocol, header_lookup);
//   OFFLOAD_RETURN_IF_ERROR(DecodeRequest(*type, options->encoding, body, max, request.get()));
//   ... run the method ...
//   OFFLOAD_RETURN_IF_ERROR(EncodeResponse(type->codec, *response, max, &out));
//   Compression c = CompressResponse(options->accept, CompressionOptions{}, &out);
//   // c.encoding: what `out` now is (Content-Encoding, or the gRPC-Web frame flag)
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_RPC_CODEC_H_
#define SERVICE_HTTP_RPC_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "service/http/protocol.h"

namespace offload::http {

// What a request's headers ask of the call.
struct CallOptions {
  Encoding encoding = Encoding::kIdentity;  // of the body (Connect) or of the frame (gRPC, -Web)
  std::optional<absl::Duration> timeout;    // Connect-Timeout-Ms or grpc-timeout
  // The response encoding the caller asks for (NegotiateEncoding): Accept-Encoding for Connect,
  // grpc-accept-encoding for gRPC-Web. Whether it is used is CompressResponse's decision.
  Encoding accept = Encoding::kIdentity;
};

// A request header by its lower-case name (as HTTP/2 and the engine carry names), or nullopt when
// absent.
using HeaderLookup = absl::FunctionRef<std::optional<absl::string_view>(const char* name)>;

// Reads the headers `protocol` defines, asking `header` by lower-case name:
// connect-protocol-version, connect-timeout-ms, content-encoding and accept-encoding (Connect unary; Connect-Content-Encoding and
// Connect-Accept-Encoding are the streaming protocol's and are not read); grpc-timeout,
// grpc-encoding and grpc-accept-encoding (gRPC and gRPC-Web).
// InvalidArgument for a malformed value, Unimplemented for an unknown encoding.
absl::StatusOr<CallOptions> ParseCallHeaders(Protocol protocol, HeaderLookup header);

// The largest body a request may have for a message of at most `max_message_bytes`: the
// message, a gRPC-Web frame header, base64 for gRPC-Web text (with room for line breaks).
int64_t MaxBody(int64_t max_message_bytes);

// The largest body of a unary POST of `type` for a message of at most `max_message_bytes`: the
// message for Connect, a frame header more for gRPC and gRPC-Web, base64's growth for gRPC-Web
// text (MaxBody).
int64_t UnaryBodyLimit(const ContentType& type, int64_t max_message_bytes);

// What a unary POST asks for, from its Content-Type, its headers and its body's size (or that
// it was over what any protocol carries: `body_too_large`). `type` is the protocol of the
// answer, also when the request is refused (a gRPC content type with a codec we lack is answered
// as gRPC; one nobody speaks as Connect). `refusal` OK: the body is to be decoded with
// `options.encoding`. Otherwise the call ends with it: Unimplemented for the content type (415
// and Accept-Post for one nobody speaks; 505 for gRPC over HTTP/1.1, `http2` false), the
// headers' errors (ParseCallHeaders), ResourceExhausted for a body over the message limit (a
// frame header more for gRPC and gRPC-Web, base64's growth for gRPC-Web text).
struct UnaryPost {
  ContentType type;
  CallOptions options;
  absl::Status refusal;
  int http_status = 0;  // the refusal's, when the protocol's own does not apply (0: it does)
  HeaderList headers;   // more headers of the refusal's answer
  int64_t body_limit = 0;  // the largest body of `type` (once the content type is read)
};
UnaryPost ReadUnaryPost(std::optional<absl::string_view> content_type, bool http2,
                        HeaderLookup header, size_t body_size, bool body_too_large,
                        int64_t max_message_bytes);

// What a Connect GET asks for (its query: ParseConnectGetQuery; Connect-Protocol-Version,
// Connect-Timeout-Ms, Accept-Encoding): `message` to decode with `options.encoding` (the query's
// compression), or `refusal`.
struct ConnectGet {
  ContentType type;
  CallOptions options;
  std::string message;
  absl::Status refusal;
};
ConnectGet ReadConnectGet(absl::string_view query, HeaderLookup header,
                          int64_t max_message_bytes);

// Decodes a whole request `body` into `request` (an empty message of the method's request type):
// gRPC-Web text's base64, the single frame of gRPC and gRPC-Web, gzip (at most `max_message_bytes` of output), then binary protobuf or
// JSON (unknown fields refused; an empty JSON body is `{}`). InvalidArgument for anything
// malformed, ResourceExhausted for too much decompressed data, Internal for a compressed gRPC-Web
// frame without a grpc-encoding (as gRPC does).
absl::Status DecodeRequest(ContentType type, Encoding encoding, absl::string_view body,
                           int64_t max_message_bytes, google::protobuf::Message* request);

// [issue 34] Reads binary protobuf `message` of type `type`, whose fields must all be singular
// `string` or `bytes` fields (AeadOpenRequest's), without copying it: `fields[n - 1]` becomes the
// bytes, where they lie in `message`, of field number n (the last occurrence wins, as protobuf
// merges; empty when absent). True only where protobuf's own parser would succeed with the same
// values; false for anything it cannot vouch for (a malformed or truncated field, a string that
// is not UTF-8, groups, a field number beyond `fields`, a type with other fields): the caller
// then decodes the message the usual way (DecodeRequest), which reports what is wrong.
bool ParseBytesFieldsInPlace(absl::string_view message, const google::protobuf::Descriptor& type,
                             absl::Span<absl::string_view> fields);

// [issue 34] The message bytes of a unary request `body` when they can be read where they lie:
// binary protobuf, not compressed (`encoding` identity and, for gRPC and gRPC-Web binary, the
// single frame's flag clear); nullopt otherwise (gRPC-Web text, JSON, gzip, a malformed frame:
// DecodeRequest decodes those, and reports what is wrong).
std::optional<absl::string_view> UncompressedProtoMessage(ContentType type, Encoding encoding,
                                                          absl::string_view body);

// One message of a gRPC or gRPC-Web request stream as FrameReader hands it over, `compressed` by
// its frame flag: decompressed and parsed as DecodeRequest does (Internal for a compressed one
// without a grpc-encoding of gzip).
absl::Status DecodeMessage(ContentType type, Encoding encoding, bool compressed,
                           absl::string_view message, int64_t max_message_bytes,
                           google::protobuf::Message* request);

// Encodes `response` in `codec` into `*out`. ResourceExhausted (and `*out` empty) when it is over
// `max_message_bytes`, Internal if the message cannot be encoded.
absl::Status EncodeResponse(Codec codec, const google::protobuf::Message& response,
                            int64_t max_message_bytes, std::string* out);

// When a response is worth compressing.
struct CompressionOptions {
  // zlib level, 1 (fastest) .. 9; 0: responses are never compressed.
  int level = 1;
  // Messages smaller than this are sent as they are.
  int64_t min_bytes = 1024;
};

// Sampled entropy (SampledEntropyBits) above which a message is sent as it is: gzip could save
// at most ~12% of it, not worth a deflate pass over every byte.
inline constexpr double kMaxCompressibleEntropyBits = 7.0;

// What CompressResponse did, for metrics and tests.
enum class CompressionResult {
  kNotAsked,        // the caller accepts identity only (or compression is off)
  kTooSmall,        // under CompressionOptions::min_bytes
  kIncompressible,  // the sample's entropy says gzip would not pay (ciphertext, keys, random)
  kNoGain,          // compressed, but saved under 1/16 of the size: sent as it was
  kCompressed,
};
absl::string_view CompressionResultName(CompressionResult result);

struct Compression {
  Encoding encoding = Encoding::kIdentity;  // of `*message` after the call
  CompressionResult result = CompressionResult::kNotAsked;
};

// Compresses `*message` (a whole encoded response message) with `accept` when that pays: the
// caller asked for it, the message is at least `options.min_bytes`, a 4 KiB sample does not look
// incompressible, and the output saves at least 1/16. Otherwise `*message` is left as it is.
Compression CompressResponse(Encoding accept, const CompressionOptions& options,
                             std::string* message);

}  // namespace offload::http

#endif  // SERVICE_HTTP_RPC_CODEC_H_
