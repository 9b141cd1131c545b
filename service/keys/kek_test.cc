#include "service/keys/kek.h"

#include <stdlib.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/internal/test_util.h"

namespace offload::keys {
namespace {

using ::offload::keys::testing::ModeOf;
using ::offload::keys::testing::ReadBytes;
using ::offload::keys::testing::TempDir;
using ::offload::keys::testing::WriteBytes;
using ::offload::keys::testing::WriteText;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHex[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
constexpr char kTestVar[] = "OFFLOAD_KEK_TEST_VAR";

SecretBytes Expected() {
  SecretBytes k(32);
  for (int i = 0; i < 32; ++i) k[i] = static_cast<uint8_t>(i);
  return k;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

class KekTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sodium_init(), 0);
    ::unsetenv(kDefaultKekEnvVar);
    ::unsetenv(kTestVar);
  }
  void TearDown() override {
    ::unsetenv(kDefaultKekEnvVar);
    ::unsetenv(kTestVar);
  }

  // A KEK file in the temp dir with `content` and `mode`.
  std::string KekFile(absl::string_view content, mode_t mode = 0600) {
    const std::string path = dir_.Sub("kekfile");
    WriteText(path, content);
    ::chmod(path.c_str(), mode);
    return path;
  }

  absl::StatusOr<SecretBytes> FromFile(const std::string& path) {
    KekSource source;
    source.file = path;
    return LoadKek(source);
  }

  TempDir dir_;
};

TEST_F(KekTest, HexFileWithSurroundingWhitespace) {
  KekOrigin origin;
  KekSource source;
  source.file = KekFile(absl::StrCat("  ", kHex, "\n"));
  auto kek = LoadKek(source, &origin);
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(SecretEquals(*kek, Expected()));
  EXPECT_FALSE(origin.generated);
  EXPECT_THAT(origin.description, HasSubstr(source.file));
}

TEST_F(KekTest, UppercaseHexFile) {
  auto kek = FromFile(KekFile(absl::AsciiStrToUpper(kHex)));
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(SecretEquals(*kek, Expected()));
}

TEST_F(KekTest, RawFile) {
  const SecretBytes raw = Expected();
  auto kek = FromFile(KekFile(absl::string_view(reinterpret_cast<const char*>(raw.data()), 32)));
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(SecretEquals(*kek, raw));
}

TEST_F(KekTest, WrongLengthBadHexAndShortHexAreRejectedWithoutEchoingContent) {
  auto s = FromFile(KekFile(std::string(kHex).substr(0, 62))).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("expected 64 hex characters, got 62"));

  std::string bad = kHex;
  bad[10] = 'g';
  s = FromFile(KekFile(bad)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("non-hex"));
  EXPECT_THAT(Msg(s), Not(HasSubstr("0a0b")));

  s = FromFile(KekFile(std::string(kHex).substr(0, 32))).status();  // hex of a 16-byte key
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("16-byte key"));

  s = FromFile(KekFile("")).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;

  s = FromFile(KekFile(std::string(5000, 'a'))).status();
  EXPECT_FALSE(s.ok());
}

TEST_F(KekTest, MissingFileIsNotFound) {
  auto s = FromFile(dir_.Sub("nope")).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("nope"));
}

TEST_F(KekTest, GroupOrWorldAccessibleFileIsRefused) {
  for (mode_t mode : {0644, 0640, 0604, 0620, 0660}) {
    auto s = FromFile(KekFile(kHex, mode)).status();
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << std::oct << mode << " " << s;
    EXPECT_THAT(Msg(s), HasSubstr("group or others"));
  }
  EXPECT_TRUE(FromFile(KekFile(kHex, 0400)).ok());
}

TEST_F(KekTest, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  auto s = FromFile(KekFile(kHex, 0000)).status();
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
}

TEST_F(KekTest, DirectoryAsFileIsAnError) {
  EXPECT_FALSE(FromFile(dir_.path()).ok());
}

