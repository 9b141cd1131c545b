#include "client/cpp/client.h"

#include <sodium.h>

#include <algorithm>
#include <optional>
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
#include "client/cpp/retry_info.h"
#include "google/protobuf/io/coded_stream.h"
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

// A refusal about the key itself: it is gone, disabled, pending deletion, retired (the version
// asked for, or the envelope's, below the minimum), or not ours to use.
bool IsKeyRefusal(int code) {
  return code == static_cast<int>(absl::StatusCode::kNotFound) ||
         code == static_cast<int>(absl::StatusCode::kFailedPrecondition) ||
         code == static_cast<int>(absl::StatusCode::kPermissionDenied);
}

// Routing keys that are key ids: key ids never hold ':' (Verify's "ed25519:<hex>" does) and are
// never empty (ListKeys' route is).
bool IsKeyIdRoute(absl::string_view route) {
  return !route.empty() && !absl::StrContains(route, ':');
}

// The serialized size of a length-delimited field of `n` bytes (tag, length, bytes); 0 when
// empty, which proto3 does not send.
size_t FieldSize(size_t n) {
  if (n == 0) return 0;
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(n) + n;
}

// The serialized size of a message of `n` bytes inside a repeated field (a batch item).
size_t ItemSize(size_t n) {
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(n) + n;
}

// A memo's bound and maximum age, checked when it is on.
absl::Status CheckMemoOptions(absl::string_view name, size_t bytes, absl::Duration max_age) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "_bytes: expected > 0 with ", name, " on, got 0"));
  }
  if (max_age <= absl::ZeroDuration() || max_age == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "_max_age: expected a finite duration > 0 with ", name,
        " on (the maximum age of an entry is the caller's to give), got ",
        absl::FormatDuration(max_age)));
  }
  return absl::OkStatus();
}

// A MemoOptions from a ClientOptions' figures.
MemoOptions MakeMemoOptions(size_t bytes, absl::Duration max_age) {
  MemoOptions o;
  o.capacity_bytes = bytes;
  o.max_age = max_age;
  return o;
}

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
  if (options.derive_memo) {
    absl::Status s = CheckMemoOptions("derive_memo", options.derive_memo_bytes,
                                      options.derive_memo_max_age);
    if (!s.ok()) return s;
  }
  if (options.open_memo) {
    absl::Status s =
        CheckMemoOptions("open_memo", options.open_memo_bytes, options.open_memo_max_age);
    if (!s.ok()) return s;
  }
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

absl::Status Client::RefreshToken(const std::shared_ptr<const std::string>& used) {
  absl::MutexLock lock(&refresh_mu_);
  if (Authorization() != used) return absl::OkStatus();  // replaced while this call waited
  {
    absl::MutexLock stats_lock(&mu_);
    ++stats_.token_refreshes;
  }
  absl::StatusOr<std::string> token = options_.token_provider();
  if (!token.ok()) {
    return absl::Status(token.status().code(),
                        absl::StrCat("token provider: ", token.status().message()));
  }
  absl::Status s = SetBearerToken(*token);
  WipeString(&*token);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("token provider: ", s.message()));
  return absl::OkStatus();
}

void Client::ResetMemos() {
  for (Memo* m : {verify_memo_.get(), derive_memo_.get(), open_memo_.get()}) {
    if (m != nullptr) m->Clear();
  }
}

void Client::DropKey(absl::string_view key_id) {
  if (derive_memo_ != nullptr) derive_memo_->DropOwner(key_id);
  if (open_memo_ != nullptr) open_memo_->DropOwner(key_id);
}

void Client::NoteKeyCode(absl::string_view key_id, int code) {
  if (IsKeyRefusal(code)) DropKey(key_id);
}

void Client::NoteKeyStatus(absl::string_view key_id, const absl::Status& status) {
  NoteKeyCode(key_id, static_cast<int>(status.code()));
}

void Client::CountNotSent(size_t request_bytes, size_t response_bytes) {
  memo_bytes_not_sent_.fetch_add(static_cast<int64_t>(request_bytes), std::memory_order_relaxed);
  memo_bytes_not_received_.fetch_add(static_cast<int64_t>(response_bytes),
                                     std::memory_order_relaxed);
}

