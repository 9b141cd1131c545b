// The transport-free middle of one HTTP RPC: a request's headers read into call options, its body
// decoded into the request message, the response message encoded. The gateway (gateway.cc) calls
// these on the HTTP server's loop threads; the HTTP fuzz target (tests/fuzz) calls the same functions
// without a socket.
//
//   absl::StatusOr<CallOptions> options = ParseCallHeaders(type->protocol, header_lookup);
//   OFFLOAD_RETURN_IF_ERROR(DecodeRequest(*type, options->encoding, body, max, request.get()));
//   ... run the method ...
//   OFFLOAD_RETURN_IF_ERROR(EncodeResponse(type->codec, *response, max, &out));
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
#include "google/protobuf/message.h"
#include "service/http/protocol.h"

namespace offload::http {

// What a request's headers ask of the call.
struct CallOptions {
  Encoding encoding = Encoding::kIdentity;  // of the body (Connect) or of the frame (gRPC-Web)
  std::optional<absl::Duration> timeout;    // Connect-Timeout-Ms or grpc-timeout
  bool gzip_response = false;               // Connect: Accept-Encoding names gzip
};

// A request header by name (case-insensitive), or nullopt when absent.
using HeaderLookup = absl::FunctionRef<std::optional<absl::string_view>(const char* name)>;

// Reads the headers `protocol` defines: Connect-Protocol-Version, Connect-Timeout-Ms,
// Content-Encoding and Accept-Encoding (Connect); grpc-timeout and grpc-encoding (gRPC-Web).
// InvalidArgument for a malformed value, Unimplemented for an unknown encoding.
absl::StatusOr<CallOptions> ParseCallHeaders(Protocol protocol, HeaderLookup header);

// Decodes a whole request `body` into `request` (an empty message of the method's request type):
// gRPC-Web text's base64, gRPC-Web's single frame, gzip (at most `max_message_bytes` of output), then binary protobuf or
// JSON (unknown fields refused; an empty JSON body is `{}`). InvalidArgument for anything
// malformed, ResourceExhausted for too much decompressed data, Internal for a compressed gRPC-Web
// frame without a grpc-encoding (as gRPC does).
absl::Status DecodeRequest(ContentType type, Encoding encoding, absl::string_view body,
                           int64_t max_message_bytes, google::protobuf::Message* request);

// Encodes `response` in `codec` into `*out`. ResourceExhausted (and `*out` empty) when it is over
// `max_message_bytes`, Internal if the message cannot be encoded.
absl::Status EncodeResponse(Codec codec, const google::protobuf::Message& response,
                            int64_t max_message_bytes, std::string* out);

}  // namespace offload::http

#endif  // SERVICE_HTTP_RPC_CODEC_H_
