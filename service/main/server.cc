#include "service/main/server.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "service/api/method_table.h"
#include "service/auth/authorizer.h"
#include "service/auth/forwarded_identity.h"
#include "service/auth/tokens.h"
#include "service/auth/tls.h"
#include "service/common/log.h"
#include "service/common/secure_memory.h"
#include "service/common/status_macros.h"
#include "service/crypto/backend.h"
#include "service/crypto/secure_heap.h"
#include "service/gateway/gateway.h"
#include "service/http/protocol.h"
#include "service/keys/file_key_store.h"
#include "service/keys/kek.h"
#include "service/keys/kek_setup.h"
#include "service/keys/key_manager.h"
#include "service/keys/postgres_key_store.h"
#include "service/main/metrics_endpoint.h"
#include "service/memo/memo.h"
#include "service/metrics/instrumented_key_store.h"
#include "service/metrics/metrics.h"
#include "service/crypto/op_counts.h"
#include "service/ops/admission.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload {
namespace {

absl::StatusOr<crypto::BackendChoice> ChooseBackends(const std::string& backend) {
  if (backend == "auto") return crypto::BackendChoice::Measure();
  OFFLOAD_ASSIGN_OR_RETURN(crypto::Backend forced, crypto::ParseBackend(backend));
  return crypto::BackendChoice::All(forced);
}

// "`flag`: expected `expected`, got `got`": the start-up refusal of a flag out of its range.
absl::Status FlagOutOfRange(absl::string_view flag, absl::string_view expected,
                            absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": expected ", expected, ", got ", got));
}

// An integer flag and its least accepted value.
struct AtLeast {
  absl::string_view flag;
  int64_t value;
  int64_t min;
  absl::string_view expected;
};
// A duration flag and its least accepted value (`strict`: the value must be above it).
struct DurationAtLeast {
  absl::string_view flag;
  absl::Duration value;
  absl::Duration min;
  bool strict;
  absl::string_view expected;
};

// The first of `checks` out of range, or OK.
absl::Status CheckAtLeast(std::initializer_list<AtLeast> checks) {
  for (const AtLeast& c : checks) {
    if (c.value < c.min) return FlagOutOfRange(c.flag, c.expected, absl::StrCat(c.value));
  }
  return absl::OkStatus();
}
absl::Status CheckAtLeast(std::initializer_list<DurationAtLeast> checks) {
  for (const DurationAtLeast& c : checks) {
    if (c.strict ? c.value <= c.min : c.value < c.min) {
      return FlagOutOfRange(c.flag, c.expected, absl::FormatDuration(c.value));
    }
  }
  return absl::OkStatus();
}

// The engine's flags (both ports): connections, timeouts, budgets, HTTP/2 limits and keepalive
// policy, each refused by name. The uint64_t flags (reset burst and rate, continuations,
// outbound ACKs, SETTINGS entries) cannot be negative: absl's parser refuses that.
absl::Status CheckHttpFlags(const ServerConfig& config) {
  const httpd::Server::Options::Http2& h2 = config.http2;
  constexpr absl::string_view kNoBound = "0 (no bound) or more";
  constexpr absl::string_view kPositive = "a duration above 0";
  OFFLOAD_RETURN_IF_ERROR(CheckAtLeast({
      {"http_threads", config.http_threads, 0, "0 (one per core, at most 4) or more"},
      {"http_max_connections", config.http_max_connections, 0, kNoBound},
      {"http_max_header_bytes", config.http_max_header_bytes, 1024, "1024 or more"},
      {"http_connection_budget_bytes", config.http_connection_budget_bytes, 0, kNoBound},
      {"http_connection_answer_budget_bytes", config.http_connection_answer_budget_bytes, 0,
       kNoBound},
      {"http_memory_budget_bytes", config.http_memory_budget_bytes, 0, kNoBound},
      {"http2_max_concurrent_streams", h2.max_concurrent_streams, 1, "1 or more"},
      {"grpc_max_concurrent_streams", config.grpc_max_concurrent_streams, 0,
       "0 (--http2_max_concurrent_streams) or more"},
      {"http2_stream_window_bytes", h2.stream_window_bytes, 65535, "65535 or more"},
      {"http2_connection_window_bytes", h2.connection_window_bytes, 65535, "65535 or more"},
      {"http2_reset_burst", static_cast<int64_t>(std::min<uint64_t>(h2.reset_burst, INT64_MAX)), 1,
       "1 or more"},
      {"http2_reset_rate", static_cast<int64_t>(std::min<uint64_t>(h2.reset_rate, INT64_MAX)), 1,
       "1 or more"},
      {"http2_max_continuations",
       static_cast<int64_t>(std::min<uint64_t>(h2.max_continuations, INT64_MAX)), 1, "1 or more"},
      {"http2_max_outbound_ack",
       static_cast<int64_t>(std::min<uint64_t>(h2.max_outbound_ack, INT64_MAX)), 1, "1 or more"},
      {"http2_max_settings", static_cast<int64_t>(std::min<uint64_t>(h2.max_settings, INT64_MAX)),
       1, "1 or more"},
      {"http2_premature_reset_streams", h2.premature_reset_streams, 0, "0 (off) or more"},
      {"http2_no_progress_burst", h2.no_progress_burst, 1, "1 or more"},
      {"http2_no_progress_rate", h2.no_progress_rate, 1, "1 or more"},
      {"http2_max_ping_strikes", h2.max_ping_strikes, 0, "0 (off) or more"},
  }));
  return CheckAtLeast({
      {"http_idle_timeout", config.http_idle_timeout, absl::ZeroDuration(), true, kPositive},
      {"http_read_timeout", config.http_read_timeout, absl::ZeroDuration(), true, kPositive},
      {"http_send_timeout", config.http_send_timeout, absl::ZeroDuration(), true, kPositive},
      // 0 would make no stream premature: the rule's off switch is the stream count.
      {"http2_premature_reset_lifetime", h2.premature_reset_lifetime, absl::ZeroDuration(), true,
       "a duration above 0 (--http2_premature_reset_streams=0 turns the rule off)"},
      {"http2_min_ping_interval", h2.min_ping_interval, absl::ZeroDuration(), false,
       "0 (no PING is too soon) or more"},
      {"http2_idle_ping_interval", h2.idle_ping_interval, absl::ZeroDuration(), false,
       "0 (no PING is too soon) or more"},
  });
}

