// Checks of TLS inputs and bearer tokens made before any connection (credentials.h), and the
// Client's use of them (no server needed: nothing connects until a call).
#include "client/cpp/credentials.h"

#include <string>

#include "absl/status/status.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(CheckBearerTokenTest, AcceptsVisibleAsciiAndNamesTheFieldNotTheToken) {
  EXPECT_TRUE(CheckBearerToken("token", "eyJhbGciOiJFZERTQSJ9.e30.c2ln-_~+/=").ok());
  const absl::Status space = CheckBearerToken("token", "secret words");
  EXPECT_EQ(space.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(space), HasSubstr("token: expected visible ASCII characters, got byte 0x20 "
                                        "at position 6 of 12"));
  EXPECT_THAT(Message(space), Not(HasSubstr("secret")));
  EXPECT_FALSE(CheckBearerToken("token", "abc\n").ok());
  EXPECT_FALSE(CheckBearerToken("token", std::string("a\0b", 3)).ok());
  EXPECT_FALSE(CheckBearerToken("token", "caf\xc3\xa9").ok());
  EXPECT_THAT(Message(CheckBearerToken("token", "")), HasSubstr("got 0"));
  EXPECT_FALSE(CheckBearerToken("token", std::string(16385, 'a')).ok());
  EXPECT_TRUE(CheckBearerToken("token", std::string(16384, 'a')).ok());
}

TEST(MakeTlsCredentialsTest, NoInputIsTlsWithTheSystemRoots) {
  auto creds = MakeTlsCredentials(TlsFiles());
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_NE(*creds, nullptr);
}

TEST(MakeTlsCredentialsTest, RefusesBrokenInputsNamingTheField) {
  TlsFiles both;
  both.ca_file = "/etc/ca.crt";
  both.ca_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_THAT(Message(MakeTlsCredentials(both).status()),
              HasSubstr("tls_ca_file, tls_ca_pem: expected at most one, got both"));

  TlsFiles missing;
  missing.ca_file = "/nonexistent/ca.crt";
  absl::Status s = MakeTlsCredentials(missing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("tls_ca_file: cannot read '/nonexistent/ca.crt': No such"));

  TlsFiles junk;
  junk.ca_pem = "no certificate here";
  EXPECT_THAT(Message(MakeTlsCredentials(junk).status()),
              HasSubstr("tls_ca_pem: expected PEM certificates"));

  TlsFiles key_only;
  key_only.key_pem = "-----BEGIN PRIVATE KEY-----\nsecret material\n-----END PRIVATE KEY-----\n";
  s = MakeTlsCredentials(key_only).status();
  EXPECT_THAT(Message(s), HasSubstr("tls_cert_file, tls_cert_pem: expected the client certificate"));
  EXPECT_THAT(Message(s), Not(HasSubstr("secret material")));

  TlsFiles cert_only;
  cert_only.cert_pem = "not parsed before the pair is complete";
  EXPECT_THAT(Message(MakeTlsCredentials(cert_only).status()),
              HasSubstr("tls_key_file, tls_key_pem: expected the private key"));
}

TEST(ClientTokenTest, CreateAndSetBearerTokenRefuseBadTokensAndKeepThePreviousOne) {
  ClientOptions o;
  o.endpoints = "127.0.0.1:1";
  o.bearer_token = "two words";
  auto refused = Client::Create(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(refused.status()), HasSubstr("bearer_token"));
  EXPECT_THAT(Message(refused.status()), Not(HasSubstr("two words")));

  o.bearer_token = "aaa.bbb.ccc";
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->SetBearerToken("bad\ttoken").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*client)->SetBearerToken("ddd.eee.fff").ok());
  EXPECT_TRUE((*client)->SetBearerToken("").ok());  // none from now on
}

}  // namespace
}  // namespace offload::client
