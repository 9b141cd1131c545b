// The crypto-offload server: loads keys, starts the worker pool and the front door on our HTTP
// engine (service/httpd): the gRPC port, and the HTTP port (gRPC, Connect, gRPC-Web), and serves
// until SIGTERM or SIGINT, then drains in-flight calls and returns.
//
//   ServerConfig config;
//   config.grpc_address = "127.0.0.1:50051";
//   absl::Status s = RunServer(config);   // blocks until a stop signal; OK after a clean drain
//
// REQUIRES: SIGTERM and SIGINT are blocked in every thread before RunServer starts any (call
// BlockStopSignals() first thing in main); RunServer waits for them with sigwait.
#ifndef SERVICE_MAIN_SERVER_H_
#define SERVICE_MAIN_SERVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "service/common/secure_memory.h"
#include "service/httpd/server.h"

namespace offload {

struct ServerConfig {
  std::string grpc_address = "127.0.0.1:50051";
  std::string data_dir = "data";
  std::string kek_file;  // empty: environment variable `kek_env`, else a generated data_dir/kek
  std::string kek_env = "OFFLOAD_KEK";
  // A KEK inside a PKCS#11 token (service/keys/pkcs11_kek.h): an RFC 7512 URI; empty: the raw
  // KEK above. The PIN comes from the URI, else kek_pkcs11_pin_file, else kek_pkcs11_pin_env.
  std::string kek_pkcs11;
  // The URI's pin-value, taken out of the flag (keys::TakePinValue): kek_pkcs11 never holds it.
  KeyBytes kek_pkcs11_pin;
  std::string kek_pkcs11_pin_file;
  std::string kek_pkcs11_pin_env = "OFFLOAD_KEK_PKCS11_PIN";
  // Raw KEK files still read (records wrapped under them are re-wrapped under the current KEK).
  std::vector<std::string> kek_previous_files;
  // How often the token is asked for a newer KEK (rotation); records are then re-wrapped.
  absl::Duration kek_refresh_interval = absl::Seconds(30);
  // DeleteKey / DestroyKeyVersion wait at least this long before wiping key material; zero wipes
  // at once.
  absl::Duration key_deletion_wait = absl::Hours(24 * 7);
  std::string keystore = "file";  // file | postgres
  std::string postgres_dsn;       // empty: the environment variable OFFLOAD_POSTGRES_DSN
  int max_batch_items = 1024;
  int64_t max_message_bytes = 16 << 20;
  int workers = 0;                 // 0 = one per core
  // Calls run on the event loop that read them (service/ops/inline_rule.h): at most this
  // estimated cost each (zero: none), at most `inline_turn_budget` per read of a connection.
  absl::Duration inline_max_call = absl::Microseconds(250);
  absl::Duration inline_turn_budget = absl::Milliseconds(2);
  std::string backend = "auto";    // auto | libsodium | openssl
  absl::Duration drain_timeout = absl::Seconds(20);
  std::string metrics_address = "127.0.0.1:9464";  // empty: no /metrics exposer
  std::string http_address = "127.0.0.1:8080";     // empty: no HTTP gateway (Connect, gRPC-Web)
  // The HTTP gateway (service/gateway/gateway.h, service/httpd/server.h).
  std::string http_cors_origins;  // comma-separated exact origins; empty: no CORS headers
  int http_threads = 0;           // event loops; 0 = one per core, at most 4
  int http_max_connections = 10000;
  absl::Duration http_idle_timeout = absl::Seconds(60);
  absl::Duration http_read_timeout = absl::Seconds(10);
  absl::Duration http_send_timeout = absl::Seconds(60);
  int64_t http_max_header_bytes = 16 << 10;
  bool http_tcp_nodelay = true;
  // The HTTP engine's memory budgets and HTTP/2 limits (service/httpd/server.h; README's flags).
  int64_t http_connection_budget_bytes = 4 << 20;
  int64_t http_connection_answer_budget_bytes = 4 << 20;
  int64_t http_memory_budget_bytes = 256 << 20;
  httpd::Server::Options::Http2 http2;
  // Peers (CIDRs) whose X-Forwarded-For names the client that admission counts.
  std::string trusted_proxies;
  int http_compression_level = 1;            // gzip level of responses, 1..9; 0: never compress
  int64_t http_compression_min_bytes = 1024;  // smaller response messages are sent as they are
  bool metrics_enabled = true;                      // false: calls are not even counted
  double log_requests_sample_rate = 0;              // fraction of calls logged (0 = none)
  // Memo cache bounds in bytes; memo_enabled = false turns every cache off (for baselines).
  bool memo_enabled = true;
  int64_t memo_verify_bytes = 32 << 20;
  int64_t memo_derive_bytes = 16 << 20;
  int64_t memo_open_bytes_per_key = 8 << 20;
  int64_t memo_open_bytes_total = 256 << 20;
  // Most bytes of key material kept in locked memory (mlock), within RLIMIT_MEMLOCK (raised up to
  // its hard limit if needed); past it, key material is DONTDUMP but unlocked, with a warning
  // and offload_locked_memory_fallback_bytes (crypto/secure_heap.h). 0: lock nothing.
  int64_t locked_memory_bytes = 4 << 20;
  // TLS on the gRPC and HTTP ports when both files are set (PEM; re-read when they change).
  std::string tls_cert_file;
  std::string tls_key_file;
  // mTLS: client certificates are checked against these CAs and callers need one (its URI SAN,
  // DNS SAN or CN is the caller's identity). Requires TLS.
  std::string tls_client_ca_file;
  // Bearer tokens (service/auth/tokens.h): JWTs checked against the keys of this JWKS file
  // (re-read when it changes), whose iss and aud must be these; the identity claim names the
  // caller. Empty jwks_file: tokens are not read.
  std::string jwks_file;
  std::string token_issuer;
  std::string token_audience;
  std::string token_identity_claim = "sub";
  std::string token_identity_prefix;  // prepended to token identities ("jwt:"); empty: none
  absl::Duration token_clock_skew = absl::Seconds(60);
  int64_t max_token_bytes = 8 << 10;
  int64_t token_memo_bytes = 4 << 20;
  // From trusted_proxies only: the header naming the caller (x-forwarded-client-cert,
  // ssl-client-cert, x-ssl-client-s-dn; service/auth/forwarded_identity.h). Empty: none.
  std::string forwarded_identity_header;
  // No anonymous calls; key lifecycle calls only for the policy's admins.
  bool require_identity = false;
  // Grants (see service/auth/policy.h): identity -> key ids and operations. Requires a source of
  // identities (mTLS, tokens or forwarded identities).
  std::string policy_file;
  // JSON-lines audit trail of key lifecycle events and refusals; empty: the main log (stderr).
  std::string audit_log_file;
  // With audit_log_file: the key (a file of 32+ bytes) of the HMAC chain over its lines.
  std::string audit_chain_key_file;
  // With the chain: audit_checkpoint lines (file, first mac, lines, last mac) to the main log,
  // and to this file when set, every interval (0: only on a change of file and at the stop).
  absl::Duration audit_checkpoint_interval = absl::Minutes(1);
  std::string audit_checkpoint_file;
  // The fraction of data-plane calls (Sign, Derive, Box, AEAD: api::Method::data_plane) audited
  // one line each: 0 none, 1 all.
  double audit_data_plane = 0;
  // Refuse calls that must be audited (UNAVAILABLE) while the audit file is unwritable.
  bool audit_fail_closed = false;
  // Overload protection (service/ops/admission.h); 0 = no bound.
  int64_t max_queued_items = 16384;
  int max_client_inflight = 256;
  int64_t max_queued_bytes = int64_t{256} << 20;  // request bytes of the items admitted
  // HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS per connection on the gRPC port: a client's calls
  // beyond it wait in the client. 0 = the HTTP port's value (http2.max_concurrent_streams).
  int grpc_max_concurrent_streams = 256;
  // The gRPC port's memory budget (its --http_memory_budget_bytes); -1: the HTTP port's. Set
  // from the retired --grpc_memory_quota_bytes, so that an old flags file keeps its bound.
  int64_t grpc_memory_budget_bytes = -1;
};

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts later).
void BlockStopSignals();

// Keeps secrets out of core dumps: the process becomes non-dumpable (PR_SET_DUMPABLE 0: no core
// file, no ptrace attach by other users of the same uid, /proc/<pid>/mem and environ root-only)
// and RLIMIT_CORE goes to 0, unless `allow_core_dumps` (debugging). Logs `process_hardened` with
// what it set. Internal if a call fails.
absl::Status HardenProcess(bool allow_core_dumps);

absl::Status RunServer(const ServerConfig& config);

}  // namespace offload

#endif  // SERVICE_MAIN_SERVER_H_
