// Shared pieces of the libFuzzer targets (tests/fuzz/README.md): a "world" of real service parts
// (file key store in a temporary folder, KeyManager, memo caches, worker pool, Operations) holding
// a fixed set of keys, invariant checks that abort with a message (libFuzzer reports an abort as
// a crash and keeps the input), and a helper to wait for a batch operation.
//
//   static World* world = NewWorld(crypto::BackendChoice::All(crypto::Backend::kLibsodium));
//   v1::SignResponse response;
//   absl::Status s = world->ops->Sign(request, &response);
//   FUZZ_CHECK(IsOneOf(s.code(), kOperationCodes), "Sign: undocumented code ", s.ToString());
//
// Every world of a process starts from one key set, copied file for file, so two worlds on
// different crypto backends hold the same secrets and must give the same answers: the backend
// targets cross-check SodiumWorld() against OpenSslWorld(). The selector-then-message input
// format they share: Input, ParseRest, ItemStatus.
// Thread-safety: NewWorld from one thread (the fuzzer's); a world's parts are thread-safe.
#ifndef TESTS_FUZZ_FUZZ_SUPPORT_H_
#define TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/message.h"
#include "service/common/secret_bytes.h"
#include "service/crypto/backend.h"
#include "service/keys/key_manager.h"
#include "service/memo/memo.h"
#include "service/ops/operations.h"
#include "service/ops/worker_pool.h"

namespace offload::fuzz {

// Aborts with "fuzz invariant failed: <what>" when `cond` is false.
#define FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) ::offload::fuzz::Fail(::absl::StrCat(#cond, ": ", __VA_ARGS__));     \
  } while (0)
[[noreturn]] void Fail(const std::string& what);

// The keys every world holds (imported from fixed secrets; kAeadRotated also has a version 2).
inline constexpr char kEd25519Key[] = "ed";
inline constexpr char kX25519Key[] = "x";
inline constexpr char kX25519CompatKey[] = "x-compat";  // allow_zero_shared_secret
inline constexpr char kChachaKey[] = "chacha";
inline constexpr char kXchachaKey[] = "xchacha";
inline constexpr char kAesGcmKey[] = "aes";
inline constexpr char kAeadRotated[] = "xchacha";
// Key ids the targets pick from by one input byte: the fixed keys, a well-formed id that does
// not exist, and malformed ones.
inline constexpr const char* kKeyIdChoices[] = {
    kEd25519Key, kX25519Key, kX25519CompatKey, kChachaKey, kXchachaKey, kAesGcmKey,
    "missing", "", "UPPER", "a/b"};
inline constexpr size_t kKeyIdChoiceCount = sizeof(kKeyIdChoices) / sizeof(kKeyIdChoices[0]);

struct World {
  // The key manager's clock: starts at a fixed time and moves only by AdvanceClock, so that a
  // scheduled deletion or destruction happens at the same call of every run of an input.
  absl::Time Now() const { return absl::FromUnixSeconds(now_seconds.load()); }
  void AdvanceClock(int64_t seconds) { now_seconds += seconds; }
  std::atomic<int64_t> now_seconds{1'900'000'000};
  std::string dir;
  std::unique_ptr<keys::KeyManager> keys;
  std::unique_ptr<memo::Memo> memo;
  std::unique_ptr<ops::WorkerPool> pool;
  std::unique_ptr<ops::Operations> ops;
};

// A new world over a copy of the process's key set, with `backends` and a small memo (so that
// eviction runs too). Its key manager destroys deleted keys at once unless a request asks for a
// wait (wait_seconds), measured on the world's clock. Never freed: it lives until the fuzzer exits. Aborts on failure.
World* NewWorld(crypto::BackendChoice backends, int max_batch_items = 16);

// The process's two cross-checked worlds: every primitive on libsodium, and every primitive on
// OpenSSL (made on first use, the same keys in both).
World* SodiumWorld();
World* OpenSslWorld();

// The key-encryption key of key_store_fuzzer's store (and of its seeds): fixed and public.
SecretBytes KeyStoreFuzzKek();

// A fresh temporary folder for `name` under $OFFLOAD_FUZZ_TMPDIR (run_fuzz.sh sets it), else
// /dev/shm when writable (fsync is cheap there), else $TMPDIR or /tmp; removed at exit.
std::string MakeTempDir(absl::string_view name);

// The status codes documented for the operations (proto/offload/v1/common.proto).
inline constexpr std::initializer_list<absl::StatusCode> kOperationCodes = {
    absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
    absl::StatusCode::kFailedPrecondition};
// ... and for a whole batch call: only its size can be refused.
inline constexpr std::initializer_list<absl::StatusCode> kBatchCallCodes = {
    absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument};

inline bool IsOneOf(absl::StatusCode code, std::initializer_list<absl::StatusCode> codes) {
  for (absl::StatusCode c : codes) {
    if (c == code) return true;
  }
  return false;
}
inline bool IsOneOf(int code, std::initializer_list<absl::StatusCode> codes) {
  return IsOneOf(static_cast<absl::StatusCode>(code), codes);
}

// Runs a batch operation `start(done)` and waits for its `done`. Returns the call's status.
template <typename Start>
absl::Status WaitForBatch(Start start) {
  absl::Notification finished;
  absl::Status result;
  start([&](absl::Status s) {
    result = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

// A batch item's result status (its `status` field: code and message) as an absl::Status.
template <typename Result>
absl::Status ItemStatus(const Result& result) {
  return absl::Status(static_cast<absl::StatusCode>(result.status().code()),
                      result.status().message());
}

// Consumes input bytes from the front: the selector bytes of a target's input format.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return *data_++;
  }
  // The rest of the input.
  absl::string_view Rest() const {
    return absl::string_view(reinterpret_cast<const char*>(data_), size_);
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

// The rest of `in` parsed as `message` (binary protobuf): false when it is not one, and the
// target rejects the input (returns -1, so that libFuzzer does not keep it).
inline bool ParseRest(const Input& in, google::protobuf::Message* message) {
  const absl::string_view rest = in.Rest();
  return message->ParseFromArray(rest.data(), static_cast<int>(rest.size()));
}

}  // namespace offload::fuzz

#endif  // TESTS_FUZZ_FUZZ_SUPPORT_H_
