#include "service/http/protocol.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "service/ops/retry_delay.h"
#include "tests/testing/payloads.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;
using testhttp::JsonLike;
using testhttp::RandomBytes;

TEST(ParseContentType, ConnectAndGrpcWeb) {
  auto t = ParseContentType("application/proto");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->protocol, Protocol::kConnect);
  EXPECT_EQ(t->codec, Codec::kProto);
  t = ParseContentType("Application/JSON; charset=utf-8");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->protocol, Protocol::kConnect);
  EXPECT_EQ(t->codec, Codec::kJson);
  for (const char* web : {"application/grpc-web", "application/grpc-web+proto"}) {
    t = ParseContentType(web);
    ASSERT_TRUE(t.ok()) << web;
    EXPECT_EQ(t->protocol, Protocol::kGrpcWeb);
    EXPECT_EQ(t->codec, Codec::kProto);
  }
}

TEST(ParseContentType, RefusesOthers) {
  for (const char* bad : {"", "text/plain", "application/grpc+thrift", "application/grpc-web+json",
                          "application/grpc-web-text+json", "application/protobuf",
                          "application/grpcx"}) {
    auto t = ParseContentType(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseContentType("text/plain").status().message(), HasSubstr("\"text/plain\""));
}

TEST(ParseContentType, Grpc) {
  for (const char* proto : {"application/grpc", "application/grpc+proto", "Application/GRPC",
                            "application/grpc; charset=utf-8"}) {
    auto t = ParseContentType(proto);
    ASSERT_TRUE(t.ok()) << proto;
    EXPECT_EQ(t->protocol, Protocol::kGrpc) << proto;
    EXPECT_EQ(t->codec, Codec::kProto) << proto;
    EXPECT_EQ(GrpcContentType(*t), "application/grpc");
  }
  auto json = ParseContentType("application/grpc+json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(json->protocol, Protocol::kGrpc);
  EXPECT_EQ(json->codec, Codec::kJson);
  EXPECT_EQ(GrpcContentType(*json), "application/grpc+json");
  // Any gRPC subtype is gRPC (answered in gRPC's terms), gRPC-Web and look-alikes are not.
  EXPECT_TRUE(IsGrpcContentType("application/grpc"));
  EXPECT_TRUE(IsGrpcContentType("application/grpc+thrift; x=y"));
  EXPECT_FALSE(IsGrpcContentType("application/grpc-web"));
  EXPECT_FALSE(IsGrpcContentType("application/grpcx"));
  EXPECT_FALSE(IsGrpcContentType("application/proto"));
}

TEST(ConnectCodes, NamesAndHttpStatusesFollowTheSpec) {
  struct Case {
    absl::StatusCode code;
    const char* name;
    int http;
  };
  const Case cases[] = {
      {absl::StatusCode::kCancelled, "canceled", 499},
      {absl::StatusCode::kUnknown, "unknown", 500},
      {absl::StatusCode::kInvalidArgument, "invalid_argument", 400},
      {absl::StatusCode::kDeadlineExceeded, "deadline_exceeded", 504},
      {absl::StatusCode::kNotFound, "not_found", 404},
      {absl::StatusCode::kAlreadyExists, "already_exists", 409},
      {absl::StatusCode::kPermissionDenied, "permission_denied", 403},
      {absl::StatusCode::kResourceExhausted, "resource_exhausted", 429},
      {absl::StatusCode::kFailedPrecondition, "failed_precondition", 400},
      {absl::StatusCode::kAborted, "aborted", 409},
      {absl::StatusCode::kOutOfRange, "out_of_range", 400},
      {absl::StatusCode::kUnimplemented, "unimplemented", 501},
      {absl::StatusCode::kInternal, "internal", 500},
      {absl::StatusCode::kUnavailable, "unavailable", 503},
      {absl::StatusCode::kDataLoss, "data_loss", 500},
      {absl::StatusCode::kUnauthenticated, "unauthenticated", 401},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ConnectCodeName(c.code), c.name);
    EXPECT_EQ(ConnectHttpStatus(c.code), c.http) << c.name;
  }
}

TEST(ConnectErrorJson, CodeAndEscapedMessage) {
  EXPECT_EQ(ConnectErrorJson(absl::NotFoundError("key \"k\": not found")),
            R"({"code":"not_found","message":"key \"k\": not found"})");
  EXPECT_EQ(ConnectErrorJson(absl::InternalError("")), R"({"code":"internal"})");
  // Invalid UTF-8 is replaced, never thrown on.
  EXPECT_THAT(ConnectErrorJson(absl::InvalidArgumentError("bad \xff byte")),
              HasSubstr("invalid_argument"));
}

