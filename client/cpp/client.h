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
// - Identity: TLS or mTLS through `credentials` (credentials.h makes them from PEM files), and a
//   bearer token sent as "authorization: Bearer <token>" metadata with every RPC, replaceable
//   while the client runs (SetBearerToken). A server certificate that TLS refuses (not signed by
//   our CAs, or without the expected name) is not waited out: the call fails over, or returns
//   UNAVAILABLE at once with gRPC's reason. (A server that refuses our certificate closes the
//   connection after the handshake under TLS 1.3: that looks like any lost connection.)
//
// Thread-safe: one Client is meant to be shared by every thread of a process. Destroying it
// waits for calls in progress (REQUIRES: no new call starts once destruction has begun).
#ifndef CLIENT_CPP_CLIENT_H_
#define CLIENT_CPP_CLIENT_H_

#include <atomic>
#include <cstdint>
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
  // `rpc(stub, context, request, response*)`.
  template <typename Rpc>
  absl::StatusOr<v1::KeyInfo> KeyVersionCall(absl::string_view key_id, uint32_t version,
                                             absl::Duration wait, Rpc rpc);
  // Runs one public call: counts it (calls, failed_calls) and keeps the destructor waiting.
  template <typename Fn>
  auto Run(Fn fn) -> decltype(fn());

  const ClientOptions options_;
  const std::unique_ptr<EndpointSet> endpoints_;
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
};

}  // namespace offload::client

#endif  // CLIENT_CPP_CLIENT_H_
