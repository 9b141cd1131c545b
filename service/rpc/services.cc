#include "service/rpc/services.h"

#include <openssl/pem.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/message_allocator.h"
#include "service/auth/tls.h"
#include "service/common/log.h"

#include "service/ops/methods.h"
#include "service/rpc/message_pool.h"

namespace offload::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;
using ops::Operations;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A failure of the service rather than of the caller's input: logged at error level.
bool IsServerFault(absl::StatusCode code) {
  return code == absl::StatusCode::kInternal || code == absl::StatusCode::kDataLoss ||
         code == absl::StatusCode::kUnknown;
}

// How the items of a finished call ended (see metrics::ItemCounts).
metrics::ItemCounts CountOne(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return {1, 0, 0};
  if (code == absl::StatusCode::kInvalidArgument) return {0, 1, 0};
  return {0, 0, 1};
}
template <typename Response>
metrics::ItemCounts CountItems(const Response&, absl::StatusCode code) {
  return CountOne(code);
}
metrics::ItemCounts CountItems(const v1::VerifyResponse& r, absl::StatusCode code) {
  return (code == absl::StatusCode::kOk && !r.valid()) ? metrics::ItemCounts{0, 1, 0}
                                                       : CountOne(code);
}
template <typename BatchResponse>
metrics::ItemCounts CountBatch(const BatchResponse& r) {
  metrics::ItemCounts counts;
  for (const auto& result : r.results()) {
    bool valid = true;
    if constexpr (std::is_same_v<BatchResponse, v1::BatchVerifyResponse>) valid = result.valid();
    const auto code = static_cast<absl::StatusCode>(result.status().code());
    metrics::ItemCounts one = CountOne(code);
    if (code == absl::StatusCode::kOk && !valid) one = {0, 1, 0};
    counts.ok += one.ok;
    counts.invalid += one.invalid;
    counts.error += one.error;
  }
  return counts;
}

// The plaintext slice of an Open answer holds one reference to the buffer (the memo's or the
// fresh open's): dropped when gRPC is done writing it, the last one wipes the bytes.
void DropPlaintextRef(void* ref) { delete static_cast<memo::SharedPlaintext*>(ref); }

// The serialized AeadOpenResponse of `result` as gRPC's message, without a copy of the
// plaintext: field 1's tag and length, the plaintext buffer itself, fields 2-3 (small slices are
// inlined by gRPC: no allocation).
void ToByteBuffer(const Operations::OpenResult& result, grpc::ByteBuffer* out) {
  uint8_t prefix[Operations::OpenResult::kMaxWirePrefix];
  uint8_t suffix[Operations::OpenResult::kMaxWireSuffix];
  grpc::Slice slices[3];
  size_t n = 0;
  if (const size_t p = result.WirePrefix(prefix); p > 0) {
    slices[n++] = grpc::Slice(prefix, p);
    slices[n++] = grpc::Slice(const_cast<uint8_t*>(result.plaintext->data()),
                              result.plaintext->size(), &DropPlaintextRef,
                              new memo::SharedPlaintext(result.plaintext));
  }
  if (const size_t q = result.WireSuffix(suffix); q > 0) slices[n++] = grpc::Slice(suffix, q);
  grpc::ByteBuffer buffer(slices, n);
  out->Swap(&buffer);
}

struct MethodInfo {
  std::string path;  // "/offload.v1.AeadService/Open"
  metrics::MethodMetrics* metrics = nullptr;
};

// Client-certificate PEM -> identity. The certificate was verified during the handshake (see
// auth::TlsFiles::VerifyClient); parsing it costs ~20 us, so each connection's certificate is
// parsed once.
class IdentityCache {
 public:
  std::string Lookup(absl::string_view pem) {
    {
      absl::MutexLock lock(&mu_);
      auto it = map_.find(pem);
      if (it != map_.end()) return it->second;
    }
    std::string identity;
    if (BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))) {
      if (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
        identity = auth::IdentityOf(cert);
        X509_free(cert);
      }
      BIO_free(bio);
    }
    absl::MutexLock lock(&mu_);
    if (map_.size() >= 4096) map_.clear();  // bounded: many distinct clients just re-parse
    map_.emplace(std::string(pem), identity);
    return identity;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> map_ ABSL_GUARDED_BY(mu_);
};

