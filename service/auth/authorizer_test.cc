#include "service/auth/authorizer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "service/api/method_table.h"

namespace offload::auth {
namespace {

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "authz-XXXXXX";
  return mkdtemp(pattern.data());
}

// Options with every RPC's operation, as the server gives them (service/api).
Authorizer::Options Opts(bool mtls, std::string policy_file, std::string audit_file) {
  Authorizer::Options options;
  options.mtls = mtls;
  options.policy_file = std::move(policy_file);
  options.audit_file = std::move(audit_file);
  options.operations = api::PolicyOperations();
  return options;
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
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(Opts(true, policy, audit));
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
  (*a)->FlushAudit();
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

// Issue 33: a lifecycle line names an anonymous caller as a data-plane line does; a refusal's
// `refusal_done` hears the refusal and whether its line was written, and is not called for an
// allowed call.
TEST(AuthorizerTest, AnonymousLifecycleLinesAndHeldRefusals) {
  const std::string dir = TempDir();
  const std::string audit = dir + "/audit.jsonl";
  Authorizer::Options options;
  options.operations = api::PolicyOperations();
  options.audit_file = audit;
  options.forwarded = true;
  options.require_identity = true;
  options.audit_fail_closed = true;
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(options);
  ASSERT_TRUE(a.ok()) << a.status();
  v1::CreateKeyRequest create;
  create.set_key_id("k");
  (*a)->AuditKeyCall({"", "ipv4:127.0.0.1:7"}, "/offload.v1.KeyService/CreateKey", create,
                     absl::OkStatus(), 1, "grpc");
  int calls = 0;
  absl::Status heard;
  bool written = false;
  const auto done = [&](absl::Status refusal, bool w) {
    ++calls;
    heard = refusal;
    written = w;
  };
  const absl::Status refused =
      (*a)->Authorize({"", "ipv4:127.0.0.1:8"}, "/offload.v1.KeyService/CreateKey", create,
                      "grpc", done);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  v1::VerifyRequest verify;
  EXPECT_TRUE((*a)->Authorize({"someone", "x"}, "/offload.v1.Ed25519Service/Verify", verify,
                              "grpc", done)
                  .ok());
  (*a)->FlushAudit();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(heard, refused);
  EXPECT_TRUE(written);
  const std::string log = ReadAll(audit);
  EXPECT_NE(log.find(R"("identity":"anonymous")"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("identity_source":"none")"), std::string::npos) << log;
  EXPECT_EQ(log.find(R"("identity":"")"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("event":"unauthenticated")"), std::string::npos) << log;
}

TEST(AuthorizerTest, WithoutMtlsEverythingPassesAndAPolicyIsRefused) {
  absl::StatusOr<std::unique_ptr<Authorizer>> open = Authorizer::Create(Opts(false, "", ""));
  ASSERT_TRUE(open.ok());
  v1::CreateKeyRequest create;
  EXPECT_TRUE((*open)->Authorize({"", "x"}, "/offload.v1.KeyService/CreateKey", create, "grpc").ok());
  EXPECT_EQ(Authorizer::Create(Opts(false, "/nonexistent.json", "")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Authorizer::Create(Opts(true, "/nonexistent.json", "")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DataPlaneTest, DescribesSingleAndBatchCallsFromRequestAndResponse) {
  v1::SignRequest sign;
  sign.set_key_id("s-1");
  sign.set_message("never in a line");
  v1::SignResponse signed_;
  signed_.set_key_version(3);
  signed_.set_signature(std::string(64, 'x'));
  DataPlaneCall one = DescribeDataPlaneCall(sign, &signed_, /*batch=*/false);
  ASSERT_EQ(one.keys.size(), 1u);
  EXPECT_EQ(one.keys[0].key_id, "s-1");
  EXPECT_EQ(one.keys[0].version, 3u);
  EXPECT_EQ(one.items, -1);
  // A failed call has no response: the requested version (0: not known).
  EXPECT_EQ(DescribeDataPlaneCall(sign, nullptr, false).keys[0].version, 0u);

  v1::BatchAeadOpenRequest batch;
  v1::BatchAeadOpenResponse results;
  for (int i = 0; i < 5; ++i) {
    batch.add_items()->set_key_id(i < 3 ? "a" : "b");
    v1::BatchAeadOpenResult* r = results.add_results();
    if (i == 4) {
      r->mutable_status()->set_code(3);  // failed: no response, the requested version
      continue;
    }
    r->mutable_response()->set_key_version(i == 2 ? 2 : 1);
    r->mutable_response()->set_memo_hit(i % 2 == 0);
  }
  DataPlaneCall many = DescribeDataPlaneCall(batch, &results, /*batch=*/true);
  EXPECT_EQ(many.items, 5);
  EXPECT_EQ(many.memo_hits, 2);
  EXPECT_EQ(many.failed_items, 1);
  ASSERT_EQ(many.keys.size(), 4u);  // (a,1) (a,2) (b,1) (b,unknown)
  EXPECT_EQ(many.keys[1].key_id, "a");
  EXPECT_EQ(many.keys[1].version, 2u);
  EXPECT_EQ(many.keys[2].key_id, "b");
  EXPECT_EQ(many.keys[3].version, 0u);
}

TEST(DataPlaneTest, AuditsLinesWithoutPayloadsAndSamples) {
  const std::string dir = TempDir();
  const std::string audit = dir + "/audit.jsonl";
  Authorizer::Options options;
  options.audit_file = audit;
  options.audit_data_plane = 1;
  absl::StatusOr<std::unique_ptr<Authorizer>> a = Authorizer::Create(options);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->SampleDataPlane());
  v1::SignRequest sign;
  sign.set_key_id("s-1");
  sign.set_message("secret-message");
  v1::SignResponse signed_;
  signed_.set_key_version(7);
  bool written = false;
  (*a)->AuditDataPlane({"", "ipv4:127.0.0.1:9"}, "/offload.v1.Ed25519Service/Sign", "grpc",
                       DescribeDataPlaneCall(sign, &signed_, false), absl::StatusCode::kOk,
                       [&written](bool ok) { written = ok; });
  (*a)->FlushAudit();
  EXPECT_TRUE(written);
  const std::string log = ReadAll(audit);
  EXPECT_NE(log.find(R"("event":"data_plane")"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("identity":"anonymous")"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("key_id":"s-1","version":7)"), std::string::npos) << log;
  EXPECT_NE(log.find(R"("code":"OK")"), std::string::npos) << log;
  EXPECT_EQ(log.find("secret-message"), std::string::npos) << log;
  EXPECT_EQ((*a)->audit_stats().data_plane_lines, 1u);
  // Any identity is escaped into valid JSON.
  (*a)->AuditDataPlane({"cn=\"q\"\\ \x01 \xc3\xbc \xff", "ipv4:127.0.0.1:9"},
                       "/offload.v1.Ed25519Service/BatchSign", "grpc",
                       DescribeDataPlaneCall(v1::BatchSignRequest(), nullptr, true),
                       absl::StatusCode::kUnavailable);
  (*a)->FlushAudit();
  {
    std::istringstream lines(ReadAll(audit));
    int parsed = 0;
    for (std::string line; std::getline(lines, line); ++parsed) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(j.is_discarded()) << line;
      if (parsed == 1) {
        EXPECT_EQ(j["identity"].get<std::string>().substr(0, 12), "cn=\"q\"\\ \x01 \xc3\xbc") << line;
        EXPECT_EQ(j["items"], 0);
        EXPECT_EQ(j["code"], "UNAVAILABLE");
      }
    }
    EXPECT_EQ(parsed, 2);
  }
  {
    // Not a gate: what a data-plane line costs the calling thread (describe, build, queue).
    constexpr int kCalls = 20000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      (*a)->AuditDataPlane({"", "ipv4:127.0.0.1:9"}, "/offload.v1.Ed25519Service/Sign", "grpc",
                           DescribeDataPlaneCall(sign, &signed_, false), absl::StatusCode::kOk);
    }
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - start).count() / kCalls;
    std::printf("data-plane audit: %.2f us per call on the caller\n", us);
    (*a)->FlushAudit();
  }

  options.audit_data_plane = 0.25;
  absl::StatusOr<std::unique_ptr<Authorizer>> sampled = Authorizer::Create(options);
  ASSERT_TRUE(sampled.ok());
  int drawn = 0;
  for (int i = 0; i < 4000; ++i) drawn += (*sampled)->SampleDataPlane() ? 1 : 0;
  EXPECT_GT(drawn, 800);
  EXPECT_LT(drawn, 1200);
  options.audit_data_plane = 0;
  EXPECT_FALSE((*Authorizer::Create(options))->SampleDataPlane());
  options.audit_data_plane = 1.5;
  EXPECT_EQ(Authorizer::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.audit_data_plane = 1;
  options.audit_fail_closed = true;
  options.audit_file.clear();
  EXPECT_EQ(Authorizer::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offload::auth