absl::Status CheckConfig(const ServerConfig& config) {
  // Flags whose wrong values would otherwise surface late (the backend after the crypto set-up,
  // the deletion wait after the key store opened) or not at all.
  if (config.backend != "auto" && config.backend != "libsodium" && config.backend != "openssl") {
    return FlagOutOfRange("backend", "auto, libsodium or openssl",
                          absl::StrCat("\"", config.backend, "\""));
  }
  if (config.key_deletion_wait < absl::ZeroDuration() ||
      config.key_deletion_wait > keys::KeyManager::kMaxDeletionWait) {
    return FlagOutOfRange("key_deletion_wait", "0 (wipe at once) to 87840h (10 years)",
                          absl::FormatDuration(config.key_deletion_wait));
  }
  // Negative would cut every call in flight at SIGTERM as 0 does, without saying so; past an
  // hour (or inf) one stuck call would hold a stopping server longer than any orchestrator waits
  // before its SIGKILL (Kubernetes: 30 s unless raised).
  if (config.drain_timeout < absl::ZeroDuration() || config.drain_timeout > absl::Hours(1)) {
    return FlagOutOfRange("drain_timeout", "0 (no wait for calls in flight) to 1h",
                          absl::FormatDuration(config.drain_timeout));
  }
  if (!(config.log_requests_sample_rate >= 0 && config.log_requests_sample_rate <= 1)) {
    return FlagOutOfRange("log_requests_sample_rate", "a fraction from 0 to 1",
                          absl::StrCat(config.log_requests_sample_rate));
  }
  OFFLOAD_RETURN_IF_ERROR(CheckAtLeast({
      {"workers", config.workers, 0, "0 (one per core) or more"},
      {"inline_max_call_us", absl::ToInt64Microseconds(config.inline_max_call), 0,
       "0 (every call that misses the memo goes to the pool) or more"},
      {"inline_turn_budget_us", absl::ToInt64Microseconds(config.inline_turn_budget), 0,
       "0 or more"},
  }));
  if (config.max_batch_items < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_items: expected at least 1, got ", config.max_batch_items));
  }
  for (int64_t bound : {config.memo_verify_bytes, config.memo_derive_bytes,
                        config.memo_open_bytes_per_key, config.memo_open_bytes_total}) {
    if (bound < 0) {
      return absl::InvalidArgumentError(absl::StrCat("memo bounds: expected >= 0, got ", bound));
    }
  }
  if (config.locked_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "locked_memory_bytes: expected >= 0, got ", config.locked_memory_bytes));
  }
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: give both or neither");
  }
  if (!config.tls_client_ca_file.empty() && config.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("tls_client_ca_file: needs tls_cert_file and tls_key_file");
  }
  if (!config.policy_file.empty() && config.tls_client_ca_file.empty() &&
      config.jwks_file.empty() && config.forwarded_identity_header.empty()) {
    return absl::InvalidArgumentError(
        "policy_file: needs a source of identities (tls_client_ca_file, jwks_file or "
        "forwarded_identity_header), else callers have none");
  }
  if (config.require_identity && config.tls_client_ca_file.empty() && config.jwks_file.empty() &&
      config.forwarded_identity_header.empty()) {
    return absl::InvalidArgumentError(
        "require_identity: needs a source of identities (tls_client_ca_file, jwks_file or "
        "forwarded_identity_header), else every call is refused");
  }
  if (config.jwks_file.empty() && (!config.token_issuer.empty() || !config.token_audience.empty())) {
    return absl::InvalidArgumentError("token_issuer, token_audience: need jwks_file");
  }
  if (config.max_token_bytes < 256 || config.token_memo_bytes < 0) {
    return absl::InvalidArgumentError(
        "max_token_bytes: expected 256 or more; token_memo_bytes: expected >= 0");
  }
  if (!config.forwarded_identity_header.empty()) {
    if (absl::StatusOr<auth::ForwardedIdentity> f =
            auth::ForwardedIdentity::Parse(config.forwarded_identity_header);
        !f.ok()) {
      return f.status();
    }
    if (config.trusted_proxies.empty()) {
      return absl::InvalidArgumentError(
          "forwarded_identity_header: needs trusted_proxies (the proxies allowed to send it)");
    }
  }
  if (config.max_queued_items < 0 || config.max_client_inflight < 0 ||
      config.max_queued_bytes < 0) {
    return absl::InvalidArgumentError(
        "max_queued_items, max_client_inflight, max_queued_bytes: expected >= 0");
  }
  if (config.max_queued_bytes > 0 && config.max_queued_bytes < config.max_message_bytes) {
    // Else a request of the largest size would run only when nothing else is queued, and
    // while it runs nothing else would be admitted.
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_bytes: expected 0 or at least max_message_bytes (", config.max_message_bytes,
        "), got ", config.max_queued_bytes));
  }
  if (config.max_queued_items > 0 && config.max_queued_items < config.max_batch_items) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_items: expected 0 or at least max_batch_items (", config.max_batch_items,
        "), got ", config.max_queued_items));
  }
  OFFLOAD_RETURN_IF_ERROR(CheckHttpFlags(config));
  if (absl::StatusOr<auth::TrustedProxies> proxies =
          auth::TrustedProxies::Parse(config.trusted_proxies);
      !proxies.ok()) {
    return proxies.status();
  }
  if (config.http_compression_level < 0 || config.http_compression_level > 9 ||
      config.http_compression_min_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http compression flags: expected http_compression_level 0 (off) to 9 and "
        "http_compression_min_bytes >= 0, got ", config.http_compression_level, " and ",
        config.http_compression_min_bytes));
  }
  if (absl::StatusOr<http::CorsPolicy> cors = http::CorsPolicy::Parse(config.http_cors_origins);
      !cors.ok()) {
    return cors.status();
  }

  if (config.max_message_bytes < 1024 || config.max_message_bytes > (1LL << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected 1024 to 1073741824, got ", config.max_message_bytes));
  }
  return absl::OkStatus();
}

