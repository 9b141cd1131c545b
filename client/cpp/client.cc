#include "client/cpp/client.h"

#include <sodium.h>

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/coalescer.h"
#include "client/cpp/credentials.h"
#include "client/cpp/endpoints.h"
#include "grpcpp/generic/generic_stub.h"

namespace offload::client {
namespace {

constexpr char kRouteHeader[] = "x-offload-key";
constexpr char kAuthorizationHeader[] = "authorization";
// What the connection probe calls (ConnectionError): harmless should it reach a server.
constexpr char kProbeMethod[] = "/grpc.health.v1.Health/Check";

absl::Status ToStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::Status ItemError(const v1::ItemStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

// Metadata values must be printable ASCII; other routing keys (never valid key ids) are not sent.
bool HeaderSafe(absl::string_view v) {
  return !v.empty() &&
         std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

absl::Duration Backoff(const ClientOptions& o, int retry) {
  absl::Duration d = o.initial_backoff;
  for (int i = 0; i < retry && d < o.max_backoff; ++i) d *= 2;
  d = std::min(d, o.max_backoff);
  thread_local absl::BitGen gen;
  // "Equal jitter": half fixed, half random, so retries of many callers spread out.
  return d / 2 + absl::Uniform(gen, 0.0, 1.0) * (d / 2);
}

const char* StateName(grpc_connectivity_state s) {
  switch (s) {
    case GRPC_CHANNEL_IDLE: return "IDLE";
    case GRPC_CHANNEL_CONNECTING: return "CONNECTING";
    case GRPC_CHANNEL_READY: return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE: return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN: return "SHUTDOWN";
  }
  return "UNKNOWN";
}

// Why the last connection attempt of `channel`, in TRANSIENT_FAILURE, failed, in gRPC's words
// ("" if it connected meanwhile): gRPC fails a fail-fast RPC on such a channel at once, inside the
// process, with that attempt's error. Should the channel connect first, the probe is a health
// check, which changes nothing. Returns by `until` at the latest.
std::string ConnectionError(const std::shared_ptr<grpc::Channel>& channel, absl::Time until) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(until));
  grpc::CompletionQueue cq;
  grpc::Slice empty;
  const grpc::ByteBuffer request(&empty, 1);  // an empty HealthCheckRequest: the whole server
  grpc::ByteBuffer response;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&ctx, kProbeMethod, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, &ctx);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (status.ok() || status.error_code() != grpc::StatusCode::UNAVAILABLE) return std::string();
  return status.error_message();
}

// Whether a connection error is TLS refusing the server (a certificate our CAs do not trust, or
// without the name we expect; a peer that does not speak TLS, "wrong version number"):
// redialling does not mend that. gRPC 1.51's words.
bool IsTlsFailure(absl::string_view error) {
  return absl::StrContains(error, "Ssl handshake failed") ||
         absl::StrContains(error, "is not in peer certificate");
}

// Waits until `channel` is connected, at most until `until`; `*state` is its last state. With
// `give_up_on_failure`, stops at the first failed attempt (TRANSIENT_FAILURE) instead of waiting
// for the channel's next redial. Otherwise each failed attempt's error goes to `*error`, and a
// TLS failure (IsTlsFailure) ends the wait. Waiting polls a completion queue, and that is what
// moves gRPC's connection attempt along (nothing else may be polling).
bool WaitConnected(const std::shared_ptr<grpc::Channel>& channel, absl::Time until,
                   bool give_up_on_failure, grpc_connectivity_state* state, std::string* error) {
  *state = channel->GetState(/*try_to_connect=*/true);
  while (*state != GRPC_CHANNEL_READY) {
    if (*state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      if (give_up_on_failure) return false;
      *error = ConnectionError(channel, until);
      if (IsTlsFailure(*error)) return false;
    }
    if (absl::Now() >= until) return false;
    channel->WaitForStateChange(*state, absl::ToChronoTime(until));
    *state = channel->GetState(/*try_to_connect=*/true);  // an IDLE channel redials
  }
  return true;
}

// "Bearer <token>", wiped when the last RPC holding it lets go; null for no token.
std::shared_ptr<const std::string> MakeAuthorization(absl::string_view token) {
  if (token.empty()) return nullptr;
  return std::shared_ptr<const std::string>(
      new std::string(absl::StrCat("Bearer ", token)), [](std::string* value) {
        sodium_memzero(value->data(), value->size());
        delete value;
      });
}

// The deadline of a batch: its earliest caller's.
template <typename Items>
absl::Time EarliestDeadline(const Items& items) {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& it : items) t = std::min(t, it.deadline);
  return t;
}

