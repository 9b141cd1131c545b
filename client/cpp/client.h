// offload::client::Client: the C++ client of crypto-offload, over the generated gRPC stubs.
//
//   offload::client::ClientOptions options;
//   options.endpoints = "dns:offload-headless.offload.svc:50051";   // or "h1:50051,h2:50051"
//   auto client = offload::client::Client::Create(options);
//   if (!client.ok()) return client.status();
//   absl::StatusOr<offload::v1::SignResponse> sig = (*client)->Sign("alice-signing", "hello");
//   absl::StatusOr<offload::v1::VerifyResponse> ok =
//       (*client)->Verify(sig->public_key(), "hello", sig->signature());   // auto-batched
//
// What it adds to the raw stubs (client/cpp/README.md has the whole story, with figures):
// - Every call returns absl::Status / absl::StatusOr and has a deadline (`timeout`, covering
//   connection waits and retries too); it ends by then (DEADLINE_EXCEEDED or UNAVAILABLE), give
//   or take a scheduling delay.
// - A call needs a connected channel before it is sent. If its endpoint has none and another
//   usable endpoint exists, it fails over at once (after at most `connect_timeout` for an
//   endpoint's first connection); if there is nowhere else to go, it waits for the connection
//   until its deadline while the channel redials (every `max_backoff` at most), so a server that
//   starts, or restarts, before the deadline is reached. Waiting is not an attempt.
// - Retries on UNAVAILABLE, at most `max_attempts` RPCs per call (4 by default), with exponential
//   backoff (`initial_backoff` 25 ms doubling to `max_backoff` 1 s, "equal jitter") between
//   attempts on the same endpoint (a failover to another endpoint goes at once). Every method
//   retries, including CreateKey/ImportKey: if a lost answer hid a success, the retry says
//   ALREADY_EXISTS. Other codes (DEADLINE_EXCEEDED of a sent RPC included) are returned as is.
// - Key affinity: the endpoint is chosen by rendezvous hashing (rendezvous.h) of a routing key
//   over the endpoints not marked down (endpoints.h): the key id, or for Verify, which has none,
//   "ed25519:<hex public key>" (one signer's verify memo stays on one replica). Each call carries
//   `x-offload-key: <routing key>` metadata for proxies that hash on it (nginx
//   `hash $http_x_offload_key consistent`). An endpoint that answers UNAVAILABLE or cannot be
//   connected is marked down (`endpoint_down_initial` doubling to `endpoint_down_max`) and its
//   keys go to their next-highest endpoint; it gets them back when the mark runs out, or, after a
//   connection failure, as soon as its channel reconnects (about `max_backoff` after the server
//   listens again, while calls are flowing). Keys of the other endpoints never move.
// - Auto-batching: concurrent single Verify, Derive and AeadOpen calls bound for one endpoint are
//   sent together as BatchVerify / BatchDerive / BatchOpen (coalescer.h: the first caller leads
//   the batch, waits `batch_window` or until `max_batch_items` joined, sends it and hands each
//   caller its own result; no extra threads; while `max_batches_in_flight` batches are out, the
//   next one keeps growing, but not past its first caller's deadline). A batch is sent to the
//   endpoint it was grouped for; only if that one fails (or is marked down by then) does it
//   follow its first item's route. A whole-batch failure goes to each of its callers, after the
//   retry policy has run for the batch as a whole, within the first caller's deadline.
// - Explicit Batch* calls take any number of items: they are split by endpoint and into chunks of
//   at most `server_max_batch_items`, sent one after the other (each to the endpoint it was
//   split for), and answered in request order. If any chunk fails as a whole, the call fails
//   with that status.
// - Retries on RESOURCE_EXHAUSTED (and UNAVAILABLE) when the server says when to come back: a
//   refusal carrying a google.rpc.RetryInfo (retry_info.h) is retried on the same endpoint after
//   at least its delay (plus up to a fifth more of jitter, and never less than the backoff above),
//   within `max_attempts` and the call's deadline; a delay that would pass the deadline returns
//   the refusal as is, and so does a RESOURCE_EXHAUSTED without a RetryInfo. Such a refusal does
//   not mark the endpoint down.
// - Identity: TLS or mTLS through `credentials` (credentials.h makes them from PEM files), and a
//   bearer token sent as "authorization: Bearer <token>" metadata with every RPC, replaceable
//   while the client runs (SetBearerToken), or fetched by `token_provider`: asked before the first
//   RPC that has no token, and once more when an RPC is refused UNAUTHENTICATED, after which that
//   RPC is sent once more with the new token. A server certificate that TLS refuses (not signed
//   by our CAs, or without the expected name) is not waited out: the call fails over, or returns
//   UNAVAILABLE at once with gRPC's reason. (A server that refuses our certificate closes the
//   connection after the handshake under TLS 1.3: that looks like any lost connection.)
// - Memos (memo.h; client/cpp/README.md, "Memos"): a repeated Verify, and with `derive_memo` /
//   `open_memo` a repeated Derive / AeadOpen, is answered from memory with no RPC, `memo_hit`
//   set as when the service's own memo answers. Only successful results are remembered (a valid
//   signature, a derived key, an opened or sealed envelope); never an invalid signature or a
//   failed open. Entries are named by a keyed digest under a random per-client key, least
//   recently used by bytes within each memo's bound, and secrets are wiped when dropped. The
//   derive and open memos are off unless asked for, and then require a maximum age (the caller's
//   to give, as the AWS Encryption SDK's cache does): an older entry is never used. A refusal
//   about a key (NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED, as a call's status or a batch
//   item's error, from any call naming the key) drops that key's entries at once, and so do this
//   client's own DisableKey, DeleteKey, DisableKeyVersion, DestroyKeyVersion and
//   SetMinDecryptionVersion, and its CreateKey and ImportKey (a new key under an id whose old key
//   was deleted elsewhere); an item error about one input (INVALID_ARGUMENT) does not. Otherwise
//   a disabled, deleted or retired key's remembered results stop being used within the maximum
//   age. Auto-batched and explicit Batch* calls look in the memo first and send only what missed
//   (a batch whose items all hit sends nothing). One set of memos per Client, shared by all its
//   endpoints and threads.
//
// Thread-safe: one Client is meant to be shared by every thread of a process. Destroying it
// waits for calls in progress (REQUIRES: no new call starts once destruction has begun).
#ifndef CLIENT_CPP_CLIENT_H_
#define CLIENT_CPP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/memo.h"
#include "grpcpp/grpcpp.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"

