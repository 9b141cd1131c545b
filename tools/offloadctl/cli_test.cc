#include "tools/offloadctl/cli.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Flags of each kind CheckFlagSyntax treats differently, registered like main.cc's.
ABSL_FLAG(std::string, t_server, "", "string flag");
ABSL_FLAG(bool, t_box, false, "bool flag");
ABSL_FLAG(uint32_t, t_version, 0, "uint32 flag");
ABSL_FLAG(absl::Duration, t_timeout, absl::Seconds(1), "duration flag");

namespace offload::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Args(std::initializer_list<const char*> list) {
  return std::vector<std::string>(list.begin(), list.end());
}

TEST(DecodeHexTest, AcceptsUpperLowerAndSurroundingWhitespace) {
  auto bytes = DecodeHex("--x", " 00ff10Ab\n");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, std::string("\x00\xff\x10\xab", 4));
  EXPECT_EQ(*DecodeHex("--x", ""), "");
}

TEST(DecodeHexTest, RejectsOddLengthAndNonHexNamingTheField) {
  auto odd = DecodeHex("--peer_hex", "abc");
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(odd.status().message()), HasSubstr("--peer_hex"));
  EXPECT_THAT(std::string(odd.status().message()), HasSubstr("got 3"));

  auto bad = DecodeHex("--nonce_hex", "00zz");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'z' at position 2"));
  EXPECT_FALSE(DecodeHex("--x", "0x00").ok());
  EXPECT_FALSE(DecodeHex("--x", "00 11").ok());
}

TEST(DecodeHexTest, RoundTripsWithEncodeHex) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(*DecodeHex("--x", EncodeHex(all)), all);
  EXPECT_EQ(EncodeHex(std::string("\x01\xab", 2)), "01ab");
}

TEST(ParseKeyTypeTest, AcceptsEveryTypeInSeveralSpellings) {
  EXPECT_EQ(*ParseKeyType("ed25519"), v1::KEY_TYPE_ED25519);
  EXPECT_EQ(*ParseKeyType("X25519"), v1::KEY_TYPE_X25519);
  EXPECT_EQ(*ParseKeyType("chacha20-poly1305"), v1::KEY_TYPE_CHACHA20_POLY1305);
  EXPECT_EQ(*ParseKeyType("xchacha20_poly1305"), v1::KEY_TYPE_XCHACHA20_POLY1305);
  EXPECT_EQ(*ParseKeyType("aes256-gcm"), v1::KEY_TYPE_AES256_GCM);
  EXPECT_EQ(*ParseKeyType("KEY_TYPE_AES256_GCM"), v1::KEY_TYPE_AES256_GCM);
  EXPECT_EQ(ParseKeyType("rsa").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKeyType("").status().code(), absl::StatusCode::kInvalidArgument);
  for (auto type : {v1::KEY_TYPE_ED25519, v1::KEY_TYPE_X25519, v1::KEY_TYPE_CHACHA20_POLY1305,
                    v1::KEY_TYPE_XCHACHA20_POLY1305, v1::KEY_TYPE_AES256_GCM}) {
    EXPECT_EQ(*ParseKeyType(KeyTypeName(type)), type);
  }
}

TEST(FindCommandTest, FindsOneAndTwoWordCommands) {
  EXPECT_EQ((*FindCommand(Args({"sign", "k"})))->name, "sign");
  EXPECT_EQ((*FindCommand(Args({"keys", "create", "k"})))->name, "keys create");
  EXPECT_EQ((*FindCommand(Args({"keys", "list"})))->name, "keys list");
  EXPECT_EQ((*FindCommand(Args({"box-open", "k"})))->name, "box-open");
  EXPECT_FALSE(FindCommand(Args({})).ok());
  EXPECT_FALSE(FindCommand(Args({"keys"})).ok());
  EXPECT_FALSE(FindCommand(Args({"keys", "destroy"})).ok());
  EXPECT_FALSE(FindCommand(Args({"frobnicate"})).ok());
}

