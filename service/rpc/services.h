// The gRPC face of the service: one callback service per API concern (keys, Ed25519, X25519, box,
// AEAD), all thin. A handler never computes on the gRPC thread: it hands the call to the worker
// pool, whose task runs the operation and finishes the call with the mapped status. Every call
// is counted (code, latency, batch size, item results); a `log_sample_rate` fraction of calls is
// logged (method, code, latency, items: never payloads). With `metrics` null nothing is counted
// or logged (the baseline of the metrics-cost benchmark).
//
//   rpc::Services services(&operations, &key_manager, &pool, &metrics, /*log_sample_rate=*/0);
//   services.RegisterAll(builder);   // before builder.BuildAndStart()
//
// Thread-safety: handlers run concurrently; the objects given must outlive the gRPC server.
#ifndef SERVICE_RPC_SERVICES_H_
#define SERVICE_RPC_SERVICES_H_

#include <memory>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "service/keys/key_manager.h"
#include "service/metrics/metrics.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload::rpc {

// Same numeric codes on both sides; the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

class Services final {
 public:
  Services(ops::Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
           metrics::Metrics* metrics, double log_sample_rate);
  ~Services();

  // Registers every service with `builder`. REQUIRES: called once, before BuildAndStart.
  void RegisterAll(grpc::ServerBuilder& builder);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace offload::rpc

#endif  // SERVICE_RPC_SERVICES_H_
