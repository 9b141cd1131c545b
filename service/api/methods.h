// Every RPC of offload.v1, once: its service, name, request and response types, whether it is a
// batch, the operation that runs it, and its traits (its operation in the grants policy, whether
// it is for admins, whether it names keys, whether its answer depends on its request only). The
// runtime method table (method_table.h: gRPC, gRPC-Web and Connect on both ports) and the grants
// policy's operations (PolicyOperations, for auth::Authorizer) are built from this list, so adding
// an RPC is one line here plus its proto (the table checks its entries against the proto's
// descriptors). This folder is the only place that lists methods (ctest layout.rules).
//
//   struct Visitor {
//     template <typename Request, typename Response>
//     void Unary(absl::string_view service, absl::string_view name, Traits traits,
//                absl::Status (Operations::*op)(const Request&, Response*) const);
//     ... Batch, MemoFirst, BatchMemoFirst, AeadOpen, Keys: see ForEachMethod ...
//   };
//   Visitor v;
//   api::ForEachMethod(v);
//
// The kinds, by how a transport runs them:
//   Unary           one item on a worker;
//   Batch           items spread over the worker pool (`op` calls `done` from a worker);
//   MemoFirst       `from_memo` (no crypto primitive, any thread) answers a hit or an error;
//                   a miss runs `fresh` on a worker with the lookup's probe;
//   BatchMemoFirst  leading memo hits on the calling thread, the rest as Batch;
//   AeadOpen        MemoFirst, and a transport may answer with the memo's plaintext buffer
//                   (Operations::AeadOpenFromMemoShared / AeadOpenFreshShared);
//   Keys            a key manager call on a worker; the admin ones (lifecycle: create, import,
//                   rotate, delete, disable, enable, ...) are audited per call.
// A data-plane RPC that names keys (Sign, Derive, Box, AEAD: not Verify, not KeyService) is
// audited per call under --audit_data_plane (auth::Authorizer::AuditDataPlane).
#ifndef SERVICE_API_METHODS_H_
#define SERVICE_API_METHODS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"
#include "service/keys/key_manager.h"
#include "service/ops/operations.h"

