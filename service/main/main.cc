// offload_server: the crypto-offload gRPC service. See README.md for the flags and a tour.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <sodium.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
// WasPresentOnCommandLine: whether a flag was given (on the command line or in a --flagfile);
// Abseil has no public way to ask.
#include "absl/flags/internal/parse.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "service/common/log.h"
#include "service/common/secure_memory.h"
#include "service/keys/kek_setup.h"
#include "service/keys/pkcs11_kek.h"
#include "service/main/memory_sizing.h"
#include "service/main/server.h"

ABSL_FLAG(std::string, grpc_address, "127.0.0.1:50051",
          "Address the gRPC server listens on (host:port; port 0 picks a free one).");
ABSL_FLAG(std::string, data_dir, "data", "Folder of the file key store (keys.db) and a generated KEK.");
ABSL_FLAG(std::string, kek_file, "",
          "File holding the 32-byte key-encryption key (64 hex characters or 32 raw bytes).");
ABSL_FLAG(std::string, kek_env, "OFFLOAD_KEK",
          "Environment variable holding the key-encryption key as 64 hex characters, used when "
          "--kek_file is empty. When neither is set, a KEK is generated into --data_dir/kek.");
ABSL_FLAG(std::string, kek_pkcs11, "",
          "The key-encryption key inside a PKCS#11 token (an HSM; SoftHSM2 for tests): an RFC 7512 "
          "URI such as 'pkcs11:token=offload;object=offload-kek?module-path=/usr/lib/softhsm/"
          "libsofthsm2.so&pin-source=/etc/offload/pin' (without module-path: the modules "
          "registered with p11-kit). The key with the URI's label and the greatest CKA_ID wraps "
          "new records; records name the key they are wrapped under. Replaces --kek_file/--kek_env "
          "(a --kek_file given too is read as a previous KEK).");
ABSL_FLAG(std::string, kek_pkcs11_pin_file, "",
          "File holding the token's user PIN, used when the --kek_pkcs11 URI has no pin-source or "
          "pin-value.");
ABSL_FLAG(std::string, kek_pkcs11_pin_env, "OFFLOAD_KEK_PKCS11_PIN",
          "Environment variable holding the token's user PIN, used when neither the URI nor "
          "--kek_pkcs11_pin_file gives one.");
ABSL_FLAG(std::vector<std::string>, kek_previous_files, {},
          "Comma-separated raw KEK files still read, never used to wrap (after a rotation, or "
          "when moving to --kek_pkcs11): records under them are re-wrapped under the current KEK.");
ABSL_FLAG(absl::Duration, kek_refresh_interval, absl::Seconds(30),
          "How often the token is asked for a newer KEK (rotation: --kek_pkcs11_create); when one "
          "appears it becomes current and the key store is re-wrapped under it.");
ABSL_FLAG(bool, kek_pkcs11_create, false,
          "Generate the next KEK inside the --kek_pkcs11 token (AES-256, sensitive, not "
          "extractable; label from the URI, CKA_ID one more than the greatest), print its name "
          "and exit. Running servers adopt it within --kek_refresh_interval.");
ABSL_FLAG(std::string, keystore, "file",
          "Key store: file (one encrypted file in --data_dir, one process) or postgres (shared "
          "by replicas; changes pushed to every replica by LISTEN/NOTIFY).");
ABSL_FLAG(std::string, postgres_dsn, "",
          "libpq connection string of the postgres key store. Empty: the environment variable "
          "OFFLOAD_POSTGRES_DSN (preferred: keeps a password off the command line).");
ABSL_FLAG(int, max_batch_items, 1024, "Most items one batch RPC may carry.");
ABSL_FLAG(int64_t, max_message_bytes, 16 << 20, "Largest request or response message, in bytes.");
ABSL_FLAG(int, workers, 0, "Worker threads for crypto work; 0 = one per core.");
ABSL_FLAG(int64_t, inline_max_call_us, 250,
          "A call whose estimated crypto cost is at most this many microseconds (a single "
          "operation, a small batch) runs to completion on the event loop that read it instead "
          "of hopping to the worker pool, within --inline_turn_budget_us; 0: every call that "
          "misses the memo goes to the pool.");
