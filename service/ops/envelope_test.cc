#include "service/ops/envelope.h"

#include <vector>

#include "gtest/gtest.h"

namespace offload::ops {
namespace {

TEST(EnvelopeTest, HeaderRoundTrip) {
  std::vector<uint8_t> nonce(24);
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(i + 1);
  std::vector<uint8_t> envelope(EnvelopeSize(24, 10));
  WriteEnvelopeHeader(0x01020304, nonce, absl::MakeSpan(envelope));
  auto view = ParseEnvelope(envelope, 24);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->key_version, 0x01020304u);
  EXPECT_EQ(std::vector<uint8_t>(view->nonce.begin(), view->nonce.end()), nonce);
  EXPECT_EQ(view->ciphertext_and_tag.size(), 10u + kEnvelopeTagSize);
  EXPECT_EQ(view->plaintext_size(), 10u);
  // The view points into the caller's bytes: nothing was copied.
  EXPECT_EQ(view->ciphertext_and_tag.data(), envelope.data() + 5 + 24);
}

TEST(EnvelopeTest, ShortestValidEnvelopeHasEmptyPlaintext) {
  std::vector<uint8_t> envelope(5 + 12 + 16, 0);
  envelope[0] = 1;
  auto view = ParseEnvelope(envelope, 12);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->plaintext_size(), 0u);
}

TEST(EnvelopeTest, RejectsEveryShortLength) {
  for (size_t n = 0; n < 5 + 12 + 16; ++n) {
    std::vector<uint8_t> envelope(n, 1);
    auto view = ParseEnvelope(envelope, 12);
    ASSERT_FALSE(view.ok()) << n;
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(view.status().message().find("envelope: expected at least 33 bytes"),
              absl::string_view::npos)
        << view.status();
  }
}

TEST(EnvelopeTest, RejectsUnknownFormatVersionOfAnySize) {
  for (size_t n : {33u, 4096u, 4u << 20}) {
    std::vector<uint8_t> envelope(n, 0);
    envelope[0] = 2;
    auto view = ParseEnvelope(envelope, 12);
    ASSERT_FALSE(view.ok());
    EXPECT_NE(view.status().message().find("unknown format version 2"), absl::string_view::npos);
  }
}

// [aead.proto] What an envelope shows alone, before any key is known: the shortest length of any
// algorithm, the format version.
TEST(EnvelopeTest, ShapeIsCheckedWithoutTheKey) {
  for (size_t n = 0; n < kEnvelopeMinSize; ++n) {
    const absl::Status s = CheckEnvelopeShape(std::vector<uint8_t>(n, 1));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(s.message().find("envelope: expected at least 33 bytes, got"),
              absl::string_view::npos)
        << s;
  }
  std::vector<uint8_t> envelope(kEnvelopeMinSize, 0);
  envelope[0] = 1;
  EXPECT_TRUE(CheckEnvelopeShape(envelope).ok());  // key version 0: the key's lookup first
  envelope[0] = 2;
  EXPECT_NE(CheckEnvelopeShape(envelope).message().find("unknown format version 2"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace offload::ops