Client::Client(ClientOptions options, std::unique_ptr<EndpointSet> endpoints)
    : options_(std::move(options)), endpoints_(std::move(endpoints)) {
  if (options_.verify_memo_bytes > 0) {
    verify_memo_ = std::make_unique<Memo>(
        MakeMemoOptions(options_.verify_memo_bytes, absl::InfiniteDuration()));
  }
  if (options_.derive_memo) {
    derive_memo_ = std::make_unique<Memo>(
        MakeMemoOptions(options_.derive_memo_bytes, options_.derive_memo_max_age));
  }
  if (options_.open_memo) {
    open_memo_ = std::make_unique<Memo>(
        MakeMemoOptions(options_.open_memo_bytes, options_.open_memo_max_age));
  }
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
  int sent = 0;               // RPCs sent: at most `budget`
  int budget = options_.max_attempts;  // one more after a token refreshed on UNAUTHENTICATED
  int backoffs = 0;           // pauses before going back to the same endpoint
  int connect_failovers = 0;  // endpoints left because they had no connection
  bool token_asked = false;   // token_provider asked for a first token by this call
  bool token_refreshed = false;  // ... and after a refusal UNAUTHENTICATED
  bool resend_at_once = false;   // the next attempt goes without a backoff (a fresh token)
  std::optional<absl::Duration> server_delay;  // RetryInfo of the last refusal
  while (sent < budget) {
    bool alternative = false;
    auto endpoint = endpoints_->Pick(route, preferred, &alternative);
    if (!resend_at_once && !last_address.empty() &&
        (!endpoint.ok() || (*endpoint)->address == last_address)) {
      // Same endpoint again (or none known): back off first, and at least for as long as the
      // server asked. A failover goes at once.
      thread_local absl::BitGen gen;
      absl::Duration pause = Backoff(options_, backoffs++);
      if (server_delay.has_value()) {
        pause = std::max(pause, RetryPause(*server_delay, options_.initial_backoff,
                                           absl::Uniform(gen, 0.0, 1.0)));
      }
      if (absl::Now() + pause >= deadline) break;
      absl::SleepFor(pause);
      if (server_delay.has_value()) {
        absl::MutexLock lock(&mu_);
        ++stats_.retry_info_waits;
      }
      endpoint = endpoints_->Pick(route, preferred, &alternative);
    }
    resend_at_once = false;
    server_delay.reset();
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

    std::shared_ptr<const std::string> auth = Authorization();
    if (auth == nullptr && options_.token_provider && !token_asked) {
      token_asked = true;
      absl::Status t = RefreshToken(nullptr);
      if (!t.ok()) return t;
      auth = Authorization();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    if (HeaderSafe(route)) ctx.AddMetadata(kRouteHeader, std::string(route));
    if (auth != nullptr) ctx.AddMetadata(kAuthorizationHeader, *auth);
    {
      absl::MutexLock lock(&mu_);
      ++stats_.rpcs;
      if (batch) ++stats_.batch_rpcs;
      if (sent > 0) ++stats_.retries;
      ++stats_.rpcs_by_endpoint[e.address];
    }
    ++sent;
    const grpc::Status s = rpc(e, &ctx);
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED && options_.token_provider &&
        !token_refreshed) {
      // Ask for a fresh token (unless another call already replaced the one refused) and send
      // this RPC once more with it, at once.
      endpoints_->ReportSuccess(e.address);
      token_refreshed = true;
      absl::Status t = RefreshToken(auth);
      if (!t.ok()) return t;
      ++budget;
      resend_at_once = true;
      last = ToStatus(s);
      last_address = e.address;
      continue;
    }
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // Overload. Retried only when the server said when: on the same endpoint (it is alive;
      // not marked down), after at least that delay. Otherwise, or when the delay would pass
      // the deadline or the attempts are spent, the refusal is the call's result as it is.
      endpoints_->ReportSuccess(e.address);
      last = ToStatus(s);
      server_delay = RetryDelay(s);
      if (!server_delay.has_value()) return last;
      last_address = e.address;
      continue;
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      endpoints_->ReportSuccess(e.address);
      return ToStatus(s);
    }
    server_delay = RetryDelay(s);  // a draining server may say when to come back
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
  if (!s.ok()) {
    if (IsKeyIdRoute(route)) NoteKeyStatus(route, s);  // a refusal about the key drops its entries
    return s;
  }
  return response;
}

