// The gateway over a real socket: raw HTTP/1.1 requests (tests/testing/http_client.h) to a gateway
// serving real operations (file key store in a temporary folder, worker pool, memo). HTTP/2 and
// real Connect / gRPC-Web clients are in tests/e2e/connect.
#include "service/gateway/gateway.h"

#include <sodium.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "service/crypto/backend.h"
#include "service/api/method_table.h"
#include "service/http/protocol.h"
#include "service/ops/admission.h"
#include "service/ops/retry_delay.h"
#include "service/ops/test_stack.h"
#include "tests/testing/http_client.h"
#include "tests/testing/payloads.h"

namespace offload::gateway {
namespace {

using ::testing::HasSubstr;
using http::CorsPolicy;
using http::EncodeFrame;
using http::Gunzip;
using http::Gzip;
using http::ParseUnaryRequestFrame;
using http::kFrameCompressed;
using http::kFrameHeaderBytes;
using http::kFrameTrailer;
using testhttp::JsonLike;
using testhttp::RandomBytes;

using testhttp::Response;

class GatewayTest : public ::testing::Test {
 protected:
  static constexpr int64_t kMaxMessage = 64 << 10;

  void SetUp() override {
    auto stack = ops::TestStack::Create();
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = *std::move(stack);
    keys_ = stack_->keys.get();
    pool_ = stack_->pool.get();
    ops_ = stack_->ops.get();
    table_ = std::make_unique<api::MethodTable>(ops_, keys_);
    metrics_ = std::make_unique<metrics::Metrics>();
    gateway_ = std::make_unique<Gateway>(table_.get(), pool_, metrics_.get(), BaseOptions());
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
    stack_.reset();
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
    gateway_ = std::make_unique<Gateway>(table_.get(), pool_, metrics_.get(), options);
    ASSERT_TRUE(gateway_->Start().ok());
  }

  Gateway::Options BaseOptions() {
    Gateway::Options options;
    options.http.address = "127.0.0.1:0";
    options.max_message_bytes = kMaxMessage;
    options.http.threads = 2;
    return options;
  }

  std::unique_ptr<ops::TestStack> stack_;
  keys::KeyManager* keys_ = nullptr;
  ops::WorkerPool* pool_ = nullptr;
  ops::Operations* ops_ = nullptr;
  std::unique_ptr<api::MethodTable> table_;
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

TEST_F(GatewayTest, OverloadRefusalsSayWhenToComeBack) {
  // A queue of one item, held here: every call that needs a worker is refused.
  ops::Admission admission({/*max_queued_items=*/1, /*max_client_inflight=*/0});
  absl::StatusOr<ops::Admission::Ticket> held = admission.Admit("someone", 1);
  ASSERT_TRUE(held.ok());
  Restart([&](Gateway::Options& o) {
    o.admission = &admission;
    o.cors = *CorsPolicy::Parse("https://app.example");
  });
  v1::VerifyRequest miss = verify_;
  miss.set_message("never verified before");  // not in the memo: needs a worker
  // Connect: 429, Retry-After in whole seconds, the RetryInfo in the error's details.
  Response r = Post(kVerify, "application/json", R"({"publicKey":")" +
                    absl::Base64Escape(miss.public_key()) + R"(","message":"bm8=","signature":")" +
                    absl::Base64Escape(miss.signature()) + R"("})", "Origin: https://app.example");
  EXPECT_EQ(r.status, 429) << r.body;
  int64_t after = 0;
  ASSERT_TRUE(absl::SimpleAtoi(r.header("retry-after"), &after)) << r.header("retry-after");
  EXPECT_GE(after, 1);
  EXPECT_LE(after, 10);
  EXPECT_THAT(r.header("access-control-expose-headers"), HasSubstr("retry-after"));
  EXPECT_THAT(r.body, HasSubstr(R"("details":[{"type":"google.rpc.RetryInfo","value":")"));
  // gRPC-Web: Trailers-Only, grpc-status-details-bin a google.rpc.Status holding the RetryInfo.
  r = Post(kVerify, "application/grpc-web", EncodeFrame(0, miss.SerializeAsString()));
  EXPECT_EQ(r.header("grpc-status"), "8");
  std::string bin = r.header("grpc-status-details-bin");
  while (bin.size() % 4 != 0) bin.push_back('=');
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(bin, &bytes)) << bin;
  google::rpc::Status status;
  ASSERT_TRUE(status.ParseFromString(bytes));
  EXPECT_EQ(status.code(), 8);
  ASSERT_EQ(status.details_size(), 1);
  google::rpc::RetryInfo info;
  ASSERT_TRUE(status.details(0).UnpackTo(&info));
  const absl::Duration delay =
      absl::Seconds(info.retry_delay().seconds()) + absl::Nanoseconds(info.retry_delay().nanos());
  EXPECT_GE(delay, ops::kMinRetryDelay);
  EXPECT_LE(delay, ops::kMaxRetryDelay);
  // A refusal that no wait would cure says nothing of the kind.
  r = Post(kVerify, "application/proto", std::string(kMaxMessage + 1, 'x'));
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.header("retry-after"), "");
  EXPECT_THAT(r.body, ::testing::Not(HasSubstr("details")));
  gateway_.reset();
}