namespace offload::client {

struct ClientOptions {
  // "host:port[,host:port...]" or "dns:host:port" (every address of the name; re-resolved).
  std::string endpoints = "127.0.0.1:50051";
  // Deadline of each call, connection waits and retries included.
  absl::Duration timeout = absl::Seconds(5);
  // RPCs per call on UNAVAILABLE (1 = no retry). Waiting for a connection is not an attempt.
  int max_attempts = 4;
  // Backoff between attempts on one endpoint (x2 per attempt, equal jitter). The same figures
  // drive each channel's redialling: `initial_backoff` after a failed connection attempt, then
  // x1.6 (+-20 %) up to `max_backoff`. REQUIRES: 0 < initial_backoff <= max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(25);
  absl::Duration max_backoff = absl::Seconds(1);
  // Time one connection attempt may take (TCP, TLS and the server's first HTTP/2 SETTINGS); also
  // what a call waits for an endpoint's first connection before failing over to another.
  absl::Duration connect_timeout = absl::Seconds(1);
  // Auto-batching of single Verify / Derive / AeadOpen calls.
  bool auto_batch = true;
  absl::Duration batch_window = absl::Milliseconds(2);
  int max_batch_items = 256;          // clamped to [1, server_max_batch_items]
  int server_max_batch_items = 1024;  // the server's --max_batch_items
  // Group commit: with this many auto-batches of one kind in flight to an endpoint, the next
  // keeps collecting past its window until one returns (or it is full). 0 = no limit.
  int max_batches_in_flight = 2;
  // Endpoint health and discovery: how long an endpoint that failed stays out (doubling per
  // consecutive failure; a reconnected channel ends a mark left by a connection failure sooner).
  absl::Duration endpoint_down_initial = absl::Milliseconds(500);
  absl::Duration endpoint_down_max = absl::Seconds(30);
  absl::Duration dns_refresh = absl::Seconds(30);
  // Null means insecure (plain-text) channels. TLS from PEM files: MakeTlsCredentials
  // (credentials.h).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // With `credentials`: the name the server's certificate must carry when it is not the host
  // dialled (an IP address, say). Empty: the host of a listed endpoint; for "dns:host:port",
  // `host` (not the resolved addresses).
  std::string tls_server_name;
  // Sent as "authorization: Bearer <bearer_token>" with every RPC when not empty, on plain-text
  // channels too (development on localhost; gRPC's own token credentials refuse those: use TLS
  // anywhere else, a bearer token is as good as a password). Replace it while the client runs
  // with SetBearerToken. Visible ASCII only (CheckBearerToken).
  std::string bearer_token;
  // Optional: returns a fresh bearer token. Asked (with no other call of it running) before an
  // RPC that would go without a token, and once more when an RPC is refused UNAUTHENTICATED (the
  // RPC is then sent once more, not counted in `max_attempts`); what it returns replaces the
  // token as SetBearerToken would. An error from it is the call's result, prefixed
  // "token provider: ". It runs on the calling thread and may block (within reason: calls
  // refused meanwhile wait for it); REQUIRES: it does not call this Client.
  std::function<absl::StatusOr<std::string>()> token_provider;

