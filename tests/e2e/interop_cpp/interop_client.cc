// offload_grpc_interop_client: the C++ side of e2e.grpc_interop (tests/e2e/test_grpc_interop.py).
// Drives a server's gRPC port with the gRPC C++ library (Debian's libgrpc++ 1.51), the same cases
// the Python side drives with python3-grpcio, and checks answers, status codes and metadata.
//
//   offload_grpc_interop_client --address=127.0.0.1:50051 [--cases=unary,errors]
//
// Prints one line per case, "PASS <case>" or "FAIL <case>: <what went wrong>; ...", and exits 1
// if any case failed (2 on a usage error). Without --cases it runs every case but watch_drain.
// The server must run with the default --max_message_bytes (16 MiB). The cases create their own
// keys (interop-cpp-*), so several runs may share one server.
//
// watch_drain is run alone against a server the caller then stops: it prints "WATCHING" once a
// grpc.health.v1 Watch reported SERVING, and expects NOT_SERVING and the stream's end with
// UNAVAILABLE once the caller sent the server SIGTERM.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "offload/v1/aead.grpc.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"
#include "offload/v1/keys.grpc.pb.h"

namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using offload::v1::AeadOpenRequest;
using offload::v1::AeadOpenResponse;
using offload::v1::AeadSealRequest;
using offload::v1::AeadSealResponse;
using offload::v1::VerifyRequest;
using offload::v1::VerifyResponse;
using offload::v1::SignRequest;
using offload::v1::SignResponse;

constexpr int64_t kMaxMessageBytes = 16 << 20;   // the server's default --max_message_bytes
constexpr int kClientMaxMessageBytes = 64 << 20;  // this client's limit: the server's is tested
constexpr size_t kGzipPlaintextBytes = 1 << 20;   // the Python side checks the wire bytes by it
constexpr auto kTimeout = std::chrono::seconds(60);
constexpr char kEdKey[] = "interop-cpp-ed";
constexpr char kAeadKey[] = "interop-cpp-aead";
constexpr size_t kChachaEnvelopeOverhead = 1 + 4 + 12 + 16;  // version, key version, nonce, tag

// What one case found wrong; empty when it passed.
class Failures {
 public:
  void Expect(bool ok, const std::string& what) {
    if (!ok) failures_.push_back(what);
  }
  // `status` has `code`, and its message contains each of `parts`.
  void ExpectStatus(const grpc::Status& status, grpc::StatusCode code, const std::string& what,
                    std::vector<std::string> parts = {}) {
    if (status.error_code() != code) {
      failures_.push_back(absl::StrCat(what, ": expected code ", code, ", got ",
                                       status.error_code(), " (", status.error_message(), ")"));
      return;
    }
    for (const std::string& part : parts) {
      Expect(absl::StrContains(status.error_message(), part),
             absl::StrCat(what, ": message \"", status.error_message(), "\" does not name ", part));
    }
    ExpectDetailsDecode(status, what);
  }
  bool ok() const { return failures_.empty(); }
  std::string Summary() const { return absl::StrJoin(failures_, "; "); }

 private:
  // grpc-status-details-bin, when the server sends it, is a google.rpc.Status (code = 1,
  // message = 2, details = 3) that agrees with grpc-status and grpc-message.
  void ExpectDetailsDecode(const grpc::Status& status, const std::string& what) {
    if (status.error_details().empty()) return;
    google::protobuf::UnknownFieldSet fields;
    if (!fields.ParseFromString(status.error_details())) {
      failures_.push_back(absl::StrCat(what, ": grpc-status-details-bin is not a protobuf"));
      return;
    }
    for (int i = 0; i < fields.field_count(); ++i) {
      const google::protobuf::UnknownField& f = fields.field(i);
      if (f.number() == 1) {
        Expect(f.type() == google::protobuf::UnknownField::TYPE_VARINT &&
                   static_cast<int>(f.varint()) == status.error_code(),
               absl::StrCat(what, ": grpc-status-details-bin has another code"));
      } else if (f.number() == 2) {
        Expect(f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
                   f.length_delimited() == status.error_message(),
               absl::StrCat(what, ": grpc-status-details-bin has another message"));
      }
    }
  }

