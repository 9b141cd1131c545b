#include "service/http/rpc_codec.h"

#include <map>
#include <random>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "tests/testing/payloads.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
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

// A JSON request the parser refuses is described by the schema's names only: protobuf's message
// quotes the offending value or a snippet of the input (an ImportKey's private key, into the
// caller's answer, the log and the audit log).
TEST(DecodeRequest, JsonErrorsNameTheFieldButNeverRepeatTheInput) {
  const ContentType json{Protocol::kConnect, Codec::kJson};
  struct Case {
    std::string body;
    std::string expect;  // a part of the message
  };
  const Case cases[] = {
      {R"({"keyId":"a","type":"KEY_TYPE_ED25519","secret":"-----BEGIN SECRET-----"})",
       "request: invalid JSON: secret: invalid value for type TYPE_BYTES"},
      {R"({"keyId":"a","secret":"U0VDUkVU U0VDUkVU"})", "secret: invalid value"},
      {R"({"keyId":"a", "secret": "SECRET" "x"})", "Expected , or } after key:value pair."},
      {R"({"keyId":"a","secret":SECRET})", "Unexpected token."},
      {R"({"keyId":"a","secret":["SECRET"]})", "secret: "},
      {R"({"keyId":"a","type":"SECRET"})", "type: invalid value for type"},
      {R"({"keyId":"a","SECRET":1})", "a field the message does not have"},
      {R"({"keyId":"a","secret":{"x":"SECRET"}})", "request: invalid JSON: "},
      {R"({"SECRET)", "request: invalid JSON: "},
      {R"({"keyId":"a","secret":"SECRET\u0000"})", "request: invalid JSON: "},
      // An unknown field whose name looks like a path and the parser's words, or holds a newline.
      {R"({"keyId: Unexpected token SECRET":1})", "a field the message does not have"},
      {R"({"SECRET\nx":1})", "a field the message does not have"},
      {R"({"keyId" "SECRET"})", "Expected : between key:value pair."},
  };
  for (const Case& c : cases) {
    v1::ImportKeyRequest got;
    const absl::Status s = DecodeRequest(json, Encoding::kIdentity, c.body, 1 << 20, &got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(s.message(), HasSubstr(c.expect)) << c.body;
    EXPECT_THAT(s.message(), Not(HasSubstr("SECRET"))) << c.body << " -> " << s.message();
    EXPECT_THAT(s.message(), Not(HasSubstr("U0VD"))) << c.body << " -> " << s.message();
    EXPECT_THAT(s.message(), Not(HasSubstr("\n"))) << c.body;
  }
  // Nested fields are named by their path.
  v1::BatchVerifyRequest batch;
  const absl::Status s = DecodeRequest(
      json, Encoding::kIdentity, R"({"items":[{"signature":"%SECRET%"}]})", 1 << 20, &batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("signature"));
  EXPECT_THAT(s.message(), Not(HasSubstr("SECRET"))) << s.message();
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

namespace offload::http {
namespace {

// A varint as protobuf writes it.
std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

std::string Field(uint64_t number, int wire, absl::string_view payload) {
  std::string out = Varint((number << 3) | wire);
  if (wire == 2) out += Varint(payload.size());
  out.append(payload.data(), payload.size());
  return out;
}

// [issue 34] Wherever the in-place reader says yes, protobuf's parser agrees, value for value;
// and it says yes to every well-formed AeadOpenRequest without groups. Random field orders,
// repeats, unknown fields of each wire type, truncations and flipped bytes; fixed seed.
TEST(ParseBytesFieldsInPlace, AgreesWithProtobufOnAeadOpenRequests) {
  const uint64_t seed = 34;
  std::mt19937_64 rng(seed);
  const auto& type = *v1::AeadOpenRequest::descriptor();
  int said_yes = 0, well_formed = 0;
  for (int round = 0; round < 20000; ++round) {
    SCOPED_TRACE(absl::StrCat("seed ", seed, " round ", round));
    std::string message;
    bool groups = false, bad_utf8 = false;
    const int parts = static_cast<int>(rng() % 7);
    for (int i = 0; i < parts; ++i) {
      const uint64_t number = 1 + rng() % 5;  // 4 and 5 are unknown
      const std::string payload = RandomBytes(rng() % 40, static_cast<uint32_t>(rng()));
      switch (rng() % 6) {
        case 0: message += Varint(number << 3) + Varint(rng()); break;           // varint
        case 1: message += Varint((number << 3) | 1) + payload.substr(0, 8) + std::string(8 - std::min<size_t>(8, payload.size()), 'x'); break;
        case 2: message += Varint((number << 3) | 5) + "abcd"; break;             // fixed32
        case 3: {
          // a group, ended right: protobuf skips it as unknown; the reader leaves it
          message += Varint((number << 3) | 3) + Varint((number << 3) | 4);
          groups = true;
          break;
        }
        default: {
          std::string bytes = payload;
          if (number == 1) {
            // key ids: mostly ASCII, sometimes not UTF-8
            if (rng() % 64 == 0) {
              bytes = "\xff\xfe";
              bad_utf8 = true;
            } else {
              bytes = absl::StrCat("key-", rng() % 1000);
            }
          }
          message += Field(number, 2, bytes);
        }
      }
    }
    if (!groups && !bad_utf8) ++well_formed;
    // Damage some: a truncation, a flipped byte, a garbage tail.
    switch (rng() % 4) {
      case 0:
        if (!message.empty()) message.resize(rng() % message.size());
        break;
      case 1:
        if (!message.empty()) message[rng() % message.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      default:
        break;
    }
    absl::string_view fields[3];
    const bool mine = ParseBytesFieldsInPlace(message, type, absl::MakeSpan(fields));
    v1::AeadOpenRequest theirs;
    const bool ok = theirs.ParseFromArray(message.data(), static_cast<int>(message.size()));
    if (mine) {
      ++said_yes;
      ASSERT_TRUE(ok) << absl::CHexEscape(message);
      EXPECT_EQ(fields[0], theirs.key_id());
      EXPECT_EQ(fields[1], theirs.envelope());
      EXPECT_EQ(fields[2], theirs.associated_data());
      // Views into the message itself: nothing copied.
      for (absl::string_view f : fields) {
        if (!f.empty()) {
          EXPECT_GE(f.data(), message.data());
          EXPECT_LE(f.data() + f.size(), message.data() + message.size());
        }
      }
    }
  }
  std::printf("read in place: %d of %d messages (%d well-formed before damage)\n", said_yes, 20000,
              well_formed);
  // Most undamaged messages are read in place (half are left as they were).
  EXPECT_GT(said_yes, well_formed / 3);
}

TEST(ParseBytesFieldsInPlace, ReadsAWellFormedRequestAndRefusesWhatItCannotVouchFor) {
  v1::AeadOpenRequest q;
  q.set_key_id("blobs");
  q.set_envelope(std::string(55000, 'e'));
  q.set_associated_data("aad");
  const std::string wire = q.SerializeAsString();
  absl::string_view f[3];
  ASSERT_TRUE(ParseBytesFieldsInPlace(wire, *v1::AeadOpenRequest::descriptor(), absl::MakeSpan(f)));
  EXPECT_EQ(f[0], "blobs");
  EXPECT_EQ(f[1].size(), 55000u);
  EXPECT_EQ(f[1].data(), wire.data() + wire.find(std::string(100, 'e')));
  EXPECT_EQ(f[2], "aad");
  // Too few slots for the type's field numbers; a type with other fields (VerifyResponse: a
  // bool); a truncated field; a key id that is not UTF-8.
  absl::string_view two[2];
  EXPECT_FALSE(ParseBytesFieldsInPlace(wire, *v1::AeadOpenRequest::descriptor(), absl::MakeSpan(two)));
  EXPECT_FALSE(ParseBytesFieldsInPlace("", *v1::AeadOpenResponse::descriptor(), absl::MakeSpan(f)));
  EXPECT_FALSE(ParseBytesFieldsInPlace(absl::string_view(wire).substr(0, wire.size() - 1),
                                       *v1::AeadOpenRequest::descriptor(), absl::MakeSpan(f)));
  EXPECT_FALSE(ParseBytesFieldsInPlace(Field(1, 2, "\xc3\x28"), *v1::AeadOpenRequest::descriptor(),
                                       absl::MakeSpan(f)));
  // The empty message: every field empty.
  EXPECT_TRUE(ParseBytesFieldsInPlace("", *v1::AeadOpenRequest::descriptor(), absl::MakeSpan(f)));
  EXPECT_TRUE(f[1].empty());
}

TEST(UncompressedProtoMessage, OnlyBinaryProtoUncompressedInOneFrame) {
  const std::string message = "\x0a\x01k";
  const ContentType connect{Protocol::kConnect, Codec::kProto, false};
  const ContentType grpc{Protocol::kGrpc, Codec::kProto, false};
  const ContentType web{Protocol::kGrpcWeb, Codec::kProto, false};
  EXPECT_EQ(UncompressedProtoMessage(connect, Encoding::kIdentity, message), message);
  EXPECT_EQ(UncompressedProtoMessage(grpc, Encoding::kIdentity, EncodeFrame(0, message)), message);
  EXPECT_EQ(UncompressedProtoMessage(web, Encoding::kIdentity, EncodeFrame(0, message)), message);
  EXPECT_FALSE(UncompressedProtoMessage(connect, Encoding::kGzip, message).has_value());
  EXPECT_FALSE(UncompressedProtoMessage(grpc, Encoding::kGzip, EncodeFrame(0, message)).has_value());
  EXPECT_FALSE(
      UncompressedProtoMessage(grpc, Encoding::kIdentity, EncodeFrame(kFrameCompressed, message))
          .has_value());
  EXPECT_FALSE(UncompressedProtoMessage(grpc, Encoding::kIdentity, message).has_value());
  EXPECT_FALSE(UncompressedProtoMessage({Protocol::kGrpcWeb, Codec::kProto, true},
                                        Encoding::kIdentity, EncodeFrame(0, message))
                   .has_value());
  EXPECT_FALSE(UncompressedProtoMessage({Protocol::kConnect, Codec::kJson, false},
                                        Encoding::kIdentity, "{}")
                   .has_value());
}

}  // namespace
}  // namespace offload::http
