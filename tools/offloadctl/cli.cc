#include "tools/offloadctl/cli.h"

#include <sodium.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cpp/credentials.h"

namespace offload::ctl {
namespace {

constexpr absl::string_view kRpcErrorPayload = "type.offloadctl/rpc_error";

// Message input forms, shared by every subcommand that takes a message or plaintext.
const std::vector<std::string> kMessageFlags = {"message", "message_hex", "message_file"};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Checks that `value` parses as a T, the way absl would parse it.
template <typename T>
bool ValueParses(absl::string_view value, std::string* error) {
  T parsed;
  return absl::ParseFlag(value, &parsed, error);
}

}  // namespace

const std::vector<CommandSpec>& Commands() {
  static const auto* const kCommands = new std::vector<CommandSpec>{
      {"keys create", {"ID"}, {"type", "allow_zero_shared_secret"},
       "Create a key with a fresh random secret as version 1.",
       "offloadctl keys create --type=ed25519 signer"},
      {"keys import", {"ID"}, {"type", "allow_zero_shared_secret", "secret_hex", "secret_file"},
       "Import a secret as version 1 (Ed25519: 32-byte seed or 64-byte seed||public key; "
       "X25519 and AEAD: 32 bytes). --secret_file is raw bytes.",
       "offloadctl keys import --type=x25519 --secret_file=alice.key alice"},
      {"keys list", {}, {}, "List every key: id, type, current version, number of versions.",
       "offloadctl keys list"},
      {"keys get", {"ID"}, {}, "Show a key's type, options and versions with public keys.",
       "offloadctl keys get signer"},
      {"keys rotate", {"ID"}, {}, "Add a new random version and make it current.",
       "offloadctl keys rotate signer"},
      {"keys delete", {"ID"}, {"wait"},
       "Schedule the key's destruction after the server's --key_deletion_wait (7 days by "
       "default), or after --wait when longer; until then it refuses every operation and "
       "'keys cancel-deletion' brings it back. Prints when it will be destroyed.",
       "offloadctl keys delete signer"},
      {"keys cancel-deletion", {"ID"}, {}, "Undo 'keys delete' before the wait ends: the key is "
       "back, enabled or disabled as it was.",
       "offloadctl keys cancel-deletion signer"},
      {"keys disable", {"ID"}, {}, "Make the key refuse every operation (FAILED_PRECONDITION); "
       "it keeps its material.",
       "offloadctl keys disable signer"},
      {"keys enable", {"ID"}, {}, "Make a disabled key usable again.",
       "offloadctl keys enable signer"},
      {"keys disable-version", {"ID", "V"}, {}, "Make version V (not the current one) refuse "
       "every operation.",
       "offloadctl keys disable-version vault 1"},
      {"keys enable-version", {"ID", "V"}, {}, "Make a disabled version V usable again.",
       "offloadctl keys enable-version vault 1"},
      {"keys destroy-version", {"ID", "V"}, {"wait"},
       "Schedule the wipe of disabled version V's secret after the server's wait (or --wait "
       "when longer); 'keys restore-version' undoes it meanwhile.",
       "offloadctl keys destroy-version vault 1"},
      {"keys restore-version", {"ID", "V"}, {}, "Undo 'keys destroy-version': version V is back, "
       "disabled.",
       "offloadctl keys restore-version vault 1"},
      {"keys min-decryption-version", {"ID", "V"}, {},
       "AEAD and X25519 keys: refuse envelopes, boxes and derivations of versions below V (at "
       "most the current version). Rewrap old envelopes first.",
       "offloadctl keys min-decryption-version vault 2"},
      {"sign", {"ID"}, kMessageFlags,
       "Ed25519-sign a message (--message, --message_hex, --message_file or stdin) with the "
       "key's current version; prints signature, key version and public key.",
       "offloadctl sign signer --message='hello'"},
      {"verify", {}, Concat({"public_key_hex", "signature_hex"}, kMessageFlags),
       "Verify an Ed25519 signature; prints valid (exit 0) or invalid (exit 1).",
       "offloadctl verify --public_key_hex=$PK --signature_hex=$SIG --message='hello'"},
      {"derive", {"ID"}, {"peer_hex", "version", "box"},
       "X25519 shared secret with a peer public key (--box: the NaCl crypto_box_beforenm key "
       "instead); --version picks an older key version.",
       "offloadctl derive alice --peer_hex=$BOB_PK"},
      {"box-seal", {"ID"}, Concat({"peer_hex", "nonce_hex"}, kMessageFlags),
       "NaCl box a plaintext (given as a message) to a peer; random nonce unless --nonce_hex. "
       "Prints nonce, ciphertext (tag || encrypted) and key version.",
       "offloadctl box-seal alice --peer_hex=$BOB_PK --message='hi bob'"},
      {"box-open", {"ID"}, {"peer_hex", "nonce_hex", "ciphertext_hex", "ciphertext_file", "version"},
       "Open a NaCl box from a peer; writes the raw plaintext (hex with --hex_output).",
       "offloadctl box-open bob --peer_hex=$ALICE_PK --nonce_hex=$N --ciphertext_hex=$C"},
      {"seal", {"ID"}, Concat({"aad", "aad_hex"}, kMessageFlags),
       "AEAD-seal a plaintext (given as a message) with optional associated data; prints the "
       "envelope and key version.",
       "offloadctl seal vault --aad='user:42' --message='secret note'"},
      {"open", {"ID"}, {"envelope_hex", "envelope_file", "aad", "aad_hex"},
       "Open an AEAD envelope (--envelope_file is raw bytes); writes the raw plaintext (hex with "
       "--hex_output).",
       "offloadctl open vault --aad='user:42' --envelope_hex=$ENV"},
      {"rewrap", {"ID"}, {"envelope_hex", "envelope_file", "envelopes_file", "aad", "aad_hex"},
       "Move an AEAD envelope to the key's current version inside the service (the plaintext "
       "never leaves it); prints the new envelope, its version and the previous one. "
       "--envelopes_file: one hex envelope per line, rewrapped in one BatchRewrap, one line "
       "out per line in (the new envelope, or the error); exit 2 if any failed.",
       "offloadctl rewrap vault --aad='user:42' --envelope_hex=$ENV"},
      {"audit verify", {"FILE..."}, {"key_file", "checkpoints"},
       "Check audit files written with --audit_chain_key_file (no server needed), oldest first: "
       "every line's mac against the key (--key_file), and that a file naming the previous "
       "file's last mac follows it. --checkpoints=FILE (the server's --audit_checkpoint_file, or "
       "its log): every audit_checkpoint of these files finds its mac at its line, and the last "
       "one names one of them, so lines cut from the end are found up to the last checkpoint. "
       "Exit 0 if all checks, 1 naming what is broken.",
       "offloadctl audit verify --key_file=/etc/offload/audit.key "
       "--checkpoints=/var/log/offload/checkpoints.jsonl /var/log/offload/audit.jsonl.1 "
       "/var/log/offload/audit.jsonl"},
      {"help", {}, {}, "Print this text.", "offloadctl help"},
  };
  return *kCommands;
}

const std::vector<std::string>& GlobalFlags() {
  static const auto* const kGlobal =
      new std::vector<std::string>{"server",        "timeout",       "json",
                                   "hex_output",    "verbose",       "tls",
                                   "tls_ca_file",   "tls_cert_file", "tls_key_file",
                                   "tls_server_name", "token",       "token_file"};
  return *kGlobal;
}

const std::vector<std::pair<std::string, std::string>>& EnvironmentFlags() {
  static const auto* const kFlags = new std::vector<std::pair<std::string, std::string>>{
      {"tls_ca_file", "OFFLOAD_TLS_CA_FILE"},   {"tls_cert_file", "OFFLOAD_TLS_CERT_FILE"},
      {"tls_key_file", "OFFLOAD_TLS_KEY_FILE"}, {"tls_server_name", "OFFLOAD_TLS_SERVER_NAME"},
      {"token", "OFFLOAD_TOKEN"},               {"token_file", "OFFLOAD_TOKEN_FILE"},
  };
  return *kFlags;
}

namespace {

// The Options field of a flag of EnvironmentFlags().
std::optional<std::string>* EnvironmentField(Options* o, absl::string_view flag) {
  if (flag == "tls_ca_file") return &o->tls_ca_file;
  if (flag == "tls_cert_file") return &o->tls_cert_file;
  if (flag == "tls_key_file") return &o->tls_key_file;
  if (flag == "tls_server_name") return &o->tls_server_name;
  if (flag == "token") return &o->token;
  if (flag == "token_file") return &o->token_file;
  return nullptr;
}

bool Given(const std::optional<std::string>& value) { return value && !value->empty(); }

}  // namespace

absl::Status ApplyEnvironment(const std::function<const char*(const char*)>& getenv,
                              Options* options) {
  const bool token_flag =
      options->specified.count("token") != 0 || options->specified.count("token_file") != 0;
  for (const auto& [flag, variable] : EnvironmentFlags()) {
    if (options->specified.count(flag) != 0) continue;
    if (token_flag && absl::StartsWith(flag, "token")) continue;
    const char* value = getenv(variable.c_str());
    if (value == nullptr || *value == '\0') continue;
    *EnvironmentField(options, flag) = value;
    options->from_environment.insert(flag);
  }
  if (Given(options->token) && Given(options->token_file)) {
    return absl::InvalidArgumentError(absl::StrCat("expected at most one of ",
                                                   SourceOf(*options, "token"), ", ",
                                                   SourceOf(*options, "token_file"), ", got 2"));
  }
  return absl::OkStatus();
}

std::string SourceOf(const Options& options, absl::string_view flag) {
  if (options.from_environment.count(std::string(flag)) != 0) {
    for (const auto& [name, variable] : EnvironmentFlags()) {
      if (name == flag) return variable;
    }
  }
  return absl::StrCat("--", flag);
}

bool UsesTls(const Options& options) {
  return options.tls || Given(options.tls_ca_file) || Given(options.tls_cert_file) ||
         Given(options.tls_key_file) || Given(options.tls_server_name);
}

absl::StatusOr<std::string> ReadToken(const Options& options) {
  std::string token;
  std::string source;
  if (Given(options.token)) {
    token = *options.token;
    source = SourceOf(options, "token");
  } else if (Given(options.token_file)) {
    source = SourceOf(options, "token_file");
    if (*options.token_file == "-") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": expected a file, got '-' (stdin is for messages)"));
    }
    absl::StatusOr<std::string> data = ReadFileBytes(*options.token_file);
    if (!data.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ",
                                                                   data.status().message()));
    token = std::string(absl::StripAsciiWhitespace(*data));
    if (!data->empty()) sodium_memzero(data->data(), data->size());
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": '", *options.token_file, "' holds no token"));
    }
  } else {
    return std::string();
  }
  if (absl::Status s = client::CheckBearerToken(source, token); !s.ok()) {
    sodium_memzero(token.data(), token.size());
    return s;
  }
  return token;
}

