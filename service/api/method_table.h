// Every unary RPC of offload.v1 as data: its path, request and response prototypes, its traits
// (policy operation, admin, audited, cacheable) and a function that runs it over the operations
// and the key manager, built from api::ForEachMethod (methods.h: the one list of the API's
// methods). Transport-independent: service/call runs its entries for every protocol and port.
//
//   MethodTable table(&operations, &key_manager);
//   const Method* m = table.Find("/offload.v1.Ed25519Service/Verify");
//   std::unique_ptr<google::protobuf::Message> request(m->request_prototype->New());
//   ... parse request, create response from m->response_prototype ...
//   if (m->batch) m->call(*request, response.get(), std::move(done), nullptr);  // any thread
//   else pool.Submit([&] { m->call(*request, response.get(), std::move(done), nullptr); });
//
// Single-item calls run on the calling thread (it must be a worker) and call `done` before they
// return; batch calls spread their items over the worker pool and call `done` from a worker.
// Methods whose memo hits need no crypto (Verify, BatchVerify, Derive, BatchDerive, AEAD Open)
// also have `from_memo` / `fresh`, the two halves of `call`: the first may run on a transport
// thread.
// Whether a method may be sent by HTTP GET comes from the proto (idempotency_level).
// Thread-safety: immutable after construction; `call` may run concurrently.
#ifndef SERVICE_API_METHOD_TABLE_H_
#define SERVICE_API_METHOD_TABLE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "service/auth/policy.h"
#include "service/keys/key_manager.h"
#include "service/ops/operations.h"

namespace offload::api {

struct Method {
  std::string service;  // "offload.v1.Ed25519Service"
  std::string method;   // "Verify"
  std::string path;     // "/offload.v1.Ed25519Service/Verify"
  bool batch = false;   // a batch twin: `items` in, `results` out
  // The proto's `option idempotency_level = NO_SIDE_EFFECTS`: Connect may send it by GET.
  bool no_side_effects = false;
  // Its operation in the grants policy ("aead.open"; empty for health), for admins only, and
  // whether it names keys (api::Traits).
  std::string operation;
  bool admin = false;
  bool uses_key = false;
  // A key lifecycle call (create, import, rotate, delete, ...: KeyService's admin calls):
  // audited, one line each.
  bool key_lifecycle = false;
  // A data-plane call that names keys (Sign, Derive, Box, AEAD): audited per call under
  // --audit_data_plane.
  bool data_plane = false;
  // The answer depends on the request only (Verify): a Connect GET answer may be cached for good.
  bool immutable = false;
  // Open to every caller, also while draining (grpc.health.v1): no identity, grants or admission.
  bool open = false;
  const google::protobuf::Message* request_prototype = nullptr;
  const google::protobuf::Message* response_prototype = nullptr;
  // The request type, or the response type, holds a secret (api/secret_fields.h: a plaintext, a
  // shared key, a key to import): a call zeroes those fields, and the transport its copies of
  // that message, before they are freed.
  bool secret_request = false;
  bool secret_response = false;
  // Runs the call: `request` and `response` are of the prototypes' types and stay alive until
  // `done` has been called. `alive` (may be null) lets a batch skip items once the caller has
  // gone or its deadline has passed.
  std::function<void(const google::protobuf::Message& request,
                     google::protobuf::Message* response, ops::Operations::Done done,
                     ops::Operations::Alive alive)>
      call;
  // Optional, as a pair. `from_memo` checks the request and answers from the memo without a
  // crypto primitive (any thread, ~0.5 us plus a copy): true when the call is complete
  // (`*status`, and `*response` when OK). Otherwise `*probe` holds what the lookup found and
  // `fresh` finishes the call as `call` would (a single call on a worker, calling `done` before
  // it returns; a batch spreading its other items over the pool). `call` is exactly the two.
  using Probe = std::shared_ptr<void>;
  std::function<bool(const google::protobuf::Message& request,
                     google::protobuf::Message* response, Probe* probe, absl::Status* status)>
      from_memo;
  std::function<void(const google::protobuf::Message& request,
                     google::protobuf::Message* response, Probe probe,
                     ops::Operations::Done done, ops::Operations::Alive alive)>
      fresh;
  // AEAD Open only (null elsewhere): `from_memo` without a copy of the plaintext, for answers the
  // gateway writes as they are (binary proto): a hit fills `*result`, whose plaintext is the
  // memo's buffer (see ops::Operations::OpenResult); a miss fills `*probe` for `fresh_shared`.
  // The request comes as its fields (ops::Operations::OpenRequestView: read where they lie in
  // the body, or a message's).
  std::function<bool(const ops::Operations::OpenRequestView& request,
                     ops::Operations::OpenResult* result, Probe* probe, absl::Status* status)>
      from_memo_shared;
  // AEAD Open only: `fresh` after a miss of `from_memo_shared`, without a copy of the plaintext:
  // `*result` holds the buffer the cipher wrote, which the memo then shares, and `*owner`, the
  // buffer the envelope lies in, moves into the memo entry (Operations::AeadOpenFreshShared).
  // On a worker, or on a loop for a call ops::InlineRule lets run there.
  std::function<absl::Status(const ops::Operations::OpenRequestView& request, std::string* owner,
                             const Probe& probe, ops::Operations::OpenResult* result)>
      fresh_shared;
};

class MethodTable final {
 public:
  // `operations` and `keys` must outlive the table (both may be null for a table whose calls
  // are never run: its data only).
  MethodTable(const ops::Operations* operations, keys::KeyManager* keys);

  // The method at `path`, or nullptr.
  const Method* Find(absl::string_view path) const;
  const std::vector<Method>& methods() const { return methods_; }

 private:
  std::vector<Method> methods_;
  absl::flat_hash_map<std::string, const Method*> by_path_;
};

// The grants policy's operation of every RPC, by path ("/offload.v1.AeadService/Open" ->
// {"aead.open", ...}): what auth::Authorizer (and auth::Policy) check calls against.
auth::OperationMap PolicyOperations();

}  // namespace offload::api

#endif  // SERVICE_API_METHOD_TABLE_H_
