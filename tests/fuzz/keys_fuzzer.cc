// KeyService request handling: input = a sequence of calls, each a selector byte (CreateKey,
// ImportKey, GetKey, ListKeys, RotateKey, DeleteKey, CancelKeyDeletion, Disable/EnableKey, the
// four version calls, SetMinDecryptionVersion, or time passing and DestroyDue on the world's
// clock), a length byte and that many bytes of serialised request. The calls run on the KeyManager the gRPC and HTTP handlers call, over a real
// file key store (atomic rewrite of keys.db on every change).
// Invariants: only documented codes; an acknowledged create / import / rotate / delete is what
// GetKey and ListKeys show afterwards, and what a second KeyManager loading a copy of keys.db
// sees (so it was persisted); an imported Ed25519 seed gives its RFC 8032 public key; ListKeys is
// sorted and unique; key ids in results are valid; the current version is always enabled; no
// deletion is left once it is due.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "offload/v1/keys.pb.h"
#include "service/crypto/ed25519.h"
#include "service/keys/file_key_store.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

World* TheWorld() {
  static World* w = NewWorld(crypto::BackendChoice{});
  return w;
}

constexpr std::initializer_list<absl::StatusCode> kKeyCodes = {
    absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
    absl::StatusCode::kAlreadyExists, absl::StatusCode::kFailedPrecondition};

// Every key is deleted once there are more keys or versions than this, so that a long run does
// not make every store rewrite slower.
constexpr size_t kMaxKeys = 48;
constexpr int kMaxVersions = 256;

std::string Describe(const v1::KeyInfo& info) { return info.ShortDebugString(); }

void CheckInfo(const v1::KeyInfo& info) {
  FUZZ_CHECK(keys::ValidateKeyId(info.key_id()).ok(), info.key_id());
  FUZZ_CHECK(info.versions_size() >= 1, Describe(info));
  FUZZ_CHECK(info.versions(info.versions_size() - 1).version() == info.current_version(),
             Describe(info));
  FUZZ_CHECK(info.versions(info.versions_size() - 1).state() == v1::KEY_VERSION_STATE_ENABLED,
             "current version not enabled: ", Describe(info));
  FUZZ_CHECK(info.min_decryption_version() <= info.current_version(), Describe(info));
  FUZZ_CHECK((info.state() == v1::KEY_STATE_PENDING_DELETION) ==
                 (info.deletion_unix_seconds() != 0),
             Describe(info));
  const bool aead = info.type() >= v1::KEY_TYPE_CHACHA20_POLY1305;
  for (const auto& v : info.versions()) {
    FUZZ_CHECK(v.public_key().size() == (aead ? 0u : 32u), Describe(info));
  }
}

void CheckSameAsStored(const v1::KeyInfo& info) {
  CheckInfo(info);
  const absl::StatusOr<v1::KeyInfo> got = TheWorld()->keys->GetKey(info.key_id());
  FUZZ_CHECK(got.ok(), got.status().ToString());
  FUZZ_CHECK(got->SerializeAsString() == info.SerializeAsString(), Describe(*got), " vs ",
             Describe(info));
}

// A second KeyManager over a copy of keys.db lists the same keys.
void CheckPersisted() {
  static const std::string dir = MakeTempDir("reload");
  const std::string copy = absl::StrCat(dir, "/", keys::FileKeyStore::kFileName);
  std::filesystem::copy_file(absl::StrCat(TheWorld()->dir, "/", keys::FileKeyStore::kFileName),
                             copy, std::filesystem::copy_options::overwrite_existing);
  SecretBytes kek(32);
  for (size_t i = 0; i < kek.size(); ++i) kek[i] = static_cast<uint8_t>(0xA0 + 7 * i);
  auto store = keys::FileKeyStore::Open(dir, std::move(kek));
  FUZZ_CHECK(store.ok(), store.status().ToString());
  auto manager = keys::KeyManager::Create(*std::move(store), crypto::BackendChoice{});
  FUZZ_CHECK(manager.ok(), manager.status().ToString());
  const std::vector<v1::KeyInfo> live = TheWorld()->keys->ListKeys();
  const std::vector<v1::KeyInfo> loaded = (*manager)->ListKeys();
  FUZZ_CHECK(live.size() == loaded.size(), live.size(), " live keys, ", loaded.size(), " loaded");
  for (size_t i = 0; i < live.size(); ++i) {
    FUZZ_CHECK(live[i].SerializeAsString() == loaded[i].SerializeAsString(), Describe(live[i]),
               " vs ", Describe(loaded[i]));
  }
}