// Runs calls on the worker pool, finishes them, and records their metrics. Shared by every
// service.
class Dispatcher {
 public:
  Dispatcher(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
             metrics::Metrics* metrics, double log_sample_rate, const Guards& guards)
      : operations_(operations),
        keys_(keys),
        pool_(pool),
        metrics_(metrics),
        log_sample_rate_(log_sample_rate),
        authorizer_(guards.authorizer),
        admission_(guards.admission) {}

  // A method's path and metrics handle; start-up only.
  const MethodInfo* Method(absl::string_view service, absl::string_view method, bool batch) {
    MethodInfo& info = methods_.emplace_back();
    info.path = absl::StrCat("/", service, "/", method);
    info.metrics = metrics_ == nullptr ? nullptr : metrics_->Method(service, method, batch);
    return &info;
  }

  // Who is calling: the verified client-certificate identity (mTLS) and the peer address.
  auth::Peer PeerOf(CallbackServerContext* context) {
    auth::Peer peer;
    peer.address = context->peer();
    if (authorizer_ == nullptr || !authorizer_->mtls()) return peer;
    std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    if (auth == nullptr) return peer;
    std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
    if (pem.empty()) return peer;  // no client certificate
    peer.identity = identities_.Lookup(absl::string_view(pem.front().data(), pem.front().size()));
    return peer;
  }

  // Authorization, then admission (room in the queue, the client's concurrency limit). On
  // refusal the call is finished here and false returned.
  bool Enter(CallbackServerContext* context, ServerUnaryReactor* reactor, const MethodInfo* method,
             const google::protobuf::Message& request, int items, Clock::time_point start,
             ops::Admission::Ticket* ticket) {
    if (authorizer_ == nullptr && admission_ == nullptr) return true;
    const auth::Peer peer = PeerOf(context);
    absl::Status status;
    if (authorizer_ != nullptr) status = authorizer_->Authorize(peer, method->path, request, "grpc");
    if (status.ok() && admission_ != nullptr) {
      absl::StatusOr<ops::Admission::Ticket> admitted = admission_->Admit(peer.ClientName(), items);
      if (admitted.ok()) {
        *ticket = *std::move(admitted);
      } else {
        status = admitted.status();
      }
    }
    if (status.ok()) return true;
    Finish(reactor, method, start, status, items > 1 ? metrics::ItemCounts{} : CountOne(status.code()),
           items > 1 ? items : 0);
    return false;
  }

  // Audits a finished key-management call (no-op for other methods or without an authorizer).
  void AuditKeyCall(CallbackServerContext* context, const MethodInfo* method,
                    const google::protobuf::Message& request, const absl::Status& status,
                    uint32_t version) {
    if (authorizer_ == nullptr) return;
    authorizer_->AuditKeyCall(PeerOf(context), method->path, request, status, version, "grpc");
  }

  // Runs `fn` (returning absl::Status) on the pool, then finishes the call with its status.
  // A call cancelled or past its deadline while it waited is finished without running.
  template <typename Response, typename Fn>
  ServerUnaryReactor* Run(CallbackServerContext* context, const MethodInfo* method,
                          const google::protobuf::Message& request, const Response* response,
                          Fn fn) {
    BeginCall();
    return Submit(context, method, request, response, std::move(fn));
  }

  // Calls begun and not yet finished (each ends in Finish()).
  int64_t in_flight() const { return in_flight_.load(std::memory_order_acquire); }

  // Run() without counting the call again (MemoFirst's miss).
  template <typename Response, typename Fn>
  ServerUnaryReactor* Submit(CallbackServerContext* context, const MethodInfo* method,
                             const google::protobuf::Message& request, const Response* response,
                             Fn fn) {
    ServerUnaryReactor* reactor = context->DefaultReactor();
    const Clock::time_point start = Clock::now();
    ops::Admission::Ticket ticket;
    if (!Enter(context, reactor, method, request, 1, start, &ticket)) return reactor;
    pool_->Submit([this, context, reactor, method, response, start, fn = std::move(fn),
                   ticket = std::move(ticket)]() mutable {
      absl::Status status = Expired(context);
      if (status.ok()) {
        status = fn();
      } else if (admission_ != nullptr) {
        admission_->CountDeadlineDrop();
      }
      ticket.Release();
      Finish(reactor, method, start, status, CountItems(*response, status.code()), 0);
    });
    return reactor;
  }

