// The service's operations, independent of transport: the gateway (service/http) calls them for
// every protocol with the request and response messages of the API.
//
//   Operations ops(&key_manager, &pool, backends, Operations::Options{});
//   v1::VerifyResponse response;
//   absl::Status s = ops.Verify(request, &response);          // runs on the calling thread
//   ops.BatchVerify(batch, &batch_response, [](absl::Status s) { ... });  // items on the pool
//
// Single-item operations run on the calling thread, which must be a worker, never a transport
// thread. Batch operations check the item count, then spread the items over the worker pool and
// call `done` once, from a worker, after every item has its result (or at once if the whole call
// is refused). BatchVerify and BatchDerive first answer their leading memo hits on the calling
// thread and call `done` there when they are all its items (see BatchVerifyFromMemo). Every size is checked
// before use; errors name the field. Results come from the memo caches when they hold them
// (`memo_hit`), and successful results are recorded there.
// Thread-safety: all methods are const and may run concurrently.
#ifndef SERVICE_OPS_OPERATIONS_H_
#define SERVICE_OPS_OPERATIONS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/x25519.pb.h"
#include "service/crypto/backend.h"
#include "service/keys/key_manager.h"
#include "service/memo/memo.h"
#include "service/ops/envelope.h"
#include "service/ops/worker_pool.h"

namespace offload::ops {

// Zeroes a BatchDerive item's shared key in place, if it has one. A batch response may live on
// an arena, which frees strings without wiping them: call it before the item is cleared or freed.
void WipeSharedKey(v1::BatchDeriveResult* result);

class Operations final {
 public:
  struct Options {
    int max_batch_items = 1024;
  };
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  // Asked before each few items of a batch run: false (the call was cancelled or its deadline
  // passed) skips the items not yet run and the batch ends DEADLINE_EXCEEDED. Null = always.
  using Alive = std::function<bool()>;

  // `keys`, `memo` and `pool` must outlive this object.
  Operations(keys::KeyManager* keys, memo::Memo* memo, WorkerPool* pool,
             crypto::BackendChoice backends, Options options);

  absl::Status Sign(const v1::SignRequest& request, v1::SignResponse* response) const;
  absl::Status Verify(const v1::VerifyRequest& request, v1::VerifyResponse* response) const;

  // Verify in two steps, so that a memo hit needs no hop to the worker pool.
  // VerifyFromMemo checks the sizes, takes the keyed BLAKE2b digest and looks it up in the memo:
  // no signature check, no key, so it may run on a transport thread (about 0.5 us). It returns
  // true when the call is complete: `*status` holds a size error, or `*response` a memo hit.
  // Otherwise `*digest` is set and VerifyFresh (on a worker) checks the signature and records a
  // valid one. Verify() is exactly VerifyFromMemo then VerifyFresh: the memo counts one lookup.
  bool VerifyFromMemo(const v1::VerifyRequest& request, v1::VerifyResponse* response,
                      memo::Digest* digest, absl::Status* status) const;
  absl::Status VerifyFresh(const v1::VerifyRequest& request, const memo::Digest& digest,
                           v1::VerifyResponse* response) const;
  absl::Status Derive(const v1::DeriveRequest& request, v1::DeriveResponse* response) const;
  // Derive in two steps, as Verify: DeriveFromMemo checks the request, finds the key version and
  // looks the peer up in the derive memo (no X25519; about 0.5 us); DeriveFresh runs the X25519
  // of a miss on a worker and records it. Derive() is exactly the two in sequence. A probe that
  // already holds a key (the previous item of a batch) is reused for a request naming its id.
  struct DeriveProbe {
    std::shared_ptr<const keys::ManagedKey> key;
    const keys::ManagedKeyVersion* version = nullptr;
    v1::DeriveOutput output = v1::DERIVE_OUTPUT_RAW;
    memo::Digest digest;
  };
  bool DeriveFromMemo(const v1::DeriveRequest& request, v1::DeriveResponse* response,
                      DeriveProbe* probe, absl::Status* status) const;
  absl::Status DeriveFresh(const v1::DeriveRequest& request, const DeriveProbe& probe,
                           v1::DeriveResponse* response) const;
  absl::Status BoxSeal(const v1::BoxSealRequest& request, v1::BoxSealResponse* response) const;
  absl::Status BoxOpen(const v1::BoxOpenRequest& request, v1::BoxOpenResponse* response) const;
  absl::Status AeadSeal(const v1::AeadSealRequest& request, v1::AeadSealResponse* response) const;
  // Opens the envelope (any version the key may still open) and seals the plaintext under the
  // current version; the plaintext stays in wiped memory. No memo is read or written.
  absl::Status AeadRewrap(const v1::AeadRewrapRequest& request,
                          v1::AeadRewrapResponse* response) const;
  absl::Status AeadOpen(const v1::AeadOpenRequest& request, v1::AeadOpenResponse* response) const;

