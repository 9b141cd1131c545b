// A gRPC message allocator that reuses a batch method's messages across calls.
//
//   PooledAllocator<v1::BatchVerifyRequest, v1::BatchVerifyResponse> allocator;
//   handler->SetMessageAllocator(&allocator);
//
// The request is a heap message that is cleared, not freed, when gRPC releases the call: a
// cleared protobuf message keeps its repeated items and their strings' buffers, so parsing the
// next call's items allocates nothing. The response lives on a protobuf arena whose first block
// is part of the holder and survives Arena::Reset(), so the items and statuses of a memo hit's
// answer cost no malloc either. A released response's secrets are wiped at once (WipeSecrets:
// BatchDerive's shared keys); the wiped response is reset when the holder is handed out again.
// (gRPC's serialized copy of an answer is gRPC's, freed by gRPC.)
//
// What waits for reuse is bounded: at most `max_idle` holders, and a request is kept only while
// it is small (Reusable: at most kPoolMaxItems items, no string field over kPoolMaxField bytes,
// no unknown fields); a larger one is freed on release, so one big batch does not pin its
// memory. An idle holder keeps at most its 16 KB arena block, the blocks of its last response
// (at most kPoolMaxItems items) and kPoolMaxItems items of short fields: 16 idle holders, a few
// MB per method at worst. Thread-safety: AllocateMessages and Release may be called from any
// thread. REQUIRES: the allocator outlives every call that uses it (shut the server down first).
#ifndef SERVICE_RPC_MESSAGE_POOL_H_
#define SERVICE_RPC_MESSAGE_POOL_H_

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/support/message_allocator.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/x25519.pb.h"
#include "service/ops/operations.h"

namespace offload::rpc {

// What a pooled request may keep: items, and bytes per string field (its capacity).
inline constexpr int kPoolMaxItems = 128;
inline constexpr size_t kPoolMaxField = 256;

// Whether a released batch request is small enough to keep: at most kPoolMaxItems items, no
// string field of an item (`fields(item)`, a std::array of pointers) holding over kPoolMaxField,
// and no unknown fields (a cleared UnknownFieldSet keeps its vector's capacity).
inline bool HasUnknownFields(const google::protobuf::Message& m) {
  return !m.GetReflection()->GetUnknownFields(m).empty();
}

template <typename Batch, typename Fields>
bool ReusableBatch(const Batch& request, Fields fields) {
  if (request.items_size() > kPoolMaxItems || HasUnknownFields(request)) return false;
  for (const auto& item : request.items()) {
    if (HasUnknownFields(item)) return false;
    for (const std::string* field : fields(item)) {
      if (field->capacity() > kPoolMaxField) return false;
    }
  }
  return true;
}

inline bool Reusable(const v1::BatchVerifyRequest& request) {
  return ReusableBatch(request, [](const v1::VerifyRequest& item) {
    return std::array<const std::string*, 3>{&item.public_key(), &item.message(),
                                             &item.signature()};
  });
}

inline bool Reusable(const v1::BatchDeriveRequest& request) {
  return ReusableBatch(request, [](const v1::DeriveRequest& item) {
    return std::array<const std::string*, 2>{&item.key_id(), &item.peer_public_key()};
  });
}

// Zeroes the secrets a batch response holds, before it is cleared, reset or freed: an arena frees
// its strings without wiping them, and a cleared item's sub-message is out of reach afterwards.
// Only BatchDerive's answers carry secrets here (shared keys); other responses: nothing to do.
template <typename Response>
void WipeSecrets(Response*) {}

inline void WipeSecrets(v1::BatchDeriveResponse* response) {
  for (v1::BatchDeriveResult& result : *response->mutable_results()) ops::WipeSharedKey(&result);
}

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
    Holder* holder = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        holder = idle_.back();
        idle_.pop_back();
      }
    }
    if (holder == nullptr) return new Holder(this);
    holder->Refresh();
    return holder;
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
    ~Holder() override { WipeSecrets(this->response()); }

    void Release() override {
      WipeSecrets(this->response());
      const bool reusable = Reusable(request_);
      if (reusable) {
        request_.Clear();
        stale_ = true;  // the response is reset when the holder is handed out again
      }
      pool_->Return(this, reusable);
    }

    // A fresh response for the next call. On the thread that handles that call's parse and, for
    // memo hits, builds its answer: protobuf 3.21 gives an arena's first block to the thread that
    // set it up (here, by Reset), other threads get blocks of their own.
    void Refresh() {
      if (!stale_) return;
      arena_.Reset();  // frees every block but block_, and the (wiped) response's strings
      NewResponse();
      stale_ = false;
    }

   private:
    static constexpr size_t kBlock = 16 * 1024;  // a 64-item response fits
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kBlock;
      options.start_block_size = 4096;  // another thread's first block (a pool worker's)
      options.max_block_size = 64 * 1024;
      return options;
    }
    void NewResponse() {
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }

    PooledAllocator* const pool_;
    bool stale_ = false;
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