TEST(CheckCommandTest, ChecksArgumentCount) {
  Options o;
  const auto* create = *FindCommand(Args({"keys", "create"}));
  EXPECT_TRUE(CheckCommand(*create, Args({"keys", "create", "k"}), o).ok());
  EXPECT_FALSE(CheckCommand(*create, Args({"keys", "create"}), o).ok());
  EXPECT_FALSE(CheckCommand(*create, Args({"keys", "create", "a", "b"}), o).ok());
  EXPECT_FALSE(CheckCommand(*create, Args({"keys", "create", ""}), o).ok());
  const auto* verify = *FindCommand(Args({"verify"}));
  EXPECT_TRUE(CheckCommand(*verify, Args({"verify"}), o).ok());
  EXPECT_FALSE(CheckCommand(*verify, Args({"verify", "k"}), o).ok());
}

TEST(CheckCommandTest, RejectsFlagsOfOtherCommandsButAcceptsGlobals) {
  const auto* sign = *FindCommand(Args({"sign"}));
  Options o;
  o.specified = {"server", "timeout", "json", "message_hex"};
  EXPECT_TRUE(CheckCommand(*sign, Args({"sign", "k"}), o).ok());
  o.specified.insert("peer_hex");
  absl::Status status = CheckCommand(*sign, Args({"sign", "k"}), o);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("--peer_hex does not apply to 'sign'"));
}

TEST(CommandsTest, EveryCommandHasHelpAndAnExampleThatParses) {
  const std::string usage = UsageText();
  for (const CommandSpec& spec : Commands()) {
    EXPECT_FALSE(spec.synopsis.empty()) << spec.name;
    EXPECT_THAT(usage, HasSubstr(spec.name));
    EXPECT_THAT(usage, HasSubstr(spec.example));
    // The example's words after "offloadctl", minus flags, name this very command.
    std::vector<std::string> words;
    std::string word;
    bool quoted = false;
    for (char c : spec.example + " ") {
      if (c == '\'') quoted = !quoted;
      if (c == ' ' && !quoted) {
        if (!word.empty() && word[0] != '-' && word != "offloadctl") words.push_back(word);
        word.clear();
      } else {
        word.push_back(c);
      }
    }
    auto found = FindCommand(words);
    ASSERT_TRUE(found.ok()) << spec.example;
    EXPECT_EQ((*found)->name, spec.name);
    EXPECT_TRUE(CheckCommand(spec, words, Options()).ok()) << spec.example;
  }
}

TEST(ReadBytesInputTest, PicksTheOneFormGiven) {
  std::optional<std::string> text, hex, file;
  text = "hi";
  EXPECT_EQ(*ReadBytesInput("message", &text, &hex, &file, true, false), "hi");
  text.reset();
  hex = "6869";
  EXPECT_EQ(*ReadBytesInput("message", &text, &hex, &file, true, false), "hi");
  hex.reset();
  text = "";  // an explicitly empty message is a message
  EXPECT_EQ(*ReadBytesInput("message", &text, &hex, &file, true, false), "");
}