absl::StatusOr<const CommandSpec*> FindCommand(absl::Span<const std::string> positional) {
  if (positional.empty()) {
    return absl::InvalidArgumentError("missing subcommand (see 'offloadctl help')");
  }
  const std::string one = positional[0];
  const std::string two = positional.size() > 1 ? absl::StrCat(one, " ", positional[1]) : one;
  for (const CommandSpec& spec : Commands()) {
    if (spec.name == one || spec.name == two) return &spec;
  }
  if (one == "audit") {
    return absl::InvalidArgumentError(
        "expected 'audit verify FILE... --key_file=KEY [--checkpoints=FILE]'");
  }
  if (one == "keys") {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected 'keys create|import|list|get|rotate|delete|cancel-deletion|disable|enable|"
        "disable-version|enable-version|destroy-version|restore-version|min-decryption-version', "
        "got 'keys",
        positional.size() > 1 ? absl::StrCat(" ", positional[1]) : "", "'"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown subcommand '", one, "' (see 'offloadctl help')"));
}

absl::Status CheckCommand(const CommandSpec& spec, absl::Span<const std::string> positional,
                          const Options& options) {
  const size_t words = absl::StrContains(spec.name, ' ') ? 2 : 1;
  const size_t got = positional.size() >= words ? positional.size() - words : 0;
  // A last argument named "X..." takes one or more.
  const bool variadic = !spec.args.empty() && absl::EndsWith(spec.args.back(), "...");
  if (variadic ? got < spec.args.size() : got != spec.args.size()) {
    std::string expected =
        spec.args.empty() ? "no arguments" : absl::StrCat(absl::StrJoin(spec.args, " "));
    return absl::InvalidArgumentError(absl::StrCat("'", spec.name, "' expects ", expected,
                                                   ", got ", got, " argument(s)"));
  }
  for (const std::string& flag : options.specified) {
    bool ok = false;
    for (const std::string& g : GlobalFlags()) ok = ok || g == flag;
    for (const std::string& f : spec.flags) ok = ok || f == flag;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", flag, " does not apply to '", spec.name, "'"));
    }
  }
  for (size_t i = words; i < positional.size(); ++i) {
    if (positional[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", spec.name, "': ", spec.args[std::min(i - words, spec.args.size() - 1)],
          " is empty"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> CheckFlagSyntax(absl::Span<const std::string> args) {
  std::set<std::string> specified;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // positional, or "-"
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    absl::string_view name = arg;
    absl::string_view value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      absl::string_view positive = name;
      if (absl::ConsumePrefix(&positive, "no")) {
        absl::CommandLineFlag* bool_flag = absl::FindCommandLineFlag(positive);
        if (bool_flag != nullptr && bool_flag->IsOfType<bool>()) {
          if (has_value) {
            return absl::InvalidArgumentError(
                absl::StrCat("flag --", name, " takes no value, got '", value, "'"));
          }
          specified.insert(std::string(positive));
          continue;
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see 'offloadctl help')"));
    }
    specified.insert(std::string(name));
    if (flag->IsOfType<bool>() && !has_value) continue;
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    std::string error;
    bool ok = true;
    if (flag->IsOfType<bool>()) {
      ok = ValueParses<bool>(value, &error);
    } else if (flag->IsOfType<uint32_t>()) {
      ok = ValueParses<uint32_t>(value, &error);
    } else if (flag->IsOfType<int32_t>()) {
      ok = ValueParses<int32_t>(value, &error);
    } else if (flag->IsOfType<absl::Duration>()) {
      ok = ValueParses<absl::Duration>(value, &error);
    }  // strings always parse; absl checks any other type itself
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad value '", value, "' for flag --", name, ": ", error));
    }
  }
  return specified;
}

std::string UsageText() {
  std::string out =
      "offloadctl: try and administer a crypto-offload server over gRPC.\n"
      "\n"
      "usage: offloadctl [global flags] SUBCOMMAND [ARGS] [flags]\n"
      "Flags may come before or after the subcommand; '--' ends the flags.\n"
      "\n"
      "global flags:\n"
      "  --server=HOST:PORT   server address (default 127.0.0.1:50051)\n"
      "  --timeout=DURATION   deadline per RPC, e.g. 500ms, 10s (default 10s)\n"
      "  --json               print the response message as JSON (bytes in base64)\n"
      "  --hex_output         print plaintexts as hex instead of raw bytes\n"
      "  --verbose            also print key version and memo_hit on stderr\n"
      "\n"
      "TLS and identity (plain text without any of them; a flag wins over its variable):\n"
      "  --tls                      TLS, checking the server against the system's CAs\n"
      "  --tls_ca_file=PEM          TLS, checking the server against these CAs\n"
      "                             [OFFLOAD_TLS_CA_FILE]\n"
      "  --tls_cert_file=PEM        mTLS: client certificate [OFFLOAD_TLS_CERT_FILE]\n"
      "  --tls_key_file=PEM         mTLS: its private key [OFFLOAD_TLS_KEY_FILE]\n"
      "  --tls_server_name=NAME     the name the server's certificate must carry, when it is\n"
      "                             not the host of --server [OFFLOAD_TLS_SERVER_NAME]\n"
      "  --token_file=PATH          file holding a bearer token (a JWT), sent as\n"
      "                             'authorization: Bearer ...' [OFFLOAD_TOKEN_FILE]\n"
      "  --token=TOKEN              the token itself; visible in ps, prefer the file\n"
      "                             [OFFLOAD_TOKEN]\n"
      "  offloadctl never prints the token, not in errors either.\n"
      "\n"
      "byte inputs: --X=TEXT, --X_hex=HEX, --X_file=PATH (raw bytes, '-' is stdin);\n"
      "a message or plaintext with none of them is read from stdin.\n"
      "key types: ed25519 x25519 chacha20-poly1305 xchacha20-poly1305 aes256-gcm\n"
      "exit codes: 0 ok, 1 verify said invalid, 2 RPC error, 64 usage or input error\n"
      "\n"
      "subcommands:\n";
  for (const CommandSpec& spec : Commands()) {
    absl::StrAppend(&out, "  ", spec.name);
    for (const std::string& arg : spec.args) absl::StrAppend(&out, " ", arg);
    for (const std::string& flag : spec.flags) absl::StrAppend(&out, " [--", flag, "]");
    absl::StrAppend(&out, "\n");
    std::string line = "     ";
    for (absl::string_view word : absl::StrSplit(spec.synopsis, ' ')) {
      if (line.size() + 1 + word.size() > 96) {
        absl::StrAppend(&out, line, "\n");
        line = "     ";
      }
      absl::StrAppend(&line, " ", word);
    }
    absl::StrAppend(&out, line, "\n      e.g. ", spec.example, "\n");
  }
  return out;
}

absl::StatusOr<std::string> DecodeHex(absl::string_view field, absl::string_view hex) {
  hex = absl::StripAsciiWhitespace(hex);
  for (size_t i = 0; i < hex.size(); ++i) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(hex[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": expected hex digits, got '", hex.substr(i, 1), "' at position ", i));
    }
  }
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected an even number of hex digits, got ", hex.size()));
  }
  return absl::HexStringToBytes(hex);
}