// The key store `config.keystore` names; `*postgres_dsn` is set for the postgres store;
// `*rewrap` re-wraps the store under the ring's current KEK (valid while the store lives).
absl::StatusOr<std::unique_ptr<keys::KeyStore>> OpenKeyStore(
    const ServerConfig& config, std::shared_ptr<keys::KekRing> keks, std::string* postgres_dsn,
    keys::KekRotator::Rewrap* rewrap) {
  if (config.keystore == "file") {
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<keys::FileKeyStore> store,
                             keys::FileKeyStore::Open(config.data_dir, std::move(keks)));
    *rewrap = [s = store.get()] { return s->RewrapAll(); };
    return store;
  }
  if (config.keystore == "postgres") {
    *postgres_dsn = config.postgres_dsn;
    if (postgres_dsn->empty()) {
      const char* env = std::getenv(keys::kPostgresDsnEnvVar);
      if (env != nullptr) *postgres_dsn = env;
    }
    OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<keys::PostgresKeyStore> store,
                             keys::PostgresKeyStore::Open(*postgres_dsn, std::move(keks)));
    *rewrap = [s = store.get()] { return s->RewrapAll(); };
    return store;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("keystore: expected file or postgres, got \"", config.keystore, "\""));
}

int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  while (sigwait(&set, &signal_number) != 0) {
  }
  return signal_number;
}

double ResidentBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Values other components count themselves, read when Prometheus scrapes.
// OpenSSL's secure heap, when it is locked (set by SetUpLockedMemory).
std::atomic<size_t> locked_openssl_heap{0};
size_t LockedOpenSslHeap() { return locked_openssl_heap.load(std::memory_order_relaxed); }

// Locked memory for key material (crypto/secure_heap.h), before any key is made. Reaching the
// bound later is a warning (once) and a metric, never a failure.
absl::Status SetUpLockedMemory(int64_t budget_bytes) {
  OFFLOAD_ASSIGN_OR_RETURN(
      crypto::LockedMemoryReport r,
      crypto::SetUpLockedMemory(static_cast<size_t>(std::max<int64_t>(budget_bytes, 0))));
  if (r.openssl_heap_locked) locked_openssl_heap.store(r.openssl_heap_bytes);
  Log(r.budget_bytes < r.requested_bytes ? LogLevel::kWarning : LogLevel::kInfo, "locked_memory",
      {{"requested_bytes", r.requested_bytes},
       {"budget_bytes", r.budget_bytes},
       {"memlock_soft_before", r.memlock_soft_before},
       {"memlock_soft", r.memlock_soft},
       {"memlock_hard", r.memlock_hard},
       {"openssl_secure_heap_bytes", r.openssl_heap_bytes},
       {"openssl_secure_heap_locked", r.openssl_heap_locked}});
  secure::SetFallbackHook([](size_t budget, size_t locked, bool mlock_refused) {
    Log(LogLevel::kWarning, "locked_memory_exhausted",
        {{"budget_bytes", budget},
         {"locked_bytes", locked},
         {"cause", mlock_refused ? "mlock refused (RLIMIT_MEMLOCK)" : "--locked_memory_bytes"},
         {"effect", "new key material is kept unlocked (still excluded from core dumps); see "
                    "offload_locked_memory_fallback_bytes"}});
  });
  return absl::OkStatus();
}

