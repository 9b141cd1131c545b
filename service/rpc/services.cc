#include "service/rpc/services.h"

#include <chrono>
#include <string>
#include <utility>

#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/box.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"

namespace offload::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;
using ops::Operations;

// Runs calls on the worker pool and finishes them. Shared by every service.
class Dispatcher {
 public:
  Dispatcher(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool)
      : operations_(operations), keys_(keys), pool_(pool) {}

  // Runs `fn` (returning absl::Status) on the pool, then finishes the call with its status.
  // A call cancelled or past its deadline while it waited is finished without running.
  template <typename Fn>
  ServerUnaryReactor* Run(CallbackServerContext* context, Fn fn) {
    ServerUnaryReactor* reactor = context->DefaultReactor();
    pool_->Submit([context, reactor, fn = std::move(fn)]() mutable {
      if (grpc::Status early = Expired(context); !early.ok()) return reactor->Finish(early);
      reactor->Finish(ToGrpcStatus(fn()));
    });
    return reactor;
  }

  template <typename Request, typename Response>
  ServerUnaryReactor* Unary(CallbackServerContext* context, const Request* request,
                            Response* response,
                            absl::Status (Operations::*op)(const Request&, Response*) const) {
    Operations* operations = operations_;
    return Run(context, [=] { return (operations->*op)(*request, response); });
  }

  // The batch's items run on the pool; the last one to finish finishes the call.
  template <typename Request, typename Response>
  ServerUnaryReactor* Batch(CallbackServerContext* context, const Request* request,
                            Response* response,
                            void (Operations::*op)(const Request&, Response*, Operations::Done)
                                const) {
    ServerUnaryReactor* reactor = context->DefaultReactor();
    (operations_->*op)(*request, response, [reactor, response](absl::Status status) {
      if (!status.ok()) response->Clear();
      reactor->Finish(ToGrpcStatus(status));
    });
    return reactor;
  }

  keys::KeyManager* keys() const { return keys_; }

 private:
  static grpc::Status Expired(CallbackServerContext* context) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled");
    if (context->deadline() < std::chrono::system_clock::now()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed while queued");
    }
    return grpc::Status::OK;
  }

  Operations* const operations_;
  keys::KeyManager* const keys_;
  ops::WorkerPool* const pool_;
};

// Copies a StatusOr<KeyInfo> into `response`.
absl::Status Store(absl::StatusOr<v1::KeyInfo> info, v1::KeyInfo* response) {
  if (!info.ok()) return info.status();
  *response = *std::move(info);
  return absl::OkStatus();
}

class KeyService final : public v1::KeyService::CallbackService {
 public:
  explicit KeyService(Dispatcher* d) : d_(d) {}

  ServerUnaryReactor* CreateKey(CallbackServerContext* c, const v1::CreateKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] { return Store(k->CreateKey(*q), r); });
  }
  ServerUnaryReactor* ImportKey(CallbackServerContext* c, const v1::ImportKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] { return Store(k->ImportKey(*q), r); });
  }
  ServerUnaryReactor* GetKey(CallbackServerContext* c, const v1::GetKeyRequest* q,
                             v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] { return Store(k->GetKey(q->key_id()), r); });
  }
  ServerUnaryReactor* ListKeys(CallbackServerContext* c, const v1::ListKeysRequest* q,
                               v1::ListKeysResponse* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] {
      for (v1::KeyInfo& info : k->ListKeys()) *r->add_keys() = std::move(info);
      return absl::OkStatus();
    });
  }
  ServerUnaryReactor* RotateKey(CallbackServerContext* c, const v1::RotateKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] { return Store(k->RotateKey(q->key_id()), r); });
  }
  ServerUnaryReactor* DeleteKey(CallbackServerContext* c, const v1::DeleteKeyRequest* q,
                                v1::DeleteKeyResponse* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, [=] { return k->DeleteKey(q->key_id()); });
  }

 private:
  Dispatcher* const d_;
};