TEST(ReadBytesInputTest, ReadsFilesAsRawBytes) {
  const std::string path = ::testing::TempDir() + "/offloadctl_input.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("\x00\x01\xff\n", 4);
  }
  std::optional<std::string> file = path;
  EXPECT_EQ(*ReadBytesInput("envelope", nullptr, nullptr, &file, true, false),
            std::string("\x00\x01\xff\n", 4));
  std::remove(path.c_str());
  EXPECT_EQ(ReadBytesInput("envelope", nullptr, nullptr, &file, true, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReadBytesInputTest, RejectsTwoFormsAndMissingRequiredInput) {
  std::optional<std::string> text = "a", hex = "61", file;
  absl::Status two = ReadBytesInput("aad", &text, &hex, nullptr, false, false).status();
  EXPECT_EQ(two.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(two.message()), HasSubstr("--aad, --aad_hex"));

  std::optional<std::string> none_text, none_hex;
  EXPECT_EQ(*ReadBytesInput("aad", &none_text, &none_hex, nullptr, false, false), "");
  absl::Status missing =
      ReadBytesInput("secret", nullptr, &none_hex, &file, true, false).status();
  EXPECT_THAT(std::string(missing.message()), HasSubstr("--secret_hex, --secret_file"));
  hex = "6";
  EXPECT_FALSE(ReadBytesInput("aad", &none_text, &hex, nullptr, false, false).ok());
}

// A fake environment for ApplyEnvironment.
std::function<const char*(const char*)> Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(ApplyEnvironmentTest, FillsFlagsNotGivenAndNamesTheirSource) {
  Options o;
  o.tls_ca_file = "flag-ca.pem";
  o.specified = {"tls_ca_file"};
  ASSERT_TRUE(ApplyEnvironment(Env({{"OFFLOAD_TLS_CA_FILE", "env-ca.pem"},
                                    {"OFFLOAD_TLS_CERT_FILE", "env-cert.pem"},
                                    {"OFFLOAD_TLS_KEY_FILE", ""},  // empty: no value
                                    {"OFFLOAD_TLS_SERVER_NAME", "localhost"}}),
                               &o)
                  .ok());
  EXPECT_EQ(o.tls_ca_file, "flag-ca.pem");  // a flag wins over its variable
  EXPECT_EQ(o.tls_cert_file, "env-cert.pem");
  EXPECT_FALSE(o.tls_key_file.has_value());
  EXPECT_EQ(o.tls_server_name, "localhost");
  EXPECT_EQ(SourceOf(o, "tls_ca_file"), "--tls_ca_file");
  EXPECT_EQ(SourceOf(o, "tls_cert_file"), "OFFLOAD_TLS_CERT_FILE");
  EXPECT_TRUE(UsesTls(o));
  EXPECT_FALSE(UsesTls(Options()));
  Options only_tls;
  only_tls.tls = true;
  EXPECT_TRUE(UsesTls(only_tls));
  for (const auto& [flag, variable] : EnvironmentFlags()) {
    EXPECT_NE(std::find(GlobalFlags().begin(), GlobalFlags().end(), flag), GlobalFlags().end())
        << flag;
  }
}

TEST(ApplyEnvironmentTest, EitherTokenFlagWinsOverBothVariables) {
  Options o;
  o.token_file = "flag.jwt";
  o.specified = {"token_file"};
  ASSERT_TRUE(ApplyEnvironment(Env({{"OFFLOAD_TOKEN", "env-token"}}), &o).ok());
  EXPECT_FALSE(o.token.has_value());
  EXPECT_EQ(o.token_file, "flag.jwt");

  Options both_vars;
  absl::Status s = ApplyEnvironment(
      Env({{"OFFLOAD_TOKEN", "t"}, {"OFFLOAD_TOKEN_FILE", "f.jwt"}}), &both_vars);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("OFFLOAD_TOKEN, OFFLOAD_TOKEN_FILE"));

  Options both_flags;
  both_flags.token = "t";
  both_flags.token_file = "f.jwt";
  both_flags.specified = {"token", "token_file"};
  s = ApplyEnvironment(Env({}), &both_flags);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--token, --token_file"));
}

TEST(ReadTokenTest, ReadsTheFileTrimmedAndNeverShowsTheToken) {
  Options none;
  EXPECT_EQ(*ReadToken(none), "");

  const std::string path = ::testing::TempDir() + "/offloadctl_token.jwt";
  {
    std::ofstream out(path);
    out << "  aaa.bbb.ccc\n";
  }
  Options file;
  file.token_file = path;
  EXPECT_EQ(*ReadToken(file), "aaa.bbb.ccc");

  Options text;
  text.token = "aaa.bbb.ccc";
  EXPECT_EQ(*ReadToken(text), "aaa.bbb.ccc");
  text.token = "aaa.bbb ccc";
  absl::Status bad = ReadToken(text).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--token: expected visible ASCII"));
  EXPECT_THAT(std::string(bad.message()), Not(HasSubstr("aaa")));

  {
    std::ofstream out(path);
    out << "\n";
  }
  file.from_environment = {"token_file"};
  absl::Status empty = ReadToken(file).status();
  EXPECT_THAT(std::string(empty.message()), HasSubstr("OFFLOAD_TOKEN_FILE: '"));
  EXPECT_THAT(std::string(empty.message()), HasSubstr("holds no token"));
  std::remove(path.c_str());
  EXPECT_THAT(std::string(ReadToken(file).status().message()), HasSubstr("cannot open"));
}

