#include "service/auth/authorizer.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "service/auth/tls.h"
#include "service/common/log.h"
#include "service/common/status_macros.h"

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

absl::StatusOr<std::shared_ptr<const Policy>> ReadPolicy(const std::string& path,
                                                         const OperationMap& operations) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("policy_file: cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<Policy> policy = Policy::Parse(text.str(), operations);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_file ", path, ": ", policy.status().message()));
  }
  return std::make_shared<const Policy>(*std::move(policy));
}

// The field `name` of `message` if it is a singular field of `type`, else null.
const FieldDescriptor* Field(const Message& message, const char* name, FieldDescriptor::Type type) {
  const FieldDescriptor* f = message.GetDescriptor()->FindFieldByName(name);
  return f != nullptr && f->type() == type && !f->is_repeated() ? f : nullptr;
}

std::string StringOf(const Message& m, const char* name) {
  const FieldDescriptor* f = Field(m, name, FieldDescriptor::TYPE_STRING);
  return f != nullptr ? m.GetReflection()->GetString(m, f) : std::string();
}

// The field `name` (uint32) of `m`, if `m` has it.
std::optional<uint32_t> Uint32Of(const Message& m, const char* name) {
  const FieldDescriptor* f = Field(m, name, FieldDescriptor::TYPE_UINT32);
  if (f == nullptr) return std::nullopt;
  return m.GetReflection()->GetUInt32(m, f);
}

std::optional<int64_t> Int64Of(const Message& m, const char* name) {
  const FieldDescriptor* f = Field(m, name, FieldDescriptor::TYPE_INT64);
  if (f == nullptr) return std::nullopt;
  return m.GetReflection()->GetInt64(m, f);
}

bool BoolOf(const Message& m, const char* name) {
  const FieldDescriptor* f = Field(m, name, FieldDescriptor::TYPE_BOOL);
  return f != nullptr && m.GetReflection()->GetBool(m, f);
}

// One item: its key id from `request`, the version `response` says it used (else the one
// `request` asked for), whether `response` came from a memo.
void DescribeItem(const Message& request, const Message* response, DataPlaneCall* call,
                  absl::flat_hash_set<std::pair<std::string, uint32_t>>* seen) {
  DataPlaneCall::Key key{StringOf(request, "key_id"), 0};
  std::optional<uint32_t> version;
  if (response != nullptr) version = Uint32Of(*response, "key_version");
  if (!version.has_value() || *version == 0) version = Uint32Of(request, "key_version");
  key.version = version.value_or(0);
  if (response != nullptr && BoolOf(*response, "memo_hit")) ++call->memo_hits;
  if (!seen->insert({key.key_id, key.version}).second) return;
  if (call->keys.size() < DataPlaneCall::kMaxKeys) {
    call->keys.push_back(std::move(key));
  } else {
    ++call->more_keys;
  }
}

thread_local absl::InsecureBitGen sample_bits;

// `text` as a JSON string (quoted) onto `out`. ASCII is escaped here; anything else goes through
// nlohmann (which replaces invalid UTF-8).
void AppendJsonString(std::string* out, absl::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      out->append(nlohmann::json(std::string(text))
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return;
    }
  }
  out->push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// ",\"name\":" then the string `value`.
void AppendMember(std::string* out, absl::string_view name, absl::string_view value) {
  absl::StrAppend(out, ",\"", name, "\":");
  AppendJsonString(out, value);
}

// Now as "2024-01-02T03:04:05.678Z", formatting the seconds once per second per thread.
std::string Iso8601NowFast() {
  thread_local int64_t second = -1;
  thread_local std::string prefix;  // "2024-01-02T03:04:05"
  const int64_t ms = absl::ToUnixMillis(absl::Now());
  if (ms / 1000 != second) {
    second = ms / 1000;
    prefix = absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::FromUnixSeconds(second),
                              absl::UTCTimeZone());
  }
  return absl::StrCat(prefix, ".", absl::Dec(ms % 1000, absl::kZeroPad3), "Z");
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

