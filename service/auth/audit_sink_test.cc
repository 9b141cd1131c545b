#include "service/auth/audit_sink.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
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

KeyBytes Key() { return KeyBytes(kKey.begin(), kKey.end()); }

std::unique_ptr<AuditSink> OpenSink(const std::string& path,
                                    const std::string& checkpoints = "",
                                    absl::Duration checkpoint_interval = absl::ZeroDuration()) {
  AuditSink::Options o;
  o.path = path;
  o.chain_key = Key();
  o.check_interval = absl::Milliseconds(20);
  o.checkpoint_file = checkpoints;
  o.checkpoint_interval = checkpoint_interval;
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

// Waits (up to 10 s) until `path` exists.
bool WaitExists(const std::string& path) {
  for (int i = 0; i < 1000; ++i) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

void Append(AuditSink& sink, int n, const std::string& tag) {
  for (int i = 0; i < n; ++i) sink.Append(R"({"event":")" + tag + R"(","i":)" + std::to_string(i) + "}");
  sink.Flush();
}

// `text` without its last `n` lines.
std::string CutLines(const std::string& text, int n) {
  size_t end = text.size();
  for (int i = 0; i <= n && end > 0; ++i) end = text.rfind('\n', end - 1);
  return text.substr(0, end == std::string::npos ? 0 : end + 1);
}

AuditTrailCheck Trail(const std::vector<std::pair<std::string, std::string>>& files,
                      std::optional<std::string> checkpoints) {
  std::vector<AuditFileText> texts;
  for (const auto& [name, text] : files) texts.push_back({name, text});
  return VerifyAuditTrail(texts, kKey,
                          checkpoints.has_value() ? std::optional<absl::string_view>(*checkpoints)
                                                  : std::nullopt);
}

// Issue 33: the last lines cut from an audit file are found by the checkpoints written apart.
TEST(AuditSinkTest, CheckpointsFindLinesCutFromTheEnd) {
  const std::string dir = TempDir();
  const std::string path = dir + "/audit.jsonl", marks = dir + "/checkpoints.jsonl";
  {
    std::unique_ptr<AuditSink> sink = OpenSink(path, marks);
    ASSERT_NE(sink, nullptr);
    Append(*sink, 33, "one");
  }  // the stop writes a checkpoint
  const std::string text = ReadAll(path);
  std::string cps = ReadAll(marks);
  EXPECT_NE(cps.find(R"("event":"audit_checkpoint")"), std::string::npos) << cps;
  EXPECT_NE(cps.find(R"("lines":33)"), std::string::npos) << cps;
  AuditTrailCheck check = Trail({{"audit.jsonl", text}}, cps);
  EXPECT_TRUE(check.ok) << check.message;
  EXPECT_EQ(check.checkpoints_checked, 1u);
  // The chain alone cannot tell; the checkpoint can.
  const std::string cut = CutLines(text, 3);
  EXPECT_EQ(VerifyAuditChain(cut, kKey).first_broken, 0u);
  check = Trail({{"audit.jsonl", cut}}, cps);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.message.find("has 30 lines"), std::string::npos) << check.message;

  // A restart counts the lines already there and goes on; cut, then resumed and written on: the
  // checkpoint's line no longer carries its mac.
  std::ofstream(path, std::ios::trunc) << cut;
  {
    std::unique_ptr<AuditSink> sink = OpenSink(path, marks);
    Append(*sink, 5, "two");
  }
  cps = ReadAll(marks);
  EXPECT_NE(cps.find(R"("lines":35)"), std::string::npos) << cps;
  check = Trail({{"audit.jsonl", ReadAll(path)}}, cps);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.message.find("line 33 of audit.jsonl does not carry"), std::string::npos)
      << check.message;
  // Only the checkpoints after the cut: fine (the cut is before them).
  check = Trail({{"audit.jsonl", ReadAll(path)}}, cps.substr(cps.find("\n") + 1));
  EXPECT_TRUE(check.ok) << check.message;
}

