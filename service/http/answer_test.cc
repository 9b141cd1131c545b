// The protocols' answers and request reading without a socket: answer.h, connect.h, grpc.h,
// stream.h, and rpc_codec.h's ReadUnaryPost / ReadConnectGet.
#include "service/http/answer.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/http/connect.h"
#include "service/http/grpc.h"
#include "service/http/rpc_codec.h"
#include "service/http/stream.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;

// The first value of `name` in `headers`, or "" (tests ask for headers that appear once).
std::string Get(const HeaderList& headers, const std::string& name) {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}
bool Has(const HeaderList& headers, const std::string& name) {
  for (const auto& [n, v] : headers) {
    if (n == name) return true;
  }
  return false;
}

constexpr ContentType kConnectProto{Protocol::kConnect, Codec::kProto, false};
constexpr ContentType kConnectJson{Protocol::kConnect, Codec::kJson, false};
constexpr ContentType kGrpc{Protocol::kGrpc, Codec::kProto, false};
constexpr ContentType kGrpcWeb{Protocol::kGrpcWeb, Codec::kProto, false};
constexpr ContentType kGrpcWebText{Protocol::kGrpcWeb, Codec::kProto, true};

TEST(ConnectAnswers, SuccessPostAndGetCaching) {
  Answer a = UnarySuccess(kConnectProto, "msg", /*gzip=*/false, std::nullopt);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/proto");
  EXPECT_FALSE(Has(a.headers, "content-encoding"));
  EXPECT_FALSE(Has(a.headers, "cache-control"));
  EXPECT_EQ(a.body, "msg");
  EXPECT_TRUE(a.trailers.empty());

  a = UnarySuccess(kConnectJson, "{}", /*gzip=*/true, CacheHint{/*immutable=*/true, false});
  EXPECT_EQ(Get(a.headers, "content-type"), "application/json");
  EXPECT_EQ(Get(a.headers, "content-encoding"), "gzip");
  EXPECT_EQ(Get(a.headers, "cache-control"), "public, max-age=31536000, immutable");
  EXPECT_EQ(Get(a.headers, "vary"), "Accept-Encoding, Authorization");

  // An identified caller's answer is private; keys change.
  EXPECT_EQ(ConnectCacheControl({true, true}), "private, max-age=31536000, immutable");
  EXPECT_EQ(ConnectCacheControl({false, false}), "private, no-cache");
  EXPECT_EQ(ConnectCacheControl({false, true}), "private, no-cache");
}

// All of an answer's body: `body`, then the shared pieces.
std::string Joined(const Answer& a) {
  std::string out = a.body;
  for (absl::string_view piece : a.shared_body) out.append(piece.data(), piece.size());
  return out;
}

TEST(ConnectAnswers, SharedBodyIsNotCopied) {
  auto owner = std::make_shared<std::string>("plaintext");
  std::weak_ptr<std::string> weak = owner;
  Answer a = ConnectSharedSuccess(Codec::kProto, "\x0a\x09", *owner, "\x10\x01", owner);
  EXPECT_EQ(a.body, "\x0a\x09");
  ASSERT_EQ(a.shared_body.size(), 2u);
  EXPECT_EQ(a.shared_body[0].data(), owner->data());
  EXPECT_EQ(Joined(a), "\x0a\x09plaintext\x10\x01");
  EXPECT_EQ(Get(a.headers, "content-type"), "application/proto");
  owner.reset();
  EXPECT_FALSE(weak.expired());  // the answer keeps the body alive
  a = Answer();
  EXPECT_TRUE(weak.expired());
}

