// The PKCS#11 KEK against Debian's SoftHSM2: a token initialised in a temporary folder
// (SOFTHSM2_CONF), keys generated inside it, wrong PIN and missing token, rotation by a newer
// generation. Skipped when softhsm2 is not installed (scripts/install-deps.sh installs it).
#include "service/keys/pkcs11_kek.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/envelope.h"
#include "service/keys/internal/test_util.h"
#include "service/keys/kek_setup.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::TempDir;
using ::offload::keys::testing::WriteText;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModule[] = "/usr/lib/softhsm/libsofthsm2.so";
constexpr char kPin[] = "pin-1234";

Pkcs11KekOptions Opts(std::string uri) {
  Pkcs11KekOptions o;
  o.uri = std::move(uri);
  return o;
}

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class Pkcs11KekTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kModule, R_OK) != 0 || ::access("/usr/bin/softhsm2-util", X_OK) != 0) {
      GTEST_SKIP() << "softhsm2 is not installed";
    }
    ASSERT_EQ(::mkdir(dir_.Sub("tokens").c_str(), 0700), 0);
    WriteText(dir_.Sub("softhsm2.conf"),
              absl::StrCat("directories.tokendir = ", dir_.Sub("tokens"),
                           "\nobjectstore.backend = file\nlog.level = ERROR\n"));
    ::setenv("SOFTHSM2_CONF", dir_.Sub("softhsm2.conf").c_str(), 1);
    const std::string init = absl::StrCat(
        "/usr/bin/softhsm2-util --init-token --free --label kek-test --pin ", kPin,
        " --so-pin so-5678 >/dev/null");
    ASSERT_EQ(std::system(init.c_str()), 0);
    WriteText(dir_.Sub("pin"), absl::StrCat(kPin, "\n"));
    ASSERT_EQ(::chmod(dir_.Sub("pin").c_str(), 0600), 0);
  }

  std::string Uri(absl::string_view extra = "") const {
    return absl::StrCat("pkcs11:token=kek-test;object=test-kek", extra, "?module-path=", kModule,
                        "&pin-source=", dir_.Sub("pin"));
  }

  TempDir dir_;
};

TEST_F(Pkcs11KekTest, GeneratesWrapsRotatesAndReadsOlderGenerations) {
  auto token = Pkcs11Token::Open(Opts(Uri()));
  ASSERT_TRUE(token.ok()) << token.status();
  // No key yet: a clear NotFound.
  const absl::Status none = (*token)->ResolveCurrent().status();
  EXPECT_TRUE(absl::IsNotFound(none)) << none;
  EXPECT_THAT(std::string(none.message()), HasSubstr("test-kek"));

  auto first = (*token)->GenerateKek();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "pkcs11:test-kek/0000000000000001");
  auto ring = KekRing::Create(nullptr, {}, *token);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ((*ring)->Current()->name(), *first);

  auto blob = SealEnvelope(*(*ring)->Current(), EnvelopeKind::kKeyRecord, Bytes("k"),
                           Bytes("secret record"));
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(*EnvelopeKekName(*blob), *first);
  auto opened = OpenEnvelope(**ring, EnvelopeKind::kKeyRecord, Bytes("k"), *blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(std::string(opened->begin(), opened->end()), "secret record");
  EXPECT_TRUE(absl::IsDataLoss(
      OpenEnvelope(**ring, EnvelopeKind::kKeyRecord, Bytes("other"), *blob).status()));

  // Rotation: a second generation, created by another process (the one-shot command).
  auto second = CreatePkcs11Kek(Opts(Uri()));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, "pkcs11:test-kek/0000000000000002");
  auto changed = (*ring)->Refresh();
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ((*ring)->Current()->name(), *second);
  // The blob under the first generation still opens; new ones name the second.
  EXPECT_TRUE(OpenEnvelope(**ring, EnvelopeKind::kKeyRecord, Bytes("k"), *blob).ok());
  auto newer = SealEnvelope(*(*ring)->Current(), EnvelopeKind::kKeyRecord, {}, Bytes("x"));
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ(*EnvelopeKekName(*newer), *second);

  // A fresh process (a replica) that knows only the URI finds both by the names blobs carry.
  auto other = Pkcs11Token::Open(Opts(Uri()));
  ASSERT_TRUE(other.ok()) << other.status();
  auto other_ring = KekRing::Create(nullptr, {}, *other);
  ASSERT_TRUE(other_ring.ok());
  EXPECT_TRUE(OpenEnvelope(**other_ring, EnvelopeKind::kKeyRecord, Bytes("k"), *blob).ok());
  EXPECT_TRUE(OpenEnvelope(**other_ring, EnvelopeKind::kKeyRecord, {}, *newer).ok());

  // Pinned to the first generation by id=: it stays current.
  auto pinned = Pkcs11Token::Open(Opts(Uri(";id=%00%00%00%00%00%00%00%01")));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto pinned_kek = (*pinned)->ResolveCurrent();
  ASSERT_TRUE(pinned_kek.ok()) << pinned_kek.status();
  EXPECT_EQ((*pinned_kek)->name(), *first);

  // A name the token does not hold.
  auto ghost = SealEnvelope(**RawKek::Create(SecretBytes(32, 7)), EnvelopeKind::kKeyRecord, {},
                            Bytes("x"));
  ASSERT_TRUE(ghost.ok());
  const absl::Status s = OpenEnvelope(**ring, EnvelopeKind::kKeyRecord, {}, *ghost).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

