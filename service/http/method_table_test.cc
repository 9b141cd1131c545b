#include "service/http/method_table.h"

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace offload::http {
namespace {

// The table serves every method of every offload.v1 service, with the API's types: a method
// added to the proto without a row here fails this test.
TEST(MethodTable, CoversEveryMethodWithTheProtoTypes) {
  const MethodTable table(/*operations=*/nullptr, /*keys=*/nullptr);
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  std::set<std::string> expected;
  for (const char* name : {"offload.v1.KeyService", "offload.v1.Ed25519Service",
                           "offload.v1.X25519Service", "offload.v1.BoxService",
                           "offload.v1.AeadService"}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
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
    }
  }
  EXPECT_EQ(table.methods().size(), expected.size());
  EXPECT_EQ(table.Find("/offload.v1.KeyService/Nope"), nullptr);
  EXPECT_EQ(table.Find("offload.v1.KeyService/GetKey"), nullptr);
}

}  // namespace
}  // namespace offload::http