  // --- Memos (README "Memos"). Bounds are in charged bytes (Memo::EntryCost: value + key id +
  // a fixed overhead per entry).
  // Valid Verify answers. 0 turns the verify memo off. No maximum age: the answer depends on
  // nothing but its inputs.
  size_t verify_memo_bytes = 1 << 20;
  // Derive answers (shared keys, wiped when dropped), keyed by (key id, key version asked, output
  // kind, peer public key). Off unless `derive_memo`; then `derive_memo_max_age` is required (a
  // finite duration > 0: Create refuses INVALID_ARGUMENT otherwise) and `derive_memo_bytes` must
  // be > 0. An entry asked as the current version (0) keeps the version the server used until
  // its age runs out, through rotations.
  bool derive_memo = false;
  size_t derive_memo_bytes = 1 << 20;
  absl::Duration derive_memo_max_age = absl::ZeroDuration();
  // AeadOpen answers (plaintexts, wiped when dropped), keyed by (key id, envelope, associated
  // data); AeadSeal and BatchAeadSeal record the envelopes they produce. Off unless `open_memo`;
  // then `open_memo_max_age` is required as above.
  bool open_memo = false;
  size_t open_memo_bytes = 8 << 20;
  absl::Duration open_memo_max_age = absl::ZeroDuration();
};

// Counters since the Client was made (a snapshot).
struct ClientStats {
  int64_t calls = 0;           // public method calls
  int64_t rpcs = 0;            // RPC attempts sent
  int64_t batch_rpcs = 0;      // of which Batch* RPCs
  int64_t retries = 0;         // attempts after the first
  int64_t failed_calls = 0;    // calls that returned an error
  int64_t auto_batches = 0;    // batches formed by auto-batching
  int64_t auto_batched_items = 0;
  int64_t endpoints_marked_down = 0;
  int64_t connect_failures = 0;  // attempts that found no connection (no RPC sent)
  std::map<std::string, int64_t> rpcs_by_endpoint;
  int64_t retry_info_waits = 0;  // retries after a pause the server asked for (RetryInfo)
  int64_t token_refreshes = 0;   // times `token_provider` was asked
  // The memos (all zero for a memo that is off). A hit is a call, or a batch item, answered with
  // no RPC (for a batch: not sent).
  MemoStats verify_memo;
  MemoStats derive_memo;
  MemoStats open_memo;
  // Serialized request (and response) message bytes of the calls and batch items the memos
  // answered: what did not travel.
  int64_t memo_bytes_not_sent = 0;
  int64_t memo_bytes_not_received = 0;
};

class EndpointSet;
struct Endpoint;
template <typename Item, typename Result>
class Coalescer;

class Client final {
 public:
  // InvalidArgument for malformed `options` (endpoints string, non-positive timeout...).
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // --- Keys (routed by `key_id`; ListKeys goes to the endpoint of the empty routing key).
  absl::StatusOr<v1::KeyInfo> CreateKey(absl::string_view key_id, v1::KeyType type,
                                        const v1::KeyOptions& options = {});
  // `secret`: see ImportKeyRequest (32-byte seed / scalar / key, or 64-byte Ed25519 secret key).
  absl::StatusOr<v1::KeyInfo> ImportKey(absl::string_view key_id, v1::KeyType type,
                                        absl::string_view secret,
                                        const v1::KeyOptions& options = {});
  absl::StatusOr<v1::KeyInfo> GetKey(absl::string_view key_id);
  absl::StatusOr<v1::ListKeysResponse> ListKeys();
  absl::StatusOr<v1::KeyInfo> RotateKey(absl::string_view key_id);

