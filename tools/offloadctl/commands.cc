#include "tools/offloadctl/commands.h"

#include <sodium.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/credentials.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/box.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"
#include "offload/v1/x25519.grpc.pb.h"
#include "service/auth/audit_chain.h"
#include "service/common/status_macros.h"

namespace offload::ctl {
namespace {

void Write(absl::string_view bytes) { std::fwrite(bytes.data(), 1, bytes.size(), stdout); }

void Wipe(std::string* s) {
  if (!s->empty()) sodium_memzero(s->data(), s->size());
}

absl::Status PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions json_options;
  json_options.preserve_proto_field_names = true;
  json_options.always_print_primitive_fields = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, json_options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("JSON encoding failed: ", status.ToString()));
  }
  Write(out);
  Write("\n");
  return absl::OkStatus();
}

absl::StatusOr<std::string> RequireHex(absl::string_view flag,
                                       const std::optional<std::string>& hex) {
  if (!hex.has_value()) return absl::InvalidArgumentError(absl::StrCat("missing --", flag));
  return DecodeHex(absl::StrCat("--", flag), *hex);
}

absl::StatusOr<std::string> OptionalHex(absl::string_view flag,
                                        const std::optional<std::string>& hex) {
  if (!hex.has_value()) return std::string();
  return DecodeHex(absl::StrCat("--", flag), *hex);
}

// The message or plaintext: --message, --message_hex, --message_file, else stdin.
absl::StatusOr<std::string> ReadMessage(const Options& o) {
  if (!o.message && !o.message_hex && !o.message_file && isatty(STDIN_FILENO)) {
    std::fputs("offloadctl: reading the message from stdin (end with Ctrl-D)\n", stderr);
  }
  return ReadBytesInput("message", &o.message, &o.message_hex, &o.message_file,
                        /*required=*/true, /*fallback_stdin=*/true);
}

absl::StatusOr<std::string> ReadAad(const Options& o) {
  return ReadBytesInput("aad", &o.aad, &o.aad_hex, nullptr, /*required=*/false,
                        /*fallback_stdin=*/false);
}

// Holds the channel and stubs of one invocation and runs calls with the --timeout deadline and
// the bearer token.
class Client final {
 public:
  // The channel of `options`: plain text, or TLS (UsesTls) with the CAs, client certificate and
  // server name given; the token read now. InvalidArgument (a usage error) for unreadable or
  // mismatched TLS files and unreadable or malformed tokens.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const Options& options) {
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    grpc::ChannelArguments args;
    if (UsesTls(options)) {
      client::TlsFiles files;
      files.ca_file = options.tls_ca_file.value_or("");
      files.cert_file = options.tls_cert_file.value_or("");
      files.key_file = options.tls_key_file.value_or("");
      OFFLOAD_ASSIGN_OR_RETURN(credentials, client::MakeTlsCredentials(files));
      const std::string name = options.tls_server_name.value_or("");
      if (!name.empty()) args.SetSslTargetNameOverride(name);
    }
    OFFLOAD_ASSIGN_OR_RETURN(std::string token, ReadToken(options));
    return std::unique_ptr<Client>(new Client(
        options, grpc::CreateCustomChannel(options.server, credentials, args), std::move(token)));
  }

  ~Client() { Wipe(&authorization_); }

  // Runs `call(context)` once with a fresh context; maps a gRPC error to a tagged absl::Status.
  template <typename Call>
  absl::Status Invoke(Call call) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    if (!authorization_.empty()) context.AddMetadata("authorization", authorization_);
    const grpc::Status status = call(&context);
    if (status.ok()) return absl::OkStatus();
    return MarkRpcError(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                     status.error_message()));
  }

  v1::KeyService::Stub& keys() { return *keys_; }
  v1::Ed25519Service::Stub& ed25519() { return *ed25519_; }
  v1::X25519Service::Stub& x25519() { return *x25519_; }
  v1::BoxService::Stub& box() { return *box_; }
  v1::AeadService::Stub& aead() { return *aead_; }

 private:
  Client(const Options& options, std::shared_ptr<grpc::Channel> channel, std::string token)
      : options_(options),
        channel_(std::move(channel)),
        keys_(v1::KeyService::NewStub(channel_)),
        ed25519_(v1::Ed25519Service::NewStub(channel_)),
        x25519_(v1::X25519Service::NewStub(channel_)),
        box_(v1::BoxService::NewStub(channel_)),
        aead_(v1::AeadService::NewStub(channel_)) {
    if (!token.empty()) authorization_ = absl::StrCat("Bearer ", token);
    Wipe(&token);
  }

  const Options& options_;
  std::string authorization_;  // "Bearer <token>", or empty
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KeyService::Stub> keys_;
  std::unique_ptr<v1::Ed25519Service::Stub> ed25519_;
  std::unique_ptr<v1::X25519Service::Stub> x25519_;
  std::unique_ptr<v1::BoxService::Stub> box_;
  std::unique_ptr<v1::AeadService::Stub> aead_;
};

