// offloadctl: the admin and try-it CLI of crypto-offload. See README.md beside this file, or run
// `offloadctl help`.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/offloadctl/cli.h"
#include "tools/offloadctl/commands.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "server address host:port");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "deadline per RPC, e.g. 500ms, 10s");
ABSL_FLAG(bool, json, false, "print the response message as JSON");
ABSL_FLAG(bool, hex_output, false, "print plaintexts as hex instead of raw bytes");
ABSL_FLAG(bool, verbose, false, "also print key version and memo_hit on stderr");
ABSL_FLAG(bool, tls, false, "TLS, checking the server's certificate against the system's CAs");
ABSL_FLAG(std::string, tls_ca_file, "", "TLS: PEM CAs of the server's certificate "
          "[OFFLOAD_TLS_CA_FILE]");
ABSL_FLAG(std::string, tls_cert_file, "", "mTLS: PEM client certificate [OFFLOAD_TLS_CERT_FILE]");
ABSL_FLAG(std::string, tls_key_file, "", "mTLS: PEM private key of --tls_cert_file "
          "[OFFLOAD_TLS_KEY_FILE]");
ABSL_FLAG(std::string, tls_server_name, "", "TLS: the name the server's certificate must carry "
          "when it is not the host of --server [OFFLOAD_TLS_SERVER_NAME]");
ABSL_FLAG(std::string, token, "", "bearer token (JWT) for 'authorization: Bearer'; shows in ps, "
          "prefer --token_file [OFFLOAD_TOKEN]");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token [OFFLOAD_TOKEN_FILE]");

ABSL_FLAG(std::string, type, "", "key type: ed25519, x25519, chacha20-poly1305, "
          "xchacha20-poly1305, aes256-gcm");
ABSL_FLAG(bool, allow_zero_shared_secret, false,
          "X25519 keys: return all-zero secrets for small-order peers (legacy compatibility)");
ABSL_FLAG(std::string, secret_hex, "", "key material to import, hex");
ABSL_FLAG(std::string, secret_file, "", "file with the raw key material to import");
ABSL_FLAG(std::string, message, "", "message or plaintext as text");
ABSL_FLAG(std::string, message_hex, "", "message or plaintext as hex");
ABSL_FLAG(std::string, message_file, "", "file with the raw message or plaintext ('-': stdin)");
ABSL_FLAG(std::string, public_key_hex, "", "Ed25519 public key, 32 bytes hex");
ABSL_FLAG(std::string, signature_hex, "", "Ed25519 signature, 64 bytes hex");
ABSL_FLAG(std::string, peer_hex, "", "peer X25519 public key, 32 bytes hex");
ABSL_FLAG(uint32_t, version, 0, "key version (0: current)");
ABSL_FLAG(bool, box, false, "derive: return the NaCl box (beforenm) key instead of the raw secret");
ABSL_FLAG(std::string, nonce_hex, "", "box nonce, 24 bytes hex");
ABSL_FLAG(std::string, ciphertext_hex, "", "box ciphertext (tag || encrypted), hex");
ABSL_FLAG(std::string, ciphertext_file, "", "file with the raw box ciphertext");
ABSL_FLAG(std::string, aad, "", "AEAD associated data as text");
ABSL_FLAG(std::string, aad_hex, "", "AEAD associated data as hex");
ABSL_FLAG(std::string, envelope_hex, "", "AEAD envelope, hex");
ABSL_FLAG(std::string, envelope_file, "", "file with the raw AEAD envelope");
ABSL_FLAG(std::string, key_file, "", "audit verify: the file holding the audit chain's key");
ABSL_FLAG(std::string, checkpoints, "",
          "audit verify: a file of the server's audit_checkpoint lines (--audit_checkpoint_file, "
          "or its log)");
ABSL_FLAG(absl::Duration, wait, absl::ZeroDuration(),
          "keys delete / destroy-version: wait at least this long before the material is wiped "
          "(the server's --key_deletion_wait when longer), e.g. 720h");
ABSL_FLAG(std::string, envelopes_file, "",
          "rewrap: file with one hex AEAD envelope per line, rewrapped in one batch");