// A deletion wait as the request's whole seconds, rounded up (0: the server's wait).
absl::StatusOr<int64_t> WaitSeconds(absl::Duration wait) {
  if (wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait: expected >= 0, got ", absl::FormatDuration(wait)));
  }
  if (wait == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("wait: expected a finite duration, got inf");
  }
  return absl::ToInt64Seconds(absl::Ceil(wait, absl::Seconds(1)));
}

// Connection failovers of one call beyond which it waits on its endpoint instead (a bound for
// pathological settings, e.g. endpoint_down_initial = 0, where marks never hold).
constexpr int kMaxConnectFailovers = 16;

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (sodium_init() < 0) return absl::InternalError("sodium_init failed");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout: expected > 0, got ", absl::FormatDuration(options.timeout)));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "connect_timeout: expected > 0, got ", absl::FormatDuration(options.connect_timeout)));
  }
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial_backoff, max_backoff: expected 0 < initial <= max, got ",
        absl::FormatDuration(options.initial_backoff), ", ",
        absl::FormatDuration(options.max_backoff)));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: expected >= 1, got ", options.max_attempts));
  }
  if (options.server_max_batch_items < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server_max_batch_items: expected >= 1, got ", options.server_max_batch_items));
  }
  options.max_batch_items =
      std::clamp(options.max_batch_items, 1, options.server_max_batch_items);
  if (options.batch_window < absl::ZeroDuration()) options.batch_window = absl::ZeroDuration();
  if (options.max_batches_in_flight < 0) options.max_batches_in_flight = 0;
  std::string token;
  token.swap(options.bearer_token);  // kept only as the Client's authorization value
  absl::Cleanup wipe_token = [&token] {
    if (!token.empty()) sodium_memzero(token.data(), token.size());
  };
  if (!token.empty()) {
    absl::Status s = CheckBearerToken("bearer_token", token);
    if (!s.ok()) return s;
  }
  EndpointSetOptions eo;
  eo.down_initial = options.endpoint_down_initial;
  eo.down_max = options.endpoint_down_max;
  eo.dns_refresh = options.dns_refresh;
  eo.reconnect_initial = options.initial_backoff;
  eo.reconnect_max = options.max_backoff;
  eo.connect_timeout = options.connect_timeout;
  eo.credentials = options.credentials;
  eo.tls_server_name = options.tls_server_name;
  auto endpoints = EndpointSet::Create(options.endpoints, eo);
  if (!endpoints.ok()) return endpoints.status();
  std::unique_ptr<Client> client(new Client(std::move(options), std::move(*endpoints)));
  {
    absl::MutexLock lock(&client->token_mu_);
    client->authorization_ = MakeAuthorization(token);
  }
  return client;
}

absl::Status Client::SetBearerToken(absl::string_view token) {
  if (!token.empty()) {
    absl::Status s = CheckBearerToken("bearer_token", token);
    if (!s.ok()) return s;
  }
  std::shared_ptr<const std::string> next = MakeAuthorization(token);
  absl::MutexLock lock(&token_mu_);
  authorization_.swap(next);
  return absl::OkStatus();  // the previous value is released (and wiped) after the unlock
}

std::shared_ptr<const std::string> Client::Authorization() const {
  absl::ReaderMutexLock lock(&token_mu_);
  return authorization_;
}

