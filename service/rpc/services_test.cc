// The gRPC services built from ops::ForEachMethod, in process: every method of the proto's five
// services is served under its path with the proto's types, and answers as the operation does.

#include "service/rpc/services.h"

#include <sodium.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"
#include "service/auth/authorizer.h"
#include "service/crypto/backend.h"
#include "service/metrics/metrics.h"
#include "service/ops/methods.h"
#include "service/ops/test_stack.h"

namespace offload::rpc {
namespace {

class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto stack = ops::TestStack::Create();
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = *std::move(stack);
    metrics_ = std::make_unique<metrics::Metrics>();
    auth::Authorizer::Options auth_options;  // no mTLS: every call allowed, lifecycle audited
    auth_options.audit_file = stack_->dir + "/audit.jsonl";
    auto authorizer = auth::Authorizer::Create(auth_options);
    ASSERT_TRUE(authorizer.ok()) << authorizer.status();
    authorizer_ = *std::move(authorizer);
    Guards guards;
    guards.authorizer = authorizer_.get();
    services_ = std::make_unique<Services>(stack_->ops.get(), stack_->keys.get(),
                                           stack_->pool.get(), metrics_.get(), 0.0, guards);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    services_->RegisterAll(builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    }
    server_.reset();
    services_.reset();
    authorizer_.reset();
    metrics_.reset();
    stack_.reset();
  }

  std::unique_ptr<ops::TestStack> stack_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<auth::Authorizer> authorizer_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// An empty request to every method of the proto: none is UNIMPLEMENTED (each has a handler),
// and each answers what its operation answers an empty request (validation errors name a field).
TEST_F(ServicesTest, EveryProtoMethodIsServed) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  grpc::GenericStub stub(channel_);
  int methods = 0;
  for (absl::string_view name : ops::kServices) {
    const google::protobuf::ServiceDescriptor* service =
        pool->FindServiceByName(std::string(name));
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string path = absl::StrCat("/", name, "/", service->method(i)->name());
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
      grpc::Slice empty("", 0);
      grpc::ByteBuffer request(&empty, 1);  // an empty message: every field at its default
      grpc::ByteBuffer response;
      absl::Notification done;
      grpc::Status status;
      stub.UnaryCall(&context, path, grpc::StubOptions(), &request, &response,
                     [&](grpc::Status s) {
                       status = std::move(s);
                       done.Notify();
                     });
      done.WaitForNotification();
      EXPECT_NE(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << path;
      if (service->method(i)->name() == "ListKeys") {
        EXPECT_TRUE(status.ok()) << path << ": " << status.error_message();
      } else if (!status.ok()) {
        // Single calls refuse the empty request with the field; empty batches are answered.
        EXPECT_TRUE(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                    status.error_code() == grpc::StatusCode::NOT_FOUND)
            << path << ": " << status.error_code() << " " << status.error_message();
      }
      ++methods;
    }
  }
  EXPECT_EQ(methods, 6 + 4 + 2 + 4 + 4);

  // Each method is counted under its own name, and exactly the batch twins as batches (the
  // items-per-batch histogram): the list's kinds as the metrics see them.
  const std::string scrape = metrics_->Scrape();
  std::set<std::string> batches, counted;
  const std::regex batch_re(
      R"re(offload_batch_items_count\{[^}]*method="([A-Za-z]+)"[^}]*service="([A-Za-z0-9.]+)")re");
  const std::regex request_re(
      R"re(offload_requests_total\{[^}]*method="([A-Za-z]+)"[^}]*service="([A-Za-z0-9.]+)")re");
  for (auto it = std::sregex_iterator(scrape.begin(), scrape.end(), batch_re);
       it != std::sregex_iterator(); ++it) {
    batches.insert(absl::StrCat((*it)[2].str(), "/", (*it)[1].str()));
  }
  for (auto it = std::sregex_iterator(scrape.begin(), scrape.end(), request_re);
       it != std::sregex_iterator(); ++it) {
    counted.insert(absl::StrCat((*it)[2].str(), "/", (*it)[1].str()));
  }
  EXPECT_EQ(batches, (std::set<std::string>{
                         "offload.v1.Ed25519Service/BatchSign",
                         "offload.v1.Ed25519Service/BatchVerify",
                         "offload.v1.X25519Service/BatchDerive", "offload.v1.BoxService/BatchSeal",
                         "offload.v1.BoxService/BatchOpen", "offload.v1.AeadService/BatchSeal",
                         "offload.v1.AeadService/BatchOpen"}))
      << scrape;
  EXPECT_EQ(counted.size(), 20u) << scrape;
}