  // Key lifecycle (offload/v1/keys.proto). DeleteKey schedules the key's destruction after the
  // server's --key_deletion_wait, or after `wait` when that is longer (zero: the server's wait;
  // rounded up to whole seconds; shorter than the server's is INVALID_ARGUMENT). Until then the
  // key refuses every operation (FAILED_PRECONDITION) and CancelKeyDeletion brings it back. The
  // answer holds the destruction time and the key as it is now (no key: the server's wait is 0
  // and the key is gone at once). A retry after a lost answer says FAILED_PRECONDITION (already
  // scheduled), as CreateKey's says ALREADY_EXISTS.
  absl::StatusOr<v1::DeleteKeyResponse> DeleteKey(absl::string_view key_id, absl::Duration wait);
  // DeleteKey with the server's wait, for callers of the call that used to delete at once.
  absl::Status DeleteKey(absl::string_view key_id);
  absl::StatusOr<v1::KeyInfo> CancelKeyDeletion(absl::string_view key_id);
  // A disabled key refuses every operation and keeps its material; no-ops in the state asked.
  absl::StatusOr<v1::KeyInfo> DisableKey(absl::string_view key_id);
  absl::StatusOr<v1::KeyInfo> EnableKey(absl::string_view key_id);
  // `version`: an explicit version other than the current one (REQUIRES: version >= 1).
  absl::StatusOr<v1::KeyInfo> DisableKeyVersion(absl::string_view key_id, uint32_t version);
  absl::StatusOr<v1::KeyInfo> EnableKeyVersion(absl::string_view key_id, uint32_t version);
  // A DISABLED version: its secret is wiped after the wait (as DeleteKey's `wait`) unless
  // RestoreKeyVersion comes first.
  absl::StatusOr<v1::KeyInfo> DestroyKeyVersion(absl::string_view key_id, uint32_t version,
                                                absl::Duration wait = absl::ZeroDuration());
  absl::StatusOr<v1::KeyInfo> RestoreKeyVersion(absl::string_view key_id, uint32_t version);
  // AEAD and X25519 keys: versions below `version` are refused for opening and deriving.
  absl::StatusOr<v1::KeyInfo> SetMinDecryptionVersion(absl::string_view key_id, uint32_t version);

  // --- Ed25519
  absl::StatusOr<v1::SignResponse> Sign(absl::string_view key_id, absl::string_view message);
  // Auto-batched. An invalid signature is OK with valid() == false.
  absl::StatusOr<v1::VerifyResponse> Verify(absl::string_view public_key,
                                            absl::string_view message,
                                            absl::string_view signature);
  absl::StatusOr<v1::BatchSignResponse> BatchSign(const v1::BatchSignRequest& request);
  absl::StatusOr<v1::BatchVerifyResponse> BatchVerify(const v1::BatchVerifyRequest& request);

  // --- X25519 (auto-batched). `key_version` 0 = current.
  absl::StatusOr<v1::DeriveResponse> Derive(absl::string_view key_id,
                                            absl::string_view peer_public_key,
                                            v1::DeriveOutput output = v1::DERIVE_OUTPUT_RAW,
                                            uint32_t key_version = 0);
  absl::StatusOr<v1::BatchDeriveResponse> BatchDerive(const v1::BatchDeriveRequest& request);

  // --- NaCl box. An empty `nonce` lets the service pick a random one.
  absl::StatusOr<v1::BoxSealResponse> BoxSeal(absl::string_view key_id,
                                              absl::string_view peer_public_key,
                                              absl::string_view plaintext,
                                              absl::string_view nonce = {});
  absl::StatusOr<v1::BoxOpenResponse> BoxOpen(absl::string_view key_id,
                                              absl::string_view peer_public_key,
                                              absl::string_view nonce,
                                              absl::string_view ciphertext,
                                              uint32_t key_version = 0);
  absl::StatusOr<v1::BatchBoxSealResponse> BatchBoxSeal(const v1::BatchBoxSealRequest& request);
  absl::StatusOr<v1::BatchBoxOpenResponse> BatchBoxOpen(const v1::BatchBoxOpenRequest& request);