Client::Client(ClientOptions options, std::unique_ptr<EndpointSet> endpoints)
    : options_(std::move(options)), endpoints_(std::move(endpoints)) {
  const absl::Duration window = options_.batch_window;
  const int max = options_.max_batch_items;

  verify_batcher_ = std::make_unique<Coalescer<Pending<v1::VerifyRequest>, v1::VerifyResponse>>(
      window, max, options_.max_batches_in_flight,
      [this](const std::string& group, std::vector<Pending<v1::VerifyRequest>>& items)
          -> absl::StatusOr<std::vector<absl::StatusOr<v1::VerifyResponse>>> {
        v1::BatchVerifyRequest req;
        for (auto& it : items) *req.add_items() = std::move(it.request);
        v1::BatchVerifyResponse resp;
        absl::Status s = Invoke(items[0].route, group, EarliestDeadline(items), true,
                                [&](const Endpoint& e, grpc::ClientContext* ctx) {
                                  resp.Clear();
                                  return e.ed25519->BatchVerify(ctx, req, &resp);
                                });
        if (!s.ok()) return s;
        std::vector<absl::StatusOr<v1::VerifyResponse>> out;
        out.reserve(resp.results_size());
        for (const auto& r : resp.results()) {
          if (r.status().code() != 0) {
            out.emplace_back(ItemError(r.status()));
          } else {
            v1::VerifyResponse v;
            v.set_valid(r.valid());
            v.set_memo_hit(r.memo_hit());
            out.emplace_back(std::move(v));
          }
        }
        return out;
      });

  derive_batcher_ = std::make_unique<Coalescer<Pending<v1::DeriveRequest>, v1::DeriveResponse>>(
      window, max, options_.max_batches_in_flight,
      [this](const std::string& group, std::vector<Pending<v1::DeriveRequest>>& items)
          -> absl::StatusOr<std::vector<absl::StatusOr<v1::DeriveResponse>>> {
        v1::BatchDeriveRequest req;
        for (auto& it : items) *req.add_items() = std::move(it.request);
        v1::BatchDeriveResponse resp;
        absl::Status s = Invoke(items[0].route, group, EarliestDeadline(items), true,
                                [&](const Endpoint& e, grpc::ClientContext* ctx) {
                                  resp.Clear();
                                  return e.x25519->BatchDerive(ctx, req, &resp);
                                });
        if (!s.ok()) return s;
        std::vector<absl::StatusOr<v1::DeriveResponse>> out;
        out.reserve(resp.results_size());
        for (auto& r : *resp.mutable_results()) {
          if (r.status().code() != 0) {
            out.emplace_back(ItemError(r.status()));
          } else {
            out.emplace_back(std::move(*r.mutable_response()));
          }
        }
        return out;
      });

  open_batcher_ =
      std::make_unique<Coalescer<Pending<v1::AeadOpenRequest>, v1::AeadOpenResponse>>(
          window, max, options_.max_batches_in_flight,
          [this](const std::string& group, std::vector<Pending<v1::AeadOpenRequest>>& items)
              -> absl::StatusOr<std::vector<absl::StatusOr<v1::AeadOpenResponse>>> {
            v1::BatchAeadOpenRequest req;
            for (auto& it : items) *req.add_items() = std::move(it.request);
            v1::BatchAeadOpenResponse resp;
            absl::Status s = Invoke(items[0].route, group, EarliestDeadline(items), true,
                                    [&](const Endpoint& e, grpc::ClientContext* ctx) {
                                      resp.Clear();
                                      return e.aead->BatchOpen(ctx, req, &resp);
                                    });
            if (!s.ok()) return s;
            std::vector<absl::StatusOr<v1::AeadOpenResponse>> out;
            out.reserve(resp.results_size());
            for (auto& r : *resp.mutable_results()) {
              if (r.status().code() != 0) {
                out.emplace_back(ItemError(r.status()));
              } else {
                out.emplace_back(std::move(*r.mutable_response()));
              }
            }
            return out;
          });
}

Client::~Client() {
  // REQUIRES says no call starts now; wait for those still running (rare: a short poll).
  while (in_flight_.load(std::memory_order_acquire) != 0) absl::SleepFor(absl::Milliseconds(1));
}

template <typename Fn>
auto Client::Run(Fn fn) -> decltype(fn()) {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto result = fn();
  if (!result.ok()) failed_calls_.fetch_add(1, std::memory_order_relaxed);
  in_flight_.fetch_sub(1, std::memory_order_release);
  return result;
}

