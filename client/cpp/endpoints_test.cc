#include "client/cpp/endpoints.h"

#include <netdb.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/rendezvous.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

TEST(ParseEndpointsTest, List) {
  auto spec = ParseEndpoints(" 127.0.0.1:5002, 127.0.0.1:5001,127.0.0.1:5001 ");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->addresses, std::vector<std::string>({"127.0.0.1:5001", "127.0.0.1:5002"}));
  EXPECT_TRUE(spec->dns_host.empty());
  auto v6 = ParseEndpoints("[::1]:50051");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->addresses, std::vector<std::string>({"[::1]:50051"}));
}

TEST(ParseEndpointsTest, Dns) {
  for (const char* s : {"dns:offload.ns.svc:50051", "dns:///offload.ns.svc:50051"}) {
    auto spec = ParseEndpoints(s);
    ASSERT_TRUE(spec.ok()) << s;
    EXPECT_EQ(spec->dns_host, "offload.ns.svc");
    EXPECT_EQ(spec->dns_port, "50051");
    EXPECT_TRUE(spec->addresses.empty());
  }
}

TEST(ParseEndpointsTest, Malformed) {
  for (const char* s : {"", "  ", "127.0.0.1", "127.0.0.1:", ":5", "a:1,,b:2", "dns:name",
                        "dns:a:1,b:2", "host:port"}) {
    auto spec = ParseEndpoints(s);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << "'" << s << "'";
  }
}

// True if this system's resolver knows "localhost" (a minimal root without /etc/hosts does not).
bool SystemResolvesLocalhost() {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo("localhost", "1", &hints, &result);
  if (result != nullptr) freeaddrinfo(result);
  return rc == 0;
}

TEST(ResolveHostTest, Localhost) {
  if (!SystemResolvesLocalhost()) {
    GTEST_SKIP() << "this system's resolver does not know localhost (no /etc/hosts entry)";
  }
  auto addrs = ResolveHost("localhost", "50051");
  ASSERT_TRUE(addrs.ok()) << addrs.status();
  EXPECT_NE(std::find(addrs->begin(), addrs->end(), "127.0.0.1:50051"), addrs->end());
}

TEST(ResolveHostTest, LiteralsAndUnknownNames) {
  auto literal = ResolveHost("127.0.0.1", "7");
  ASSERT_TRUE(literal.ok());
  EXPECT_EQ(*literal, std::vector<std::string>({"127.0.0.1:7"}));
  EXPECT_EQ(ResolveHost("no-such-host.invalid", "1").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(EndpointSetTest, DnsNameBecomesItsAddresses) {
  auto set = EndpointSet::Create("dns:127.0.0.1:5001", {});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ((*set)->Addresses(), std::vector<std::string>({"127.0.0.1:5001"}));
  auto none = EndpointSet::Create("dns:no-such-host.invalid:5001", {});
  ASSERT_TRUE(none.ok());  // not an error yet: calls are UNAVAILABLE until it resolves
  EXPECT_EQ((*none)->Pick("k").status().code(), absl::StatusCode::kUnavailable);
}

// Channels connect lazily, so no server is needed to check routing and failover.
TEST(EndpointSetTest, DownEndpointsKeysMoveToTheirNextChoiceAndOnlyThose) {
  EndpointSetOptions options;
  options.down_initial = absl::Hours(1);  // stays down for the whole test
  auto set = EndpointSet::Create("127.0.0.1:5001,127.0.0.1:5002,127.0.0.1:5003", options);
  ASSERT_TRUE(set.ok());
  const std::vector<std::string> all = (*set)->Addresses();
  std::vector<std::string> before;
  for (int i = 0; i < 300; ++i) before.push_back((*(*set)->Pick(absl::StrCat("k", i)))->address);

  (*set)->ReportFailure("127.0.0.1:5002", /*connection=*/false);
  EXPECT_TRUE((*set)->IsDown("127.0.0.1:5002"));
  EXPECT_EQ((*set)->marked_down(), 1);
  for (int i = 0; i < 300; ++i) {
    const std::string key = absl::StrCat("k", i);
    const std::string now = (*(*set)->Pick(key))->address;
    if (before[i] == "127.0.0.1:5002") {
      EXPECT_EQ(now, all[RankEndpoints(key, all)[1]]);
    } else {
      EXPECT_EQ(now, before[i]);
    }
  }
  // Every endpoint down: the marks are ignored rather than failing every call.
  (*set)->ReportFailure("127.0.0.1:5001", /*connection=*/false);
  (*set)->ReportFailure("127.0.0.1:5003", /*connection=*/true);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ((*(*set)->Pick(absl::StrCat("k", i)))->address, before[i]);
  }
  // A success does not lift a backoff that a server's UNAVAILABLE started (a call in flight
  // before it cannot know); it does lift one that a connection failure started (the channel
  // works again). Unknown addresses are ignored.
  (*set)->ReportSuccess("127.0.0.1:5002");
  EXPECT_TRUE((*set)->IsDown("127.0.0.1:5002"));
  EXPECT_TRUE((*set)->IsDown("127.0.0.1:5003"));  // not connected: stays down
  (*set)->ReportSuccess("127.0.0.1:5003");
  EXPECT_FALSE((*set)->IsDown("127.0.0.1:5003"));
  EXPECT_FALSE((*set)->HasFailed("127.0.0.1:5003"));
  (*set)->ReportFailure("10.9.9.9:1", /*connection=*/true);
  EXPECT_EQ((*set)->marked_down(), 3);
}

TEST(EndpointSetTest, PreferredEndpointWhileUsableAndWhetherThereIsAnAlternative) {
  EndpointSetOptions options;
  options.down_initial = absl::Hours(1);
  auto set = EndpointSet::Create("127.0.0.1:5001,127.0.0.1:5002", options);
  ASSERT_TRUE(set.ok());
  // A key of 5001 asked for with 5002 preferred goes to 5002 (where its batch was grouped).
  std::string key_of_5001;
  for (int i = 0; key_of_5001.empty(); ++i) {
    const std::string k = absl::StrCat("k", i);
    if ((*(*set)->Pick(k))->address == "127.0.0.1:5001") key_of_5001 = k;
  }
  bool alternative = false;
  EXPECT_EQ((*(*set)->Pick(key_of_5001, "127.0.0.1:5002", &alternative))->address,
            "127.0.0.1:5002");
  EXPECT_TRUE(alternative);
  // An unknown preferred endpoint, or one marked down, is not used: the key's route is.
  EXPECT_EQ((*(*set)->Pick(key_of_5001, "127.0.0.1:9999"))->address, "127.0.0.1:5001");
  (*set)->ReportFailure("127.0.0.1:5002", /*connection=*/true);
  EXPECT_EQ((*(*set)->Pick(key_of_5001, "127.0.0.1:5002", &alternative))->address,
            "127.0.0.1:5001");
  EXPECT_FALSE(alternative);  // 5002 is down: nothing to fail over to
  (*set)->ReportFailure("127.0.0.1:5001", /*connection=*/true);
  EXPECT_EQ((*(*set)->Pick(key_of_5001, {}, &alternative))->address, "127.0.0.1:5001");
  EXPECT_FALSE(alternative);
}

}  // namespace
}  // namespace offload::client
