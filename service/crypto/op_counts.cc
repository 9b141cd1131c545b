#include "service/crypto/op_counts.h"

#include <atomic>

namespace offload::crypto {
namespace {

struct alignas(64) Counter {
  std::atomic<uint64_t> n{0};
};
Counter counters[static_cast<int>(CryptoOp::kNumOps)];

}  // namespace

const char* CryptoOpName(CryptoOp op) {
  switch (op) {
    case CryptoOp::kEd25519Sign: return "ed25519_sign";
    case CryptoOp::kEd25519Verify: return "ed25519_verify";
    case CryptoOp::kX25519: return "x25519";
    case CryptoOp::kAeadSeal: return "aead_seal";
    case CryptoOp::kAeadOpen: return "aead_open";
    case CryptoOp::kBoxSeal: return "box_seal";
    case CryptoOp::kBoxOpen: return "box_open";
    case CryptoOp::kNumOps: break;
  }
  return "unknown";
}

uint64_t CryptoOpCount(CryptoOp op) {
  return counters[static_cast<int>(op)].n.load(std::memory_order_relaxed);
}

namespace internal {
void CountOp(CryptoOp op) {
  counters[static_cast<int>(op)].n.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace internal

}  // namespace offload::crypto