template <typename Rpc>
absl::Status Client::Invoke(absl::string_view route, absl::string_view preferred,
                            absl::Time deadline, bool batch, Rpc rpc) {
  absl::Status last = absl::UnavailableError("no attempt made");
  std::string last_address;
  int sent = 0;               // RPCs sent: at most max_attempts
  int backoffs = 0;           // pauses before going back to the same endpoint
  int connect_failovers = 0;  // endpoints left because they had no connection
  while (sent < options_.max_attempts) {
    bool alternative = false;
    auto endpoint = endpoints_->Pick(route, preferred, &alternative);
    if (!last_address.empty() && (!endpoint.ok() || (*endpoint)->address == last_address)) {
      // Same endpoint again (or none known): back off first. A failover goes at once.
      const absl::Duration pause = Backoff(options_, backoffs++);
      if (absl::Now() + pause >= deadline) break;
      absl::SleepFor(pause);
      endpoint = endpoints_->Pick(route, preferred, &alternative);
    }
    if (!endpoint.ok()) {
      last = endpoint.status();
      last_address = "?";  // back off before asking again
      continue;
    }
    const Endpoint& e = **endpoint;

    // A connection first. With somewhere to fail over to, an endpoint that failed recently is
    // left at once unless connected, and a fresh one gets `connect_timeout`; with nowhere else to
    // go, the call waits for this endpoint until its deadline while the channel redials (every
    // max_backoff at most), so a server that comes up in time is reached.
    grpc_connectivity_state state = e.channel->GetState(/*try_to_connect=*/true);
    if (state != GRPC_CHANNEL_READY) {
      const bool failover = alternative && connect_failovers < kMaxConnectFailovers;
      absl::Time until = deadline;
      if (failover) {
        until = endpoints_->HasFailed(e.address)
                    ? absl::InfinitePast()
                    : std::min(deadline, absl::Now() + options_.connect_timeout);
      }
      std::string error;
      if (!WaitConnected(e.channel, until, /*give_up_on_failure=*/failover, &state, &error)) {
        {
          absl::MutexLock lock(&mu_);
          ++stats_.connect_failures;
        }
        endpoints_->ReportFailure(e.address, /*connection=*/true);
        last_address = e.address;
        std::string what = absl::StrCat(e.address, ": no connection (channel ",
                                        StateName(state), ")");
        if (!error.empty()) absl::StrAppend(&what, ": ", error);
        // TLS refused the peer: nowhere else to go, and waiting does not mend it.
        if (IsTlsFailure(error)) return absl::UnavailableError(what);
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(
              sent == 0 ? absl::StrCat("deadline exceeded: ", what)
                        : absl::StrCat("deadline exceeded: ", what, "; before: ", last.message()));
        }
        last = absl::UnavailableError(what);
        if (failover) ++connect_failovers;
        continue;
      }
    }

    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    if (HeaderSafe(route)) ctx.AddMetadata(kRouteHeader, std::string(route));
    if (std::shared_ptr<const std::string> auth = Authorization()) {
      ctx.AddMetadata(kAuthorizationHeader, *auth);
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.rpcs;
      if (batch) ++stats_.batch_rpcs;
      if (sent > 0) ++stats_.retries;
      ++stats_.rpcs_by_endpoint[e.address];
    }
    ++sent;
    const grpc::Status s = rpc(e, &ctx);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      endpoints_->ReportSuccess(e.address);
      return ToStatus(s);
    }
    // Not connected any more: the connection was lost (the server went away); still connected:
    // the server itself said UNAVAILABLE.
    const bool connection =
        e.channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    endpoints_->ReportFailure(e.address, connection);
    last = absl::UnavailableError(absl::StrCat(e.address, ": ", s.error_message()));
    last_address = e.address;
  }
  return last;
}

template <typename Response, typename Call>
absl::StatusOr<Response> Client::InvokeUnary(absl::string_view route, Call call) {
  Response response;
  absl::Status s = Invoke(route, {}, absl::Now() + options_.timeout, false,
                          [&](const Endpoint& e, grpc::ClientContext* ctx) {
                            response.Clear();  // a retry starts from an empty response
                            return call(e, ctx, &response);
                          });
  if (!s.ok()) return s;
  return response;
}

