// offloadctl's command-line layer: the subcommand table, flag checks, hex and input handling, and
// the exit-code policy. Everything here is pure (no RPC, no global flags) so it can be unit-tested;
// main.cc copies the absl flags into an `Options` and commands.cc runs the RPCs.
//
//   absl::StatusOr<const CommandSpec*> spec = FindCommand(positional);
//   absl::Status ok = CheckCommand(**spec, positional, options);
//   absl::StatusOr<std::string> message = ReadBytesInput(options.message, ...);
//
// Thread-safety: all functions are reentrant; none keeps state.
#ifndef TOOLS_OFFLOADCTL_CLI_H_
#define TOOLS_OFFLOADCTL_CLI_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "offload/v1/keys.pb.h"

namespace offload::ctl {

// Process exit codes.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidSignature = 1;  // `verify` answered "invalid"
inline constexpr int kExitRpcError = 2;          // the server (or the channel) returned an error
inline constexpr int kExitUsage = 64;            // bad command line or unreadable local input

// Everything the subcommands read from the command line. Optional fields hold a value only when
// the flag was given, so "--message=" (an empty message) differs from no --message at all.
struct Options {
  std::string server = "127.0.0.1:50051";
  absl::Duration timeout = absl::Seconds(10);
  bool json = false;
  bool hex_output = false;
  bool verbose = false;

  // Transport security and identity: global flags, each but --tls also read from an environment
  // variable when its flag is not given (ApplyEnvironment).
  bool tls = false;
  std::optional<std::string> tls_ca_file;
  std::optional<std::string> tls_cert_file;
  std::optional<std::string> tls_key_file;
  std::optional<std::string> tls_server_name;
  std::optional<std::string> token;       // the bearer token itself (shows in `ps`)
  std::optional<std::string> token_file;  // a file holding it

  std::optional<std::string> type;
  bool allow_zero_shared_secret = false;
  std::optional<std::string> secret_hex;
  std::optional<std::string> secret_file;

  std::optional<std::string> message;
  std::optional<std::string> message_hex;
  std::optional<std::string> message_file;

  std::optional<std::string> public_key_hex;
  std::optional<std::string> signature_hex;
  std::optional<std::string> peer_hex;
  std::optional<uint32_t> version;
  bool box = false;
  std::optional<std::string> nonce_hex;
  std::optional<std::string> ciphertext_hex;
  std::optional<std::string> ciphertext_file;
  std::optional<std::string> aad;
  std::optional<std::string> aad_hex;
  std::optional<std::string> envelope_hex;
  std::optional<std::string> envelope_file;

  std::optional<std::string> key_file;  // audit verify: the chain's key
  std::optional<std::string> checkpoints;  // audit verify: the audit_checkpoint lines
  std::optional<absl::Duration> wait;   // keys delete / destroy-version: the deletion wait
  std::optional<std::string> envelopes_file;  // rewrap: one hex envelope per line (BatchRewrap)