std::string EncodeHex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

absl::StatusOr<std::string> ReadFileBytes(absl::string_view path) {
  if (path == "-") {
    std::string data;
    char buffer[1 << 16];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) data.append(buffer, n);
    if (std::ferror(stdin)) return absl::InvalidArgumentError("cannot read stdin");
    return data;
  }
  std::ifstream in(std::string(path), std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot open '", path, "'"));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  return data;
}

absl::StatusOr<std::string> ReadBytesInput(absl::string_view name,
                                           const std::optional<std::string>* text,
                                           const std::optional<std::string>* hex,
                                           const std::optional<std::string>* file,
                                           bool required, bool fallback_stdin) {
  const bool has_text = text != nullptr && text->has_value();
  const bool has_hex = hex != nullptr && hex->has_value();
  const bool has_file = file != nullptr && file->has_value();
  std::vector<std::string> forms;
  if (text != nullptr) forms.push_back(absl::StrCat("--", name));
  if (hex != nullptr) forms.push_back(absl::StrCat("--", name, "_hex"));
  if (file != nullptr) forms.push_back(absl::StrCat("--", name, "_file"));
  const int given = int{has_text} + int{has_hex} + int{has_file};
  if (given > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected at most one of ", absl::StrJoin(forms, ", "), ", got ", given));
  }
  if (has_text) return **text;
  if (has_hex) return DecodeHex(absl::StrCat("--", name, "_hex"), **hex);
  if (has_file) return ReadFileBytes(**file);
  if (fallback_stdin) return ReadFileBytes("-");
  if (required) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing ", name, ": give one of ", absl::StrJoin(forms, ", ")));
  }
  return std::string();
}

