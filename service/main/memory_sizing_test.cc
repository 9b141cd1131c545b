#include "service/main/memory_sizing.h"

#include <cstdio>
#include <unistd.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace offload {
namespace {

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/memory_max_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(MemorySizingTest, ReadsCgroupLimits) {
  EXPECT_EQ(*ReadMemoryLimit(WriteTemp("1073741824\n")), 1073741824);
  EXPECT_EQ(*ReadMemoryLimit(WriteTemp("max\n")), std::nullopt);
  EXPECT_EQ(*ReadMemoryLimit(WriteTemp("9223372036854771712\n")), std::nullopt);  // cgroup v1
  EXPECT_EQ(*ReadMemoryLimit("/nonexistent/memory.max"), std::nullopt);
  EXPECT_EQ(*ReadMemoryLimit(""), std::nullopt);
  EXPECT_EQ(ReadMemoryLimit(WriteTemp("lots")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadMemoryLimit(WriteTemp("-5")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemorySizingTest, OneGibibytePodGetsTheStatedFractions) {
  ServerConfig config;
  const nlohmann::json chosen = SizeToMemoryLimit(int64_t{1} << 30, {}, &config);
  EXPECT_EQ(config.http_memory_budget_bytes, 128 << 20);
  EXPECT_EQ(config.grpc_memory_budget_bytes, 128 << 20);
  EXPECT_EQ(config.memo_open_bytes_total, 256 << 20);
  EXPECT_EQ(config.memo_verify_bytes, 32 << 20);
  EXPECT_EQ(config.memo_derive_bytes, 16 << 20);
  EXPECT_EQ(config.memo_open_bytes_per_key, 8 << 20);
  EXPECT_EQ(config.max_queued_bytes, 64 << 20);
  EXPECT_EQ(chosen["max_queued_bytes"], 64 << 20);
  EXPECT_EQ(chosen["limit_bytes"], int64_t{1} << 30);
  EXPECT_EQ(chosen["http_memory_budget_bytes"], 128 << 20);
  EXPECT_TRUE(chosen["given_by_flags"].empty());
  // Together they leave the process over 39% of the limit.
  const int64_t bounds = config.http_memory_budget_bytes + config.grpc_memory_budget_bytes +
                         config.memo_open_bytes_total + config.memo_verify_bytes +
                         config.memo_derive_bytes + config.max_queued_bytes;
  EXPECT_LE(bounds, (int64_t{1} << 30) * 39 / 64);
}

TEST(MemorySizingTest, SmallLimitsShrinkEverythingLargeOnesRaiseNothing) {
  ServerConfig small;
  SizeToMemoryLimit(int64_t{16} << 20, {}, &small);
  EXPECT_EQ(small.http_memory_budget_bytes, 2 << 20);
  EXPECT_EQ(small.memo_open_bytes_total, 4 << 20);
  EXPECT_EQ(small.memo_open_bytes_per_key, 4 << 20);  // at most the total
  EXPECT_EQ(small.memo_verify_bytes, 512 << 10);
  EXPECT_EQ(small.max_queued_bytes, small.max_message_bytes);  // L/16 is 1 MiB: one message
  ServerConfig large;
  SizeToMemoryLimit(int64_t{64} << 30, {}, &large);
  const ServerConfig defaults;
  EXPECT_EQ(large.http_memory_budget_bytes, defaults.http_memory_budget_bytes);
  EXPECT_EQ(large.memo_open_bytes_total, defaults.memo_open_bytes_total);
  EXPECT_EQ(large.memo_verify_bytes, defaults.memo_verify_bytes);
  EXPECT_EQ(large.max_queued_bytes, defaults.max_queued_bytes);
}

TEST(MemorySizingTest, BoundsGivenByFlagsAreKept) {
  ServerConfig config;
  config.memo_verify_bytes = 12345;
  config.http_memory_budget_bytes = 999 << 20;
  MemorySizing::Given given;
  given.memo_verify_bytes = true;
  given.http_memory_budget_bytes = true;
  const nlohmann::json chosen = SizeToMemoryLimit(int64_t{512} << 20, given, &config);
  EXPECT_EQ(config.memo_verify_bytes, 12345);
  EXPECT_EQ(config.http_memory_budget_bytes, 999 << 20);
  EXPECT_EQ(config.grpc_memory_budget_bytes, 999 << 20);  // the HTTP port's, as without sizing
  EXPECT_EQ(config.memo_open_bytes_total, 128 << 20);
  EXPECT_EQ(chosen["given_by_flags"],
            nlohmann::json({"http_memory_budget_bytes", "memo_verify_bytes"}));
}

}  // namespace
}  // namespace offload