  // Names (without dashes) of every flag given on the command line, globals included.
  std::set<std::string> specified;
  // Names of the flags whose value ApplyEnvironment took from their variable.
  std::set<std::string> from_environment;
};

// One subcommand: its words ("keys create" has two), positional arguments after the words, the
// non-global flags it accepts, and the help text.
struct CommandSpec {
  std::string name;            // "keys create", "sign", ...
  std::vector<std::string> args;  // names of the required positional arguments, e.g. {"ID"}
  std::vector<std::string> flags;  // accepted flags besides the global ones
  std::string synopsis;        // one line: what it does
  std::string example;         // a command line that works against a fresh server
};

// The subcommand table, in the order the usage text lists them.
const std::vector<CommandSpec>& Commands();

// Flags that every subcommand accepts.
const std::vector<std::string>& GlobalFlags();

// Finds the subcommand named by the first one or two `positional` words (argv[0] excluded).
// InvalidArgument for an unknown or missing subcommand.
absl::StatusOr<const CommandSpec*> FindCommand(absl::Span<const std::string> positional);

// Checks the positional argument count of `spec` and that every flag in `options.specified` is
// global or accepted by `spec`. InvalidArgument names the offending argument or flag.
absl::Status CheckCommand(const CommandSpec& spec, absl::Span<const std::string> positional,
                          const Options& options);

// Checks flag names and values in `args` (argv without argv[0]) against the absl flag registry,
// with absl's syntax (--name=value, --name value, --bool, --nobool, "--" ends flags), without
// changing any flag. Lets main exit with kExitUsage where absl::ParseCommandLine would exit 1.
// Returns the names of the flags given ("box" for --nobox), which this Abseil version's
// CommandLineFlag does not expose. Flags read from a --flagfile are not seen.
absl::StatusOr<std::set<std::string>> CheckFlagSyntax(absl::Span<const std::string> args);

// The full usage text: global flags, then every subcommand with its flags and an example.
std::string UsageText();

// The environment variable of each flag that has one: {"tls_ca_file", "OFFLOAD_TLS_CA_FILE"},
// ..., {"token", "OFFLOAD_TOKEN"}, {"token_file", "OFFLOAD_TOKEN_FILE"}.
const std::vector<std::pair<std::string, std::string>>& EnvironmentFlags();

// Fills each flag of EnvironmentFlags() that was not given from its variable, read with `getenv`
// (an unset or empty variable is no value). A flag wins over its variable, and for the token
// either token flag wins over both variables. InvalidArgument for two token sources at once
// (--token and --token_file, or OFFLOAD_TOKEN and OFFLOAD_TOKEN_FILE).
absl::Status ApplyEnvironment(const std::function<const char*(const char*)>& getenv,
                              Options* options);

// Where the value of `flag` came from, for messages: "--flag" or its variable's name.
std::string SourceOf(const Options& options, absl::string_view flag);

// Whether the channel is TLS: --tls, or any --tls_* value.
bool UsesTls(const Options& options);

// The bearer token to send ("" for none): --token, or the contents of --token_file with
// surrounding whitespace removed (from their variables likewise). InvalidArgument for an
// unreadable or empty file, or a token CheckBearerToken refuses; messages name the source, never
// the token.
absl::StatusOr<std::string> ReadToken(const Options& options);

// Decodes hex. Surrounding ASCII whitespace is ignored; anything else must be an even number of
// [0-9a-fA-F] characters. InvalidArgument names `field` and the first bad position.
absl::StatusOr<std::string> DecodeHex(absl::string_view field, absl::string_view hex);

// Lower-case hex of `bytes`.
std::string EncodeHex(absl::string_view bytes);

// Reads a whole file ("-" is stdin). InvalidArgument if it cannot be read.
absl::StatusOr<std::string> ReadFileBytes(absl::string_view path);

// Resolves one byte input given as text, hex or a file; `name` is the flag stem ("message" for
// --message / --message_hex / --message_file). More than one given is InvalidArgument. None given:
// `fallback_stdin` reads stdin, otherwise `required` makes it InvalidArgument and an absent
// optional input is the empty string. Pass nullptr for forms the input does not have.
absl::StatusOr<std::string> ReadBytesInput(absl::string_view name,
                                           const std::optional<std::string>* text,
                                           const std::optional<std::string>* hex,
                                           const std::optional<std::string>* file,
                                           bool required, bool fallback_stdin);

// "ed25519", "x25519", "chacha20-poly1305", "xchacha20-poly1305", "aes256-gcm" (case and '-'/'_'
// insensitive, "KEY_TYPE_" prefix allowed) to the proto enum.
absl::StatusOr<v1::KeyType> ParseKeyType(absl::string_view name);

// The short lower-case name ParseKeyType accepts, or "unspecified(N)".
std::string KeyTypeName(v1::KeyType type);

// "enabled", "disabled", "pending-deletion" / "enabled", "disabled", "destroy-scheduled",
// "destroyed"; "unspecified(N)" otherwise.
std::string KeyStateName(v1::KeyState state);
std::string KeyVersionStateName(v1::KeyVersionState state);

// Seconds since the Unix epoch as "2026-01-02T03:04:05Z".
std::string FormatUnixSeconds(int64_t seconds);

// A key version argument (the V of `keys disable-version ID V`): a decimal number >= 1.
// InvalidArgument names `V` and the text.
absl::StatusOr<uint32_t> ParseVersionArg(absl::string_view text);

// A --wait value as a request's whole seconds, rounded up. InvalidArgument if negative.
absl::StatusOr<int64_t> WaitSeconds(absl::Duration wait);

// Human-readable lines for a key: id, type, state (with its deletion time),
// min_decryption_version, options, one line per version with its state.
std::string FormatKeyInfo(const v1::KeyInfo& key);

// One line per key for `keys list`: id, type, versions, and whatever is not plain enabled (the
// key's state and deletion time, min_decryption_version, versions not enabled).
std::string FormatKeyListLine(const v1::KeyInfo& key);

// What `keys delete ID` prints: when the key will be destroyed (relative to `now`) and how to
// keep it, or "deleted: ID" when the server destroyed it at once (no key in the answer).
std::string FormatDeleteKey(const v1::DeleteKeyResponse& response, absl::string_view key_id,
                            absl::Time now);

// The exit code for a failed command: kExitRpcError if `status` came from the server
// (see MarkRpcError), kExitUsage otherwise.
int ExitCodeFor(const absl::Status& status);

// Tags `status` as an RPC error (an absl::Status payload) so ExitCodeFor maps it to kExitRpcError.
absl::Status MarkRpcError(absl::Status status);

// "error: NOT_FOUND: no such key" - the line printed on stderr for a failed command.
std::string FormatError(const absl::Status& status);

}  // namespace offload::ctl

#endif  // TOOLS_OFFLOADCTL_CLI_H_