namespace offload::api {

using ops::Operations;

inline constexpr absl::string_view kKeyService = "offload.v1.KeyService";
inline constexpr absl::string_view kEd25519Service = "offload.v1.Ed25519Service";
inline constexpr absl::string_view kX25519Service = "offload.v1.X25519Service";
inline constexpr absl::string_view kBoxService = "offload.v1.BoxService";
inline constexpr absl::string_view kAeadService = "offload.v1.AeadService";
// Every service of offload.v1, in the proto's order.
inline constexpr absl::string_view kServices[] = {kKeyService, kEd25519Service, kX25519Service,
                                                  kBoxService, kAeadService};

// What the grants policy, the audit and caches need to know of an RPC.
struct Traits {
  // Its operation in the grants policy (service/auth/policy.h): "aead.open" for Open and
  // BatchOpen alike.
  absl::string_view operation;
  // For admins only (key lifecycle: create, import, rotate, delete, disable, enable, ...); such
  // calls are audited, one line each.
  bool admin = false;
  // Names keys (false for keys.list, and for Verify of caller-supplied public keys).
  bool uses_key = true;
  // The answer depends on the request only (Verify): a Connect GET of it may be cached for good.
  bool immutable = false;
};
inline constexpr bool kAdmin = true;

// A key manager call: fills `response` or returns the error.
template <typename Request, typename Response>
using KeyFn = absl::Status (*)(keys::KeyManager* keys, const Request& request, Response* response);

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
      "CreateKey", {"keys.create", kAdmin},
      [](keys::KeyManager* k, const v1::CreateKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->CreateKey(q), r);
      });
  v.template Keys<v1::ImportKeyRequest, v1::KeyInfo>(
      "ImportKey", {"keys.import", kAdmin},
      [](keys::KeyManager* k, const v1::ImportKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->ImportKey(q), r);
      });
  v.template Keys<v1::GetKeyRequest, v1::KeyInfo>(
      "GetKey", {"keys.get"},
      [](keys::KeyManager* k, const v1::GetKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->GetKey(q.key_id()), r);
      });
  v.template Keys<v1::ListKeysRequest, v1::ListKeysResponse>(
      "ListKeys", {"keys.list", false, /*uses_key=*/false},
      [](keys::KeyManager* k, const v1::ListKeysRequest&, v1::ListKeysResponse* r) {
        for (v1::KeyInfo& info : k->ListKeys()) *r->add_keys() = std::move(info);
        return absl::OkStatus();
      });
  v.template Keys<v1::RotateKeyRequest, v1::KeyInfo>(
      "RotateKey", {"keys.rotate", kAdmin},
      [](keys::KeyManager* k, const v1::RotateKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->RotateKey(q.key_id()), r);
      });
  v.template Keys<v1::DeleteKeyRequest, v1::DeleteKeyResponse>(
      "DeleteKey", {"keys.delete", kAdmin},
      [](keys::KeyManager* k, const v1::DeleteKeyRequest& q, v1::DeleteKeyResponse* r) {
        absl::StatusOr<v1::DeleteKeyResponse> done = k->DeleteKey(q);
        if (!done.ok()) return done.status();
        *r = *std::move(done);
        return absl::OkStatus();
      });
  v.template Keys<v1::CancelKeyDeletionRequest, v1::KeyInfo>(
      "CancelKeyDeletion", {"keys.restore", kAdmin},
      [](keys::KeyManager* k, const v1::CancelKeyDeletionRequest& q, v1::KeyInfo* r) {
        return Store(k->CancelKeyDeletion(q.key_id()), r);
      });
  v.template Keys<v1::DisableKeyRequest, v1::KeyInfo>(
      "DisableKey", {"keys.disable", kAdmin},
      [](keys::KeyManager* k, const v1::DisableKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->DisableKey(q.key_id()), r);
      });
  v.template Keys<v1::EnableKeyRequest, v1::KeyInfo>(
      "EnableKey", {"keys.enable", kAdmin},
      [](keys::KeyManager* k, const v1::EnableKeyRequest& q, v1::KeyInfo* r) {
        return Store(k->EnableKey(q.key_id()), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "DisableKeyVersion", {"keys.disable", kAdmin},
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->DisableKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "EnableKeyVersion", {"keys.enable", kAdmin},
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->EnableKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "DestroyKeyVersion", {"keys.delete", kAdmin},
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->DestroyKeyVersion(q), r);
      });
  v.template Keys<v1::KeyVersionRequest, v1::KeyInfo>(
      "RestoreKeyVersion", {"keys.restore", kAdmin},
      [](keys::KeyManager* k, const v1::KeyVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->RestoreKeyVersion(q), r);
      });
  v.template Keys<v1::SetMinDecryptionVersionRequest, v1::KeyInfo>(
      "SetMinDecryptionVersion", {"keys.configure", kAdmin},
      [](keys::KeyManager* k, const v1::SetMinDecryptionVersionRequest& q, v1::KeyInfo* r) {
        return Store(k->SetMinDecryptionVersion(q), r);
      });

  const Traits sign{"ed25519.sign"};
  const Traits verify{"ed25519.verify", false, /*uses_key=*/false, /*immutable=*/true};
  v.Unary(kEd25519Service, "Sign", sign, &O::Sign);
  v.Batch(kEd25519Service, "BatchSign", sign, &O::BatchSign);
  v.MemoFirst(kEd25519Service, "Verify", verify, &O::VerifyFromMemo, &O::VerifyFresh);
  v.BatchMemoFirst(kEd25519Service, "BatchVerify", verify, &O::BatchVerifyFromMemo,
                   &O::BatchVerifyFresh);

  const Traits derive{"x25519.derive"};
  v.MemoFirst(kX25519Service, "Derive", derive, &O::DeriveFromMemo, &O::DeriveFresh);
  v.BatchMemoFirst(kX25519Service, "BatchDerive", derive, &O::BatchDeriveFromMemo,
                   &O::BatchDeriveFresh);

  const Traits box_seal{"box.seal"}, box_open{"box.open"};
  v.Unary(kBoxService, "Seal", box_seal, &O::BoxSeal);
  v.Batch(kBoxService, "BatchSeal", box_seal, &O::BatchBoxSeal);
  v.Unary(kBoxService, "Open", box_open, &O::BoxOpen);
  v.Batch(kBoxService, "BatchOpen", box_open, &O::BatchBoxOpen);

  const Traits aead_seal{"aead.seal"}, aead_open{"aead.open"}, aead_rewrap{"aead.rewrap"};
  v.Unary(kAeadService, "Seal", aead_seal, &O::AeadSeal);
  v.Batch(kAeadService, "BatchSeal", aead_seal, &O::BatchAeadSeal);
  v.AeadOpen(kAeadService, "Open", aead_open);
  v.Batch(kAeadService, "BatchOpen", aead_open, &O::BatchAeadOpen);
  v.Unary(kAeadService, "Rewrap", aead_rewrap, &O::AeadRewrap);
  v.Batch(kAeadService, "BatchRewrap", aead_rewrap, &O::BatchAeadRewrap);
}

}  // namespace offload::api

#endif  // SERVICE_API_METHODS_H_
