// The engine's write batch: bytes in order, and secret bytes zeroed once the batch is done.
#include "service/httpd/internal/engine.h"

#include <string>

#include "gtest/gtest.h"

namespace offload::httpd::internal {
namespace {

std::string Joined(WriteBatch& batch) {
  std::string out;
  for (const iovec& v : batch.Iov()) out.append(static_cast<const char*>(v.iov_base), v.iov_len);
  return out;
}

TEST(WriteBatchTest, KeepsCopiedAndReferencedBytesInOrder) {
  WriteBatch batch;
  auto big = std::make_shared<const std::string>(600, 'B');
  batch.Copy("head", 4);
  batch.Ref(big->data(), big->size(), big);
  batch.Ref("tail", 4, nullptr);  // small: copied
  EXPECT_EQ(Joined(batch), "head" + *big + "tail");
  EXPECT_EQ(batch.size(), 608u);
  batch.Consume(6);
  EXPECT_EQ(Joined(batch), std::string(598, 'B') + "tail");
}

// A secret piece copied into the batch (a small answer's body) is zeroed when the batch is
// cleared after its write: the batch's buffer stays allocated for the next write, so the bytes
// the iovec pointed to are readable, and must be zeros.
TEST(WriteBatchTest, SecretCopiesAreZeroedWhenTheBatchIsCleared) {
  WriteBatch batch;
  batch.Copy("\x00\x00\x05\x00\x01", 5);
  const std::string secret(48, 'S');
  batch.Ref(secret.data(), secret.size(), nullptr, /*secret=*/true);
  for (int i = 0; i < 200; ++i) batch.Copy("frame-header", 12);  // grows the buffer past the secret
  const iovec first = batch.Iov().front();
  ASSERT_GE(first.iov_len, 53u);
  const std::string before(static_cast<const char*>(first.iov_base) + 5, 48);
  EXPECT_EQ(before, secret);
  batch.Clear();
  EXPECT_EQ(std::string(static_cast<const char*>(first.iov_base), 53), std::string(53, '\0'));

  // Not secret: left as it is (no cost for ordinary answers; the first byte is the emptied
  // string's terminator).
  batch.Copy("plain", 5);
  const iovec plain = batch.Iov().front();
  batch.Clear();
  EXPECT_EQ(std::string(static_cast<const char*>(plain.iov_base) + 1, 4), "lain");
}

}  // namespace
}  // namespace offload::httpd::internal
