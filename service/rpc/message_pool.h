// A gRPC message allocator that reuses a batch method's messages across calls.
//
//   PooledAllocator<v1::BatchVerifyRequest, v1::BatchVerifyResponse> allocator;
//   handler->SetMessageAllocator(&allocator);
//
// The request is a heap message that is cleared, not freed, when gRPC releases the call: a
// cleared protobuf message keeps its repeated items and their strings' buffers, so parsing the
// next call's items allocates nothing. The response lives on a protobuf arena whose first block
// is part of the holder and survives Arena::Reset(): its items and statuses cost no malloc
// either. Before a response is reset its secrets are wiped (WipeSecrets, e.g. BatchDerive's
// shared keys), so they never reach free memory or a later call.
//
// What waits for reuse is bounded: at most `max_idle` holders, and a request is kept only while
// it is small (PoolTraits<Request>::Reusable: at most kPoolMaxItems items, no string field over
// kPoolMaxField bytes); a larger one is freed on release, so one big batch does not pin its
// memory. An idle holder keeps at most its 16 KB arena block plus kPoolMaxItems items of short
// fields (~100 KB); 16 idle holders, under 2 MB per method. Thread-safety: AllocateMessages and
// Release may be called from any thread.
#ifndef SERVICE_RPC_MESSAGE_POOL_H_
#define SERVICE_RPC_MESSAGE_POOL_H_

#include <sodium.h>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "grpcpp/support/message_allocator.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/x25519.pb.h"

namespace offload::rpc {

// What a pooled request may keep: items, and bytes per string field (its capacity).
inline constexpr int kPoolMaxItems = 128;
inline constexpr size_t kPoolMaxField = 256;

// Whether a released batch request is small enough to keep: at most kPoolMaxItems items, and no
// string field of an item (`fields(item)`, a std::array of pointers) holding over kPoolMaxField.
template <typename Batch, typename Fields>
bool ReusableBatch(const Batch& request, Fields fields) {
  if (request.items_size() > kPoolMaxItems) return false;
  for (const auto& item : request.items()) {
    for (const std::string* field : fields(item)) {
      if (field->capacity() > kPoolMaxField) return false;
    }
  }
  return true;
}

// Per message type: whether a released request is small enough to keep, and which response
// fields are secrets.
template <typename Message>
struct PoolTraits;

template <>
struct PoolTraits<v1::BatchVerifyRequest> {
  static bool Reusable(const v1::BatchVerifyRequest& r) {
    return ReusableBatch(r, [](const v1::VerifyRequest& item) {
      return std::array<const std::string*, 3>{&item.public_key(), &item.message(),
                                               &item.signature()};
    });
  }
};

template <>
struct PoolTraits<v1::BatchDeriveRequest> {
  static bool Reusable(const v1::BatchDeriveRequest& r) {
    return ReusableBatch(r, [](const v1::DeriveRequest& item) {
      return std::array<const std::string*, 2>{&item.key_id(), &item.peer_public_key()};
    });
  }
};

template <>
struct PoolTraits<v1::BatchVerifyResponse> {
  static void WipeSecrets(v1::BatchVerifyResponse*) {}  // validity bits and statuses only
};

template <>
struct PoolTraits<v1::BatchDeriveResponse> {
  static void WipeSecrets(v1::BatchDeriveResponse* r) {
    for (v1::BatchDeriveResult& result : *r->mutable_results()) {
      if (!result.has_response()) continue;
      std::string* key = result.mutable_response()->mutable_shared_key();
      sodium_memzero(key->data(), key->size());
    }
  }
};

template <typename Request, typename Response>
class PooledAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  explicit PooledAllocator(size_t max_idle = 16) : max_idle_(max_idle) {}
  ~PooledAllocator() override {
    for (Holder* holder : idle_) delete holder;
  }
  PooledAllocator(const PooledAllocator&) = delete;
  PooledAllocator& operator=(const PooledAllocator&) = delete;

  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        Holder* holder = idle_.back();
        idle_.pop_back();
        return holder;
      }
    }
    return new Holder(this);
  }

  // Holders waiting for reuse (for tests).
  size_t idle() const {
    absl::MutexLock lock(&mu_);
    return idle_.size();
  }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    explicit Holder(PooledAllocator* pool) : pool_(pool), arena_(Options(block_)) {
      this->set_request(&request_);
      NewResponse();
    }
    ~Holder() override { PoolTraits<Response>::WipeSecrets(this->response()); }

    void Release() override {
      PoolTraits<Response>::WipeSecrets(this->response());
      const bool reusable = PoolTraits<Request>::Reusable(request_);
      if (reusable) {
        request_.Clear();
        arena_.Reset();  // frees every block but block_, and the response's strings
        NewResponse();
      }
      pool_->Return(this, reusable);
    }

   private:
    static constexpr size_t kBlock = 16 * 1024;  // a 64-item response fits
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kBlock;
      options.max_block_size = 64 * 1024;
      return options;
    }
    void NewResponse() {
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }

    PooledAllocator* const pool_;
    Request request_;
    alignas(8) char block_[kBlock];
    google::protobuf::Arena arena_;  // after block_: constructed over it, destroyed before it
  };

  void Return(Holder* holder, bool reusable) {
    if (reusable) {
      absl::MutexLock lock(&mu_);
      if (idle_.size() < max_idle_) {
        idle_.push_back(holder);
        return;
      }
    }
    delete holder;
  }

  const size_t max_idle_;
  mutable absl::Mutex mu_;
  std::vector<Holder*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace offload::rpc

#endif  // SERVICE_RPC_MESSAGE_POOL_H_