TEST(GrpcAnswers, SharedBodiesAreTheBytesOfTheMessage) {
  // [issue 34] gRPC and gRPC-Web binary answer a shared body in the bytes GrpcSuccess writes
  // for the whole message, the body never copied.
  auto owner = std::make_shared<std::string>(std::string(5000, 'p'));
  const std::string message = "\x0a\x88\x27" + *owner + "\x10\x01";
  for (const ContentType& type : {kGrpc, kGrpcWeb, kConnectProto}) {
    Answer shared = UnarySharedSuccess(type, "\x0a\x88\x27", *owner, "\x10\x01", owner);
    Answer copied = UnarySuccess(type, message, /*gzip=*/false, std::nullopt);
    EXPECT_EQ(Joined(shared), Joined(copied));
    EXPECT_EQ(shared.headers, copied.headers);
    EXPECT_EQ(shared.trailers, copied.trailers);
    ASSERT_FALSE(shared.shared_body.empty());
    EXPECT_EQ(shared.shared_body[0].data(), owner->data());
  }
  // A large gRPC message is sent from its own buffer after its frame header; a small one is
  // copied behind it.
  Answer large = UnarySuccess(kGrpc, std::string(kCopyAtMost + 1, 'm'), false, std::nullopt);
  EXPECT_EQ(large.body, EncodeFrameHeader(0, kCopyAtMost + 1));
  EXPECT_EQ(Joined(large), EncodeFrame(0, std::string(kCopyAtMost + 1, 'm')));
  Answer small = UnarySuccess(kGrpc, std::string(kCopyAtMost, 'm'), false, std::nullopt);
  EXPECT_TRUE(small.shared_body.empty());
  EXPECT_EQ(small.body, EncodeFrame(0, std::string(kCopyAtMost, 'm')));
}

TEST(ConnectAnswers, ErrorsFollowTheStatusTable) {
  Answer a = UnaryError(kConnectProto, absl::NotFoundError("key k: not found"), 0);
  EXPECT_EQ(a.status, 404);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/json");
  EXPECT_EQ(a.body, R"({"code":"not_found","message":"key k: not found"})");
  EXPECT_FALSE(Has(a.headers, "cache-control"));
  a = UnaryError(kConnectProto, absl::UnimplementedError("x"), 415, /*get=*/true);
  EXPECT_EQ(a.status, 415);
  EXPECT_EQ(Get(a.headers, "cache-control"), "no-store");
  EXPECT_EQ(ConnectEndStreamJson(absl::OkStatus()), "{}");
  EXPECT_EQ(ConnectEndStreamJson(absl::UnavailableError("draining")),
            R"({"error":{"code":"unavailable","message":"draining"}})");
}

TEST(GrpcAnswers, SuccessIsOneFrameThenTrailers) {
  Answer a = UnarySuccess(kGrpc, "msg", /*gzip=*/true, std::nullopt);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/grpc");
  EXPECT_EQ(Get(a.headers, "grpc-encoding"), "gzip");
  EXPECT_EQ(Get(a.headers, "grpc-accept-encoding"), "identity,gzip");
  EXPECT_EQ(a.body, EncodeFrame(kFrameCompressed, "msg"));
  EXPECT_EQ(a.trailers, (HeaderList{{"grpc-status", "0"}}));
}

TEST(GrpcAnswers, WebCarriesItsTrailersInTheBody) {
  Answer a = UnarySuccess(kGrpcWeb, "msg", /*gzip=*/false, std::nullopt);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/grpc-web+proto");
  EXPECT_FALSE(Has(a.headers, "grpc-encoding"));
  EXPECT_EQ(a.body, EncodeFrame(0, "msg") + EncodeFrame(kFrameTrailer, "grpc-status: 0\r\n"));
  EXPECT_TRUE(a.trailers.empty());
  Answer text = UnarySuccess(kGrpcWebText, "msg", false, std::nullopt);
  EXPECT_EQ(Get(text.headers, "content-type"), "application/grpc-web-text+proto");
  std::string decoded;
  ASSERT_TRUE(absl::Base64Unescape(text.body, &decoded));
  EXPECT_EQ(decoded, a.body);
}

TEST(GrpcAnswers, ErrorsAreTrailersOnly) {
  Answer a = UnaryError(kGrpc, absl::NotFoundError("key 100%: gone"), 0);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Get(a.headers, "grpc-status"), "5");
  EXPECT_EQ(Get(a.headers, "grpc-message"), "key 100%25: gone");
  EXPECT_EQ(Get(a.headers, "grpc-accept-encoding"), "identity,gzip");
  EXPECT_TRUE(a.body.empty());
  EXPECT_TRUE(a.trailers.empty());
  // Below gRPC: plain HTTP.
  a = UnaryError(kGrpc, absl::UnimplementedError("gRPC requires HTTP/2"), 505);
  EXPECT_EQ(a.status, 505);
  EXPECT_EQ(a.body, "gRPC requires HTTP/2\n");
  // gRPC-Web: the status in the headers, no grpc-accept-encoding.
  a = UnaryError(kGrpcWeb, absl::PermissionDeniedError("no"), 0);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/grpc-web+proto");
  EXPECT_EQ(Get(a.headers, "grpc-status"), "7");
  EXPECT_FALSE(Has(a.headers, "grpc-accept-encoding"));
}