// A body over its own protocol's bound (not only over what gRPC-Web text's base64 carries) is
// refused on its Content-Length, unread, and counted as body_too_large: before, a Connect or
// gRPC-Web binary body between --max_message_bytes and the base64 bound was read whole, then
// refused with no count.
TEST_F(GatewayTest, ABodyOverItsProtocolsBoundIsRefusedUnreadAndCounted) {
  const auto too_large = [&] {
    return gateway_->server_stats().abuse[static_cast<int>(httpd::AbuseReason::kBodyTooLarge)];
  };
  const uint64_t before = too_large();
  Response r = Post(kVerify, "application/proto", std::string(kMaxMessage + 1, 'x'));
  EXPECT_EQ(r.status, 429);
  EXPECT_THAT(r.body, HasSubstr("expected at most 65536 bytes"));
  EXPECT_EQ(too_large(), before + 1);
  r = Post(kVerify, "application/grpc-web+proto", std::string(kMaxMessage + 6, 'x'));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("grpc-status"), "8");
  EXPECT_EQ(too_large(), before + 2);
  // At its bound a body is read and decoded (here: not a valid message).
  r = Post(kVerify, "application/proto", std::string(kMaxMessage, 'x'));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(too_large(), before + 2);
  // gRPC-Web text keeps base64's room.
  r = Post(kVerify, "application/grpc-web-text", std::string(kMaxMessage + 6, 'A'));
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.header("grpc-status"), "8");
  EXPECT_EQ(too_large(), before + 2);
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


