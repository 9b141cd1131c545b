#include "client/cpp/endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/cpp/rendezvous.h"

namespace offload::client {
namespace {

constexpr absl::Duration kMinResolveInterval = absl::Seconds(1);

// A duration as whole milliseconds for a channel argument, at least 1.
int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

// Splits "host:port" / "[v6]:port" at the last colon; false when there is no port.
bool SplitHostPort(absl::string_view s, std::string* host, std::string* port) {
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == s.size()) return false;
  *host = std::string(s.substr(0, colon));
  *port = std::string(s.substr(colon + 1));
  return std::all_of(port->begin(), port->end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

absl::StatusOr<EndpointSpec> ParseEndpoints(absl::string_view spec) {
  spec = absl::StripAsciiWhitespace(spec);
  if (spec.empty()) return absl::InvalidArgumentError("endpoints: expected host:port[,...], got ''");
  EndpointSpec out;
  if (absl::ConsumePrefix(&spec, "dns:")) {
    absl::ConsumePrefix(&spec, "///");
    if (!SplitHostPort(spec, &out.dns_host, &out.dns_port) || absl::StrContains(spec, ',')) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoints: expected dns:host:port, got 'dns:", spec, "'"));
    }
    return out;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::string host, port;
    if (!SplitHostPort(item, &host, &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoints: expected host:port in each item, got '", item, "'"));
    }
    out.addresses.emplace_back(item);
  }
  std::sort(out.addresses.begin(), out.addresses.end());
  out.addresses.erase(std::unique(out.addresses.begin(), out.addresses.end()), out.addresses.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host,
                                                     const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving ", host, ":", port, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {0};
    if (ai->ai_family == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
      inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat(ip, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(ai->ai_addr);
      inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip));
      out.push_back(absl::StrCat("[", ip, "]:", port));
    }
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) return absl::UnavailableError(absl::StrCat("no address for ", host));
  return out;
}

absl::StatusOr<std::unique_ptr<EndpointSet>> EndpointSet::Create(absl::string_view spec,
                                                                  EndpointSetOptions options) {
  auto parsed = ParseEndpoints(spec);
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<EndpointSet> set(new EndpointSet(std::move(*parsed), std::move(options)));
  absl::MutexLock lock(&set->mu_);
  if (set->spec_.dns_host.empty()) {
    set->SetAddresses(set->spec_.addresses, /*resolved=*/false);
  } else {
    set->MaybeRefresh(absl::Now());
  }
  return set;
}

EndpointSet::EndpointSet(EndpointSpec spec, EndpointSetOptions options)
    : spec_(std::move(spec)), options_(std::move(options)) {}

std::shared_ptr<const Endpoint> EndpointSet::MakeEndpoint(const std::string& address,
                                                          bool resolved) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // the Client retries, across endpoints
  // Redial soon and often enough that a replica which comes back is found within about
  // `reconnect_max`; gRPC names the time one attempt may take "min reconnect backoff".
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(options_.reconnect_initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              std::max(Millis(options_.reconnect_max), Millis(options_.reconnect_initial)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(options_.connect_timeout));
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A resolved address is dialled as is; a listed one may be a name gRPC resolves itself.
  std::string target = address;
  if (resolved) target = absl::StrCat(address[0] == '[' ? "ipv6:" : "ipv4:", address);
  auto creds = options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  if (options_.credentials != nullptr) {
    const std::string& name = !options_.tls_server_name.empty() ? options_.tls_server_name
                              : resolved                         ? spec_.dns_host
                                                                 : std::string();
    if (!name.empty()) args.SetSslTargetNameOverride(name);
  }
  auto e = std::make_shared<Endpoint>();
  e->address = address;
  e->channel = grpc::CreateCustomChannel(target, creds, args);
  e->keys = v1::KeyService::NewStub(e->channel);
  e->ed25519 = v1::Ed25519Service::NewStub(e->channel);
  e->x25519 = v1::X25519Service::NewStub(e->channel);
  e->box = v1::BoxService::NewStub(e->channel);
  e->aead = v1::AeadService::NewStub(e->channel);
  return e;
}

void EndpointSet::SetAddresses(const std::vector<std::string>& addresses, bool resolved) {
  std::vector<std::shared_ptr<const Endpoint>> next;
  next.reserve(addresses.size());
  for (const std::string& a : addresses) {
    auto it = std::lower_bound(addresses_.begin(), addresses_.end(), a);
    if (it != addresses_.end() && *it == a) {
      next.push_back(endpoints_[it - addresses_.begin()]);
    } else {
      next.push_back(MakeEndpoint(a, resolved));
    }
  }
  addresses_ = addresses;
  endpoints_ = std::move(next);
  for (auto it = health_.begin(); it != health_.end();) {
    auto cur = it++;
    if (!std::binary_search(addresses_.begin(), addresses_.end(), cur->first)) health_.erase(cur);
  }
}

void EndpointSet::MaybeRefresh(absl::Time now) {
  if (spec_.dns_host.empty() || resolving_ || now < next_resolve_) return;
  resolving_ = true;
  mu_.Unlock();
  auto resolved = ResolveHost(spec_.dns_host, spec_.dns_port);
  mu_.Lock();
  resolving_ = false;
  last_resolve_ = absl::Now();
  if (resolved.ok()) {
    SetAddresses(*resolved, /*resolved=*/true);
    next_resolve_ = last_resolve_ + options_.dns_refresh;
  } else {
    // Keep the last good list; try again soon.
    next_resolve_ = last_resolve_ + kMinResolveInterval;
  }
}

bool EndpointSet::Usable(const Health* health, const Endpoint& endpoint, absl::Time now) {
  if (health == nullptr || health->down_until <= now) return true;
  // Reconnected since a connection failure: back at once (reading the state is cheap).
  return health->connection &&
         endpoint.channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
}

absl::StatusOr<std::shared_ptr<const Endpoint>> EndpointSet::Pick(absl::string_view key,
                                                                 absl::string_view preferred,
                                                                 bool* alternative) {
  const absl::Time now = absl::Now();
  if (!spec_.dns_host.empty()) {
    bool due;
    {
      absl::ReaderMutexLock lock(&mu_);
      due = !resolving_ && now >= next_resolve_;
    }
    if (due) {
      absl::MutexLock lock(&mu_);
      MaybeRefresh(now);
    }
  }
  // The common path only reads: a shared lock, so concurrent callers do not queue.
  absl::ReaderMutexLock lock(&mu_);
  if (endpoints_.empty()) {
    return absl::UnavailableError(
        spec_.dns_host.empty() ? std::string("no endpoints")
                               : absl::StrCat("no address for ", spec_.dns_host, " yet"));
  }
  std::vector<bool> usable(addresses_.size(), true);
  int usable_count = 0;
  for (size_t i = 0; i < addresses_.size(); ++i) {
    if (!health_.empty()) {
      auto it = health_.find(addresses_[i]);
      usable[i] = Usable(it == health_.end() ? nullptr : &it->second, *endpoints_[i], now);
    }
    usable_count += usable[i] ? 1 : 0;
  }
  int i = -1;
  if (!preferred.empty()) {
    auto it = std::lower_bound(addresses_.begin(), addresses_.end(), preferred);
    if (it != addresses_.end() && *it == preferred && usable[it - addresses_.begin()]) {
      i = static_cast<int>(it - addresses_.begin());
    }
  }
  if (i < 0) i = PickEndpoint(key, addresses_, usable_count > 0 ? usable : std::vector<bool>());
  if (alternative != nullptr) *alternative = usable_count - (usable[i] ? 1 : 0) > 0;
  return endpoints_[i];
}

void EndpointSet::ReportFailure(const std::string& address, bool connection) {
  std::shared_ptr<const Endpoint> endpoint;
  {
    absl::MutexLock lock(&mu_);
    auto pos = std::lower_bound(addresses_.begin(), addresses_.end(), address);
    if (pos == addresses_.end() || *pos != address) return;
    endpoint = endpoints_[pos - addresses_.begin()];
    Health& h = health_[address];
    const absl::Time now = absl::Now();
    if (h.down_until > now) {
      // Already down: concurrent failures count once. A server's own UNAVAILABLE outranks a
      // connection failure (it keeps the endpoint out even while connected).
      h.connection = h.connection && connection;
    } else {
      absl::Duration backoff = options_.down_initial;
      for (int i = 0; i < h.failures && backoff < options_.down_max; ++i) backoff *= 2;
      h.failures++;
      h.down_until = now + std::min(backoff, options_.down_max);
      h.connection = connection;
      ++marked_down_;
    }
    // Its address may have changed (a rescheduled pod): re-resolve soon.
    next_resolve_ = std::min(next_resolve_, last_resolve_ + kMinResolveInterval);
  }
  // An idle channel (its connection was lost) starts redialling now, in gRPC's threads; one in
  // TRANSIENT_FAILURE is already redialling on its backoff.
  if (connection) endpoint->channel->GetState(/*try_to_connect=*/true);
}

void EndpointSet::ReportSuccess(const std::string& address) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!health_.contains(address)) return;  // the common case: nothing to clear
  }
  absl::MutexLock lock(&mu_);
  auto it = health_.find(address);
  if (it != health_.end() && (it->second.connection || it->second.down_until <= absl::Now())) {
    health_.erase(it);
  }
}

bool EndpointSet::HasFailed(const std::string& address) const {
  absl::ReaderMutexLock lock(&mu_);
  return health_.contains(address);
}

std::vector<std::string> EndpointSet::Addresses() const {
  absl::ReaderMutexLock lock(&mu_);
  return addresses_;
}

bool EndpointSet::IsDown(const std::string& address) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = health_.find(address);
  if (it == health_.end()) return false;
  auto pos = std::lower_bound(addresses_.begin(), addresses_.end(), address);
  if (pos == addresses_.end() || *pos != address) return false;
  return !Usable(&it->second, *endpoints_[pos - addresses_.begin()], absl::Now());
}

int64_t EndpointSet::marked_down() const {
  absl::MutexLock lock(&mu_);
  return marked_down_;
}

}  // namespace offload::client
