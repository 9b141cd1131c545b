// minimal_server: the baseline of issue 15 - the gRPC server a user could write in an afternoon
// for the same proto, to see what our machinery costs next to it (tests/bench/README.md,
// "Against a minimal server").
//
// gRPC's callback API, no worker pool, no memo, no metrics, no auth: every handler does its work
// inline on the gRPC thread and finishes the call there.
//   Ed25519Service.Verify / BatchVerify   libsodium crypto_sign_verify_detached
//   AeadService.Open / BatchOpen          OpenSSL EVP ChaCha20-Poly1305 (one EVP_CIPHER_CTX per
//                                         call), our envelope 0x01 | version u32 | nonce | ct | tag
//   KeyService.CreateKey / ImportKey / DeleteKey / GetKey   ChaCha20-Poly1305 keys, in memory
// Sizes are checked as the proto says (INVALID_ARGUMENT, or a batch item's own status), so that
// offload_load --check passes against it. With --malloc_settings (the default) it makes the two
// mallopt calls of service/main/main.cc, so that a comparison is of the code, not of glibc's
// defaults. Loopback only; prints {"grpc_port":N} once serving and stops on SIGTERM/SIGINT.
//
//   minimal_server --address=127.0.0.1:0 [--malloc_settings=false]
#include <malloc.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sodium.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "gRPC listen address (loopback only)");
ABSL_FLAG(bool, malloc_settings, true, "M_MMAP_THRESHOLD 1 MB, M_TRIM_THRESHOLD 64 MB as ours");

namespace {

namespace v1 = offload::v1;
using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

constexpr size_t kNonce = 12, kTag = 16, kHeader = 5;

ServerUnaryReactor* Done(CallbackServerContext* c, grpc::Status s = grpc::Status::OK) {
  ServerUnaryReactor* r = c->DefaultReactor();
  r->Finish(std::move(s));
  return r;
}
grpc::Status Invalid(std::string m) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(m));
}

class Keys {
 public:
  bool Add(const std::string& id, std::string key) {
    absl::MutexLock l(&mu_);
    return map_.emplace(id, std::make_shared<const std::string>(std::move(key))).second;
  }
  std::shared_ptr<const std::string> Find(const std::string& id) {
    absl::MutexLock l(&mu_);
    auto it = map_.find(id);
    return it == map_.end() ? nullptr : it->second;
  }
  bool Erase(const std::string& id) {
    absl::MutexLock l(&mu_);
    return map_.erase(id) > 0;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const std::string>> map_ ABSL_GUARDED_BY(mu_);
};

class KeyService final : public v1::KeyService::CallbackService {
 public:
  explicit KeyService(Keys* keys) : keys_(keys) {}
  ServerUnaryReactor* CreateKey(CallbackServerContext* c, const v1::CreateKeyRequest* q,
                                v1::KeyInfo* r) override {
    std::string key(32, '\0');
    randombytes_buf(key.data(), key.size());
    return Add(c, q->key_id(), q->type(), std::move(key), r);
  }
  ServerUnaryReactor* ImportKey(CallbackServerContext* c, const v1::ImportKeyRequest* q,
                                v1::KeyInfo* r) override {
    if (q->secret().size() != 32) return Done(c, Invalid("secret: expected 32 bytes"));
    return Add(c, q->key_id(), q->type(), q->secret(), r);
  }
  ServerUnaryReactor* GetKey(CallbackServerContext* c, const v1::GetKeyRequest* q,
                             v1::KeyInfo* r) override {
    if (keys_->Find(q->key_id()) == nullptr) return Done(c, {grpc::StatusCode::NOT_FOUND, "key"});
    Info(q->key_id(), r);
    return Done(c);
  }
  ServerUnaryReactor* DeleteKey(CallbackServerContext* c, const v1::DeleteKeyRequest* q,
                                v1::DeleteKeyResponse*) override {
    if (!keys_->Erase(q->key_id())) return Done(c, {grpc::StatusCode::NOT_FOUND, "key"});
    return Done(c);
  }

