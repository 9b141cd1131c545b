#include "service/common/secret_bytes.h"

#include <string>

#include "gtest/gtest.h"

namespace offload {
namespace {

TEST(SecretStrings, WipeStringZeroesInPlaceAndKeepsTheSize) {
  std::string s(40, 'k');
  const char* at = s.data();
  WipeString(&s);
  EXPECT_EQ(s, std::string(40, '\0'));
  EXPECT_EQ(s.data(), at);
  std::string empty;
  WipeString(&empty);  // nothing to do, no crash
  EXPECT_TRUE(empty.empty());
}

// Appends keep every byte, in order, across many growths (from empty, from a reserved buffer,
// by one byte and by more than double at once).
TEST(SecretStrings, AppendWipingKeepsTheBytesAcrossGrowth) {
  std::string s, expected;
  for (int i = 0; i < 300; ++i) {
    const std::string piece(static_cast<size_t>(i % 7 == 0 ? 3 * (i + 1) : 1),
                            static_cast<char>('a' + i % 26));
    AppendWiping(&s, piece.data(), piece.size());
    expected += piece;
    ASSERT_EQ(s, expected) << "after append " << i;
  }
  std::string reserved;
  reserved.reserve(64);
  const char* at = reserved.data();
  AppendWiping(&reserved, "0123456789", 10);
  EXPECT_EQ(reserved.data(), at);  // room enough: no new buffer
  EXPECT_EQ(reserved, "0123456789");
}

}  // namespace
}  // namespace offload