absl::StatusOr<v1::KeyType> ParseKeyType(absl::string_view name) {
  std::string n = absl::AsciiStrToLower(name);
  for (char& c : n) {
    if (c == '_') c = '-';
  }
  absl::string_view v = n;
  absl::ConsumePrefix(&v, "key-type-");
  if (v == "ed25519") return v1::KEY_TYPE_ED25519;
  if (v == "x25519") return v1::KEY_TYPE_X25519;
  if (v == "chacha20-poly1305") return v1::KEY_TYPE_CHACHA20_POLY1305;
  if (v == "xchacha20-poly1305") return v1::KEY_TYPE_XCHACHA20_POLY1305;
  if (v == "aes256-gcm" || v == "aes-256-gcm") return v1::KEY_TYPE_AES256_GCM;
  return absl::InvalidArgumentError(absl::StrCat(
      "--type: expected ed25519, x25519, chacha20-poly1305, xchacha20-poly1305 or aes256-gcm, "
      "got '", name, "'"));
}

std::string KeyTypeName(v1::KeyType type) {
  switch (type) {
    case v1::KEY_TYPE_ED25519: return "ed25519";
    case v1::KEY_TYPE_X25519: return "x25519";
    case v1::KEY_TYPE_CHACHA20_POLY1305: return "chacha20-poly1305";
    case v1::KEY_TYPE_XCHACHA20_POLY1305: return "xchacha20-poly1305";
    case v1::KEY_TYPE_AES256_GCM: return "aes256-gcm";
    default: return absl::StrCat("unspecified(", static_cast<int>(type), ")");
  }
}