  // --- AEAD envelopes. AeadOpen is auto-batched.
  absl::StatusOr<v1::AeadSealResponse> AeadSeal(absl::string_view key_id,
                                                absl::string_view plaintext,
                                                absl::string_view associated_data = {});
  absl::StatusOr<v1::AeadOpenResponse> AeadOpen(absl::string_view key_id,
                                                absl::string_view envelope,
                                                absl::string_view associated_data = {});
  absl::StatusOr<v1::BatchAeadSealResponse> BatchAeadSeal(const v1::BatchAeadSealRequest& request);
  absl::StatusOr<v1::BatchAeadOpenResponse> BatchAeadOpen(const v1::BatchAeadOpenRequest& request);
  // Opens `envelope` and seals its plaintext under the key's current version inside the service
  // (the plaintext never leaves it), with the same `associated_data`. Not auto-batched.
  absl::StatusOr<v1::AeadRewrapResponse> AeadRewrap(absl::string_view key_id,
                                                    absl::string_view envelope,
                                                    absl::string_view associated_data = {});
  absl::StatusOr<v1::BatchAeadRewrapResponse> BatchAeadRewrap(
      const v1::BatchAeadRewrapRequest& request);

  // Replaces the bearer token of every RPC started from now on (the one of ClientOptions at
  // first); an empty `token` sends none. For tokens that expire: refresh before they do. RPCs in
  // flight keep the token they were sent with. InvalidArgument (the previous token stays) for a
  // token CheckBearerToken refuses; the message never contains the token.
  absl::Status SetBearerToken(absl::string_view token) ABSL_LOCKS_EXCLUDED(token_mu_);

  // Drops (and wipes) every entry of every memo, e.g. when the process knows that keys changed.
  // Answers on their way when it is called are not remembered.
  void ResetMemos();

  // --- Introspection (tests, dashboards).
  // The routing key of Verify calls for `public_key`: "ed25519:" + lowercase hex.
  static std::string VerifyRoutingKey(absl::string_view public_key);
  // The endpoint a call with `routing_key` would go to now ("" when none is known).
  std::string RouteFor(absl::string_view routing_key);
  std::vector<std::string> Endpoints() const;
  bool IsEndpointDown(const std::string& address) const;
  ClientStats Stats() const;

 private:
  template <typename Req>
  struct Pending {
    std::string route;
    Req request;
    absl::Time deadline = absl::InfiniteFuture();
  };

  explicit Client(ClientOptions options, std::unique_ptr<EndpointSet> endpoints);

  // The "authorization" metadata value for RPCs started now ("Bearer <token>"), or null.
  std::shared_ptr<const std::string> Authorization() const ABSL_LOCKS_EXCLUDED(token_mu_);

  // Runs `rpc(endpoint, context)` with the retry policy; `route` picks the endpoint (unless
  // `preferred`, an endpoint address, is given and usable) and is sent as x-offload-key.
  // `deadline` bounds every wait for a connection, attempt and backoff.
  template <typename Rpc>
  absl::Status Invoke(absl::string_view route, absl::string_view preferred, absl::Time deadline,
                      bool batch, Rpc rpc);
  // Invoke for one unary RPC within the default timeout, returning its response:
  // `call(endpoint, context, response*)` returns the grpc::Status of the stub call.
  template <typename Response, typename Call>
  absl::StatusOr<Response> InvokeUnary(absl::string_view route, Call call);
  // Splits an explicit batch by endpoint and size, runs `rpc` per chunk, merges in order.
  template <typename BatchReq, typename BatchResp, typename RouteOf, typename Rpc>
  absl::StatusOr<BatchResp> SplitBatch(const BatchReq& request, RouteOf route_of, Rpc rpc);
  // A KeyVersionRequest for `key_id`, `version` and `wait` (DeleteKey's), sent with
  // `rpc(stub, context, request, response*)`. `refuses`: on success the key refuses something
  // it did not before, so its memo entries are dropped.
  template <typename Rpc>
  absl::StatusOr<v1::KeyInfo> KeyVersionCall(absl::string_view key_id, uint32_t version,
                                             absl::Duration wait, bool refuses, Rpc rpc);
  // Runs one public call: counts it (calls, failed_calls) and keeps the destructor waiting.
  template <typename Fn>
  auto Run(Fn fn) -> decltype(fn());

