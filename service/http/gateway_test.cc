// The gateway over a real socket: raw HTTP/1.1 requests (tests/testing/http_client.h) to a gateway
// serving real operations (file key store in a temporary folder, worker pool, memo). HTTP/2 and
// real Connect / gRPC-Web clients are in tests/e2e/connect.
#include "service/http/gateway.h"

#include <sodium.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "service/crypto/backend.h"
#include "service/http/method_table.h"
#include "service/http/protocol.h"
#include "service/keys/file_key_store.h"
#include "service/memo/memo.h"
#include "tests/testing/http_client.h"

namespace offload::http {
namespace {

using ::testing::HasSubstr;

using testhttp::Response;

class GatewayTest : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxMessage = 64 << 10;

  void SetUp() override {
    ASSERT_TRUE(crypto::InitCrypto().ok());
    char tmpl[] = "/tmp/offload-http-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    SecretBytes kek(32);
    randombytes_buf(kek.data(), kek.size());
    auto store = keys::FileKeyStore::Open(dir_, std::move(kek));
    ASSERT_TRUE(store.ok()) << store.status();
    auto manager = keys::KeyManager::Create(*std::move(store), crypto::BackendChoice{});
    ASSERT_TRUE(manager.ok()) << manager.status();
    keys_ = *std::move(manager);
    memo_ = std::make_unique<memo::Memo>(memo::MemoOptions{});
    pool_ = std::make_unique<ops::WorkerPool>(2);
    ops_ = std::make_unique<ops::Operations>(keys_.get(), memo_.get(), pool_.get(),
                                             crypto::BackendChoice{}, ops::Operations::Options{});
    table_ = std::make_unique<MethodTable>(ops_.get(), keys_.get());
    metrics_ = std::make_unique<metrics::Metrics>();
    gateway_ = std::make_unique<Gateway>(table_.get(), pool_.get(), metrics_.get(), BaseOptions());
    ASSERT_TRUE(gateway_->Start().ok());
    ASSERT_GT(gateway_->port(), 0);

    v1::CreateKeyRequest create;
    create.set_key_id("signer");
    create.set_type(v1::KEY_TYPE_ED25519);
    ASSERT_TRUE(keys_->CreateKey(create).ok());
    v1::SignRequest sign;
    sign.set_key_id("signer");
    sign.set_message("hello");
    v1::SignResponse signed_;
    absl::Notification done;
    pool_->Submit([&] {
      ASSERT_TRUE(ops_->Sign(sign, &signed_).ok());
      done.Notify();
    });
    done.WaitForNotification();
    verify_.set_public_key(signed_.public_key());
    verify_.set_message("hello");
    verify_.set_signature(signed_.signature());
  }