namespace {

// The plaintexts a batch split copied into its per-endpoint requests (SplitBatch): zeroed once
// sent, as AeadSeal and BoxSeal zero theirs. Other batches carry no secret input.
template <typename BatchReq>
void WipeSecretInputs(BatchReq*) {}
void WipeSecretInputs(v1::BatchAeadSealRequest* r) {
  for (auto& item : *r->mutable_items()) WipeString(item.mutable_plaintext());
}
void WipeSecretInputs(v1::BatchBoxSealRequest* r) {
  for (auto& item : *r->mutable_items()) WipeString(item.mutable_plaintext());
}

}  // namespace

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
      WipeSecretInputs(&sub);  // its copies of seal plaintexts
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

template <typename BatchReq, typename BatchResp>
absl::StatusOr<BatchResp> Client::NoteBatchRefusals(const BatchReq& request,
                                                    absl::StatusOr<BatchResp> result) {
  if (derive_memo_ == nullptr && open_memo_ == nullptr) return result;
  if (!result.ok()) {
    if (!IsKeyRefusal(static_cast<int>(result.status().code()))) return result;
    std::vector<absl::string_view> keys;
    for (const auto& item : request.items()) keys.push_back(item.key_id());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (absl::string_view k : keys) DropKey(k);
    return result;
  }
  for (int i = 0; i < result->results_size() && i < request.items_size(); ++i) {
    NoteKeyCode(request.items(i).key_id(), result->results(i).status().code());
  }
  return result;
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
    auto r = InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                  v1::KeyInfo* resp) {
      return e.keys->CreateKey(ctx, req, resp);
    });
    // A new key under the id: whatever was remembered for it came from a key deleted since.
    if (r.ok()) DropKey(key_id);
    return r;
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
    DropKey(key_id);  // a new key under the id, as for CreateKey
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
    auto r = InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                       v1::KeyInfo* resp) {
      return e.keys->RotateKey(ctx, req, resp);
    });
    // Derives asked as "current" mean the new version from now on (as the TypeScript client
    // has it); rotations made elsewhere reach the memo within its maximum age.
    if (r.ok()) DropKey(key_id);
    return r;
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
    auto r = InvokeUnary<v1::DeleteKeyResponse>(
        key_id, [&](const Endpoint& e, grpc::ClientContext* ctx, v1::DeleteKeyResponse* resp) {
          return e.keys->DeleteKey(ctx, req, resp);
        });
    if (r.ok()) DropKey(key_id);  // the key refuses every call from now on
    return r;
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
    auto r = InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                  v1::KeyInfo* resp) {
      return e.keys->DisableKey(ctx, req, resp);
    });
    if (r.ok()) DropKey(key_id);  // the key refuses every call from now on
    return r;
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
                                                   absl::Duration wait, bool refuses, Rpc rpc) {
  return Run([&]() -> absl::StatusOr<v1::KeyInfo> {
    v1::KeyVersionRequest req;
    req.set_key_id(std::string(key_id));
    req.set_version(version);
    absl::StatusOr<int64_t> wait_seconds = WaitSeconds(wait);
    if (!wait_seconds.ok()) return wait_seconds.status();
    req.set_wait_seconds(*wait_seconds);
    auto r = InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                  v1::KeyInfo* resp) {
      return rpc(*e.keys, ctx, req, resp);
    });
    if (r.ok() && refuses) DropKey(key_id);  // a version the key refuses from now on
    return r;
  });
}