DataPlaneCall DescribeDataPlaneCall(const Message& request, const Message* response, bool batch) {
  DataPlaneCall call;
  absl::flat_hash_set<std::pair<std::string, uint32_t>> seen;
  if (!batch) {
    DescribeItem(request, response, &call, &seen);
    return call;
  }
  const FieldDescriptor* items = request.GetDescriptor()->FindFieldByName("items");
  if (items == nullptr || !items->is_repeated() || items->type() != FieldDescriptor::TYPE_MESSAGE) {
    return call;
  }
  const FieldDescriptor* results =
      response != nullptr ? response->GetDescriptor()->FindFieldByName("results") : nullptr;
  if (results != nullptr &&
      (!results->is_repeated() || results->type() != FieldDescriptor::TYPE_MESSAGE)) {
    results = nullptr;
  }
  const int n = request.GetReflection()->FieldSize(request, items);
  const int answered = results != nullptr ? response->GetReflection()->FieldSize(*response, results) : 0;
  call.items = n;
  for (int i = 0; i < n; ++i) {
    const Message& item = request.GetReflection()->GetRepeatedMessage(request, items, i);
    const Message* result =
        i < answered ? &response->GetReflection()->GetRepeatedMessage(*response, results, i)
                     : nullptr;
    if (result != nullptr) {
      // {status, response}: the item's own answer is `response`, set when it succeeded.
      const FieldDescriptor* status = Field(*result, "status", FieldDescriptor::TYPE_MESSAGE);
      if (status != nullptr && result->GetReflection()->HasField(*result, status)) {
        const Message& s = result->GetReflection()->GetMessage(*result, status);
        const FieldDescriptor* code = Field(s, "code", FieldDescriptor::TYPE_INT32);
        if (code != nullptr && s.GetReflection()->GetInt32(s, code) != 0) ++call.failed_items;
      }
      const FieldDescriptor* inner = Field(*result, "response", FieldDescriptor::TYPE_MESSAGE);
      if (inner != nullptr) {
        result = result->GetReflection()->HasField(*result, inner)
                     ? &result->GetReflection()->GetMessage(*result, inner)
                     : nullptr;
      }
    }
    DescribeItem(item, result, &call, &seen);
  }
  return call;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(Options options) {
  if (!options.policy_file.empty() && !options.mtls && !options.tokens && !options.forwarded) {
    return absl::InvalidArgumentError(
        "policy_file: needs a source of identities (tls_client_ca_file, jwks_file or "
        "forwarded_identity_header), else callers have none");
  }
  // The chain key goes to the audit sink alone (see Options::audit_chain_key).
  KeyBytes chain_key = std::move(options.audit_chain_key);
  options.audit_chain_key.clear();
  std::unique_ptr<Authorizer> a(new Authorizer(std::move(options)));
  if (!a->options_.policy_file.empty()) {
    const int64_t stamp = FileFingerprint(a->options_.policy_file);
    absl::StatusOr<std::shared_ptr<const Policy>> policy = ReadPolicy(a->options_.policy_file, a->options_.operations);
    if (!policy.ok()) return policy.status();
    absl::MutexLock lock(&a->policy_mu_);
    a->policy_ = *std::move(policy);
    a->policy_stamp_ = stamp;
    a->policy_look_ = absl::Now();
  }
  if (!chain_key.empty() && a->options_.audit_file.empty()) {
    return absl::InvalidArgumentError("audit_chain_key_file: needs audit_log_file");
  }
  if (!a->options_.audit_checkpoint_file.empty() && chain_key.empty()) {
    return absl::InvalidArgumentError("audit_checkpoint_file: needs audit_chain_key_file");
  }
  if (a->options_.audit_checkpoint_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("audit_checkpoint_interval: expected 0 or more");
  }
  if (a->options_.audit_fail_closed && a->options_.audit_file.empty()) {
    return absl::InvalidArgumentError("audit_fail_closed: needs audit_log_file");
  }
  if (!(a->options_.audit_data_plane >= 0 && a->options_.audit_data_plane <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "audit_data_plane: expected a fraction in [0, 1], got ", a->options_.audit_data_plane));
  }
  if (!a->options_.audit_file.empty()) {
    // A chain goes on from the file's last line (AuditSink).
    AuditSink::Options sink;
    sink.path = a->options_.audit_file;
    sink.chain_key = std::move(chain_key);
    sink.checkpoint_interval = a->options_.audit_checkpoint_interval;
    sink.checkpoint_file = a->options_.audit_checkpoint_file;
    OFFLOAD_ASSIGN_OR_RETURN(a->sink_, AuditSink::Open(std::move(sink)));
  }
  return a;
}