std::string KeyStateName(v1::KeyState state) {
  switch (state) {
    case v1::KEY_STATE_ENABLED: return "enabled";
    case v1::KEY_STATE_DISABLED: return "disabled";
    case v1::KEY_STATE_PENDING_DELETION: return "pending-deletion";
    default: return absl::StrCat("unspecified(", static_cast<int>(state), ")");
  }
}

std::string KeyVersionStateName(v1::KeyVersionState state) {
  switch (state) {
    case v1::KEY_VERSION_STATE_ENABLED: return "enabled";
    case v1::KEY_VERSION_STATE_DISABLED: return "disabled";
    case v1::KEY_VERSION_STATE_DESTROY_SCHEDULED: return "destroy-scheduled";
    case v1::KEY_VERSION_STATE_DESTROYED: return "destroyed";
    default: return absl::StrCat("unspecified(", static_cast<int>(state), ")");
  }
}

std::string FormatUnixSeconds(int64_t seconds) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(seconds),
                          absl::UTCTimeZone());
}

absl::StatusOr<uint32_t> ParseVersionArg(absl::string_view text) {
  uint32_t version = 0;
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
  if (!digits || !absl::SimpleAtoi(text, &version) || version == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("V: expected a key version number >= 1, got '", text, "'"));
  }
  return version;
}