TEST(Routes, UnknownMethodAndReflectionThatIsNotAStream) {
  Answer a = UnknownMethod("/x.Y/Z", "application/grpc", /*http2=*/true);
  EXPECT_EQ(Get(a.headers, "grpc-status"), "12");
  EXPECT_EQ(Get(a.headers, "grpc-message"), "unknown method /x.Y/Z");
  EXPECT_EQ(UnknownMethod("/x.Y/Z", "application/grpc", false).status, 505);
  a = UnknownMethod("/x.Y/Z", "application/proto", true);
  EXPECT_EQ(a.status, 404);
  EXPECT_THAT(a.body, HasSubstr(R"("code":"unimplemented")"));

  EXPECT_EQ(ReflectionNotAStream("application/grpc", false).status, 505);
  EXPECT_EQ(Get(ReflectionNotAStream("application/grpc", true).headers, "grpc-status"), "12");
  a = ReflectionNotAStream("application/connect+proto", true);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/connect+proto");
  a = ReflectionNotAStream("application/grpc-web-text", true);
  EXPECT_EQ(Get(a.headers, "content-type"), "application/grpc-web+proto");
  EXPECT_EQ(Get(a.headers, "grpc-status"), "12");
  EXPECT_EQ(ReflectionNotAStream(std::nullopt, true).status, 415);
}

TEST(Streams, WiresHeadersAndEnds) {
  EXPECT_EQ(StreamWireOf("application/grpc"), StreamWire::kGrpc);
  EXPECT_EQ(StreamWireOf("application/grpc-web+proto; charset=x"), StreamWire::kGrpcWeb);
  EXPECT_EQ(StreamWireOf("Application/Connect+Proto"), StreamWire::kConnect);
  EXPECT_EQ(StreamWireOf("application/grpc+json"), std::nullopt);
  EXPECT_EQ(StreamWireOf("application/grpc-web-text"), std::nullopt);
  EXPECT_EQ(StreamWireOf("application/proto"), std::nullopt);
  EXPECT_EQ(StreamWireOf(std::nullopt), std::nullopt);

  EXPECT_EQ(Get(StreamHeaders(StreamWire::kConnect), "connect-accept-encoding"), "gzip");
  const absl::Status draining = absl::UnavailableError("server is draining");
  StreamEnd end = EndOfStream(StreamWire::kGrpc, draining);
  EXPECT_EQ(end.trailers, (HeaderList{{"grpc-status", "14"}, {"grpc-message", "server is draining"}}));
  EXPECT_FALSE(end.last_data.has_value());
  end = EndOfStream(StreamWire::kGrpcWeb, absl::OkStatus());
  EXPECT_EQ(end.last_data, EncodeFrame(kFrameTrailer, "grpc-status: 0\r\n"));
  end = EndOfStream(StreamWire::kConnect, absl::OkStatus());
  EXPECT_EQ(end.last_data, EncodeFrame(kConnectEndStream, "{}"));

  Answer refused = StreamRefusal(StreamWire::kConnect, draining);
  EXPECT_EQ(refused.status, 200);
  EXPECT_EQ(refused.body, EncodeFrame(kConnectEndStream, ConnectEndStreamJson(draining)));
  EXPECT_EQ(Get(StreamRefusal(StreamWire::kGrpc, draining).headers, "grpc-status"), "14");

  const std::map<std::string, std::string> headers = {{"grpc-encoding", "gzip"},
                                                      {"connect-content-encoding", "br"}};
  const auto lookup = [&](const char* name) -> std::optional<absl::string_view> {
    auto it = headers.find(name);
    if (it == headers.end()) return std::nullopt;
    return absl::string_view(it->second);
  };
  EXPECT_EQ(*StreamEncoding(StreamWire::kGrpc, lookup), Encoding::kGzip);
  EXPECT_EQ(StreamEncoding(StreamWire::kConnect, lookup).status().code(),
            absl::StatusCode::kUnimplemented);
}