// A refusal that says when to come back, as admission makes it.
absl::Status Refused(absl::Duration delay) {
  return ops::WithRetryDelay(absl::ResourceExhaustedError("server overloaded"), delay);
}

// Unpadded base64 (as the Connect protocol and gRPC's -bin headers write it) decoded.
std::string Unbase64(std::string text) {
  while (text.size() % 4 != 0) text.push_back('=');
  std::string bytes;
  EXPECT_TRUE(absl::Base64Unescape(text, &bytes)) << text;
  return bytes;
}

TEST(ErrorDetails, ConnectJsonCarriesRetryInfo) {
  const std::string json = ConnectErrorJson(Refused(absl::Milliseconds(1500)));
  const nlohmann::json body = nlohmann::json::parse(json);
  EXPECT_EQ(body["code"], "resource_exhausted");
  EXPECT_EQ(body["message"], "server overloaded");
  ASSERT_EQ(body["details"].size(), 1u) << json;
  EXPECT_EQ(body["details"][0]["type"], "google.rpc.RetryInfo");
  const std::string value = body["details"][0]["value"];
  EXPECT_EQ(value.find('='), std::string::npos) << "Connect writes unpadded base64: " << value;
  google::rpc::RetryInfo info;
  ASSERT_TRUE(info.ParseFromString(Unbase64(value)));
  EXPECT_EQ(info.retry_delay().seconds(), 1);
  EXPECT_EQ(info.retry_delay().nanos(), 500000000);
  // No details, no key.
  EXPECT_EQ(ConnectErrorJson(absl::ResourceExhaustedError("too big")),
            R"({"code":"resource_exhausted","message":"too big"})");
}

TEST(ErrorDetails, GrpcStatusDetailsBinIsAGoogleRpcStatus) {
  EXPECT_EQ(GrpcStatusDetailsBin(absl::ResourceExhaustedError("too big")), "");
  const std::string bin = GrpcStatusDetailsBin(Refused(absl::Milliseconds(250)));
  EXPECT_EQ(bin.find('='), std::string::npos);
  google::rpc::Status status;
  ASSERT_TRUE(status.ParseFromString(Unbase64(bin)));
  EXPECT_EQ(status.code(), 8);
  EXPECT_EQ(status.message(), "server overloaded");
  ASSERT_EQ(status.details_size(), 1);
  EXPECT_EQ(status.details(0).type_url(), "type.googleapis.com/google.rpc.RetryInfo");
  google::rpc::RetryInfo info;
  ASSERT_TRUE(status.details(0).UnpackTo(&info));
  EXPECT_EQ(info.retry_delay().seconds(), 0);
  EXPECT_EQ(info.retry_delay().nanos(), 250000000);

  std::vector<std::pair<std::string, std::string>> headers;
  AppendGrpcStatusDetails(Refused(absl::Milliseconds(250)), /*pushback=*/true, &headers);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[0].first, "grpc-status-details-bin");
  EXPECT_EQ(headers[0].second, bin);
  EXPECT_EQ(headers[1], std::make_pair(std::string("grpc-retry-pushback-ms"), std::string("250")));
  headers.clear();
  AppendGrpcStatusDetails(absl::InternalError("x"), /*pushback=*/true, &headers);
  EXPECT_TRUE(headers.empty());

  EXPECT_EQ(GrpcWebTrailers(Refused(absl::Milliseconds(250))),
            absl::StrCat("grpc-status: 8\r\ngrpc-message: server overloaded\r\n"
                         "grpc-status-details-bin: ", bin, "\r\n"));
}