  void TearDown() override {
    gateway_.reset();
    table_.reset();
    ops_.reset();
    pool_.reset();
    keys_.reset();
    memo_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Sends `head` (request line and headers, without the blank line) and `body` on a new
  // connection. status 0: no connection or no response.
  Response Send(const std::string& head, const std::string& body, bool content_length = true) {
    testhttp::Connection c(gateway_->port());
    if (!c.connected()) return {};
    std::string request = head + "\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (content_length) absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
    request += "\r\n" + body;
    c.Send(request);
    return c.Read(std::chrono::seconds(20), absl::StartsWith(head, "HEAD "));
  }

  Response Post(const std::string& path, const std::string& content_type, const std::string& body,
                const std::string& extra_headers = "") {
    std::string head = absl::StrCat("POST ", path, " HTTP/1.1\r\nContent-Type: ", content_type);
    if (!extra_headers.empty()) absl::StrAppend(&head, "\r\n", extra_headers);
    return Send(head, body);
  }

  // Restarts the gateway with `options` changed by `edit`.
  template <typename Edit>
  void Restart(Edit edit) {
    gateway_.reset();
    Gateway::Options options = BaseOptions();
    edit(options);
    gateway_ = std::make_unique<Gateway>(table_.get(), pool_.get(), metrics_.get(), options);
    ASSERT_TRUE(gateway_->Start().ok());
  }

  Gateway::Options BaseOptions() {
    Gateway::Options options;
    options.address = "127.0.0.1:0";
    options.max_message_bytes = kMaxMessage;
    options.threads = 2;
    return options;
  }

  std::string dir_;
  std::unique_ptr<keys::KeyManager> keys_;
  std::unique_ptr<memo::Memo> memo_;
  std::unique_ptr<ops::WorkerPool> pool_;
  std::unique_ptr<ops::Operations> ops_;
  std::unique_ptr<MethodTable> table_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<Gateway> gateway_;
  v1::VerifyRequest verify_;
};

constexpr char kVerify[] = "/offload.v1.Ed25519Service/Verify";

TEST_F(GatewayTest, HealthAndReadiness) {
  EXPECT_EQ(Send("GET /healthz HTTP/1.1", "").status, 200);
  EXPECT_EQ(Send("GET /readyz HTTP/1.1", "").status, 503);
  gateway_->SetReady(true);
  EXPECT_EQ(Send("GET /readyz HTTP/1.1", "").status, 200);
  EXPECT_EQ(Send("GET /nothing HTTP/1.1", "").status, 404);
}

TEST_F(GatewayTest, ConnectProto) {
  const Response r = Post(kVerify, "application/proto", verify_.SerializeAsString(),
                          "Connect-Protocol-Version: 1\r\nConnect-Timeout-Ms: 10000");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "application/proto");
  v1::VerifyResponse response;
  ASSERT_TRUE(response.ParseFromString(r.body));
  EXPECT_TRUE(response.valid());
  const std::string scrape = metrics_->Scrape();
  EXPECT_THAT(scrape, HasSubstr("method=\"Verify\""));
}

TEST_F(GatewayTest, ConnectJson) {
  // bytes are base64 in proto3 JSON; field names in lowerCamelCase or as declared.
  const std::string json = absl::StrCat(
      R"({"publicKey":")", absl::Base64Escape(verify_.public_key()), R"(","message":")",
      absl::Base64Escape("hello"), R"(","signature":")", absl::Base64Escape(verify_.signature()),
      R"("})");
  const Response r = Post(kVerify, "application/json; charset=utf-8", json);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_THAT(r.body, HasSubstr(R"("valid":true)"));
}

TEST_F(GatewayTest, GrpcWebBinary) {
  const Response r =
      Post(kVerify, "application/grpc-web+proto", EncodeFrame(0, verify_.SerializeAsString()),
           "X-Grpc-Web: 1\r\ngrpc-timeout: 10S");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/grpc-web+proto");
  bool compressed = false;
  ASSERT_GE(r.body.size(), kFrameHeaderBytes);
  const uint32_t n = (uint8_t(r.body[1]) << 24) | (uint8_t(r.body[2]) << 16) |
                     (uint8_t(r.body[3]) << 8) | uint8_t(r.body[4]);
  const std::string frame = r.body.substr(0, kFrameHeaderBytes + n);  // outlives the view
  auto message = ParseUnaryRequestFrame(frame, &compressed);
  ASSERT_TRUE(message.ok()) << message.status();
  v1::VerifyResponse response;
  ASSERT_TRUE(response.ParseFromString(std::string(*message)));
  EXPECT_TRUE(response.valid());
  EXPECT_EQ(r.body.substr(kFrameHeaderBytes + n),
            EncodeFrame(kFrameTrailer, "grpc-status: 0\r\n"));
}

TEST_F(GatewayTest, GrpcWebErrorsAreTrailersOnly) {
  const std::string frame = EncodeFrame(0, verify_.SerializeAsString());
  const Response r = Post(kVerify, "application/grpc-web", frame.substr(0, frame.size() - 3));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("grpc-status"), "3");
  EXPECT_THAT(r.header("grpc-message"), HasSubstr("truncated"));
  EXPECT_EQ(r.body, "");
}