absl::Status PrintKey(const Options& o, const v1::KeyInfo& key) {
  if (o.json) return PrintJson(key);
  Write(FormatKeyInfo(key));
  return absl::OkStatus();
}

absl::Status PrintPlaintext(const Options& o, const google::protobuf::Message& response,
                            const std::string& plaintext) {
  if (o.json) return PrintJson(response);
  if (o.hex_output) {
    Write(absl::StrCat(EncodeHex(plaintext), "\n"));
  } else {
    Write(plaintext);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::KeyType> RequireType(const Options& o) {
  if (!o.type.has_value()) {
    return absl::InvalidArgumentError(
        "missing --type (ed25519, x25519, chacha20-poly1305, xchacha20-poly1305, aes256-gcm)");
  }
  return ParseKeyType(*o.type);
}

absl::StatusOr<int> KeysCreate(Client& c, const Options& o, const std::string& id) {
  v1::CreateKeyRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(v1::KeyType type, RequireType(o));
  request.set_type(type);
  request.mutable_options()->set_allow_zero_shared_secret(o.allow_zero_shared_secret);
  v1::KeyInfo response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.keys().CreateKey(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintKey(o, response));
  return kExitOk;
}

absl::StatusOr<int> KeysImport(Client& c, const Options& o, const std::string& id) {
  v1::ImportKeyRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(v1::KeyType type, RequireType(o));
  request.set_type(type);
  request.mutable_options()->set_allow_zero_shared_secret(o.allow_zero_shared_secret);
  absl::Cleanup wipe = [&request] { Wipe(request.mutable_secret()); };
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_secret(),
                           ReadBytesInput("secret", nullptr, &o.secret_hex, &o.secret_file,
                                          /*required=*/true, /*fallback_stdin=*/false));
  v1::KeyInfo response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.keys().ImportKey(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintKey(o, response));
  return kExitOk;
}

absl::StatusOr<int> KeysList(Client& c, const Options& o) {
  v1::ListKeysResponse response;
  OFFLOAD_RETURN_IF_ERROR(c.Invoke(
      [&](auto* ctx) { return c.keys().ListKeys(ctx, v1::ListKeysRequest(), &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    for (const v1::KeyInfo& key : response.keys()) Write(FormatKeyListLine(key));
    if (o.verbose) std::fprintf(stderr, "%d key(s)\n", response.keys_size());
  }
  return kExitOk;
}

absl::StatusOr<int> KeysGet(Client& c, const Options& o, const std::string& id) {
  v1::GetKeyRequest request;
  request.set_key_id(id);
  v1::KeyInfo response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.keys().GetKey(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintKey(o, response));
  return kExitOk;
}

absl::StatusOr<int> KeysRotate(Client& c, const Options& o, const std::string& id) {
  v1::RotateKeyRequest request;
  request.set_key_id(id);
  v1::KeyInfo response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.keys().RotateKey(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintKey(o, response));
  return kExitOk;
}

absl::StatusOr<int> KeysDelete(Client& c, const Options& o, const std::string& id) {
  v1::DeleteKeyRequest request;
  request.set_key_id(id);
  if (o.wait.has_value()) {
    OFFLOAD_ASSIGN_OR_RETURN(int64_t seconds, WaitSeconds(*o.wait));
    request.set_wait_seconds(seconds);
  }
  v1::DeleteKeyResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.keys().DeleteKey(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(FormatDeleteKey(response, id, absl::Now()));
  }
  return kExitOk;
}

// The lifecycle calls that take a key id and answer the KeyInfo (`rpc(stub, ctx, &response)`).
template <typename Rpc>
absl::StatusOr<int> KeysChange(Client& c, const Options& o, Rpc rpc) {
  v1::KeyInfo response;
  OFFLOAD_RETURN_IF_ERROR(c.Invoke([&](auto* ctx) { return rpc(c.keys(), ctx, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintKey(o, response));
  return kExitOk;
}

absl::StatusOr<int> KeysCancelDeletion(Client& c, const Options& o, const std::string& id) {
  v1::CancelKeyDeletionRequest request;
  request.set_key_id(id);
  return KeysChange(c, o, [&](auto& stub, auto* ctx, v1::KeyInfo* r) {
    return stub.CancelKeyDeletion(ctx, request, r);
  });
}

absl::StatusOr<int> KeysDisable(Client& c, const Options& o, const std::string& id) {
  v1::DisableKeyRequest request;
  request.set_key_id(id);
  return KeysChange(c, o, [&](auto& stub, auto* ctx, v1::KeyInfo* r) {
    return stub.DisableKey(ctx, request, r);
  });
}

absl::StatusOr<int> KeysEnable(Client& c, const Options& o, const std::string& id) {
  v1::EnableKeyRequest request;
  request.set_key_id(id);
  return KeysChange(c, o, [&](auto& stub, auto* ctx, v1::KeyInfo* r) {
    return stub.EnableKey(ctx, request, r);
  });
}

// `keys disable-version|enable-version|destroy-version|restore-version ID V`.
absl::StatusOr<int> KeysVersion(Client& c, const Options& o, const std::string& name,
                                const std::string& id, const std::string& version_arg) {
  v1::KeyVersionRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(uint32_t version, ParseVersionArg(version_arg));
  request.set_version(version);
  if (o.wait.has_value()) {
    OFFLOAD_ASSIGN_OR_RETURN(int64_t seconds, WaitSeconds(*o.wait));
    request.set_wait_seconds(seconds);
  }
  return KeysChange(c, o, [&](v1::KeyService::Stub& stub, grpc::ClientContext* ctx,
                              v1::KeyInfo* r) {
    if (name == "keys disable-version") return stub.DisableKeyVersion(ctx, request, r);
    if (name == "keys enable-version") return stub.EnableKeyVersion(ctx, request, r);
    if (name == "keys destroy-version") return stub.DestroyKeyVersion(ctx, request, r);
    return stub.RestoreKeyVersion(ctx, request, r);
  });
}

absl::StatusOr<int> KeysMinDecryptionVersion(Client& c, const Options& o, const std::string& id,
                                             const std::string& version_arg) {
  v1::SetMinDecryptionVersionRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(uint32_t version, ParseVersionArg(version_arg));
  request.set_min_decryption_version(version);
  return KeysChange(c, o, [&](auto& stub, auto* ctx, v1::KeyInfo* r) {
    return stub.SetMinDecryptionVersion(ctx, request, r);
  });
}

absl::StatusOr<int> Sign(Client& c, const Options& o, const std::string& id) {
  v1::SignRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_message(), ReadMessage(o));
  v1::SignResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.ed25519().Sign(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(absl::StrCat("signature: ", EncodeHex(response.signature()),
                       "\nkey_version: ", response.key_version(),
                       "\npublic_key: ", EncodeHex(response.public_key()), "\n"));
  }
  return kExitOk;
}

absl::StatusOr<int> Verify(Client& c, const Options& o) {
  v1::VerifyRequest request;
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_public_key(),
                           RequireHex("public_key_hex", o.public_key_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_signature(),
                           RequireHex("signature_hex", o.signature_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_message(), ReadMessage(o));
  v1::VerifyResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.ed25519().Verify(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(response.valid() ? "valid\n" : "invalid\n");
  }
  if (o.verbose) std::fprintf(stderr, "memo_hit: %s\n", response.memo_hit() ? "true" : "false");
  return response.valid() ? kExitOk : kExitInvalidSignature;
}

absl::StatusOr<int> Derive(Client& c, const Options& o, const std::string& id) {
  v1::DeriveRequest request;
  request.set_key_id(id);
  request.set_key_version(o.version.value_or(0));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_peer_public_key(), RequireHex("peer_hex", o.peer_hex));
  request.set_output(o.box ? v1::DERIVE_OUTPUT_BOX_BEFORENM : v1::DERIVE_OUTPUT_RAW);
  v1::DeriveResponse response;
  absl::Cleanup wipe = [&response] { Wipe(response.mutable_shared_key()); };
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.x25519().Derive(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(absl::StrCat("shared_key: ", EncodeHex(response.shared_key()),
                       "\nkey_version: ", response.key_version(),
                       "\nmemo_hit: ", response.memo_hit() ? "true" : "false", "\n"));
  }
  return kExitOk;
}

absl::StatusOr<int> BoxSeal(Client& c, const Options& o, const std::string& id) {
  v1::BoxSealRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_peer_public_key(), RequireHex("peer_hex", o.peer_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_nonce(), OptionalHex("nonce_hex", o.nonce_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_plaintext(), ReadMessage(o));
  v1::BoxSealResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.box().Seal(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(absl::StrCat("nonce: ", EncodeHex(response.nonce()),
                       "\nciphertext: ", EncodeHex(response.ciphertext()),
                       "\nkey_version: ", response.key_version(), "\n"));
  }
  return kExitOk;
}

absl::StatusOr<int> BoxOpen(Client& c, const Options& o, const std::string& id) {
  v1::BoxOpenRequest request;
  request.set_key_id(id);
  request.set_key_version(o.version.value_or(0));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_peer_public_key(), RequireHex("peer_hex", o.peer_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_nonce(), RequireHex("nonce_hex", o.nonce_hex));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_ciphertext(),
                           ReadBytesInput("ciphertext", nullptr, &o.ciphertext_hex,
                                          &o.ciphertext_file, /*required=*/true,
                                          /*fallback_stdin=*/false));
  v1::BoxOpenResponse response;
  absl::Cleanup wipe = [&response] { Wipe(response.mutable_plaintext()); };
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.box().Open(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintPlaintext(o, response, response.plaintext()));
  if (o.verbose) std::fprintf(stderr, "memo_hit: %s\n", response.memo_hit() ? "true" : "false");
  return kExitOk;
}

absl::StatusOr<int> AeadSeal(Client& c, const Options& o, const std::string& id) {
  v1::AeadSealRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_associated_data(), ReadAad(o));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_plaintext(), ReadMessage(o));
  v1::AeadSealResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.aead().Seal(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(absl::StrCat("envelope: ", EncodeHex(response.envelope()),
                       "\nkey_version: ", response.key_version(), "\n"));
  }
  return kExitOk;
}

absl::StatusOr<int> AeadOpen(Client& c, const Options& o, const std::string& id) {
  v1::AeadOpenRequest request;
  request.set_key_id(id);
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_envelope(),
                           ReadBytesInput("envelope", nullptr, &o.envelope_hex, &o.envelope_file,
                                          /*required=*/true, /*fallback_stdin=*/false));
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_associated_data(), ReadAad(o));
  v1::AeadOpenResponse response;
  absl::Cleanup wipe = [&response] { Wipe(response.mutable_plaintext()); };
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.aead().Open(ctx, request, &response); }));
  OFFLOAD_RETURN_IF_ERROR(PrintPlaintext(o, response, response.plaintext()));
  if (o.verbose) {
    std::fprintf(stderr, "key_version: %u\nmemo_hit: %s\n", response.key_version(),
                 response.memo_hit() ? "true" : "false");
  }
  return kExitOk;
}

