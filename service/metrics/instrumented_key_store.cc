#include "service/metrics/instrumented_key_store.h"

#include <chrono>
#include <utility>

namespace offload::metrics {

InstrumentedKeyStore::InstrumentedKeyStore(std::unique_ptr<keys::KeyStore> store,
                                           Metrics* metrics)
    : store_(std::move(store)),
      load_seconds_(std::make_shared<std::atomic<double>>(0)),
      counts_(std::make_shared<std::array<std::atomic<uint64_t>, 2 * kNumOps>>()) {
  const char* ops[kNumOps] = {"load", "put", "delete"};
  for (int op = 0; op < kNumOps; ++op) {
    for (int ok = 0; ok < 2; ++ok) {
      auto counts = counts_;
      metrics->AddPullCounter("offload_keystore_operations_total",
                              "Key store operations, by operation and result",
                              {{"op", ops[op]}, {"result", ok ? "ok" : "error"}},
                              [counts, i = 2 * op + ok] { return double((*counts)[i].load()); });
    }
  }
  auto load_seconds = load_seconds_;
  metrics->AddPullGauge("offload_keystore_load_seconds", "Duration of the last key store load",
                        {}, [load_seconds] { return load_seconds->load(); });
}

void InstrumentedKeyStore::Count(Op op, bool ok) {
  (*counts_)[2 * op + (ok ? 1 : 0)].fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<std::vector<keys::KeyRecord>> InstrumentedKeyStore::LoadAll() {
  const auto start = std::chrono::steady_clock::now();
  auto records = store_->LoadAll();
  load_seconds_->store(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  Count(kLoad, records.ok());
  return records;
}

absl::Status InstrumentedKeyStore::Put(const keys::KeyRecord& record) {
  absl::Status s = store_->Put(record);
  Count(kPut, s.ok());
  return s;
}

absl::Status InstrumentedKeyStore::Delete(absl::string_view key_id) {
  absl::Status s = store_->Delete(key_id);
  Count(kDelete, s.ok());
  return s;
}

// Single-record loads and the conditional writes count as "load" and "put".
absl::StatusOr<keys::KeyRecord> InstrumentedKeyStore::Load(absl::string_view key_id) {
  auto record = store_->Load(key_id);
  Count(kLoad, record.ok() || absl::IsNotFound(record.status()));
  return record;
}

absl::Status InstrumentedKeyStore::Insert(const keys::KeyRecord& record) {
  absl::Status s = store_->Insert(record);
  Count(kPut, s.ok());
  return s;
}

absl::Status InstrumentedKeyStore::DeleteIf(absl::string_view key_id,
                                            const DeletePredicate& only_if) {
  absl::Status s = store_->DeleteIf(key_id, only_if);
  Count(kDelete, s.ok() || absl::IsFailedPrecondition(s));
  return s;
}

absl::Status InstrumentedKeyStore::Update(absl::string_view key_id, const UpdateFn& update) {
  absl::Status s = store_->Update(key_id, update);
  Count(kPut, s.ok());
  return s;
}

}  // namespace offload::metrics