template <typename Request>
bool Parse(absl::string_view bytes, Request* q) {
  return q->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// One call; returns whether it changed the store.
bool Call(uint8_t selector, absl::string_view bytes) {
  keys::KeyManager& keys = *TheWorld()->keys;
  switch (selector % 12) {
    case 0: {
      v1::CreateKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r = keys.CreateKey(q);
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (!r.ok()) return false;
      FUZZ_CHECK(r->key_id() == q.key_id() && r->type() == q.type() && r->current_version() == 1,
                 Describe(*r));
      CheckSameAsStored(*r);
      return true;
    }
    case 1: {
      v1::ImportKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r = keys.ImportKey(q);
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (!r.ok()) return false;
      FUZZ_CHECK(r->key_id() == q.key_id() && r->type() == q.type() && r->current_version() == 1,
                 Describe(*r));
      if (q.type() == v1::KEY_TYPE_ED25519) {
        const auto* seed = reinterpret_cast<const uint8_t*>(q.secret().data());
        const auto pk = crypto::Ed25519PublicKeyFromSeed(absl::MakeConstSpan(seed, 32));
        FUZZ_CHECK(pk.ok(), pk.status().ToString());
        FUZZ_CHECK(r->versions(0).public_key() ==
                       std::string(reinterpret_cast<const char*>(pk->data()), pk->size()),
                   "imported seed, other public key");
      }
      CheckSameAsStored(*r);
      return true;
    }
    case 2: {
      v1::GetKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r = keys.GetKey(q.key_id());
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      FUZZ_CHECK(r.ok() == (keys.Find(q.key_id()) != nullptr), r.status().ToString());
      if (r.ok()) CheckInfo(*r);
      return false;
    }
    case 3: {
      const std::vector<v1::KeyInfo> all = keys.ListKeys();
      for (size_t i = 0; i < all.size(); ++i) {
        CheckInfo(all[i]);
        if (i > 0) FUZZ_CHECK(all[i - 1].key_id() < all[i].key_id(), "ListKeys order");
      }
      FUZZ_CHECK(all.size() == keys.size(), all.size(), " vs ", keys.size());
      return false;
    }
    case 4: {
      v1::RotateKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> before = keys.GetKey(q.key_id());
      const absl::StatusOr<v1::KeyInfo> r = keys.RotateKey(q.key_id());
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      // Only an enabled key rotates (not a disabled one, nor one pending deletion).
      FUZZ_CHECK(r.ok() == (before.ok() && before->state() == v1::KEY_STATE_ENABLED),
                 r.status().ToString(), " / ", before.status().ToString());
      if (!r.ok()) return false;
      FUZZ_CHECK(r->current_version() == before->current_version() + 1 &&
                     r->versions_size() == before->versions_size() + 1,
                 Describe(*before), " -> ", Describe(*r));
      CheckSameAsStored(*r);
      return true;
    }
    case 5: {
      // DeleteKey, at once or (wait_seconds) scheduled on the world's clock.
      v1::DeleteKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      q.set_wait_seconds(q.wait_seconds() % 100000);
      const std::shared_ptr<const keys::ManagedKey> held = keys.Find(q.key_id());
      const absl::StatusOr<v1::DeleteKeyResponse> r = keys.DeleteKey(q);
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (q.wait_seconds() >= 0 && held != nullptr && held->deletion_unix_seconds == 0) {
        FUZZ_CHECK(r.ok(), r.status().ToString());
      }
      if (!r.ok()) return false;
      if (q.wait_seconds() == 0) {
        FUZZ_CHECK(keys.GetKey(q.key_id()).status().code() == absl::StatusCode::kNotFound,
                   "deleted key still there");
      } else {
        CheckSameAsStored(r->key());
        FUZZ_CHECK(r->key().state() == v1::KEY_STATE_PENDING_DELETION, Describe(r->key()));
      }
      return true;
    }
    case 6: {
      v1::CancelKeyDeletionRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r = keys.CancelKeyDeletion(q.key_id());
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (r.ok()) CheckSameAsStored(*r);
      return r.ok();
    }
    case 7: {
      v1::DisableKeyRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r =
          bytes.size() % 2 == 0 ? keys.DisableKey(q.key_id()) : keys.EnableKey(q.key_id());
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (r.ok()) CheckSameAsStored(*r);
      return r.ok();
    }
    case 8: {
      v1::KeyVersionRequest q;
      if (!Parse(bytes, &q)) return false;
      q.set_wait_seconds(q.wait_seconds() % 100000);
      absl::StatusOr<v1::KeyInfo> r;
      switch (q.version() % 4) {
        case 0: r = keys.DisableKeyVersion(q); break;
        case 1: r = keys.EnableKeyVersion(q); break;
        case 2: r = keys.DestroyKeyVersion(q); break;
        default: r = keys.RestoreKeyVersion(q); break;
      }
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (r.ok()) CheckSameAsStored(*r);
      return r.ok();
    }
    case 9: {
      v1::SetMinDecryptionVersionRequest q;
      if (!Parse(bytes, &q)) return false;
      const absl::StatusOr<v1::KeyInfo> r = keys.SetMinDecryptionVersion(q);
      FUZZ_CHECK(IsOneOf(r.status().code(), kKeyCodes), r.status().ToString());
      if (r.ok()) CheckSameAsStored(*r);
      return r.ok();
    }
    default: {
      // Time passes (up to a day), and whatever is due is destroyed.
      int64_t seconds = 0;
      for (char c : bytes.substr(0, 3)) seconds = seconds * 256 + static_cast<uint8_t>(c);
      TheWorld()->AdvanceClock(seconds % 86401);
      const absl::StatusOr<int> destroyed = keys.DestroyDue();
      FUZZ_CHECK(destroyed.ok(), destroyed.status().ToString());
      for (const v1::KeyInfo& info : keys.ListKeys()) {
        CheckInfo(info);
        FUZZ_CHECK(info.deletion_unix_seconds() == 0 ||
                       info.deletion_unix_seconds() > absl::ToUnixSeconds(TheWorld()->Now()),
                   "a due deletion was left: ", Describe(info));
      }
      return *destroyed > 0;
    }
  }
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  Input in(data, size);
  bool changed = false;
  for (int calls = 0; calls < 8 && !in.Rest().empty(); ++calls) {
    const uint8_t selector = in.Byte();
    const size_t length = in.Byte();
    const absl::string_view rest = in.Rest();
    const absl::string_view bytes = rest.substr(0, length);
    in = Input(reinterpret_cast<const uint8_t*>(rest.data()) + bytes.size(),
               rest.size() - bytes.size());
    changed |= Call(selector, bytes);
  }
  if (changed) CheckPersisted();
  // Keep the store small.
  keys::KeyManager& keys = *TheWorld()->keys;
  const std::vector<v1::KeyInfo> all = keys.ListKeys();
  int versions = 0;
  for (const v1::KeyInfo& info : all) versions += info.versions_size();
  if (all.size() > kMaxKeys || versions > kMaxVersions) {
    for (const v1::KeyInfo& info : all) {
      if (info.state() == v1::KEY_STATE_PENDING_DELETION) {
        FUZZ_CHECK(keys.CancelKeyDeletion(info.key_id()).ok(), info.key_id());
      }
      FUZZ_CHECK(keys.DeleteKey(info.key_id()).ok(), info.key_id());
    }
  }
  return 0;
}
