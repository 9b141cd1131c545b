// TokenVerifier on EdDSA tokens signed here with libsodium (tests/e2e/test_tokens.py checks ES256,
// RS256 and EdDSA tokens minted by PyJWT against a running server): claims, refusals by reason,
// the memo, and a JWKS that changes.
#include "service/auth/tokens.h"

#include <sodium.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace offload::auth {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string B64(absl::string_view bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_URLSAFE_NO_PADDING),
                  '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    bytes.size(), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

struct SigningKey {
  std::string kid;
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];
  explicit SigningKey(std::string id) : kid(std::move(id)) { crypto_sign_keypair(pk, sk); }
  Json Jwk() const {
    return {{"kty", "OKP"}, {"crv", "Ed25519"}, {"kid", kid},
            {"x", B64(absl::string_view(reinterpret_cast<const char*>(pk), sizeof pk))}};
  }
  std::string Sign(const Json& header, const Json& claims) const {
    const std::string input = B64(header.dump()) + "." + B64(claims.dump());
    unsigned char sig[crypto_sign_BYTES];
    crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(input.data()),
                         input.size(), sk);
    return input + "." + B64(absl::string_view(reinterpret_cast<const char*>(sig), sizeof sig));
  }
};

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    jwks_ = absl::StrCat(::testing::TempDir(), "/jwks-", getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".json");
    WriteJwks({a_.Jwk(), b_.Jwk()});
  }
  void TearDown() override { std::remove(jwks_.c_str()); }

  void WriteJwks(const std::vector<Json>& keys) {
    std::ofstream(jwks_, std::ios::trunc) << Json{{"keys", keys}}.dump();
  }
  std::unique_ptr<TokenVerifier> Make(size_t remembered_bytes = 1 << 20) {
    TokenVerifier::Options o;
    o.jwks_file = jwks_;
    o.issuer = "https://id.example";
    o.audience = "offload";
    o.remembered_bytes = remembered_bytes;
    o.clock = [this] { return now_; };
    o.watch_interval = absl::ZeroDuration();  // the test calls CheckFile
    absl::StatusOr<std::unique_ptr<TokenVerifier>> v = TokenVerifier::Create(o);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *std::move(v) : nullptr;
  }
  Json Claims(absl::string_view sub = "app-a") const {
    const int64_t now = absl::ToUnixSeconds(now_);
    return {{"iss", "https://id.example"}, {"aud", "offload"}, {"sub", std::string(sub)},
            {"iat", now}, {"exp", now + 600}};
  }
  std::string Token(const SigningKey& key, const Json& claims) const {
    return key.Sign({{"alg", "EdDSA"}, {"typ", "JWT"}, {"kid", key.kid}}, claims);
  }
  // The refusal's reason, "" when accepted.
  static std::string Reason(const absl::StatusOr<std::string>& r) {
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    const std::string m(r.status().message());
    return m.substr(6, m.find(':') - 6);  // "token <reason>: ..."
  }

  std::string jwks_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
  SigningKey a_{"a"}, b_{"b"};
};

TEST_F(TokensTest, AValidTokenNamesItsSubjectAndIsRememberedUntilExp) {
  auto v = Make();
  const std::string token = Token(a_, Claims());
  EXPECT_FALSE(v->Remembered(token).has_value());
  EXPECT_EQ(v->Verify(token).value(), "app-a");
  EXPECT_EQ(v->Remembered(token).value_or(""), "app-a");
  EXPECT_EQ(v->counts().signature_checks, 1u);
  EXPECT_EQ(v->counts().remembered, 1u);
  now_ += absl::Seconds(600 + 61);  // past exp and the 60 s skew
  EXPECT_FALSE(v->Remembered(token).has_value());
  EXPECT_EQ(Reason(v->Verify(token)), "expired");
}

TEST_F(TokensTest, AudienceMayBeAList) {
  auto v = Make();
  Json c = Claims();
  c["aud"] = {"other", "offload"};
  EXPECT_EQ(v->Verify(Token(a_, c)).value(), "app-a");
}