template <typename BatchReq, typename BatchResp, typename RouteOf, typename Rpc>
absl::StatusOr<BatchResp> Client::SplitBatch(const BatchReq& request, RouteOf route_of, Rpc rpc) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  const int n = request.items_size();
  if (n == 0) {  // the server owns the answer to an empty batch
    BatchResp resp;
    absl::Status s = Invoke("", {}, deadline, true, [&](const Endpoint& e, grpc::ClientContext* ctx) {
      resp.Clear();
      return rpc(e, ctx, request, &resp);
    });
    if (!s.ok()) return s;
    return resp;
  }
  std::map<std::string, std::vector<int>> groups;
  for (int i = 0; i < n; ++i) groups[RouteFor(route_of(request.items(i)))].push_back(i);
  BatchResp out;
  for (int i = 0; i < n; ++i) out.add_results();
  const size_t chunk = static_cast<size_t>(options_.server_max_batch_items);
  for (const auto& [address, indices] : groups) {
    for (size_t begin = 0; begin < indices.size(); begin += chunk) {
      const size_t end = std::min(indices.size(), begin + chunk);
      BatchReq sub;
      for (size_t k = begin; k < end; ++k) *sub.add_items() = request.items(indices[k]);
      BatchResp resp;
      // To the endpoint the chunk was grouped for (its first item's route only if that one is
      // down by now).
      absl::Status s = Invoke(route_of(sub.items(0)), address, deadline, true,
                              [&](const Endpoint& e, grpc::ClientContext* ctx) {
                                resp.Clear();
                                return rpc(e, ctx, sub, &resp);
                              });
      if (!s.ok()) return s;
      if (resp.results_size() != static_cast<int>(end - begin)) {
        return absl::InternalError(absl::StrCat("batch answer: expected ", end - begin,
                                                " results, got ", resp.results_size()));
      }
      for (size_t k = begin; k < end; ++k) {
        out.mutable_results(indices[k])->Swap(resp.mutable_results(static_cast<int>(k - begin)));
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Keys

absl::StatusOr<v1::KeyInfo> Client::CreateKey(absl::string_view key_id, v1::KeyType type,
                                              const v1::KeyOptions& options) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::CreateKeyRequest req;
    req.set_key_id(std::string(key_id));
    req.set_type(type);
    *req.mutable_options() = options;
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::KeyInfo* resp) {
      return e.keys->CreateKey(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::KeyInfo> Client::ImportKey(absl::string_view key_id, v1::KeyType type,
                                              absl::string_view secret,
                                              const v1::KeyOptions& options) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::ImportKeyRequest req;
    req.set_key_id(std::string(key_id));
    req.set_type(type);
    req.set_secret(std::string(secret));
    *req.mutable_options() = options;
    v1::KeyInfo resp;
    absl::Status s = Invoke(key_id, {}, absl::Now() + options_.timeout, false,
                            [&](const Endpoint& e, grpc::ClientContext* ctx) {
                              return e.keys->ImportKey(ctx, req, &resp);
                            });
    std::string* copy = req.mutable_secret();
    if (!copy->empty()) sodium_memzero(copy->data(), copy->size());
    if (!s.ok()) return s;
    return resp;
  });
}

absl::StatusOr<v1::KeyInfo> Client::GetKey(absl::string_view key_id) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::GetKeyRequest req;
    req.set_key_id(std::string(key_id));
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::KeyInfo* resp) {
      return e.keys->GetKey(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::ListKeysResponse> Client::ListKeys() {
  return Run([&]() -> absl::StatusOr<v1::ListKeysResponse> {
    v1::ListKeysRequest req;
    return InvokeUnary<v1::ListKeysResponse>("", [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::ListKeysResponse* resp) {
      return e.keys->ListKeys(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::KeyInfo> Client::RotateKey(absl::string_view key_id) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::RotateKeyRequest req;
    req.set_key_id(std::string(key_id));
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::KeyInfo* resp) {
      return e.keys->RotateKey(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::DeleteKeyResponse> Client::DeleteKey(absl::string_view key_id,
                                                        absl::Duration wait) {
  return Run([&]() -> absl::StatusOr<v1::DeleteKeyResponse> {
    v1::DeleteKeyRequest req;
    req.set_key_id(std::string(key_id));
    absl::StatusOr<int64_t> wait_seconds = WaitSeconds(wait);
    if (!wait_seconds.ok()) return wait_seconds.status();
    req.set_wait_seconds(*wait_seconds);
    return InvokeUnary<v1::DeleteKeyResponse>(
        key_id, [&](const Endpoint& e, grpc::ClientContext* ctx, v1::DeleteKeyResponse* resp) {
          return e.keys->DeleteKey(ctx, req, resp);
        });
  });
}

absl::Status Client::DeleteKey(absl::string_view key_id) {
  return DeleteKey(key_id, absl::ZeroDuration()).status();
}

absl::StatusOr<v1::KeyInfo> Client::CancelKeyDeletion(absl::string_view key_id) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::CancelKeyDeletionRequest req;
    req.set_key_id(std::string(key_id));
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                v1::KeyInfo* resp) {
      return e.keys->CancelKeyDeletion(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::KeyInfo> Client::DisableKey(absl::string_view key_id) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::DisableKeyRequest req;
    req.set_key_id(std::string(key_id));
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                v1::KeyInfo* resp) {
      return e.keys->DisableKey(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::KeyInfo> Client::EnableKey(absl::string_view key_id) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::EnableKeyRequest req;
    req.set_key_id(std::string(key_id));
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                v1::KeyInfo* resp) {
      return e.keys->EnableKey(ctx, req, resp);
    });
  });
}

template <typename Rpc>
absl::StatusOr<v1::KeyInfo> Client::KeyVersionCall(absl::string_view key_id, uint32_t version,
                                                   absl::Duration wait, Rpc rpc) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::KeyVersionRequest req;
    req.set_key_id(std::string(key_id));
    req.set_version(version);
    absl::StatusOr<int64_t> wait_seconds = WaitSeconds(wait);
    if (!wait_seconds.ok()) return wait_seconds.status();
    req.set_wait_seconds(*wait_seconds);
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                v1::KeyInfo* resp) {
      return rpc(*e.keys, ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::KeyInfo> Client::DisableKeyVersion(absl::string_view key_id,
                                                      uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(),
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.DisableKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::EnableKeyVersion(absl::string_view key_id, uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(),
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.EnableKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::DestroyKeyVersion(absl::string_view key_id, uint32_t version,
                                                      absl::Duration wait) {
  return KeyVersionCall(key_id, version, wait,
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.DestroyKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::RestoreKeyVersion(absl::string_view key_id,
                                                      uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(),
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.RestoreKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::SetMinDecryptionVersion(absl::string_view key_id,
                                                            uint32_t version) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::SetMinDecryptionVersionRequest req;
    req.set_key_id(std::string(key_id));
    req.set_min_decryption_version(version);
    return InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                v1::KeyInfo* resp) {
      return e.keys->SetMinDecryptionVersion(ctx, req, resp);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Ed25519

absl::StatusOr<v1::SignResponse> Client::Sign(absl::string_view key_id,
                                              absl::string_view message) {
  return Run([&]() -> absl::StatusOr<v1::SignResponse> {
    v1::SignRequest req;
    req.set_key_id(std::string(key_id));
    req.set_message(std::string(message));
    return InvokeUnary<v1::SignResponse>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::SignResponse* resp) {
      return e.ed25519->Sign(ctx, req, resp);
    });
  });
}

std::string Client::VerifyRoutingKey(absl::string_view public_key) {
  return absl::StrCat("ed25519:", absl::BytesToHexString(public_key));
}

absl::StatusOr<v1::VerifyResponse> Client::Verify(absl::string_view public_key,
                                                  absl::string_view message,
                                                  absl::string_view signature) {
  return Run([&]() -> absl::StatusOr<v1::VerifyResponse> {
    Pending<v1::VerifyRequest> p;
    p.route = VerifyRoutingKey(public_key);
    p.request.set_public_key(std::string(public_key));
    p.request.set_message(std::string(message));
    p.request.set_signature(std::string(signature));
    if (options_.auto_batch) {
      const std::string group = RouteFor(p.route);
      p.deadline = absl::Now() + options_.timeout;
      const absl::Time deadline = p.deadline;
      return verify_batcher_->Submit(group, std::move(p), deadline);
    }
    return InvokeUnary<v1::VerifyResponse>(p.route, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::VerifyResponse* resp) {
      return e.ed25519->Verify(ctx, p.request, resp);
    });
  });
}

absl::StatusOr<v1::BatchSignResponse> Client::BatchSign(const v1::BatchSignRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchSignRequest, v1::BatchSignResponse>(
        request, [](const v1::SignRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchSignRequest& req,
           v1::BatchSignResponse* resp) { return e.ed25519->BatchSign(ctx, req, resp); });
  });
}

absl::StatusOr<v1::BatchVerifyResponse> Client::BatchVerify(
    const v1::BatchVerifyRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchVerifyRequest, v1::BatchVerifyResponse>(
        request, [](const v1::VerifyRequest& r) { return VerifyRoutingKey(r.public_key()); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchVerifyRequest& req,
           v1::BatchVerifyResponse* resp) { return e.ed25519->BatchVerify(ctx, req, resp); });
  });
}

// ---------------------------------------------------------------------------------------------
// X25519

absl::StatusOr<v1::DeriveResponse> Client::Derive(absl::string_view key_id,
                                                  absl::string_view peer_public_key,
                                                  v1::DeriveOutput output, uint32_t key_version) {
  return Run([&]() -> absl::StatusOr<v1::DeriveResponse> {
    Pending<v1::DeriveRequest> p;
    p.route = std::string(key_id);
    p.request.set_key_id(std::string(key_id));
    p.request.set_key_version(key_version);
    p.request.set_peer_public_key(std::string(peer_public_key));
    p.request.set_output(output);
    if (options_.auto_batch) {
      const std::string group = RouteFor(p.route);
      p.deadline = absl::Now() + options_.timeout;
      const absl::Time deadline = p.deadline;
      return derive_batcher_->Submit(group, std::move(p), deadline);
    }
    return InvokeUnary<v1::DeriveResponse>(p.route, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::DeriveResponse* resp) {
      return e.x25519->Derive(ctx, p.request, resp);
    });
  });
}

absl::StatusOr<v1::BatchDeriveResponse> Client::BatchDerive(
    const v1::BatchDeriveRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchDeriveRequest, v1::BatchDeriveResponse>(
        request, [](const v1::DeriveRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchDeriveRequest& req,
           v1::BatchDeriveResponse* resp) { return e.x25519->BatchDerive(ctx, req, resp); });
  });
}

// ---------------------------------------------------------------------------------------------
// Box

absl::StatusOr<v1::BoxSealResponse> Client::BoxSeal(absl::string_view key_id,
                                                    absl::string_view peer_public_key,
                                                    absl::string_view plaintext,
                                                    absl::string_view nonce) {
  return Run([&]() -> absl::StatusOr<v1::BoxSealResponse> {
    v1::BoxSealRequest req;
    req.set_key_id(std::string(key_id));
    req.set_peer_public_key(std::string(peer_public_key));
    req.set_nonce(std::string(nonce));
    req.set_plaintext(std::string(plaintext));
    return InvokeUnary<v1::BoxSealResponse>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::BoxSealResponse* resp) {
      return e.box->Seal(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::BoxOpenResponse> Client::BoxOpen(absl::string_view key_id,
                                                    absl::string_view peer_public_key,
                                                    absl::string_view nonce,
                                                    absl::string_view ciphertext,
                                                    uint32_t key_version) {
  return Run([&]() -> absl::StatusOr<v1::BoxOpenResponse> {
    v1::BoxOpenRequest req;
    req.set_key_id(std::string(key_id));
    req.set_key_version(key_version);
    req.set_peer_public_key(std::string(peer_public_key));
    req.set_nonce(std::string(nonce));
    req.set_ciphertext(std::string(ciphertext));
    return InvokeUnary<v1::BoxOpenResponse>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::BoxOpenResponse* resp) {
      return e.box->Open(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::BatchBoxSealResponse> Client::BatchBoxSeal(
    const v1::BatchBoxSealRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchBoxSealRequest, v1::BatchBoxSealResponse>(
        request, [](const v1::BoxSealRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchBoxSealRequest& req,
           v1::BatchBoxSealResponse* resp) { return e.box->BatchSeal(ctx, req, resp); });
  });
}

absl::StatusOr<v1::BatchBoxOpenResponse> Client::BatchBoxOpen(
    const v1::BatchBoxOpenRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchBoxOpenRequest, v1::BatchBoxOpenResponse>(
        request, [](const v1::BoxOpenRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchBoxOpenRequest& req,
           v1::BatchBoxOpenResponse* resp) { return e.box->BatchOpen(ctx, req, resp); });
  });
}

// ---------------------------------------------------------------------------------------------
// AEAD

absl::StatusOr<v1::AeadSealResponse> Client::AeadSeal(absl::string_view key_id,
                                                      absl::string_view plaintext,
                                                      absl::string_view associated_data) {
  return Run([&]() -> absl::StatusOr<v1::AeadSealResponse> {
    v1::AeadSealRequest req;
    req.set_key_id(std::string(key_id));
    req.set_plaintext(std::string(plaintext));
    req.set_associated_data(std::string(associated_data));
    return InvokeUnary<v1::AeadSealResponse>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::AeadSealResponse* resp) {
      return e.aead->Seal(ctx, req, resp);
    });
  });
}

absl::StatusOr<v1::AeadOpenResponse> Client::AeadOpen(absl::string_view key_id,
                                                      absl::string_view envelope,
                                                      absl::string_view associated_data) {
  return Run([&]() -> absl::StatusOr<v1::AeadOpenResponse> {
    Pending<v1::AeadOpenRequest> p;
    p.route = std::string(key_id);
    p.request.set_key_id(std::string(key_id));
    p.request.set_envelope(std::string(envelope));
    p.request.set_associated_data(std::string(associated_data));
    if (options_.auto_batch) {
      const std::string group = RouteFor(p.route);
      p.deadline = absl::Now() + options_.timeout;
      const absl::Time deadline = p.deadline;
      return open_batcher_->Submit(group, std::move(p), deadline);
    }
    return InvokeUnary<v1::AeadOpenResponse>(p.route, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::AeadOpenResponse* resp) {
      return e.aead->Open(ctx, p.request, resp);
    });
  });
}

absl::StatusOr<v1::BatchAeadSealResponse> Client::BatchAeadSeal(
    const v1::BatchAeadSealRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchAeadSealRequest, v1::BatchAeadSealResponse>(
        request, [](const v1::AeadSealRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadSealRequest& req,
           v1::BatchAeadSealResponse* resp) { return e.aead->BatchSeal(ctx, req, resp); });
  });
}

absl::StatusOr<v1::BatchAeadOpenResponse> Client::BatchAeadOpen(
    const v1::BatchAeadOpenRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchAeadOpenRequest, v1::BatchAeadOpenResponse>(
        request, [](const v1::AeadOpenRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadOpenRequest& req,
           v1::BatchAeadOpenResponse* resp) { return e.aead->BatchOpen(ctx, req, resp); });
  });
}

