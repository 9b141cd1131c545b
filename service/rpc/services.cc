#include "service/rpc/services.h"

#include <openssl/pem.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/message_allocator.h"
#include "service/auth/tls.h"
#include "service/common/log.h"

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
      if (!status.ok()) response->Clear();
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

// Copies a StatusOr<KeyInfo> into `response`.
absl::Status Store(absl::StatusOr<v1::KeyInfo> info, v1::KeyInfo* response) {
  if (!info.ok()) return info.status();
  *response = *std::move(info);
  return absl::OkStatus();
}

constexpr absl::string_view kKeys = "offload.v1.KeyService";
constexpr absl::string_view kEd25519 = "offload.v1.Ed25519Service";
constexpr absl::string_view kX25519 = "offload.v1.X25519Service";
constexpr absl::string_view kBox = "offload.v1.BoxService";
constexpr absl::string_view kAead = "offload.v1.AeadService";

class KeyService final : public v1::KeyService::CallbackService {
 public:
  explicit KeyService(Dispatcher* d)
      : d_(d),
        create_(d->Method(kKeys, "CreateKey", false)),
        import_(d->Method(kKeys, "ImportKey", false)),
        get_(d->Method(kKeys, "GetKey", false)),
        list_(d->Method(kKeys, "ListKeys", false)),
        rotate_(d->Method(kKeys, "RotateKey", false)),
        delete_(d->Method(kKeys, "DeleteKey", false)) {}

  ServerUnaryReactor* CreateKey(CallbackServerContext* c, const v1::CreateKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, create_, *q, r, [=] {
      absl::Status s = Store(k->CreateKey(*q), r);
      d_->AuditKeyCall(c, create_, *q, s, r->current_version());
      return s;
    });
  }
  ServerUnaryReactor* ImportKey(CallbackServerContext* c, const v1::ImportKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, import_, *q, r, [=] {
      absl::Status s = Store(k->ImportKey(*q), r);
      d_->AuditKeyCall(c, import_, *q, s, r->current_version());
      return s;
    });
  }
  ServerUnaryReactor* GetKey(CallbackServerContext* c, const v1::GetKeyRequest* q,
                             v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, get_, *q, r, [=] { return Store(k->GetKey(q->key_id()), r); });
  }
  ServerUnaryReactor* ListKeys(CallbackServerContext* c, const v1::ListKeysRequest* q,
                               v1::ListKeysResponse* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, list_, *q, r, [=] {
      for (v1::KeyInfo& info : k->ListKeys()) *r->add_keys() = std::move(info);
      return absl::OkStatus();
    });
  }
  ServerUnaryReactor* RotateKey(CallbackServerContext* c, const v1::RotateKeyRequest* q,
                                v1::KeyInfo* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, rotate_, *q, r, [=] {
      absl::Status s = Store(k->RotateKey(q->key_id()), r);
      d_->AuditKeyCall(c, rotate_, *q, s, r->current_version());
      return s;
    });
  }
  ServerUnaryReactor* DeleteKey(CallbackServerContext* c, const v1::DeleteKeyRequest* q,
                                v1::DeleteKeyResponse* r) override {
    keys::KeyManager* k = d_->keys();
    return d_->Run(c, delete_, *q, r, [=] {
      absl::Status s = k->DeleteKey(q->key_id());
      d_->AuditKeyCall(c, delete_, *q, s, 0);
      return s;
    });
  }

 private:
  Dispatcher* const d_;
  const MethodInfo* const create_;
  const MethodInfo* const import_;
  const MethodInfo* const get_;
  const MethodInfo* const list_;
  const MethodInfo* const rotate_;
  const MethodInfo* const delete_;
};