TEST_F(TokensTest, EachRefusalHasItsReason) {
  auto v = Make();
  const auto with = [&](const char* claim, Json value) {
    Json c = Claims();
    if (value.is_null()) {
      c.erase(claim);
    } else {
      c[claim] = value;
    }
    return Token(a_, c);
  };
  const int64_t now = absl::ToUnixSeconds(now_);
  EXPECT_EQ(Reason(v->Verify(with("exp", now - 61))), "expired");
  EXPECT_EQ(Reason(v->Verify(with("exp", now - 30))), "");  // within the skew
  EXPECT_EQ(Reason(v->Verify(with("exp", nullptr))), "malformed");
  EXPECT_EQ(Reason(v->Verify(with("nbf", now + 120))), "not_yet_valid");
  EXPECT_EQ(Reason(v->Verify(with("aud", "someone-else"))), "audience");
  EXPECT_EQ(Reason(v->Verify(with("aud", nullptr))), "audience");
  EXPECT_EQ(Reason(v->Verify(with("iss", "https://evil.example"))), "issuer");
  EXPECT_EQ(Reason(v->Verify(with("sub", ""))), "identity");
  EXPECT_EQ(Reason(v->Verify(with("sub", 7))), "identity");
  EXPECT_EQ(Reason(v->Verify(with("sub", std::string(257, 'x')))), "identity");

  EXPECT_EQ(Reason(v->Verify(a_.Sign({{"alg", "EdDSA"}, {"kid", "nope"}}, Claims()))),
            "unknown_kid");
  EXPECT_EQ(Reason(v->Verify(a_.Sign({{"alg", "EdDSA"}}, Claims()))), "unknown_kid");  // 2 keys
  EXPECT_EQ(Reason(v->Verify(a_.Sign({{"alg", "ES256"}, {"kid", "a"}}, Claims()))), "algorithm");
  EXPECT_EQ(Reason(v->Verify(a_.Sign({{"alg", "HS256"}, {"kid", "a"}}, Claims()))), "algorithm");
  EXPECT_EQ(Reason(v->Verify(a_.Sign({{"alg", "EdDSA"}, {"kid", "a"}, {"crit", {"x"}}},
                                     Claims()))),
            "malformed");
  // alg none: the header says none, the signature part is empty.
  const std::string none = B64(Json{{"alg", "none"}, {"kid", "a"}}.dump()) + "." +
                           B64(Claims().dump()) + ".";
  EXPECT_EQ(Reason(v->Verify(none)), "algorithm");
  // Signed by b, claiming a's kid; a bit flipped in a's signature.
  EXPECT_EQ(Reason(v->Verify(b_.Sign({{"alg", "EdDSA"}, {"kid", "a"}}, Claims()))), "signature");
  std::string flipped = Token(a_, Claims());
  flipped[flipped.size() - 5] = flipped[flipped.size() - 5] == 'A' ? 'B' : 'A';
  EXPECT_EQ(Reason(v->Verify(flipped)), "signature");
  EXPECT_EQ(Reason(v->Verify("a.b")), "malformed");
  EXPECT_EQ(Reason(v->Verify("a.b.c.d")), "malformed");
  EXPECT_EQ(Reason(v->Verify("!!!.b.c")), "malformed");
  EXPECT_EQ(Reason(v->Verify(std::string(9000, 'a'))), "too_large");
  // Nothing refused was remembered.
  EXPECT_EQ(v->counts().remembered, 0u);
  EXPECT_EQ(v->counts().refused[static_cast<int>(TokenVerifier::Refusal::kSignature)], 2u);
}

TEST_F(TokensTest, ARemovedKeyIsRefusedOnceTheFileChanges) {
  auto v = Make();
  const std::string token = Token(b_, Claims("app-b"));
  EXPECT_EQ(v->Verify(token).value(), "app-b");
  EXPECT_TRUE(v->Remembered(token).has_value());
  WriteJwks({a_.Jwk()});
  v->CheckFile();  // the watcher thread's look (a file's fingerprint includes its size)
  EXPECT_FALSE(v->Remembered(token).has_value());
  EXPECT_EQ(Reason(v->Verify(token)), "unknown_kid");
  // A JWKS that no longer parses, or whose members have the wrong types, keeps the keys it had.
  for (const char* bad : {"{not json", R"({"keys":[{"kty":1}]})", R"({"keys":[{"kty":"OKP","crv":[]}]})",
                          R"({"keys":{"kty":"OKP"}})"}) {
    std::ofstream(jwks_, std::ios::trunc) << bad;
    v->CheckFile();
    EXPECT_EQ(v->Verify(Token(a_, Claims())).value(), "app-a") << bad;
  }
}

