#include "service/auth/authorizer.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"

namespace offload::auth {
namespace {

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "authz-XXXXXX";
  return mkdtemp(pattern.data());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(KeyIdsOfTest, FindsEveryKeyIdOnceIncludingBatchItems) {
  v1::BatchAeadOpenRequest batch;
  for (const char* id : {"a", "b", "a", "c"}) batch.add_items()->set_key_id(id);
  EXPECT_EQ(KeyIdsOf(batch), (std::vector<std::string>{"a", "b", "c"}));
  v1::VerifyRequest verify;
  EXPECT_TRUE(KeyIdsOf(verify).empty());
}

TEST(PeerTest, ClientNameIsTheIdentityElseTheHost) {
  EXPECT_EQ((Peer{"app-a", "ipv4:127.0.0.1:5000"}.ClientName()), "app-a");
  EXPECT_EQ((Peer{"", "ipv4:127.0.0.1:5000"}.ClientName()), "127.0.0.1");
  EXPECT_EQ((Peer{"", "ipv6:[::1]:5000"}.ClientName()), "::1");
  EXPECT_EQ((Peer{"", "127.0.0.2"}.ClientName()), "127.0.0.2");
}

TEST(AuthorizerTest, RefusesAuditsAndCountsAndReloadsThePolicy) {
  const std::string dir = TempDir();
  const std::string policy = dir + "/policy.json";
  const std::string audit = dir + "/audit.jsonl";
  std::ofstream(policy) << R"({"admins": ["adm"], "grants": [
      {"client": "app-a", "keys": ["a-*"], "operations": ["aead.*"]}]})";
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create({true, policy, audit});
  ASSERT_TRUE(a.ok()) << a.status();
  v1::AeadOpenRequest open;
  open.set_key_id("a-1");
  EXPECT_TRUE((*a)->Authorize({"app-a", "ipv4:127.0.0.1:1"}, "/offload.v1.AeadService/Open", open,
                              "grpc").ok());
  EXPECT_EQ((*a)->Authorize({"", "ipv4:127.0.0.1:1"}, "/offload.v1.AeadService/Open", open, "grpc")
                .code(),
            absl::StatusCode::kUnauthenticated);
  open.set_key_id("b-1");
  EXPECT_EQ((*a)->Authorize({"app-a", "ipv4:127.0.0.1:1"}, "/offload.v1.AeadService/Open", open,
                            "http").code(),
            absl::StatusCode::kPermissionDenied);
  v1::CreateKeyRequest create;
  create.set_key_id("a-2");
  EXPECT_EQ((*a)->Authorize({"app-a", "x"}, "/offload.v1.KeyService/CreateKey", create, "grpc")
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*a)->Authorize({"adm", "x"}, "/offload.v1.KeyService/CreateKey", create, "grpc").ok());
  (*a)->AuditKeyCall({"adm", "x"}, "/offload.v1.KeyService/CreateKey", create, absl::OkStatus(),
                     1, "grpc");
  (*a)->AuditHandshakeRefused("grpc", "mallory", "unable to get local issuer certificate");
  const Authorizer::Counts c = (*a)->counts();
  EXPECT_EQ(c.unauthenticated, 1u);
  EXPECT_EQ(c.permission_denied, 2u);
  EXPECT_EQ(c.handshake_refused, 1u);
  const std::string log = ReadAll(audit);
  EXPECT_NE(log.find("\"event\":\"unauthenticated\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"event\":\"permission_denied\""), std::string::npos);
  EXPECT_NE(log.find("\"key_ids\":[\"b-1\"]"), std::string::npos);
  EXPECT_NE(log.find("\"event\":\"key_create\""), std::string::npos);
  EXPECT_NE(log.find("\"event\":\"tls_handshake_refused\""), std::string::npos);

  // A new grant takes effect without a restart; a broken file keeps the last good policy.
  sleep(1);
  std::ofstream(policy) << R"({"grants": [{"client": "app-a", "keys": ["*"], "operations": ["aead.open"]}]})";
  sleep(1);
  EXPECT_TRUE((*a)->Authorize({"app-a", "x"}, "/offload.v1.AeadService/Open", open, "grpc").ok());
  std::ofstream(policy) << "{broken";
  sleep(1);
  EXPECT_TRUE((*a)->Authorize({"app-a", "x"}, "/offload.v1.AeadService/Open", open, "grpc").ok());
}

TEST(AuthorizerTest, WithoutMtlsEverythingPassesAndAPolicyIsRefused) {
  absl::StatusOr<std::unique_ptr<Authorizer>> open = Authorizer::Create({false, "", ""});
  ASSERT_TRUE(open.ok());
  v1::CreateKeyRequest create;
  EXPECT_TRUE((*open)->Authorize({"", "x"}, "/offload.v1.KeyService/CreateKey", create, "grpc").ok());
  EXPECT_EQ(Authorizer::Create({false, "/nonexistent.json", ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Authorizer::Create({true, "/nonexistent.json", ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload::auth
