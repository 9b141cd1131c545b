// EndpointSet: the replicas a Client talks to, which of them are usable, and one gRPC channel each.
//
// Endpoints come from a list ("127.0.0.1:5001,127.0.0.1:5002") or from a DNS name with several
// addresses ("dns:offload-headless.ns.svc:50051", as a Kubernetes headless Service publishes),
// resolved with getaddrinfo at creation, every `dns_refresh`, and soon (at most once a second)
// after an endpoint failed. Hashing names a resolved endpoint by "ip:port" ("[ip6]:port").
//
// An endpoint that failed is marked down for a backoff that doubles on each consecutive failure
// (from `down_initial` to `down_max`) and resets on success; while down, `Pick` skips it, so its
// keys go to their next-highest endpoint. It is usable again when the backoff has passed, or -
// when the failure was a lost or refused connection - as soon as its channel is connected again:
// the channel is told to reconnect when the failure is reported and then redials by itself with
// gRPC's backoff (`reconnect_initial` x1.6 up to `reconnect_max`, each attempt allowed
// `connect_timeout`), so a restarted replica gets its keys back about `reconnect_max` after it
// listens. (gRPC makes progress on a connection attempt only while some thread polls for it: any
// call in flight does; with none, gRPC's backup poller runs every 5 s.) When every endpoint is
// down, `Pick` ignores the marks.
//
// Thread-safe. Endpoints are handed out as shared_ptr, so a DNS refresh that drops one never
// pulls a channel from under a call in progress. A refresh runs on the calling thread of the
// `Pick` that finds it due (one at a time; others keep using the previous list).
#ifndef CLIENT_CPP_ENDPOINTS_H_
#define CLIENT_CPP_ENDPOINTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/box.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"

namespace offload::client {

// What an endpoints string says: a fixed list, or a DNS name and port to resolve.
struct EndpointSpec {
  std::vector<std::string> addresses;  // fixed list (empty for DNS)
  std::string dns_host;                // non-empty for "dns:host:port"
  std::string dns_port;
};

// Parses "host:port[,host:port...]" or "dns:host:port" (also "dns:///host:port").
// InvalidArgument for an empty string, an empty item or an item without a port.
[[nodiscard]] absl::StatusOr<EndpointSpec> ParseEndpoints(absl::string_view spec);

// Every TCP address of `host` (getaddrinfo), as sorted unique "ip:port" / "[ip6]:port".
// Unavailable when the name does not resolve.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host,
                                                                   const std::string& port);

// One replica: its hashing name, channel and stubs. Immutable once made.
struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KeyService::Stub> keys;
  std::unique_ptr<v1::Ed25519Service::Stub> ed25519;
  std::unique_ptr<v1::X25519Service::Stub> x25519;
  std::unique_ptr<v1::BoxService::Stub> box;
  std::unique_ptr<v1::AeadService::Stub> aead;
};

struct EndpointSetOptions {
  absl::Duration down_initial = absl::Milliseconds(500);
  absl::Duration down_max = absl::Seconds(30);
  absl::Duration dns_refresh = absl::Seconds(30);
  // The channels' reconnection: first redial `reconnect_initial` after a failed connection
  // attempt, then x1.6 (+-20 % jitter) up to `reconnect_max`; one attempt (TCP, TLS, the server's
  // HTTP/2 SETTINGS) may take `connect_timeout`.
  absl::Duration reconnect_initial = absl::Milliseconds(25);
  absl::Duration reconnect_max = absl::Seconds(1);
  absl::Duration connect_timeout = absl::Seconds(1);
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure
  // With `credentials`: the name the server certificates must carry. Empty: the host of a listed
  // endpoint, the name of a "dns:" spec (not the address it resolved to).
  std::string tls_server_name;
  int max_message_bytes = 64 << 20;
};

class EndpointSet final {
 public:
  // InvalidArgument for a malformed `spec`. A DNS name that does not resolve yet is not an error:
  // calls fail with UNAVAILABLE until it does (re-resolved at most once a second meanwhile).
  static absl::StatusOr<std::unique_ptr<EndpointSet>> Create(absl::string_view spec,
                                                             EndpointSetOptions options);

  // The endpoint for routing key `key` (rendezvous hashing over the usable endpoints; over all of
  // them when none is usable), or the endpoint named `preferred` when it is known and usable (an
  // auto-batch goes where it was grouped). `*alternative` (when not null) says whether another
  // usable endpoint exists, i.e. whether a failure here could fail over. Unavailable when no
  // endpoint is known.
  absl::StatusOr<std::shared_ptr<const Endpoint>> Pick(absl::string_view key,
                                                       absl::string_view preferred = {},
                                                       bool* alternative = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A call to `address` failed with UNAVAILABLE, or found no connection: mark it down for its
  // backoff. `connection`: the channel was not connected (refused, lost, timed out), so it is
  // usable again as soon as it reconnects; the channel is told to reconnect now. Otherwise (the
  // server itself answered UNAVAILABLE) only the backoff brings it back.
  void ReportFailure(const std::string& address, bool connection) ABSL_LOCKS_EXCLUDED(mu_);
  // A call to `address` got an answer: clear its failure count, unless it is marked down by a
  // server's UNAVAILABLE more recent than this call could know (concurrent calls).
  void ReportSuccess(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `address` failed recently (marked down, possibly usable again, not yet succeeded).
  bool HasFailed(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);

  // The current endpoint addresses (sorted) and those among them marked down right now.
  std::vector<std::string> Addresses() const ABSL_LOCKS_EXCLUDED(mu_);
  // Marked down and not usable again yet.
  bool IsDown(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t marked_down() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Health {
    int failures = 0;
    absl::Time down_until = absl::InfinitePast();
    bool connection = false;  // the last failure was the channel's, not the server's answer
  };

  // Whether an endpoint with `health` (null: never failed) may be picked at `now`.
  static bool Usable(const Health* health, const Endpoint& endpoint, absl::Time now);

  EndpointSet(EndpointSpec spec, EndpointSetOptions options);
  std::shared_ptr<const Endpoint> MakeEndpoint(const std::string& address, bool resolved) const;
  // Replaces the endpoint list with `addresses`, keeping existing channels.
  void SetAddresses(const std::vector<std::string>& addresses, bool resolved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-resolves the DNS name when due; may release and re-take mu_.
  void MaybeRefresh(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EndpointSpec spec_;
  const EndpointSetOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);  // sorted
  std::vector<std::shared_ptr<const Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);  // same order
  absl::flat_hash_map<std::string, Health> health_ ABSL_GUARDED_BY(mu_);
  absl::Time last_resolve_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_resolve_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool resolving_ ABSL_GUARDED_BY(mu_) = false;
  int64_t marked_down_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace offload::client

#endif  // CLIENT_CPP_ENDPOINTS_H_