TEST(ErrorDetails, RetryAfterRoundsUpToWholeSeconds) {
  EXPECT_EQ(RetryAfterValue(Refused(absl::Milliseconds(100))), "1");
  EXPECT_EQ(RetryAfterValue(Refused(absl::Milliseconds(1000))), "1");
  EXPECT_EQ(RetryAfterValue(Refused(absl::Milliseconds(1001))), "2");
  EXPECT_EQ(RetryAfterValue(absl::UnavailableError("x")), std::nullopt);
  EXPECT_THAT(std::string(CorsPolicy::kExposeHeaders), HasSubstr("retry-after"));
}

TEST(Timeouts, ConnectMilliseconds) {
  EXPECT_EQ(*ParseConnectTimeout("250"), absl::Milliseconds(250));
  EXPECT_EQ(*ParseConnectTimeout("0"), absl::ZeroDuration());
  for (const char* bad : {"", "-1", "1.5", "12345678901", "10s", " 5"}) {
    EXPECT_EQ(ParseConnectTimeout(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Timeouts, GrpcUnits) {
  EXPECT_EQ(*ParseGrpcTimeout("2S"), absl::Seconds(2));
  EXPECT_EQ(*ParseGrpcTimeout("150m"), absl::Milliseconds(150));
  EXPECT_EQ(*ParseGrpcTimeout("7u"), absl::Microseconds(7));
  EXPECT_EQ(*ParseGrpcTimeout("1H"), absl::Hours(1));
  for (const char* bad : {"", "S", "5", "5x", "123456789S", "-5S"}) {
    EXPECT_EQ(ParseGrpcTimeout(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ConnectProtocolVersion, AbsentOrOne) {
  EXPECT_TRUE(CheckConnectProtocolVersion(std::nullopt).ok());
  EXPECT_TRUE(CheckConnectProtocolVersion("1").ok());
  EXPECT_EQ(CheckConnectProtocolVersion("2").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConnectProtocolVersion("").code(), absl::StatusCode::kInvalidArgument);
}

TEST(Encoding, IdentityGzipAndUnknown) {
  EXPECT_EQ(*ParseEncoding(""), Encoding::kIdentity);
  EXPECT_EQ(*ParseEncoding("identity"), Encoding::kIdentity);
  EXPECT_EQ(*ParseEncoding("GZIP"), Encoding::kGzip);
  EXPECT_EQ(ParseEncoding("br").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(EncodingName(Encoding::kGzip), "gzip");
  EXPECT_EQ(EncodingName(Encoding::kIdentity), "identity");
}

TEST(NegotiateEncoding, QValuesIdentityAndStar) {
  struct Case {
    std::optional<absl::string_view> header;
    Encoding want;
  };
  const Case cases[] = {
      // Asked for, in the forms clients send.
      {"gzip", Encoding::kGzip},
      {"gzip, deflate, br, zstd", Encoding::kGzip},  // a browser
      {"gzip,br", Encoding::kGzip},                  // connect-node
      {"br, gzip;q=0.8", Encoding::kGzip},
      {"GZIP", Encoding::kGzip},
      {"x-gzip", Encoding::kGzip},
      {"gzip; q=1.000", Encoding::kGzip},
      {"gzip;Q=0.001", Encoding::kGzip},
      {"*", Encoding::kGzip},
      {"br, *;q=0.5", Encoding::kGzip},
      {"gzip;q=0.5, identity;q=0.5", Encoding::kGzip},  // a tie: the server's choice
      {"gzip;q=0.5, identity;q=0.1", Encoding::kGzip},
      {"identity;q=0, gzip", Encoding::kGzip},
      // Not asked for, or refused (RFC 9110 12.5.3: q=0 means "not acceptable").
      {std::nullopt, Encoding::kIdentity},  // no header: nothing is compressed unasked
      {"", Encoding::kIdentity},
      {"identity", Encoding::kIdentity},
      {"br", Encoding::kIdentity},
      {"br, deflate", Encoding::kIdentity},
      {"gzip;q=0", Encoding::kIdentity},
      {"gzip;q=0.0", Encoding::kIdentity},
      {"gzip;q=0.000", Encoding::kIdentity},
      {"gzip; q=0, *", Encoding::kIdentity},  // named beats "*"
      {"*;q=0", Encoding::kIdentity},
      {"*;q=0, identity", Encoding::kIdentity},
      {"gzip;q=0.4, identity;q=0.5", Encoding::kIdentity},  // identity preferred
      {"gzip, gzip;q=0", Encoding::kIdentity},              // a refusal anywhere wins
      {"identity, *;q=0", Encoding::kIdentity},
      // Malformed weights: the entry is ignored.
      {"gzip;q=2", Encoding::kIdentity},
      {"gzip;q=1.5", Encoding::kIdentity},
      {"gzip;q=0.0001", Encoding::kIdentity},
      {"gzip;q=", Encoding::kIdentity},
      {"gzip;q=abc", Encoding::kIdentity},
      {"gzip;q=-1", Encoding::kIdentity},
      {"gzip;q=2, *;q=0.1", Encoding::kGzip},  // the bad entry gone, "*" covers gzip
      // Other parameters do not matter; empty items are skipped.
      {"gzip;level=9", Encoding::kGzip},
      {" , ,gzip", Encoding::kGzip},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(NegotiateEncoding(c.header), c.want)
        << (c.header.has_value() ? std::string(*c.header) : "(absent)");
  }
}


TEST(Gzip, RoundTripAndLimits) {
  const std::string data(100000, 'a');
  auto zipped = Gzip(data);
  ASSERT_TRUE(zipped.ok());
  EXPECT_LT(zipped->size(), data.size() / 10);
  auto back = Gunzip(*zipped, data.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
  // A bomb: stops at the bound.
  EXPECT_EQ(Gunzip(*zipped, 1000).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Gunzip(*zipped, data.size() - 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Gunzip(zipped->substr(0, zipped->size() / 2), data.size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gunzip("not gzip at all", 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gunzip("", 1000).status().code(), absl::StatusCode::kInvalidArgument);
  auto empty = Gzip("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*Gunzip(*empty, 10), "");
}

TEST(Gzip, LevelsAndOneCompressorPerThread) {
  const std::string text = JsonLike(55000);
  size_t fast = 0, best = 0;
  for (int level : {1, 9, 1, 6, 1}) {  // switching levels re-creates the thread's compressor
    auto z = Gzip(text, level);
    ASSERT_TRUE(z.ok()) << level;
    EXPECT_EQ(*Gunzip(*z, text.size()), text) << level;
    if (level == 1) fast = z->size();
    if (level == 9) best = z->size();
  }
  EXPECT_LE(best, fast);
  EXPECT_LT(fast, text.size() / 3);
  for (int bad : {0, -1, 10}) {
    EXPECT_EQ(Gzip(text, bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Gunzip, SeveralMembersAsGzipWritesThem) {
  const std::string a = JsonLike(3000), b(5000, 'b');
  const std::string both = *Gzip(a) + *Gzip(b);
  auto back = Gunzip(both, 1 << 20);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a + b);
  // Trailing bytes that are not another member.
  EXPECT_EQ(Gunzip(*Gzip(a) + "junk", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Sets the gzip trailer's size claim (ISIZE, the last 4 bytes) to `claim`.
std::string WithClaim(std::string zipped, uint32_t claim) {
  for (int i = 0; i < 4; ++i) zipped[zipped.size() - 4 + i] = static_cast<char>(claim >> (8 * i));
  return zipped;
}

TEST(Gunzip, ASizeClaimIsOnlyAHint) {
  const std::string data = JsonLike(300000);
  const std::string zipped = *Gzip(data);
  // Claims of 0, too little, and far too much (beyond the bound): the data decides, and the
  // bound holds whatever the claim. (zlib checks ISIZE only at the very end: a wrong claim is
  // refused as malformed once the output is whole, never before.)
  for (uint32_t claim : {0u, 100u, 1u << 31}) {
    auto back = Gunzip(WithClaim(zipped, claim), data.size());
    EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument) << claim;
    EXPECT_EQ(Gunzip(WithClaim(zipped, claim), data.size() - 1).status().code(),
              absl::StatusCode::kResourceExhausted)
        << claim;
  }
  // Honest claims below and above the eager size both come back whole.
  const std::string big = JsonLike(3 << 20);
  auto back = Gunzip(*Gzip(big), big.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, big);
}

TEST(SampledEntropyBits, RandomVersusText) {
  EXPECT_EQ(SampledEntropyBits(""), 0);
  EXPECT_EQ(SampledEntropyBits(std::string(5000, 'x')), 0);
  for (size_t n : {1024u, 4096u, 56320u, 1u << 20}) {
    EXPECT_GT(SampledEntropyBits(RandomBytes(n, 7)), 7.7) << n;
    EXPECT_LT(SampledEntropyBits(JsonLike(n)), 5.5) << n;
  }
  // base64 of random bytes: 6 bits a byte.
  const double b64 = SampledEntropyBits(absl::Base64Escape(RandomBytes(40000, 3)));
  EXPECT_GT(b64, 5.8);
  EXPECT_LT(b64, 6.05);
}

TEST(Frames, EncodeAndParseOne) {
  const std::string frame = EncodeFrame(0, "hello");
  EXPECT_EQ(frame, std::string("\x00\x00\x00\x00\x05hello", 10));
  bool compressed = true;
  auto message = ParseUnaryRequestFrame(frame, &compressed);
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(*message, "hello");
  EXPECT_FALSE(compressed);
  auto z = ParseUnaryRequestFrame(EncodeFrame(kFrameCompressed, "zz"), &compressed);
  ASSERT_TRUE(z.ok());
  EXPECT_TRUE(compressed);
  const std::string big(70000, 'x');
  EXPECT_EQ(*ParseUnaryRequestFrame(EncodeFrame(0, big), &compressed), big);
  EXPECT_EQ(*ParseUnaryRequestFrame(EncodeFrame(0, ""), &compressed), "");
}

TEST(Frames, HeaderAloneIsTheFramesFirstFiveBytes) {
  EXPECT_EQ(EncodeFrameHeader(kFrameTrailer, 0x01020304), std::string("\x80\x01\x02\x03\x04", 5));
  const std::string big(70000, 'y');
  EXPECT_EQ(EncodeFrameHeader(0, big.size()) + big, EncodeFrame(0, big));
}

TEST(Frames, RefusesMalformed) {
  bool compressed = false;
  const std::string frame = EncodeFrame(0, "hello");
  EXPECT_THAT(ParseUnaryRequestFrame(frame.substr(0, 3), &compressed).status().message(),
              HasSubstr("5-byte frame header"));
  EXPECT_THAT(ParseUnaryRequestFrame(frame.substr(0, 8), &compressed).status().message(),
              HasSubstr("truncated"));
  EXPECT_THAT(ParseUnaryRequestFrame(frame + "x", &compressed).status().message(),
              HasSubstr("trailing"));
  EXPECT_EQ(ParseUnaryRequestFrame(EncodeFrame(kFrameTrailer, "a: b\r\n"), &compressed)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUnaryRequestFrame(frame + EncodeFrame(0, "again"), &compressed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Trailers, StatusAndPercentEncodedMessage) {
  EXPECT_EQ(GrpcWebTrailers(absl::OkStatus()), "grpc-status: 0\r\n");
  EXPECT_EQ(GrpcWebTrailers(absl::InvalidArgumentError("100% bad\r\nü")),
            "grpc-status: 3\r\ngrpc-message: 100%25 bad%0D%0A%C3%BC\r\n");
  EXPECT_EQ(PercentEncode("plain text"), "plain text");
}

TEST(GrpcWebText, ContentTypesAndBase64Chunks) {
  auto t = ParseContentType("application/grpc-web-text");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->protocol, Protocol::kGrpcWeb);
  EXPECT_TRUE(t->text);
  EXPECT_EQ(GrpcWebContentType(*t), "application/grpc-web-text+proto");
  EXPECT_TRUE(ParseContentType("application/grpc-web-text+proto; charset=utf-8")->text);
  EXPECT_FALSE(ParseContentType("application/grpc-web+proto")->text);
  // One chunk, two padded chunks back to back, line breaks.
  EXPECT_EQ(*DecodeGrpcWebText(EncodeGrpcWebText("hello")), "hello");
  EXPECT_EQ(*DecodeGrpcWebText(EncodeGrpcWebText("a") + EncodeGrpcWebText("bc")), "abc");
  EXPECT_EQ(*DecodeGrpcWebText("aGVs\r\nbG8="), "hello");
  EXPECT_EQ(*DecodeGrpcWebText(""), "");
  EXPECT_EQ(DecodeGrpcWebText("a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeGrpcWebText("!!!!").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConnectGet, QueryParameters) {
  auto q = ParseConnectGetQuery("connect=v1&encoding=json&message=%7B%22keyId%22%3A%22a+b%22%7D",
                                1024);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->codec, Codec::kJson);
  EXPECT_EQ(q->message, R"({"keyId":"a b"})");
  EXPECT_EQ(q->compression, Encoding::kIdentity);
  // base64=1: URL-safe, padding optional; unknown parameters ignored.
  q = ParseConnectGetQuery("encoding=proto&base64=1&message=_-8&cachebust=42", 1024);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->message, "\xff\xef");
  q = ParseConnectGetQuery("encoding=proto&base64=1&compression=gzip&message=", 1024);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->compression, Encoding::kGzip);
  EXPECT_EQ(q->message, "");
  const auto code = [](absl::string_view query) {
    return ParseConnectGetQuery(query, 8).status().code();
  };
  EXPECT_EQ(code("message=x"), absl::StatusCode::kInvalidArgument);             // no encoding
  EXPECT_EQ(code("encoding=xml&message=x"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("encoding=proto"), absl::StatusCode::kInvalidArgument);        // no message
  EXPECT_EQ(code("connect=v2&encoding=proto&message="), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("encoding=proto&message=%zz"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("encoding=proto&message=%4"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("encoding=proto&base64=1&message=*"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("encoding=proto&compression=br&message="), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code("encoding=proto&message=123456789"), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(ParseConnectGetQuery("message=x", 8).status().message(), HasSubstr("encoding"));
  EXPECT_EQ(ParseConnectGetQuery("encoding=proto&message=%zz", 8).status().message(),
            "query: message: a '%' escape is not two hex digits");
  // A parameter given twice: the first counts, as connect-go reads it.
  q = ParseConnectGetQuery("encoding=proto&message=a&message=b&encoding=json", 8);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->message, "a");
  EXPECT_EQ(q->codec, Codec::kProto);
}

TEST(Cors, ExactOriginsOnly) {
  auto cors = CorsPolicy::Parse("https://app.example.com, http://127.0.0.1:5173");
  ASSERT_TRUE(cors.ok()) << cors.status();
  EXPECT_TRUE(cors->enabled());
  EXPECT_TRUE(cors->Allows("https://app.example.com"));
  EXPECT_TRUE(cors->Allows("HTTPS://APP.EXAMPLE.COM"));
  EXPECT_FALSE(cors->Allows("https://app.example.com:8443"));
  EXPECT_FALSE(cors->Allows("https://evil.app.example.com"));
  EXPECT_FALSE(cors->Allows("null"));

  CorsPolicy::Answer ok = cors->Preflight("https://app.example.com", "POST");
  EXPECT_EQ(ok.status, 204);
  HeaderList headers;
  cors->AddResponseHeaders(std::optional<absl::string_view>("https://evil.example"), &headers);
  for (const auto& [name, value] : headers) EXPECT_NE(name, "access-control-allow-origin");
  CorsPolicy::Answer refused = cors->Preflight("https://evil.example", "POST");
  EXPECT_EQ(refused.status, 403);
  for (const auto& [name, value] : refused.headers) {
    EXPECT_NE(name.rfind("access-control-allow", 0), 0u) << name;
  }
  EXPECT_EQ(cors->Preflight("https://app.example.com", "DELETE").status, 403);

  // No list: nothing at all.
  CorsPolicy none;
  HeaderList empty;
  none.AddResponseHeaders(std::optional<absl::string_view>("https://app.example.com"), &empty);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(none.Preflight("https://app.example.com", "POST").status, 403);

  for (const char* bad : {"*", "null", "app.example.com", "https://", "https://a.example/",
                          "https://a.example/path", "https://*.example.com"}) {
    EXPECT_EQ(CorsPolicy::Create({bad}).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace offload::http

namespace offload::http {
namespace {

TEST(FrameReader, MessagesInAnyPieces) {
  const std::string stream = EncodeFrame(0, "first") + EncodeFrame(kFrameCompressed, "") +
                             EncodeFrame(0, std::string(300, 'z'));
  for (size_t piece : {size_t{1}, size_t{2}, size_t{5}, size_t{7}, stream.size()}) {
    FrameReader reader(1000);
    std::vector<std::pair<bool, std::string>> got;
    for (size_t i = 0; i < stream.size(); i += piece) {
      ASSERT_TRUE(reader
                      .Feed(absl::string_view(stream).substr(i, piece),
                            [&](bool compressed, absl::string_view m) {
                              got.emplace_back(compressed, std::string(m));
                              return absl::OkStatus();
                            })
                      .ok());
      const size_t fed = std::min(i + piece, stream.size());
      const bool boundary = fed == 10 || fed == 15 || fed == stream.size();  // frame ends
      EXPECT_EQ(reader.at_boundary(), boundary) << piece << " " << fed;
    }
    ASSERT_EQ(got.size(), 3u) << piece;
    EXPECT_EQ(got[0], std::make_pair(false, std::string("first")));
    EXPECT_EQ(got[1], std::make_pair(true, std::string()));
    EXPECT_EQ(got[2].second, std::string(300, 'z'));
  }
}

TEST(FrameReader, RefusesTrailersOversizeAndStopsOnError) {
  const auto none = [](bool, absl::string_view) { return absl::OkStatus(); };
  FrameReader trailer(100);
  EXPECT_EQ(trailer.Feed(EncodeFrame(kFrameTrailer, "x"), none).code(),
            absl::StatusCode::kInvalidArgument);
  // The header alone says too much: refused before a byte of it is held.
  FrameReader big(100);
  EXPECT_EQ(big.Feed(EncodeFrame(0, std::string(101, 'a')).substr(0, 5), none).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(big.Feed(EncodeFrame(0, "ok"), none).code(), absl::StatusCode::kResourceExhausted);
  FrameReader failing(100);
  int calls = 0;
  const auto fail = [&](bool, absl::string_view) {
    ++calls;
    return absl::InternalError("no");
  };
  EXPECT_EQ(failing.Feed(EncodeFrame(0, "a") + EncodeFrame(0, "b"), fail).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace offload::http
