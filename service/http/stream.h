// The wire of a stream (health Watch, server reflection): gRPC, gRPC-Web (binary) or Connect's
// streaming protocol, as connect-go serves them (buf curl reflects with the protocol of its
// call). All three carry length-prefixed messages both ways (EncodeFrame, FrameReader); they
// differ in the content type and in how the end and its status are told: trailers, a trailer
// frame (0x80), or an end-of-stream message (0x02) holding Connect's error JSON. Pure functions:
// answer_test.cc.
//
//   std::optional<StreamWire> wire = StreamWireOf(content_type);     // nullopt: not a stream
//   server writes StreamHeaders(*wire), then EncodeFrame(0, message) per answer, then
//   StreamEnd end = EndOfStream(*wire, status);  // its trailers, or its last body bytes
//
// Thread-safety: every function is thread-safe.
#ifndef SERVICE_HTTP_STREAM_H_
#define SERVICE_HTTP_STREAM_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/http/answer.h"
#include "service/http/protocol.h"
#include "service/http/rpc_codec.h"

namespace offload::http {

enum class StreamWire { kGrpc, kGrpcWeb, kConnect };

// The wire of a stream's content type: binary protobuf gRPC or gRPC-Web (as ParseContentType
// reads them), or application/connect+proto (Connect's streaming type, which unary calls never
// carry). nullopt for anything else (and for no content type).
std::optional<StreamWire> StreamWireOf(std::optional<absl::string_view> content_type);

// The headers that start a stream's answer (HTTP 200).
HeaderList StreamHeaders(StreamWire wire);

// The encoding of a stream's request messages (compressed ones are flagged per message), from
// its headers: connect-content-encoding, or grpc-encoding. Unimplemented for an unknown one.
absl::StatusOr<Encoding> StreamEncoding(StreamWire wire, HeaderLookup header);

// How a started stream ends with `status`: with trailers (gRPC), or with last body bytes and no
// trailers (gRPC-Web's trailer frame, Connect's end-of-stream message).
struct StreamEnd {
  HeaderList trailers;
  std::optional<std::string> last_data;
};
StreamEnd EndOfStream(StreamWire wire, const absl::Status& status);

// The whole answer of a stream refused before it started.
Answer StreamRefusal(StreamWire wire, const absl::Status& status);

}  // namespace offload::http

#endif  // SERVICE_HTTP_STREAM_H_