Authorizer::~Authorizer() = default;

void Authorizer::FlushAudit() {
  if (sink_ != nullptr) sink_->Flush();
}

Authorizer::AuditStats Authorizer::audit_stats() const {
  AuditStats stats;
  stats.data_plane_lines = data_plane_lines_.load(std::memory_order_relaxed);
  stats.refused = audit_refused_.load(std::memory_order_relaxed);
  if (sink_ != nullptr) stats.sink = sink_->stats();
  return stats;
}

bool Authorizer::SampleDataPlane() const {
  const double rate = options_.audit_data_plane;
  if (rate <= 0) return false;
  if (rate >= 1) return true;
  return absl::Bernoulli(sample_bits, rate);
}

void Authorizer::AuditDataPlane(const Peer& peer, absl::string_view path,
                                absl::string_view transport, const DataPlaneCall& call,
                                absl::StatusCode code, AuditSink::Done done) {
  data_plane_lines_.fetch_add(1, std::memory_order_relaxed);
  // Built by hand: nlohmann's ordered_json costs several microseconds a line, on the calling
  // thread (an event loop, for a memo hit).
  std::string line = "{\"ts\":\"";
  line.reserve(384);
  absl::StrAppend(&line, Iso8601NowFast(), "\",\"event\":\"data_plane\"");
  AppendMember(&line, "transport", transport);
  AppendMember(&line, "identity", peer.identity.empty() ? "anonymous" : peer.identity);
  AppendMember(&line, "identity_source", peer.identity.empty() ? "none" : peer.identity_source);
  AppendMember(&line, "peer", peer.address);
  if (!peer.forwarded_client.empty()) {
    AppendMember(&line, "forwarded_client", peer.forwarded_client);
  }
  AppendMember(&line, "method", path);
  if (call.items < 0) {
    AppendMember(&line, "key_id", call.keys.empty() ? "" : call.keys.front().key_id);
    if (!call.keys.empty() && call.keys.front().version != 0) {
      absl::StrAppend(&line, ",\"version\":", call.keys.front().version);
    }
    absl::StrAppend(&line, ",\"memo_hit\":", call.memo_hits > 0 ? "true" : "false");
  } else {
    absl::StrAppend(&line, ",\"items\":", call.items, ",\"keys\":[");
    for (size_t i = 0; i < call.keys.size(); ++i) {
      line.append(i == 0 ? "{\"key_id\":" : ",{\"key_id\":");
      AppendJsonString(&line, call.keys[i].key_id);
      if (call.keys[i].version != 0) absl::StrAppend(&line, ",\"version\":", call.keys[i].version);
      line.push_back('}');
    }
    line.push_back(']');
    if (call.more_keys > 0) absl::StrAppend(&line, ",\"more_keys\":", call.more_keys);
    absl::StrAppend(&line, ",\"memo_hits\":", call.memo_hits, ",\"failed_items\":",
                    call.failed_items);
  }
  AppendMember(&line, "code", absl::StatusCodeToString(code));
  line.push_back('}');
  if (sink_ == nullptr) {
    AuditOrdered(nlohmann::ordered_json::parse(line), std::move(done));
    return;
  }
  sink_->Append(std::move(line), std::move(done));
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
  absl::StatusOr<std::shared_ptr<const Policy>> policy = ReadPolicy(options_.policy_file, options_.operations);
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

void Authorizer::Audit(absl::string_view event, nlohmann::json fields, AuditSink::Done done) {
  if (sink_ == nullptr) {
    fields["audit"] = true;
    Log(LogLevel::kInfo, event, std::move(fields));
    if (done) done(true);
    return;
  }
  nlohmann::ordered_json line;
  line["ts"] = Iso8601Now();
  line["event"] = std::string(event);
  for (auto& [k, v] : fields.items()) line[k] = v;
  AuditOrdered(std::move(line), std::move(done));
}

void Authorizer::AuditOrdered(nlohmann::ordered_json line, AuditSink::Done done) {
  if (sink_ == nullptr) {
    // The main log: its own "ts" and "event".
    const std::string event = line["event"].get<std::string>();
    nlohmann::json fields;
    for (auto& [k, v] : line.items()) {
      if (k != "ts" && k != "event") fields[k] = v;
    }
    fields["audit"] = true;
    Log(LogLevel::kInfo, event, std::move(fields));
    if (done) done(true);
    return;
  }
  sink_->Append(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                std::move(done));
}

absl::Status Authorizer::Authorize(const Peer& peer, absl::string_view path,
                                   const Message& request, absl::string_view transport,
                                   RefusalDone refusal_done) {
  if (!enforcing()) return absl::OkStatus();
  // The refusal's line goes with `done`, which hands the refusal on.
  const auto done_for = [&refusal_done](const absl::Status& refusal) -> AuditSink::Done {
    if (!refusal_done) return nullptr;
    return [refusal_done = std::move(refusal_done), refusal](bool written) {
      refusal_done(refusal, written);
    };
  };
  absl::StatusOr<Operation> op = OperationOf(options_.operations, path);
  if (!op.ok()) {
    const absl::Status status = absl::UnimplementedError(absl::StrCat("unknown method ", path));
    if (refusal_done) refusal_done(status, true);  // no line to wait for
    return status;
  }
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
    AuditUnauthenticated(peer, path, status, transport, done_for(status));
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
                                {"reason", std::string(status.message())}},
          done_for(status));
  }
  return status;
}