class Ed25519Service final : public v1::Ed25519Service::CallbackService {
 public:
  explicit Ed25519Service(Dispatcher* d) : d_(d) {}
  ServerUnaryReactor* Sign(CallbackServerContext* c, const v1::SignRequest* q,
                           v1::SignResponse* r) override {
    return d_->Unary(c, q, r, &Operations::Sign);
  }
  ServerUnaryReactor* BatchSign(CallbackServerContext* c, const v1::BatchSignRequest* q,
                                v1::BatchSignResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchSign);
  }
  ServerUnaryReactor* Verify(CallbackServerContext* c, const v1::VerifyRequest* q,
                             v1::VerifyResponse* r) override {
    return d_->Unary(c, q, r, &Operations::Verify);
  }
  ServerUnaryReactor* BatchVerify(CallbackServerContext* c, const v1::BatchVerifyRequest* q,
                                  v1::BatchVerifyResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchVerify);
  }

 private:
  Dispatcher* const d_;
};

class X25519Service final : public v1::X25519Service::CallbackService {
 public:
  explicit X25519Service(Dispatcher* d) : d_(d) {}
  ServerUnaryReactor* Derive(CallbackServerContext* c, const v1::DeriveRequest* q,
                             v1::DeriveResponse* r) override {
    return d_->Unary(c, q, r, &Operations::Derive);
  }
  ServerUnaryReactor* BatchDerive(CallbackServerContext* c, const v1::BatchDeriveRequest* q,
                                  v1::BatchDeriveResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchDerive);
  }

 private:
  Dispatcher* const d_;
};

class BoxService final : public v1::BoxService::CallbackService {
 public:
  explicit BoxService(Dispatcher* d) : d_(d) {}
  ServerUnaryReactor* Seal(CallbackServerContext* c, const v1::BoxSealRequest* q,
                           v1::BoxSealResponse* r) override {
    return d_->Unary(c, q, r, &Operations::BoxSeal);
  }
  ServerUnaryReactor* BatchSeal(CallbackServerContext* c, const v1::BatchBoxSealRequest* q,
                                v1::BatchBoxSealResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchBoxSeal);
  }
  ServerUnaryReactor* Open(CallbackServerContext* c, const v1::BoxOpenRequest* q,
                           v1::BoxOpenResponse* r) override {
    return d_->Unary(c, q, r, &Operations::BoxOpen);
  }
  ServerUnaryReactor* BatchOpen(CallbackServerContext* c, const v1::BatchBoxOpenRequest* q,
                                v1::BatchBoxOpenResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchBoxOpen);
  }

 private:
  Dispatcher* const d_;
};

class AeadService final : public v1::AeadService::CallbackService {
 public:
  explicit AeadService(Dispatcher* d) : d_(d) {}
  ServerUnaryReactor* Seal(CallbackServerContext* c, const v1::AeadSealRequest* q,
                           v1::AeadSealResponse* r) override {
    return d_->Unary(c, q, r, &Operations::AeadSeal);
  }
  ServerUnaryReactor* BatchSeal(CallbackServerContext* c, const v1::BatchAeadSealRequest* q,
                                v1::BatchAeadSealResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchAeadSeal);
  }
  ServerUnaryReactor* Open(CallbackServerContext* c, const v1::AeadOpenRequest* q,
                           v1::AeadOpenResponse* r) override {
    return d_->Unary(c, q, r, &Operations::AeadOpen);
  }
  ServerUnaryReactor* BatchOpen(CallbackServerContext* c, const v1::BatchAeadOpenRequest* q,
                                v1::BatchAeadOpenResponse* r) override {
    return d_->Batch(c, q, r, &Operations::BatchAeadOpen);
  }

 private:
  Dispatcher* const d_;
};

}  // namespace

struct Services::Impl {
  Impl(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool)
      : dispatcher(operations, keys, pool),
        key_service(&dispatcher),
        ed25519_service(&dispatcher),
        x25519_service(&dispatcher),
        box_service(&dispatcher),
        aead_service(&dispatcher) {}

  Dispatcher dispatcher;
  KeyService key_service;
  Ed25519Service ed25519_service;
  X25519Service x25519_service;
  BoxService box_service;
  AeadService aead_service;
};

Services::Services(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool)
    : impl_(std::make_unique<Impl>(operations, keys, pool)) {}

Services::~Services() = default;

void Services::RegisterAll(grpc::ServerBuilder& builder) {
  builder.RegisterService(&impl_->key_service);
  builder.RegisterService(&impl_->ed25519_service);
  builder.RegisterService(&impl_->x25519_service);
  builder.RegisterService(&impl_->box_service);
  builder.RegisterService(&impl_->aead_service);
}

}  // namespace offload::rpc
