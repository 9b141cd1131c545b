#include "service/http/rpc_codec.h"

#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "tests/testing/payloads.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;
using testhttp::JsonLike;
using testhttp::RandomBytes;

absl::StatusOr<CallOptions> Parse(Protocol protocol, std::map<std::string, std::string> headers) {
  return ParseCallHeaders(protocol, [&headers](const char* name) -> std::optional<absl::string_view> {
    // Names are asked in lower case, as HTTP/2 carries them: the test's are any case.
    for (const auto& [n, v] : headers) {
      if (n == name) return absl::string_view(v);
      if (absl::AsciiStrToLower(n) == name) return absl::string_view(v);
    }
    return std::nullopt;
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
  EXPECT_EQ(o->accept, Encoding::kGzip);
  o = Parse(Protocol::kConnect, {});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->encoding, Encoding::kIdentity);
  EXPECT_FALSE(o->timeout.has_value());
  EXPECT_EQ(o->accept, Encoding::kIdentity);
  // Refused, or only in the streaming protocol's header (not read for unary calls).
  for (const char* refused : {"gzip;q=0", "identity", "*;q=0", ""}) {
    o = Parse(Protocol::kConnect, {{"Accept-Encoding", refused}});
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->accept, Encoding::kIdentity) << refused;
  }
  o = Parse(Protocol::kConnect, {{"Connect-Accept-Encoding", "gzip"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->accept, Encoding::kIdentity);
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
  EXPECT_EQ(o->accept, Encoding::kIdentity);  // Accept-Encoding is not gRPC-Web's
  o = Parse(Protocol::kGrpcWeb, {{"grpc-accept-encoding", "gzip,br"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->accept, Encoding::kGzip);
  o = Parse(Protocol::kGrpcWeb, {{"grpc-accept-encoding", "identity, deflate"}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->accept, Encoding::kIdentity);
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


// An AEAD Open answer of `plaintext`, encoded as the gateway encodes it.
std::string OpenResponse(Codec codec, const std::string& plaintext) {
  v1::AeadOpenResponse r;
  r.set_plaintext(plaintext);
  r.set_key_version(1);
  r.set_memo_hit(true);
  std::string out;
  EXPECT_TRUE(EncodeResponse(codec, r, 1 << 20, &out).ok());
  return out;
}

TEST(CompressResponse, OnlyWhatShrinksAndWasAskedFor) {
  const CompressionOptions options;  // level 1, 1024 bytes at least
  // A compressible 55 KB plaintext: compressed, much smaller, and it decompresses back.
  const std::string text = OpenResponse(Codec::kProto, JsonLike(55000));
  std::string m = text;
  Compression c = CompressResponse(Encoding::kGzip, options, &m);
  EXPECT_EQ(c.result, CompressionResult::kCompressed);
  EXPECT_EQ(c.encoding, Encoding::kGzip);
  EXPECT_LT(m.size(), text.size() / 3);
  EXPECT_EQ(*Gunzip(m, text.size()), text);
  // Not asked for: untouched.
  m = text;
  c = CompressResponse(Encoding::kIdentity, options, &m);
  EXPECT_EQ(c.result, CompressionResult::kNotAsked);
  EXPECT_EQ(c.encoding, Encoding::kIdentity);
  EXPECT_EQ(m, text);
  // Compression off.
  m = text;
  c = CompressResponse(Encoding::kGzip, CompressionOptions{0, 1024}, &m);
  EXPECT_EQ(c.result, CompressionResult::kNotAsked);
  EXPECT_EQ(m, text);
  // Random 55 KB (ciphertext, keys, random plaintext): sent as it is, without a deflate pass.
  const std::string random = OpenResponse(Codec::kProto, RandomBytes(55000, 1));
  m = random;
  c = CompressResponse(Encoding::kGzip, options, &m);
  EXPECT_EQ(c.result, CompressionResult::kIncompressible);
  EXPECT_EQ(c.encoding, Encoding::kIdentity);
  EXPECT_EQ(m, random);
  // Small: under min_bytes, whatever it is.
  const std::string small = OpenResponse(Codec::kProto, std::string(900, 'a'));
  m = small;
  c = CompressResponse(Encoding::kGzip, options, &m);
  EXPECT_EQ(c.result, CompressionResult::kTooSmall);
  EXPECT_EQ(m, small);
  m = small;
  c = CompressResponse(Encoding::kGzip, CompressionOptions{1, 0}, &m);
  EXPECT_EQ(c.result, CompressionResult::kCompressed);
  // JSON of random bytes is base64 (6 bits a byte): gzip still saves a fifth.
  const std::string b64 = OpenResponse(Codec::kJson, RandomBytes(55000, 2));
  m = b64;
  c = CompressResponse(Encoding::kGzip, options, &m);
  EXPECT_EQ(c.result, CompressionResult::kCompressed);
  EXPECT_LT(m.size(), b64.size() * 85 / 100);
  EXPECT_EQ(*Gunzip(m, b64.size()), b64);
}

TEST(CompressResponse, ASampleThatLiesCostsOnePassAndNothingElse) {
  // Low-entropy samples around random bytes that gzip cannot shrink: compressed, found to save
  // under 1/16, and sent as they were.
  std::string m = RandomBytes(200000, 5);
  const size_t step = (m.size() - 512) / 7;
  for (size_t k = 0; k < 8; ++k) {
    for (size_t i = 0; i < 512; ++i) m[k * step + i] = static_cast<char>('a' + i % 4);
  }
  const std::string before = m;
  ASSERT_LT(SampledEntropyBits(m), kMaxCompressibleEntropyBits);
  const Compression c = CompressResponse(Encoding::kGzip, CompressionOptions{}, &m);
  EXPECT_EQ(c.result, CompressionResult::kNoGain);
  EXPECT_EQ(c.encoding, Encoding::kIdentity);
  EXPECT_EQ(m, before);
}

}  // namespace
}  // namespace offload::http
