#include "service/auth/audit_sink.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "service/auth/audit_chain.h"

namespace offload::auth {
namespace {

const std::string kKey(32, 'k');

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "audit-sink-XXXXXX";
  return mkdtemp(pattern.data());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Waits (up to 10 s) until `sink` is healthy or not.
bool WaitHealthy(const AuditSink& sink, bool healthy) {
  for (int i = 0; i < 1000; ++i) {
    if (sink.healthy() == healthy) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// Points the symlink `link` at `target`, atomically (rename over it).
void Repoint(const std::string& link, const std::string& target) {
  const std::string tmp = link + ".new";
  unlink(tmp.c_str());
  ASSERT_EQ(symlink(target.c_str(), tmp.c_str()), 0);
  ASSERT_EQ(rename(tmp.c_str(), link.c_str()), 0);
}

std::unique_ptr<AuditSink> OpenSink(const std::string& path) {
  AuditSink::Options o;
  o.path = path;
  o.chain_key = kKey;
  o.check_interval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<AuditSink>> sink = AuditSink::Open(std::move(o));
  EXPECT_TRUE(sink.ok()) << sink.status();
  return sink.ok() ? *std::move(sink) : nullptr;
}

TEST(AuditSinkTest, WritesChainedLinesAndResumesAfterARestart) {
  const std::string path = TempDir() + "/audit.jsonl";
  for (int run = 0; run < 2; ++run) {
    std::unique_ptr<AuditSink> sink = OpenSink(path);
    ASSERT_NE(sink, nullptr);
    std::atomic<int> written{0};
    for (int i = 0; i < 100; ++i) {
      sink->Append(R"({"event":"e","i":)" + std::to_string(i) + "}",
                   [&written](bool ok) { written += ok ? 1 : 0; });
    }
    sink->Flush();
    EXPECT_EQ(written.load(), 100);
    EXPECT_EQ(sink->stats().lines_written, 100u);
  }
  const AuditCheck check = VerifyAuditChain(ReadAll(path), kKey);
  EXPECT_EQ(check.lines, 200u);
  EXPECT_EQ(check.first_broken, 0u) << check.reason;
}

TEST(AuditSinkTest, AnUnwritableFileFailsLinesUntilItIsWritableAgain) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  const std::string dir = TempDir();
  const std::string file = dir + "/real.jsonl", link = dir + "/audit.jsonl";
  std::ofstream(file).close();
  Repoint(link, file);
  std::unique_ptr<AuditSink> sink = OpenSink(link);
  ASSERT_NE(sink, nullptr);
  sink->Append(R"({"event":"before"})");
  sink->Flush();

  Repoint(link, "/dev/full");  // writes now fail with ENOSPC
  ASSERT_TRUE(WaitHealthy(*sink, false));
  bool heard = false, written = true;
  sink->Append(R"({"event":"lost"})", [&](bool ok) { heard = true, written = ok; });
  sink->Flush();
  EXPECT_TRUE(heard);
  EXPECT_FALSE(written);
  EXPECT_GE(sink->stats().write_failures, 1u);
  EXPECT_EQ(sink->stats().lines_lost, 1u);

  Repoint(link, file);
  ASSERT_TRUE(WaitHealthy(*sink, true));
  sink->Append(R"({"event":"after"})", [&](bool ok) { written = ok; });
  sink->Flush();
  EXPECT_TRUE(written);
  const std::string text = ReadAll(file);
  EXPECT_EQ(text.find("\"lost\""), std::string::npos) << text;
  EXPECT_NE(text.find(R"("event":"audit_log_recovered")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("lines_lost":1)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("event":"after")"), std::string::npos) << text;
  // The chain goes on across the gap.
  const AuditCheck check = VerifyAuditChain(text, kKey);
  EXPECT_EQ(check.first_broken, 0u) << check.reason << "\n" << text;
}

TEST(AuditSinkTest, ARotatedFileStartsANewChainNamingThePreviousMac) {
  const std::string dir = TempDir();
  const std::string path = dir + "/audit.jsonl", old = dir + "/audit.jsonl.1";
  std::unique_ptr<AuditSink> sink = OpenSink(path);
  ASSERT_NE(sink, nullptr);
  sink->Append(R"({"event":"one"})");
  sink->Flush();
  ASSERT_EQ(rename(path.c_str(), old.c_str()), 0);
  for (int i = 0; i < 1000; ++i) {  // the next check re-opens the path: a new file
    struct stat st;
    if (stat(path.c_str(), &st) == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  sink->Append(R"({"event":"two"})");
  sink->Flush();
  const std::string fresh = ReadAll(path);
  EXPECT_NE(fresh.find(R"("event":"audit_file_reopened")"), std::string::npos) << fresh;
  EXPECT_NE(fresh.find(R"("previous_file_mac":")"), std::string::npos) << fresh;
  EXPECT_EQ(VerifyAuditChain(fresh, kKey).first_broken, 0u);
  EXPECT_EQ(VerifyAuditChain(ReadAll(old), kKey).first_broken, 0u);
}

// Not a gate: what an Append costs the calling thread (a loop thread, for a memo hit).
TEST(AuditSinkTest, AppendCost) {
  const std::string path = TempDir() + "/audit.jsonl";
  std::unique_ptr<AuditSink> sink = OpenSink(path);
  ASSERT_NE(sink, nullptr);
  const std::string line =
      R"({"ts":"2024-01-01T00:00:00.000Z","event":"data_plane","transport":"grpc",)"
      R"("identity":"anonymous","identity_source":"none","peer":"ipv4:127.0.0.1:5555",)"
      R"("method":"/offload.v1.Ed25519Service/Sign","key_id":"k","version":1,"memo_hit":false,)"
      R"("code":"OK"})";
  constexpr int kLines = 50000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLines; ++i) sink->Append(line);
  const auto appended = std::chrono::steady_clock::now();
  sink->Flush();
  const auto flushed = std::chrono::steady_clock::now();
  std::printf("append: %.3f us/line on the caller; written (sealed, HMAC chain) after %.3f us/line\n",
              std::chrono::duration<double, std::micro>(appended - start).count() / kLines,
              std::chrono::duration<double, std::micro>(flushed - start).count() / kLines);
  EXPECT_EQ(sink->stats().lines_written + sink->stats().lines_lost, uint64_t{kLines});
}

}  // namespace
}  // namespace offload::auth
