#include "service/auth/trusted_proxies.h"

#include "gtest/gtest.h"

namespace offload::auth {
namespace {

TEST(TrustedProxies, ParsesRangesAndRefusesGarbage) {
  EXPECT_TRUE(TrustedProxies::Parse("").value().empty());
  EXPECT_FALSE(TrustedProxies::Parse("10.0.0.0/8, ::1/128, 192.0.2.1").value().empty());
  for (const char* bad : {"10.0.0.0/33", "::1/129", "example.com", "10.0.0.0/x", "1.2.3/8"}) {
    EXPECT_FALSE(TrustedProxies::Parse(bad).ok()) << bad;
  }
}

TEST(TrustedProxies, ContainsByPrefix) {
  const TrustedProxies p = TrustedProxies::Parse("10.0.0.0/8,192.0.2.128/25,2001:db8::/32").value();
  EXPECT_TRUE(p.Contains("10.255.1.2"));
  EXPECT_FALSE(p.Contains("11.0.0.1"));
  EXPECT_TRUE(p.Contains("192.0.2.200"));
  EXPECT_FALSE(p.Contains("192.0.2.127"));
  EXPECT_TRUE(p.Contains("2001:db8:1::5"));
  EXPECT_TRUE(p.Contains("[2001:db8::1]"));
  EXPECT_FALSE(p.Contains("2001:db9::1"));
  EXPECT_TRUE(p.Contains("::ffff:10.1.1.1"));  // IPv4-mapped
  EXPECT_FALSE(p.Contains("not an address"));
}

TEST(TrustedProxies, ForwardedClientOnlyFromTrustedPeers) {
  const TrustedProxies p = TrustedProxies::Parse("127.0.0.2/32, 10.0.0.0/8").value();
  EXPECT_EQ(p.ClientOf("127.0.0.2", "203.0.113.7"), "203.0.113.7");
  // Right to left, past the trusted hops; what the client wrote itself (left) is not believed.
  EXPECT_EQ(p.ClientOf("127.0.0.2", "198.51.100.1, 203.0.113.7, 10.1.1.1"), "203.0.113.7");
  EXPECT_EQ(p.ClientOf("127.0.0.1", "203.0.113.7"), "");  // not a trusted peer
  EXPECT_EQ(p.ClientOf("127.0.0.2", std::nullopt), "");
  EXPECT_EQ(p.ClientOf("127.0.0.2", "10.0.0.1, 10.0.0.2"), "");
  EXPECT_EQ(p.ClientOf("127.0.0.2", "garbage"), "");
  EXPECT_EQ(TrustedProxies().ClientOf("127.0.0.2", "203.0.113.7"), "");
}

}  // namespace
}  // namespace offload::auth
