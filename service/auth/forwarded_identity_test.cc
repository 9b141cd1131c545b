#include "service/auth/forwarded_identity.h"

#include "gtest/gtest.h"

namespace offload::auth {
namespace {

std::string IdentityOr(const ForwardedIdentity& f, absl::string_view value) {
  absl::StatusOr<std::string> id = f.IdentityOf(value);
  return id.ok() ? *id : "error: " + std::string(id.status().message());
}

TEST(ForwardedIdentityTest, EnvoyXfccNamesUriThenDnsThenSubjectCnOfTheLastElement) {
  const ForwardedIdentity f = ForwardedIdentity::Parse("X-Forwarded-Client-Cert").value();
  EXPECT_EQ(f.header(), "x-forwarded-client-cert");
  EXPECT_EQ(IdentityOr(f, "By=spiffe://offload;Hash=ab12;Subject=\"CN=app-a,O=Example\";"
                          "URI=spiffe://offload/app-b;DNS=app-b.example"),
            "spiffe://offload/app-b");
  EXPECT_EQ(IdentityOr(f, "Hash=ab12;DNS=app-c;DNS=other"), "app-c");
  EXPECT_EQ(IdentityOr(f, "Hash=ab12;Subject=\"CN=app-d,OU=x\\,y\""), "app-d");
  // Two proxies: the last element is the nearest one's.
  EXPECT_EQ(IdentityOr(f, "URI=spiffe://far;Hash=1,Hash=2;Subject=\"O=a,CN=near\""), "near");
  EXPECT_EQ(IdentityOr(f, "Hash=ab12").substr(0, 6), "error:");
  // A client's open quote must not swallow the proxy's own element (APPEND_FORWARD).
  EXPECT_EQ(IdentityOr(f, "URI=spiffe://offload/admin;x=\",By=p;URI=spiffe://offload/app-b")
                .substr(0, 6),
            "error:");
  EXPECT_EQ(IdentityOr(f, "URI=spiffe://offload/admin\\").substr(0, 6), "error:");
  EXPECT_EQ(IdentityOr(f, "URI=a,,URI=b"), "b");
}

TEST(ForwardedIdentityTest, NginxHeaders) {
  const ForwardedIdentity dn = ForwardedIdentity::Parse("x-ssl-client-s-dn").value();
  EXPECT_EQ(IdentityOr(dn, "CN=app-a,O=Example Corp"), "app-a");
  EXPECT_EQ(IdentityOr(dn, "O=Example").substr(0, 6), "error:");
  const ForwardedIdentity pem = ForwardedIdentity::Parse("ssl-client-cert").value();
  EXPECT_EQ(IdentityOr(pem, "-----BEGIN%20CERTIFICATE-----%0Anot-a-cert").substr(0, 6), "error:");
  EXPECT_EQ(IdentityOr(pem, "%zz").substr(0, 6), "error:");
  EXPECT_EQ(IdentityOr(pem, std::string(20000, 'a')).substr(0, 6), "error:");
}

TEST(ForwardedIdentityTest, UnknownHeadersAreRefused) {
  EXPECT_FALSE(ForwardedIdentity::Parse("x-client").ok());
  EXPECT_FALSE(ForwardedIdentity::Parse("").ok());
}

}  // namespace
}  // namespace offload::auth