ABSL_FLAG(int64_t, inline_turn_budget_us, 2000,
          "Estimated microseconds of work an event loop runs for one turn of one connection "
          "(the reads of it made in a row before another connection is served: many HTTP/2 "
          "streams) before the rest of its calls go to the pool; only one call's "
          "worth while answers from workers wait on that loop.");
ABSL_FLAG(std::string, backend, "auto",
          "Crypto backend: auto (the faster per operation, measured at start), libsodium or openssl.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(20),
          "On SIGTERM, how long in-flight calls may take before they are cancelled.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "Address of the Prometheus /metrics endpoint (host:port); empty turns it off.");
ABSL_FLAG(std::string, http_address, "127.0.0.1:8080",
          "Address of the HTTP gateway (Connect and gRPC-Web for every unary RPC, /healthz, "
          "/readyz) (host:port); empty turns it off.");
ABSL_FLAG(std::string, http_cors_origins, "",
          "Browser origins allowed by CORS on the HTTP gateway: a comma-separated list of exact "
          "origins (https://app.example.com); empty: no CORS headers at all. Preflights from "
          "other origins are refused.");
ABSL_FLAG(std::string, http_cors_origin, "",
          "One allowed CORS origin (kept for older set-ups; joins --http_cors_origins).");
ABSL_FLAG(int, http_threads, 0, "Event loop threads of the HTTP gateway; 0 = one per core, at most 4.");
ABSL_FLAG(int, http_max_connections, 10000,
          "Open connections on the HTTP port at most; more are closed at accept. 0 = no bound.");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(60),
          "An HTTP connection with no request under way (keep-alive) is closed after this long.");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(10),
          "HTTP/1.1 request headers and TLS handshakes must finish within this time; a request "
          "body that makes no progress for this long has its connection cut.");
ABSL_FLAG(int64_t, http_max_header_bytes, 16 << 10,
          "Largest request headers (all lines) on the HTTP port; beyond: 431.");
ABSL_FLAG(int, http2_max_concurrent_streams, 100,
          "Concurrent requests per HTTP/2 connection on the HTTP port.");
ABSL_FLAG(absl::Duration, http_send_timeout, absl::Seconds(60),
          "An HTTP answer that makes no progress for this long (the client does not read it, or "
          "keeps its HTTP/2 window shut) has its connection cut.");
ABSL_FLAG(int64_t, http_connection_budget_bytes, 4 << 20,
          "Request body bytes held (and header text), per connection (gRPC port: at least 4x "
          "--max_message_bytes): past it new requests are refused RESOURCE_EXHAUSTED (HTTP 429) "
          "and body windows are not given back (a request of up to --max_message_bytes still "
          "completes). 0: no bound.");
ABSL_FLAG(int64_t, http_connection_answer_budget_bytes, 4 << 20,
          "Answer bytes not yet sent (a client that does not read them, or keeps its HTTP/2 window "
          "shut), per connection on both ports, apart from request bodies: past it the "
          "connection's new calls are refused RESOURCE_EXHAUSTED with a retry delay (an answer "
          "begun below it still completes, whatever its size). 0: no bound.");
ABSL_FLAG(int64_t, http_memory_budget_bytes, 256 << 20,
          "Request bodies and unsent answers over all connections of a port: past it new requests "
          "are refused and connections holding body bytes are not read. 0: no bound.");
ABSL_FLAG(int32_t, http2_stream_window_bytes, 256 << 10,
          "HTTP/2 SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a stream may send before the "
          "server takes them.");
ABSL_FLAG(int32_t, http2_connection_window_bytes, 1 << 20,
          "HTTP/2 connection window: request body bytes of all of a connection's streams.");
ABSL_FLAG(uint64_t, http2_reset_burst, 1000,
          "Incoming RST_STREAM limit (Rapid Reset): a token bucket of this many (resets after a "
          "patient wait, of streams just answered, and one per stream that ended well are "
          "free)...");
ABSL_FLAG(uint64_t, http2_reset_rate, 33, "...refilled at this many per second; empty: GOAWAY.");
ABSL_FLAG(uint64_t, http2_max_continuations, 8,
          "CONTINUATION frames per HTTP/2 header block; more ends the connection.");
ABSL_FLAG(uint64_t, http2_max_outbound_ack, 1000,
          "PING/SETTINGS ACKs and RST_STREAMs queued for a client that does not read them; more "
          "ends the connection.");
