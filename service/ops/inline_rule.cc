#include "service/ops/inline_rule.h"

#include <algorithm>

#include "offload/v1/aead.pb.h"
#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/x25519.pb.h"

namespace offload::ops {
namespace {

namespace v1 = ::offload::v1;

// Per operation: a fixed part and a part per KiB of the bytes it hashes or ciphers, in ns, from
// crypto_bench on the build machine (tests/bench/README.md), rounded up.
constexpr int64_t kVerify = 45'000, kVerifyPerKiB = 1'500;  // SHA-512 of R, A and the message
constexpr int64_t kSign = 25'000, kSignPerKiB = 3'000;      // the message is hashed twice
constexpr int64_t kDerive = 35'000;                         // X25519
constexpr int64_t kBox = 40'000, kBoxPerKiB = 600;          // X25519 + XSalsa20-Poly1305
constexpr int64_t kAead = 2'000, kAeadPerKiB = 600;         // key and envelope, the cipher
// The bytes' part of a cost: `per_kib` for each started KiB.
int64_t Bytes(size_t bytes, int64_t per_kib) {
  return static_cast<int64_t>((bytes + 1023) / 1024) * per_kib;
}

int64_t Verify(const v1::VerifyRequest& q) { return kVerify + Bytes(q.message().size(), kVerifyPerKiB); }
int64_t Sign(const v1::SignRequest& q) { return kSign + Bytes(q.message().size(), kSignPerKiB); }
int64_t Derive(const v1::DeriveRequest&) { return kDerive; }
int64_t BoxSeal(const v1::BoxSealRequest& q) { return kBox + Bytes(q.plaintext().size(), kBoxPerKiB); }
int64_t BoxOpen(const v1::BoxOpenRequest& q) { return kBox + Bytes(q.ciphertext().size(), kBoxPerKiB); }
int64_t AeadSeal(const v1::AeadSealRequest& q) {
  return kAead + Bytes(q.plaintext().size() + q.associated_data().size(), kAeadPerKiB);
}
int64_t AeadOpen(const v1::AeadOpenRequest& q) {
  return kAead + Bytes(q.envelope().size() + q.associated_data().size(), kAeadPerKiB);
}
int64_t AeadRewrap(const v1::AeadRewrapRequest& q) {  // an open and a seal
  return 2 * (kAead + Bytes(q.envelope().size() + q.associated_data().size(), kAeadPerKiB));
}

// The sum over a batch's items, saturating.
template <typename Batch, typename Item>
int64_t Sum(const Batch& batch, int64_t (*one)(const Item&)) {
  int64_t total = 0;
  for (const Item& item : batch.items()) {
    total += one(item);
    if (total >= InlineRule::kNever / 2) return InlineRule::kNever;
  }
  return total;
}

// `request` as a `T`, or null: descriptors are compared (a pointer each), no RTTI walk.
template <typename T>
const T* As(const google::protobuf::Message& request) {
  return request.GetDescriptor() == T::descriptor() ? static_cast<const T*>(&request) : nullptr;
}

}  // namespace

InlineRule::InlineRule(Options options)
    : options_(options),
      max_call_ns_(absl::ToInt64Nanoseconds(std::max(options.max_call, absl::ZeroDuration()))),
      turn_budget_ns_(
          absl::ToInt64Nanoseconds(std::max(options.turn_budget, absl::ZeroDuration()))) {}

int64_t InlineRule::EstimateNanos(const google::protobuf::Message& request) {
  if (auto* q = As<v1::VerifyRequest>(request)) return Verify(*q);
  if (auto* q = As<v1::BatchVerifyRequest>(request)) return Sum(*q, &Verify);
  if (auto* q = As<v1::DeriveRequest>(request)) return Derive(*q);
  if (auto* q = As<v1::BatchDeriveRequest>(request)) return Sum(*q, &Derive);
  if (auto* q = As<v1::AeadOpenRequest>(request)) return AeadOpen(*q);
  if (auto* q = As<v1::BatchAeadOpenRequest>(request)) return Sum(*q, &AeadOpen);
  if (auto* q = As<v1::AeadSealRequest>(request)) return AeadSeal(*q);
  if (auto* q = As<v1::BatchAeadSealRequest>(request)) return Sum(*q, &AeadSeal);
  if (auto* q = As<v1::AeadRewrapRequest>(request)) return AeadRewrap(*q);
  if (auto* q = As<v1::BatchAeadRewrapRequest>(request)) return Sum(*q, &AeadRewrap);
  if (auto* q = As<v1::SignRequest>(request)) return Sign(*q);
  if (auto* q = As<v1::BatchSignRequest>(request)) return Sum(*q, &Sign);
  if (auto* q = As<v1::BoxSealRequest>(request)) return BoxSeal(*q);
  if (auto* q = As<v1::BatchBoxSealRequest>(request)) return Sum(*q, &BoxSeal);
  if (auto* q = As<v1::BoxOpenRequest>(request)) return BoxOpen(*q);
  if (auto* q = As<v1::BatchBoxOpenRequest>(request)) return Sum(*q, &BoxOpen);
  return kNever;
}

int64_t InlineRule::EstimateAeadOpenNanos(size_t bytes) { return kAead + Bytes(bytes, kAeadPerKiB); }

bool InlineRule::RunHere(int64_t cost_ns, int64_t charged_ns, int64_t waiting) const {
  if (cost_ns > max_call_ns_) return false;
  const int64_t budget = waiting > 0 ? max_call_ns_ : turn_budget_ns_;
  return charged_ns <= budget - cost_ns;
}

}  // namespace offload::ops