void Authorizer::AuditUnauthenticated(const Peer& peer, absl::string_view path,
                                      const absl::Status& status, absl::string_view transport,
                                      AuditSink::Done done) {
  unauthenticated_.fetch_add(1, std::memory_order_relaxed);
  Audit("unauthenticated", {{"transport", std::string(transport)},
                            {"peer", peer.address},
                            {"method", std::string(path)},
                            {"reason", std::string(status.message())}},
        std::move(done));
}

void Authorizer::AuditKeyCall(const Peer& peer, absl::string_view path, const Message& request,
                              const absl::Status& status, uint32_t version,
                              absl::string_view transport, AuditSink::Done done) {
  absl::StatusOr<Operation> op = OperationOf(options_.operations, path);
  if (!op.ok() || !op->admin) {
    if (done) done(true);
    return;
  }
  const std::vector<std::string> key_ids = KeyIdsOf(request);
  // An anonymous caller is named as data-plane lines name it, never with empty fields.
  const bool anonymous = peer.identity.empty();
  nlohmann::json fields = {{"transport", std::string(transport)},
                           {"identity", anonymous ? std::string("anonymous") : peer.identity},
                           {"identity_source", anonymous ? "none" : peer.identity_source},
                           {"peer", peer.address},
                           {"operation", op->name},
                           {"key_id", key_ids.empty() ? std::string() : key_ids.front()},
                           {"code", absl::StatusCodeToString(status.code())}};
  if (version != 0) fields["version"] = version;
  // Which call, and what it asked for: DeleteKey and DestroyKeyVersion share keys.delete.
  fields["method"] = std::string(path.substr(path.rfind('/') + 1));
  if (std::optional<uint32_t> target = Uint32Of(request, "version"); target && *target != 0) {
    fields["target_version"] = *target;
  }
  if (std::optional<int64_t> wait = Int64Of(request, "wait_seconds"); wait && *wait != 0) {
    fields["wait_seconds"] = *wait;
  }
  if (std::optional<uint32_t> min = Uint32Of(request, "min_decryption_version")) {
    fields["min_decryption_version"] = *min;
  }
  if (!status.ok()) fields["reason"] = std::string(status.message());
  Audit(status.ok() ? "key_" + op->name.substr(5) : std::string("key_call_failed"),
        std::move(fields), std::move(done));
}

void Authorizer::AuditKeyDestroyed(absl::string_view key_id,
                                   const std::vector<uint32_t>& versions) {
  nlohmann::json fields = {{"key_id", std::string(key_id)}, {"by", "key_deletion_wait"}};
  if (!versions.empty()) fields["versions"] = versions;
  Audit(versions.empty() ? "key_destroyed" : "key_versions_destroyed", std::move(fields));
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