absl::StatusOr<v1::KeyInfo> Client::DisableKeyVersion(absl::string_view key_id,
                                                      uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(), /*refuses=*/true,
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.DisableKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::EnableKeyVersion(absl::string_view key_id, uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(), /*refuses=*/false,
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.EnableKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::DestroyKeyVersion(absl::string_view key_id, uint32_t version,
                                                      absl::Duration wait) {
  return KeyVersionCall(key_id, version, wait, /*refuses=*/true,
                        [](v1::KeyService::Stub& s, grpc::ClientContext* ctx,
                           const v1::KeyVersionRequest& req, v1::KeyInfo* resp) {
                          return s.DestroyKeyVersion(ctx, req, resp);
                        });
}

absl::StatusOr<v1::KeyInfo> Client::RestoreKeyVersion(absl::string_view key_id,
                                                      uint32_t version) {
  return KeyVersionCall(key_id, version, absl::ZeroDuration(), /*refuses=*/false,
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
    auto r = InvokeUnary<v1::KeyInfo>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                                  v1::KeyInfo* resp) {
      return e.keys->SetMinDecryptionVersion(ctx, req, resp);
    });
    if (r.ok()) DropKey(key_id);  // versions below it are refused from now on
    return r;
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
    std::optional<Memo::Digest> digest;
    uint64_t generation = 0;
    if (verify_memo_ != nullptr) {
      digest = digester_.Verify(public_key, signature, message);
      if (verify_memo_->Lookup(*digest, nullptr, nullptr)) {
        v1::VerifyResponse hit;
        hit.set_valid(true);
        hit.set_memo_hit(true);
        CountNotSent(FieldSize(public_key.size()) + FieldSize(message.size()) +
                         FieldSize(signature.size()),
                     hit.ByteSizeLong());
        return hit;
      }
      generation = verify_memo_->generation();
    }
    absl::StatusOr<v1::VerifyResponse> result = SendVerify(public_key, message, signature);
    if (digest.has_value() && result.ok() && result->valid()) {
      verify_memo_->Insert(*digest, {}, {}, 0, generation);  // valid answers only
    }
    return result;
  });
}

absl::StatusOr<v1::VerifyResponse> Client::SendVerify(absl::string_view public_key,
                                                      absl::string_view message,
                                                      absl::string_view signature) {
  {
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
  }
}

absl::StatusOr<v1::BatchSignResponse> Client::BatchSign(const v1::BatchSignRequest& request) {
  return Run([&] {
    return NoteBatchRefusals(
        request,
        SplitBatch<v1::BatchSignRequest, v1::BatchSignResponse>(
            request, [](const v1::SignRequest& r) { return r.key_id(); },
            [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchSignRequest& req,
               v1::BatchSignResponse* resp) { return e.ed25519->BatchSign(ctx, req, resp); }));
  });
}

absl::StatusOr<v1::BatchVerifyResponse> Client::SendBatchVerify(
    const v1::BatchVerifyRequest& request) {
  return SplitBatch<v1::BatchVerifyRequest, v1::BatchVerifyResponse>(
      request, [](const v1::VerifyRequest& r) { return VerifyRoutingKey(r.public_key()); },
      [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchVerifyRequest& req,
         v1::BatchVerifyResponse* resp) { return e.ed25519->BatchVerify(ctx, req, resp); });
}

absl::StatusOr<v1::BatchVerifyResponse> Client::BatchVerify(
    const v1::BatchVerifyRequest& request) {
  return Run([&]() -> absl::StatusOr<v1::BatchVerifyResponse> {
    const int n = request.items_size();
    if (verify_memo_ == nullptr || n == 0) return SendBatchVerify(request);
    // Memo first: only the items that missed are sent.
    std::vector<Memo::Digest> digests(n);
    std::vector<int> missed;
    v1::BatchVerifyRequest misses;
    v1::BatchVerifyResponse out;
    size_t not_sent = 0, not_received = 0;
    for (int i = 0; i < n; ++i) {
      const v1::VerifyRequest& item = request.items(i);
      digests[i] = digester_.Verify(item.public_key(), item.signature(), item.message());
      v1::BatchVerifyResult* r = out.add_results();
      if (verify_memo_->Lookup(digests[i], nullptr, nullptr)) {
        r->set_valid(true);
        r->set_memo_hit(true);
        not_sent += ItemSize(item.ByteSizeLong());
        not_received += ItemSize(r->ByteSizeLong());
      } else {
        missed.push_back(i);
        *misses.add_items() = item;
      }
    }
    CountNotSent(not_sent, not_received);
    if (missed.empty()) return out;
    const uint64_t generation = verify_memo_->generation();
    absl::StatusOr<v1::BatchVerifyResponse> sent = SendBatchVerify(misses);
    if (!sent.ok()) return sent.status();
    for (size_t k = 0; k < missed.size(); ++k) {
      v1::BatchVerifyResult* r = out.mutable_results(missed[k]);
      r->Swap(sent->mutable_results(static_cast<int>(k)));
      if (r->status().code() == 0 && r->valid()) {
        verify_memo_->Insert(digests[missed[k]], {}, {}, 0, generation);
      }
    }
    return out;
  });
}

// ---------------------------------------------------------------------------------------------
// X25519