  // AeadOpen in two steps, as Verify. AeadOpenFromMemo finds the key, parses the envelope and
  // looks it up in the open memo: no cipher, so it may run on a transport thread (a 55 KB hit
  // compares and copies 55 KB, ~3 us). It returns true when the call is complete: `*status`
  // holds an error, or `*response` a memo hit. Otherwise `*probe` is filled and AeadOpenFresh
  // (on a worker) decrypts and records the result. AeadOpen() is exactly the two in sequence.
  // REQUIRES: `request` outlives `*probe` (the probe points into its envelope).
  struct OpenProbe {
    std::shared_ptr<const keys::ManagedKey> key;
    const keys::ManagedKeyVersion* version = nullptr;
    EnvelopeView view;
    memo::Digest digest;
  };
  bool AeadOpenFromMemo(const v1::AeadOpenRequest& request, v1::AeadOpenResponse* response,
                        OpenProbe* probe, absl::Status* status) const;
  absl::Status AeadOpenFresh(const v1::AeadOpenRequest& request, const OpenProbe& probe,
                             v1::AeadOpenResponse* response) const;

  // AeadOpen without a copy of the plaintext, for transports that write it as it is (the gRPC
  // Open handler, the HTTP gateway's Connect proto answer). OpenResult holds the plaintext by
  // reference: the memo entry's buffer on a hit, else the buffer the cipher wrote (no zero-fill)
  // that the memo then shares. The serialized AeadOpenResponse is WirePrefix() + plaintext +
  // WireSuffix(), byte for byte what protobuf's serializer writes for the same message.
  struct OpenResult {
    static constexpr size_t kMaxWirePrefix = 6;  // tag + 32-bit varint length
    static constexpr size_t kMaxWireSuffix = 8;  // key_version (tag + varint), memo_hit
    memo::SharedPlaintext plaintext;  // non-null once the call succeeded
    uint32_t key_version = 0;
    bool memo_hit = false;
    // Field 1's tag and length into `out` (nothing for an empty plaintext); returns the size.
    size_t WirePrefix(uint8_t out[kMaxWirePrefix]) const;
    // Fields 2 and 3 (memo_hit only when true) into `out`; returns the size.
    size_t WireSuffix(uint8_t out[kMaxWireSuffix]) const;
  };
  // As AeadOpenFromMemo, filling `*result` on a hit (no plaintext copy: the memcmp of the stored
  // ciphertext is the hit's only pass over the bytes).
  bool AeadOpenFromMemoShared(const v1::AeadOpenRequest& request, OpenResult* result,
                              OpenProbe* probe, absl::Status* status) const;
  // As AeadOpenFresh. The envelope is moved out of `*request` into the memo entry (its stored
  // ciphertext): `request->envelope()` is empty afterwards (whatever the outcome of the insert).
  // REQUIRES: `probe` was filled from `*request` by AeadOpenFromMemoShared.
  absl::Status AeadOpenFreshShared(v1::AeadOpenRequest* request, const OpenProbe& probe,
                                   OpenResult* result) const;
  // An AeadOpenRequest's fields read where they lie (a request body parsed in place, see
  // http::ParseBytesFieldsInPlace): nothing is copied.
  struct OpenRequestView {
    absl::string_view key_id;
    absl::string_view envelope;
    absl::string_view associated_data;
  };
  // The two steps over a view. The fresh step moves `*owner`, the buffer the envelope lies in,
  // into the memo entry as its stored ciphertext (cut after the tag; empty afterwards), so that
  // a request body becomes the entry without a copy. REQUIRES: `request.envelope` lies within
  // `*owner`, and `probe` was filled from `request` by AeadOpenFromMemoShared.
  bool AeadOpenFromMemoShared(const OpenRequestView& request, OpenResult* result,
                              OpenProbe* probe, absl::Status* status) const;
  absl::Status AeadOpenFreshShared(const OpenRequestView& request, std::string* owner,
                                   const OpenProbe& probe, OpenResult* result) const;

