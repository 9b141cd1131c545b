#include "service/crypto/backend.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "service/crypto/op_counts.h"

namespace offload::crypto {
namespace {

TEST(Backend, NamesRoundTrip) {
  for (Backend b : {Backend::kLibsodium, Backend::kOpenSsl}) {
    auto parsed = ParseBackend(BackendName(b));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, b);
  }
  auto bad = ParseBackend("boringssl");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBackend("OpenSSL").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Backend, InitCryptoIsIdempotent) {
  EXPECT_TRUE(InitCrypto().ok());
  EXPECT_TRUE(InitCrypto().ok());
}

TEST(Backend, AllAndToString) {
  EXPECT_EQ(BackendChoice::All(Backend::kOpenSsl).ToString(),
            "ed25519_sign=openssl ed25519_verify=openssl x25519=openssl chacha20_poly1305=openssl "
            "xchacha20_poly1305=openssl aes256_gcm=openssl");
  BackendChoice all = BackendChoice::All(Backend::kLibsodium);
  EXPECT_EQ(all.x25519, Backend::kLibsodium);
  EXPECT_EQ(all.aes256_gcm, Backend::kLibsodium);
}

// Measure() runs at every server start, so its cost must stay small: it does a fixed amount of
// work (per curve operation 2 backends x (1 warm-up + 8 batches x 24), per AEAD 2 x (1 + 8 x 4)
// seals of 16 KB), about 0.1 s on a 2-core machine. That work is what is checked, by the
// primitives' run counters; the time is printed, never asserted (the machine may be busy).
TEST(Backend, MeasureDoesABoundedAmountOfWork) {
  ASSERT_TRUE(InitCrypto().ok());
  uint64_t before[static_cast<int>(CryptoOp::kNumOps)];
  for (int op = 0; op < static_cast<int>(CryptoOp::kNumOps); ++op) {
    before[op] = CryptoOpCount(static_cast<CryptoOp>(op));
  }
  auto start = std::chrono::steady_clock::now();
  BackendChoice choice = BackendChoice::Measure();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  std::printf("[ measure ] %.1f ms: %s\n", ms, choice.ToString().c_str());
  auto ran = [&](CryptoOp op) { return CryptoOpCount(op) - before[static_cast<int>(op)]; };
  constexpr uint64_t kCurveRuns = 2 * (1 + 8 * 24);
  constexpr uint64_t kAeadSeals = 3 * 2 * (1 + 8 * 4);
  // Both backends were measured (not a fallback that ran nothing), and no more than that.
  EXPECT_GE(ran(CryptoOp::kEd25519Sign), kCurveRuns);
  EXPECT_LE(ran(CryptoOp::kEd25519Sign), kCurveRuns + 1);  // + the reference signature
  EXPECT_EQ(ran(CryptoOp::kEd25519Verify), kCurveRuns);
  EXPECT_GE(ran(CryptoOp::kX25519), kCurveRuns);
  EXPECT_LE(ran(CryptoOp::kX25519), kCurveRuns + 1);  // + the peer's public key
  EXPECT_EQ(ran(CryptoOp::kAeadSeal), kAeadSeals);
  EXPECT_EQ(ran(CryptoOp::kAeadOpen), 0u);
  EXPECT_EQ(ran(CryptoOp::kBoxSeal) + ran(CryptoOp::kBoxOpen), 0u);
}

}  // namespace
}  // namespace offload::crypto