TEST(AuditSinkTest, CheckpointsAtTheirIntervalGoToTheFileAndTheLog) {
  const std::string dir = TempDir();
  const std::string path = dir + "/audit.jsonl", marks = dir + "/checkpoints.jsonl";
  std::unique_ptr<AuditSink> sink = OpenSink(path, marks, absl::Milliseconds(20));
  Append(*sink, 4, "a");
  bool seen = false;
  for (int i = 0; i < 1000 && !seen; ++i) {
    seen = ReadAll(marks).find(R"("lines":4)") != std::string::npos;
    if (!seen) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(seen) << ReadAll(marks);
  // Nothing written since: no new checkpoint.
  absl::SleepFor(absl::Milliseconds(100));
  const std::string before = ReadAll(marks);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ReadAll(marks), before);
  const AuditTrailCheck check = Trail({{"audit.jsonl", ReadAll(path)}}, ReadAll(marks));
  EXPECT_TRUE(check.ok) << check.message;
}

// Across a rotation: the file left gets its checkpoint, the new one names its last mac; a cut
// at the old file's end is found both ways.
TEST(AuditSinkTest, CheckpointsAcrossReopenedFiles) {
  const std::string dir = TempDir();
  const std::string path = dir + "/audit.jsonl", old = dir + "/audit.jsonl.1";
  const std::string marks = dir + "/checkpoints.jsonl";
  {
    std::unique_ptr<AuditSink> sink = OpenSink(path, marks);
    Append(*sink, 10, "first");
    ASSERT_EQ(rename(path.c_str(), old.c_str()), 0);
    ASSERT_TRUE(WaitExists(path));
    Append(*sink, 4, "second");
  }
  const std::string cps = ReadAll(marks);
  AuditTrailCheck check = Trail({{"old", ReadAll(old)}, {"new", ReadAll(path)}}, cps);
  EXPECT_TRUE(check.ok) << check.message;
  EXPECT_EQ(check.checkpoints_checked, 2u) << cps;
  const std::string cut = CutLines(ReadAll(old), 2);
  check = Trail({{"old", cut}, {"new", ReadAll(path)}}, cps);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.message.find("cut from"), std::string::npos) << check.message;
  check = Trail({{"old", cut}}, cps);  // the old file alone: its checkpoint tells
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.message.find("old has 8 lines"), std::string::npos) << check.message;
  check = Trail({{"old", cut}, {"new", ReadAll(path)}}, std::nullopt);
  EXPECT_FALSE(check.ok) << "previous_file_mac tells too";
  EXPECT_NE(check.message.find("cut from the end of old"), std::string::npos) << check.message;
  // The current file alone: its checkpoints check, the old file's are counted as elsewhere.
  check = Trail({{"new", ReadAll(path)}}, cps);
  EXPECT_TRUE(check.ok) << check.message;
  EXPECT_EQ(check.checkpoints_elsewhere, 1u);
  // The current file cut down to nothing: the last checkpoint names no file given.
  check = Trail({{"old", ReadAll(old)}, {"new", ""}}, cps);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.message.find("the last one"), std::string::npos) << check.message;
}

// Issue 33: a re-opened file whose first write failed starts, once writable, with a line that
// still names the previous file's last mac.
TEST(AuditSinkTest, AFailedReopenStillLinksTheNewFile) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  const std::string dir = TempDir();
  const std::string first = dir + "/first.jsonl", second = dir + "/second.jsonl";
  const std::string link = dir + "/audit.jsonl";
  std::ofstream(first).close();
  Repoint(link, first);
  std::unique_ptr<AuditSink> sink = OpenSink(link);
  Append(*sink, 3, "a");
  Repoint(link, "/dev/full");  // the re-opened line's write fails
  ASSERT_TRUE(WaitHealthy(*sink, false));
  std::ofstream(second).close();
  Repoint(link, second);  // a new, empty file: a new chain
  ASSERT_TRUE(WaitHealthy(*sink, true));
  Append(*sink, 2, "b");
  const std::string text = ReadAll(second);
  const std::string head = text.substr(0, text.find('\n'));
  EXPECT_NE(head.find(R"("event":"audit_log_recovered")"), std::string::npos) << head;
  const std::string first_text = ReadAll(first);
  std::string last_line = first_text.substr(CutLines(first_text, 1).size());
  last_line.pop_back();  // its newline
  const std::string last_of_first = MacOf(last_line);
  ASSERT_FALSE(last_of_first.empty());
  EXPECT_NE(head.find(R"("previous_file_mac":")" + last_of_first + "\""), std::string::npos)
      << head;
  const AuditTrailCheck check = Trail({{"first", ReadAll(first)}, {"second", text}}, std::nullopt);
  EXPECT_TRUE(check.ok) << check.message;
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