ABSL_FLAG(uint64_t, http2_max_settings, 32, "Entries per HTTP/2 SETTINGS frame; more ends the "
          "connection.");
ABSL_FLAG(int, http2_premature_reset_streams, 200,
          "Premature resets (Envoy's rule): once an HTTP/2 connection has closed this many "
          "streams (or half this many ended early), GOAWAY if half of them ended before their "
          "answer, reset by the client or by the server for a client error. 0: off.");
ABSL_FLAG(absl::Duration, http2_premature_reset_lifetime, absl::Seconds(1),
          "A stream that ends before its answer within this long of opening is premature.");
ABSL_FLAG(int, http2_no_progress_burst, 1000,
          "HTTP/2 frames without progress (empty DATA, WINDOW_UPDATE under 1 KiB not answering our "
          "DATA, PRIORITY, "
          "repeated SETTINGS, PINGs with nothing sent between them, invalid frames): a token "
          "bucket per connection of this many...");
ABSL_FLAG(int, http2_no_progress_rate, 33,
          "...refilled at this many per second; empty: GOAWAY ENHANCE_YOUR_CALM.");
ABSL_FLAG(absl::Duration, http2_min_ping_interval, absl::Minutes(5),
          "Keep-alive PINGs as grpc-core enforces them: a PING sooner than this after the previous "
          "one, with nothing sent in between, is a strike...");
ABSL_FLAG(absl::Duration, http2_idle_ping_interval, absl::Hours(2),
          "...and sooner than this while no call is open...");
ABSL_FLAG(int, http2_max_ping_strikes, 2,
          "...and more strikes than this: GOAWAY ENHANCE_YOUR_CALM \"too_many_pings\" (gRPC "
          "clients then double their keepalive time). Sending clears the strikes. 0: off.");
ABSL_FLAG(std::string, trusted_proxies, "",
          "Comma-separated CIDRs (127.0.0.1/32, 10.0.0.0/8, ::1/128) of proxies in front of the "
          "server, on both ports: from those peers only, the nearest untrusted address of X-Forwarded-For is "
          "the client that per-client admission counts. Empty: the peer address always.");
ABSL_FLAG(bool, http_tcp_nodelay, true,
          "TCP_NODELAY on HTTP connections (false only to measure what Nagle's algorithm costs).");
ABSL_FLAG(int, http_compression_level, 1,
          "gzip level of HTTP responses for callers that accept gzip (Accept-Encoding, "
          "grpc-accept-encoding): 1 (fastest) to 9 (smallest); 0 never compresses responses "
          "(compressed requests are still accepted).");
ABSL_FLAG(int64_t, http_compression_min_bytes, 1024,
          "HTTP response messages smaller than this are never compressed.");
ABSL_FLAG(absl::Duration, key_deletion_wait, absl::Hours(24 * 7),
          "How long DeleteKey and DestroyKeyVersion wait before key material is wiped (a request "
          "may ask for longer, never shorter); CancelKeyDeletion / RestoreKeyVersion undo them "
          "meanwhile. 0 wipes at once (tests and throwaway setups only). At most 10 years.");
ABSL_FLAG(bool, allow_core_dumps, false,
          "Leave the process dumpable and its core size limit as it is (for debugging only: a "
          "core file holds keys, shared keys and memoized plaintexts). Default: no core files, "
          "not dumpable (PR_SET_DUMPABLE 0, RLIMIT_CORE 0).");
ABSL_FLAG(int64_t, locked_memory_bytes, 4 << 20,
          "Most bytes of key material held in locked memory (mlock: never swapped), OpenSSL's "
          "secure heap included; capped by RLIMIT_MEMLOCK, whose soft limit is raised up to the "
          "hard one. Past it, new key material goes to unlocked memory still excluded from core "
          "dumps, with a warning log and offload_locked_memory_fallback_bytes. 0: lock nothing.");
ABSL_FLAG(bool, metrics, true,
          "Count calls for Prometheus; false turns metrics off entirely (for the cost benchmark).");
ABSL_FLAG(double, log_requests_sample_rate, 0,
          "Fraction of calls logged as JSON lines (method, code, latency, items; never payloads): "
          "0 to 1.");
