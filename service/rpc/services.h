// The gRPC face of the service: one callback service per API concern (keys, Ed25519, X25519, box,
// AEAD), all thin. A handler never runs a crypto primitive on the gRPC thread: it hands the call
// to the worker pool, whose task runs the operation and finishes the call with the mapped status.
// Only memo hits are answered on the gRPC thread (a digest, a lookup, a copy): those of unary
// Verify, Derive and AEAD Open, and the leading ones of a BatchVerify or BatchDerive (at most
// 64). Every call is authorized (mTLS identity and grants, when configured) and
// admitted (overload protection) before it is queued; a call whose deadline passes while queued
// is dropped, not computed. Every call is counted (code, latency, batch size, item results); a
// `log_sample_rate` fraction of calls is logged (method, code, latency, items: never payloads).
// With `metrics` null nothing is counted or logged (the baseline of the metrics-cost benchmark).
//
//   rpc::Services services(&operations, &key_manager, &pool, &metrics, /*log_sample_rate=*/0);
//   services.RegisterAll(builder);   // before builder.BuildAndStart()
//
// Thread-safety: handlers run concurrently; the objects given must outlive the gRPC server.
#ifndef SERVICE_RPC_SERVICES_H_
#define SERVICE_RPC_SERVICES_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "service/auth/authorizer.h"
#include "service/keys/key_manager.h"
#include "service/metrics/metrics.h"
#include "service/ops/admission.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload::rpc {

// Same numeric codes on both sides; the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Optional gatekeepers, checked before a call is queued (both may be null).
struct Guards {
  auth::Authorizer* authorizer = nullptr;  // identity, grants, audit
  ops::Admission* admission = nullptr;     // queue bound, per-client concurrency
};

class Services final {
 public:

  Services(ops::Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
           metrics::Metrics* metrics, double log_sample_rate, Guards guards = {});
  ~Services();

  // Registers every service with `builder`. REQUIRES: called once, before BuildAndStart.
  void RegisterAll(grpc::ServerBuilder& builder);

  // Calls handed to a handler and not yet finished (for a drain that ends as soon as it can).
  int64_t in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace offload::rpc

#endif  // SERVICE_RPC_SERVICES_H_