// `rewrap ID --envelopes_file=PATH`: one hex envelope per line (blank lines skipped), one
// BatchRewrap, one line out per envelope in: the new envelope's hex, or "error: CODE: message".
absl::StatusOr<int> AeadBatchRewrap(Client& c, const Options& o, const std::string& id,
                                    const std::string& aad) {
  OFFLOAD_ASSIGN_OR_RETURN(std::string text, ReadFileBytes(*o.envelopes_file));
  v1::BatchAeadRewrapRequest request;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    v1::AeadRewrapRequest* item = request.add_items();
    item->set_key_id(id);
    item->set_associated_data(aad);
    OFFLOAD_ASSIGN_OR_RETURN(
        *item->mutable_envelope(),
        DecodeHex(absl::StrCat("--envelopes_file line ", line_number), line));
  }
  if (request.items_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--envelopes_file: expected hex envelopes, one a line, got none in '",
                     *o.envelopes_file, "'"));
  }
  v1::BatchAeadRewrapResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.aead().BatchRewrap(ctx, request, &response); }));
  int failed = 0;
  for (const v1::BatchAeadRewrapResult& r : response.results()) {
    if (r.status().code() != 0) ++failed;
  }
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    for (const v1::BatchAeadRewrapResult& r : response.results()) {
      if (r.status().code() != 0) {
        Write(absl::StrCat(
            FormatError(absl::Status(static_cast<absl::StatusCode>(r.status().code()),
                                     r.status().message())),
            "\n"));
      } else {
        Write(absl::StrCat(EncodeHex(r.response().envelope()), "\n"));
      }
    }
  }
  if (failed != 0) {
    return MarkRpcError(absl::AbortedError(absl::StrCat(
        failed, " of ", response.results_size(), " envelope(s) not rewrapped")));
  }
  return kExitOk;
}