void RegisterPulledMetrics(metrics::Metrics& m, memo::Memo& memo, ops::WorkerPool& pool,
                           keys::KeyManager& keys) {
  using Read = memo::CacheStats (memo::Memo::*)() const;
  const std::pair<const char*, Read> caches[] = {{"verify", &memo::Memo::verify_stats},
                                                 {"derive", &memo::Memo::derive_stats},
                                                 {"open", &memo::Memo::open_stats}};
  for (const auto& [name, read] : caches) {
    const metrics::Metrics::Labels labels = {{"cache", name}};
    m.AddPullCounter("offload_memo_hits_total", "Memo lookups answered from the cache", labels,
                     [&memo, read = read] { return double((memo.*read)().hits); });
    m.AddPullCounter("offload_memo_misses_total", "Memo lookups that had to compute", labels,
                     [&memo, read = read] { return double((memo.*read)().misses); });
    m.AddPullCounter("offload_memo_evictions_total", "Entries pushed out by the byte bound",
                     labels, [&memo, read = read] { return double((memo.*read)().evictions); });
    m.AddPullGauge("offload_memo_entries", "Entries held", labels,
                   [&memo, read = read] { return double((memo.*read)().entries); });
    m.AddPullGauge("offload_memo_bytes", "Bytes charged (values, keys, per-entry overhead)",
                   labels, [&memo, read = read] { return double((memo.*read)().bytes); });
    m.AddPullGauge("offload_memo_capacity_bytes", "Byte bound", labels,
                   [&memo, read = read] { return double((memo.*read)().capacity_bytes); });
  }
  m.AddPullGauge("offload_worker_queue_depth", "Tasks waiting for a worker thread", {},
                 [&pool] { return double(pool.queue_depth()); });
  m.AddPullGauge("offload_worker_busy", "Worker threads running a task", {},
                 [&pool] { return double(pool.busy()); });
  m.AddPullGauge("offload_workers", "Worker threads", {}, [&pool] { return double(pool.size()); });
  m.AddPullGauge("offload_keys", "Managed keys loaded", {},
                 [&keys] { return double(keys.size()); });
  for (int op = 0; op < static_cast<int>(crypto::CryptoOp::kNumOps); ++op) {
    const auto o = static_cast<crypto::CryptoOp>(op);
    // Counted from here on: the start-up backend measurement is not the service's work.
    m.AddPullCounter("offload_crypto_operations_total", "Primitive runs (memo hits run none)",
                     {{"op", crypto::CryptoOpName(o)}},
                     [o, base = crypto::CryptoOpCount(o)] {
                       return double(crypto::CryptoOpCount(o) - base);
                     });
  }
  m.AddPullGauge("offload_process_resident_memory_bytes", "Resident set size of the process", {},
                 [] { return ResidentBytes(); });
  // Secret memory (issue 26): key material locked, memo payloads excluded from core dumps.
  m.AddPullGauge("offload_locked_memory_bytes",
                 "Bytes of key material memory locked (mlock), OpenSSL's secure heap included",
                 {}, [] { return double(secure::GetStats().locked_bytes + LockedOpenSslHeap()); });
  m.AddPullGauge("offload_locked_memory_budget_bytes",
                 "Most bytes locked for key material (--locked_memory_bytes within RLIMIT_MEMLOCK)",
                 {}, [] { return double(secure::GetStats().locked_budget_bytes +
                                        LockedOpenSslHeap()); });
  m.AddPullGauge("offload_locked_memory_fallback_bytes",
                 "Bytes of key material memory left unlocked (still not dumped): budget reached",
                 {}, [] { return double(secure::GetStats().fallback_bytes); });
  m.AddPullCounter("offload_locked_memory_openssl_fallback_keys_total",
                   "Keys built on libsodium because OpenSSL's secure heap was full", {},
                   [] { return double(crypto::SecureHeapFallbacks()); });
  m.AddPullGauge("offload_nodump_memory_bytes",
                 "Bytes mapped for memo payloads (plaintexts, shared keys), excluded from core "
                 "dumps", {}, [] { return double(secure::GetStats().nodump_bytes); });
}