TEST_F(TokensTest, TheWatcherThreadNoticesAChangedFile) {
  TokenVerifier::Options o;
  o.jwks_file = jwks_;
  o.issuer = "https://id.example";
  o.audience = "offload";
  o.clock = [this] { return now_; };
  o.watch_interval = absl::Milliseconds(20);
  auto v = TokenVerifier::Create(o).value();
  const std::string token = Token(b_, Claims("app-b"));
  ASSERT_TRUE(v->Verify(token).ok());
  WriteJwks({a_.Jwk()});
  // An answer, not a time: the watcher runs on its own; wait (up to 10 s) until it has looked.
  for (int i = 0; i < 1000 && v->Remembered(token).has_value(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(v->Remembered(token).has_value());
  EXPECT_EQ(Reason(v->Verify(token)), "unknown_kid");
}

TEST_F(TokensTest, TimesOutsideTheCalendarAreMalformed) {
  auto v = Make();
  for (Json bad : {Json(1e300), Json(-1), Json(18446744073709551615.0), Json("1800000600"),
                   Json(true), Json(nullptr)}) {
    Json c = Claims();
    c["exp"] = bad;
    EXPECT_EQ(Reason(v->Verify(Token(a_, c))), "malformed") << bad.dump();
    c = Claims();
    if (bad.is_null()) continue;  // nbf: null is "present and not a time", tested below
    c["nbf"] = bad;
    EXPECT_EQ(Reason(v->Verify(Token(a_, c))), "malformed") << "nbf " << bad.dump();
  }
  Json c = Claims();
  c["nbf"] = nullptr;
  EXPECT_EQ(Reason(v->Verify(Token(a_, c))), "malformed");
}

TEST_F(TokensTest, AnIdentityPrefixSetsTokenIdentitiesApart) {
  TokenVerifier::Options o;
  o.jwks_file = jwks_;
  o.issuer = "https://id.example";
  o.audience = "offload";
  o.identity_prefix = "jwt:";
  o.clock = [this] { return now_; };
  o.watch_interval = absl::ZeroDuration();
  auto v = TokenVerifier::Create(o).value();
  const std::string token = Token(a_, Claims("ops-admin"));
  EXPECT_EQ(v->Verify(token).value(), "jwt:ops-admin");
  EXPECT_EQ(v->Remembered(token).value_or(""), "jwt:ops-admin");
}

TEST_F(TokensTest, PrecheckRefusesWithoutASignatureCheck) {
  auto v = Make();
  EXPECT_TRUE(v->Precheck(Token(a_, Claims())).ok());
  EXPECT_EQ(v->Precheck(a_.Sign({{"alg", "HS256"}, {"kid", "a"}}, Claims())).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(v->Precheck(a_.Sign({{"alg", "EdDSA"}, {"kid", "zz"}}, Claims())).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(v->Precheck("x.y").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(v->counts().signature_checks, 0u);
}

TEST_F(TokensTest, TheMemoStaysWithinItsBound) {
  auto v = Make(/*remembered_bytes=*/10 * 140);
  std::vector<std::string> tokens;
  for (int i = 0; i < 50; ++i) {
    tokens.push_back(Token(a_, Claims(absl::StrCat("client-", i))));
    ASSERT_TRUE(v->Verify(tokens.back()).ok());
    EXPECT_LE(v->remembered_bytes(), 10u * 140);
  }
  EXPECT_TRUE(v->Remembered(tokens.back()).has_value());   // newest kept
  EXPECT_FALSE(v->Remembered(tokens.front()).has_value());  // oldest gone
}

TEST_F(TokensTest, BadKeySetsAreRefusedAtStart) {
  const auto start = [&](const std::vector<Json>& keys) {
    WriteJwks(keys);
    TokenVerifier::Options o;
    o.jwks_file = jwks_;
    o.issuer = "i";
    o.audience = "a";
    o.watch_interval = absl::ZeroDuration();
    return TokenVerifier::Create(o).status();
  };
  Json priv = a_.Jwk();
  priv["d"] = "AAAA";
  EXPECT_THAT(start({priv}).message(), HasSubstr("private"));
  EXPECT_THAT(start({{{"kty", "oct"}, {"k", "c2VjcmV0"}}}).message(), HasSubstr("private"));
  // Keys the service cannot use are skipped (a warning), so an issuer's JWKS that also lists,
  // say, an X25519 or a PS256 key still works; a JWKS of only such keys is refused.
  const Json x25519 = {{"kty", "OKP"}, {"crv", "X25519"}, {"x", "AAAA"}};
  Json wrong_alg = a_.Jwk();
  wrong_alg["alg"] = "RS256";
  EXPECT_THAT(start({x25519}).message(), HasSubstr("no signature key"));
  EXPECT_THAT(start({wrong_alg}).message(), HasSubstr("no signature key"));
  EXPECT_TRUE(start({x25519, wrong_alg, b_.Jwk()}).ok());
  EXPECT_THAT(start({{{"kty", 7}}}).message(), HasSubstr("no signature key"));
  EXPECT_THAT(start({{{"kty", "OKP"}, {"crv", "Ed25519"}, {"x", 5}}}).message(),
              HasSubstr("no signature key"));
  EXPECT_THAT(start({a_.Jwk(), a_.Jwk()}).message(), HasSubstr("twice"));
  EXPECT_THAT(start({}).message(), HasSubstr("no signature key"));
  Json enc = a_.Jwk();
  enc["use"] = "enc";
  EXPECT_THAT(start({enc}).message(), HasSubstr("no signature key"));
  // A small RSA key (1024 bits), generated by cjose's own test vectors' shape: n of 128 bytes.
  const std::string n(128, '\xc5');
  EXPECT_THAT(start({{{"kty", "RSA"}, {"kid", "r"}, {"e", "AQAB"}, {"n", B64(n)}}}).message(),
              HasSubstr("no signature key"));
  WriteJwks({a_.Jwk()});
  TokenVerifier::Options o;
  o.jwks_file = jwks_;
  EXPECT_THAT(TokenVerifier::Create(o).status().message(), HasSubstr("token_issuer"));
}

// Issue 33: one unusable key no longer refuses the whole file; it is skipped and counted, and
// the other keys verify (tests/e2e/test_tokens.py does it with PyJWT's own short EC key).
TEST_F(TokensTest, AnUnusableKeyIsSkippedAndTheOthersLoad) {
  // A P-256 key whose x lost its leading zero byte (31 bytes), as PyJWT 2.6 writes 1 key in 128;
  // an Ed25519 key of 31 bytes; a 1024-bit RSA key; an entry that is no object; a kid that is no
  // string.
  const Json short_ec = {{"kty", "EC"}, {"crv", "P-256"}, {"kid", "short-ec"},
                         {"x", B64(std::string(31, '\x11'))}, {"y", B64(std::string(32, '\x22'))}};
  const Json short_ed = {{"kty", "OKP"}, {"crv", "Ed25519"}, {"kid", "short-ed"},
                         {"x", B64(std::string(31, '\x01'))}};
  const Json small_rsa = {{"kty", "RSA"}, {"kid", "r"}, {"e", "AQAB"},
                          {"n", B64(std::string(128, '\xc5'))}};
  Json bad_kid = b_.Jwk();
  bad_kid["kid"] = 12;
  WriteJwks({short_ec, a_.Jwk(), short_ed, small_rsa, Json(7), bad_kid});
  auto v = Make();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->counts().jwks_keys_skipped, 5u);
  EXPECT_EQ(v->Verify(Token(a_, Claims())).value(), "app-a");
  // On a reload too: the file changes, the broken keys are skipped again, b now verifies.
  WriteJwks({short_ec, b_.Jwk(), a_.Jwk()});
  v->CheckFile();
  EXPECT_EQ(v->counts().jwks_keys_skipped, 6u);
  EXPECT_EQ(v->Verify(Token(b_, Claims("app-b"))).value(), "app-b");
  EXPECT_EQ(v->Verify(Token(a_, Claims())).value(), "app-a");
  EXPECT_EQ(Reason(v->Verify(b_.Sign({{"alg", "ES256"}, {"kid", "short-ec"}}, Claims()))),
            "unknown_kid");
}

TEST_F(TokensTest, ATokenWithoutKidUsesTheOnlyKey) {
  WriteJwks({a_.Jwk()});
  auto v = Make();
  EXPECT_EQ(v->Verify(a_.Sign({{"alg", "EdDSA"}}, Claims())).value(), "app-a");
}

}  // namespace
}  // namespace offload::auth