absl::StatusOr<int> AeadRewrap(Client& c, const Options& o, const std::string& id) {
  OFFLOAD_ASSIGN_OR_RETURN(std::string aad, ReadAad(o));
  if (o.envelopes_file.has_value()) {
    if (o.envelope_hex.has_value() || o.envelope_file.has_value()) {
      return absl::InvalidArgumentError(
          "expected at most one of --envelope_hex, --envelope_file, --envelopes_file, got 2");
    }
    return AeadBatchRewrap(c, o, id, aad);
  }
  v1::AeadRewrapRequest request;
  request.set_key_id(id);
  request.set_associated_data(aad);
  OFFLOAD_ASSIGN_OR_RETURN(*request.mutable_envelope(),
                           ReadBytesInput("envelope", nullptr, &o.envelope_hex, &o.envelope_file,
                                          /*required=*/true, /*fallback_stdin=*/false));
  v1::AeadRewrapResponse response;
  OFFLOAD_RETURN_IF_ERROR(
      c.Invoke([&](auto* ctx) { return c.aead().Rewrap(ctx, request, &response); }));
  if (o.json) {
    OFFLOAD_RETURN_IF_ERROR(PrintJson(response));
  } else {
    Write(absl::StrCat("envelope: ", EncodeHex(response.envelope()),
                       "\nkey_version: ", response.key_version(),
                       "\nprevious_key_version: ", response.previous_key_version(), "\n"));
  }
  return kExitOk;
}

