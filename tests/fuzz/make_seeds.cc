// Writes the seed corpora of the fuzz targets from the shared test vectors (../shared/testvectors)
// and from real service output: offload_fuzz_seeds <out dir> makes <out dir>/<target>/seed-N.
// Requests carry Wycheproof / RFC / NaCl vector bytes (public keys, signatures, peers, nonces,
// plaintexts, associated data, ciphertexts), and the fixed keys of fuzz_support.h sign, seal
// and box some of them so that the corpora start with inputs that succeed, not only ones that
// fail. run_fuzz.sh and the ctest `fuzz.*` tests run it before fuzzing; nothing is committed but
// the few hand-written seeds in tests/fuzz/seeds/.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/keys.pb.h"
#include "offload/v1/x25519.pb.h"
#include "grpc/reflection/v1/reflection.pb.h"
#include "service/http/protocol.h"
#include "service/keys/envelope.h"
#include "service/keys/file_key_store.h"
#include "service/keys/record_codec.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/testing/vectors.h"

namespace offload::fuzz {
namespace {

using testvectors::LoadJsonOrDie;
using testvectors::UnhexField;

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::string StrField(const nlohmann::json& j) { return Str(UnhexField(j)); }

class Writer {
 public:
  explicit Writer(std::string root) : root_(std::move(root)) {}
  void Add(const std::string& target, const std::string& bytes) {
    const std::string dir = absl::StrCat(root_, "/", target);
    std::filesystem::create_directories(dir);
    const std::string path = absl::StrCat(dir, "/seed-", counts_[target]++);
    std::ofstream(path, std::ios::binary) << bytes;
  }
  // A selector byte, then a message.
  void Add(const std::string& target, uint8_t selector, const google::protobuf::Message& m) {
    Add(target, std::string(1, static_cast<char>(selector)) + m.SerializeAsString());
  }
  void Report() const {
    for (const auto& [target, n] : counts_) std::printf("%s: %d seeds\n", target.c_str(), n);
  }