absl::StatusOr<v1::DeriveResponse> Client::Derive(absl::string_view key_id,
                                                  absl::string_view peer_public_key,
                                                  v1::DeriveOutput output, uint32_t key_version) {
  return Run([&]() -> absl::StatusOr<v1::DeriveResponse> {
    std::optional<Memo::Digest> digest;
    uint64_t generation = 0;
    if (derive_memo_ != nullptr) {
      digest = digester_.Derive(key_id, key_version, output, peer_public_key);
      v1::DeriveResponse hit;
      uint32_t version = 0;
      if (derive_memo_->Lookup(*digest, hit.mutable_shared_key(), &version)) {
        hit.set_key_version(version);
        hit.set_memo_hit(true);
        v1::DeriveRequest req;
        req.set_key_version(key_version);
        req.set_output(output);
        CountNotSent(FieldSize(key_id.size()) + FieldSize(peer_public_key.size()) +
                         req.ByteSizeLong(),
                     hit.ByteSizeLong());
        return hit;
      }
      generation = derive_memo_->generation();
    }
    absl::StatusOr<v1::DeriveResponse> result =
        SendDerive(key_id, peer_public_key, output, key_version);
    if (!result.ok()) {
      NoteKeyStatus(key_id, result.status());
    } else if (digest.has_value()) {
      derive_memo_->Insert(*digest, key_id, result->shared_key(), result->key_version(),
                           generation);
    }
    return result;
  });
}

absl::StatusOr<v1::DeriveResponse> Client::SendDerive(absl::string_view key_id,
                                                      absl::string_view peer_public_key,
                                                      v1::DeriveOutput output,
                                                      uint32_t key_version) {
  {
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
  }
}

absl::StatusOr<v1::BatchDeriveResponse> Client::SendBatchDerive(
    const v1::BatchDeriveRequest& request) {
  return SplitBatch<v1::BatchDeriveRequest, v1::BatchDeriveResponse>(
      request, [](const v1::DeriveRequest& r) { return r.key_id(); },
      [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchDeriveRequest& req,
         v1::BatchDeriveResponse* resp) { return e.x25519->BatchDerive(ctx, req, resp); });
}

absl::StatusOr<v1::BatchDeriveResponse> Client::BatchDerive(
    const v1::BatchDeriveRequest& request) {
  return Run([&]() -> absl::StatusOr<v1::BatchDeriveResponse> {
    const int n = request.items_size();
    if (derive_memo_ == nullptr || n == 0) return NoteBatchRefusals(request, SendBatchDerive(request));
    std::vector<Memo::Digest> digests(n);
    std::vector<int> missed;
    v1::BatchDeriveRequest misses;
    v1::BatchDeriveResponse out;
    size_t not_sent = 0, not_received = 0;
    for (int i = 0; i < n; ++i) {
      const v1::DeriveRequest& item = request.items(i);
      digests[i] =
          digester_.Derive(item.key_id(), item.key_version(), item.output(), item.peer_public_key());
      v1::BatchDeriveResult* r = out.add_results();
      uint32_t version = 0;
      if (derive_memo_->Lookup(digests[i], r->mutable_response()->mutable_shared_key(),
                               &version)) {
        r->mutable_response()->set_key_version(version);
        r->mutable_response()->set_memo_hit(true);
        not_sent += ItemSize(item.ByteSizeLong());
        not_received += ItemSize(r->ByteSizeLong());
      } else {
        missed.push_back(i);
        *misses.add_items() = item;
      }
    }
    CountNotSent(not_sent, not_received);
    if (missed.empty()) return out;
    const uint64_t generation = derive_memo_->generation();
    absl::StatusOr<v1::BatchDeriveResponse> sent = SendBatchDerive(misses);
    if (!sent.ok()) return NoteBatchRefusals(misses, std::move(sent));
    for (size_t k = 0; k < missed.size(); ++k) {
      v1::BatchDeriveResult* r = out.mutable_results(missed[k]);
      r->Swap(sent->mutable_results(static_cast<int>(k)));
      if (r->status().code() == 0) {
        derive_memo_->Insert(digests[missed[k]], request.items(missed[k]).key_id(),
                             r->response().shared_key(), r->response().key_version(),
                             generation);
      }
    }
    return NoteBatchRefusals(request, absl::StatusOr<v1::BatchDeriveResponse>(std::move(out)));
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
    req.mutable_plaintext()->assign(plaintext.data(), plaintext.size());  // no temporary left unwiped
    auto r = InvokeUnary<v1::BoxSealResponse>(key_id, [&](const Endpoint& e,
                                                         grpc::ClientContext* ctx,
                                                         v1::BoxSealResponse* resp) {
      return e.box->Seal(ctx, req, resp);
    });
    WipeString(req.mutable_plaintext());  // the client's copy of the caller's secret
    return r;
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
    return NoteBatchRefusals(
        request,
        SplitBatch<v1::BatchBoxSealRequest, v1::BatchBoxSealResponse>(
            request, [](const v1::BoxSealRequest& r) { return r.key_id(); },
            [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchBoxSealRequest& req,
               v1::BatchBoxSealResponse* resp) { return e.box->BatchSeal(ctx, req, resp); }));
  });
}