  // REQUIRES: `request` and `response` stay alive until `done` has been called.
  void BatchSign(const v1::BatchSignRequest& request, v1::BatchSignResponse* response,
                 Done done, Alive alive = nullptr) const;
  void BatchVerify(const v1::BatchVerifyRequest& request, v1::BatchVerifyResponse* response,
                   Done done, Alive alive = nullptr) const;
  // BatchVerify in two steps, as Verify. BatchVerifyFromMemo checks the item count, then answers
  // on the calling thread the leading items that need no signature check (memo hits, size
  // errors), at most kMaxInlineVerifyItems (~0.5 us each), stopping at the first that does. It
  // returns true when the call is complete: `*status` refuses the whole call, or every item has
  // its result. Otherwise BatchVerifyFresh runs the remaining items on the pool, starting at
  // `probe.next`, whose digest the probe holds. BatchVerify() is exactly the two in sequence.
  static constexpr int kMaxInlineVerifyItems = 64;
  struct BatchVerifyProbe {
    int next = 0;              // the first item without a result
    bool have_digest = false;  // `digest` is item `next`'s (it was looked up and missed)
    memo::Digest digest;
  };
  bool BatchVerifyFromMemo(const v1::BatchVerifyRequest& request,
                           v1::BatchVerifyResponse* response, BatchVerifyProbe* probe,
                           absl::Status* status) const;
  // REQUIRES: `request` and `response` stay alive until `done` has been called.
  void BatchVerifyFresh(const v1::BatchVerifyRequest& request, const BatchVerifyProbe& probe,
                        v1::BatchVerifyResponse* response, Done done,
                        Alive alive = nullptr) const;
  void BatchDerive(const v1::BatchDeriveRequest& request, v1::BatchDeriveResponse* response,
                   Done done, Alive alive = nullptr) const;
  // BatchDerive in two steps, as BatchVerify: BatchDeriveFromMemo answers on the calling thread
  // the leading items that need no X25519 (memo hits, request errors; ~0.5 us each), at most
  // kMaxInlineVerifyItems, stopping at the first that does, whose probe it keeps;
  // BatchDeriveFresh runs the rest on the pool. BatchDerive() is exactly the two in sequence.
  struct BatchDeriveProbe {
    int next = 0;              // the first item without a result
    bool have_probe = false;   // `probe` is item `next`'s (it was looked up and missed)
    DeriveProbe probe;
  };
  bool BatchDeriveFromMemo(const v1::BatchDeriveRequest& request,
                           v1::BatchDeriveResponse* response, BatchDeriveProbe* probe,
                           absl::Status* status) const;
  // REQUIRES: `request` and `response` stay alive until `done` has been called.
  void BatchDeriveFresh(const v1::BatchDeriveRequest& request, const BatchDeriveProbe& probe,
                        v1::BatchDeriveResponse* response, Done done,
                        Alive alive = nullptr) const;
  void BatchBoxSeal(const v1::BatchBoxSealRequest& request, v1::BatchBoxSealResponse* response,
                    Done done, Alive alive = nullptr) const;
  void BatchBoxOpen(const v1::BatchBoxOpenRequest& request, v1::BatchBoxOpenResponse* response,
                    Done done, Alive alive = nullptr) const;
  void BatchAeadSeal(const v1::BatchAeadSealRequest& request, v1::BatchAeadSealResponse* response,
                     Done done, Alive alive = nullptr) const;
  void BatchAeadOpen(const v1::BatchAeadOpenRequest& request, v1::BatchAeadOpenResponse* response,
                     Done done, Alive alive = nullptr) const;
  void BatchAeadRewrap(const v1::BatchAeadRewrapRequest& request,
                       v1::BatchAeadRewrapResponse* response, Done done,
                       Alive alive = nullptr) const;

  const Options& options() const { return options_; }

 private:
  // InvalidArgument for an empty batch or one over the limit.
  absl::Status CheckBatchSize(int items) const;
  // Runs `item(i)` for every i in [0, n) on the pool, then `done(OK)` from the worker that ran
  // the last one. One worker starts; the others join only when the items prove slow (see .cc).
  template <typename ItemFn>
  void RunBatch(int n, ItemFn item, Done done, Alive alive) const;
  // A batch whose results hold (status, response of `single`) per item.
  template <typename BatchRequest, typename BatchResponse, typename Request, typename Response>
  void BatchOf(const BatchRequest& request, BatchResponse* response,
               absl::Status (Operations::*single)(const Request&, Response*) const,
               Done done, Alive alive) const;

  // The 32-byte shared key of `version` with `peer` (raw or box key, as `output` says), from the
  // derive memo when it has it. Sets `*memo_hit`.
  absl::Status DeriveShared(const keys::ManagedKey& key, const keys::ManagedKeyVersion& version,
                            absl::Span<const uint8_t> peer, v1::DeriveOutput output,
                            absl::Span<uint8_t> out, bool* memo_hit) const;

  keys::KeyManager* const keys_;
  memo::Memo* const memo_;
  WorkerPool* const pool_;
  const crypto::BackendChoice backends_;
  const Options options_;
};

}  // namespace offload::ops

#endif  // SERVICE_OPS_OPERATIONS_H_