  // Finishes a call that needed no work on the pool (a memo hit answered on this gRPC thread),
  // skipping the two thread hand-offs a pool task costs (a worker wake-up, then the poller's).
  // REQUIRES: the call was authorized (Refuse() returned null).
  template <typename Response>
  ServerUnaryReactor* FinishInline(CallbackServerContext* context, const MethodInfo* method,
                                   const Response* response, absl::Status status) {
    ServerUnaryReactor* reactor = context->DefaultReactor();
    const Clock::time_point start = Clock::now();
    if (absl::Status expired = Expired(context); !expired.ok()) status = expired;
    Finish(reactor, method, start, status, CountItems(*response, status.code()), 0);
    return reactor;
  }

  // For calls answered without the pool (no admission: nothing is queued): null if the caller
  // may make the call, else the reactor of the call, finished with the refusal.
  ServerUnaryReactor* Refuse(CallbackServerContext* context, const MethodInfo* method,
                             const google::protobuf::Message& request) {
    if (authorizer_ == nullptr) return nullptr;
    absl::Status status = authorizer_->Authorize(PeerOf(context), method->path, request, "grpc");
    if (status.ok()) return nullptr;
    ServerUnaryReactor* reactor = context->DefaultReactor();
    Finish(reactor, method, Clock::now(), status, CountOne(status.code()), 0);
    return reactor;
  }

  // A unary call whose memo hit needs no pool (Verify, Derive, AEAD Open): `from_memo` checks the
  // request and looks it up (no crypto primitive) on this gRPC thread, and finishes the call on a
  // hit or an error; a miss goes to the pool, where `fresh` gets what the lookup found, so the
  // memo counts one lookup per call.
  template <typename Request, typename Response, typename Probe>
  ServerUnaryReactor* MemoFirst(
      CallbackServerContext* context, const MethodInfo* method, const Request* request,
      Response* response,
      bool (Operations::*from_memo)(const Request&, Response*, Probe*, absl::Status*) const,
      absl::Status (Operations::*fresh)(const Request&, const Probe&, Response*) const) {
    BeginCall();
    if (ServerUnaryReactor* refused = Refuse(context, method, *request)) return refused;
    Operations* operations = operations_;
    Probe probe;
    absl::Status status;
    if ((operations->*from_memo)(*request, response, &probe, &status)) {
      return FinishInline(context, method, response, std::move(status));
    }
    return Submit(context, method, *request, response,
               [operations, request, response, fresh, probe = std::move(probe)] {
                 return (operations->*fresh)(*request, probe, response);
               });
  }

