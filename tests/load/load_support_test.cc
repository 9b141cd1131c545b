#include "tests/load/load_support.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace offload::load {
namespace {

// Percentiles from the histogram are within its bucket width (1/64 of the value) of the exact
// nearest-rank percentile, across six decades of latency.
TEST(LatencyHistogramTest, PercentilesMatchSortedSamples) {
  const uint64_t seed = 20261129;
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> dist(13.0, 2.0);  // median ~0.4 ms, long tail
  std::vector<int64_t> samples;
  LatencyHistogram h;
  for (int i = 0; i < 200000; ++i) {
    const int64_t v = static_cast<int64_t>(dist(rng));
    samples.push_back(v);
    h.Record(v);
  }
  std::sort(samples.begin(), samples.end());
  for (double p : {0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    const size_t rank = std::max<size_t>(1, static_cast<size_t>(std::ceil(p * samples.size())));
    const double exact = samples[rank - 1];
    EXPECT_NEAR(h.PercentileNs(p), exact, exact / 64 + 1) << "p=" << p << " seed=" << seed;
  }
  EXPECT_EQ(h.count(), 200000);
  EXPECT_EQ(h.max_ns(), samples.back());
}

TEST(LatencyHistogramTest, SmallValuesExactAndMergeAndClear) {
  LatencyHistogram a, b;
  for (int v = 1; v <= 50; ++v) a.Record(v);
  for (int v = 51; v <= 100; ++v) b.Record(v * 1000);
  EXPECT_EQ(a.PercentileNs(0.5), 25);
  a.Merge(b);
  EXPECT_EQ(a.count(), 100);
  EXPECT_EQ(a.PercentileNs(0.5), 50);
  EXPECT_NEAR(a.PercentileNs(0.99), 99000, 99000 / 64);
  a.Clear();
  EXPECT_EQ(a.count(), 0);
  EXPECT_EQ(a.PercentileNs(0.99), 0);
  a.Record(-5);  // a clock step backwards counts as 0, never crashes
  EXPECT_EQ(a.PercentileNs(1.0), 0);
}

TEST(ProcStatusTest, ParsesKibFields) {
  const char* text =
      "Name:\toffload_server\nVmHWM:\t   81234 kB\nVmRSS:\t   40960 kB\nThreads:\t12\n";
  EXPECT_EQ(*ParseStatusKib(text, "VmRSS"), 40960);
  EXPECT_EQ(*ParseStatusKib(text, "VmHWM"), 81234);
  EXPECT_TRUE(absl::IsNotFound(ParseStatusKib(text, "VmSwap").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseStatusKib(text, "Threads").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseStatusKib("VmRSS: lots kB\n", "VmRSS").status()));
}

TEST(ProcStatusTest, ReadsThisProcess) {
  absl::StatusOr<int64_t> rss = ProcessStatusKib(getpid(), "VmRSS");
  ASSERT_TRUE(rss.ok()) << rss.status();
  EXPECT_GT(*rss, 0);
  EXPECT_FALSE(ProcessStatusKib(0, "VmRSS").ok());
  EXPECT_GE(ProcessCpuMicros(getpid()), 0);
  EXPECT_EQ(ProcessCpuMicros(0), -1);
}

TEST(LoopbackTest, OnlyLoopbackAddresses) {
  EXPECT_TRUE(IsLoopback("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopback("[::1]:50051"));
  EXPECT_TRUE(IsLoopback("localhost:1"));
  EXPECT_FALSE(IsLoopback("10.0.0.1:50051"));
  EXPECT_FALSE(IsLoopback("127.0.0.10:50051"));
  EXPECT_FALSE(IsLoopback("example.com:443"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ConnectChannels("192.0.2.1:50051", 1, std::chrono::milliseconds(1)).status()));
}

// The envelope the generators seal locally opens with libsodium at the offsets aead.proto states.
TEST(SealEnvelopeTest, LayoutAndRoundTrip) {
  ASSERT_GE(sodium_init(), 0);
  const std::string key = RandomString(32);
  for (bool xchacha : {true, false}) {
    const size_t nonce = xchacha ? 24 : 12;
    const std::string env = SealEnvelope(key, 0x01020304, xchacha, "plaintext", "aad");
    ASSERT_EQ(env.size(), 5 + nonce + 9 + 16);
    EXPECT_EQ(env.substr(0, 5), std::string("\x01\x01\x02\x03\x04", 5));
    std::string out(9, '\0');
    unsigned long long n = 0;
    const auto* c = reinterpret_cast<const unsigned char*>(env.data() + 5 + nonce);
    const auto* np = reinterpret_cast<const unsigned char*>(env.data() + 5);
    const auto* k = reinterpret_cast<const unsigned char*>(key.data());
    auto* o = reinterpret_cast<unsigned char*>(out.data());
    const auto* ad = reinterpret_cast<const unsigned char*>("aad");
    const int rc =
        xchacha ? crypto_aead_xchacha20poly1305_ietf_decrypt(o, &n, nullptr, c, 25, ad, 3, np, k)
                : crypto_aead_chacha20poly1305_ietf_decrypt(o, &n, nullptr, c, 25, ad, 3, np, k);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(out, "plaintext");
  }
}

}  // namespace
}  // namespace offload::load