absl::StatusOr<int64_t> WaitSeconds(absl::Duration wait) {
  if (wait < absl::ZeroDuration() || wait == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--wait: expected a duration >= 0, got ", absl::FormatDuration(wait)));
  }
  return absl::ToInt64Seconds(absl::Ceil(wait, absl::Seconds(1)));
}

std::string FormatKeyInfo(const v1::KeyInfo& key) {
  std::string out = absl::StrCat("key_id: ", key.key_id(), "\ntype: ", KeyTypeName(key.type()),
                                 "\ncurrent_version: ", key.current_version(), "\n");
  if (key.state() != v1::KEY_STATE_UNSPECIFIED) {
    absl::StrAppend(&out, "state: ", KeyStateName(key.state()), "\n");
  }
  if (key.deletion_unix_seconds() != 0) {
    absl::StrAppend(&out, "deletion: ", FormatUnixSeconds(key.deletion_unix_seconds()), "\n");
  }
  if (key.min_decryption_version() > 1) {
    absl::StrAppend(&out, "min_decryption_version: ", key.min_decryption_version(), "\n");
  }
  if (key.type() == v1::KEY_TYPE_X25519) {
    absl::StrAppend(&out, "allow_zero_shared_secret: ",
                    key.options().allow_zero_shared_secret() ? "true" : "false", "\n");
  }
  for (const v1::KeyVersionInfo& v : key.versions()) {
    absl::StrAppend(&out, "version: ", v.version(), "  created: ",
                    FormatUnixSeconds(v.created_unix_seconds()));
    if (v.state() != v1::KEY_VERSION_STATE_UNSPECIFIED) {
      absl::StrAppend(&out, "  state: ", KeyVersionStateName(v.state()));
    }
    if (v.destroy_unix_seconds() != 0) {
      absl::StrAppend(&out,
                      v.state() == v1::KEY_VERSION_STATE_DESTROYED ? "  destroyed: " : "  destroy: ",
                      FormatUnixSeconds(v.destroy_unix_seconds()));
    }
    if (!v.public_key().empty()) {
      absl::StrAppend(&out, "  public_key: ", EncodeHex(v.public_key()));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FormatKeyListLine(const v1::KeyInfo& key) {
  std::string out = absl::StrCat(key.key_id(), "  ", KeyTypeName(key.type()),
                                 "  current_version=", key.current_version(),
                                 "  versions=", key.versions_size());
  if (key.state() != v1::KEY_STATE_UNSPECIFIED && key.state() != v1::KEY_STATE_ENABLED) {
    absl::StrAppend(&out, "  state=", KeyStateName(key.state()));
  }
  if (key.deletion_unix_seconds() != 0) {
    absl::StrAppend(&out, "  deletion=", FormatUnixSeconds(key.deletion_unix_seconds()));
  }
  if (key.min_decryption_version() > 1) {
    absl::StrAppend(&out, "  min_decryption_version=", key.min_decryption_version());
  }
  std::vector<std::string> others;
  for (const v1::KeyVersionInfo& v : key.versions()) {
    if (v.state() != v1::KEY_VERSION_STATE_UNSPECIFIED &&
        v.state() != v1::KEY_VERSION_STATE_ENABLED) {
      others.push_back(absl::StrCat(v.version(), ":", KeyVersionStateName(v.state())));
    }
  }
  if (!others.empty()) absl::StrAppend(&out, "  version_states=", absl::StrJoin(others, ","));
  absl::StrAppend(&out, "\n");
  return out;
}

std::string FormatDeleteKey(const v1::DeleteKeyResponse& response, absl::string_view key_id,
                            absl::Time now) {
  if (!response.has_key()) return absl::StrCat("deleted: ", key_id, "\n");
  const absl::Time when = absl::FromUnixSeconds(response.deletion_unix_seconds());
  const absl::Duration left = std::max(absl::ZeroDuration(), absl::Ceil(when - now,
                                                                        absl::Seconds(1)));
  return absl::StrCat("pending_deletion: ", key_id, "\ndeletion: ",
                      FormatUnixSeconds(response.deletion_unix_seconds()), " (in ",
                      absl::FormatDuration(left), ")\nto keep it: offloadctl keys cancel-deletion ",
                      key_id, "\n");
}

absl::Status MarkRpcError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kRpcErrorPayload, absl::Cord("1"));
  return status;
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  return status.GetPayload(kRpcErrorPayload).has_value() ? kExitRpcError : kExitUsage;
}

std::string FormatError(const absl::Status& status) {
  return absl::StrCat("error: ", absl::StatusCodeToString(status.code()), ": ",
                      status.message());
}

}  // namespace offload::ctl