TEST_F(GatewayTest, ConnectErrors) {
  const std::string proto = verify_.SerializeAsString();
  Response r = Post(kVerify, "text/plain", proto);
  EXPECT_EQ(r.status, 415);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"unimplemented")"));

  r = Post(kVerify, "application/json", "{\"publicKey\": ");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"invalid_argument")"));
  r = Post(kVerify, "application/json", R"({"noSuchField": 1})");
  EXPECT_EQ(r.status, 400);

  r = Post(kVerify, "application/proto", proto.substr(0, proto.size() - 10));
  EXPECT_EQ(r.status, 400) << r.body;

  r = Post("/offload.v1.Ed25519Service/Nope", "application/proto", proto);
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"unimplemented")"));

  r = Post(kVerify, "application/proto", proto, "Connect-Protocol-Version: 2");
  EXPECT_EQ(r.status, 400);

  r = Post(kVerify, "application/proto", proto, "Content-Encoding: br");
  EXPECT_EQ(r.status, 501);

  r = Post(kVerify, "application/proto", std::string(kMaxMessage + 1, 'x'));
  EXPECT_EQ(r.status, 429);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"resource_exhausted")"));

  // A wrong-size public key is the operation's own InvalidArgument.
  v1::VerifyRequest bad = verify_;
  bad.set_public_key("short");
  r = Post(kVerify, "application/proto", bad.SerializeAsString());
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("public_key"));

  // Unknown key: not_found.
  r = Post("/offload.v1.KeyService/GetKey", "application/json", R"({"keyId":"nobody"})");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"not_found")"));

  r = Send("GET /offload.v1.Ed25519Service/Sign HTTP/1.1", "");
  EXPECT_EQ(r.status, 405);
  r = Send(absl::StrCat("PUT ", kVerify, " HTTP/1.1"), "");
  EXPECT_EQ(r.status, 405);
}

TEST_F(GatewayTest, GzipBothWays) {
  auto zipped = Gzip(verify_.SerializeAsString());
  ASSERT_TRUE(zipped.ok());
  const Response r = Post(kVerify, "application/proto", *zipped, "Content-Encoding: gzip");
  ASSERT_EQ(r.status, 200) << r.body;
  v1::VerifyResponse response;
  ASSERT_TRUE(response.ParseFromString(r.body));
  EXPECT_TRUE(response.valid());
}

TEST_F(GatewayTest, ChunkedBodyOverTheLimitIsRefused) {
  // Chunked: no Content-Length. Over the message limit: RESOURCE_EXHAUSTED; over what any
  // protocol could carry: the HTTP server's 413 before the gateway sees it.
  const auto chunked = [&](size_t total) {
    std::string body;
    const std::string chunk(16 << 10, 'x');
    for (size_t sent = 0; sent < total; sent += chunk.size()) {
      absl::StrAppend(&body, absl::Hex(chunk.size()), "\r\n", chunk, "\r\n");
    }
    body += "0\r\n\r\n";
    return Send(absl::StrCat("POST ", kVerify,
                             " HTTP/1.1\r\nContent-Type: application/proto\r\n"
                             "Transfer-Encoding: chunked"),
                body, /*content_length=*/false);
  };
  EXPECT_EQ(chunked(kMaxMessage + (8 << 10)).status, 429);
  EXPECT_EQ(chunked(4 * kMaxMessage).status, 413);
}

TEST_F(GatewayTest, ExpiredDeadline) {
  const Response r =
      Post(kVerify, "application/proto", verify_.SerializeAsString(), "Connect-Timeout-Ms: 0");
  EXPECT_EQ(r.status, 504);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"deadline_exceeded")"));
}

