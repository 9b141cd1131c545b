// The gateway over a real socket: civetweb's client sends raw requests to a gateway serving real
// operations (file key store in a temporary folder, worker pool, memo).
#include "service/http/gateway.h"

#include <civetweb.h>
#include <sodium.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
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

namespace offload::http {
namespace {

using ::testing::HasSubstr;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

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
    Gateway::Options options;
    options.address = "127.0.0.1:0";
    options.max_message_bytes = kMaxMessage;
    options.threads = 4;
    gateway_ = std::make_unique<Gateway>(table_.get(), pool_.get(), metrics_.get(), options);
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

  // Sends `head` (request line and headers, without the blank line) and `body`.
  // status 0: no connection (`may_fail`).
  Response Send(const std::string& head, const std::string& body, bool content_length = true,
                bool may_fail = false) {
    char error[256] = "";
    mg_connection* conn = mg_connect_client("127.0.0.1", gateway_->port(), 0, error, sizeof(error));
    if (!may_fail) {
      EXPECT_NE(conn, nullptr) << error;
    }
    Response r;
    if (conn == nullptr) return r;
    std::string request = head + "\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (content_length) absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
    request += "\r\n" + body;
    mg_write(conn, request.data(), request.size());
    if (mg_get_response(conn, error, sizeof(error), 10000) < 0) {
      if (!may_fail) ADD_FAILURE() << "no response: " << error;
      mg_close_connection(conn);
      return r;
    }
    const mg_response_info* info = mg_get_response_info(conn);
    r.status = info->status_code;
    for (int i = 0; i < info->num_headers; ++i) {
      r.headers[absl::AsciiStrToLower(info->http_headers[i].name)] = info->http_headers[i].value;
    }
    char buffer[4096];
    int n;
    while ((n = mg_read(conn, buffer, sizeof(buffer))) > 0) r.body.append(buffer, n);
    mg_close_connection(conn);
    return r;
  }

  Response Post(const std::string& path, const std::string& content_type, const std::string& body,
                const std::string& extra_headers = "") {
    std::string head = absl::StrCat("POST ", path, " HTTP/1.1\r\nContent-Type: ", content_type);
    if (!extra_headers.empty()) absl::StrAppend(&head, "\r\n", extra_headers);
    return Send(head, body);
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
  EXPECT_EQ(r.headers.at("content-type"), "application/proto");
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
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  EXPECT_THAT(r.body, HasSubstr(R"("valid":true)"));
}

TEST_F(GatewayTest, GrpcWebBinary) {
  const Response r =
      Post(kVerify, "application/grpc-web+proto", EncodeFrame(0, verify_.SerializeAsString()),
           "X-Grpc-Web: 1\r\ngrpc-timeout: 10S");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "application/grpc-web+proto");
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
  EXPECT_EQ(r.headers.at("grpc-status"), "3");
  EXPECT_THAT(r.headers.at("grpc-message"), HasSubstr("truncated"));
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

  r = Send(absl::StrCat("GET ", kVerify, " HTTP/1.1"), "");
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
  // Chunked: no Content-Length, so the gateway stops reading at the limit.
  std::string body;
  const std::string chunk(16 << 10, 'x');
  for (int i = 0; i < 6; ++i) absl::StrAppend(&body, absl::Hex(chunk.size()), "\r\n", chunk, "\r\n");
  body += "0\r\n\r\n";
  const Response r = Send(absl::StrCat("POST ", kVerify,
                                       " HTTP/1.1\r\nContent-Type: application/proto\r\n"
                                       "Transfer-Encoding: chunked"),
                          body, /*content_length=*/false);
  EXPECT_EQ(r.status, 429);
}

TEST_F(GatewayTest, ExpiredDeadline) {
  const Response r =
      Post(kVerify, "application/proto", verify_.SerializeAsString(), "Connect-Timeout-Ms: 0");
  EXPECT_EQ(r.status, 504);
  EXPECT_THAT(r.body, HasSubstr(R"("code":"deadline_exceeded")"));
}

TEST_F(GatewayTest, DrainingRefusesCallsThenStops) {
  gateway_->SetReady(true);
  gateway_->Drain();
  // civetweb may still be listening for a moment: what it answers then is "not ready" and
  // UNAVAILABLE; afterwards the connection is refused.
  const Response ready = Send("GET /readyz HTTP/1.1", "", true, /*may_fail=*/true);
  if (ready.status != 0) {
    EXPECT_EQ(ready.status, 503);
  }
  const Response call = Send(absl::StrCat("POST ", kVerify, " HTTP/1.1\r\nContent-Type: application/proto"),
                             verify_.SerializeAsString(), true, /*may_fail=*/true);
  if (call.status != 0) {
    EXPECT_EQ(call.status, 503);
    EXPECT_THAT(call.body, HasSubstr(R"("code":"unavailable")"));
  }
  gateway_->Stop();
  char error[256];
  EXPECT_EQ(mg_connect_client("127.0.0.1", gateway_->port(), 0, error, sizeof(error)), nullptr);
}

}  // namespace
}  // namespace offload::http