// A key written into the token with a known value (pkcs11-tool --write-object: not generated
// there, CKA_LOCAL false), even with a greater generation id, never becomes the KEK: whoever may
// write to the token must not be able to choose the key the store gets re-wrapped under.
TEST_F(Pkcs11KekTest, AKeyImportedWithAKnownValueNeverBecomesCurrent) {
  if (::access("/usr/bin/pkcs11-tool", X_OK) != 0) GTEST_SKIP() << "opensc is not installed";
  auto token = Pkcs11Token::Open(Opts(Uri()));
  ASSERT_TRUE(token.ok()) << token.status();
  auto first = (*token)->GenerateKek();
  ASSERT_TRUE(first.ok()) << first.status();
  WriteText(dir_.Sub("known-key"), std::string(32, 'k'));
  const std::string plant = absl::StrCat(
      "/usr/bin/pkcs11-tool --module ", kModule, " --token-label kek-test --login --pin ", kPin,
      " --write-object ", dir_.Sub("known-key"), " --type secrkey --key-type AES:32",
      " --label test-kek --id 00000000000000ff --usage-decrypt --sensitive >/dev/null 2>&1");
  ASSERT_EQ(std::system(plant.c_str()), 0) << plant;
  auto current = (*token)->ResolveCurrent();
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ((*current)->name(), *first) << "the planted key was adopted";
  const absl::Status planted = (*token)->Resolve("pkcs11:test-kek/00000000000000ff").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(planted)) << planted;
  EXPECT_THAT(std::string(planted.message()), HasSubstr("CKA_LOCAL"));
}

TEST_F(Pkcs11KekTest, WrongPinIsPermissionDeniedAndNeverEchoed) {
  WriteText(dir_.Sub("pin"), "not-the-pin-9876\n");
  ASSERT_EQ(::chmod(dir_.Sub("pin").c_str(), 0600), 0);
  auto token = Pkcs11Token::Open(Opts(Uri()));
  ASSERT_FALSE(token.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(token.status())) << token.status();
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("wrong PIN"));
  EXPECT_THAT(std::string(token.status().message()), Not(HasSubstr("9876")));
  // pin-value in the URI is hidden in messages too.
  auto by_value = Pkcs11Token::Open(
      Opts(absl::StrCat("pkcs11:token=absent;pin-value=hush-4321?module-path=", kModule)));
  ASSERT_FALSE(by_value.ok());
  EXPECT_THAT(std::string(by_value.status().message()), Not(HasSubstr("hush-4321")));
}

