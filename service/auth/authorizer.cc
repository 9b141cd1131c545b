#include "service/auth/authorizer.h"

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "service/auth/tls.h"
#include "service/common/log.h"

namespace offload::auth {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

void CollectKeyIds(const Message& message, int depth, absl::flat_hash_set<std::string>* seen,
                   std::vector<std::string>* out) {
  if (depth > 4) return;
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const google::protobuf::Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_STRING && f->name() == "key_id" && !f->is_repeated()) {
      std::string id = r->GetString(message, f);
      if (seen->insert(id).second) out->push_back(std::move(id));
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        const int n = r->FieldSize(message, f);
        for (int j = 0; j < n; ++j) {
          CollectKeyIds(r->GetRepeatedMessage(message, f, j), depth + 1, seen, out);
        }
      } else if (r->HasField(message, f)) {
        CollectKeyIds(r->GetMessage(message, f), depth + 1, seen, out);
      }
    }
  }
}

absl::StatusOr<std::shared_ptr<const Policy>> ReadPolicy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("policy_file: cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<Policy> policy = Policy::Parse(text.str());
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_file ", path, ": ", policy.status().message()));
  }
  return std::make_shared<const Policy>(*std::move(policy));
}

std::string Iso8601Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

std::string Peer::ClientName() const {
  if (!identity.empty()) return identity;
  if (!forwarded_client.empty()) return forwarded_client;
  return Host();
}

std::string Peer::Host() const {
  // "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000" / "127.0.0.1" -> the host part.
  absl::string_view a = address;
  if (absl::StartsWith(a, "ipv4:") || absl::StartsWith(a, "ipv6:")) a.remove_prefix(5);
  if (!a.empty() && a.front() == '[') {
    const size_t end = a.find(']');
    return std::string(end == absl::string_view::npos ? a : a.substr(1, end - 1));
  }
  const size_t colon = a.rfind(':');
  if (colon != absl::string_view::npos && a.find(':') == colon) a = a.substr(0, colon);
  return std::string(a);
}

std::vector<std::string> KeyIdsOf(const Message& message) {
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> out;
  CollectKeyIds(message, 0, &seen, &out);
  return out;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(Options options) {
  if (!options.policy_file.empty() && !options.mtls && !options.tokens && !options.forwarded) {
    return absl::InvalidArgumentError(
        "policy_file: needs a source of identities (tls_client_ca_file, jwks_file or "
        "forwarded_identity_header), else callers have none");
  }
  std::unique_ptr<Authorizer> a(new Authorizer(std::move(options)));
  if (!a->options_.policy_file.empty()) {
    const int64_t stamp = FileFingerprint(a->options_.policy_file);
    absl::StatusOr<std::shared_ptr<const Policy>> policy = ReadPolicy(a->options_.policy_file);
    if (!policy.ok()) return policy.status();
    absl::MutexLock lock(&a->policy_mu_);
    a->policy_ = *std::move(policy);
    a->policy_stamp_ = stamp;
    a->policy_look_ = absl::Now();
  }
  if (!a->options_.audit_chain_key.empty() && a->options_.audit_file.empty()) {
    return absl::InvalidArgumentError("audit_chain_key_file: needs audit_log_file");
  }
  if (!a->options_.audit_file.empty()) {
    std::string last_line;  // a chain goes on from the file's last line
    if (!a->options_.audit_chain_key.empty()) {
      std::ifstream existing(a->options_.audit_file, std::ios::binary);
      for (std::string line; std::getline(existing, line);) {
        if (!line.empty()) last_line = std::move(line);
      }
    }
    a->audit_ = std::fopen(a->options_.audit_file.c_str(), "a");
    if (a->audit_ == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("audit_file: cannot open ", a->options_.audit_file, " for appending"));
    }
    if (!a->options_.audit_chain_key.empty()) {
      absl::MutexLock lock(&a->audit_mu_);
      a->chain_ = std::make_unique<AuditChain>(a->options_.audit_chain_key);
      a->chain_->Resume(last_line);
    }
  }
  return a;
}

Authorizer::~Authorizer() {
  if (audit_ != nullptr) std::fclose(audit_);
}

std::shared_ptr<const Policy> Authorizer::CurrentPolicy() {
  if (options_.policy_file.empty()) return nullptr;
  absl::MutexLock lock(&policy_mu_);
  const absl::Time now = absl::Now();
  if (now - policy_look_ < absl::Seconds(1)) return policy_;
  policy_look_ = now;
  const int64_t stamp = FileFingerprint(options_.policy_file);
  if (stamp == policy_stamp_) return policy_;
  policy_stamp_ = stamp;
  absl::StatusOr<std::shared_ptr<const Policy>> policy = ReadPolicy(options_.policy_file);
  if (!policy.ok()) {
    Log(LogLevel::kError, "policy_reload_failed",
        {{"error", std::string(policy.status().message())}, {"kept", "previous policy"}});
    return policy_;
  }
  policy_ = *std::move(policy);
  Log(LogLevel::kInfo, "policy_reloaded",
      {{"policy_file", options_.policy_file}, {"grants", policy_->grant_count()}});
  return policy_;
}

void Authorizer::Audit(absl::string_view event, nlohmann::json fields) {
  if (audit_ == nullptr) {
    fields["audit"] = true;
    Log(LogLevel::kInfo, event, std::move(fields));
    return;
  }
  nlohmann::ordered_json line;
  line["ts"] = Iso8601Now();
  line["event"] = std::string(event);
  for (auto& [k, v] : fields.items()) line[k] = v;
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  absl::MutexLock lock(&audit_mu_);
  if (chain_ != nullptr) text = chain_->Seal(text);
  std::fwrite(text.data(), 1, text.size(), audit_);
  std::fputc('\n', audit_);
  std::fflush(audit_);
}