ABSL_FLAG(bool, memo, true, "Memo caches on (false: every request is computed afresh).");
ABSL_FLAG(int64_t, memo_verify_bytes, 32 << 20, "Byte bound of the verify memo.");
ABSL_FLAG(int64_t, memo_derive_bytes, 16 << 20, "Byte bound of the derive memo (shared keys).");
ABSL_FLAG(int64_t, memo_open_bytes_per_key, 8 << 20, "Byte bound of the open memo per key.");
ABSL_FLAG(int64_t, memo_open_bytes_total, 256 << 20, "Byte bound of the open memo in all.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM server certificate (then its chain) for TLS on the gRPC and HTTP ports; re-read "
          "when it changes. With --tls_key_file.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CAs for client certificates: turns on mTLS (callers need a certificate; its URI "
          "SAN, DNS SAN or CN is their identity).");
ABSL_FLAG(std::string, jwks_file, "",
          "JWKS (JSON Web Key Set) of the public keys that sign bearer tokens (EdDSA Ed25519, "
          "ES256, RS256); re-read when it changes. Set: `authorization: Bearer <JWT>` names the "
          "caller on every port and protocol. Needs --token_issuer and --token_audience.");
ABSL_FLAG(std::string, token_issuer, "", "The iss every bearer token must carry.");
ABSL_FLAG(std::string, token_audience, "",
          "The aud every bearer token must carry (a string, or one of a list).");
ABSL_FLAG(std::string, token_identity_claim, "sub",
          "The token claim that names the caller (matched by the policy's clients).");
ABSL_FLAG(std::string, token_identity_prefix, "",
          "Prepended to every token identity (e.g. \"jwt:\"), so that the policy can never mistake "
          "a token's subject for a certificate identity of the same name; empty: the claim as is.");
ABSL_FLAG(absl::Duration, token_clock_skew, absl::Seconds(60),
          "Leeway for a token's exp and nbf against this machine's clock (0 to 10m).");
ABSL_FLAG(int64_t, max_token_bytes, 8 << 10, "Longer bearer tokens are refused unread.");
ABSL_FLAG(int64_t, token_memo_bytes, 4 << 20,
          "Byte bound of the verified-token memo (a keyed hash of each token, its identity, "
          "until its exp): a repeated token costs no signature check.");
ABSL_FLAG(std::string, forwarded_identity_header, "",
          "From --trusted_proxies only, the header that names the caller's client certificate: "
          "x-forwarded-client-cert (Envoy XFCC), ssl-client-cert (nginx "
          "$ssl_client_escaped_cert) or x-ssl-client-s-dn (nginx $ssl_client_s_dn). From "
          "anyone else it is ignored (counted and logged).");
ABSL_FLAG(bool, require_identity, false,
          "Every call needs an identity (client certificate, bearer token or forwarded "
          "identity): no anonymous calls; key lifecycle calls only for the policy's admins.");
ABSL_FLAG(std::string, policy_file, "",
          "JSON grants: identity -> key ids and operations; admins (see service/auth/policy.h). "
          "Re-read when it changes. Requires a source of identities (mTLS, --jwks_file or "
          "--forwarded_identity_header).");
ABSL_FLAG(std::string, audit_chain_key_file, "",
          "A file of at least 32 secret bytes: every --audit_log_file line then carries an HMAC "
          "chaining it to the line before, so an edited, removed or moved line is found by "
          "`offloadctl audit verify`. Keep the key away from the audit file's readers.");
ABSL_FLAG(absl::Duration, audit_checkpoint_interval, absl::Minutes(1),
          "With --audit_chain_key_file: how often an audit_checkpoint line (the audit file, the "
          "mac of its first line, its lines so far, its last mac) is written apart from the "
          "audit file - to this log and to --audit_checkpoint_file - when lines were written "
          "since the last one; also on a change of file and at shutdown. `offloadctl audit "
          "verify --checkpoints` then finds lines cut from the file's end. 0: only then.");
ABSL_FLAG(std::string, audit_checkpoint_file, "",
          "With --audit_chain_key_file: a file (kept apart from the audit file's) to which every "
          "audit_checkpoint line is appended as well; empty: this log only.");
ABSL_FLAG(std::string, audit_log_file, "",
          "Append-only JSON-lines audit trail (key lifecycle, refusals); empty: the main log.");
ABSL_FLAG(std::string, audit_data_plane, "off",
          "Audit data-plane calls (Sign, Derive, Box, AEAD Seal/Open/Rewrap and their batches), "
          "one line per call: identity, peer, method, key id and version used, code, items, "
          "memo hits (never payloads): off, all, or the fraction drawn per call (0.01).");
