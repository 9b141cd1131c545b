// Which fields of the API's messages hold secrets (a plaintext to seal or just opened, a shared
// key, a key to import), and wiping them in place: a call's request and response messages are
// zeroed before they are freed when their types carry such a field (call::Call).
//
//   if (api::HasSecretFields(*m.response_prototype->GetDescriptor())) ...
//   api::WipeSecretFields(response);  // every secret bytes field, nested and repeated too
//
// Secret fields are found by name (`plaintext`, `shared_key`, `secret`), the names offload.v1
// gives them; method_table_test checks which methods that marks.
// Thread-safety: pure functions; WipeSecretFields REQUIRES no other thread uses the message.
#ifndef SERVICE_API_SECRET_FIELDS_H_
#define SERVICE_API_SECRET_FIELDS_H_

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace offload::api {

// True when `type`, or a message type any of its fields holds (at any depth), has a secret
// bytes field.
bool HasSecretFields(const google::protobuf::Descriptor& type);

// Zeroes the bytes of every secret field set in `message` and in the messages it holds; sizes
// stay (the fields then hold zeros).
void WipeSecretFields(google::protobuf::Message* message);

}  // namespace offload::api

#endif  // SERVICE_API_SECRET_FIELDS_H_
