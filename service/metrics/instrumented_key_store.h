// A KeyStore decorator that counts the store's operations and their failures, and times loads,
// for the metrics offload_keystore_operations_total{op,result} and offload_keystore_load_seconds.
//
//   auto store = std::make_unique<InstrumentedKeyStore>(std::move(file_store), &metrics);
//
// Thread-safety: as the wrapped store; the counters are atomic.
#ifndef SERVICE_METRICS_INSTRUMENTED_KEY_STORE_H_
#define SERVICE_METRICS_INSTRUMENTED_KEY_STORE_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "service/keys/key_store.h"
#include "service/metrics/metrics.h"

namespace offload::metrics {

class InstrumentedKeyStore final : public keys::KeyStore {
 public:
  // Registers the metrics with `metrics`, which must outlive this object's scrapes.
  InstrumentedKeyStore(std::unique_ptr<keys::KeyStore> store, Metrics* metrics);

  absl::StatusOr<std::vector<keys::KeyRecord>> LoadAll() override;
  absl::Status Put(const keys::KeyRecord& record) override;
  absl::Status Delete(absl::string_view key_id) override;
  absl::Status DeleteIf(absl::string_view key_id, const DeletePredicate& only_if) override;
  absl::StatusOr<keys::KeyRecord> Load(absl::string_view key_id) override;
  absl::Status Insert(const keys::KeyRecord& record) override;
  absl::Status Update(absl::string_view key_id, const UpdateFn& update) override;
  std::string Describe() const override { return store_->Describe(); }

 private:
  enum Op { kLoad, kPut, kDelete, kNumOps };
  void Count(Op op, bool ok);

  std::unique_ptr<keys::KeyStore> store_;
  std::shared_ptr<std::atomic<double>> load_seconds_;
  std::shared_ptr<std::array<std::atomic<uint64_t>, 2 * kNumOps>> counts_;
};

}  // namespace offload::metrics

#endif  // SERVICE_METRICS_INSTRUMENTED_KEY_STORE_H_
