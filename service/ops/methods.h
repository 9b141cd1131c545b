// Every RPC of offload.v1, once: its service, name, request and response types, whether it is a
// batch, and the operation that runs it. The gateway's method table (service/http: gRPC, gRPC-Web
// and Connect on both ports) is built from this list, so adding an RPC is one line here plus its
// proto (the table checks its entries against the proto's descriptors).
//
//   struct Visitor {
//     template <typename Request, typename Response>
//     void Unary(absl::string_view service, absl::string_view name,
//                absl::Status (Operations::*op)(const Request&, Response*) const);
//     ... Batch, MemoFirst, BatchMemoFirst, AeadOpen, Keys: see ForEachMethod ...
//   };
//   Visitor v;
//   ops::ForEachMethod(v);
//
// The kinds, by how a transport runs them:
//   Unary           one item on a worker;
//   Batch           items spread over the worker pool (`op` calls `done` from a worker);
//   MemoFirst       `from_memo` (no crypto primitive, any thread) answers a hit or an error;
//                   a miss runs `fresh` on a worker with the lookup's probe;
//   BatchMemoFirst  leading memo hits on the calling thread, the rest as Batch;
//   AeadOpen        MemoFirst, and a transport may answer with the memo's plaintext buffer
//                   (Operations::AeadOpenFromMemoShared / AeadOpenFreshShared);
//   Keys            a key manager call on a worker; `audited` ones (lifecycle: create, import,
//                   rotate, delete, disable, enable, ...) are audited by the transport.
#ifndef SERVICE_OPS_METHODS_H_
#define SERVICE_OPS_METHODS_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"
#include "service/keys/key_manager.h"
#include "service/ops/operations.h"

namespace offload::ops {

inline constexpr absl::string_view kKeyService = "offload.v1.KeyService";
inline constexpr absl::string_view kEd25519Service = "offload.v1.Ed25519Service";
inline constexpr absl::string_view kX25519Service = "offload.v1.X25519Service";
inline constexpr absl::string_view kBoxService = "offload.v1.BoxService";
inline constexpr absl::string_view kAeadService = "offload.v1.AeadService";
// Every service of offload.v1, in the proto's order.
inline constexpr absl::string_view kServices[] = {kKeyService, kEd25519Service, kX25519Service,
                                                  kBoxService, kAeadService};

// The RPCs that use a key's secret, audited per call under --audit_data_plane (one line each:
// identity, key id, the version used, outcome; auth::Authorizer::AuditDataPlane). A new RPC
// that uses a key opts in with one line here. (Verify uses no key; KeyService is audited as
// key lifecycle.)
struct DataPlaneMethod {
  absl::string_view service;
  absl::string_view name;
};
inline constexpr DataPlaneMethod kDataPlaneAudited[] = {
    {kEd25519Service, "Sign"},  {kEd25519Service, "BatchSign"},
    {kX25519Service, "Derive"}, {kX25519Service, "BatchDerive"},
    {kBoxService, "Seal"},      {kBoxService, "BatchSeal"},
    {kBoxService, "Open"},      {kBoxService, "BatchOpen"},
    {kAeadService, "Seal"},     {kAeadService, "BatchSeal"},
    {kAeadService, "Open"},     {kAeadService, "BatchOpen"},
    {kAeadService, "Rewrap"},   {kAeadService, "BatchRewrap"},
};

// A key manager call: fills `response` or returns the error.
template <typename Request, typename Response>
using KeyFn = absl::Status (*)(keys::KeyManager* keys, const Request& request, Response* response);

// Whether the proto has `service`.`name` with these request and response types (each transport
// checks its entries at start-up: a mismatch is a programming error).
inline bool InProto(absl::string_view service, absl::string_view name,
                    const google::protobuf::Descriptor* request,
                    const google::protobuf::Descriptor* response) {
  const google::protobuf::MethodDescriptor* d =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          absl::StrCat(service, ".", name));
  return d != nullptr && d->input_type() == request && d->output_type() == response;
}

namespace methods_internal {
inline absl::Status Store(absl::StatusOr<v1::KeyInfo> info, v1::KeyInfo* response) {
  if (!info.ok()) return info.status();
  *response = *std::move(info);
  return absl::OkStatus();
}
}  // namespace methods_internal

