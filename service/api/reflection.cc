#include "service/api/reflection.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.pb.h"

namespace offload::api {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using google::protobuf::FileDescriptorProto;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

constexpr absl::string_view kV1Package = ".grpc.reflection.v1.";
constexpr absl::string_view kV1alphaPackage = ".grpc.reflection.v1alpha.";
constexpr absl::string_view kV1alphaFile = "grpc/reflection/v1alpha/reflection.proto";

// A name from a request, for an error message: at most 128 bytes, escaped.
std::string Quote(absl::string_view name) {
  return absl::StrCat("\"", absl::CHexEscape(name.substr(0, 128)), name.size() > 128 ? "...\"" : "\"");
}

void Rename(std::string* type_name) {
  if (absl::StartsWith(*type_name, kV1Package)) {
    *type_name = absl::StrCat(kV1alphaPackage, type_name->substr(kV1Package.size()));
  }
}

bool IsV1alpha(absl::string_view name) {
  return absl::StartsWith(name, kV1alphaPackage.substr(1));
}

}  // namespace

Reflection::Reflection(std::vector<std::string> services)
    : services_(std::move(services)), v1alpha_pool_(std::make_unique<DescriptorPool>()) {
  services_.emplace_back(kV1);
  services_.emplace_back(kV1alpha);
  // v1alpha: v1's file, renamed. Its messages are the same on the wire.
  FileDescriptorProto file;
  ServerReflectionRequest::descriptor()->file()->CopyTo(&file);
  file.set_name(std::string(kV1alphaFile));
  file.set_package("grpc.reflection.v1alpha");
  file.clear_options();
  for (auto& message : *file.mutable_message_type()) {
    for (auto& field : *message.mutable_field()) {
      if (field.has_type_name()) Rename(field.mutable_type_name());
    }
  }
  for (auto& service : *file.mutable_service()) {
    for (auto& method : *service.mutable_method()) {
      Rename(method.mutable_input_type());
      Rename(method.mutable_output_type());
    }
  }
  v1alpha_file_ = v1alpha_pool_->BuildFile(file);
  // What may be described: the files of the listed services and everything they import.
  std::vector<const FileDescriptor*> queue;
  for (const std::string& service : services_) {
    const FileDescriptor* f = AnyFileOfSymbol(service);
    if (f != nullptr && !files_.contains(f->name())) {
      files_[f->name()];
      queue.push_back(f);
    }
  }
  for (size_t i = 0; i < queue.size(); ++i) {
    const FileDescriptor* f = queue[i];
    File& entry = files_[f->name()];
    FileDescriptorProto proto;
    f->CopyTo(&proto);
    proto.SerializeToString(&entry.bytes);
    for (int d = 0; d < f->dependency_count(); ++d) {
      const FileDescriptor* dep = f->dependency(d);
      if (dep == nullptr) continue;  // never built (a lazily loaded pool): nothing to send
      entry.imports.push_back(dep->name());
      if (!files_.contains(dep->name())) {
        files_[dep->name()];
        queue.push_back(dep);
      }
    }
  }
}

const FileDescriptor* Reflection::AnyFileOfSymbol(absl::string_view symbol) const {
  return IsV1alpha(symbol)
             ? v1alpha_pool_->FindFileContainingSymbol(std::string(symbol))
             : DescriptorPool::generated_pool()->FindFileContainingSymbol(std::string(symbol));
}

Reflection::~Reflection() = default;

absl::StatusOr<const FileDescriptor*> Reflection::FileOfSymbol(absl::string_view symbol) const {
  const FileDescriptor* file = AnyFileOfSymbol(symbol);
  if (file == nullptr || !files_.contains(file->name())) {
    return absl::NotFoundError(absl::StrCat("symbol not found: ", Quote(symbol)));
  }
  return file;
}

absl::StatusOr<const FileDescriptor*> Reflection::FileByName(absl::string_view name) const {
  const FileDescriptor* file =
      name == kV1alphaFile ? v1alpha_file_
                           : DescriptorPool::generated_pool()->FindFileByName(std::string(name));
  if (file == nullptr || !files_.contains(file->name())) {
    return absl::NotFoundError(absl::StrCat("file not found: ", Quote(name)));
  }
  return file;
}

const google::protobuf::Descriptor* Reflection::MessageType(absl::string_view name) const {
  const google::protobuf::Descriptor* type =
      IsV1alpha(name) ? v1alpha_pool_->FindMessageTypeByName(std::string(name))
                      : DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(name));
  return type != nullptr && files_.contains(type->file()->name()) ? type : nullptr;
}

void Reflection::Stream::AddFiles(const std::string& file,
                                  grpc::reflection::v1::FileDescriptorResponse* out) {
  // The file asked for always; then its imports, breadth first, each once per stream.
  std::vector<const std::string*> queue = {&file};
  sent_.insert(file);
  for (size_t i = 0; i < queue.size(); ++i) {
    auto it = reflection_->files_.find(*queue[i]);
    if (it == reflection_->files_.end()) continue;
    out->add_file_descriptor_proto(it->second.bytes);
    for (const std::string& dep : it->second.imports) {
      if (sent_.insert(dep).second) queue.push_back(&dep);
    }
  }
}

ServerReflectionResponse Reflection::Stream::Answer(const ServerReflectionRequest& request) {
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  absl::Status error;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kFileByFilename: {
      absl::StatusOr<const FileDescriptor*> file = reflection_->FileByName(request.file_by_filename());
      if (file.ok()) AddFiles((*file)->name(), response.mutable_file_descriptor_response());
      error = file.status();
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      absl::StatusOr<const FileDescriptor*> file =
          reflection_->FileOfSymbol(request.file_containing_symbol());
      if (file.ok()) AddFiles((*file)->name(), response.mutable_file_descriptor_response());
      error = file.status();
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const google::protobuf::Descriptor* type = reflection_->MessageType(ext.containing_type());
      const google::protobuf::FieldDescriptor* field =
          type == nullptr ? nullptr
                          : type->file()->pool()->FindExtensionByNumber(type, ext.extension_number());
      if (field == nullptr || !reflection_->files_.contains(field->file()->name())) {
        error = absl::NotFoundError(absl::StrCat("extension not found: ", Quote(ext.containing_type()),
                                                 " number ", ext.extension_number()));
      } else {
        AddFiles(field->file()->name(), response.mutable_file_descriptor_response());
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const std::string& name = request.all_extension_numbers_of_type();
      const google::protobuf::Descriptor* type = reflection_->MessageType(name);
      if (type == nullptr) {
        error = absl::NotFoundError(absl::StrCat("type not found: ", Quote(name)));
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      type->file()->pool()->FindAllExtensions(type, &extensions);
      auto* out = response.mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const auto* e : extensions) {
        if (reflection_->files_.contains(e->file()->name())) out->add_extension_number(e->number());
      }
      break;
    }
    case ServerReflectionRequest::kListServices: {
      auto* out = response.mutable_list_services_response();
      for (const std::string& name : reflection_->services()) out->add_service()->set_name(name);
      break;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      error = absl::InvalidArgumentError(
          "message_request: expected file_by_filename, file_containing_symbol, "
          "file_containing_extension, all_extension_numbers_of_type or list_services");
      break;
  }
  if (!error.ok()) {
    auto* e = response.mutable_error_response();
    e->set_error_code(static_cast<int>(error.code()));
    e->set_error_message(std::string(error.message()));
  }
  return response;
}

}  // namespace offload::api