TEST_F(KekTest, DefaultEnvironmentVariable) {
  ::setenv(kDefaultKekEnvVar, kHex, 1);
  KekOrigin origin;
  auto kek = LoadKek(KekSource(), &origin);
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(SecretEquals(*kek, Expected()));
  EXPECT_THAT(origin.description, HasSubstr(kDefaultKekEnvVar));
}

TEST_F(KekTest, NamedEnvironmentVariable) {
  KekSource source;
  source.env_var = kTestVar;
  source.data_dir = dir_.path();
  ::setenv(kDefaultKekEnvVar, std::string(64, 'f').c_str(), 1);  // ignored: another name given
  ::setenv(kTestVar, absl::StrCat(kHex, "\n").c_str(), 1);
  KekOrigin origin;
  auto kek = LoadKek(source, &origin);
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(SecretEquals(*kek, Expected()));
  EXPECT_THAT(origin.description, HasSubstr(kTestVar));

  ::setenv(kTestVar, "abcd", 1);
  auto s = LoadKek(source).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("expected 64 hex characters, got 4"));
  EXPECT_THAT(Msg(s), Not(HasSubstr("abcd")));
}

// As the server runs by default: --kek_env=OFFLOAD_KEK, variable unset -> generated KEK.
TEST_F(KekTest, UnsetOrEmptyVariableFallsBackToGeneration) {
  KekSource source;
  source.env_var = kTestVar;
  source.data_dir = dir_.path();
  ::setenv(kTestVar, "", 1);
  KekOrigin origin;
  auto kek = LoadKek(source, &origin);
  ASSERT_TRUE(kek.ok()) << kek.status();
  EXPECT_TRUE(origin.generated);
  source.data_dir.clear();
  auto s = LoadKek(source).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr(kTestVar));
}

TEST_F(KekTest, FileTakesPrecedenceOverEnvironment) {
  ::setenv(kDefaultKekEnvVar, std::string(64, 'f').c_str(), 1);
  auto kek = FromFile(KekFile(kHex));
  ASSERT_TRUE(kek.ok());
  EXPECT_TRUE(SecretEquals(*kek, Expected()));
}

TEST_F(KekTest, GeneratedOnceThenReused) {
  KekSource source;
  source.data_dir = dir_.Sub("data/nested");
  KekOrigin origin;
  auto first = LoadKek(source, &origin);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 32u);
  EXPECT_TRUE(origin.generated);
  const std::string path = source.data_dir + "/kek";
  EXPECT_EQ(ModeOf(path), 0600);
  EXPECT_EQ(ModeOf(source.data_dir), 0700);
  EXPECT_EQ(ReadBytes(path).size(), 65u);  // 64 hex + newline
  EXPECT_THAT(origin.description, HasSubstr(path));

  auto second = LoadKek(source, &origin);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(origin.generated);
  EXPECT_TRUE(SecretEquals(*first, *second));

  // And the generated file works as an explicit KEK file too.
  auto third = FromFile(path);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(SecretEquals(*first, *third));
}

TEST_F(KekTest, GenerationRefusedWhenAKeyStoreAlreadyExists) {
  WriteText(dir_.Sub("keys.db"), "sealed under a lost kek");
  KekSource source;
  source.data_dir = dir_.path();
  auto s = LoadKek(source).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("keys.db"));
  EXPECT_NE(::access(dir_.Sub("kek").c_str(), F_OK), 0);
}

TEST_F(KekTest, TooOpenGeneratedFileIsRefused) {
  KekSource source;
  source.data_dir = dir_.path();
  ASSERT_TRUE(LoadKek(source).ok());
  ::chmod(dir_.Sub("kek").c_str(), 0644);
  EXPECT_TRUE(absl::IsPermissionDenied(LoadKek(source).status()));
}

TEST_F(KekTest, NoSourceAtAll) {
  auto s = LoadKek(KekSource()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr(kDefaultKekEnvVar));
}

}  // namespace
}  // namespace offload::keys