namespace {

using offload::ctl::Options;

// Copies `flag` into `out` only when it was given on the command line.
template <typename T>
void Take(const absl::Flag<T>& flag, std::optional<T>* out, const Options* options) {
  const std::string name(absl::GetFlagReflectionHandle(flag).Name());
  if (options->specified.count(name) != 0) *out = absl::GetFlag(flag);
}

template <typename T>
void Take(const absl::Flag<T>& flag, T* out, const Options* /*options*/) {
  *out = absl::GetFlag(flag);
}

// `specified`: the names of the flags given on the command line.
Options OptionsFromFlags(std::set<std::string> specified) {
  Options o;
  o.specified = std::move(specified);
  Take(FLAGS_server, &o.server, &o);
  Take(FLAGS_timeout, &o.timeout, &o);
  Take(FLAGS_json, &o.json, &o);
  Take(FLAGS_hex_output, &o.hex_output, &o);
  Take(FLAGS_verbose, &o.verbose, &o);
  Take(FLAGS_tls, &o.tls, &o);
  Take(FLAGS_tls_ca_file, &o.tls_ca_file, &o);
  Take(FLAGS_tls_cert_file, &o.tls_cert_file, &o);
  Take(FLAGS_tls_key_file, &o.tls_key_file, &o);
  Take(FLAGS_tls_server_name, &o.tls_server_name, &o);
  Take(FLAGS_token, &o.token, &o);
  Take(FLAGS_token_file, &o.token_file, &o);
  Take(FLAGS_type, &o.type, &o);
  Take(FLAGS_allow_zero_shared_secret, &o.allow_zero_shared_secret, &o);
  Take(FLAGS_secret_hex, &o.secret_hex, &o);
  Take(FLAGS_secret_file, &o.secret_file, &o);
  Take(FLAGS_message, &o.message, &o);
  Take(FLAGS_message_hex, &o.message_hex, &o);
  Take(FLAGS_message_file, &o.message_file, &o);
  Take(FLAGS_public_key_hex, &o.public_key_hex, &o);
  Take(FLAGS_signature_hex, &o.signature_hex, &o);
  Take(FLAGS_peer_hex, &o.peer_hex, &o);
  Take(FLAGS_version, &o.version, &o);
  Take(FLAGS_box, &o.box, &o);
  Take(FLAGS_nonce_hex, &o.nonce_hex, &o);
  Take(FLAGS_ciphertext_hex, &o.ciphertext_hex, &o);
  Take(FLAGS_ciphertext_file, &o.ciphertext_file, &o);
  Take(FLAGS_aad, &o.aad, &o);
  Take(FLAGS_aad_hex, &o.aad_hex, &o);
  Take(FLAGS_envelope_hex, &o.envelope_hex, &o);
  Take(FLAGS_envelope_file, &o.envelope_file, &o);
  Take(FLAGS_key_file, &o.key_file, &o);
  Take(FLAGS_checkpoints, &o.checkpoints, &o);
  Take(FLAGS_wait, &o.wait, &o);
  Take(FLAGS_envelopes_file, &o.envelopes_file, &o);
  return o;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", offload::ctl::FormatError(status).c_str());
  return offload::ctl::ExitCodeFor(status);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "try and administer a crypto-offload server; run 'offloadctl help' for the subcommands");
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      std::fputs(offload::ctl::UsageText().c_str(), stdout);
      return offload::ctl::kExitOk;
    }
  }
  absl::StatusOr<std::set<std::string>> specified = offload::ctl::CheckFlagSyntax(args);
  if (!specified.ok()) return Fail(specified.status());
  const std::vector<char*> parsed = absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> positional(parsed.begin() + 1, parsed.end());
  if (positional.empty()) {
    std::fputs(offload::ctl::UsageText().c_str(), stdout);
    return offload::ctl::kExitOk;
  }
  Options options = OptionsFromFlags(*std::move(specified));
  absl::StatusOr<const offload::ctl::CommandSpec*> spec = offload::ctl::FindCommand(positional);
  if (!spec.ok()) return Fail(spec.status());
  if (absl::Status ok = offload::ctl::CheckCommand(**spec, positional, options); !ok.ok()) {
    return Fail(ok);
  }
  if ((*spec)->name != "help") {
    absl::Status ok = offload::ctl::ApplyEnvironment(
        [](const char* name) -> const char* { return std::getenv(name); }, &options);
    if (!ok.ok()) return Fail(ok);
  }
  absl::StatusOr<int> exit_code = offload::ctl::RunCommand(**spec, positional, options);
  std::fflush(stdout);
  if (!exit_code.ok()) return Fail(exit_code.status());
  return *exit_code;
}