TEST_F(Pkcs11KekTest, MissingTokenListsWhatIsThere) {
  auto token = Pkcs11Token::Open(
      Opts(absl::StrCat("pkcs11:token=no-such-token?module-path=", kModule, "&pin-source=",
                    dir_.Sub("pin"))));
  ASSERT_FALSE(token.ok());
  EXPECT_TRUE(absl::IsNotFound(token.status())) << token.status();
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("no token matches"));
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("kek-test"));
}

TEST_F(Pkcs11KekTest, MissingModuleAndPinAreClear) {
  auto no_module = Pkcs11Token::Open(
      Opts(absl::StrCat("pkcs11:token=kek-test?module-path=/nonexistent/lib.so&pin-source=",
                    dir_.Sub("pin"))));
  EXPECT_TRUE(absl::IsNotFound(no_module.status())) << no_module.status();
  EXPECT_THAT(std::string(no_module.status().message()), HasSubstr("/nonexistent/lib.so"));
  Pkcs11KekOptions no_pin = Opts(absl::StrCat("pkcs11:token=kek-test?module-path=", kModule));
  no_pin.pin_env = "OFFLOAD_TEST_UNSET_PIN_VARIABLE";
  auto token = Pkcs11Token::Open(no_pin);
  EXPECT_TRUE(absl::IsFailedPrecondition(token.status())) << token.status();
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("no PIN"));
  EXPECT_TRUE(absl::IsInvalidArgument(Pkcs11Token::Open(Opts("not a uri")).status()));
}

// Issue 33: a pin-value is taken out of the URI in place (the command line no longer shows it),
// percent-decoded, and the URI still parses to the same token.
TEST(TakePinValueTest, TakesThePinOutInPlaceAndWipesTheTail) {
  struct Case {
    std::string in, out, pin;
  };
  const Case cases[] = {
      {"pkcs11:token=t?module-path=/m.so&pin-value=12%2534&x=y", "pkcs11:token=t?module-path=/m.so&x=y",
       "12%34"},
      {"pkcs11:token=t?pin-value=abc&module-path=/m.so", "pkcs11:token=t?module-path=/m.so", "abc"},
      {"pkcs11:token=t?pin-value=abc", "pkcs11:token=t", "abc"},
      {"pkcs11:token=absent;pin-value=hush-4321?module-path=/m.so",
       "pkcs11:token=absent?module-path=/m.so", "hush-4321"},
      {"pkcs11:pin-value=p;token=t", "pkcs11:token=t", "p"},
      {"pkcs11:token=xpin-value=no?module-path=/m.so", "pkcs11:token=xpin-value=no?module-path=/m.so",
       ""},
      {"pkcs11:token=t?pin-value=a&pin-value=b", "pkcs11:token=t", "b"},
  };
  for (const Case& c : cases) {
    std::string buffer = c.in;
    KeyBytes pin;
    auto taken = TakePinValue(buffer.data(), &pin);
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(*taken, !c.pin.empty()) << c.in;
    EXPECT_EQ(std::string(buffer.c_str()), c.out) << c.in;
    EXPECT_EQ(std::string(pin.begin(), pin.end()), c.pin) << c.in;
    // Past the new end: zeros only (what was moved or taken is gone).
    for (size_t i = std::strlen(buffer.c_str()); i < buffer.size(); ++i) {
      ASSERT_EQ(buffer[i], '\0') << c.in << " at " << i;
    }
  }
  std::string bad = "pkcs11:token=t?pin-value=ab%zz-secret";
  KeyBytes pin;
  auto refused = TakePinValue(bad.data(), &pin);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr("secret")));
  EXPECT_EQ(bad.find("secret"), std::string::npos);
}

}  // namespace
}  // namespace offload::keys
