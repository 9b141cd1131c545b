#include "service/http/rpc_codec.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<CallOptions> Parse(Protocol protocol, std::map<std::string, std::string> headers) {
  return ParseCallHeaders(protocol, [&headers](const char* name) -> std::optional<absl::string_view> {
    auto it = headers.find(name);
    if (it == headers.end()) return std::nullopt;
    return absl::string_view(it->second);
  });
}

TEST(ParseCallHeaders, ConnectHeaders) {
  auto o = Parse(Protocol::kConnect, {{"Connect-Protocol-Version", "1"},
                                      {"Connect-Timeout-Ms", "2500"},
                                      {"Content-Encoding", "gzip"},
                                      {"Accept-Encoding", "br, gzip;q=0.5"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->encoding, Encoding::kGzip);
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  EXPECT_TRUE(o->gzip_response);
  o = Parse(Protocol::kConnect, {});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->encoding, Encoding::kIdentity);
  EXPECT_FALSE(o->timeout.has_value());
  EXPECT_FALSE(o->gzip_response);
  EXPECT_EQ(Parse(Protocol::kConnect, {{"Connect-Protocol-Version", "2"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Parse(Protocol::kConnect, {{"Content-Encoding", "br"}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(ParseCallHeaders, GrpcWebHeadersOnly) {
  // Connect's headers mean nothing to gRPC-Web, and the other way round.
  auto o = Parse(Protocol::kGrpcWeb, {{"grpc-timeout", "3S"},
                                      {"grpc-encoding", "gzip"},
                                      {"Connect-Protocol-Version", "7"},
                                      {"Accept-Encoding", "gzip"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->timeout, absl::Seconds(3));
  EXPECT_EQ(o->encoding, Encoding::kGzip);
  EXPECT_FALSE(o->gzip_response);
  EXPECT_EQ(Parse(Protocol::kGrpcWeb, {{"grpc-timeout", "3"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Parse(Protocol::kConnect, {{"grpc-timeout", "x"}}).ok());
}

TEST(DecodeRequest, ProtoJsonFramesAndGzip) {
  v1::VerifyRequest want;
  want.set_public_key(std::string(32, 'p'));
  want.set_message("hi");
  const std::string bytes = want.SerializeAsString();
  const ContentType proto{Protocol::kConnect, Codec::kProto};
  const ContentType json{Protocol::kConnect, Codec::kJson};
  const ContentType web{Protocol::kGrpcWeb, Codec::kProto};

  v1::VerifyRequest got;
  ASSERT_TRUE(DecodeRequest(proto, Encoding::kIdentity, bytes, 1 << 20, &got).ok());
  EXPECT_EQ(got.SerializeAsString(), bytes);
  got.Clear();
  ASSERT_TRUE(DecodeRequest(web, Encoding::kIdentity, EncodeFrame(0, bytes), 1 << 20, &got).ok());
  EXPECT_EQ(got.SerializeAsString(), bytes);
  const std::string zipped = *Gzip(bytes);
  got.Clear();
  ASSERT_TRUE(DecodeRequest(proto, Encoding::kGzip, zipped, 1 << 20, &got).ok());
  EXPECT_EQ(got.SerializeAsString(), bytes);
  got.Clear();
  ASSERT_TRUE(DecodeRequest(web, Encoding::kGzip, EncodeFrame(kFrameCompressed, zipped), 1 << 20,
                            &got)
                  .ok());
  EXPECT_EQ(got.SerializeAsString(), bytes);
  got.Clear();
  ASSERT_TRUE(DecodeRequest(json, Encoding::kIdentity, R"({"message":"aGk="})", 1 << 20, &got).ok());
  EXPECT_EQ(got.message(), "hi");
  got.Clear();
  EXPECT_TRUE(DecodeRequest(json, Encoding::kIdentity, "", 1 << 20, &got).ok());  // as {}
}

TEST(DecodeRequest, Refusals) {
  v1::VerifyRequest got;
  const ContentType proto{Protocol::kConnect, Codec::kProto};
  const ContentType json{Protocol::kConnect, Codec::kJson};
  const ContentType web{Protocol::kGrpcWeb, Codec::kProto};
  absl::Status s = DecodeRequest(json, Encoding::kIdentity, R"({"nope":1})", 1 << 20, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("invalid JSON"));
  s = DecodeRequest(proto, Encoding::kIdentity, "\xff\xff\xff", 1 << 20, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("offload.v1.VerifyRequest"));
  s = DecodeRequest(web, Encoding::kIdentity, std::string("\x00\x00\x00\x00\x05\x0a", 6), 1 << 20,
                    &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // A compressed frame needs grpc-encoding (as gRPC: INTERNAL).
  s = DecodeRequest(web, Encoding::kIdentity, EncodeFrame(kFrameCompressed, *Gzip("x")), 1 << 20,
                    &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  // Decompressed size is bounded.
  s = DecodeRequest(proto, Encoding::kGzip, *Gzip(std::string(4096, 'a')), 1024, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
}

TEST(EncodeResponse, ProtoJsonAndLimit) {
  v1::AeadOpenResponse r;
  r.set_plaintext("hello");
  r.set_key_version(2);
  std::string out;
  ASSERT_TRUE(EncodeResponse(Codec::kProto, r, 1 << 20, &out).ok());
  EXPECT_EQ(out, r.SerializeAsString());
  ASSERT_TRUE(EncodeResponse(Codec::kJson, r, 1 << 20, &out).ok());
  EXPECT_EQ(out, R"({"plaintext":"aGVsbG8=","keyVersion":2})");
  const absl::Status s = EncodeResponse(Codec::kProto, r, 4, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace offload::http
