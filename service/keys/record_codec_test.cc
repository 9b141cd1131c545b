#include "service/keys/record_codec.h"

#include <sodium.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/keys/envelope.h"
#include "service/keys/key_id.h"

namespace offload::keys {
namespace {

using ::testing::HasSubstr;

SecretBytes Random(size_t n) {
  SecretBytes s(n);
  randombytes_buf(s.data(), s.size());
  return s;
}

absl::Span<const uint8_t> Bytes(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

KeyRecord Valid() {
  KeyRecord r;
  r.key_id = "k";
  r.type = v1::KEY_TYPE_X25519;
  r.current_version = 2;
  for (uint32_t v : {1u, 2u}) {
    KeyVersionRecord kv;
    kv.version = v;
    { SecretBytes r = Random(32); kv.secret.assign(r.begin(), r.end()); }
    kv.public_key.assign(32, 7);
    r.versions.push_back(kv);
  }
  return r;
}

class RecordCodecTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GE(sodium_init(), 0); }
};

TEST(KeyIdTest, EdgeCases) {
  for (const std::string& ok :
       {std::string("a"), std::string("0"), std::string("payments"), std::string("a.b_c-d"),
        std::string("9-"), std::string(64, 'z')}) {
    EXPECT_TRUE(ValidateKeyId(ok).ok()) << ok;
  }
  const std::string too_long(65, 'a');
  for (absl::string_view bad :
       {absl::string_view(""), absl::string_view("A"), absl::string_view("-a"),
        absl::string_view(".a"), absl::string_view("_a"), absl::string_view("a b"),
        absl::string_view("a/b"), absl::string_view("aB"), absl::string_view("a\n"),
        absl::string_view("\xc3\xa9"), absl::string_view("a\0b", 3), absl::string_view(too_long)}) {
    absl::Status s = ValidateKeyId(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("key_id")) << bad;
  }
  EXPECT_THAT(std::string(ValidateKeyId(too_long).message()), HasSubstr("got 65"));
}

TEST_F(RecordCodecTest, ValidateKeyRecord) {
  EXPECT_TRUE(ValidateKeyRecord(Valid()).ok());
  KeyRecord r = Valid();
  r.current_version = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
  r = Valid();
  std::swap(r.versions[0], r.versions[1]);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
  r = Valid();
  r.versions[0].version = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
  r = Valid();
  r.versions.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
  r = Valid();
  r.versions[1].public_key.clear();
  EXPECT_THAT(std::string(ValidateKeyRecord(r).message()), HasSubstr("expected 32 bytes, got 0"));
  r = Valid();
  r.type = v1::KEY_TYPE_CHACHA20_POLY1305;  // AEAD: no public key, no allow_zero option
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
  for (auto& v : r.versions) v.public_key.clear();
  EXPECT_TRUE(ValidateKeyRecord(r).ok());
  r.options.set_allow_zero_shared_secret(true);
  EXPECT_THAT(std::string(ValidateKeyRecord(r).message()), HasSubstr("allow_zero_shared_secret"));
  r = Valid();
  r.type = static_cast<v1::KeyType>(42);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateKeyRecord(r)));
}

TEST_F(RecordCodecTest, SingleRecordRoundTripAndGarbage) {
  const KeyRecord r = Valid();
  auto bytes = SerializeKeyRecord(r);
  ASSERT_TRUE(bytes.ok());
  auto back = ParseKeyRecord(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->key_id, "k");
  ASSERT_EQ(back->versions.size(), 2u);
  EXPECT_TRUE(SecretEquals(back->versions[1].secret, r.versions[1].secret));

  EXPECT_TRUE(absl::IsDataLoss(ParseKeyRecord(Bytes("\xff\xff\xff")).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseKeyRecord({}).status()));  // empty = invalid record
}

TEST_F(RecordCodecTest, EnvelopeBindsKekKindAndContext) {
  const SecretBytes kek = Random(32);
  const std::string plain = "plaintext";
  auto blob = SealEnvelope(kek, EnvelopeKind::kKeyRecord, Bytes("row-1"), Bytes(plain));
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->size(), kEnvelopeHeaderSize + plain.size() + kEnvelopeTagSize);
  auto opened = OpenEnvelope(kek, EnvelopeKind::kKeyRecord, Bytes("row-1"), *blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(std::string(opened->begin(), opened->end()), plain);

  EXPECT_TRUE(absl::IsDataLoss(
      OpenEnvelope(kek, EnvelopeKind::kKeyRecord, Bytes("row-2"), *blob).status()));
  EXPECT_TRUE(absl::IsDataLoss(
      OpenEnvelope(kek, EnvelopeKind::kKeyStoreContents, Bytes("row-1"), *blob).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      OpenEnvelope(Random(32), EnvelopeKind::kKeyRecord, Bytes("row-1"), *blob).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      OpenEnvelope(Random(31), EnvelopeKind::kKeyRecord, Bytes("row-1"), *blob).status()));
  std::vector<uint8_t> future = *blob;
  future[4] = 2;
  EXPECT_THAT(std::string(OpenEnvelope(kek, EnvelopeKind::kKeyRecord, Bytes("row-1"), future)
                              .status()
                              .message()),
              HasSubstr("format version 2"));

  // Two seals of the same plaintext differ (random nonce).
  auto again = SealEnvelope(kek, EnvelopeKind::kKeyRecord, Bytes("row-1"), Bytes(plain));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *blob);
  EXPECT_EQ(KekIdHex(kek).size(), 16u);
}

}  // namespace
}  // namespace offload::keys
