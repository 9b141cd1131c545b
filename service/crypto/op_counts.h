// How many times each primitive has run in this process, counted where it runs. The memo tests
// use it to prove that a hit skipped the cipher; the metrics export it.
//
//   uint64_t before = CryptoOpCount(CryptoOp::kAeadOpen);
//   ... 54 opens of 27 distinct ciphertexts ...
//   EXPECT_EQ(CryptoOpCount(CryptoOp::kAeadOpen) - before, 27);
//
// Thread-safety: counts are relaxed atomics, one cache line each.
#ifndef SERVICE_CRYPTO_OP_COUNTS_H_
#define SERVICE_CRYPTO_OP_COUNTS_H_

#include <cstdint>

namespace offload::crypto {

enum class CryptoOp {
  kEd25519Sign,
  kEd25519Verify,
  kX25519,
  kAeadSeal,
  kAeadOpen,
  kBoxSeal,
  kBoxOpen,
  kNumOps,
};

const char* CryptoOpName(CryptoOp op);
uint64_t CryptoOpCount(CryptoOp op);

namespace internal {
void CountOp(CryptoOp op);
}  // namespace internal

}  // namespace offload::crypto

#endif  // SERVICE_CRYPTO_OP_COUNTS_H_