TEST(CheckFlagSyntaxTest, AcceptsAbslSyntax) {
  EXPECT_TRUE(CheckFlagSyntax(Args({"--t_server=h:1", "sign", "k", "--t_box"})).ok());
  EXPECT_TRUE(CheckFlagSyntax(Args({"--t_server", "h:1", "-t_version=3", "--not_box"})).ok());
  EXPECT_TRUE(CheckFlagSyntax(Args({"--t_box=false", "--t_timeout=250ms", "-"})).ok());
  EXPECT_TRUE(CheckFlagSyntax(Args({"--", "--no_such_flag"})).ok());
  EXPECT_TRUE(CheckFlagSyntax(Args({"--t_server="})).ok());
}

TEST(CheckFlagSyntaxTest, ReturnsTheFlagsGiven) {
  auto specified =
      CheckFlagSyntax(Args({"-t_server", "h", "x", "--not_box", "--t_timeout=1s", "--", "--t_version=1"}));
  ASSERT_TRUE(specified.ok()) << specified.status();
  EXPECT_EQ(*specified, (std::set<std::string>{"t_server", "t_box", "t_timeout"}));
}

TEST(CheckFlagSyntaxTest, RejectsUnknownFlagsAndBadValues) {
  absl::Status unknown = CheckFlagSyntax(Args({"sign", "--mesage=hi"})).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("unknown flag --mesage"));
  EXPECT_FALSE(CheckFlagSyntax(Args({"--t_version=-1"})).ok());
  EXPECT_FALSE(CheckFlagSyntax(Args({"--t_version=x"})).ok());
  EXPECT_FALSE(CheckFlagSyntax(Args({"--t_timeout=10"})).ok());  // no unit
  EXPECT_FALSE(CheckFlagSyntax(Args({"--t_box=maybe"})).ok());
  EXPECT_FALSE(CheckFlagSyntax(Args({"--not_box=true"})).ok());
  EXPECT_FALSE(CheckFlagSyntax(Args({"--t_server"})).ok());  // value missing
  EXPECT_FALSE(CheckFlagSyntax(Args({"--not_server"})).ok());  // not a bool
}

TEST(ExitCodeTest, RpcErrorsAreTwoEverythingElseSixtyFour) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("bad hex")), kExitUsage);
  EXPECT_EQ(ExitCodeFor(MarkRpcError(absl::InvalidArgumentError("bad size"))), kExitRpcError);
  EXPECT_EQ(ExitCodeFor(MarkRpcError(absl::NotFoundError("no key"))), kExitRpcError);
  EXPECT_TRUE(MarkRpcError(absl::OkStatus()).ok());
  EXPECT_EQ(FormatError(absl::NotFoundError("no key 'k'")), "error: NOT_FOUND: no key 'k'");
}

TEST(FormatTest, KeyInfoShowsVersionsAndPublicKeys) {
  v1::KeyInfo key;
  key.set_key_id("alice");
  key.set_type(v1::KEY_TYPE_X25519);
  key.set_current_version(2);
  auto* first = key.add_versions();
  first->set_version(1);
  first->set_public_key(std::string("\x01\x02", 2));
  first->set_created_unix_seconds(0);
  key.add_versions()->set_version(2);
  const std::string text = FormatKeyInfo(key);
  EXPECT_THAT(text, HasSubstr("key_id: alice\ntype: x25519\ncurrent_version: 2\n"));
  EXPECT_THAT(text, HasSubstr("allow_zero_shared_secret: false\n"));
  EXPECT_THAT(text, HasSubstr("version: 1  created: 1970-01-01T00:00:00Z  public_key: 0102\n"));
  EXPECT_EQ(FormatKeyListLine(key), "alice  x25519  current_version=2  versions=2\n");
}