// Calls `v` once per RPC, services in the proto's order, methods in each service's order.
template <typename Visitor>
void ForEachMethod(Visitor& v) {
  using O = Operations;
  using methods_internal::Store;
  v.template Keys<v1::CreateKeyRequest, v1::KeyInfo>(
      "CreateKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::CreateKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->CreateKey(q), r);
      });
  v.template Keys<v1::ImportKeyRequest, v1::KeyInfo>(
      "ImportKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::ImportKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->ImportKey(q), r);
      });
  v.template Keys<v1::GetKeyRequest, v1::KeyInfo>(
      "GetKey", /*audited=*/false,
      [](keys::KeyManager* k, const v1::GetKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->GetKey(q.key_id()), r);
      });
  v.template Keys<v1::ListKeysRequest, v1::ListKeysResponse>(
      "ListKeys", /*audited=*/false,
      [](keys::KeyManager* k, const v1::ListKeysRequest&, v1::ListKeysResponse* r) {
        for (v1::KeyInfo& info : k->ListKeys()) *r->add_keys() = std::move(info);
        return absl::OkStatus();
      });
  v.template Keys<v1::RotateKeyRequest, v1::KeyInfo>(
      "RotateKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::RotateKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->RotateKey(q.key_id()), r);
      });
  v.template Keys<v1::DeleteKeyRequest, v1::DeleteKeyResponse>(
      "DeleteKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::DeleteKeyRequest& q, v1::DeleteKeyResponse* r) {
        absl::StatusOr<v1::DeleteKeyResponse> done = k->DeleteKey(q);
        if (!done.ok()) return done.status();
        *r = *std::move(done);
        return absl::OkStatus();
      });
  v.template Keys<v1::CancelKeyDeletionRequest, v1::KeyInfo>(
      "CancelKeyDeletion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::CancelKeyDeletionRequest& q, v1::KeyInfo* r) {
        return Store(k->CancelKeyDeletion(q.key_id()), r);
      });
  v.template Keys<v1::DisableKeyRequest, v1::KeyInfo>(
      "DisableKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::DisableKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->DisableKey(q.key_id()), r);
      });
  v.template Keys<v1::EnableKeyRequest, v1::KeyInfo>(
      "EnableKey", /*audited=*/true,
      [](keys::KeyManager* k, const v1::EnableKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->EnableKey(q.key_id()), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "DisableKeyVersion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->DisableKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "EnableKeyVersion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->EnableKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "DestroyKeyVersion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->DestroyKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "RestoreKeyVersion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->RestoreKeyVersion(q), r);
      });
  v.template Keys<v1::SetMinDecryptionVersionRequest, v1::KeyInfo>(
      "SetMinDecryptionVersion", /*audited=*/true,
      [](keys::KeyManager* k, const v1::SetMinDecryptionVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->SetMinDecryptionVersion(q), r);
      });

  v.Unary(kEd25519Service, "Sign", &O::Sign);
  v.Batch(kEd25519Service, "BatchSign", &O::BatchSign);
  v.MemoFirst(kEd25519Service, "Verify", &O::VerifyFromMemo, &O::VerifyFresh);
  v.BatchMemoFirst(kEd25519Service, "BatchVerify", &O::BatchVerifyFromMemo, &O::BatchVerifyFresh);

  v.MemoFirst(kX25519Service, "Derive", &O::DeriveFromMemo, &O::DeriveFresh);
  v.BatchMemoFirst(kX25519Service, "BatchDerive", &O::BatchDeriveFromMemo, &O::BatchDeriveFresh);

  v.Unary(kBoxService, "Seal", &O::BoxSeal);
  v.Batch(kBoxService, "BatchSeal", &O::BatchBoxSeal);
  v.Unary(kBoxService, "Open", &O::BoxOpen);
  v.Batch(kBoxService, "BatchOpen", &O::BatchBoxOpen);

  v.Unary(kAeadService, "Seal", &O::AeadSeal);
  v.Batch(kAeadService, "BatchSeal", &O::BatchAeadSeal);
  v.AeadOpen(kAeadService, "Open");
  v.Batch(kAeadService, "BatchOpen", &O::BatchAeadOpen);
  v.Unary(kAeadService, "Rewrap", &O::AeadRewrap);
  v.Batch(kAeadService, "BatchRewrap", &O::BatchAeadRewrap);
}

}  // namespace offload::ops

#endif  // SERVICE_OPS_METHODS_H_