// `audit verify FILE...`: the files' HMAC chains (service/auth/audit_chain.h) under --key_file,
// their order (previous_file_mac), and with --checkpoints, that no line was cut from their ends up
// to the last checkpoint.
absl::StatusOr<int> AuditVerify(const Options& o, absl::Span<const std::string> paths) {
  if (!o.key_file.has_value()) {
    return absl::InvalidArgumentError("audit verify: --key_file is required");
  }
  OFFLOAD_ASSIGN_OR_RETURN(KeyBytes key, auth::ReadAuditKey(*o.key_file));
  const auto read = [](const std::string& path) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("audit verify: cannot read ", path));
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  std::vector<auth::AuditFileText> files;
  for (const std::string& path : paths) {
    OFFLOAD_ASSIGN_OR_RETURN(std::string text, read(path));
    files.push_back({path, std::move(text)});
  }
  std::optional<std::string> checkpoints;
  if (o.checkpoints.has_value()) {
    OFFLOAD_ASSIGN_OR_RETURN(checkpoints, read(*o.checkpoints));
  }
  const auth::AuditTrailCheck check = auth::VerifyAuditTrail(
      files, absl::string_view(reinterpret_cast<const char*>(key.data()), key.size()),
      checkpoints.has_value() ? std::optional<absl::string_view>(*checkpoints) : std::nullopt);
  Write(check.message + "\n");
  return check.ok ? kExitOk : kExitInvalidSignature;
}

}  // namespace

