#include "service/api/method_table.h"

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "gtest/gtest.h"
#include "service/api/methods.h"

namespace offload::api {
namespace {

// The table serves every method of every offload.v1 service, with the API's types: a method
// added to the proto without a row here fails this test.
TEST(MethodTable, CoversEveryMethodWithTheProtoTypes) {
  const MethodTable table(/*operations=*/nullptr, /*keys=*/nullptr);
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  std::set<std::string> expected;
  for (absl::string_view name : kServices) {
    const google::protobuf::ServiceDescriptor* service =
        pool->FindServiceByName(std::string(name));
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      const std::string path = "/" + service->full_name() + "/" + method->name();
      expected.insert(path);
      const Method* m = table.Find(path);
      ASSERT_NE(m, nullptr) << path;
      EXPECT_EQ(m->path, path);
      EXPECT_EQ(m->service, service->full_name());
      EXPECT_EQ(m->method, method->name());
      EXPECT_EQ(m->request_prototype->GetDescriptor(), method->input_type()) << path;
      EXPECT_EQ(m->response_prototype->GetDescriptor(), method->output_type()) << path;
      EXPECT_EQ(m->batch, method->name().rfind("Batch", 0) == 0) << path;
      EXPECT_FALSE(method->client_streaming() || method->server_streaming()) << path;
      EXPECT_TRUE(static_cast<bool>(m->call)) << path;
      EXPECT_EQ(m->no_side_effects, method->options().idempotency_level() ==
                                        google::protobuf::MethodOptions::NO_SIDE_EFFECTS)
          << path;
      EXPECT_EQ(static_cast<bool>(m->from_memo), static_cast<bool>(m->fresh)) << path;
    }
  }
  EXPECT_EQ(table.methods().size(), expected.size());
  // The side-effect-free methods (Connect GET) are exactly these, as the proto says.
  std::set<std::string> get_methods, memo_first;
  for (const Method& m : table.methods()) {
    if (m.no_side_effects) get_methods.insert(m.path);
    if (m.from_memo) memo_first.insert(m.path);
  }
  EXPECT_EQ(get_methods, (std::set<std::string>{"/offload.v1.Ed25519Service/Verify",
                                                "/offload.v1.Ed25519Service/BatchVerify",
                                                "/offload.v1.KeyService/GetKey",
                                                "/offload.v1.KeyService/ListKeys"}));
  EXPECT_EQ(memo_first, (std::set<std::string>{"/offload.v1.Ed25519Service/Verify",
                                               "/offload.v1.Ed25519Service/BatchVerify",
                                               "/offload.v1.X25519Service/Derive",
                                               "/offload.v1.X25519Service/BatchDerive",
                                               "/offload.v1.AeadService/Open"}));
  // Key lifecycle calls (audited) are exactly these.
  std::set<std::string> audited;
  for (const Method& m : table.methods()) {
    if (m.key_lifecycle) audited.insert(m.path);
  }
  EXPECT_EQ(audited, (std::set<std::string>{"/offload.v1.KeyService/CreateKey",
                                            "/offload.v1.KeyService/ImportKey",
                                            "/offload.v1.KeyService/RotateKey",
                                            "/offload.v1.KeyService/DeleteKey",
                                            "/offload.v1.KeyService/CancelKeyDeletion",
                                            "/offload.v1.KeyService/DisableKey",
                                            "/offload.v1.KeyService/EnableKey",
                                            "/offload.v1.KeyService/DisableKeyVersion",
                                            "/offload.v1.KeyService/EnableKeyVersion",
                                            "/offload.v1.KeyService/DestroyKeyVersion",
                                            "/offload.v1.KeyService/RestoreKeyVersion",
                                            "/offload.v1.KeyService/SetMinDecryptionVersion"}));
  // Data-plane calls audited per call under --audit_data_plane, and answers cacheable for good.
  std::set<std::string> data_plane, immutable;
  for (const Method& m : table.methods()) {
    if (m.data_plane) data_plane.insert(m.path);
    if (m.immutable) immutable.insert(m.path);
  }
  EXPECT_EQ(data_plane, (std::set<std::string>{"/offload.v1.Ed25519Service/Sign",
                                               "/offload.v1.Ed25519Service/BatchSign",
                                               "/offload.v1.X25519Service/Derive",
                                               "/offload.v1.X25519Service/BatchDerive",
                                               "/offload.v1.BoxService/Seal",
                                               "/offload.v1.BoxService/BatchSeal",
                                               "/offload.v1.BoxService/Open",
                                               "/offload.v1.BoxService/BatchOpen",
                                               "/offload.v1.AeadService/Seal",
                                               "/offload.v1.AeadService/BatchSeal",
                                               "/offload.v1.AeadService/Open",
                                               "/offload.v1.AeadService/BatchOpen",
                                               "/offload.v1.AeadService/Rewrap",
                                               "/offload.v1.AeadService/BatchRewrap"}));
  EXPECT_EQ(immutable, (std::set<std::string>{"/offload.v1.Ed25519Service/Verify",
                                              "/offload.v1.Ed25519Service/BatchVerify"}));
  EXPECT_EQ(table.Find("/offload.v1.KeyService/Nope"), nullptr);
  EXPECT_EQ(table.Find("offload.v1.KeyService/GetKey"), nullptr);
}

}  // namespace
}  // namespace offload::api

namespace offload::api {
namespace {

// The grants policy's operations come from the table: every RPC has one, a batch its single
// twin's, the key management ones are for admins.
TEST(PolicyOperations, EveryRpcHasItsOperation) {
  const auth::OperationMap ops = PolicyOperations();
  EXPECT_EQ(ops.size(), MethodTable(nullptr, nullptr).methods().size());
  const auto op = [&](const char* path) { return ops.at(path); };
  EXPECT_EQ(op("/offload.v1.AeadService/BatchOpen").name, "aead.open");
  EXPECT_EQ(op("/offload.v1.BoxService/Seal").name, "box.seal");
  EXPECT_EQ(op("/offload.v1.X25519Service/BatchDerive").name, "x25519.derive");
  EXPECT_EQ(op("/offload.v1.KeyService/DestroyKeyVersion").name, "keys.delete");
  EXPECT_EQ(op("/offload.v1.KeyService/CancelKeyDeletion").name, "keys.restore");
  EXPECT_EQ(op("/offload.v1.KeyService/SetMinDecryptionVersion").name, "keys.configure");
  EXPECT_TRUE(op("/offload.v1.KeyService/CreateKey").admin);
  EXPECT_FALSE(op("/offload.v1.KeyService/GetKey").admin);
  EXPECT_TRUE(op("/offload.v1.KeyService/GetKey").uses_key);
  EXPECT_FALSE(op("/offload.v1.KeyService/ListKeys").uses_key);
  EXPECT_FALSE(op("/offload.v1.Ed25519Service/Verify").uses_key);
  EXPECT_TRUE(op("/offload.v1.Ed25519Service/Sign").uses_key);
  EXPECT_EQ(ops.count("/offload.v1.AeadService/Nope"), 0u);
}

}  // namespace
}  // namespace offload::api