TEST_F(GatewayTest, DrainingRefusesCallsThenStops) {
  gateway_->SetReady(true);
  testhttp::Connection kept(gateway_->port());
  kept.Send("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(kept.Read().status, 200);
  gateway_->Drain();
  // The idle keep-alive connection is closed, new connections are refused.
  EXPECT_TRUE(kept.ClosedWithin(std::chrono::seconds(10)));
  testhttp::Connection late(gateway_->port());
  EXPECT_FALSE(late.connected());
  gateway_->Stop(absl::Now() + absl::Seconds(5));
}

TEST_F(GatewayTest, MemoHitIsAnsweredAndMarked) {
  for (bool expect_hit : {false, true}) {
    const Response r = Post(kVerify, "application/proto", verify_.SerializeAsString());
    ASSERT_EQ(r.status, 200) << r.body;
    v1::VerifyResponse response;
    ASSERT_TRUE(response.ParseFromString(r.body));
    EXPECT_TRUE(response.valid());
    EXPECT_EQ(response.memo_hit(), expect_hit);
  }
}

// Issue 15: an AEAD Open memo hit over Connect proto is written from the memo's buffer; the body
// is byte for byte protobuf's serialization of the answer, and a tampered envelope that keeps
// nonce and tag fails as it would fresh. JSON and gzip answers still go through the message.
TEST_F(GatewayTest, ConnectProtoOpenHitIsTheSerializedAnswer) {
  v1::CreateKeyRequest create;
  create.set_key_id("blobs");
  create.set_type(v1::KEY_TYPE_CHACHA20_POLY1305);
  ASSERT_TRUE(keys_->CreateKey(create).ok());
  const std::string plaintext(40000, 'b');  // JSON (base64) within kMaxMessage
  v1::AeadSealRequest seal;
  seal.set_key_id("blobs");
  seal.set_plaintext(plaintext);
  v1::AeadSealResponse sealed;
  ASSERT_TRUE(ops_->AeadSeal(seal, &sealed).ok());  // recorded: the first open is a hit
  v1::AeadOpenRequest open;
  open.set_key_id("blobs");
  open.set_envelope(sealed.envelope());
  constexpr char kOpen[] = "/offload.v1.AeadService/Open";
  v1::AeadOpenResponse expected;
  expected.set_plaintext(plaintext);
  expected.set_key_version(1);
  expected.set_memo_hit(true);
  for (int i = 0; i < 2; ++i) {
    const Response r = Post(kOpen, "application/proto", open.SerializeAsString());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type"), "application/proto");
    EXPECT_EQ(r.body, expected.SerializeAsString());
  }
  const Response json = Post(kOpen, "application/json", R"({"keyId":"blobs","envelope":")" +
                                                            absl::Base64Escape(sealed.envelope()) +
                                                            R"("})");
  ASSERT_EQ(json.status, 200) << json.body;
  EXPECT_THAT(json.body, HasSubstr("\"memoHit\":true"));
  const Response zipped =
      Post(kOpen, "application/proto", open.SerializeAsString(), "Accept-Encoding: gzip");
  ASSERT_EQ(zipped.status, 200);
  EXPECT_EQ(zipped.header("content-encoding"), "gzip");
  std::string tampered = sealed.envelope();
  tampered[100] ^= 1;
  open.set_envelope(tampered);
  for (int i = 0; i < 2; ++i) {
    const Response r = Post(kOpen, "application/proto", open.SerializeAsString());
    EXPECT_EQ(r.status, 400) << r.body;
  }
}