 private:
  ServerUnaryReactor* Add(CallbackServerContext* c, const std::string& id, v1::KeyType type,
                          std::string key, v1::KeyInfo* r) {
    if (type != v1::KEY_TYPE_CHACHA20_POLY1305) {
      return Done(c, {grpc::StatusCode::UNIMPLEMENTED, "only chacha20-poly1305 keys"});
    }
    if (!keys_->Add(id, std::move(key))) {
      return Done(c, {grpc::StatusCode::ALREADY_EXISTS, "key id taken"});
    }
    Info(id, r);
    return Done(c);
  }
  static void Info(const std::string& id, v1::KeyInfo* r) {
    r->set_key_id(id);
    r->set_type(v1::KEY_TYPE_CHACHA20_POLY1305);
    r->set_current_version(1);
    r->add_versions()->set_version(1);
  }
  Keys* const keys_;
};

// Empty status when the signature checks out or is merely invalid; an error for bad sizes.
grpc::Status VerifyOne(const v1::VerifyRequest& q, bool* valid) {
  if (q.public_key().size() != 32) return Invalid("public_key: expected 32 bytes");
  if (q.signature().size() != 64) return Invalid("signature: expected 64 bytes");
  *valid = crypto_sign_verify_detached(
               reinterpret_cast<const unsigned char*>(q.signature().data()),
               reinterpret_cast<const unsigned char*>(q.message().data()), q.message().size(),
               reinterpret_cast<const unsigned char*>(q.public_key().data())) == 0;
  return grpc::Status::OK;
}

class Ed25519Service final : public v1::Ed25519Service::CallbackService {
 public:
  ServerUnaryReactor* Verify(CallbackServerContext* c, const v1::VerifyRequest* q,
                             v1::VerifyResponse* r) override {
    bool valid = false;
    grpc::Status s = VerifyOne(*q, &valid);
    r->set_valid(valid);
    return Done(c, std::move(s));
  }
  ServerUnaryReactor* BatchVerify(CallbackServerContext* c, const v1::BatchVerifyRequest* q,
                                  v1::BatchVerifyResponse* r) override {
    if (q->items_size() == 0 || q->items_size() > 1024) return Done(c, Invalid("items: 1..1024"));
    for (const auto& item : q->items()) {
      bool valid = false;
      grpc::Status s = VerifyOne(item, &valid);
      auto* result = r->add_results();
      result->set_valid(valid);
      if (!s.ok()) {
        result->mutable_status()->set_code(s.error_code());
        result->mutable_status()->set_message(s.error_message());
      }
    }
    return Done(c);
  }
};

grpc::Status OpenOne(Keys* keys, const v1::AeadOpenRequest& q, v1::AeadOpenResponse* r) {
  std::shared_ptr<const std::string> key = keys->Find(q.key_id());
  if (key == nullptr) return {grpc::StatusCode::NOT_FOUND, "key_id: no such key"};
  const std::string& env = q.envelope();
  if (env.size() < kHeader + kNonce + kTag) return Invalid("envelope: too short");
  if (env[0] != 1) return Invalid("envelope: unknown format version");
  if (env[1] != 0 || env[2] != 0 || env[3] != 0 || env[4] != 1) {
    return {grpc::StatusCode::NOT_FOUND, "envelope: no such key version"};
  }
  const auto* nonce = reinterpret_cast<const unsigned char*>(env.data() + kHeader);
  const auto* ct = nonce + kNonce;
  const int ct_len = static_cast<int>(env.size() - kHeader - kNonce - kTag);
  std::string* out = r->mutable_plaintext();
  out->resize(ct_len);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  bool ok = ctx != nullptr &&
            EVP_DecryptInit_ex(ctx, EVP_chacha20_poly1305(), nullptr,
                               reinterpret_cast<const unsigned char*>(key->data()), nonce) == 1 &&
            EVP_DecryptUpdate(ctx, nullptr, &len,
                              reinterpret_cast<const unsigned char*>(q.associated_data().data()),
                              static_cast<int>(q.associated_data().size())) == 1 &&
            EVP_DecryptUpdate(ctx, reinterpret_cast<unsigned char*>(out->data()), &len, ct,
                              ct_len) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, kTag,
                                const_cast<unsigned char*>(ct + ct_len)) == 1 &&
            EVP_DecryptFinal_ex(ctx, reinterpret_cast<unsigned char*>(out->data()) + len, &len) ==
                1;
  EVP_CIPHER_CTX_free(ctx);
  if (!ok) {
    r->Clear();
    return Invalid("envelope: authentication failed");
  }
  r->set_key_version(1);
  return grpc::Status::OK;
}

class AeadService final : public v1::AeadService::CallbackService {
 public:
  explicit AeadService(Keys* keys) : keys_(keys) {}
  ServerUnaryReactor* Open(CallbackServerContext* c, const v1::AeadOpenRequest* q,
                           v1::AeadOpenResponse* r) override {
    return Done(c, OpenOne(keys_, *q, r));
  }
  ServerUnaryReactor* BatchOpen(CallbackServerContext* c, const v1::BatchAeadOpenRequest* q,
                                v1::BatchAeadOpenResponse* r) override {
    if (q->items_size() == 0 || q->items_size() > 1024) return Done(c, Invalid("items: 1..1024"));
    for (const auto& item : q->items()) {
      auto* result = r->add_results();
      grpc::Status s = OpenOne(keys_, item, result->mutable_response());
      if (!s.ok()) {
        result->clear_response();
        result->mutable_status()->set_code(s.error_code());
        result->mutable_status()->set_message(s.error_message());
      }
    }
    return Done(c);
  }

 private:
  Keys* const keys_;
};

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_malloc_settings)) {
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
  }
  if (sodium_init() < 0) return 1;
  const std::string address = absl::GetFlag(FLAGS_address);
  if (!absl::StartsWith(address, "127.") && !absl::StartsWith(address, "[::1]") &&
      !absl::StartsWith(address, "localhost:")) {
    std::fprintf(stderr, "--address must be a loopback address\n");
    return 2;
  }
  Keys keys;
  KeyService key_service(&keys);
  Ed25519Service ed25519_service;
  AeadService aead_service(&keys);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(16 << 20);
  builder.RegisterService(&key_service);
  builder.RegisterService(&ed25519_service);
  builder.RegisterService(&aead_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "could not listen on %s\n", address.c_str());
    return 1;
  }
  std::printf("{\"grpc_port\":%d}\n", port);
  std::fflush(stdout);
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