// Request headers for ReadUnaryPost / ReadConnectGet.
struct Headers {
  std::map<std::string, std::string> values;
  std::optional<absl::string_view> operator()(const char* name) const {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return absl::string_view(it->second);
  }
};

TEST(ReadUnaryPost, ProtocolsAndRefusals) {
  const Headers none;
  UnaryPost p = ReadUnaryPost("application/grpc-web-text", true, none, 10, false, 1024);
  ASSERT_TRUE(p.refusal.ok()) << p.refusal;
  EXPECT_EQ(p.type.protocol, Protocol::kGrpcWeb);
  EXPECT_TRUE(p.type.text);

  // Nobody speaks it: 415 and what we take.
  p = ReadUnaryPost("text/plain", true, none, 10, false, 1024);
  EXPECT_EQ(p.refusal.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(p.http_status, 415);
  EXPECT_EQ(p.type.protocol, Protocol::kConnect);
  EXPECT_EQ(Get(p.headers, "accept-post"), std::string(kAcceptPost));
  // gRPC with a codec we lack is answered as gRPC; gRPC over HTTP/1.1 is 505.
  p = ReadUnaryPost("application/grpc+thrift", true, none, 10, false, 1024);
  EXPECT_EQ(p.type.protocol, Protocol::kGrpc);
  EXPECT_EQ(p.http_status, 0);
  EXPECT_EQ(p.refusal.code(), absl::StatusCode::kUnimplemented);
  p = ReadUnaryPost("application/grpc", false, none, 10, false, 1024);
  EXPECT_EQ(p.http_status, 505);

  // Headers' errors, then the body's size: the message, a frame header more for gRPC-Web.
  p = ReadUnaryPost("application/proto", true, Headers{{{"content-encoding", "br"}}}, 10, false,
                    1024);
  EXPECT_EQ(p.refusal.code(), absl::StatusCode::kUnimplemented);
  Headers timeout{{{"connect-timeout-ms", "250"}}};
  p = ReadUnaryPost("application/proto", true, timeout, 1024, false, 1024);
  ASSERT_TRUE(p.refusal.ok());
  EXPECT_EQ(p.options.timeout, absl::Milliseconds(250));
  p = ReadUnaryPost("application/proto", true, none, 1025, false, 1024);
  EXPECT_EQ(p.refusal.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ReadUnaryPost("application/grpc-web", true, none, 1029, false, 1024).refusal.ok());
  EXPECT_EQ(ReadUnaryPost("application/grpc-web", true, none, 1030, false, 1024).refusal.code(),
            absl::StatusCode::kResourceExhausted);
  p = ReadUnaryPost("application/json", true, none, 0, /*body_too_large=*/true, 1024);
  EXPECT_EQ(p.refusal.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.refusal.message(), HasSubstr("got more"));
  EXPECT_EQ(MaxBody(1024), ((1024 + 5 + 2) / 3) * 4 + 4096);
}

TEST(ReadConnectGet, QueryAndHeaders) {
  const std::string message = absl::WebSafeBase64Escape("\x0a\x01x");
  ConnectGet g = ReadConnectGet("encoding=json&message=%7B%7D&connect=v1",
                                Headers{{{"accept-encoding", "gzip"}}}, 1024);
  ASSERT_TRUE(g.refusal.ok()) << g.refusal;
  EXPECT_EQ(g.type.codec, Codec::kJson);
  EXPECT_EQ(g.message, "{}");
  EXPECT_EQ(g.options.accept, Encoding::kGzip);
  g = ReadConnectGet("encoding=proto&base64=1&message=" + message, Headers{}, 1024);
  ASSERT_TRUE(g.refusal.ok()) << g.refusal;
  EXPECT_EQ(g.message, "\x0a\x01x");
  EXPECT_EQ(ReadConnectGet("message=x", Headers{}, 1024).refusal.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadConnectGet("encoding=json&message=%7B%7D",
                           Headers{{{"connect-protocol-version", "2"}}}, 1024)
                .refusal.code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadConnectGet("encoding=json&message=%7B%7D",
                           Headers{{{"connect-timeout-ms", "soon"}}}, 1024)
                .refusal.code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload::http