ABSL_FLAG(bool, audit_fail_closed, false,
          "With --audit_log_file: while the audit file cannot be written, calls that must be "
          "audited (key lifecycle, drawn data-plane calls) are refused UNAVAILABLE, and no call "
          "is answered before its line is written. Off: lines that cannot be written are lost "
          "(counted) and calls go on.");
ABSL_FLAG(int64_t, max_queued_items, 16384,
          "Items admitted and not yet finished, all callers; beyond: RESOURCE_EXHAUSTED at once. "
          "0 = no bound.");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{256} << 20,
          "Bytes of the requests admitted and not yet finished, all callers; beyond: "
          "RESOURCE_EXHAUSTED at once. 0 = no bound; otherwise at least --max_message_bytes "
          "(the default is raised to it).");
ABSL_FLAG(int, max_client_inflight, 256,
          "Calls in flight per client (mTLS identity, else peer address); 0 = no bound.");
// Retired with gRPC 1.51's server (issue 24): still accepted, so that an old flags file starts
// the server, and named in a warning with what replaces them (README, "Migrating").
ABSL_FLAG(std::string, grpc_transport, "",
          "Retired: our engine serves --grpc_address (gRPC 1.51's server is gone); ignored.");
ABSL_FLAG(int64_t, grpc_memory_quota_bytes, -1,
          "Retired with gRPC 1.51's server: when set, the gRPC port's memory budget (as "
          "--http_memory_budget_bytes is the HTTP port's); unset, it has the HTTP port's value.");
ABSL_FLAG(std::string, memory_limit_file, "/sys/fs/cgroup/memory.max",
          "The cgroup memory limit (cgroup v2's memory.max: bytes or \"max\"): when it holds "
          "one, the port budgets and memo bounds not set by flags are sized against it (each "
          "port's --http_memory_budget_bytes 1/8, --memo_open_bytes_total 1/4, "
          "--memo_verify_bytes 1/32, --memo_derive_bytes 1/64, each at most its default) and "
          "logged (memory_sizing); cgroup v1's memory/memory.limit_in_bytes when the default file "
          "is absent. Empty: no sizing.");
ABSL_FLAG(int, grpc_max_concurrent_streams, 256,
          "HTTP/2 streams (calls) open at once per gRPC connection; a client's further calls wait "
          "in the client. 0 = the HTTP port's --http2_max_concurrent_streams.");

namespace {

// [issue 33] A PIN given as pin-value= in --kek_pkcs11 is taken out of the command line before
// the flags are parsed (argv is rewritten in place, so /proc/PID/cmdline and `ps` no longer show
// it, and no flag or URI copy ever holds it), then out of the flag's value (a --flagfile's).
// The PIN goes to `*pin` (locked memory). False (logged) for a malformed pin-value.
bool TakeKekPin(int argc, char** argv, offload::KeyBytes* pin) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) break;
    char* value = nullptr;
    for (const char* name : {"--kek_pkcs11=", "-kek_pkcs11="}) {
      if (std::strncmp(arg, name, std::strlen(name)) == 0) value = arg + std::strlen(name);
    }
    if (value == nullptr && i + 1 < argc &&
        (std::strcmp(arg, "--kek_pkcs11") == 0 || std::strcmp(arg, "-kek_pkcs11") == 0)) {
      value = argv[++i];
    }
    if (value == nullptr) continue;
    absl::StatusOr<bool> taken = offload::keys::TakePinValue(value, pin);
    if (!taken.ok()) {
      offload::Log(offload::LogLevel::kError, "server_failed", {{"error", taken.status().ToString()}});
      return false;
    }
  }
  return true;
}