  // AEAD Open without a copy of the plaintext (see ToByteBuffer): the request is parsed from
  // gRPC's bytes here, a memo hit is answered on this gRPC thread with the memo's buffer, a miss
  // decrypts on the pool into a buffer that the memo and the answer then share. Otherwise as
  // MemoFirst (authorization, admission, deadlines, metrics).
  ServerUnaryReactor* OpenShared(CallbackServerContext* context, const MethodInfo* method,
                                 const grpc::ByteBuffer* request_bytes,
                                 grpc::ByteBuffer* response_bytes) {
    BeginCall();
    struct OpenCall {
      v1::AeadOpenRequest request;
      Operations::OpenProbe probe;  // points into request.envelope()
      Operations::OpenResult result;
    };
    auto call = std::make_unique<OpenCall>();
    {
      // Reading does not change the buffer; the reader's API only takes it non-const.
      grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(request_bytes));
      if (!call->request.ParseFromZeroCopyStream(&reader)) {
        // As gRPC's own deserialization answers a malformed message (not logged: the caller's).
        ServerUnaryReactor* reactor = context->DefaultReactor();
        if (method->metrics != nullptr) {
          method->metrics->Record(absl::StatusCode::kInternal, 0,
                                  CountOne(absl::StatusCode::kInternal), 0);
        }
        reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, "failed to parse the request"));
        in_flight_.fetch_sub(1, std::memory_order_acq_rel);
        return reactor;
      }
    }
    if (ServerUnaryReactor* refused = Refuse(context, method, call->request)) return refused;
    Operations* operations = operations_;
    absl::Status status;
    if (operations->AeadOpenFromMemoShared(call->request, &call->result, &call->probe, &status)) {
      ServerUnaryReactor* reactor = context->DefaultReactor();
      const Clock::time_point start = Clock::now();
      if (absl::Status expired = Expired(context); !expired.ok()) status = expired;
      if (status.ok()) ToByteBuffer(call->result, response_bytes);
      Finish(reactor, method, start, status, CountOne(status.code()), 0);
      return reactor;
    }
    ServerUnaryReactor* reactor = context->DefaultReactor();
    const Clock::time_point start = Clock::now();
    ops::Admission::Ticket ticket;
    if (!Enter(context, reactor, method, call->request, 1, start, &ticket)) return reactor;
    pool_->Submit([this, operations, context, reactor, method, response_bytes, start,
                   call = std::move(call), ticket = std::move(ticket)]() mutable {
      absl::Status status = Expired(context);
      if (status.ok()) {
        status = operations->AeadOpenFreshShared(&call->request, call->probe, &call->result);
        if (status.ok()) ToByteBuffer(call->result, response_bytes);
      } else if (admission_ != nullptr) {
        admission_->CountDeadlineDrop();
      }
      ticket.Release();
      Finish(reactor, method, start, status, CountOne(status.code()), 0);
    });
    return reactor;
  }

  template <typename Request, typename Response>
  ServerUnaryReactor* Unary(CallbackServerContext* context, const MethodInfo* method,
                            const Request* request, Response* response,
                            absl::Status (Operations::*op)(const Request&, Response*) const) {
    Operations* operations = operations_;
    return Run(context, method, *request, response,
               [=] { return (operations->*op)(*request, response); });
  }

  // The batch's items run on the pool; the last one to finish finishes the call.
  template <typename Request, typename Response>
  ServerUnaryReactor* Batch(CallbackServerContext* context, const MethodInfo* method,
                            const Request* request, Response* response,
                            void (Operations::*op)(const Request&, Response*, Operations::Done,
                                                   Operations::Alive) const) {
    BeginCall();
    ServerUnaryReactor* reactor = context->DefaultReactor();
    const Clock::time_point start = Clock::now();
    ops::Admission::Ticket ticket;
    if (!EnterBatch(context, reactor, method, *request, start, &ticket)) return reactor;
    (operations_->*op)(*request, response,
                       BatchDone(reactor, method, request, response, start, std::move(ticket)),
                       [context] { return Expired(context).ok(); });
    return reactor;
  }

  // A batch whose leading memo hits are answered on this gRPC thread (BatchVerify, see
  // Operations::BatchVerifyFromMemo): when that answers every item the call finishes here,
  // without the pool; otherwise the other items run on the pool as in Batch().
  template <typename Request, typename Response, typename Probe>
  ServerUnaryReactor* BatchMemoFirst(
      CallbackServerContext* context, const MethodInfo* method, const Request* request,
      Response* response,
      bool (Operations::*from_memo)(const Request&, Response*, Probe*, absl::Status*) const,
      void (Operations::*fresh)(const Request&, const Probe&, Response*, Operations::Done,
                                Operations::Alive) const) {
    BeginCall();
    ServerUnaryReactor* reactor = context->DefaultReactor();
    const Clock::time_point start = Clock::now();
    ops::Admission::Ticket ticket;
    if (!EnterBatch(context, reactor, method, *request, start, &ticket)) return reactor;
    Operations::Done done = BatchDone(reactor, method, request, response, start, std::move(ticket));
    Probe probe;
    absl::Status status;
    if ((operations_->*from_memo)(*request, response, &probe, &status)) {
      std::move(done)(status);
    } else {
      (operations_->*fresh)(*request, probe, response, std::move(done),
                            [context] { return Expired(context).ok(); });
    }
    return reactor;
  }

  keys::KeyManager* keys() const { return keys_; }

 private:
  // A batch call's deadline check, authorization and admission (one per item); on refusal the
  // call is finished here and false returned.
  template <typename Request>
  bool EnterBatch(CallbackServerContext* context, ServerUnaryReactor* reactor,
                  const MethodInfo* method, const Request& request, Clock::time_point start,
                  ops::Admission::Ticket* ticket) {
    if (absl::Status expired = Expired(context); !expired.ok()) {
      Finish(reactor, method, start, expired, {}, request.items_size());
      return false;
    }
    return Enter(context, reactor, method, request, std::max(1, request.items_size()), start,
                 ticket);
  }

  // What finishes a batch call once its items have their results (or the call failed as a whole).
  template <typename Request, typename Response>
  Operations::Done BatchDone(ServerUnaryReactor* reactor, const MethodInfo* method,
                             const Request* request, Response* response, Clock::time_point start,
                             ops::Admission::Ticket ticket) {
    return [this, reactor, method, request, response, start,
            ticket = std::move(ticket)](absl::Status status) mutable {
      ticket.Release();
      if (status.code() == absl::StatusCode::kDeadlineExceeded && admission_ != nullptr) {
        admission_->CountDeadlineDrop();
      }
      const metrics::ItemCounts counts =
          status.ok() ? CountBatch(*response) : metrics::ItemCounts{};
      if (!status.ok()) {
        WipeSecrets(response);  // items answered before the call failed (see message_pool.h)
        response->Clear();
      }
      Finish(reactor, method, start, status, counts, request->items_size());
    };
  }

  static absl::Status Expired(CallbackServerContext* context) {
    if (context->IsCancelled()) return absl::CancelledError("call cancelled");
    if (context->deadline() < std::chrono::system_clock::now()) {
      return absl::DeadlineExceededError("deadline passed while queued");
    }
    return absl::OkStatus();
  }

  void Finish(ServerUnaryReactor* reactor, const MethodInfo* info, Clock::time_point start,
              const absl::Status& status, const metrics::ItemCounts& counts, int batch_size) {
    const double seconds = SecondsSince(start);
    metrics::MethodMetrics* method = info->metrics;
    if (method != nullptr) method->Record(status.code(), seconds, counts, batch_size);
    if (IsServerFault(status.code())) {
      // Messages name fields and sizes, never payloads or key material.
      Log(LogLevel::kError, "request_failed",
          {{"method", method != nullptr ? method->name() : std::string("unknown")},
           {"code", absl::StatusCodeToString(status.code())},
           {"message", std::string(status.message())}});
    }
    if (method != nullptr && log_sample_rate_ > 0 && absl::Bernoulli(bitgen_, log_sample_rate_)) {
      // Names, codes and sizes only: never key material, messages or plaintexts.
      Log(LogLevel::kInfo, "request",
          {{"method", method->name()},
           {"code", absl::StatusCodeToString(status.code())},
           {"seconds", seconds},
           {"items", batch_size}});
    }
    reactor->Finish(ToGrpcStatus(status));
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  }

  void BeginCall() { in_flight_.fetch_add(1, std::memory_order_acq_rel); }

  Operations* const operations_;
  keys::KeyManager* const keys_;
  ops::WorkerPool* const pool_;
  metrics::Metrics* const metrics_;
  const double log_sample_rate_;
  auth::Authorizer* const authorizer_;
  ops::Admission* const admission_;
  std::deque<MethodInfo> methods_;  // stable addresses
  std::atomic<int64_t> in_flight_{0};
  IdentityCache identities_;
  static thread_local absl::InsecureBitGen bitgen_;
};

