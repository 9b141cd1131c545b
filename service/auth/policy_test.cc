#include "service/auth/policy.h"

#include "gtest/gtest.h"
#include "service/api/method_table.h"

namespace offload::auth {
namespace {

constexpr char kPolicy[] = R"({
  "admins": ["ops-admin"],
  "grants": [
    {"client": "app-a", "keys": ["app-a-*", "shared"], "operations": ["aead.*", "ed25519.sign"]},
    {"client": "*.edge.example", "keys": ["edge-?"], "operations": ["x25519.derive", "keys.get"]},
    {"client": "lister", "keys": [], "operations": ["keys.list"]}
  ]
})";

// The RPCs' operations, as the server gives them to the policy (service/api).
const OperationMap& Ops() {
  static const OperationMap* const ops = new OperationMap(api::PolicyOperations());
  return *ops;
}
Operation Op(absl::string_view path) { return *OperationOf(Ops(), path); }

TEST(PolicyTest, GrantsMatchClientKeyAndOperationPatterns) {
  absl::StatusOr<Policy> p = Policy::Parse(kPolicy, Ops());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Check("app-a", Op("/offload.v1.AeadService/Open"), {"app-a-1"}).ok());
  EXPECT_TRUE(p->Check("app-a", Op("/offload.v1.AeadService/BatchSeal"), {"shared", "app-a-x"}).ok());
  EXPECT_TRUE(p->Check("app-a", Op("/offload.v1.Ed25519Service/BatchSign"), {"app-a-s"}).ok());
  EXPECT_TRUE(p->Check("d1.edge.example", Op("/offload.v1.X25519Service/Derive"), {"edge-1"}).ok());
  EXPECT_TRUE(p->Check("d1.edge.example", Op("/offload.v1.KeyService/GetKey"), {"edge-1"}).ok());
  EXPECT_TRUE(p->Check("lister", Op("/offload.v1.KeyService/ListKeys"), {}).ok());
}

TEST(PolicyTest, RefusesWhatIsNotGranted) {
  absl::StatusOr<Policy> p = Policy::Parse(kPolicy, Ops());
  ASSERT_TRUE(p.ok());
  const auto denied = [&](absl::string_view who, absl::string_view path,
                          std::vector<std::string> keys) {
    absl::Status s = p->Check(who, Op(path), keys);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << who << " " << path;
  };
  denied("app-a", "/offload.v1.AeadService/Open", {"app-b-1"});            // other key
  denied("app-a", "/offload.v1.AeadService/BatchOpen", {"app-a-1", "x"});  // one item not granted
  denied("app-a", "/offload.v1.X25519Service/Derive", {"app-a-1"});        // other operation
  denied("app-b", "/offload.v1.AeadService/Open", {"app-a-1"});            // no grant at all
  denied("edge.example", "/offload.v1.X25519Service/Derive", {"edge-1"});  // pattern needs a dot
  denied("d1.edge.example", "/offload.v1.X25519Service/Derive", {"edge-10"});
  denied("app-a", "/offload.v1.KeyService/ListKeys", {});
  // Key management is for admins only, whatever the grants say.
  denied("app-a", "/offload.v1.KeyService/CreateKey", {"app-a-new"});
  denied("app-a", "/offload.v1.KeyService/DeleteKey", {"app-a-1"});
}

TEST(PolicyTest, AdminsManageKeysButDoNotUseThem) {
  absl::StatusOr<Policy> p = Policy::Parse(kPolicy, Ops());
  ASSERT_TRUE(p.ok());
  for (const char* m : {"CreateKey", "ImportKey", "RotateKey", "DeleteKey", "GetKey", "ListKeys"}) {
    EXPECT_TRUE(p->Check("ops-admin", Op(std::string("/offload.v1.KeyService/") + m), {"k"}).ok())
        << m;
  }
  EXPECT_EQ(p->Check("ops-admin", Op("/offload.v1.AeadService/Open"), {"app-a-1"}).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(PolicyTest, VerifyOfCallerSuppliedKeysIsOpenUnlessTurnedOff) {
  absl::StatusOr<Policy> open = Policy::Parse(kPolicy, Ops());
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->Check("anyone", Op("/offload.v1.Ed25519Service/BatchVerify"), {}).ok());
  absl::StatusOr<Policy> closed = Policy::Parse(R"({"open_verify": false, "grants": [
      {"client": "v", "keys": ["*"], "operations": ["ed25519.verify"]}]})", Ops());
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->Check("anyone", Op("/offload.v1.Ed25519Service/Verify"), {}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(closed->Check("v", Op("/offload.v1.Ed25519Service/Verify"), {}).ok());
}

TEST(PolicyTest, RejectsMalformedPoliciesNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"[]", "policy"},
      {"{\"admins\": \"x\"}", "admins"},
      {"{\"grants\": [{\"keys\": [\"a\"]}]}", "grants[0].client"},
      {"{\"grants\": [{\"client\": \"a\", \"operations\": [\"aead.decrypt\"]}]}",
       "grants[0].operations"},
      {"{\"grants\": [{\"client\": \"a\", \"colour\": 1}]}", "grants[0]: unknown field colour"},
      {"{\"admin\": []}", "unknown field admin"},
      {"{not json", "policy"},
  };
  for (const auto& [text, field] : cases) {
    absl::StatusOr<Policy> p = Policy::Parse(text, Ops());
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(field), absl::string_view::npos) << p.status();
  }
}

TEST(PolicyTest, EveryRpcHasAnOperation) {
  for (const char* path :
       {"/offload.v1.KeyService/CreateKey", "/offload.v1.Ed25519Service/Verify",
        "/offload.v1.X25519Service/BatchDerive", "/offload.v1.BoxService/BatchOpen",
        "/offload.v1.AeadService/Seal"}) {
    EXPECT_TRUE(OperationOf(Ops(), path).ok()) << path;
  }
  EXPECT_EQ(OperationOf(Ops(), "/offload.v1.AeadService/Nope").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace offload::auth