// The generated stubs (the proto's types) against the table-built services: a key made, a
// signature verified (the second time from the memo), an AEAD blob sealed and opened (the raw
// Open: Seal recorded the plaintext, so the answer is the memo's buffer), then opened with
// other associated data (a fresh decrypt, which fails).
TEST_F(ServicesTest, AnswersThroughTheGeneratedStubs) {
  auto keys = v1::KeyService::NewStub(channel_);
  auto ed = v1::Ed25519Service::NewStub(channel_);
  auto aead = v1::AeadService::NewStub(channel_);
  auto create_key = [&](const std::string& id, v1::KeyType type) {
    grpc::ClientContext c;
    v1::CreateKeyRequest q;
    q.set_key_id(id);
    q.set_type(type);
    v1::KeyInfo r;
    const grpc::Status status = keys->CreateKey(&c, q, &r);
    EXPECT_TRUE(status.ok()) << id << ": " << status.error_message();
    EXPECT_EQ(r.current_version(), 1u) << id;
    return status.ok();
  };
  ASSERT_TRUE(create_key("signer", v1::KEY_TYPE_ED25519));
  v1::SignResponse signed_;
  {
    grpc::ClientContext c;
    v1::SignRequest q;
    q.set_key_id("signer");
    q.set_message("hello");
    ASSERT_TRUE(ed->Sign(&c, q, &signed_).ok());
  }
  for (bool want_hit : {false, true}) {
    grpc::ClientContext c;
    v1::VerifyRequest q;
    q.set_public_key(signed_.public_key());
    q.set_message("hello");
    q.set_signature(signed_.signature());
    v1::VerifyResponse r;
    ASSERT_TRUE(ed->Verify(&c, q, &r).ok());
    EXPECT_TRUE(r.valid());
    EXPECT_EQ(r.memo_hit(), want_hit);
  }
  ASSERT_TRUE(create_key("box", v1::KEY_TYPE_XCHACHA20_POLY1305));
  v1::AeadSealResponse sealed;
  {
    grpc::ClientContext c;
    v1::AeadSealRequest q;
    q.set_key_id("box");
    q.set_plaintext(std::string(55000, 'p'));
    ASSERT_TRUE(aead->Seal(&c, q, &sealed).ok());
  }
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext c;
    v1::AeadOpenRequest q;
    q.set_key_id("box");
    q.set_envelope(sealed.envelope());
    v1::AeadOpenResponse r;
    const grpc::Status s = aead->Open(&c, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.plaintext(), std::string(55000, 'p'));
    EXPECT_TRUE(r.memo_hit());
    EXPECT_EQ(r.key_version(), 1u);
  }
  {
    grpc::ClientContext c;
    v1::AeadOpenRequest q;
    q.set_key_id("box");
    q.set_envelope(sealed.envelope());
    q.set_associated_data("other");
    v1::AeadOpenResponse r;
    const grpc::Status s = aead->Open(&c, q, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_TRUE(r.plaintext().empty());
  }
}