absl::StatusOr<v1::BatchBoxOpenResponse> Client::BatchBoxOpen(
    const v1::BatchBoxOpenRequest& request) {
  return Run([&] {
    return NoteBatchRefusals(
        request,
        SplitBatch<v1::BatchBoxOpenRequest, v1::BatchBoxOpenResponse>(
            request, [](const v1::BoxOpenRequest& r) { return r.key_id(); },
            [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchBoxOpenRequest& req,
               v1::BatchBoxOpenResponse* resp) { return e.box->BatchOpen(ctx, req, resp); }));
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
    req.mutable_plaintext()->assign(plaintext.data(), plaintext.size());  // no temporary left unwiped
    req.set_associated_data(std::string(associated_data));
    const uint64_t generation = open_memo_ != nullptr ? open_memo_->generation() : 0;
    auto r = InvokeUnary<v1::AeadSealResponse>(key_id, [&](const Endpoint& e, grpc::ClientContext* ctx,
                                         v1::AeadSealResponse* resp) {
      return e.aead->Seal(ctx, req, resp);
    });
    WipeString(req.mutable_plaintext());
    if (r.ok() && open_memo_ != nullptr) {
      // An echo of this envelope costs nothing: what an open of it would answer.
      open_memo_->Insert(digester_.Open(key_id, r->envelope(), associated_data), key_id,
                         plaintext, r->key_version(), generation);
    }
    return r;
  });
}

absl::StatusOr<v1::AeadOpenResponse> Client::AeadOpen(absl::string_view key_id,
                                                      absl::string_view envelope,
                                                      absl::string_view associated_data) {
  return Run([&]() -> absl::StatusOr<v1::AeadOpenResponse> {
    std::optional<Memo::Digest> digest;
    uint64_t generation = 0;
    if (open_memo_ != nullptr) {
      digest = digester_.Open(key_id, envelope, associated_data);
      v1::AeadOpenResponse hit;
      uint32_t version = 0;
      if (open_memo_->Lookup(*digest, hit.mutable_plaintext(), &version)) {
        hit.set_key_version(version);
        hit.set_memo_hit(true);
        CountNotSent(FieldSize(key_id.size()) + FieldSize(envelope.size()) +
                         FieldSize(associated_data.size()),
                     hit.ByteSizeLong());
        return hit;
      }
      generation = open_memo_->generation();
    }
    absl::StatusOr<v1::AeadOpenResponse> result = SendOpen(key_id, envelope, associated_data);
    if (!result.ok()) {
      NoteKeyStatus(key_id, result.status());  // a failed open is never remembered
    } else if (digest.has_value()) {
      open_memo_->Insert(*digest, key_id, result->plaintext(), result->key_version(),
                         generation);
    }
    return result;
  });
}

absl::StatusOr<v1::AeadOpenResponse> Client::SendOpen(absl::string_view key_id,
                                                      absl::string_view envelope,
                                                      absl::string_view associated_data) {
  {
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
  }
}