  // Asks `token_provider` for a token and installs it, unless the token in use is no longer
  // `used` (another call replaced it meanwhile). One provider call at a time.
  absl::Status RefreshToken(const std::shared_ptr<const std::string>& used)
      ABSL_LOCKS_EXCLUDED(refresh_mu_, token_mu_);
  // After a call naming `key_id` ended with `status`: a refusal about the key (NOT_FOUND,
  // FAILED_PRECONDITION, PERMISSION_DENIED) drops its entries from the derive and open memos.
  void NoteKeyStatus(absl::string_view key_id, const absl::Status& status);
  void NoteKeyCode(absl::string_view key_id, int code);
  // Drops `key_id`'s entries from the derive and open memos.
  void DropKey(absl::string_view key_id);
  // Counts a memo answer's bytes that did not travel.
  void CountNotSent(size_t request_bytes, size_t response_bytes);
  // After an explicit batch of key-named items: drops the entries of each key that an item error
  // (or the whole call's status) refused. Returns `result`.
  template <typename BatchReq, typename BatchResp>
  absl::StatusOr<BatchResp> NoteBatchRefusals(const BatchReq& request,
                                              absl::StatusOr<BatchResp> result);
  // The single calls as sent (auto-batched or not), after the memo missed.
  absl::StatusOr<v1::VerifyResponse> SendVerify(absl::string_view public_key,
                                                absl::string_view message,
                                                absl::string_view signature);
  absl::StatusOr<v1::DeriveResponse> SendDerive(absl::string_view key_id,
                                                absl::string_view peer_public_key,
                                                v1::DeriveOutput output, uint32_t key_version);
  absl::StatusOr<v1::AeadOpenResponse> SendOpen(absl::string_view key_id,
                                                absl::string_view envelope,
                                                absl::string_view associated_data);
  // The explicit batches, as sent (after the memo).
  absl::StatusOr<v1::BatchVerifyResponse> SendBatchVerify(const v1::BatchVerifyRequest& request);
  absl::StatusOr<v1::BatchDeriveResponse> SendBatchDerive(const v1::BatchDeriveRequest& request);
  absl::StatusOr<v1::BatchAeadOpenResponse> SendBatchOpen(const v1::BatchAeadOpenRequest& request);

  const ClientOptions options_;
  const std::unique_ptr<EndpointSet> endpoints_;
  // The memos (null when off) and the keyed digests that name their entries.
  const MemoDigester digester_;
  std::unique_ptr<Memo> verify_memo_;
  std::unique_ptr<Memo> derive_memo_;
  std::unique_ptr<Memo> open_memo_;
  std::atomic<int64_t> memo_bytes_not_sent_{0};
  std::atomic<int64_t> memo_bytes_not_received_{0};
  std::unique_ptr<Coalescer<Pending<v1::VerifyRequest>, v1::VerifyResponse>> verify_batcher_;
  std::unique_ptr<Coalescer<Pending<v1::DeriveRequest>, v1::DeriveResponse>> derive_batcher_;
  std::unique_ptr<Coalescer<Pending<v1::AeadOpenRequest>, v1::AeadOpenResponse>> open_batcher_;

  // Per-call bookkeeping is lock-free, so that many threads entering at once do not queue on a
  // mutex before they can join a batch.
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> failed_calls_{0};
  mutable absl::Mutex mu_;
  ClientStats stats_ ABSL_GUARDED_BY(mu_);  // per-RPC counters

  // Held shared by RPCs while their context takes a copy; wiped when the last holder lets go.
  mutable absl::Mutex token_mu_;
  std::shared_ptr<const std::string> authorization_ ABSL_GUARDED_BY(token_mu_);
  // Held while `token_provider` runs, so that callers refused together ask it once.
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_BEFORE(token_mu_);
};

}  // namespace offload::client

#endif  // CLIENT_CPP_CLIENT_H_