// BatchVerify and BatchDerive reuse their messages across calls (PooledAllocator): calls of
// different sizes, one after another on one connection, each get exactly their own answer, also
// after a call too large to be kept and one with a long field.
TEST_F(ServicesTest, BatchCallsThatReuseMessagesAnswerOnlyTheirOwnItems) {
  auto keys = v1::KeyService::NewStub(channel_);
  auto ed = v1::Ed25519Service::NewStub(channel_);
  auto x = v1::X25519Service::NewStub(channel_);
  unsigned char pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_keypair(pk, sk);
  // Each call's items differ from the previous calls' (`call` is in every message and in which
  // items are invalid): an answer left over from an earlier call would not match.
  auto item = [&](int call, int i, size_t message_size, bool valid) {
    v1::VerifyRequest q;
    std::string message(message_size, static_cast<char>('a' + (i + call) % 26));
    message[0] = static_cast<char>(call);
    unsigned char sig[crypto_sign_BYTES];
    crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(message.data()),
                         message.size(), sk);
    if (!valid) sig[0] ^= 1;
    q.set_public_key(pk, sizeof pk);
    q.set_message(message);
    q.set_signature(sig, sizeof sig);
    return q;
  };
  struct Shape {
    int items;
    size_t message_size;
  };
  // 64 items; 3; 300 (more than a pooled request keeps); 1 with a 2,000-byte message; 64 again.
  const Shape shapes[] = {{64, 40}, {3, 10}, {300, 12}, {1, 2000}, {64, 40}};
  for (int call = 0; call < 5; ++call) {
    const Shape& shape = shapes[call];
    auto valid = [call](int i) { return (i + call) % 3 != 1; };
    v1::BatchVerifyRequest q;
    for (int i = 0; i < shape.items; ++i) *q.add_items() = item(call, i, shape.message_size, valid(i));
    if (shape.items > 2) q.mutable_items(2)->set_public_key("short");  // an item error
    grpc::ClientContext c;
    v1::BatchVerifyResponse r;
    const grpc::Status status = ed->BatchVerify(&c, q, &r);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(r.results_size(), shape.items);
    for (int i = 0; i < shape.items; ++i) {
      const v1::BatchVerifyResult& result = r.results(i);
      if (i == 2) {
        EXPECT_EQ(result.status().code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
        EXPECT_FALSE(result.valid()) << i;
      } else {
        EXPECT_EQ(result.status().code(), 0) << shape.items << " items, item " << i;
        EXPECT_EQ(result.valid(), valid(i)) << shape.items << " items, item " << i;
      }
    }
  }

  // An imported scalar, so that the expected shared keys come from libsodium here, not from the
  // server (whose memo would answer a Derive with what BatchDerive just stored).
  unsigned char scalar[crypto_scalarmult_SCALARBYTES];
  randombytes_buf(scalar, sizeof scalar);
  {
    grpc::ClientContext c;
    v1::ImportKeyRequest q;
    q.set_key_id("dh");
    q.set_type(v1::KEY_TYPE_X25519);
    q.set_secret(scalar, sizeof scalar);
    v1::KeyInfo info;
    const grpc::Status status = keys->ImportKey(&c, q, &info);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  auto peer = [](int i) {
    std::string key(32, '\0');
    crypto_generichash(reinterpret_cast<unsigned char*>(key.data()), key.size(),
                       reinterpret_cast<const unsigned char*>(&i), sizeof i, nullptr, 0);
    return key;
  };
  auto derive = [&](const std::string& peer_key) {
    std::string shared(crypto_scalarmult_BYTES, '\0');
    EXPECT_EQ(crypto_scalarmult(reinterpret_cast<unsigned char*>(shared.data()), scalar,
                                reinterpret_cast<const unsigned char*>(peer_key.data())),
              0);
    return shared;
  };
  // The last call repeats the first's items: memo hits, after three calls of other items.
  const int sizes[] = {64, 2, 200, 64, 64};
  for (int call = 0; call < 5; ++call) {
    const int items = sizes[call];
    const int seed = call == 4 ? 0 : call;
    v1::BatchDeriveRequest q;
    for (int i = 0; i < items; ++i) {
      v1::DeriveRequest* d = q.add_items();
      d->set_key_id(i == 1 ? "nosuch" : "dh");
      d->set_peer_public_key(peer(i * 7 + seed * 1000));
    }
    grpc::ClientContext c;
    v1::BatchDeriveResponse r;
    const grpc::Status status = x->BatchDerive(&c, q, &r);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(r.results_size(), items);
    for (int i = 0; i < items; ++i) {
      const v1::BatchDeriveResult& result = r.results(i);
      if (i == 1) {
        EXPECT_EQ(result.status().code(), grpc::StatusCode::NOT_FOUND);
        EXPECT_TRUE(result.response().shared_key().empty());
      } else {
        EXPECT_EQ(result.status().code(), 0) << items << " items, item " << i;
        EXPECT_EQ(result.response().shared_key(), derive(peer(i * 7 + seed * 1000)))
            << items << " items, item " << i;
      }
    }
  }
}

// Key lifecycle calls are audited with the key's version after the call (none after a delete);
// lookups are not.
TEST_F(ServicesTest, AuditsKeyLifecycleCalls) {
  auto keys = v1::KeyService::NewStub(channel_);
  auto call = [](auto fn) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    const grpc::Status s = fn(&c);
    EXPECT_TRUE(s.ok()) << s.error_message();
  };
  v1::KeyInfo info;
  v1::CreateKeyRequest create;
  create.set_key_id("k");
  create.set_type(v1::KEY_TYPE_X25519);
  call([&](grpc::ClientContext* c) { return keys->CreateKey(c, create, &info); });
  v1::RotateKeyRequest rotate;
  rotate.set_key_id("k");
  call([&](grpc::ClientContext* c) { return keys->RotateKey(c, rotate, &info); });
  v1::GetKeyRequest get;
  get.set_key_id("k");
  call([&](grpc::ClientContext* c) { return keys->GetKey(c, get, &info); });
  v1::ListKeysResponse list;
  call([&](grpc::ClientContext* c) { return keys->ListKeys(c, v1::ListKeysRequest(), &list); });
  v1::DeleteKeyRequest del;
  del.set_key_id("k");
  v1::DeleteKeyResponse deleted;
  call([&](grpc::ClientContext* c) { return keys->DeleteKey(c, del, &deleted); });

  std::ifstream in(stack_->dir + "/audit.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["event"], "key_create");
  EXPECT_EQ(lines[0]["version"], 1);
  EXPECT_EQ(lines[1]["event"], "key_rotate");
  EXPECT_EQ(lines[1]["version"], 2);
  EXPECT_EQ(lines[2]["event"], "key_delete");
  EXPECT_FALSE(lines[2].contains("version"));
  for (const auto& line : lines) {
    EXPECT_EQ(line["transport"], "grpc");
    EXPECT_EQ(line["key_id"], "k");
    EXPECT_EQ(line["code"], "OK");
  }
}

}  // namespace
}  // namespace offload::rpc
