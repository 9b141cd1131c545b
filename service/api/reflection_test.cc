#include "service/api/reflection.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "offload/store/v1/keystore.pb.h"
#include "offload/v1/ed25519.pb.h"

namespace offload::api {
namespace {

using google::protobuf::FileDescriptorProto;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::ElementsAre;
using ::testing::Contains;

// The generated files are in the pool once their code is linked: make sure it is.
const bool kLinked = offload::v1::VerifyRequest::descriptor() != nullptr &&
                     grpc::health::v1::HealthCheckRequest::descriptor() != nullptr &&
                     offload::store::v1::KeyVersionRecord::descriptor() != nullptr;

std::vector<std::string> FileNames(const ServerReflectionResponse& r) {
  std::vector<std::string> names;
  for (const std::string& raw : r.file_descriptor_response().file_descriptor_proto()) {
    FileDescriptorProto fd;
    EXPECT_TRUE(fd.ParseFromString(raw));
    names.push_back(fd.name());
  }
  return names;
}

TEST(Reflection, ListsTheServicesAndItself) {
  Reflection reflection({"offload.v1.Ed25519Service", "grpc.health.v1.Health"});
  Reflection::Stream stream(&reflection);
  ServerReflectionRequest request;
  request.set_list_services("");
  request.set_host("h");
  const ServerReflectionResponse r = stream.Answer(request);
  std::vector<std::string> names;
  for (const auto& s : r.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, ElementsAre("offload.v1.Ed25519Service", "grpc.health.v1.Health",
                                 "grpc.reflection.v1.ServerReflection",
                                 "grpc.reflection.v1alpha.ServerReflection"));
  EXPECT_EQ(r.valid_host(), "h");
  EXPECT_EQ(r.original_request().list_services(), "");
}

TEST(Reflection, DescribesEveryListedService) {
  Reflection reflection({"offload.v1.Ed25519Service", "grpc.health.v1.Health"});
  for (const std::string& service : reflection.services()) {
    Reflection::Stream stream(&reflection);
    ServerReflectionRequest request;
    request.set_file_containing_symbol(service);
    const ServerReflectionResponse r = stream.Answer(request);
    ASSERT_TRUE(r.has_file_descriptor_response()) << service << ": " << r.DebugString();
    FileDescriptorProto fd;
    ASSERT_TRUE(fd.ParseFromString(r.file_descriptor_response().file_descriptor_proto(0)));
    bool found = false;
    for (const auto& s : fd.service()) found |= absl::StrCat(fd.package(), ".", s.name()) == service;
    EXPECT_TRUE(found) << service << " not in " << fd.name();
  }
}

TEST(Reflection, SendsImportsOncePerStreamAndTheFileAlways) {
  Reflection reflection({"offload.v1.Ed25519Service"});
  Reflection::Stream stream(&reflection);
  ServerReflectionRequest request;
  request.set_file_containing_symbol("offload.v1.Ed25519Service.Verify");  // a method
  const std::vector<std::string> first = FileNames(stream.Answer(request));
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(first[0], "offload/v1/ed25519.proto");
  EXPECT_THAT(first, Contains("offload/v1/common.proto"));
  request.set_file_by_filename("offload/v1/ed25519.proto");
  EXPECT_THAT(FileNames(stream.Answer(request)), ElementsAre("offload/v1/ed25519.proto"));
  Reflection::Stream other(&reflection);  // a new stream sends them again
  EXPECT_EQ(FileNames(other.Answer(request)), first);
}

TEST(Reflection, ErrorsAreAnswersNotStreamFailures) {
  Reflection reflection({"offload.v1.Ed25519Service"});
  Reflection::Stream stream(&reflection);
  ServerReflectionRequest request;
  request.set_file_containing_symbol(std::string(1000, 'x'));
  ServerReflectionResponse r = stream.Answer(request);
  EXPECT_EQ(r.error_response().error_code(), 5);  // NOT_FOUND
  EXPECT_LT(r.error_response().error_message().size(), 200u);  // the name is cut short
  request.set_file_by_filename("nope.proto");
  EXPECT_EQ(stream.Answer(request).error_response().error_code(), 5);
  request.mutable_file_containing_extension()->set_containing_type("offload.v1.SignRequest");
  request.mutable_file_containing_extension()->set_extension_number(1000);
  EXPECT_EQ(stream.Answer(request).error_response().error_code(), 5);
  request.Clear();
  EXPECT_EQ(stream.Answer(request).error_response().error_code(), 3);  // INVALID_ARGUMENT
  request.set_all_extension_numbers_of_type("offload.v1.SignRequest");
  r = stream.Answer(request);
  EXPECT_EQ(r.all_extension_numbers_response().base_type_name(), "offload.v1.SignRequest");
  EXPECT_EQ(r.all_extension_numbers_response().extension_number_size(), 0);
}

TEST(Reflection, DescribesNothingTheServicesDoNotReach) {
  // Linked into the binary, but no listed service uses them: as if absent.
  Reflection reflection({"offload.v1.Ed25519Service"});
  Reflection::Stream stream(&reflection);
  ASSERT_NE(google::protobuf::DescriptorPool::generated_pool()->FindFileByName(
                "offload/store/v1/keystore.proto"),
            nullptr);
  for (const char* file : {"offload/store/v1/keystore.proto", "google/protobuf/descriptor.proto",
                           "grpc/health/v1/health.proto"}) {
    ServerReflectionRequest request;
    request.set_file_by_filename(file);
    EXPECT_EQ(stream.Answer(request).error_response().error_code(), 5) << file;
  }
  ServerReflectionRequest request;
  request.set_file_containing_symbol("offload.store.v1.KeyVersionRecord");
  EXPECT_EQ(stream.Answer(request).error_response().error_code(), 5);
  request.set_all_extension_numbers_of_type("google.protobuf.FileOptions");
  EXPECT_EQ(stream.Answer(request).error_response().error_code(), 5);
}

TEST(Reflection, V1alphaIsV1UnderItsOwnName) {
  Reflection reflection({});
  Reflection::Stream stream(&reflection);
  ServerReflectionRequest request;
  request.set_file_containing_symbol("grpc.reflection.v1alpha.ServerReflectionResponse");
  const ServerReflectionResponse r = stream.Answer(request);
  ASSERT_TRUE(r.has_file_descriptor_response()) << r.DebugString();
  FileDescriptorProto fd;
  ASSERT_TRUE(fd.ParseFromString(r.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(fd.package(), "grpc.reflection.v1alpha");
  EXPECT_EQ(fd.name(), "grpc/reflection/v1alpha/reflection.proto");
  for (const auto& m : fd.message_type()) {
    for (const auto& f : m.field()) EXPECT_FALSE(absl::StrContains(f.type_name(), ".v1.")) << f.type_name();
  }
}

}  // namespace
}  // namespace offload::api