  std::vector<std::string> failures_;
};

void SetDeadline(grpc::ClientContext* context,
                 std::chrono::system_clock::duration timeout = kTimeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

// `n` bytes from a fixed seed (plaintexts and messages; nothing secret).
std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t word = gen();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<char>(word >> (8 * j));
  }
  return out;
}

// `n` bytes of repetitive text: gzip takes most of it off.
std::string CompressibleText(size_t n) {
  std::string out;
  while (out.size() < n) {
    absl::StrAppend(&out, "{\"user\":", out.size() % 977, ",\"state\":\"a compressible line\"}\n");
  }
  out.resize(n);
  return out;
}

class Client {
 public:
  explicit Client(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(kClientMaxMessageBytes);
    args.SetMaxReceiveMessageSize(kClientMaxMessageBytes);
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    keys_ = offload::v1::KeyService::NewStub(channel_);
    ed_ = offload::v1::Ed25519Service::NewStub(channel_);
    aead_ = offload::v1::AeadService::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  // Creates the keys the cases use unless they exist (an earlier run on the same server).
  grpc::Status CreateKeys() {
    for (const auto& [id, type] : {std::pair{kEdKey, offload::v1::KEY_TYPE_ED25519},
                                   std::pair{kAeadKey, offload::v1::KEY_TYPE_CHACHA20_POLY1305}}) {
      grpc::ClientContext context;
      SetDeadline(&context);
      offload::v1::CreateKeyRequest request;
      request.set_key_id(id);
      request.set_type(type);
      offload::v1::KeyInfo info;
      grpc::Status s = keys_->CreateKey(&context, request, &info);
      if (!s.ok() && s.error_code() != grpc::StatusCode::ALREADY_EXISTS) return s;
    }
    return grpc::Status::OK;
  }

  // --- the cases ---------------------------------------------------------------------------

  // Ed25519 Sign/Verify (and a batch), AEAD Seal/Open with associated data.
  void Unary(Failures& f) {
    const std::string message = "interop from C++";
    SignResponse signed_once;
    f.ExpectStatus(Sign(message, &signed_once), grpc::StatusCode::OK, "Sign");
    f.Expect(signed_once.signature().size() == 64 && signed_once.public_key().size() == 32,
             "Sign: expected a 64-byte signature and a 32-byte public key");
    SignResponse signed_again;
    f.ExpectStatus(Sign(message, &signed_again), grpc::StatusCode::OK, "Sign again");
    f.Expect(signed_again.signature() == signed_once.signature(),
             "Sign: Ed25519 is deterministic, the second signature differs");
    f.Expect(VerifyValid(signed_once.public_key(), message, signed_once.signature()) == 1,
             "Verify: the signature is not valid");
    f.Expect(VerifyValid(signed_once.public_key(), message + "!", signed_once.signature()) == 0,
             "Verify: the signature is valid for another message");

    offload::v1::BatchVerifyRequest batch;
    for (int i = 0; i < 8; ++i) {
      VerifyRequest* item = batch.add_items();
      item->set_public_key(signed_once.public_key());
      item->set_message(i % 2 == 0 ? message : "other");
      item->set_signature(signed_once.signature());
    }
    offload::v1::BatchVerifyResponse results;
    grpc::ClientContext batch_context;
    SetDeadline(&batch_context);
    f.ExpectStatus(ed_->BatchVerify(&batch_context, batch, &results), grpc::StatusCode::OK,
                   "BatchVerify");
    f.Expect(results.results_size() == 8, "BatchVerify: expected 8 results");
    for (int i = 0; i < results.results_size(); ++i) {
      f.Expect(results.results(i).valid() == (i % 2 == 0),
               absl::StrCat("BatchVerify: item ", i, " has the wrong answer"));
    }

    const std::string plaintext = RandomBytes(3000, 1);
    AeadSealResponse sealed;
    f.ExpectStatus(Seal(plaintext, "user-42", &sealed), grpc::StatusCode::OK, "Seal");
    f.Expect(sealed.envelope().size() == plaintext.size() + kChachaEnvelopeOverhead,
             absl::StrCat("Seal: expected a ", plaintext.size() + kChachaEnvelopeOverhead,
                          "-byte envelope, got ", sealed.envelope().size()));
    AeadOpenResponse opened;
    f.ExpectStatus(Open(sealed.envelope(), "user-42", &opened), grpc::StatusCode::OK, "Open");
    f.Expect(opened.plaintext() == plaintext, "Open: the plaintext differs from the one sealed");
    f.ExpectStatus(Open(sealed.envelope(), "user-43", &opened), grpc::StatusCode::INVALID_ARGUMENT,
                   "Open with other associated data");
  }

  // Bad arguments name their field; a missing key and an unknown method have their codes.
  void Errors(Failures& f) {
    VerifyResponse response;
    f.ExpectStatus(Verify(std::string(5, 'k'), "m", std::string(64, 's'), &response),
                   grpc::StatusCode::INVALID_ARGUMENT, "Verify with a 5-byte public key",
                   {"public_key"});
    f.ExpectStatus(Verify(std::string(32, 'k'), "m", std::string(10, 's'), &response),
                   grpc::StatusCode::INVALID_ARGUMENT, "Verify with a 10-byte signature",
                   {"signature"});
    AeadOpenResponse opened;
    f.ExpectStatus(Open("short", "", &opened), grpc::StatusCode::INVALID_ARGUMENT,
                   "Open of a 5-byte envelope", {"envelope"});
    grpc::ClientContext context;
    SetDeadline(&context);
    SignRequest request;
    request.set_key_id("interop-cpp-missing");
    request.set_message("m");
    SignResponse signed_message;
    f.ExpectStatus(ed_->Sign(&context, request, &signed_message), grpc::StatusCode::NOT_FOUND,
                   "Sign with a missing key", {"interop-cpp-missing"});
    std::string unused;
    f.ExpectStatus(GenericCall("/offload.v1.Ed25519Service/Nope", "", &unused),
                   grpc::StatusCode::UNIMPLEMENTED, "an unknown method", {"Nope"});
    ExpectServing(f, "after the errors");
  }

  // A 1 ms deadline on a 1024-item batch of full verifications: DEADLINE_EXCEEDED.
  void Deadline(Failures& f) {
    offload::v1::BatchVerifyRequest batch = SlowBatch(f, 2);
    offload::v1::BatchVerifyResponse results;
    grpc::ClientContext context;
    SetDeadline(&context, std::chrono::milliseconds(1));
    f.ExpectStatus(ed_->BatchVerify(&context, batch, &results),
                   grpc::StatusCode::DEADLINE_EXCEEDED, "BatchVerify with a 1 ms deadline");
    ExpectServing(f, "after the deadline");
  }

  // A unary call cancelled while in flight, and a Watch stream cancelled after its first
  // message: CANCELLED, and the channel goes on serving.
  void Cancel(Failures& f) {
    // The batch takes the server tens of milliseconds; the cancel follows its start at once. Should
    // the call win the race all the same, it is tried again on a fresh batch.
    grpc::Status status;
    for (int attempt = 0; attempt < 5; ++attempt) {
      offload::v1::BatchVerifyRequest batch = SlowBatch(f, 100 + attempt);
      offload::v1::BatchVerifyResponse results;
      grpc::ClientContext context;
      SetDeadline(&context);
      std::promise<grpc::Status> done;
      ed_->async()->BatchVerify(&context, &batch, &results,
                                [&done](grpc::Status s) { done.set_value(std::move(s)); });
      context.TryCancel();
      status = done.get_future().get();
      if (!status.ok()) break;
    }
    f.ExpectStatus(status, grpc::StatusCode::CANCELLED, "BatchVerify cancelled in flight");

    grpc::ClientContext context;
    SetDeadline(&context);
    HealthCheckRequest request;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
        health_->Watch(&context, request);
    HealthCheckResponse first;
    f.Expect(watch->Read(&first) && first.status() == HealthCheckResponse::SERVING,
             "Watch: expected SERVING first");
    context.TryCancel();
    HealthCheckResponse more;
    while (watch->Read(&more)) {
    }
    f.ExpectStatus(watch->Finish(), grpc::StatusCode::CANCELLED, "Watch cancelled in flight");
    ExpectServing(f, "after the cancellations");
  }

  // gzip both ways: a compressible plaintext sealed in a gzip'd request, and opened (the client
  // accepts gzip: the server compresses the answer). The Python side counts the wire bytes.
  void Gzip(Failures& f) {
    const std::string plaintext = CompressibleText(kGzipPlaintextBytes);
    grpc::ClientContext seal_context;
    SetDeadline(&seal_context);
    seal_context.set_compression_algorithm(GRPC_COMPRESS_GZIP);
    AeadSealRequest seal;
    seal.set_key_id(kAeadKey);
    seal.set_plaintext(plaintext);
    AeadSealResponse sealed;
    f.ExpectStatus(aead_->Seal(&seal_context, seal, &sealed), grpc::StatusCode::OK, "gzip'd Seal");
    AeadOpenResponse opened;
    f.ExpectStatus(Open(sealed.envelope(), "", &opened), grpc::StatusCode::OK, "Open");
    f.Expect(opened.plaintext() == plaintext, "Open: the plaintext differs from the one sealed");
  }

  // Text and -bin request metadata (a value with every byte, a long text value) pass. The
  // response metadata an application sees is what the engine sends: `date` and `server`.
  void Metadata(Failures& f) {
    grpc::ClientContext context;
    SetDeadline(&context);
    std::string every_byte;
    for (int i = 0; i < 256; ++i) every_byte.push_back(static_cast<char>(i));
    context.AddMetadata("x-offload-key", kEdKey);
    context.AddMetadata("x-interop-text", "hello, interop");
    context.AddMetadata("x-interop-long", std::string(2048, 'v'));
    context.AddMetadata("x-interop-bin", every_byte);
    SignRequest request;
    request.set_key_id(kEdKey);
    request.set_message("metadata");
    SignResponse response;
    f.ExpectStatus(ed_->Sign(&context, request, &response), grpc::StatusCode::OK,
                   "Sign with metadata");
    f.Expect(response.signature().size() == 64, "Sign with metadata: no 64-byte signature");
    std::map<std::string, std::string> initial;
    for (const auto& [key, value] : context.GetServerInitialMetadata()) {
      initial.emplace(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
    }
    f.Expect(initial.size() == 2 && initial.count("date") == 1 &&
                 initial["server"] == "crypto-offload",
             absl::StrCat("response headers: expected date and server: crypto-offload, got ",
                          absl::StrJoin(initial, ", ", absl::PairFormatter(": "))));
    f.Expect(context.GetServerTrailingMetadata().empty(),
             "response trailers: expected no metadata beside the status");
  }

  // Requests at and just under --max_message_bytes succeed (Ed25519 Verify of a message sized so
  // the request is exactly 16 MiB, AEAD Seal and Open sized so the Open request is); one byte
  // more is RESOURCE_EXHAUSTED, and the connection goes on serving.
  void MaxMessage(Failures& f) {
    SignResponse signature;
    VerifyRequest verify;
    verify.set_public_key(std::string(32, '\0'));
    verify.set_signature(std::string(64, '\0'));
    verify.set_message(SizedFill(&verify, [](VerifyRequest* r, std::string m) {
      r->set_message(std::move(m));
    }));
    f.ExpectStatus(Sign(verify.message(), &signature), grpc::StatusCode::OK,
                   "Sign of a message just under the limit");
    verify.set_public_key(signature.public_key());
    verify.set_signature(signature.signature());
    f.Expect(static_cast<int64_t>(verify.ByteSizeLong()) == kMaxMessageBytes,
             "Verify request: not exactly the limit");
    VerifyResponse verified;
    f.ExpectStatus(Verify(verify.public_key(), verify.message(), verify.signature(), &verified),
                   grpc::StatusCode::OK, "Verify of a request at the limit");
    f.Expect(verified.valid(), "Verify of a request at the limit: not valid");

    // The Open request carries the envelope, 33 bytes more than the plaintext: size it to the
    // limit, and the Seal request and both answers fit.
    AeadOpenRequest open;
    open.set_key_id(kAeadKey);
    const std::string envelope_sized = SizedFill(&open, [](AeadOpenRequest* r, std::string m) {
      r->set_envelope(std::move(m));
    });
    const std::string plaintext =
        RandomBytes(envelope_sized.size() - kChachaEnvelopeOverhead, 3);
    AeadSealResponse sealed;
    f.ExpectStatus(Seal(plaintext, "", &sealed), grpc::StatusCode::OK,
                   "Seal of a plaintext just under the limit");
    open.set_envelope(sealed.envelope());
    f.Expect(static_cast<int64_t>(open.ByteSizeLong()) == kMaxMessageBytes,
             "Open request: not exactly the limit");
    AeadOpenResponse opened;
    f.ExpectStatus(Open(sealed.envelope(), "", &opened), grpc::StatusCode::OK,
                   "Open of a request at the limit");
    f.Expect(opened.plaintext() == plaintext, "Open at the limit: the plaintext differs");

    grpc::ClientContext context;
    SetDeadline(&context);
    SignRequest over;
    over.set_key_id(kEdKey);
    over.set_message(SizedFill(&over, [](SignRequest* r, std::string m) {
      r->set_message(std::move(m));
    }) + "x");
    SignResponse unused;
    f.ExpectStatus(ed_->Sign(&context, over, &unused), grpc::StatusCode::RESOURCE_EXHAUSTED,
                   "Sign of a request one byte over the limit");
    ExpectServing(f, "after the largest messages");
  }

  // Server reflection v1 on one stream: the services listed, the file of offload.v1.AeadService
  // (with its imports) into a DescriptorPool, then Seal called through grpc::GenericStub with
  // messages built from that pool alone, and the envelope opened with the generated stub.
  void Reflection(Failures& f) {
    namespace refl = grpc::reflection::v1;
    auto stub = refl::ServerReflection::NewStub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    auto stream = stub->ServerReflectionInfo(&context);
    refl::ServerReflectionRequest list;
    list.set_list_services("");
    refl::ServerReflectionRequest symbol;
    symbol.set_file_containing_symbol("offload.v1.AeadService");
    refl::ServerReflectionResponse listed, described;
    f.Expect(stream->Write(list) && stream->Read(&listed), "reflection: no list_services answer");
    f.Expect(stream->Write(symbol) && stream->Read(&described),
             "reflection: no file_containing_symbol answer");
    stream->WritesDone();
    f.ExpectStatus(stream->Finish(), grpc::StatusCode::OK, "ServerReflectionInfo");

    std::vector<std::string> services;
    for (const auto& s : listed.list_services_response().service()) services.push_back(s.name());
    for (const char* want :
         {"offload.v1.KeyService", "offload.v1.Ed25519Service", "offload.v1.X25519Service",
          "offload.v1.BoxService", "offload.v1.AeadService", "grpc.health.v1.Health",
          "grpc.reflection.v1.ServerReflection"}) {
      f.Expect(std::find(services.begin(), services.end(), want) != services.end(),
               absl::StrCat("reflection: ", want, " not listed (got ",
                            absl::StrJoin(services, ","), ")"));
    }

    google::protobuf::SimpleDescriptorDatabase database;
    for (const std::string& raw : described.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      f.Expect(file.ParseFromString(raw) && database.Add(file),
               "reflection: a FileDescriptorProto that does not parse or repeats");
    }
    google::protobuf::DescriptorPool pool(&database);
    const google::protobuf::ServiceDescriptor* service =
        pool.FindServiceByName("offload.v1.AeadService");
    const google::protobuf::MethodDescriptor* method =
        service == nullptr ? nullptr : service->FindMethodByName("Seal");
    if (method == nullptr) {
      f.Expect(false, "reflection: offload.v1.AeadService.Seal cannot be built from the files");
      return;
    }
    google::protobuf::DynamicMessageFactory factory(&pool);
    std::unique_ptr<google::protobuf::Message> request(
        factory.GetPrototype(method->input_type())->New());
    std::unique_ptr<google::protobuf::Message> response(
        factory.GetPrototype(method->output_type())->New());
    const std::string plaintext = "sealed by a reflected method";
    const auto* reflection = request->GetReflection();
    reflection->SetString(request.get(), method->input_type()->FindFieldByName("key_id"), kAeadKey);
    reflection->SetString(request.get(), method->input_type()->FindFieldByName("plaintext"),
                          plaintext);
    std::string answer;
    f.ExpectStatus(GenericCall("/offload.v1.AeadService/Seal", request->SerializeAsString(),
                               &answer),
                   grpc::StatusCode::OK, "generic Seal");
    f.Expect(response->ParseFromString(answer), "generic Seal: the answer does not parse");
    const google::protobuf::FieldDescriptor* envelope_field =
        method->output_type()->FindFieldByName("envelope");
    const std::string envelope =
        envelope_field == nullptr ? "" : response->GetReflection()->GetString(*response, envelope_field);
    AeadOpenResponse opened;
    f.ExpectStatus(Open(envelope, "", &opened), grpc::StatusCode::OK, "Open of the generic Seal");
    f.Expect(opened.plaintext() == plaintext, "Open of the generic Seal: the plaintext differs");
  }

  // Health Watch across a drain (see the file comment).
  void WatchDrain(Failures& f) {
    grpc::ClientContext context;
    SetDeadline(&context, std::chrono::seconds(120));
    HealthCheckRequest request;
    auto watch = health_->Watch(&context, request);
    std::vector<int> statuses;
    HealthCheckResponse response;
    if (watch->Read(&response)) statuses.push_back(response.status());
    f.Expect(statuses == std::vector<int>{HealthCheckResponse::SERVING},
             "Watch: expected SERVING first");
    std::printf("WATCHING\n");
    std::fflush(stdout);
    while (watch->Read(&response)) statuses.push_back(response.status());
    f.Expect(statuses == std::vector<int>{HealthCheckResponse::SERVING,
                                          HealthCheckResponse::NOT_SERVING},
             absl::StrCat("Watch: expected SERVING then NOT_SERVING, got ",
                          absl::StrJoin(statuses, ",")));
    f.ExpectStatus(watch->Finish(), grpc::StatusCode::UNAVAILABLE, "Watch across the drain");
  }

 private:
  grpc::Status Sign(const std::string& message, SignResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    SignRequest request;
    request.set_key_id(kEdKey);
    request.set_message(message);
    return ed_->Sign(&context, request, response);
  }

  grpc::Status Verify(const std::string& public_key, const std::string& message,
                      const std::string& signature, VerifyResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    VerifyRequest request;
    request.set_public_key(public_key);
    request.set_message(message);
    request.set_signature(signature);
    return ed_->Verify(&context, request, response);
  }

  // 1 valid, 0 invalid, -1 the call failed.
  int VerifyValid(const std::string& public_key, const std::string& message,
                  const std::string& signature) {
    VerifyResponse response;
    if (!Verify(public_key, message, signature, &response).ok()) return -1;
    return response.valid() ? 1 : 0;
  }

  grpc::Status Seal(const std::string& plaintext, const std::string& aad,
                    AeadSealResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    AeadSealRequest request;
    request.set_key_id(kAeadKey);
    request.set_plaintext(plaintext);
    request.set_associated_data(aad);
    return aead_->Seal(&context, request, response);
  }

  grpc::Status Open(const std::string& envelope, const std::string& aad,
                    AeadOpenResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    AeadOpenRequest request;
    request.set_key_id(kAeadKey);
    request.set_envelope(envelope);
    request.set_associated_data(aad);
    return aead_->Open(&context, request, response);
  }

  // A unary call of `method` (a path) through grpc::GenericStub, with serialized messages.
  grpc::Status GenericCall(const std::string& method, const std::string& request,
                           std::string* response) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Slice slice(request);
    grpc::ByteBuffer request_buffer(&slice, 1);
    grpc::ByteBuffer response_buffer;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request_buffer, &response_buffer,
                   [&done](grpc::Status s) { done.set_value(std::move(s)); });
    grpc::Status status = done.get_future().get();
    std::vector<grpc::Slice> slices;
    response->clear();
    if (status.ok() && response_buffer.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
  }

  // The bytes that make `*request` exactly kMaxMessageBytes once `set` puts them in its field
  // (any length from 2 MiB on takes a 4-byte varint, so one correction is exact).
  template <typename Request, typename Setter>
  static std::string SizedFill(Request* request, Setter set) {
    Request probe = *request;
    set(&probe, std::string(kMaxMessageBytes - 64, 'm'));
    const size_t size = kMaxMessageBytes - 64 + (kMaxMessageBytes - probe.ByteSizeLong());
    return RandomBytes(size, 2);
  }

  // 1024 full verifications that fail: a valid signature under other messages. Failures are
  // never memoised, so every call costs the server 1024 curve operations (tens of milliseconds).
  offload::v1::BatchVerifyRequest SlowBatch(Failures& f, uint64_t seed) {
    SignResponse signed_message;
    f.ExpectStatus(Sign("slow", &signed_message), grpc::StatusCode::OK, "Sign");
    offload::v1::BatchVerifyRequest batch;
    for (int i = 0; i < 1024; ++i) {
      VerifyRequest* item = batch.add_items();
      item->set_public_key(signed_message.public_key());
      item->set_message(RandomBytes(1024, seed * 10007 + i));
      item->set_signature(signed_message.signature());
    }
    return batch;
  }

  void ExpectServing(Failures& f, const std::string& when) {
    grpc::ClientContext context;
    SetDeadline(&context);
    HealthCheckResponse response;
    grpc::Status s = health_->Check(&context, HealthCheckRequest(), &response);
    f.Expect(s.ok() && response.status() == HealthCheckResponse::SERVING,
             absl::StrCat("health Check ", when, ": ", s.error_code(), " ", s.error_message()));
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<offload::v1::KeyService::Stub> keys_;
  std::unique_ptr<offload::v1::Ed25519Service::Stub> ed_;
  std::unique_ptr<offload::v1::AeadService::Stub> aead_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

using CaseFn = void (Client::*)(Failures&);

const std::vector<std::pair<std::string, CaseFn>>& AllCases() {
  static const auto* cases = new std::vector<std::pair<std::string, CaseFn>>{
      {"unary", &Client::Unary},           {"errors", &Client::Errors},
      {"deadline", &Client::Deadline},     {"cancel", &Client::Cancel},
      {"gzip", &Client::Gzip},             {"metadata", &Client::Metadata},
      {"max_message", &Client::MaxMessage}, {"reflection", &Client::Reflection},
      {"watch_drain", &Client::WatchDrain}};
  return *cases;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  std::vector<std::string> wanted;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--address=")) {
      address = arg.substr(sizeof("--address=") - 1);
    } else if (absl::StartsWith(arg, "--cases=")) {
      wanted = absl::StrSplit(arg.substr(sizeof("--cases=") - 1), ',', absl::SkipEmpty());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (address.empty()) {
    std::fprintf(stderr, "usage: %s --address=HOST:PORT [--cases=unary,errors,...]\n", argv[0]);
    return 2;
  }
  std::map<std::string, CaseFn> known(AllCases().begin(), AllCases().end());
  if (wanted.empty()) {
    for (const auto& [name, fn] : AllCases()) {
      if (name != "watch_drain") wanted.push_back(name);
    }
  }
  for (const std::string& name : wanted) {
    if (known.count(name) == 0) {
      std::fprintf(stderr, "unknown case %s\n", name.c_str());
      return 2;
    }
  }

  Client client(address);
  if (grpc::Status s = client.CreateKeys(); !s.ok()) {
    std::printf("FAIL setup: CreateKey: %d %s\n", s.error_code(), s.error_message().c_str());
    return 1;
  }
  int failed = 0;
  for (const std::string& name : wanted) {
    Failures f;
    (client.*known[name])(f);
    if (f.ok()) {
      std::printf("PASS %s\n", name.c_str());
    } else {
      std::printf("FAIL %s: %s\n", name.c_str(), f.Summary().c_str());
      ++failed;
    }
    std::fflush(stdout);
  }
  return failed == 0 ? 0 : 1;
}