TEST(FormatTest, KeyInfoShowsLifecycleStates) {
  v1::KeyInfo key;
  key.set_key_id("vault");
  key.set_type(v1::KEY_TYPE_AES256_GCM);
  key.set_current_version(3);
  key.set_state(v1::KEY_STATE_PENDING_DELETION);
  key.set_deletion_unix_seconds(86400);
  key.set_min_decryption_version(2);
  auto* a = key.add_versions();
  a->set_version(1);
  a->set_state(v1::KEY_VERSION_STATE_DESTROYED);
  a->set_destroy_unix_seconds(60);
  auto* b = key.add_versions();
  b->set_version(2);
  b->set_state(v1::KEY_VERSION_STATE_DISABLED);
  auto* c = key.add_versions();
  c->set_version(3);
  c->set_state(v1::KEY_VERSION_STATE_ENABLED);
  const std::string text = FormatKeyInfo(key);
  EXPECT_THAT(text, HasSubstr("current_version: 3\nstate: pending-deletion\n"
                              "deletion: 1970-01-02T00:00:00Z\nmin_decryption_version: 2\n"));
  EXPECT_THAT(text, HasSubstr("version: 1  created: 1970-01-01T00:00:00Z  state: destroyed  "
                              "destroyed: 1970-01-01T00:01:00Z\n"));
  EXPECT_THAT(text, HasSubstr("version: 2  created: 1970-01-01T00:00:00Z  state: disabled\n"));
  EXPECT_EQ(FormatKeyListLine(key),
            "vault  aes256-gcm  current_version=3  versions=3  state=pending-deletion  "
            "deletion=1970-01-02T00:00:00Z  min_decryption_version=2  "
            "version_states=1:destroyed,2:disabled\n");
}

TEST(FormatTest, DeleteKeySaysWhenAndHowToCancel) {
  v1::DeleteKeyResponse response;
  response.set_deletion_unix_seconds(7200);
  response.mutable_key()->set_state(v1::KEY_STATE_PENDING_DELETION);
  EXPECT_EQ(FormatDeleteKey(response, "k", absl::FromUnixSeconds(3600)),
            "pending_deletion: k\ndeletion: 1970-01-01T02:00:00Z (in 1h)\n"
            "to keep it: offloadctl keys cancel-deletion k\n");
  // A server with --key_deletion_wait=0 destroys at once and answers no key.
  EXPECT_EQ(FormatDeleteKey(v1::DeleteKeyResponse(), "k", absl::FromUnixSeconds(0)),
            "deleted: k\n");
}

TEST(ArgsTest, VersionsAndWaits) {
  EXPECT_EQ(*ParseVersionArg("2"), 2u);
  for (const char* bad : {"0", "", "-1", "x", "1.5", "99999999999"}) {
    EXPECT_EQ(ParseVersionArg(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(*WaitSeconds(absl::Milliseconds(1500)), 2);
  EXPECT_EQ(*WaitSeconds(absl::ZeroDuration()), 0);
  EXPECT_EQ(WaitSeconds(absl::Seconds(-1)).status().code(), absl::StatusCode::kInvalidArgument);
  const auto* spec = *FindCommand(Args({"keys", "destroy-version"}));
  EXPECT_TRUE(CheckCommand(*spec, Args({"keys", "destroy-version", "k", "1"}), Options()).ok());
  EXPECT_FALSE(CheckCommand(*spec, Args({"keys", "destroy-version", "k"}), Options()).ok());
}

}  // namespace
}  // namespace offload::ctl
