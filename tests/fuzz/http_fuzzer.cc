// The HTTP request path (service/http) without a socket: the same mapping functions the gateway's
// unary call (service/gateway/internal/unary_call.cc) calls, in its order. Input = a request in
// text form:
//   line 1: the path ("/offload.v1.AeadService/Open"), or "GET " and a path with a Connect GET
//           query ("GET /offload.v1.KeyService/GetKey?encoding=json&message=...")
//   then "Name: value" header lines, an empty line, and the body (bytes to the end)
// Steps: method table lookup, ReadUnaryPost (content type, Connect / gRPC / gRPC-Web headers, the
// body size limit) or ReadConnectGet (the GET query and headers), DecodeRequest (gRPC-Web text's
// base64, gRPC-Web frame, gzip, binary or JSON protobuf), the method call over Operations and
// the KeyManager (a world with the fixed keys), EncodeResponse, CompressResponse and the answer
// (UnarySuccess), or the error's answer in each protocol (UnaryError: Connect JSON error, gRPC
// Trailers-Only, gRPC-Web trailers).
// Invariants: no crash; only codes a gateway call may end with; an error body is JSON with the
// code's Connect name and an HTTP status of 4xx/5xx; percent-encoded messages are printable
// ASCII; frames and gzip round-trip.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "service/api/method_table.h"
#include "service/api/reflection.h"
#include "service/http/answer.h"
#include "service/http/protocol.h"
#include "service/http/rpc_codec.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

using http::Codec;
using http::Protocol;

// Small, so that size limits and gzip bombs are reachable.
constexpr int64_t kMaxMessageBytes = 64 << 10;
constexpr size_t kMaxKeys = 32;

struct Fixture {
  World* world = NewWorld(crypto::BackendChoice{});
  api::MethodTable table{world->ops.get(), world->keys.get()};
};
Fixture& F() {
  static Fixture* f = new Fixture;
  return *f;
}

struct Request {
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;
  absl::string_view body;
};

Request ParseInput(absl::string_view text) {
  Request r;
  size_t line_end = text.find('\n');
  r.path = std::string(text.substr(0, line_end));
  if (line_end == absl::string_view::npos) return r;
  text.remove_prefix(line_end + 1);
  while (!text.empty()) {
    line_end = text.find('\n');
    absl::string_view line = text.substr(0, line_end);
    text.remove_prefix(line_end == absl::string_view::npos ? text.size() : line_end + 1);
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    r.headers.emplace_back(std::string(line.substr(0, colon)),
                           std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  r.body = text;
  return r;
}

// The error a client would see: checks the Connect JSON body and the gRPC-Web trailers.
void CheckErrorEncodings(const absl::Status& status) {
  const std::string body = http::ConnectErrorJson(status);
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!parsed.is_discarded() && parsed.is_object(), "error body is not JSON: ", body);
  FUZZ_CHECK(parsed.value("code", "") == http::ConnectCodeName(status.code()), body);
  const int http_status = http::ConnectHttpStatus(status.code());
  FUZZ_CHECK(http_status >= 400 && http_status <= 599, http_status);
  const std::string encoded = http::PercentEncode(status.message());
  for (unsigned char c : encoded) FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "grpc-message byte ", int{c});
  const std::string trailers = http::GrpcWebTrailers(status);
  FUZZ_CHECK(absl::StartsWith(trailers, absl::StrCat("grpc-status: ", static_cast<int>(status.code()),
                                                     "\r\n")),
             trailers);
  // The answers the protocols make of it: Connect's status and JSON, gRPC's and gRPC-Web's
  // Trailers-Only with the code in grpc-status.
  const http::Answer connect = http::UnaryError(http::ContentType{}, status, 0);
  FUZZ_CHECK(connect.status == http_status && connect.body == body, connect.status);
  for (const http::ContentType type : {http::ContentType{Protocol::kGrpc, Codec::kProto, false},
                                       http::ContentType{Protocol::kGrpcWeb, Codec::kProto, true}}) {
    const http::Answer grpc = http::UnaryError(type, status, 0);
    FUZZ_CHECK(grpc.status == 200 && grpc.body.empty() && grpc.trailers.empty(), grpc.status);
    bool has_status = false;
    for (const auto& [name, value] : grpc.headers) {
      if (name == "grpc-status") has_status = value == absl::StrCat(static_cast<int>(status.code()));
    }
    FUZZ_CHECK(has_status, "grpc-status of ", status.ToString());
  }
}