 private:
  std::string root_;
  std::map<std::string, int> counts_;
};

// The HTTP target's text form of a request (see http_fuzzer.cc), in each protocol and codec.
void AddHttp(Writer& w, absl::string_view path, const google::protobuf::Message& request) {
  const std::string proto = request.SerializeAsString();
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(request, &json);
  const std::string p(path);
  w.Add("http", absl::StrCat(p, "\nContent-Type: application/proto\n\n", proto));
  w.Add("http", absl::StrCat(p, "\nContent-Type: application/json\nConnect-Protocol-Version: 1\n"
                                "Connect-Timeout-Ms: 5000\nAccept-Encoding: gzip\n\n",
                             json));
  w.Add("http", absl::StrCat(p, "\nContent-Type: application/grpc-web+proto\ngrpc-timeout: 5S\n\n",
                             http::EncodeFrame(0, proto)));
  w.Add("http", absl::StrCat(p, "\nContent-Type: application/grpc\ngrpc-timeout: 5S\n\n",
                             http::EncodeFrame(0, proto)));
  if (auto zipped = http::Gzip(proto); zipped.ok()) {
    w.Add("http", absl::StrCat(p, "\nContent-Type: application/proto\nContent-Encoding: gzip\n\n",
                               *zipped));
    w.Add("http", absl::StrCat(p, "\nContent-Type: application/grpc-web\ngrpc-encoding: gzip\n\n",
                               http::EncodeFrame(http::kFrameCompressed, *zipped)));
  }
}

void Ed25519Seeds(Writer& w, World* world) {
  const auto wp = LoadJsonOrDie("wycheproof/ed25519_test.json");
  v1::BatchVerifyRequest batch;
  for (const auto& group : wp["testGroups"]) {
    const std::string pk = StrField(group["publicKey"]["pk"]);
    for (const auto& t : group["tests"]) {
      v1::VerifyRequest q;
      q.set_public_key(pk);
      q.set_message(StrField(t["msg"]));
      q.set_signature(StrField(t["sig"]));
      w.Add("ed25519", 1, q);
      w.Add("ed25519", std::string(1, 4) + pk + q.signature() + q.message());
      if (batch.items_size() < 4) *batch.add_items() = q;
    }
  }
  w.Add("ed25519", 3, batch);
  AddHttp(w, "/offload.v1.Ed25519Service/BatchVerify", batch);
  const auto speccheck = LoadJsonOrDie("ed25519_speccheck_cases.json");
  for (const auto& c : speccheck) {
    v1::VerifyRequest q;
    q.set_public_key(StrField(c["pub_key"]));
    q.set_message(StrField(c["message"]));
    q.set_signature(StrField(c["signature"]));
    w.Add("ed25519", 1, q);
    w.Add("ed25519", std::string(1, 4) + q.public_key() + q.signature() + q.message());
  }
  v1::BatchSignRequest batch_sign;
  const auto rfc = LoadJsonOrDie("rfc_vectors.json");
  for (const auto& t : rfc["ed25519"]["tests"]) {
    v1::VerifyRequest q;
    q.set_public_key(StrField(t["public_key"]));
    q.set_message(StrField(t["message"]));
    q.set_signature(StrField(t["signature"]));
    w.Add("ed25519", 1, q);
    v1::SignRequest s;
    s.set_key_id(kEd25519Key);
    s.set_message(q.message());
    w.Add("ed25519", 0, s);
    AddHttp(w, "/offload.v1.Ed25519Service/Sign", s);
    *batch_sign.add_items() = s;
    // A signature by the fixed key: a valid verify.
    v1::SignResponse signed_;
    if (world->ops->Sign(s, &signed_).ok()) {
      v1::VerifyRequest v;
      v.set_public_key(signed_.public_key());
      v.set_message(s.message());
      v.set_signature(signed_.signature());
      w.Add("ed25519", 1, v);
      AddHttp(w, "/offload.v1.Ed25519Service/Verify", v);
    }
  }
  w.Add("ed25519", 2, batch_sign);
}

void X25519Seeds(Writer& w) {
  const auto wp = LoadJsonOrDie("wycheproof/x25519_test.json");
  v1::BatchDeriveRequest batch;
  int n = 0;
  for (const auto& group : wp["testGroups"]) {
    for (const auto& t : group["tests"]) {
      if (n++ % 4 != 0) continue;  // a quarter of them: every flag is still represented
      v1::DeriveRequest q;
      q.set_key_id(n % 8 == 1 ? kX25519CompatKey : kX25519Key);
      q.set_peer_public_key(StrField(t["public"]));
      q.set_output(n % 3 == 0 ? v1::DERIVE_OUTPUT_BOX_BEFORENM : v1::DERIVE_OUTPUT_RAW);
      w.Add("x25519", 0, q);
      w.Add("x25519", std::string{2, static_cast<char>(n % 8 == 1 ? 2 : 1), 1, 0} +
                          q.peer_public_key());
      if (batch.items_size() < 4) *batch.add_items() = q;
    }
  }
  w.Add("x25519", 1, batch);
  const auto rfc = LoadJsonOrDie("rfc_vectors.json")["x25519"];
  v1::DeriveRequest q;
  q.set_key_id(kX25519Key);
  q.set_peer_public_key(StrField(rfc["diffie_hellman"]["bob_public"]));
  q.set_output(v1::DERIVE_OUTPUT_RAW);
  w.Add("x25519", 0, q);
  AddHttp(w, "/offload.v1.X25519Service/Derive", q);
  AddHttp(w, "/offload.v1.X25519Service/BatchDerive", batch);
}

void BoxSeeds(Writer& w, World* world) {
  const auto nacl = LoadJsonOrDie("nacl_box_vectors.json");
  for (const auto& t : nacl["tests"]) {
    v1::BoxSealRequest seal;
    seal.set_key_id(kX25519Key);
    seal.set_peer_public_key(StrField(t["bob_public_key"]));
    seal.set_nonce(StrField(t["nonce"]));
    seal.set_plaintext(StrField(t["plaintext"]));
    w.Add("box", 0, seal);
    AddHttp(w, "/offload.v1.BoxService/Seal", seal);
    v1::BatchBoxSealRequest batch_seal;
    *batch_seal.add_items() = seal;
    seal.clear_nonce();
    *batch_seal.add_items() = seal;
    w.Add("box", 2, batch_seal);
    // The vector's own ciphertext (made with Alice's key: fails here), then one that opens.
    v1::BoxOpenRequest open;
    open.set_key_id(kX25519Key);
    open.set_peer_public_key(StrField(t["alice_public_key"]));
    open.set_nonce(StrField(t["nonce"]));
    open.set_ciphertext(StrField(t["ciphertext_combined"]));
    w.Add("box", 1, open);
    w.Add("box", std::string(1, 4) + std::string(1, 1) + open.peer_public_key() + open.nonce() +
                     open.ciphertext());
    v1::BoxSealResponse sealed;
    seal.set_nonce(StrField(t["nonce"]));
    if (world->ops->BoxSeal(seal, &sealed).ok()) {
      open.set_peer_public_key(seal.peer_public_key());
      open.set_ciphertext(sealed.ciphertext());
      w.Add("box", 1, open);
      AddHttp(w, "/offload.v1.BoxService/Open", open);
      v1::BatchBoxOpenRequest batch_open;
      *batch_open.add_items() = open;
      open.set_key_version(2);
      *batch_open.add_items() = open;
      w.Add("box", 3, batch_open);
      w.Add("box", std::string(1, 4) + std::string(1, 1) + open.peer_public_key() + open.nonce() +
                       open.ciphertext());
    }
  }
}

void AeadSeeds(Writer& w, World* world) {
  struct File {
    const char* path;
    const char* key_id;
    uint8_t key_choice;  // index in kKeyIdChoices
  };
  const File files[] = {{"wycheproof/chacha20_poly1305_test.json", kChachaKey, 3},
                        {"wycheproof/xchacha20_poly1305_test.json", kXchachaKey, 4},
                        {"wycheproof/aes_gcm_test.json", kAesGcmKey, 5}};
  for (const File& f : files) {
    int n = 0;
    v1::BatchAeadSealRequest batch_seal;
    v1::BatchAeadOpenRequest batch_open;
    const auto file = LoadJsonOrDie(f.path);
    for (const auto& group : file["testGroups"]) {
      const int iv_bits = group["ivSize"].get<int>();
      for (const auto& t : group["tests"]) {
        if (n++ % 6 != 0) continue;
        const std::string iv = StrField(t["iv"]);
        const std::string envelope = std::string("\x01\x00\x00\x00\x01", 5) + iv +
                                     StrField(t["ct"]) + StrField(t["tag"]);
        if (iv_bits == 96 || iv_bits == 192) {
          w.Add("aead_envelope", std::string(1, iv_bits == 192 ? 1 : 0) + envelope);
        }
        v1::AeadOpenRequest open;
        open.set_key_id(f.key_id);
        open.set_envelope(envelope);
        open.set_associated_data(StrField(t["aad"]));
        w.Add("aead", 1, open);
        const std::string aad = open.associated_data().substr(0, 31);
        w.Add("aead", std::string{4, static_cast<char>(f.key_choice),
                                  static_cast<char>(aad.size())} + aad + envelope);
        v1::AeadSealRequest seal;
        seal.set_key_id(f.key_id);
        seal.set_plaintext(StrField(t["msg"]));
        seal.set_associated_data(open.associated_data());
        w.Add("aead", 0, seal);
        if (batch_seal.items_size() < 3) *batch_seal.add_items() = seal;
        // One that opens (under the fixed version-1 keys; xchacha's version 2 is per process).
        v1::AeadSealResponse sealed;
        if (world->ops->AeadSeal(seal, &sealed).ok()) {
          open.set_envelope(sealed.envelope());
          w.Add("aead", 1, open);
          if (batch_open.items_size() < 3) *batch_open.add_items() = open;
          w.Add("aead_envelope",
                std::string(1, f.key_choice == 4 ? 1 : 0) + sealed.envelope());
        }
      }
    }
    w.Add("aead", 2, batch_seal);
    w.Add("aead", 3, batch_open);
    AddHttp(w, "/offload.v1.AeadService/BatchSeal", batch_seal);
    AddHttp(w, "/offload.v1.AeadService/BatchOpen", batch_open);
    if (batch_open.items_size() > 0) AddHttp(w, "/offload.v1.AeadService/Open", batch_open.items(0));
    if (batch_seal.items_size() > 0) AddHttp(w, "/offload.v1.AeadService/Seal", batch_seal.items(0));
  }
}

// keys_fuzzer's format: (selector, length, serialised request) per call.
std::string KeyCall(uint8_t selector, const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString().substr(0, 255);
  return std::string{static_cast<char>(selector), static_cast<char>(bytes.size())} + bytes;
}

void KeySeeds(Writer& w) {
  const auto rfc = LoadJsonOrDie("rfc_vectors.json");
  int i = 0;
  for (const auto& t : rfc["ed25519"]["tests"]) {
    v1::ImportKeyRequest import;
    import.set_key_id(absl::StrCat("rfc-", i++));
    import.set_type(v1::KEY_TYPE_ED25519);
    import.set_secret(StrField(t["secret_key"]) + (i % 2 ? StrField(t["public_key"]) : ""));
    v1::GetKeyRequest get;
    get.set_key_id(import.key_id());
    v1::RotateKeyRequest rotate;
    rotate.set_key_id(import.key_id());
    v1::DeleteKeyRequest del;
    del.set_key_id(import.key_id());
    w.Add("keys", KeyCall(1, import) + KeyCall(2, get) + KeyCall(4, rotate) + KeyCall(3, get) +
                      KeyCall(5, del));
    AddHttp(w, "/offload.v1.KeyService/ImportKey", import);
  }
  const v1::KeyType types[] = {v1::KEY_TYPE_ED25519, v1::KEY_TYPE_X25519,
                               v1::KEY_TYPE_CHACHA20_POLY1305, v1::KEY_TYPE_XCHACHA20_POLY1305,
                               v1::KEY_TYPE_AES256_GCM};
  for (v1::KeyType type : types) {
    v1::CreateKeyRequest create;
    create.set_key_id(absl::StrCat("k", static_cast<int>(type)));
    create.set_type(type);
    create.mutable_options()->set_allow_zero_shared_secret(type == v1::KEY_TYPE_X25519);
    v1::DeleteKeyRequest del;
    del.set_key_id(create.key_id());
    w.Add("keys", KeyCall(0, create) + KeyCall(0, create) + KeyCall(3, del) + KeyCall(5, del));
    AddHttp(w, "/offload.v1.KeyService/CreateKey", create);
    v1::ImportKeyRequest import;
    import.set_key_id(absl::StrCat("i", static_cast<int>(type)));
    import.set_type(type);
    import.set_secret(std::string(32, 'k'));
    w.Add("keys", KeyCall(1, import) + KeyCall(5, del));
  }
  v1::GetKeyRequest get;
  get.set_key_id(kEd25519Key);
  AddHttp(w, "/offload.v1.KeyService/GetKey", get);
  AddHttp(w, "/offload.v1.KeyService/ListKeys", v1::ListKeysRequest());
}

// key_store_fuzzer's modes, from a real store holding the vector keys.
void KeyStoreSeeds(Writer& w) {
  const std::string dir = MakeTempDir("seeds-store");
  SecretBytes kek = KeyStoreFuzzKek();
  {
    auto store = keys::FileKeyStore::Open(dir, KeyStoreFuzzKek());
    if (!store.ok()) Fail(store.status().ToString());
    auto manager = keys::KeyManager::Create(*std::move(store), crypto::BackendChoice{});
    if (!manager.ok()) Fail(manager.status().ToString());
    const auto rfc = LoadJsonOrDie("rfc_vectors.json");
    int i = 0;
    for (const auto& t : rfc["ed25519"]["tests"]) {
      v1::ImportKeyRequest import;
      import.set_key_id(absl::StrCat("ed-", i++));
      import.set_type(v1::KEY_TYPE_ED25519);
      import.set_secret(StrField(t["secret_key"]));
      (void)(*manager)->ImportKey(import);
    }
    v1::ImportKeyRequest x;
    x.set_key_id("alice");
    x.set_type(v1::KEY_TYPE_X25519);
    x.set_secret(StrField(rfc["x25519"]["diffie_hellman"]["alice_private"]));
    x.mutable_options()->set_allow_zero_shared_secret(true);
    (void)(*manager)->ImportKey(x);
    v1::CreateKeyRequest aead;
    aead.set_key_id("blobs");
    aead.set_type(v1::KEY_TYPE_AES256_GCM);
    (void)(*manager)->CreateKey(aead);
    (void)(*manager)->RotateKey("blobs");
  }
  std::ifstream in(absl::StrCat(dir, "/", keys::FileKeyStore::kFileName), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  w.Add("key_store", std::string(1, 0) + file);
  const auto plain = keys::OpenEnvelope(
      kek, keys::EnvelopeKind::kKeyStoreContents, {},
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(file.data()), file.size()));
  if (!plain.ok()) Fail(plain.status().ToString());
  w.Add("key_store", std::string(1, 1) + std::string(plain->begin(), plain->end()));
  w.Add("key_store", std::string(1, 1));  // an empty store
  const auto records = keys::ParseKeyStoreContents(*plain);
  if (!records.ok()) Fail(records.status().ToString());
  for (const keys::KeyRecord& r : *records) {
    const auto bytes = keys::SerializeKeyRecord(r);
    if (!bytes.ok()) Fail(bytes.status().ToString());
    w.Add("key_store", std::string(1, 2) + std::string(bytes->begin(), bytes->end()));
    const auto sealed = keys::SealEnvelope(
        kek, keys::EnvelopeKind::kKeyRecord,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(r.key_id.data()), r.key_id.size()),
        *bytes);
    if (!sealed.ok()) Fail(sealed.status().ToString());
    w.Add("key_store", std::string{3, static_cast<char>(r.key_id.size())} + r.key_id +
                           std::string(sealed->begin(), sealed->end()));
  }
}

// Server reflection: a gRPC request stream of reflection requests (the HTTP target feeds every
// body to the reflection stream too).
void ReflectionSeeds(Writer& w) {
  grpc::reflection::v1::ServerReflectionRequest list, symbol, file;
  list.set_list_services("");
  symbol.set_file_containing_symbol("offload.v1.Ed25519Service.Verify");
  file.set_file_by_filename("offload/v1/common.proto");
  w.Add("http", absl::StrCat("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo\n"
                             "Content-Type: application/grpc\n\n",
                             http::EncodeFrame(0, list.SerializeAsString()),
                             http::EncodeFrame(0, symbol.SerializeAsString()),
                             http::EncodeFrame(0, file.SerializeAsString())));
}

}  // namespace
}  // namespace offload::fuzz

int main(int argc, char** argv) {
  using namespace offload::fuzz;  // NOLINT
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out dir>\n", argv[0]);
    return 2;
  }
  Writer w(argv[1]);
  const std::unique_ptr<World> owned(NewWorld(offload::crypto::BackendChoice{}));
  World* world = owned.get();
  Ed25519Seeds(w, world);
  X25519Seeds(w);
  BoxSeeds(w, world);
  AeadSeeds(w, world);
  KeySeeds(w);
  KeyStoreSeeds(w);
  ReflectionSeeds(w);
  w.Report();
  return 0;
}