thread_local absl::InsecureBitGen Dispatcher::bitgen_;

// Puts a batch call's request and response on one protobuf arena: the item messages (a
// BatchVerify(64) call parses 64 requests and builds 64 results and 64 statuses) come from a few
// arena blocks instead of one malloc and one free each, and all go at once when gRPC releases the
// call. Strings still own heap buffers (protobuf 3.21), so plaintexts are freed as before.
// Thread-safe: every call gets its own arena.
template <typename Request, typename Response>
class ArenaAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder; }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() : arena_(Options()) {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    static google::protobuf::ArenaOptions Options() {
      google::protobuf::ArenaOptions options;
      options.start_block_size = 4096;  // a 64-item batch takes ~15 KB: 3 blocks
      options.max_block_size = 64 * 1024;
      return options;
    }
    google::protobuf::Arena arena_;
  };
};

// One proto service's methods on gRPC's callback API, added one by one from ops::ForEachMethod
// (what the generated CallbackService classes do with a method each). gRPC takes the service's
// name from its methods' paths.
class TableService final : public grpc::Service {
 public:
  template <typename Request, typename Response>
  void AddUnary(absl::string_view service, absl::string_view name, const MethodInfo* info,
                std::function<ServerUnaryReactor*(CallbackServerContext*, const Request*,
                                                  Response*)>
                    handler,
                grpc::MessageAllocator<Request, Response>* allocator = nullptr) {
    CheckInProto(service, name, Request::descriptor(), Response::descriptor());
    AddMethod(new grpc::internal::RpcServiceMethod(info->path.c_str(),
                                                   grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    auto* h = new grpc::internal::CallbackUnaryHandler<Request, Response>(std::move(handler));
    if (allocator != nullptr) h->SetMessageAllocator(allocator);
    MarkMethodCallback(methods_added_++, h);
  }
  // A method whose request and answer are handed over as bytes (AEAD Open, see OpenShared).
  void AddRawUnary(absl::string_view service, absl::string_view name, const MethodInfo* info,
                   std::function<ServerUnaryReactor*(CallbackServerContext*,
                                                     const grpc::ByteBuffer*, grpc::ByteBuffer*)>
                       handler,
                   const google::protobuf::Descriptor* request,
                   const google::protobuf::Descriptor* response) {
    CheckInProto(service, name, request, response);
    AddMethod(new grpc::internal::RpcServiceMethod(info->path.c_str(),
                                                   grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    MarkMethodRawCallback(
        methods_added_++,
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            std::move(handler)));
  }

 private:
  static void CheckInProto(absl::string_view service, absl::string_view name,
                           const google::protobuf::Descriptor* request,
                           const google::protobuf::Descriptor* response) {
    if (ops::InProto(service, name, request, response)) return;
    // Our own invariant (a programming error), caught by every test that starts a server.
    std::fprintf(stderr, "grpc services: %s.%s is not in the proto with these types\n",
                 std::string(service).c_str(), std::string(name).c_str());
    std::abort();
  }

  int methods_added_ = 0;
};

// Builds the gRPC services from ops::ForEachMethod: one TableService per proto service, each
// method bound to the Dispatcher's way of running its kind. Batches get their arena allocator;
// BatchVerify and BatchDerive, whose memo hits are answered on the gRPC thread, reuse their
// messages (PooledAllocator: a 64-item hit then parses into kept buffers, builds its answer in
// a kept arena block).
class ServicesBuilder {
 public:
  ServicesBuilder(Dispatcher* d, std::deque<TableService>* services,
                  std::vector<std::unique_ptr<void, void (*)(void*)>>* allocators)
      : d_(d), services_(services), allocators_(allocators) {}

  template <typename Request, typename Response>
  void Keys(absl::string_view name, bool audited, ops::KeyFn<Request, Response> fn) {
    const MethodInfo* info = d_->Method(ops::kKeyService, name, false);
    Dispatcher* d = d_;
    ServiceFor(ops::kKeyService)
        .AddUnary<Request, Response>(
            ops::kKeyService, name, info, [d, info, audited, fn](CallbackServerContext* c, const Request* q, Response* r) {
              keys::KeyManager* k = d->keys();
              return d->Run(c, info, *q, r, [=] {
                absl::Status s = fn(k, *q, r);
                if (audited) d->AuditKeyCall(c, info, *q, s, VersionOf(*r));
                return s;
              });
            });
  }
  template <typename Request, typename Response>
  void Unary(absl::string_view service, absl::string_view name,
             absl::Status (Operations::*op)(const Request&, Response*) const) {
    const MethodInfo* info = d_->Method(service, name, false);
    Dispatcher* d = d_;
    ServiceFor(service).AddUnary<Request, Response>(
        service, name, info, [d, info, op](CallbackServerContext* c, const Request* q, Response* r) {
          return d->Unary(c, info, q, r, op);
        });
  }
  template <typename Request, typename Response>
  void Batch(absl::string_view service, absl::string_view name,
             void (Operations::*op)(const Request&, Response*, Operations::Done,
                                    Operations::Alive) const) {
    const MethodInfo* info = d_->Method(service, name, true);
    Dispatcher* d = d_;
    ServiceFor(service).AddUnary<Request, Response>(
        service, name, info,
        [d, info, op](CallbackServerContext* c, const Request* q, Response* r) {
          return d->Batch(c, info, q, r, op);
        },
        Allocator<ArenaAllocator<Request, Response>>());
  }
  template <typename Request, typename Response, typename Probe>
  void MemoFirst(absl::string_view service, absl::string_view name,
                 bool (Operations::*from_memo)(const Request&, Response*, Probe*, absl::Status*)
                     const,
                 absl::Status (Operations::*fresh)(const Request&, const Probe&, Response*) const) {
    const MethodInfo* info = d_->Method(service, name, false);
    Dispatcher* d = d_;
    ServiceFor(service).AddUnary<Request, Response>(
        service, name, info, [d, info, from_memo, fresh](CallbackServerContext* c, const Request* q, Response* r) {
          return d->MemoFirst(c, info, q, r, from_memo, fresh);
        });
  }
  template <typename Request, typename Response, typename Probe>
  void BatchMemoFirst(absl::string_view service, absl::string_view name,
                      bool (Operations::*from_memo)(const Request&, Response*, Probe*,
                                                    absl::Status*) const,
                      void (Operations::*fresh)(const Request&, const Probe&, Response*,
                                                Operations::Done, Operations::Alive) const) {
    const MethodInfo* info = d_->Method(service, name, true);
    Dispatcher* d = d_;
    ServiceFor(service).AddUnary<Request, Response>(
        service, name, info,
        [d, info, from_memo, fresh](CallbackServerContext* c, const Request* q, Response* r) {
          return d->BatchMemoFirst(c, info, q, r, from_memo, fresh);
        },
        Allocator<PooledAllocator<Request, Response>>());
  }
  // Open is a raw method (gRPC hands over the request bytes and takes the answer's as they
  // are): see Dispatcher::OpenShared. Its messages are those of the proto, encoded the same.
  void AeadOpen(absl::string_view service, absl::string_view name) {
    const MethodInfo* info = d_->Method(service, name, false);
    Dispatcher* d = d_;
    ServiceFor(service).AddRawUnary(
        service, name, info,
        [d, info](CallbackServerContext* c, const grpc::ByteBuffer* q, grpc::ByteBuffer* r) {
          return d->OpenShared(c, info, q, r);
        },
        v1::AeadOpenRequest::descriptor(), v1::AeadOpenResponse::descriptor());
  }

 private:
  static uint32_t VersionOf(const v1::KeyInfo& info) { return info.current_version(); }
  template <typename Response>
  static uint32_t VersionOf(const Response&) {
    return 0;
  }

  // The service's TableService, made on its first method (entries need not be grouped).
  TableService& ServiceFor(absl::string_view service) {
    TableService*& found = by_name_[service];
    if (found == nullptr) found = &services_->emplace_back();
    return *found;
  }

  template <typename A>
  A* Allocator() {
    auto* allocator = new A();
    allocators_->emplace_back(allocator, [](void* a) { delete static_cast<A*>(a); });
    return allocator;
  }

  Dispatcher* const d_;
  std::deque<TableService>* const services_;
  std::vector<std::unique_ptr<void, void (*)(void*)>>* const allocators_;
  absl::flat_hash_map<std::string, TableService*> by_name_;
};

}  // namespace

struct Services::Impl {
  Impl(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
       metrics::Metrics* metrics, double log_sample_rate, const Guards& guards)
      : dispatcher(operations, keys, pool, metrics, log_sample_rate, guards) {
    ServicesBuilder builder(&dispatcher, &services, &allocators);
    ops::ForEachMethod(builder);
  }

  Dispatcher dispatcher;
  // Batch methods' message allocators (outlive the services that point to them).
  std::vector<std::unique_ptr<void, void (*)(void*)>> allocators;
  std::deque<TableService> services;  // stable addresses: the server keeps pointers
};

Services::Services(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
                   metrics::Metrics* metrics, double log_sample_rate, Guards guards)
    : impl_(std::make_unique<Impl>(operations, keys, pool, metrics, log_sample_rate, guards)) {}

Services::~Services() = default;

int64_t Services::in_flight() const { return impl_->dispatcher.in_flight(); }

void Services::RegisterAll(grpc::ServerBuilder& builder) {
  for (TableService& service : impl_->services) builder.RegisterService(&service);
}

}  // namespace offload::rpc