void RegisterGuardMetrics(metrics::Metrics& m, ops::Admission& admission,
                          auth::Authorizer& authorizer, auth::TokenVerifier* tokens) {
  using AdmissionRead = uint64_t ops::Admission::Counts::*;
  const std::pair<const char*, AdmissionRead> drops[] = {
      {"queue_full", &ops::Admission::Counts::queue_full},
      {"client_limit", &ops::Admission::Counts::client_limit},
      {"deadline", &ops::Admission::Counts::deadline},
      {"client_gone", &ops::Admission::Counts::client_gone},
      {"answers_unread", &ops::Admission::Counts::answers_unread}};
  for (const auto& [reason, field] : drops) {
    m.AddPullCounter("offload_dropped_total",
                     "Calls refused (queue_full: by items or request bytes queued, client_limit: "
                     "RESOURCE_EXHAUSTED) or dropped "
                     "unrun (deadline: passed while queued; client_gone: the caller's stream or "
                     "connection ended first; answers_unread: refused RESOURCE_EXHAUSTED before "
                     "it ran, its connection holding more unread answers than its budget)",
                     {{"reason", reason}},
                     [&admission, field = field] { return double(admission.counts().*field); });
  }
  m.AddPullGauge("offload_queued_items", "Items admitted and not yet finished", {},
                 [&admission] { return double(admission.queued_items()); });
  m.AddPullGauge("offload_queued_bytes",
                 "Bytes of the requests admitted and not yet finished (--max_queued_bytes)", {},
                 [&admission] { return double(admission.queued_bytes()); });
  using AuthRead = uint64_t auth::Authorizer::Counts::*;
  const std::pair<const char*, AuthRead> denials[] = {
      {"unauthenticated", &auth::Authorizer::Counts::unauthenticated},
      {"permission_denied", &auth::Authorizer::Counts::permission_denied},
      {"handshake_refused", &auth::Authorizer::Counts::handshake_refused}};
  for (const auto& [reason, field] : denials) {
    m.AddPullCounter("offload_auth_denied_total",
                     "Calls or TLS handshakes refused by authentication or the grants policy",
                     {{"reason", reason}},
                     [&authorizer, field = field] { return double(authorizer.counts().*field); });
  }
  m.AddPullCounter("offload_forwarded_identity_ignored_total",
                   "Forwarded identity headers from peers that are not trusted proxies (ignored)",
                   {}, [&authorizer] { return double(authorizer.counts().forwarded_ignored); });
  // The audit trail (issue 26): data-plane lines, the file's writes, and fail-closed refusals.
  m.AddPullCounter("offload_audit_data_plane_lines_total",
                   "Data-plane calls audited (--audit_data_plane): lines handed to the audit log",
                   {}, [&authorizer] { return double(authorizer.audit_stats().data_plane_lines); });
  m.AddPullCounter("offload_audit_lines_written_total",
                   "Lines written to --audit_log_file (the kernel took them; no fsync)", {},
                   [&authorizer] { return double(authorizer.audit_stats().sink.lines_written); });
  m.AddPullCounter("offload_audit_write_failures_total",
                   "Failed writes or re-opens of --audit_log_file (probes included)", {},
                   [&authorizer] { return double(authorizer.audit_stats().sink.write_failures); });
  m.AddPullCounter("offload_audit_lines_lost_total",
                   "Audit lines that could not be written (the file unwritable, or the writer's "
                   "queue full); under --audit_fail_closed their calls were answered UNAVAILABLE",
                   {}, [&authorizer] { return double(authorizer.audit_stats().sink.lines_lost); });
  m.AddPullCounter("offload_audit_refused_total",
                   "Calls refused UNAVAILABLE before they ran because the audit log was "
                   "unwritable (--audit_fail_closed)",
                   {}, [&authorizer] { return double(authorizer.audit_stats().refused); });
  m.AddPullGauge("offload_audit_log_writable",
                 "1 while --audit_log_file takes writes (or there is none), 0 from a failed write "
                 "until a re-open probe succeeds",
                 {}, [&authorizer] { return authorizer.audit_stats().sink.healthy ? 1.0 : 0.0; });
  // Registered with or without --jwks_file (all 0 without), so that dashboards find them.
  using TokenCounts = auth::TokenVerifier::Counts;
  const auto token_counts = [tokens] { return tokens != nullptr ? tokens->counts() : TokenCounts{}; };
  for (int i = 0; i < auth::TokenVerifier::kRefusals; ++i) {
    m.AddPullCounter(
        "offload_token_refused_total",
        "Bearer tokens refused, by reason (each is also an unauthenticated call)",
        {{"reason", auth::TokenVerifier::RefusalName(static_cast<auth::TokenVerifier::Refusal>(i))}},
        [token_counts, i] { return double(token_counts().refused[i]); });
  }
  const char* const checks_help =
      "Bearer tokens accepted from the memo (remembered) or checked by signature";
  m.AddPullCounter("offload_token_checks_total", checks_help, {{"result", "remembered"}},
                   [token_counts] { return double(token_counts().remembered); });
  m.AddPullCounter("offload_token_checks_total", checks_help, {{"result", "signature_checked"}},
                   [token_counts] { return double(token_counts().signature_checks); });
  m.AddPullCounter("offload_token_jwks_keys_skipped_total",
                   "JWKS keys passed over as unusable (the file's other keys load), summed over "
                   "every read of --jwks_file",
                   {}, [token_counts] { return double(token_counts().jwks_keys_skipped); });
  m.AddPullGauge("offload_token_memo_bytes", "Bytes held by the verified-token memo", {},
                 [tokens] { return tokens != nullptr ? double(tokens->remembered_bytes()) : 0.0; });
}

// The server_started line: where it listens (the addresses as given and the ports bound, which
// differ for port 0; 0 for a port that is off) and its limits.
void LogStarted(const ServerConfig& config, int grpc_port, int http_port, int metrics_port,
                size_t workers) {
  Log(LogLevel::kInfo, "server_started",
      {{"grpc_address", config.grpc_address},
       {"grpc_port", grpc_port},
       {"http_address", config.http_address},
       {"http_port", http_port},
       {"metrics_address", config.metrics_address},
       {"metrics_port", metrics_port},
       {"workers", workers},
       {"max_batch_items", config.max_batch_items},
       {"max_message_bytes", config.max_message_bytes},
       {"tls", config.tls_cert_file.empty() ? "off"
               : (config.tls_client_ca_file.empty() ? "tls" : "mtls")},
       {"policy_file", config.policy_file},
       {"identities", {{"tokens", !config.jwks_file.empty()},
                       {"forwarded_identity_header", config.forwarded_identity_header},
                       {"require_identity", config.require_identity}}},
       {"max_queued_items", config.max_queued_items},
       {"max_client_inflight", config.max_client_inflight},
       {"max_queued_bytes", config.max_queued_bytes},
       {"grpc_max_concurrent_streams", config.grpc_max_concurrent_streams},
       {"memo", {{"enabled", config.memo_enabled},
                 {"verify_bytes", config.memo_verify_bytes},
                 {"derive_bytes", config.memo_derive_bytes},
                 {"open_bytes_per_key", config.memo_open_bytes_per_key},
                 {"open_bytes_total", config.memo_open_bytes_total}}}});
}

}  // namespace