bool TakeKekPinFromFlag(offload::KeyBytes* pin) {
  std::string uri = absl::GetFlag(FLAGS_kek_pkcs11);
  if (uri.find("pin-value=") == std::string::npos) return true;
  absl::StatusOr<bool> taken = offload::keys::TakePinValue(uri.data(), pin);
  uri.resize(std::strlen(uri.c_str()));
  absl::SetFlag(&FLAGS_kek_pkcs11, uri);
  sodium_memzero(uri.data(), uri.size());
  if (!taken.ok()) {
    offload::Log(offload::LogLevel::kError, "server_failed", {{"error", taken.status().ToString()}});
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // glibc's defaults hand freed memory back to the kernel as soon as 128 KB sit free at the top
  // of a heap, and the dynamic mmap threshold moves with the sizes freed. A stream of 55 KB
  // opens (request, plaintext, memo copies, gRPC slices) then faults in and zeroes fresh pages on
  // every call. Keeping up to 64 MB free in the process and mmapping only blocks of 1 MB or more
  // cut server CPU per 55 KB open by about a fifth (tests/bench/README.md, "Allocator").
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  // Every idle keep-alive connection holds a descriptor: allow as many as the hard limit does.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  offload::BlockStopSignals();
  absl::SetProgramUsageMessage("The crypto-offload gRPC service.\nUsage: offload_server [flags]");
  offload::KeyBytes kek_pin;  // a pin-value taken out of --kek_pkcs11
  if (!TakeKekPin(argc, argv, &kek_pin)) return 1;
  absl::ParseCommandLine(argc, argv);
  if (!TakeKekPinFromFlag(&kek_pin)) return 1;
  if (absl::Status s = offload::HardenProcess(absl::GetFlag(FLAGS_allow_core_dumps)); !s.ok()) {
    offload::Log(offload::LogLevel::kError, "server_failed", {{"error", s.ToString()}});
    return 1;
  }

  if (absl::GetFlag(FLAGS_kek_pkcs11_create)) {
    absl::StatusOr<std::string> created = offload::keys::CreatePkcs11Kek(
        {absl::GetFlag(FLAGS_kek_pkcs11), absl::GetFlag(FLAGS_kek_pkcs11_pin_file),
         absl::GetFlag(FLAGS_kek_pkcs11_pin_env), std::move(kek_pin)});
    if (!created.ok()) {
      offload::Log(offload::LogLevel::kError, "kek_create_failed",
                   {{"error", created.status().ToString()}});
      return 1;
    }
    offload::Log(offload::LogLevel::kInfo, "kek_created", {{"kek", *created}});
    std::printf("%s\n", created->c_str());
    return 0;
  }

  offload::ServerConfig config;
  config.grpc_address = absl::GetFlag(FLAGS_grpc_address);
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.kek_file = absl::GetFlag(FLAGS_kek_file);
  config.kek_env = absl::GetFlag(FLAGS_kek_env);
  config.kek_pkcs11 = absl::GetFlag(FLAGS_kek_pkcs11);
  config.kek_pkcs11_pin = std::move(kek_pin);
  config.kek_pkcs11_pin_file = absl::GetFlag(FLAGS_kek_pkcs11_pin_file);
  config.kek_pkcs11_pin_env = absl::GetFlag(FLAGS_kek_pkcs11_pin_env);
  config.kek_previous_files = absl::GetFlag(FLAGS_kek_previous_files);
  config.kek_refresh_interval = absl::GetFlag(FLAGS_kek_refresh_interval);
  config.key_deletion_wait = absl::GetFlag(FLAGS_key_deletion_wait);
  config.keystore = absl::GetFlag(FLAGS_keystore);
  config.postgres_dsn = absl::GetFlag(FLAGS_postgres_dsn);
  config.max_batch_items = absl::GetFlag(FLAGS_max_batch_items);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.workers = absl::GetFlag(FLAGS_workers);
  config.inline_max_call = absl::Microseconds(absl::GetFlag(FLAGS_inline_max_call_us));
  config.inline_turn_budget = absl::Microseconds(absl::GetFlag(FLAGS_inline_turn_budget_us));
  config.backend = absl::GetFlag(FLAGS_backend);
  config.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  config.http_address = absl::GetFlag(FLAGS_http_address);
  config.http_cors_origins = absl::GetFlag(FLAGS_http_cors_origins);
  if (const std::string one = absl::GetFlag(FLAGS_http_cors_origin); !one.empty()) {
    config.http_cors_origins += config.http_cors_origins.empty() ? one : "," + one;
  }
  config.http_threads = absl::GetFlag(FLAGS_http_threads);
  config.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  config.http_idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  config.http_read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
  config.http_max_header_bytes = absl::GetFlag(FLAGS_http_max_header_bytes);
  config.http_send_timeout = absl::GetFlag(FLAGS_http_send_timeout);
  config.http_connection_budget_bytes = absl::GetFlag(FLAGS_http_connection_budget_bytes);
  config.http_connection_answer_budget_bytes =
      absl::GetFlag(FLAGS_http_connection_answer_budget_bytes);
  config.http_memory_budget_bytes = absl::GetFlag(FLAGS_http_memory_budget_bytes);
  config.http2.max_concurrent_streams = absl::GetFlag(FLAGS_http2_max_concurrent_streams);
  config.http2.stream_window_bytes = absl::GetFlag(FLAGS_http2_stream_window_bytes);
  config.http2.connection_window_bytes = absl::GetFlag(FLAGS_http2_connection_window_bytes);
  config.http2.reset_burst = absl::GetFlag(FLAGS_http2_reset_burst);
  config.http2.reset_rate = absl::GetFlag(FLAGS_http2_reset_rate);
  config.http2.max_continuations = absl::GetFlag(FLAGS_http2_max_continuations);
  config.http2.max_outbound_ack = absl::GetFlag(FLAGS_http2_max_outbound_ack);
  config.http2.max_settings = absl::GetFlag(FLAGS_http2_max_settings);
  config.http2.premature_reset_streams = absl::GetFlag(FLAGS_http2_premature_reset_streams);
  config.http2.premature_reset_lifetime = absl::GetFlag(FLAGS_http2_premature_reset_lifetime);
  config.http2.no_progress_burst = absl::GetFlag(FLAGS_http2_no_progress_burst);
  config.http2.no_progress_rate = absl::GetFlag(FLAGS_http2_no_progress_rate);
  config.http2.min_ping_interval = absl::GetFlag(FLAGS_http2_min_ping_interval);
  config.http2.idle_ping_interval = absl::GetFlag(FLAGS_http2_idle_ping_interval);
  config.http2.max_ping_strikes = absl::GetFlag(FLAGS_http2_max_ping_strikes);
  config.trusted_proxies = absl::GetFlag(FLAGS_trusted_proxies);
  config.http_tcp_nodelay = absl::GetFlag(FLAGS_http_tcp_nodelay);
  config.http_compression_level = absl::GetFlag(FLAGS_http_compression_level);
  config.http_compression_min_bytes = absl::GetFlag(FLAGS_http_compression_min_bytes);
  config.metrics_enabled = absl::GetFlag(FLAGS_metrics);
  config.log_requests_sample_rate = absl::GetFlag(FLAGS_log_requests_sample_rate);
  config.memo_enabled = absl::GetFlag(FLAGS_memo);
  config.memo_verify_bytes = absl::GetFlag(FLAGS_memo_verify_bytes);
  config.memo_derive_bytes = absl::GetFlag(FLAGS_memo_derive_bytes);
  config.memo_open_bytes_per_key = absl::GetFlag(FLAGS_memo_open_bytes_per_key);
  config.memo_open_bytes_total = absl::GetFlag(FLAGS_memo_open_bytes_total);
  config.locked_memory_bytes = absl::GetFlag(FLAGS_locked_memory_bytes);
  config.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  config.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  config.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  config.jwks_file = absl::GetFlag(FLAGS_jwks_file);
  config.token_issuer = absl::GetFlag(FLAGS_token_issuer);
  config.token_audience = absl::GetFlag(FLAGS_token_audience);
  config.token_identity_claim = absl::GetFlag(FLAGS_token_identity_claim);
  config.token_identity_prefix = absl::GetFlag(FLAGS_token_identity_prefix);
  config.token_clock_skew = absl::GetFlag(FLAGS_token_clock_skew);
  config.max_token_bytes = absl::GetFlag(FLAGS_max_token_bytes);
  config.token_memo_bytes = absl::GetFlag(FLAGS_token_memo_bytes);
  config.forwarded_identity_header = absl::GetFlag(FLAGS_forwarded_identity_header);
  config.require_identity = absl::GetFlag(FLAGS_require_identity);
  config.policy_file = absl::GetFlag(FLAGS_policy_file);
  config.audit_log_file = absl::GetFlag(FLAGS_audit_log_file);
  config.audit_chain_key_file = absl::GetFlag(FLAGS_audit_chain_key_file);
  config.audit_checkpoint_interval = absl::GetFlag(FLAGS_audit_checkpoint_interval);
  config.audit_checkpoint_file = absl::GetFlag(FLAGS_audit_checkpoint_file);
  {
    const std::string v = absl::GetFlag(FLAGS_audit_data_plane);
    double rate = 0;
    if (v == "all") {
      rate = 1;
    } else if (v != "off" && (!absl::SimpleAtod(v, &rate) || !(rate >= 0 && rate <= 1))) {
      offload::Log(offload::LogLevel::kError, "server_failed",
                   {{"error", "audit_data_plane: expected off, all or a fraction in [0, 1], got " + v}});
      return 1;
    }
    config.audit_data_plane = rate;
  }
  config.audit_fail_closed = absl::GetFlag(FLAGS_audit_fail_closed);
  config.max_queued_items = absl::GetFlag(FLAGS_max_queued_items);
  config.max_client_inflight = absl::GetFlag(FLAGS_max_client_inflight);
  config.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  if (config.max_queued_bytes > 0 &&
      !absl::flags_internal::WasPresentOnCommandLine("max_queued_bytes")) {
    // The default is at least one request of the largest size.
    config.max_queued_bytes = std::max(config.max_queued_bytes, config.max_message_bytes);
  }
  config.grpc_max_concurrent_streams = absl::GetFlag(FLAGS_grpc_max_concurrent_streams);
  if (!absl::GetFlag(FLAGS_grpc_transport).empty()) {
    offload::Log(offload::LogLevel::kWarning, "flag_retired",
                 {{"flag", "grpc_transport"},
                  {"advice", "ignored: our engine serves the gRPC port; drop the flag"}});
  }
  if (const int64_t quota = absl::GetFlag(FLAGS_grpc_memory_quota_bytes); quota != -1) {
    config.grpc_memory_budget_bytes = quota;
    offload::Log(offload::LogLevel::kWarning, "flag_retired",
                 {{"flag", "grpc_memory_quota_bytes"},
                  {"advice", "taken as the gRPC port's memory budget (bytes held for requests "
                             "and unsent answers, all its connections; 0: no bound); the HTTP "
                             "port's is --http_memory_budget_bytes"}});
  }

  // Bounds sized against the container's memory limit, where there is one.
  {
    std::string path = absl::GetFlag(FLAGS_memory_limit_file);
    // cgroup v1 names it otherwise: read there when the default (v2) file is not present.
    constexpr char kCgroupV2[] = "/sys/fs/cgroup/memory.max";
    constexpr char kCgroupV1[] = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
    if (path == kCgroupV2 && access(kCgroupV2, R_OK) != 0) path = kCgroupV1;
    absl::StatusOr<std::optional<int64_t>> limit = offload::ReadMemoryLimit(path);
    if (!limit.ok()) {
      offload::Log(offload::LogLevel::kError, "server_failed",
                   {{"error", limit.status().ToString()}});
      return 1;
    }
    if (limit->has_value()) {
      // A flag given on the command line (or in a --flagfile) keeps its value.
      const auto given = [](absl::string_view name) {
        return absl::flags_internal::WasPresentOnCommandLine(name);
      };
      offload::MemorySizing::Given g;
      g.http_memory_budget_bytes = given("http_memory_budget_bytes");
      g.grpc_memory_budget_bytes = given("grpc_memory_quota_bytes");
      g.memo_verify_bytes = given("memo_verify_bytes");
      g.memo_derive_bytes = given("memo_derive_bytes");
      g.memo_open_bytes_total = given("memo_open_bytes_total");
      g.memo_open_bytes_per_key = given("memo_open_bytes_per_key");
      g.max_queued_bytes = given("max_queued_bytes");
      nlohmann::json chosen = offload::SizeToMemoryLimit(**limit, g, &config);
      chosen["memory_limit_file"] = path;
      offload::Log(offload::LogLevel::kInfo, "memory_sizing", std::move(chosen));
    } else {
      offload::Log(offload::LogLevel::kInfo, "memory_sizing",
                   {{"memory_limit_file", path}, {"limit_bytes", nullptr},
                    {"advice", "no memory limit found: the bounds are the flags' values"}});
    }
  }

  absl::Status status = offload::RunServer(config);
  if (!status.ok()) {
    offload::Log(offload::LogLevel::kError, "server_failed", {{"error", status.ToString()}});
    return 1;
  }
  return 0;
}