TEST_F(GatewayTest, GrpcWebText) {
  const std::string body = absl::Base64Escape(EncodeFrame(0, verify_.SerializeAsString()));
  const Response r = Post(kVerify, "application/grpc-web-text", body, "X-Grpc-Web: 1");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "application/grpc-web-text+proto");
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(r.body, &bytes));
  ASSERT_GE(bytes.size(), kFrameHeaderBytes);
  const uint32_t n = (uint8_t(bytes[1]) << 24) | (uint8_t(bytes[2]) << 16) |
                     (uint8_t(bytes[3]) << 8) | uint8_t(bytes[4]);
  v1::VerifyResponse response;
  ASSERT_TRUE(response.ParseFromString(bytes.substr(kFrameHeaderBytes, n)));
  EXPECT_TRUE(response.valid());
  EXPECT_EQ(bytes.substr(kFrameHeaderBytes + n), EncodeFrame(kFrameTrailer, "grpc-status: 0\r\n"));
  // Not base64: an error in the trailers, as for any malformed gRPC-Web request.
  const Response bad = Post(kVerify, "application/grpc-web-text", "!!!not base64!!!");
  EXPECT_EQ(bad.header("grpc-status"), "3");
}

TEST_F(GatewayTest, ConnectGetForSideEffectFreeMethods) {
  // Verify by GET: URL-safe base64 of the binary request, cacheable for a year.
  std::string b64 = absl::WebSafeBase64Escape(verify_.SerializeAsString());
  Response r = Send(absl::StrCat("GET ", kVerify, "?connect=v1&encoding=proto&base64=1&message=",
                                 b64, " HTTP/1.1"),
                    "", false);
  ASSERT_EQ(r.status, 200) << r.body;
  v1::VerifyResponse response;
  ASSERT_TRUE(response.ParseFromString(r.body));
  EXPECT_TRUE(response.valid());
  EXPECT_THAT(r.header("cache-control"), HasSubstr("max-age=31536000"));
  EXPECT_THAT(r.header("cache-control"), HasSubstr("immutable"));

  // ListKeys by GET with percent-encoded JSON: keys change, so no-cache.
  r = Send("GET /offload.v1.KeyService/ListKeys?connect=v1&encoding=json&message=%7B%7D HTTP/1.1",
           "", false);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.body, HasSubstr("\"signer\""));
  EXPECT_EQ(r.header("cache-control"), "private, no-cache");
  r = Send("GET /offload.v1.KeyService/GetKey?encoding=json&message=%7B%22keyId%22%3A%22signer%22%7D "
           "HTTP/1.1",
           "", false);
  EXPECT_EQ(r.status, 200) << r.body;

  // An error by GET: Connect's error JSON, never cached.
  r = Send("GET /offload.v1.KeyService/GetKey?connect=v1&encoding=json&message=%7B%22keyId%22%3A%22nobody%22%7D "
           "HTTP/1.1",
           "", false);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.header("cache-control"), "no-store");
  // Malformed queries name the parameter.
  r = Send(absl::StrCat("GET ", kVerify, "?connect=v1&message=x HTTP/1.1"), "", false);
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("encoding"));
  r = Send(absl::StrCat("GET ", kVerify, "?connect=v2&encoding=proto&message= HTTP/1.1"), "", false);
  EXPECT_EQ(r.status, 400);

  // Methods with side effects are POST only.
  for (const char* path : {"/offload.v1.KeyService/DeleteKey", "/offload.v1.Ed25519Service/Sign",
                           "/offload.v1.AeadService/Open"}) {
    r = Send(absl::StrCat("GET ", path, "?connect=v1&encoding=json&message=%7B%7D HTTP/1.1"), "",
             false);
    EXPECT_EQ(r.status, 405) << path;
    EXPECT_EQ(r.header("allow"), "POST") << path;
  }
}

