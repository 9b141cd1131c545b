#include "service/api/secret_fields.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"
#include "service/api/method_table.h"

namespace offload::api {
namespace {

TEST(SecretFields, FoundByTypeAtAnyDepth) {
  EXPECT_TRUE(HasSecretFields(*v1::AeadOpenResponse::descriptor()));
  EXPECT_TRUE(HasSecretFields(*v1::BatchAeadOpenResponse::descriptor()));  // results.response
  EXPECT_TRUE(HasSecretFields(*v1::AeadSealRequest::descriptor()));
  EXPECT_TRUE(HasSecretFields(*v1::DeriveResponse::descriptor()));
  EXPECT_TRUE(HasSecretFields(*v1::BatchDeriveResponse::descriptor()));
  EXPECT_TRUE(HasSecretFields(*v1::BoxOpenResponse::descriptor()));
  EXPECT_TRUE(HasSecretFields(*v1::ImportKeyRequest::descriptor()));
  EXPECT_FALSE(HasSecretFields(*v1::VerifyRequest::descriptor()));
  EXPECT_FALSE(HasSecretFields(*v1::BatchVerifyResponse::descriptor()));
  EXPECT_FALSE(HasSecretFields(*v1::SignResponse::descriptor()));
  EXPECT_FALSE(HasSecretFields(*v1::AeadRewrapResponse::descriptor()));  // envelopes only
}

// The methods whose calls wipe their messages: every one that carries a plaintext, a shared key
// or a key to import, and no other.
TEST(SecretFields, MarkTheMethodsThatCarrySecrets) {
  const MethodTable table(/*operations=*/nullptr, /*keys=*/nullptr);
  std::set<std::string> requests, responses;
  for (const Method& m : table.methods()) {
    const std::string name = m.service.substr(m.service.rfind('.') + 1) + "/" + m.method;
    if (m.secret_request) requests.insert(name);
    if (m.secret_response) responses.insert(name);
  }
  EXPECT_EQ(requests, (std::set<std::string>{"AeadService/Seal", "AeadService/BatchSeal",
                                             "BoxService/Seal", "BoxService/BatchSeal",
                                             "KeyService/ImportKey"}));
  EXPECT_EQ(responses, (std::set<std::string>{"AeadService/Open", "AeadService/BatchOpen",
                                              "BoxService/Open", "BoxService/BatchOpen",
                                              "X25519Service/Derive",
                                              "X25519Service/BatchDerive"}));
}

// Zeroed where they lie (the bytes a pointer taken before sees), sizes and other fields kept.
TEST(SecretFields, WipeZeroesSecretBytesInPlace) {
  v1::BatchAeadOpenResponse response;
  for (int i = 0; i < 2; ++i) {
    v1::BatchAeadOpenResult* r = response.add_results();
    r->mutable_response()->set_plaintext(std::string(40 + i, static_cast<char>('a' + i)));
    r->mutable_response()->set_key_version(7);
    r->mutable_status()->set_message("kept");
  }
  response.add_results();  // an item without a response
  const char* first = response.results(0).response().plaintext().data();
  WipeSecretFields(&response);
  ASSERT_EQ(response.results_size(), 3);
  for (int i = 0; i < 2; ++i) {
    const v1::BatchAeadOpenResult& r = response.results(i);
    EXPECT_EQ(r.response().plaintext(), std::string(40 + i, '\0'));
    EXPECT_EQ(r.response().key_version(), 7u);
    EXPECT_EQ(r.status().message(), "kept");
  }
  EXPECT_EQ(std::string(first, 40), std::string(40, '\0'));
  EXPECT_FALSE(response.results(2).has_response());  // nothing created by the wipe

  v1::DeriveResponse derive;
  derive.set_shared_key(std::string(32, '\x5a'));
  WipeSecretFields(&derive);
  EXPECT_EQ(derive.shared_key(), std::string(32, '\0'));
}

}  // namespace
}  // namespace offload::api