absl::StatusOr<v1::AeadRewrapResponse> Client::AeadRewrap(absl::string_view key_id,
                                                          absl::string_view envelope,
                                                          absl::string_view associated_data) {
  return Run([&]() -> absl::StatusOr<v1::AeadRewrapResponse> {
    v1::AeadRewrapRequest req;
    req.set_key_id(std::string(key_id));
    req.set_envelope(std::string(envelope));
    req.set_associated_data(std::string(associated_data));
    return InvokeUnary<v1::AeadRewrapResponse>(
        key_id, [&](const Endpoint& e, grpc::ClientContext* ctx, v1::AeadRewrapResponse* resp) {
          return e.aead->Rewrap(ctx, req, resp);
        });
  });
}

absl::StatusOr<v1::BatchAeadRewrapResponse> Client::BatchAeadRewrap(
    const v1::BatchAeadRewrapRequest& request) {
  return Run([&] {
    return SplitBatch<v1::BatchAeadRewrapRequest, v1::BatchAeadRewrapResponse>(
        request, [](const v1::AeadRewrapRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadRewrapRequest& req,
           v1::BatchAeadRewrapResponse* resp) { return e.aead->BatchRewrap(ctx, req, resp); });
  });
}

// ---------------------------------------------------------------------------------------------
// Introspection

std::string Client::RouteFor(absl::string_view routing_key) {
  auto e = endpoints_->Pick(routing_key);
  return e.ok() ? (*e)->address : std::string();
}

std::vector<std::string> Client::Endpoints() const { return endpoints_->Addresses(); }

bool Client::IsEndpointDown(const std::string& address) const {
  return endpoints_->IsDown(address);
}

ClientStats Client::Stats() const {
  ClientStats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  s.calls = calls_.load();
  s.failed_calls = failed_calls_.load();
  for (const CoalescerStats& c :
       {verify_batcher_->stats(), derive_batcher_->stats(), open_batcher_->stats()}) {
    s.auto_batches += c.batches;
    s.auto_batched_items += c.items;
  }
  s.endpoints_marked_down = endpoints_->marked_down();
  return s;
}

}  // namespace offload::client