absl::Status HardenProcess(bool allow_core_dumps) {
  if (!allow_core_dumps) {
    // Both: RLIMIT_CORE alone is undone by a core_pattern that pipes to a program (systemd-
    // coredump, apport ignore the limit); a non-dumpable process is never dumped.
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) {
      return absl::InternalError(absl::StrCat("setrlimit(RLIMIT_CORE, 0): errno ", errno));
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
      return absl::InternalError(absl::StrCat("prctl(PR_SET_DUMPABLE, 0): errno ", errno));
    }
  }
  rlimit core{};
  getrlimit(RLIMIT_CORE, &core);
  Log(allow_core_dumps ? LogLevel::kWarning : LogLevel::kInfo, "process_hardened",
      {{"dumpable", prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1},
       {"core_limit", core.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(core.rlim_cur)},
       {"allow_core_dumps", allow_core_dumps}});
  return absl::OkStatus();
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::Status RunServer(const ServerConfig& config) {
  OFFLOAD_RETURN_IF_ERROR(CheckConfig(config));
  // Debian's Abseil is built without NDEBUG, so every absl::Mutex lock (ours and gRPC's) runs
  // the debug deadlock detector: a global graph update per acquisition (GraphCycles::GetId was
  // ~2-3% of server CPU on unary calls). Lock order is checked in the TSan build instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  OFFLOAD_RETURN_IF_ERROR(crypto::InitCrypto());
  OFFLOAD_RETURN_IF_ERROR(SetUpLockedMemory(config.locked_memory_bytes));
  OFFLOAD_ASSIGN_OR_RETURN(crypto::BackendChoice backends, ChooseBackends(config.backend));
  Log(LogLevel::kInfo, "crypto_backends",
      {{"mode", config.backend}, {"choice", backends.ToString()}});

  metrics::Metrics metrics;
  metrics.SetInfo("offload_build_info", "Version and the crypto backend chosen per operation",
                  {{"version", OFFLOAD_VERSION},
                   {"ed25519_sign", std::string(crypto::BackendName(backends.ed25519_sign))},
                   {"ed25519_verify", std::string(crypto::BackendName(backends.ed25519_verify))},
                   {"x25519", std::string(crypto::BackendName(backends.x25519))},
                   {"chacha20_poly1305", std::string(crypto::BackendName(backends.chacha20_poly1305))},
                   {"xchacha20_poly1305",
                    std::string(crypto::BackendName(backends.xchacha20_poly1305))},
                   {"aes256_gcm", std::string(crypto::BackendName(backends.aes256_gcm))}});
  auto ready = std::make_shared<std::atomic<bool>>(false);
  metrics.AddPullGauge("offload_ready", "1 once the key store is loaded and calls are served",
                       {}, [ready] { return ready->load() ? 1.0 : 0.0; });
  // Metrics are up first, so that a slow or failing key store load can be seen.
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (config.metrics_enabled && !config.metrics_address.empty()) {
    OFFLOAD_ASSIGN_OR_RETURN(metrics_endpoint,
                             MetricsEndpoint::Start(&metrics, config.metrics_address));
  }

  const absl::Time load_start = absl::Now();
  keys::KekOrigin kek_origin;
  // Replicas sharing a postgres store need one KEK between them, never a generated one each.
  const bool shared_store = config.keystore == "postgres";
  keys::KekConfig kek_config;
  kek_config.raw = {config.kek_file, config.kek_env, shared_store ? "" : config.data_dir};
  kek_config.pkcs11.uri = config.kek_pkcs11;
  kek_config.pkcs11.pin = config.kek_pkcs11_pin;
  kek_config.pkcs11.pin_file = config.kek_pkcs11_pin_file;
  kek_config.pkcs11.pin_env = config.kek_pkcs11_pin_env;
  kek_config.previous_files = config.kek_previous_files;
  absl::StatusOr<std::shared_ptr<keys::KekRing>> loaded_kek =
      keys::BuildKekRing(kek_config, &kek_origin);
  if (!loaded_kek.ok() && shared_store && config.kek_pkcs11.empty()) {
    return absl::Status(loaded_kek.status().code(),
                        absl::StrCat("keystore=postgres needs the same KEK on every replica "
                                     "(--kek_file, --kek_env or --kek_pkcs11): ",
                                     loaded_kek.status().message()));
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::shared_ptr<keys::KekRing> kek, std::move(loaded_kek));
  if (kek_origin.generated) {
    Log(LogLevel::kWarning, "kek_generated",
        {{"source", kek_origin.description},
         {"advice", "supply the key-encryption key by --kek_file or an environment variable in "
                    "production; whoever reads this file can decrypt every key"}});
  }
  std::string postgres_dsn;
  keys::KekRotator::Rewrap rewrap;
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<keys::KeyStore> opened,
                           OpenKeyStore(config, kek, &postgres_dsn, &rewrap));
  const std::string store_description = opened->Describe();
  auto store = std::make_unique<metrics::InstrumentedKeyStore>(std::move(opened), &metrics);
  keys::KeyManager::Options manager_options;
  manager_options.deletion_wait = config.key_deletion_wait;
  OFFLOAD_ASSIGN_OR_RETURN(auto key_manager,
                           keys::KeyManager::Create(std::move(store), backends, manager_options));
  Log(LogLevel::kInfo, "keys_loaded",
      {{"store", store_description},
       {"kek", kek->Describe()},
       {"kek_source", kek_origin.description},
       {"keys", key_manager->size()},
       {"seconds", absl::ToDoubleSeconds(absl::Now() - load_start)}});

  memo::MemoOptions memo_options;
  memo_options.enabled = config.memo_enabled;
  memo_options.verify_bytes = static_cast<size_t>(config.memo_verify_bytes);
  memo_options.derive_bytes = static_cast<size_t>(config.memo_derive_bytes);
  memo_options.open_bytes_per_key = static_cast<size_t>(config.memo_open_bytes_per_key);
  memo_options.open_bytes_total = static_cast<size_t>(config.memo_open_bytes_total);
  memo::Memo memo(memo_options);
  // A rotated or deleted key's entries go at once (they could never be served again anyway:
  // entries are named by key version instances that are never reused).
  key_manager->AddChangeListener([&memo](absl::string_view key_id) { memo.DropKey(key_id); });
  // Deletions and version destructions whose wait has ended are carried out within a second;
  // stopped before the memo goes (its listener drops the memo's entries).
  key_manager->StartReaper(absl::Seconds(1));
  absl::Cleanup stop_reaper = [&key_manager] { key_manager->StopReaper(); };
  // With a shared store, changes made through other replicas arrive by NOTIFY (stopped before
  // the memo and the key manager go: declared after both).
  std::unique_ptr<keys::PostgresChangeListener> store_listener;
  if (!postgres_dsn.empty()) {
    keys::KeyManager* manager = key_manager.get();
    OFFLOAD_ASSIGN_OR_RETURN(
        store_listener,
        keys::PostgresChangeListener::Start(
            postgres_dsn, {[manager](absl::string_view id) { return manager->ReloadKey(id); },
                           [manager] { return manager->Resync(); }}));
  }
  // KEK rotation: a newer KEK in the token becomes current and the store is re-wrapped under it,
  // records left under a previous KEK at once (stopped before the key manager, which owns the
  // store, goes: declared after it).
  if (config.kek_refresh_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kek_refresh_interval: expected > 0");
  }
  const std::unique_ptr<keys::KekRotator> kek_rotator =
      keys::KekRotator::Start(kek, std::move(rewrap), config.kek_refresh_interval);

  std::unique_ptr<auth::TlsFiles> tls;
  if (!config.tls_cert_file.empty()) {
    tls = std::make_unique<auth::TlsFiles>(auth::TlsFiles::Paths{
        config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file});
    OFFLOAD_RETURN_IF_ERROR(tls->Load());
  }
  std::unique_ptr<auth::TokenVerifier> tokens;
  if (!config.jwks_file.empty()) {
    auth::TokenVerifier::Options token_options;
    token_options.jwks_file = config.jwks_file;
    token_options.issuer = config.token_issuer;
    token_options.audience = config.token_audience;
    token_options.identity_claim = config.token_identity_claim;
    token_options.identity_prefix = config.token_identity_prefix;
    token_options.clock_skew = config.token_clock_skew;
    token_options.max_token_bytes = static_cast<size_t>(config.max_token_bytes);
    token_options.remembered_bytes = static_cast<size_t>(config.token_memo_bytes);
    OFFLOAD_ASSIGN_OR_RETURN(tokens, auth::TokenVerifier::Create(std::move(token_options)));
  }
  std::optional<auth::ForwardedIdentity> forwarded_identity;
  if (!config.forwarded_identity_header.empty()) {
    OFFLOAD_ASSIGN_OR_RETURN(forwarded_identity,
                             auth::ForwardedIdentity::Parse(config.forwarded_identity_header));
    if (absl::StrContains(config.trusted_proxies, "/0")) {
      Log(LogLevel::kWarning, "forwarded_identity_from_anyone",
          {{"trusted_proxies", config.trusted_proxies},
           {"advice", "a /0 range trusts every peer to name its own identity in " +
                          config.forwarded_identity_header + "; list the proxies only"}});
    }
  }
  auth::Authorizer::Options auth_options;
  auth_options.mtls = !config.tls_client_ca_file.empty();
  auth_options.tokens = tokens != nullptr;
  auth_options.forwarded = forwarded_identity.has_value();
  auth_options.require_identity = config.require_identity;
  auth_options.policy_file = config.policy_file;
  auth_options.audit_file = config.audit_log_file;
  auth_options.audit_data_plane = config.audit_data_plane;
  auth_options.audit_fail_closed = config.audit_fail_closed;
  auth_options.operations = api::PolicyOperations();
  auth_options.audit_checkpoint_interval = config.audit_checkpoint_interval;
  auth_options.audit_checkpoint_file = config.audit_checkpoint_file;
  if (!config.audit_chain_key_file.empty()) {
    OFFLOAD_ASSIGN_OR_RETURN(auth_options.audit_chain_key,
                             auth::ReadAuditKey(config.audit_chain_key_file));
  }
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<auth::Authorizer> authorizer,
                           auth::Authorizer::Create(std::move(auth_options)));
  // Key material the reaper wipes is in the audit trail too; the reaper stops before the
  // authorizer goes (this cleanup runs first: declared after it).
  key_manager->AddDestroyListener(
      [a = authorizer.get()](absl::string_view key_id, const std::vector<uint32_t>& versions) {
        a->AuditKeyDestroyed(key_id, versions);
      });
  absl::Cleanup stop_reaper_before_authorizer = [&key_manager] { key_manager->StopReaper(); };
  if (!config.require_identity && !auth_options.mtls && config.policy_file.empty() &&
      (tokens != nullptr || forwarded_identity.has_value())) {
    Log(LogLevel::kWarning, "identity_optional",
        {{"advice", "tokens or forwarded identities without --require_identity or "
                    "--policy_file: a call without an identity is still served"}});
  }
  if (tls != nullptr && tls->mtls() && config.policy_file.empty()) {
    Log(LogLevel::kWarning, "no_policy",
        {{"advice", "mTLS without --policy_file: every client with a valid certificate may use "
                    "every key and manage keys"}});
  }
  ops::Admission admission(
      {config.max_queued_items, config.max_client_inflight, config.max_queued_bytes});

  // Declared before the server so that it outlives it: the server's calls finish on the pool.
  ops::WorkerPool pool(config.workers);
  ops::Operations operations(key_manager.get(), &memo, &pool, backends,
                             ops::Operations::Options{config.max_batch_items});
  RegisterPulledMetrics(metrics, memo, pool, *key_manager);
  RegisterGuardMetrics(metrics, admission, *authorizer, tokens.get());
  // One method table for every port and protocol: gRPC, gRPC-Web and Connect.
  api::MethodTable http_methods(&operations, key_manager.get());
  OFFLOAD_ASSIGN_OR_RETURN(auth::TrustedProxies trusted_proxies,
                           auth::TrustedProxies::Parse(config.trusted_proxies));
  // The engine's options for a port: the HTTP port's flags, the same guards and TLS.
  const auto engine_options = [&](const std::string& address, const std::string& port) {
    gateway::Gateway::Options http_options;
    http_options.port = port;
    http_options.http.address = address;
    http_options.max_message_bytes = config.max_message_bytes;
    http_options.http.threads = config.http_threads;
    http_options.http.max_connections = config.http_max_connections;
    http_options.http.idle_timeout = config.http_idle_timeout;
    http_options.http.read_timeout = config.http_read_timeout;
    http_options.http.send_timeout = config.http_send_timeout;
    http_options.http.max_header_bytes = config.http_max_header_bytes;
    http_options.http.connection_budget_bytes = config.http_connection_budget_bytes;
    http_options.http.connection_answer_budget_bytes = config.http_connection_answer_budget_bytes;
    http_options.http.memory_budget_bytes = config.http_memory_budget_bytes;
    http_options.http.http2 = config.http2;
    http_options.http.tcp_nodelay = config.http_tcp_nodelay;
    http_options.trusted_proxies = trusted_proxies;
    http_options.forwarded_identity =
        forwarded_identity.has_value() ? &*forwarded_identity : nullptr;
    http_options.tokens = tokens.get();
    http_options.compression.level = config.http_compression_level;
    http_options.compression.min_bytes = config.http_compression_min_bytes;
    http_options.log_sample_rate = config.log_requests_sample_rate;
    http_options.tls = tls.get();
    http_options.authorizer = authorizer.get();
    http_options.admission = &admission;
    http_options.inline_work = {config.inline_max_call, config.inline_turn_budget};
    return http_options;
  };
  std::unique_ptr<gateway::Gateway> http_gateway;
  if (!config.http_address.empty()) {
    gateway::Gateway::Options http_options = engine_options(config.http_address, "http");
    OFFLOAD_ASSIGN_OR_RETURN(http_options.cors, http::CorsPolicy::Parse(config.http_cors_origins));
    http_gateway = std::make_unique<gateway::Gateway>(
        &http_methods, &pool, config.metrics_enabled ? &metrics : nullptr, http_options);
    OFFLOAD_RETURN_IF_ERROR(http_gateway->Start());
  }
  // The gRPC port on the same engine: gRPC clients multiplex their calls on one connection, so
  // a connection may hold four of the largest messages at once.
  gateway::Gateway::Options grpc_options = engine_options(config.grpc_address, "grpc");
  if (config.grpc_max_concurrent_streams > 0) {
    grpc_options.http.http2.max_concurrent_streams = config.grpc_max_concurrent_streams;
  }
  if (config.http_connection_budget_bytes > 0) {  // 0: no bound, on both ports
    grpc_options.http.connection_budget_bytes =
        std::max(config.http_connection_budget_bytes, 4 * config.max_message_bytes);
  }
  if (config.grpc_memory_budget_bytes >= 0) {
    grpc_options.http.memory_budget_bytes = config.grpc_memory_budget_bytes;
  }
  gateway::Gateway grpc_gateway(&http_methods, &pool, config.metrics_enabled ? &metrics : nullptr,
                             grpc_options);
  OFFLOAD_RETURN_IF_ERROR(grpc_gateway.Start());
  ready->store(true);
  grpc_gateway.SetReady(true);
  if (http_gateway != nullptr) http_gateway->SetReady(true);
  LogStarted(config, grpc_gateway.port(), http_gateway != nullptr ? http_gateway->port() : 0,
             metrics_endpoint != nullptr ? metrics_endpoint->port() : 0, pool.size());

  const int signal_number = WaitForStopSignal();
  Log(LogLevel::kInfo, "server_draining",
      {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"},
       {"drain_timeout_seconds", absl::ToDoubleSeconds(config.drain_timeout)}});
  ready->store(false);
  const absl::Time drain_start = absl::Now();
  const absl::Time drain_deadline = drain_start + config.drain_timeout;
  // Both ports at once: health NOT_SERVING, GOAWAY (the double one gRPC describes), idle
  // connections closed, no new connection; then every request accepted is answered (until the
  // deadline) and the connections close.
  grpc_gateway.Drain();
  if (http_gateway != nullptr) http_gateway->Drain();
  grpc_gateway.Stop(drain_deadline);
  if (http_gateway != nullptr) http_gateway->Stop(drain_deadline);
  // Tasks still queued (calls past the drain deadline) run now, while everything they use is
  // still here.
  pool.WaitIdle();
  // Answers held for their audit line (lifecycle calls; fail-closed) are delivered by the audit
  // writer thread: wait for it too, before the gateways' method tables go.
  authorizer->FlushAudit();
  if (metrics_endpoint != nullptr) metrics_endpoint->Stop();
  // How the drain ended, for operators who tune --drain_timeout: every call answered, or at the
  // deadline (calls still running then were cut).
  Log(LogLevel::kInfo, "server_stopped",
      {{"drain", absl::Now() >= drain_deadline ? "deadline" : "calls_done"},
       {"drain_seconds", absl::ToDoubleSeconds(absl::Now() - drain_start)}});
  return absl::OkStatus();
}

}  // namespace offload
