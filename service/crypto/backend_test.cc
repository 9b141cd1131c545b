#include "service/crypto/backend.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

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

TEST(Backend, MeasureIsQuick) {
  ASSERT_TRUE(InitCrypto().ok());
  auto start = std::chrono::steady_clock::now();
  BackendChoice choice = BackendChoice::Measure();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  std::printf("[ measure ] %.1f ms: %s\n", ms, choice.ToString().c_str());
  // Budget ~100 ms; generous bound for a loaded 2-core CI machine.
  EXPECT_LT(ms, 1000.0);
}

}  // namespace
}  // namespace offload::crypto