absl::Status Authorizer::Authorize(const Peer& peer, absl::string_view path,
                                   const Message& request, absl::string_view transport) {
  if (!enforcing()) return absl::OkStatus();
  absl::StatusOr<Operation> op = OperationOf(path);
  if (!op.ok()) return absl::UnimplementedError(absl::StrCat("unknown method ", path));
  std::shared_ptr<const Policy> policy = CurrentPolicy();
  if (peer.identity.empty()) {
    // Tokens alone make an identity optional; mTLS, a policy or require_identity need one.
    if (!options_.require_identity && !options_.mtls && policy == nullptr) return absl::OkStatus();
    std::string wanted;
    if (options_.mtls) wanted = "a verified client certificate";
    if (options_.tokens) absl::StrAppend(&wanted, wanted.empty() ? "" : " or ", "a bearer token");
    if (options_.forwarded && wanted.empty()) wanted = "an identity forwarded by a trusted proxy";
    if (wanted.empty()) wanted = "an identity";
    const absl::Status status = absl::UnauthenticatedError(absl::StrCat(wanted, " is required"));
    AuditUnauthenticated(peer, path, status, transport);
    return status;
  }
  std::vector<std::string> key_ids;
  absl::Status status;
  if (policy != nullptr) {
    key_ids = KeyIdsOf(request);  // only a policy reads them: a walk over the message
    status = policy->Check(peer.identity, *op, key_ids);
  } else if (options_.require_identity && op->admin) {
    status = absl::PermissionDeniedError(absl::StrCat(
        op->name, " is for admins, and there is no policy_file to name them"));
  } else {
    return absl::OkStatus();  // an identity and no policy: every client
  }
  if (!status.ok()) {
    permission_denied_.fetch_add(1, std::memory_order_relaxed);
    Audit("permission_denied", {{"transport", std::string(transport)},
                                {"identity", peer.identity},
                                {"identity_source", peer.identity_source},
                                {"peer", peer.address},
                                {"method", std::string(path)},
                                {"operation", op->name},
                                {"key_ids", key_ids},
                                {"reason", std::string(status.message())}});
  }
  return status;
}

void Authorizer::AuditUnauthenticated(const Peer& peer, absl::string_view path,
                                      const absl::Status& status, absl::string_view transport) {
  unauthenticated_.fetch_add(1, std::memory_order_relaxed);
  Audit("unauthenticated", {{"transport", std::string(transport)},
                            {"peer", peer.address},
                            {"method", std::string(path)},
                            {"reason", std::string(status.message())}});
}

void Authorizer::AuditKeyCall(const Peer& peer, absl::string_view path, const Message& request,
                              const absl::Status& status, uint32_t version,
                              absl::string_view transport) {
  absl::StatusOr<Operation> op = OperationOf(path);
  if (!op.ok() || !op->admin) return;
  const std::vector<std::string> key_ids = KeyIdsOf(request);
  nlohmann::json fields = {{"transport", std::string(transport)},
                           {"identity", peer.identity},
                           {"identity_source", peer.identity_source},
                           {"peer", peer.address},
                           {"operation", op->name},
                           {"key_id", key_ids.empty() ? std::string() : key_ids.front()},
                           {"code", absl::StatusCodeToString(status.code())}};
  if (version != 0) fields["version"] = version;
  if (!status.ok()) fields["reason"] = std::string(status.message());
  Audit(status.ok() ? "key_" + op->name.substr(5) : std::string("key_call_failed"),
        std::move(fields));
}

void Authorizer::AuditHandshakeRefused(absl::string_view transport,
                                       absl::string_view claimed_identity,
                                       absl::string_view reason) {
  handshake_refused_.fetch_add(1, std::memory_order_relaxed);
  Audit("tls_handshake_refused", {{"transport", std::string(transport)},
                                  {"claimed_identity", std::string(claimed_identity)},
                                  {"reason", std::string(reason)}});
}

void Authorizer::AuditRefusedRequest(absl::string_view peer_address, absl::string_view port,
                                     absl::string_view reason) {
  Audit("request_refused", {{"port", std::string(port)},
                            {"peer", std::string(peer_address)},
                            {"reason", std::string(reason)}});
}

void Authorizer::ForwardedIdentityIgnored(const Peer& peer, absl::string_view header) {
  const uint64_t count = forwarded_ignored_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = absl::GetCurrentTimeNanos();
  int64_t last = forwarded_ignored_logged_ns_.load(std::memory_order_relaxed);
  if (now - last < int64_t{10'000'000'000} ||
      !forwarded_ignored_logged_ns_.compare_exchange_strong(last, now)) {
    return;
  }
  Log(LogLevel::kWarning, "forwarded_identity_ignored",
      {{"header", std::string(header)},
       {"peer", peer.address},
       {"reason", "the peer is not in trusted_proxies"},
       {"ignored_so_far", count}});
}

Authorizer::Counts Authorizer::counts() const {
  return {unauthenticated_.load(std::memory_order_relaxed),
          permission_denied_.load(std::memory_order_relaxed),
          handshake_refused_.load(std::memory_order_relaxed),
          forwarded_ignored_.load(std::memory_order_relaxed)};
}

}  // namespace offload::auth