// The value of the metric line starting with `series` in `scrape`, or -1.
double MetricValue(const std::string& scrape, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

TEST_F(GatewayTest, ResponsesAreCompressedOnlyWhenAskedAndWorthIt) {
  v1::CreateKeyRequest create;
  create.set_key_id("blobs");
  create.set_type(v1::KEY_TYPE_XCHACHA20_POLY1305);
  ASSERT_TRUE(keys_->CreateKey(create).ok());
  // Sealed through the gateway (so the open memo holds them), then opened with every header.
  const auto seal = [&](const std::string& plaintext) {
    v1::AeadSealRequest request;
    request.set_key_id("blobs");
    request.set_plaintext(plaintext);
    const Response r = Post("/offload.v1.AeadService/Seal", "application/proto",
                            request.SerializeAsString(), "Accept-Encoding: gzip");
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_FALSE(r.has("content-encoding")) << "ciphertext does not compress";
    v1::AeadSealResponse sealed;
    EXPECT_TRUE(sealed.ParseFromString(r.body));
    v1::AeadOpenRequest open;
    open.set_key_id("blobs");
    open.set_envelope(sealed.envelope());
    return open.SerializeAsString();
  };
  const std::string text = JsonLike(55000), random = RandomBytes(55000);
  const std::string open_text = seal(text), open_random = seal(random);
  constexpr char kOpen[] = "/offload.v1.AeadService/Open";
  const auto plaintext_of = [](const Response& r) {
    std::string body = r.body;
    if (r.header("content-encoding") == "gzip") body = *Gunzip(body, 1 << 20);
    v1::AeadOpenResponse response;
    EXPECT_TRUE(response.ParseFromString(body));
    EXPECT_TRUE(response.memo_hit());
    return response.plaintext();
  };

  // Compressible and asked for: gzip, smaller.
  Response r = Post(kOpen, "application/proto", open_text, "Accept-Encoding: gzip, deflate, br");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-encoding"), "gzip");
  EXPECT_LT(r.body.size(), text.size() / 3);
  EXPECT_EQ(plaintext_of(r), text);
  // Refused, not asked for, or identity only: as it is.
  for (const char* header : {"Accept-Encoding: gzip;q=0", "Accept-Encoding: identity",
                             "Accept-Encoding: *;q=0", "Accept-Encoding: br", "X-None: 1",
                             "Connect-Accept-Encoding: gzip"}) {
    r = Post(kOpen, "application/proto", open_text, header);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_FALSE(r.has("content-encoding")) << header;
    EXPECT_EQ(plaintext_of(r), text) << header;
  }
  // Random data: asked for, and still sent as it is.
  r = Post(kOpen, "application/proto", open_random, "Accept-Encoding: gzip");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.has("content-encoding"));
  EXPECT_EQ(r.body.size(), 55000u + 8u);  // plaintext, its tag and length, version, memo_hit
  EXPECT_EQ(plaintext_of(r), random);

  // gRPC-Web: the frame's flag and grpc-encoding, asked for by grpc-accept-encoding.
  const auto web_message = [](const Response& r, bool* compressed) {
    const std::string& b = r.body;
    const uint32_t n = (uint8_t(b[1]) << 24) | (uint8_t(b[2]) << 16) | (uint8_t(b[3]) << 8) |
                       uint8_t(b[4]);
    *compressed = (b[0] & kFrameCompressed) != 0;
    EXPECT_EQ(b.substr(kFrameHeaderBytes + n), EncodeFrame(kFrameTrailer, "grpc-status: 0\r\n"));
    return b.substr(kFrameHeaderBytes, n);
  };
  bool compressed = false;
  r = Post(kOpen, "application/grpc-web+proto", EncodeFrame(0, open_text),
           "X-Grpc-Web: 1\r\ngrpc-accept-encoding: gzip,br");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("grpc-encoding"), "gzip");
  EXPECT_FALSE(r.has("content-encoding"));
  std::string m = web_message(r, &compressed);
  EXPECT_TRUE(compressed);
  EXPECT_LT(m.size(), text.size() / 3);
  v1::AeadOpenResponse open;
  ASSERT_TRUE(open.ParseFromString(*Gunzip(m, 1 << 20)));
  EXPECT_EQ(open.plaintext(), text);
  for (const char* header : {"X-Grpc-Web: 1\r\nAccept-Encoding: gzip", "X-Grpc-Web: 1"}) {
    r = Post(kOpen, "application/grpc-web+proto", EncodeFrame(0, open_text), header);
    ASSERT_EQ(r.status, 200);
    EXPECT_FALSE(r.has("grpc-encoding")) << header;
    m = web_message(r, &compressed);
    EXPECT_FALSE(compressed) << header;
  }
  r = Post(kOpen, "application/grpc-web+proto", EncodeFrame(0, open_random),
           "grpc-accept-encoding: gzip");
  EXPECT_FALSE(r.has("grpc-encoding"));
  m = web_message(r, &compressed);
  EXPECT_FALSE(compressed);
  EXPECT_EQ(m.size(), 55008u);

  // Counted: bytes by encoding and the decisions.
  const std::string scrape = metrics_->Scrape();
  EXPECT_EQ(MetricValue(scrape, R"(offload_http_response_compression_total{result="compressed"})"), 2);
  EXPECT_EQ(
      MetricValue(scrape, R"(offload_http_response_compression_total{result="incompressible"})"),
      4);  // two opens of random data, two seals
  EXPECT_GT(MetricValue(scrape, R"(offload_http_sent_bytes_total{encoding="gzip"})"), 0);
  EXPECT_GT(MetricValue(scrape, R"(offload_http_sent_bytes_total{encoding="identity"})"),
            9 * 55000);
  EXPECT_GT(MetricValue(scrape, "offload_http_compression_saved_bytes_total"), 2 * 55000 * 2 / 3);
  EXPECT_GT(MetricValue(scrape, R"(offload_http_received_bytes_total{encoding="identity"})"), 0);
  EXPECT_EQ(MetricValue(scrape, R"(offload_http_received_bytes_total{encoding="gzip"})"), 0);

  // Level 0: never compressed.
  Restart([](Gateway::Options& o) { o.compression.level = 0; });
  r = Post(kOpen, "application/proto", open_text, "Accept-Encoding: gzip");
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(r.has("content-encoding"));
  // A threshold above the proto message (55 KB) but under its JSON (base64, 73 KB), level 9.
  Restart([](Gateway::Options& o) {
    o.compression = {9, 60000};
    o.max_message_bytes = 1 << 20;
  });
  r = Post(kOpen, "application/proto", open_text, "Accept-Encoding: gzip");
  ASSERT_EQ(r.status, 200);
  EXPECT_FALSE(r.has("content-encoding"));
  v1::AeadOpenRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(open_text));
  const std::string json = absl::StrCat(R"({"keyId":"blobs","envelope":")",
                                        absl::Base64Escape(parsed.envelope()), "\"}");
  r = Post(kOpen, "application/json", json, "Accept-Encoding: gzip");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-encoding"), "gzip");
  EXPECT_THAT(*Gunzip(r.body, 1 << 20), HasSubstr(absl::Base64Escape(text)));
  // Errors are never compressed.
  r = Post(kOpen, "application/json", R"({"keyId":"blobs","envelope":""})", "Accept-Encoding: gzip");
  EXPECT_EQ(r.status, 400);
  EXPECT_FALSE(r.has("content-encoding"));
}

