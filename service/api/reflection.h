// gRPC server reflection (grpc/grpc doc/server-reflection.md), v1 and v1alpha, answered from the
// descriptors compiled into this binary: what grpcurl, grpcui, Postman and `buf curl` use to
// list our services and call them without .proto files. Free of any transport: the gateway feeds
// it the messages of one ServerReflectionInfo stream (service/gateway).
//
//   Reflection reflection({"offload.v1.Ed25519Service", "grpc.health.v1.Health"});
//   Reflection::Stream stream(&reflection);           // one per ServerReflectionInfo call
//   grpc::reflection::v1::ServerReflectionResponse r = stream.Answer(request);
//
// Every service listed can be described: its file and every file it imports are found (the
// reflection services themselves included; v1alpha is described by a copy of v1's file under
// the v1alpha package). Nothing else is: other files linked into the binary (the key store's
// record format, gRPC's own) are NOT_FOUND, as if absent. Files are serialized once, here. A file
// is sent once per stream: a later answer carries the file asked for and only the dependencies not
// yet sent on that stream.
//
// Thread-safety: Reflection is immutable after construction; a Stream is used by one thread at a
// time.
#ifndef SERVICE_API_REFLECTION_H_
#define SERVICE_API_REFLECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "grpc/reflection/v1/reflection.pb.h"

namespace offload::api {

class Reflection final {
 public:
  // The reflection services' own names, listed beside `services`.
  static constexpr absl::string_view kV1 = "grpc.reflection.v1.ServerReflection";
  static constexpr absl::string_view kV1alpha = "grpc.reflection.v1alpha.ServerReflection";
  // Their one method (a bidirectional stream), in both versions.
  static constexpr absl::string_view kV1Path =
      "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
  static constexpr absl::string_view kV1alphaPath =
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

  // `services`: the full names of the services to list (each must be in the generated pool).
  explicit Reflection(std::vector<std::string> services);
  ~Reflection();

  // The services listed: `services`, then v1 and v1alpha reflection.
  const std::vector<std::string>& services() const { return services_; }

  // The file that declares `symbol` (a service, method, message, enum, enum value, field or
  // extension), or NotFound.
  absl::StatusOr<const google::protobuf::FileDescriptor*> FileOfSymbol(absl::string_view symbol) const;
  // The file named `name`, or NotFound.
  absl::StatusOr<const google::protobuf::FileDescriptor*> FileByName(absl::string_view name) const;
  // The message type named `name`, or null.
  const google::protobuf::Descriptor* MessageType(absl::string_view name) const;

  class Stream {
   public:
    explicit Stream(const Reflection* reflection) : reflection_(reflection) {}
    // The answer to one request (an error answer inside the response, as the protocol wants).
    grpc::reflection::v1::ServerReflectionResponse Answer(
        const grpc::reflection::v1::ServerReflectionRequest& request);

   private:
    // `file` (always) and its transitive imports not yet sent, serialized, into `out`.
    void AddFiles(const std::string& file, grpc::reflection::v1::FileDescriptorResponse* out);

    const Reflection* const reflection_;
    absl::flat_hash_set<std::string> sent_;  // file names already sent on this stream
  };

 private:
  // A file a listed service reaches: serialized, and the names of its imports.
  struct File {
    std::string bytes;
    std::vector<std::string> imports;
  };
  // The file `symbol` names in either pool, whether described or not.
  const google::protobuf::FileDescriptor* AnyFileOfSymbol(absl::string_view symbol) const;

  std::vector<std::string> services_;
  absl::flat_hash_map<std::string, File> files_;
  // v1alpha's file: v1's under the v1alpha package, in a pool of its own (gRPC's libraries may
  // have put a v1alpha file of another name into the generated pool).
  std::unique_ptr<google::protobuf::DescriptorPool> v1alpha_pool_;
  const google::protobuf::FileDescriptor* v1alpha_file_ = nullptr;
};

}  // namespace offload::api

#endif  // SERVICE_API_REFLECTION_H_