absl::StatusOr<int> RunCommand(const CommandSpec& spec, absl::Span<const std::string> positional,
                               const Options& options) {
  if (spec.name == "help") {
    Write(UsageText());
    return kExitOk;
  }
  if (spec.name == "audit verify") return AuditVerify(options, positional.subspan(2));
  OFFLOAD_ASSIGN_OR_RETURN(std::unique_ptr<Client> made, Client::Create(options));
  Client& client = *made;
  // The positional arguments after the subcommand's words: ID, then V for the version commands.
  const size_t words = spec.name.find(' ') == std::string::npos ? 1 : 2;
  const std::string id = positional.size() > words ? positional[words] : "";
  const std::string arg2 = positional.size() > words + 1 ? positional[words + 1] : "";
  const std::string& n = spec.name;
  if (n == "keys create") return KeysCreate(client, options, id);
  if (n == "keys import") return KeysImport(client, options, id);
  if (n == "keys list") return KeysList(client, options);
  if (n == "keys get") return KeysGet(client, options, id);
  if (n == "keys rotate") return KeysRotate(client, options, id);
  if (n == "keys delete") return KeysDelete(client, options, id);
  if (n == "keys cancel-deletion") return KeysCancelDeletion(client, options, id);
  if (n == "keys disable") return KeysDisable(client, options, id);
  if (n == "keys enable") return KeysEnable(client, options, id);
  if (n == "keys disable-version" || n == "keys enable-version" || n == "keys destroy-version" ||
      n == "keys restore-version") {
    return KeysVersion(client, options, n, id, arg2);
  }
  if (n == "keys min-decryption-version") {
    return KeysMinDecryptionVersion(client, options, id, arg2);
  }
  if (n == "sign") return Sign(client, options, id);
  if (n == "verify") return Verify(client, options);
  if (n == "derive") return Derive(client, options, id);
  if (n == "box-seal") return BoxSeal(client, options, id);
  if (n == "box-open") return BoxOpen(client, options, id);
  if (n == "seal") return AeadSeal(client, options, id);
  if (n == "open") return AeadOpen(client, options, id);
  if (n == "rewrap") return AeadRewrap(client, options, id);
  return absl::InternalError(absl::StrCat("subcommand '", n, "' has no implementation"));
}

}  // namespace offload::ctl