bool IsFixedKey(const google::protobuf::Message& request) {
  const auto* field = request.GetDescriptor()->FindFieldByName("key_id");
  if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
    return false;
  }
  const std::string id = request.GetReflection()->GetString(request, field);
  for (size_t i = 0; i < 6; ++i) {
    if (id == kKeyIdChoices[i]) return true;
  }
  return false;
}

absl::Status Serve(const Request& r, std::string* out) {
  const auto header = [&r](const char* name) -> std::optional<absl::string_view> {
    for (const auto& [n, v] : r.headers) {
      if (absl::EqualsIgnoreCase(n, name)) return absl::string_view(v);
    }
    return std::nullopt;
  };
  // A Connect GET: the message comes from the query, and only side-effect-free methods take it.
  const bool get = absl::StartsWith(r.path, "GET ");
  absl::string_view path = get ? absl::string_view(r.path).substr(4) : absl::string_view(r.path);
  const absl::string_view query = get && path.find('?') != absl::string_view::npos
                                      ? path.substr(path.find('?') + 1)
                                      : absl::string_view();
  if (get) path = path.substr(0, path.find('?'));
  const api::Method* method = F().table.Find(path);
  if (method == nullptr) {
    return absl::UnimplementedError(absl::StrCat("unknown method ", path.substr(0, 128)));
  }
  http::ContentType type;
  http::CallOptions options;
  std::string get_message;
  absl::string_view body = r.body;
  if (get) {
    if (!method->no_side_effects) return absl::UnimplementedError("GET: POST only");
    http::ConnectGet g = http::ReadConnectGet(query, header, kMaxMessageBytes);
    if (!g.refusal.ok()) return g.refusal;
    FUZZ_CHECK(g.message.size() <= static_cast<size_t>(kMaxMessageBytes), "GET size");
    type = g.type;
    options = g.options;
    get_message = std::move(g.message);
    body = get_message;
  } else {
    http::UnaryPost post = http::ReadUnaryPost(header("Content-Type"), /*http2=*/true, header,
                                               body.size(), false, kMaxMessageBytes);
    if (!post.refusal.ok()) {
      FUZZ_CHECK(post.http_status == 0 || post.http_status == 415, post.http_status);
      return post.refusal;
    }
    int64_t limit = kMaxMessageBytes +
                    (post.type.protocol != Protocol::kConnect ? int64_t{http::kFrameHeaderBytes} : 0);
    if (post.type.text) limit = http::MaxBody(kMaxMessageBytes);
    FUZZ_CHECK(static_cast<int64_t>(body.size()) <= limit, "body over the limit read");
    type = post.type;
    options = post.options;
  }
  std::unique_ptr<google::protobuf::Message> request(method->request_prototype->New());
  std::unique_ptr<google::protobuf::Message> response(method->response_prototype->New());
  // [issue 34] The gateway reads some requests where they lie (AEAD Open's): wherever that
  // reader says yes, protobuf's parser agrees, value for value (every type whose fields are all
  // strings or bytes is tried, not only AEAD Open's).
  if (std::optional<absl::string_view> message =
          get ? std::nullopt : http::UncompressedProtoMessage(type, options.encoding, body)) {
    absl::string_view fields[16];
    const google::protobuf::Descriptor& d = *request->GetDescriptor();
    if (http::ParseBytesFieldsInPlace(*message, d, absl::MakeSpan(fields))) {
      std::unique_ptr<google::protobuf::Message> parsed(method->request_prototype->New());
      FUZZ_CHECK(parsed->ParseFromArray(message->data(), static_cast<int>(message->size())),
                 "read in place what protobuf refuses: ", d.full_name());
      for (int i = 0; i < d.field_count(); ++i) {
        const google::protobuf::FieldDescriptor* f = d.field(i);
        FUZZ_CHECK(parsed->GetReflection()->GetString(*parsed, f) == fields[f->number() - 1],
                   "in-place field differs: ", f->full_name());
      }
    }
  }
  if (absl::Status s =
          http::DecodeRequest(type, options.encoding, body, kMaxMessageBytes, request.get());
      !s.ok()) {
    return s;
  }
  // Deleting, rotating or disabling the fixed keys (or their versions) would change what later
  // inputs find: every KeyService call that changes a key leaves them alone.
  if (method->service == "offload.v1.KeyService" && method->method != "CreateKey" &&
      method->method != "ImportKey" && method->method != "GetKey" &&
      method->method != "ListKeys" && IsFixedKey(*request)) {
    return absl::FailedPreconditionError("fuzz: fixed key left alone");
  }
  const absl::Status status = WaitForBatch([&](ops::Operations::Done done) {
    method->call(*request, response.get(), std::move(done), nullptr);
  });
  if (!status.ok()) {
    FUZZ_CHECK(method->batch ? IsOneOf(status.code(), kBatchCallCodes)
                             : IsOneOf(status.code(), {absl::StatusCode::kInvalidArgument,
                                                       absl::StatusCode::kNotFound,
                                                       absl::StatusCode::kFailedPrecondition,
                                                       absl::StatusCode::kAlreadyExists}),
               method->path, ": ", status.ToString());
    return status;
  }
  if (absl::Status s = http::EncodeResponse(type.codec, *response, kMaxMessageBytes, out);
      !s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kResourceExhausted, s.ToString());
    return s;
  }
  if (type.protocol != Protocol::kConnect) {
    const std::string frame = http::EncodeFrame(0, *out);
    bool compressed = true;
    const auto payload = http::ParseUnaryRequestFrame(frame, &compressed);
    FUZZ_CHECK(payload.ok() && *payload == *out && !compressed, "frame round trip");
    if (type.text) {
      const absl::StatusOr<std::string> back =
          http::DecodeGrpcWebText(http::EncodeGrpcWebText(frame));
      FUZZ_CHECK(back.ok() && *back == frame, "grpc-web-text round trip");
    }
  }
  // The response compression the gateway applies (to either protocol): what it sends decodes
  // to the message, and is only ever smaller.
  std::string sent = *out;
  const http::Compression c = http::CompressResponse(options.accept, http::CompressionOptions{}, &sent);
  if (c.encoding == http::Encoding::kGzip) {
    FUZZ_CHECK(options.accept == http::Encoding::kGzip && sent.size() < out->size(), "gzip pays");
    const absl::StatusOr<std::string> back = http::Gunzip(sent, out->size());
    FUZZ_CHECK(back.ok() && *back == *out, "gzip round trip");
  } else {
    FUZZ_CHECK(sent == *out, "an uncompressed response is unchanged");
  }
  // The answer carries the message as sent: whole for Connect, in one frame (flagged when
  // compressed) for gRPC and binary gRPC-Web.
  std::optional<http::CacheHint> hint;
  if (get) hint = http::CacheHint{method->immutable, false};
  const http::Answer answer = http::UnarySuccess(type, sent, c.encoding == http::Encoding::kGzip, hint);
  FUZZ_CHECK(answer.status == 200, answer.status);
  if (type.protocol == Protocol::kConnect) {
    FUZZ_CHECK(answer.body == sent, "Connect answer body");
  } else if (!type.text) {
    bool compressed = false;
    const auto message = http::ParseUnaryRequestFrame(
        absl::string_view(answer.body).substr(0, http::kFrameHeaderBytes + sent.size()), &compressed);
    FUZZ_CHECK(message.ok() && *message == sent &&
                   compressed == (c.encoding == http::Encoding::kGzip),
               "answer frame");
  }
  // What we encoded decodes to the same response.
  std::unique_ptr<google::protobuf::Message> decoded(method->response_prototype->New());
  const absl::Status d = http::DecodeRequest(http::ContentType{Protocol::kConnect, type.codec},
                                             http::Encoding::kIdentity, *out, kMaxMessageBytes,
                                             decoded.get());
  FUZZ_CHECK(d.ok(), "response does not decode: ", d.ToString());
  FUZZ_CHECK(decoded->SerializeAsString() == response->SerializeAsString(),
             "response changed in encoding: ", response->ShortDebugString(), " became ",
             decoded->ShortDebugString(), " through ", *out);
  return absl::OkStatus();
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  const Request request = ParseInput(absl::string_view(reinterpret_cast<const char*>(data), size));
  // The CORS origin list parser and matcher take flag values and request headers alike.
  for (const auto& [name, value] : request.headers) {
    if (!absl::EqualsIgnoreCase(name, "Origin")) continue;
    const absl::StatusOr<http::CorsPolicy> cors = http::CorsPolicy::Parse(value);
    if (cors.ok()) {
      for (const std::string& o : cors->origins()) FUZZ_CHECK(cors->Allows(o), o);
      const http::CorsPolicy::Answer a = cors->Preflight(value, "POST");
      FUZZ_CHECK(a.status == 204 || a.status == 403, a.status);
    }
  }
  // The streaming side (server reflection over gRPC): the body as a message stream, fed in
  // uneven pieces; each message that parses is a reflection request, and gets an answer.
  {
    static const api::Reflection reflection(
        {"offload.v1.KeyService", "offload.v1.Ed25519Service", "grpc.health.v1.Health"});
    api::Reflection::Stream stream(&reflection);
    http::FrameReader reader(64 << 10);
    const absl::string_view body = request.body;
    const size_t piece = 1 + size % 7;
    for (size_t i = 0; i < body.size(); i += piece) {
      const absl::Status fed = reader.Feed(body.substr(i, piece), [&](bool, absl::string_view m) {
        FUZZ_CHECK(m.size() <= (64u << 10), "frame bound");
        grpc::reflection::v1::ServerReflectionRequest rr;
        if (rr.ParseFromArray(m.data(), static_cast<int>(m.size()))) {
          const auto answer = stream.Answer(rr);
          FUZZ_CHECK(answer.message_response_case() !=
                         grpc::reflection::v1::ServerReflectionResponse::MESSAGE_RESPONSE_NOT_SET,
                     "a reflection answer");
        }
        return absl::OkStatus();
      });
      if (!fed.ok()) {
        FUZZ_CHECK(fed.code() == absl::StatusCode::kInvalidArgument ||
                       fed.code() == absl::StatusCode::kResourceExhausted,
                   fed.ToString());
        break;
      }
    }
  }
  std::string out;
  const absl::Status status = Serve(request, &out);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() != absl::StatusCode::kInternal ||
                   absl::StartsWith(status.message(), "grpc-web request: compressed frame") ||
                   absl::StartsWith(status.message(), "grpc request: compressed frame"),
               status.ToString());
    CheckErrorEncodings(status);
  }
  keys::KeyManager& keys = *F().world->keys;
  if (keys.size() > kMaxKeys) {
    for (const v1::KeyInfo& info : keys.ListKeys()) {
      bool fixed = false;
      for (size_t i = 0; i < 6; ++i) fixed |= info.key_id() == kKeyIdChoices[i];
      if (fixed) continue;
      if (info.state() == v1::KEY_STATE_PENDING_DELETION) {
        FUZZ_CHECK(keys.CancelKeyDeletion(info.key_id()).ok(), info.key_id());
      }
      FUZZ_CHECK(keys.DeleteKey(info.key_id()).ok(), info.key_id());
    }
  }
  return 0;
}