class Ed25519Service final : public v1::Ed25519Service::CallbackService {
 public:
  explicit Ed25519Service(Dispatcher* d)
      : d_(d),
        sign_(d->Method(kEd25519, "Sign", false)),
        batch_sign_(d->Method(kEd25519, "BatchSign", true)),
        verify_(d->Method(kEd25519, "Verify", false)),
        batch_verify_(d->Method(kEd25519, "BatchVerify", true)) {
    SetMessageAllocatorFor_BatchSign(&batch_sign_arena_);
    SetMessageAllocatorFor_BatchVerify(&batch_verify_arena_);
  }
  ServerUnaryReactor* Sign(CallbackServerContext* c, const v1::SignRequest* q,
                           v1::SignResponse* r) override {
    return d_->Unary(c, sign_, q, r, &Operations::Sign);
  }
  ServerUnaryReactor* BatchSign(CallbackServerContext* c, const v1::BatchSignRequest* q,
                                v1::BatchSignResponse* r) override {
    return d_->Batch(c, batch_sign_, q, r, &Operations::BatchSign);
  }
  ServerUnaryReactor* Verify(CallbackServerContext* c, const v1::VerifyRequest* q,
                             v1::VerifyResponse* r) override {
    return d_->MemoFirst(c, verify_, q, r, &Operations::VerifyFromMemo, &Operations::VerifyFresh);
  }
  ServerUnaryReactor* BatchVerify(CallbackServerContext* c, const v1::BatchVerifyRequest* q,
                                  v1::BatchVerifyResponse* r) override {
    return d_->BatchMemoFirst(c, batch_verify_, q, r, &Operations::BatchVerifyFromMemo,
                              &Operations::BatchVerifyFresh);
  }

 private:
  Dispatcher* const d_;
  const MethodInfo* const sign_;
  const MethodInfo* const batch_sign_;
  const MethodInfo* const verify_;
  const MethodInfo* const batch_verify_;
  ArenaAllocator<v1::BatchSignRequest, v1::BatchSignResponse> batch_sign_arena_;
  ArenaAllocator<v1::BatchVerifyRequest, v1::BatchVerifyResponse> batch_verify_arena_;
};

class X25519Service final : public v1::X25519Service::CallbackService {
 public:
  explicit X25519Service(Dispatcher* d)
      : d_(d),
        derive_(d->Method(kX25519, "Derive", false)),
        batch_derive_(d->Method(kX25519, "BatchDerive", true)) {
    SetMessageAllocatorFor_BatchDerive(&batch_derive_arena_);
  }
  ServerUnaryReactor* Derive(CallbackServerContext* c, const v1::DeriveRequest* q,
                             v1::DeriveResponse* r) override {
    return d_->MemoFirst(c, derive_, q, r, &Operations::DeriveFromMemo, &Operations::DeriveFresh);
  }
  ServerUnaryReactor* BatchDerive(CallbackServerContext* c, const v1::BatchDeriveRequest* q,
                                  v1::BatchDeriveResponse* r) override {
    return d_->BatchMemoFirst(c, batch_derive_, q, r, &Operations::BatchDeriveFromMemo,
                              &Operations::BatchDeriveFresh);
  }

 private:
  Dispatcher* const d_;
  const MethodInfo* const derive_;
  const MethodInfo* const batch_derive_;
  ArenaAllocator<v1::BatchDeriveRequest, v1::BatchDeriveResponse> batch_derive_arena_;
};

class BoxService final : public v1::BoxService::CallbackService {
 public:
  explicit BoxService(Dispatcher* d)
      : d_(d),
        seal_(d->Method(kBox, "Seal", false)),
        batch_seal_(d->Method(kBox, "BatchSeal", true)),
        open_(d->Method(kBox, "Open", false)),
        batch_open_(d->Method(kBox, "BatchOpen", true)) {
    SetMessageAllocatorFor_BatchSeal(&batch_seal_arena_);
    SetMessageAllocatorFor_BatchOpen(&batch_open_arena_);
  }
  ServerUnaryReactor* Seal(CallbackServerContext* c, const v1::BoxSealRequest* q,
                           v1::BoxSealResponse* r) override {
    return d_->Unary(c, seal_, q, r, &Operations::BoxSeal);
  }
  ServerUnaryReactor* BatchSeal(CallbackServerContext* c, const v1::BatchBoxSealRequest* q,
                                v1::BatchBoxSealResponse* r) override {
    return d_->Batch(c, batch_seal_, q, r, &Operations::BatchBoxSeal);
  }
  ServerUnaryReactor* Open(CallbackServerContext* c, const v1::BoxOpenRequest* q,
                           v1::BoxOpenResponse* r) override {
    return d_->Unary(c, open_, q, r, &Operations::BoxOpen);
  }
  ServerUnaryReactor* BatchOpen(CallbackServerContext* c, const v1::BatchBoxOpenRequest* q,
                                v1::BatchBoxOpenResponse* r) override {
    return d_->Batch(c, batch_open_, q, r, &Operations::BatchBoxOpen);
  }

