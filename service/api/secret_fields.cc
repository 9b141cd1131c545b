#include "service/api/secret_fields.h"

#include <sodium.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace offload::api {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

bool IsSecretField(const FieldDescriptor& field) {
  if (field.type() != FieldDescriptor::TYPE_BYTES) return false;
  const absl::string_view name = field.name();
  return name == "plaintext" || name == "shared_key" || name == "secret";
}

bool HasSecretFieldsSeen(const Descriptor& type, std::vector<const Descriptor*>* seen) {
  for (const Descriptor* s : *seen) {
    if (s == &type) return false;  // recursive types: already being looked at
  }
  seen->push_back(&type);
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor& field = *type.field(i);
    if (IsSecretField(field)) return true;
    if (field.type() == FieldDescriptor::TYPE_MESSAGE &&
        HasSecretFieldsSeen(*field.message_type(), seen)) {
      return true;
    }
  }
  return false;
}

// The field's own std::string (not a copy: bytes fields are stored as std::string), zeroed.
void ZeroStored(const std::string& stored) {
  if (!stored.empty()) sodium_memzero(const_cast<char*>(stored.data()), stored.size());
}

}  // namespace

bool HasSecretFields(const Descriptor& type) {
  std::vector<const Descriptor*> seen;
  return HasSecretFieldsSeen(type, &seen);
}

void WipeSecretFields(Message* message) {
  const Descriptor& type = *message->GetDescriptor();
  // Qualified: api has a Reflection of its own (the gRPC reflection service).
  const google::protobuf::Reflection& reflection = *message->GetReflection();
  std::string scratch;  // unused for bytes fields: GetStringReference returns the field's own
  for (int f = 0; f < type.field_count(); ++f) {
    const FieldDescriptor* field = type.field(f);
    if (IsSecretField(*field)) {
      if (field->is_repeated()) {
        for (int i = 0, n = reflection.FieldSize(*message, field); i < n; ++i) {
          ZeroStored(reflection.GetRepeatedStringReference(*message, field, i, &scratch));
        }
      } else {
        ZeroStored(reflection.GetStringReference(*message, field, &scratch));
      }
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE &&
               HasSecretFields(*field->message_type())) {
      if (field->is_repeated()) {
        for (int i = 0, n = reflection.FieldSize(*message, field); i < n; ++i) {
          WipeSecretFields(reflection.MutableRepeatedMessage(message, field, i));
        }
      } else if (reflection.HasField(*message, field)) {
        WipeSecretFields(reflection.MutableMessage(message, field));
      }
    }
  }
  ZeroStored(scratch);
}

}  // namespace offload::api
