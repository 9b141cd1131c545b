// The key store file loader (service/keys: file_key_store, envelope, record_codec) and the
// KeyManager load on top of it. Input = mode byte, then:
//   0  a whole keys.db file, loaded by FileKeyStore::Open (envelope header, tag, KEK id)
//   1  plaintext store contents, sealed under the store's KEK (an authenticated but corrupt or
//      hand-made file), then FileKeyStore::Open, LoadAll and KeyManager::Create
//   2  one serialised key record (a database row's plaintext): ParseKeyRecord
//   3  one sealed key record blob: OpenEnvelope(kKeyRecord) with a key id as context
// Invariants: nothing crashes; only the documented codes (DataLoss for corruption,
// FailedPrecondition for another KEK or format version); what parses is valid
// (ValidateKeyRecord), serialises back and parses to the same records; a store that opens loads
// into a KeyManager with one key per record, or is refused as DataLoss.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/keys/envelope.h"
#include "service/keys/file_key_store.h"
#include "service/keys/key_manager.h"
#include "service/keys/record_codec.h"
#include "tests/fuzz/fuzz_support.h"

namespace offload::fuzz {
namespace {

SecretBytes Kek() { return KeyStoreFuzzKek(); }

const std::string& Dir() {
  static const std::string* dir = new std::string(MakeTempDir("store"));
  return *dir;
}

void WriteKeysDb(absl::Span<const uint8_t> bytes) {
  const std::string path = absl::StrCat(Dir(), "/", keys::FileKeyStore::kFileName);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0, path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    FUZZ_CHECK(n > 0, path);
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string Serialized(const keys::KeyRecord& record) {
  const absl::StatusOr<SecretBytes> s = keys::SerializeKeyRecord(record);
  FUZZ_CHECK(s.ok(), "a parsed record does not serialise: ", s.status().ToString());
  return std::string(s->begin(), s->end());
}

// Serialise -> parse gives the same records.
void CheckRoundTrip(const std::vector<keys::KeyRecord>& records) {
  for (size_t i = 0; i < records.size(); ++i) {
    FUZZ_CHECK(keys::ValidateKeyRecord(records[i]).ok(), records[i].key_id);
    if (i > 0) FUZZ_CHECK(records[i - 1].key_id < records[i].key_id, "not sorted / unique");
  }
  const absl::StatusOr<SecretBytes> all = keys::SerializeKeyStoreContents(records);
  FUZZ_CHECK(all.ok(), all.status().ToString());
  const auto back = keys::ParseKeyStoreContents(*all);
  FUZZ_CHECK(back.ok(), back.status().ToString());
  FUZZ_CHECK(back->size() == records.size(), back->size(), " vs ", records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    FUZZ_CHECK(Serialized((*back)[i]) == Serialized(records[i]), "record ", i, " changed");
  }
}

void LoadStore() {
  auto store = keys::FileKeyStore::Open(Dir(), Kek());
  FUZZ_CHECK(IsOneOf(store.status().code(),
                     {absl::StatusCode::kOk, absl::StatusCode::kDataLoss,
                      absl::StatusCode::kFailedPrecondition}),
             store.status().ToString());
  if (!store.ok()) return;
  const auto records = (*store)->LoadAll();
  FUZZ_CHECK(records.ok(), "opened, then failed to load: ", records.status().ToString());
  CheckRoundTrip(*records);
  auto manager = keys::KeyManager::Create(*std::move(store), crypto::BackendChoice{});
  FUZZ_CHECK(IsOneOf(manager.status().code(), {absl::StatusCode::kOk, absl::StatusCode::kDataLoss}),
             manager.status().ToString());
  if (manager.ok()) {
    FUZZ_CHECK((*manager)->size() == records->size(), (*manager)->size(), " keys for ",
               records->size(), " records");
  }
}

}  // namespace
}  // namespace offload::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace offload;  // NOLINT
  using namespace offload::fuzz;  // NOLINT
  if (size == 0) return -1;
  if (absl::Status s = crypto::InitCrypto(); !s.ok()) Fail(s.ToString());
  const absl::Span<const uint8_t> rest(data + 1, size - 1);
  const SecretBytes kek = Kek();
  switch (data[0] % 4) {
    case 0:
      WriteKeysDb(rest);
      LoadStore();
      break;
    case 1: {
      const auto blob = keys::SealEnvelope(kek, keys::EnvelopeKind::kKeyStoreContents, {}, rest);
      FUZZ_CHECK(blob.ok(), blob.status().ToString());
      WriteKeysDb(*blob);
      LoadStore();
      break;
    }
    case 2: {
      const absl::StatusOr<keys::KeyRecord> record = keys::ParseKeyRecord(rest);
      FUZZ_CHECK(IsOneOf(record.status().code(), {absl::StatusCode::kOk, absl::StatusCode::kDataLoss}),
                 record.status().ToString());
      if (!record.ok()) break;
      FUZZ_CHECK(keys::ValidateKeyRecord(*record).ok(), record->key_id);
      const std::string once = Serialized(*record);
      const auto again = keys::ParseKeyRecord(absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(once.data()), once.size()));
      FUZZ_CHECK(again.ok() && Serialized(*again) == once, "record round trip");
      break;
    }
    case 3: {
      const size_t id_size = rest.empty() ? 0 : rest[0] % 16;
      const absl::Span<const uint8_t> after = rest.subspan(rest.empty() ? 0 : 1);
      const absl::Span<const uint8_t> context = after.first(std::min(id_size, after.size()));
      const absl::Span<const uint8_t> blob = after.subspan(context.size());
      const auto plain = keys::OpenEnvelope(kek, keys::EnvelopeKind::kKeyRecord, context, blob);
      FUZZ_CHECK(IsOneOf(plain.status().code(),
                         {absl::StatusCode::kOk, absl::StatusCode::kDataLoss,
                          absl::StatusCode::kFailedPrecondition}),
                 plain.status().ToString());
      // An authentic blob needs the KEK: only a seal made here opens, to what was sealed.
      const auto sealed = keys::SealEnvelope(kek, keys::EnvelopeKind::kKeyRecord, context, blob);
      FUZZ_CHECK(sealed.ok(), sealed.status().ToString());
      const auto opened = keys::OpenEnvelope(kek, keys::EnvelopeKind::kKeyRecord, context, *sealed);
      FUZZ_CHECK(opened.ok() && std::equal(opened->begin(), opened->end(), blob.begin(),
                                           blob.end()),
                 "seal/open round trip: ", opened.status().ToString());
      break;
    }
  }
  return 0;
}