 private:
  Dispatcher* const d_;
  const MethodInfo* const seal_;
  const MethodInfo* const batch_seal_;
  const MethodInfo* const open_;
  const MethodInfo* const batch_open_;
  ArenaAllocator<v1::BatchBoxSealRequest, v1::BatchBoxSealResponse> batch_seal_arena_;
  ArenaAllocator<v1::BatchBoxOpenRequest, v1::BatchBoxOpenResponse> batch_open_arena_;
};

// Open is a raw method (gRPC hands over the request bytes and takes the answer's as they are):
// see Dispatcher::OpenShared. Its messages are those of the proto, encoded the same.
class AeadService final
    : public v1::AeadService::WithRawCallbackMethod_Open<v1::AeadService::CallbackService> {
 public:
  explicit AeadService(Dispatcher* d)
      : d_(d),
        seal_(d->Method(kAead, "Seal", false)),
        batch_seal_(d->Method(kAead, "BatchSeal", true)),
        open_(d->Method(kAead, "Open", false)),
        batch_open_(d->Method(kAead, "BatchOpen", true)) {
    SetMessageAllocatorFor_BatchSeal(&batch_seal_arena_);
    SetMessageAllocatorFor_BatchOpen(&batch_open_arena_);
  }
  ServerUnaryReactor* Seal(CallbackServerContext* c, const v1::AeadSealRequest* q,
                           v1::AeadSealResponse* r) override {
    return d_->Unary(c, seal_, q, r, &Operations::AeadSeal);
  }
  ServerUnaryReactor* BatchSeal(CallbackServerContext* c, const v1::BatchAeadSealRequest* q,
                                v1::BatchAeadSealResponse* r) override {
    return d_->Batch(c, batch_seal_, q, r, &Operations::BatchAeadSeal);
  }
  ServerUnaryReactor* Open(CallbackServerContext* c, const grpc::ByteBuffer* q,
                           grpc::ByteBuffer* r) override {
    return d_->OpenShared(c, open_, q, r);
  }
  ServerUnaryReactor* BatchOpen(CallbackServerContext* c, const v1::BatchAeadOpenRequest* q,
                                v1::BatchAeadOpenResponse* r) override {
    return d_->Batch(c, batch_open_, q, r, &Operations::BatchAeadOpen);
  }

 private:
  Dispatcher* const d_;
  const MethodInfo* const seal_;
  const MethodInfo* const batch_seal_;
  const MethodInfo* const open_;
  const MethodInfo* const batch_open_;
  ArenaAllocator<v1::BatchAeadSealRequest, v1::BatchAeadSealResponse> batch_seal_arena_;
  ArenaAllocator<v1::BatchAeadOpenRequest, v1::BatchAeadOpenResponse> batch_open_arena_;
};

}  // namespace

struct Services::Impl {
  Impl(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
       metrics::Metrics* metrics, double log_sample_rate, const Guards& guards)
      : dispatcher(operations, keys, pool, metrics, log_sample_rate, guards),
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

Services::Services(Operations* operations, keys::KeyManager* keys, ops::WorkerPool* pool,
                   metrics::Metrics* metrics, double log_sample_rate, Guards guards)
    : impl_(std::make_unique<Impl>(operations, keys, pool, metrics, log_sample_rate, guards)) {}

Services::~Services() = default;

int64_t Services::in_flight() const { return impl_->dispatcher.in_flight(); }

void Services::RegisterAll(grpc::ServerBuilder& builder) {
  builder.RegisterService(&impl_->key_service);
  builder.RegisterService(&impl_->ed25519_service);
  builder.RegisterService(&impl_->x25519_service);
  builder.RegisterService(&impl_->box_service);
  builder.RegisterService(&impl_->aead_service);
}

}  // namespace offload::rpc
