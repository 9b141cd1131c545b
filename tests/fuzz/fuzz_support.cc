#include "tests/fuzz/fuzz_support.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "google/protobuf/stubs/logging.h"
#include "offload/v1/keys.pb.h"
#include "service/common/log.h"
#include "service/common/secret_bytes.h"
#include "service/keys/file_key_store.h"

namespace offload::fuzz {
namespace {

// A run makes millions of calls: keep the service's info lines (key_added, ...) and protobuf's
// complaints about parsed input (invalid UTF-8 in a string field is most inputs) out of the
// output. Warnings and errors still show.
[[maybe_unused]] const bool kQuiet = [] {
  SetMinLogLevel(LogLevel::kWarning);
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

// Fixed, public test secrets: a crash input replays against the same keys.
SecretBytes FixedSecret(uint8_t first) {
  SecretBytes s(32);
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(first + 7 * i);
  return s;
}

std::string SecretString(uint8_t first) {
  const SecretBytes s = FixedSecret(first);
  return std::string(s.begin(), s.end());
}

absl::Mutex dirs_mu;
std::vector<std::string>* TempDirs() {
  static auto* dirs = new std::vector<std::string>;
  return dirs;
}

void RemoveTempDirs() {
  absl::MutexLock lock(&dirs_mu);
  for (const std::string& dir : *TempDirs()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
}

template <typename T>
T OrDie(absl::StatusOr<T> value, absl::string_view what) {
  if (!value.ok()) Fail(absl::StrCat("setup: ", what, ": ", value.status().ToString()));
  return *std::move(value);
}

// The process's key set, made once: the folder holding its keys.db.
const std::string& KeySetDir() {
  static const std::string* dir = [] {
    auto* made = new std::string(MakeTempDir("keyset"));
    auto store = OrDie(keys::FileKeyStore::Open(*made, FixedSecret(0xA0)), "open key set store");
    auto manager = OrDie(keys::KeyManager::Create(std::move(store), crypto::BackendChoice{}),
                         "key set manager");
    struct Spec {
      const char* id;
      v1::KeyType type;
      bool allow_zero;
    };
    const Spec specs[] = {
        {kEd25519Key, v1::KEY_TYPE_ED25519, false},
        {kX25519Key, v1::KEY_TYPE_X25519, false},
        {kX25519CompatKey, v1::KEY_TYPE_X25519, true},
        {kChachaKey, v1::KEY_TYPE_CHACHA20_POLY1305, false},
        {kXchachaKey, v1::KEY_TYPE_XCHACHA20_POLY1305, false},
        {kAesGcmKey, v1::KEY_TYPE_AES256_GCM, false},
    };
    uint8_t first = 1;
    for (const Spec& spec : specs) {
      v1::ImportKeyRequest request;
      request.set_key_id(spec.id);
      request.set_type(spec.type);
      request.set_secret(SecretString(first));
      first = static_cast<uint8_t>(first + 31);
      request.mutable_options()->set_allow_zero_shared_secret(spec.allow_zero);
      OrDie(manager->ImportKey(request), spec.id);
    }
    OrDie(manager->RotateKey(kAeadRotated), "rotate");
    return made;
  }();
  return *dir;
}

}  // namespace

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

SecretBytes KeyStoreFuzzKek() {
  SecretBytes kek(32);
  for (size_t i = 0; i < kek.size(); ++i) kek[i] = static_cast<uint8_t>(0x5A ^ (3 * i));
  return kek;
}

std::string MakeTempDir(absl::string_view name) {
  std::string base;
  if (const char* env = std::getenv("OFFLOAD_FUZZ_TMPDIR"); env != nullptr && *env != '\0') {
    base = env;
  } else if (::access("/dev/shm", W_OK) == 0) {
    base = "/dev/shm";
  } else if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
    base = tmp;
  } else {
    base = "/tmp";
  }
  std::string tmpl = absl::StrCat(base, "/offload-fuzz-", name, "-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) Fail(absl::StrCat("setup: mkdtemp ", tmpl));
  absl::MutexLock lock(&dirs_mu);
  if (TempDirs()->empty()) std::atexit(RemoveTempDirs);
  TempDirs()->push_back(tmpl);
  return tmpl;
}

World* NewWorld(crypto::BackendChoice backends, int max_batch_items) {
  if (absl::Status s = crypto::InitCrypto(); !s.ok()) Fail(s.ToString());
  auto* world = new World;
  world->dir = MakeTempDir("world");
  std::filesystem::copy_file(
      absl::StrCat(KeySetDir(), "/", keys::FileKeyStore::kFileName),
      absl::StrCat(world->dir, "/", keys::FileKeyStore::kFileName));
  auto store = OrDie(keys::FileKeyStore::Open(world->dir, FixedSecret(0xA0)), "open world store");
  keys::KeyManager::Options key_options;
  key_options.deletion_wait = absl::ZeroDuration();
  key_options.clock = [world] { return world->Now(); };
  world->keys =
      OrDie(keys::KeyManager::Create(std::move(store), backends, key_options), "world manager");
  memo::MemoOptions memo_options;
  // Small, so that eviction runs within a fuzzing run too.
  memo_options.verify_bytes = 64 << 10;
  memo_options.derive_bytes = 16 << 10;
  memo_options.open_bytes_per_key = 64 << 10;
  memo_options.open_bytes_total = 256 << 10;
  memo_options.shards = 4;
  world->memo = std::make_unique<memo::Memo>(memo_options);
  memo::Memo* memo = world->memo.get();
  world->keys->AddChangeListener([memo](absl::string_view id) { memo->DropKey(id); });
  world->pool = std::make_unique<ops::WorkerPool>(2);
  ops::Operations::Options options;
  options.max_batch_items = max_batch_items;
  world->ops = std::make_unique<ops::Operations>(world->keys.get(), memo, world->pool.get(),
                                                 backends, options);
  return world;
}

World* SodiumWorld() {
  static World* w = NewWorld(crypto::BackendChoice::All(crypto::Backend::kLibsodium));
  return w;
}

World* OpenSslWorld() {
  static World* w = NewWorld(crypto::BackendChoice::All(crypto::Backend::kOpenSsl));
  return w;
}

}  // namespace offload::fuzz