TEST_F(GatewayTest, GzipBombIsRefusedAtTheBound) {
  // 16 MiB of zeros in ~16 KB of gzip, claiming (in its trailer) to be 100 bytes.
  std::string bomb = *Gzip(std::string(16 << 20, '\0'), 9);
  for (int i = 0; i < 4; ++i) bomb[bomb.size() - 4 + i] = i == 0 ? 100 : 0;
  ASSERT_LT(bomb.size(), static_cast<size_t>(kMaxMessage));
  Response r = Post(kVerify, "application/proto", bomb, "Content-Encoding: gzip");
  EXPECT_EQ(r.status, 429);
  EXPECT_THAT(r.body, HasSubstr("once decompressed"));
  r = Post(kVerify, "application/grpc-web+proto", EncodeFrame(kFrameCompressed, bomb),
           "grpc-encoding: gzip");
  EXPECT_EQ(r.header("grpc-status"), "8");
  EXPECT_GT(MetricValue(metrics_->Scrape(), R"(offload_http_received_bytes_total{encoding="gzip"})"),
            2 * bomb.size() - 1);
}

TEST_F(GatewayTest, ChunkedBodyOverTheLimitIsRefused) {
  // Chunked: no Content-Length. Over the message limit: RESOURCE_EXHAUSTED; over what any
  // protocol could carry too (the HTTP server stops reading it there, and the gateway answers in
  // the protocol's terms).
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
  const Response huge = chunked(4 * kMaxMessage);
  EXPECT_EQ(huge.status, 429);
  EXPECT_THAT(huge.body, HasSubstr("resource_exhausted"));
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
  // A browser's gRPC-Web client must read grpc-encoding to know a frame is compressed.
  EXPECT_THAT(r.header("access-control-expose-headers"), HasSubstr("grpc-encoding"));
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

// Both ports count their connections under their own name: before, the gRPC port's open,
// accepted and refused connections (its --http_max_connections applies as the HTTP port's does)
// and read timeouts were in no metric.
TEST_F(GatewayTest, TheGrpcPortCountsItsConnectionsUnderItsName) {
  Restart([](Gateway::Options& o) {
    o.port = "grpc";
    o.http.max_connections = 1;
  });
  testhttp::Connection held(gateway_->port());
  ASSERT_TRUE(held.connected());
  for (int i = 0; i < 2000 && gateway_->server_stats().open < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(gateway_->server_stats().open, 1);
  testing::internal::CaptureStderr();
  testhttp::Connection refused(gateway_->port());
  EXPECT_TRUE(refused.ClosedWithin(std::chrono::seconds(15)));
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr(R"("event":"connection_refused")"));
  EXPECT_THAT(log, HasSubstr(R"("max_connections":1)"));
  const std::string scrape = metrics_->Scrape();
  EXPECT_THAT(scrape, HasSubstr("offload_http_connections{port=\"grpc\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("offload_http_connections_total{port=\"grpc\",result=\"accepted\"} 2"));
  EXPECT_THAT(scrape, HasSubstr("offload_http_connections_total{port=\"grpc\",result=\"refused\"} 1"));
  EXPECT_THAT(scrape, HasSubstr("offload_http_read_timeouts_total{port=\"grpc\"} 0"));
}

TEST_F(GatewayTest, ConnectionHygiene) {
  Restart([](Gateway::Options& o) {
    o.http.max_header_bytes = 2048;
    o.http.read_timeout = absl::Seconds(1);
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
  EXPECT_THAT(metrics_->Scrape(), HasSubstr("offload_http_connections_total{port=\"http\",result=\"accepted\"}"));
}

}  // namespace
}  // namespace offload::gateway