absl::StatusOr<v1::BatchAeadSealResponse> Client::BatchAeadSeal(
    const v1::BatchAeadSealRequest& request) {
  return Run([&] {
    const uint64_t generation = open_memo_ != nullptr ? open_memo_->generation() : 0;
    auto r = SplitBatch<v1::BatchAeadSealRequest, v1::BatchAeadSealResponse>(
        request, [](const v1::AeadSealRequest& r) { return r.key_id(); },
        [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadSealRequest& req,
           v1::BatchAeadSealResponse* resp) { return e.aead->BatchSeal(ctx, req, resp); });
    if (r.ok() && open_memo_ != nullptr) {
      for (int i = 0; i < r->results_size() && i < request.items_size(); ++i) {
        const v1::BatchAeadSealResult& result = r->results(i);
        if (result.status().code() != 0) continue;
        const v1::AeadSealRequest& item = request.items(i);
        open_memo_->Insert(
            digester_.Open(item.key_id(), result.response().envelope(), item.associated_data()),
            item.key_id(), item.plaintext(), result.response().key_version(), generation);
      }
    }
    return NoteBatchRefusals(request, std::move(r));
  });
}

absl::StatusOr<v1::BatchAeadOpenResponse> Client::SendBatchOpen(
    const v1::BatchAeadOpenRequest& request) {
  return SplitBatch<v1::BatchAeadOpenRequest, v1::BatchAeadOpenResponse>(
      request, [](const v1::AeadOpenRequest& r) { return r.key_id(); },
      [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadOpenRequest& req,
         v1::BatchAeadOpenResponse* resp) { return e.aead->BatchOpen(ctx, req, resp); });
}

absl::StatusOr<v1::BatchAeadOpenResponse> Client::BatchAeadOpen(
    const v1::BatchAeadOpenRequest& request) {
  return Run([&]() -> absl::StatusOr<v1::BatchAeadOpenResponse> {
    const int n = request.items_size();
    if (open_memo_ == nullptr || n == 0) return NoteBatchRefusals(request, SendBatchOpen(request));
    std::vector<Memo::Digest> digests(n);
    std::vector<int> missed;
    v1::BatchAeadOpenRequest misses;
    v1::BatchAeadOpenResponse out;
    size_t not_sent = 0, not_received = 0;
    for (int i = 0; i < n; ++i) {
      const v1::AeadOpenRequest& item = request.items(i);
      digests[i] = digester_.Open(item.key_id(), item.envelope(), item.associated_data());
      v1::BatchAeadOpenResult* r = out.add_results();
      uint32_t version = 0;
      if (open_memo_->Lookup(digests[i], r->mutable_response()->mutable_plaintext(), &version)) {
        r->mutable_response()->set_key_version(version);
        r->mutable_response()->set_memo_hit(true);
        not_sent += ItemSize(item.ByteSizeLong());
        not_received += ItemSize(r->ByteSizeLong());
      } else {
        missed.push_back(i);
        *misses.add_items() = item;
      }
    }
    CountNotSent(not_sent, not_received);
    if (missed.empty()) return out;
    const uint64_t generation = open_memo_->generation();
    absl::StatusOr<v1::BatchAeadOpenResponse> sent = SendBatchOpen(misses);
    if (!sent.ok()) return NoteBatchRefusals(misses, std::move(sent));
    for (size_t k = 0; k < missed.size(); ++k) {
      v1::BatchAeadOpenResult* r = out.mutable_results(missed[k]);
      r->Swap(sent->mutable_results(static_cast<int>(k)));
      if (r->status().code() == 0) {  // failed opens are never remembered
        open_memo_->Insert(digests[missed[k]], request.items(missed[k]).key_id(),
                           r->response().plaintext(), r->response().key_version(), generation);
      }
    }
    return NoteBatchRefusals(request, absl::StatusOr<v1::BatchAeadOpenResponse>(std::move(out)));
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
    return NoteBatchRefusals(
        request,
        SplitBatch<v1::BatchAeadRewrapRequest, v1::BatchAeadRewrapResponse>(
            request, [](const v1::AeadRewrapRequest& r) { return r.key_id(); },
            [](const Endpoint& e, grpc::ClientContext* ctx, const v1::BatchAeadRewrapRequest& req,
               v1::BatchAeadRewrapResponse* resp) {
              return e.aead->BatchRewrap(ctx, req, resp);
            }));
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
  if (verify_memo_ != nullptr) s.verify_memo = verify_memo_->Stats();
  if (derive_memo_ != nullptr) s.derive_memo = derive_memo_->Stats();
  if (open_memo_ != nullptr) s.open_memo = open_memo_->Stats();
  s.memo_bytes_not_sent = memo_bytes_not_sent_.load(std::memory_order_relaxed);
  s.memo_bytes_not_received = memo_bytes_not_received_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace offload::client