TEST_F(GatewayTest, CorsOnlyForListedOrigins) {
  // No list: no CORS header anywhere, and preflights are refused.
  Response r = Send("OPTIONS /offload.v1.KeyService/DeleteKey HTTP/1.1\r\nOrigin: "
                    "https://app.example.com\r\nAccess-Control-Request-Method: POST",
                    "");
  EXPECT_EQ(r.status, 403);
  EXPECT_FALSE(r.has("access-control-allow-origin"));

  Restart([](Gateway::Options& o) {
    auto cors = CorsPolicy::Create({"https://app.example.com", "http://127.0.0.1:5173"});
    ASSERT_TRUE(cors.ok());
    o.cors = *cors;
  });
  const auto preflight = [&](const std::string& origin) {
    return Send(absl::StrCat("OPTIONS /offload.v1.KeyService/DeleteKey HTTP/1.1\r\nOrigin: ", origin,
                             "\r\nAccess-Control-Request-Method: POST\r\n"
                             "Access-Control-Request-Headers: content-type,connect-protocol-version"),
                "");
  };
  r = preflight("https://app.example.com");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("access-control-allow-origin"), "https://app.example.com");
  EXPECT_THAT(r.header("access-control-allow-headers"), HasSubstr("connect-protocol-version"));
  EXPECT_THAT(r.header("access-control-allow-headers"), HasSubstr("x-grpc-web"));
  EXPECT_THAT(r.header("access-control-allow-methods"), HasSubstr("POST"));
  for (const char* foreign : {"https://evil.example.com", "https://app.example.com.evil.com",
                              "http://app.example.com", "null"}) {
    r = preflight(foreign);
    EXPECT_EQ(r.status, 403) << foreign;
    for (const auto& [name, value] : r.headers) {
      EXPECT_FALSE(absl::StartsWith(name, "access-control-allow")) << foreign << ": " << name;
    }
  }
  // Actual requests: the listed origin gets its header and the exposed headers; others none.
  r = Post(kVerify, "application/proto", verify_.SerializeAsString(),
           "Origin: http://127.0.0.1:5173");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("access-control-allow-origin"), "http://127.0.0.1:5173");
  EXPECT_THAT(r.header("access-control-expose-headers"), HasSubstr("grpc-status"));
  EXPECT_THAT(r.header("vary"), HasSubstr("Origin"));
  r = Post(kVerify, "application/proto", verify_.SerializeAsString(),
           "Origin: https://evil.example.com");
  EXPECT_FALSE(r.has("access-control-allow-origin"));
  // Wildcards and paths are not origins.
  EXPECT_FALSE(CorsPolicy::Create({"*"}).ok());
  EXPECT_FALSE(CorsPolicy::Create({"https://app.example.com/"}).ok());
  EXPECT_FALSE(CorsPolicy::Parse("https://a.example, app.example.com").ok());
  EXPECT_TRUE(CorsPolicy::Parse(" https://a.example , http://[::1]:8080 ").ok());
}

TEST_F(GatewayTest, ConnectionHygiene) {
  Restart([](Gateway::Options& o) {
    o.max_header_bytes = 2048;
    o.read_timeout = absl::Seconds(1);
  });
  // Oversized headers: 431.
  Response r = Post(kVerify, "application/proto", verify_.SerializeAsString(),
                    absl::StrCat("X-Pad: ", std::string(4096, 'p')));
  EXPECT_EQ(r.status, 431);
  // A sender that stops mid-headers is cut.
  testhttp::Connection stalled(gateway_->port());
  stalled.Send(absl::StrCat("POST ", kVerify, " HTTP/1.1\r\nHost: x\r\n"));
  EXPECT_TRUE(stalled.ClosedWithin(std::chrono::seconds(15)));
  EXPECT_GE(gateway_->server_stats().read_timeouts, 1u);
  // Keep-alive: many calls on one connection.
  testhttp::Connection kept(gateway_->port());
  for (int i = 0; i < 5; ++i) {
    kept.Send(absl::StrCat("POST ", kVerify, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/proto\r\n"
                           "Content-Length: ", verify_.ByteSizeLong(), "\r\n\r\n",
                           verify_.SerializeAsString()));
    EXPECT_EQ(kept.Read().status, 200);
  }
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("offload_http_connections_total{result=\"accepted\"}"));
}

}  // namespace
}  // namespace offload::http
