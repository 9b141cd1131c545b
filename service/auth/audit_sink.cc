#include "service/auth/audit_sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "service/common/log.h"

namespace offload::auth {
namespace {

// How much of a file's end is read for its last line (a line is far shorter).
constexpr off_t kTailBytes = 1 << 20;

std::string Iso8601(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

// The last non-empty line of the first `size` bytes of `fd`; empty if none (or unreadable).
std::string LastLine(int fd, off_t size) {
  const off_t from = std::max<off_t>(0, size - kTailBytes);
  std::string tail(static_cast<size_t>(size - from), '\0');
  size_t got = 0;
  while (got < tail.size()) {
    const ssize_t n = pread(fd, tail.data() + got, tail.size() - got, from + off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  tail.resize(got);
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  const size_t at = tail.rfind('\n');
  return at == std::string::npos ? tail : tail.substr(at + 1);
}

}  // namespace

AuditSink::AuditSink(Options options) : options_(std::move(options)) {
  if (!options_.chain_key.empty()) chain_ = std::make_unique<AuditChain>(options_.chain_key);
}

absl::StatusOr<std::unique_ptr<AuditSink>> AuditSink::Open(Options options) {
  std::unique_ptr<AuditSink> sink(new AuditSink(std::move(options)));
  if (!sink->OpenPath()) {
    return absl::UnavailableError(absl::StrCat("audit_file: cannot open ", sink->options_.path,
                                               " for appending: ", std::strerror(errno)));
  }
  sink->thread_ = std::thread([s = sink.get()] { s->Run(); });
  return sink;
}

AuditSink::~AuditSink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  CloseFd();
}

void AuditSink::Append(std::string json, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && queue_.size() < options_.max_queued_lines) {
      queue_.push_back({std::move(json), std::move(done)});
      ++appended_;
      return;
    }
  }
  lines_lost_.fetch_add(1, std::memory_order_relaxed);
  if (done) done(false);
}

void AuditSink::Flush() {
  struct Wait {
    AuditSink* sink;
    uint64_t target;
    static bool Reached(Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return w->sink->finished_ >= w->target;
    }
  };
  absl::MutexLock lock(&mu_);
  Wait wait{this, appended_};
  mu_.Await(absl::Condition(&Wait::Reached, &wait));
}

AuditSink::Stats AuditSink::stats() const {
  return {lines_written_.load(std::memory_order_relaxed),
          write_failures_.load(std::memory_order_relaxed),
          lines_lost_.load(std::memory_order_relaxed), healthy()};
}

void AuditSink::Run() {
  struct Ready {
    static bool Check(AuditSink* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return !s->queue_.empty() || s->stop_;
    }
  };
  absl::Time next_check = absl::Now() + options_.check_interval;
  std::vector<Entry> batch;
  for (;;) {
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&Ready::Check, this), next_check);
      batch.swap(queue_);
      stopping = stop_;
    }
    if (absl::Now() >= next_check) {
      Check();
      next_check = absl::Now() + options_.check_interval;
    }
    if (!batch.empty()) {
      WriteBatch(batch);
      const size_t n = batch.size();
      batch.clear();
      absl::MutexLock lock(&mu_);
      finished_ += n;
    }
    if (stopping) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

bool AuditSink::OpenPath() {
  int fd = open(options_.path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  bool readable = true;
  if (fd < 0 && errno == EACCES) {
    fd = open(options_.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    readable = false;
  }
  if (fd < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return false;
  }
  fd_ = fd;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  regular_ = S_ISREG(st.st_mode);
  good_size_ = regular_ ? st.st_size : 0;
  if (chain_ != nullptr && regular_ && readable) {
    // A regular file carries its own chain: go on from its last line (none: a new chain).
    // Anything else (a pipe, a device) goes on from the chain in memory.
    chain_->Resume(LastLine(fd_, st.st_size));
  }
  return true;
}

void AuditSink::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool AuditSink::WriteAll(const std::string& bytes) {
  // Where this batch starts: the file's size now, not a count kept since it was opened (a
  // copytruncate rotation keeps the inode and empties the file).
  struct stat st;
  const off_t start = regular_ && fstat(fd_, &st) == 0 ? st.st_size : good_size_;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n == 0 ? EIO : errno;
      // No half line stays behind to break the chain: back to the last whole batch.
      if (done > 0 && regular_) (void)ftruncate(fd_, start);
      MarkBroken("write", error);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  good_size_ = start + static_cast<off_t>(bytes.size());
  return true;
}

std::string AuditSink::Sealed(std::string json) {
  return chain_ != nullptr ? chain_->Seal(json) : std::move(json);
}

void AuditSink::WriteBatch(std::vector<Entry>& batch) {
  bool written = false;
  if (healthy() && fd_ >= 0) {
    const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
    std::string bytes;
    for (Entry& e : batch) {
      bytes += Sealed(std::move(e.json));
      bytes += '\n';
    }
    written = WriteAll(bytes);
    if (!written && chain_ != nullptr) chain_->Restore(previous);
  }
  (written ? lines_written_ : lines_lost_).fetch_add(batch.size(), std::memory_order_relaxed);
  for (Entry& e : batch) {
    if (e.done) e.done(written);
  }
}

void AuditSink::MarkBroken(absl::string_view what, int error) {
  write_failures_.fetch_add(1, std::memory_order_relaxed);
  last_error_ = absl::StrCat(what, ": ", std::strerror(error));
  if (!healthy()) return;
  healthy_.store(false, std::memory_order_release);
  broken_since_ = absl::Now();
  lost_at_break_ = lines_lost_.load(std::memory_order_relaxed);
  Log(LogLevel::kError, "audit_log_unwritable",
      {{"path", options_.path},
       {"error", last_error_},
       {"probe", absl::StrCat("re-opened every ",
                              absl::FormatDuration(options_.check_interval))}});
}

void AuditSink::Check() {
  if (healthy()) {
    // Still the file the path names? (Rotated, removed, a replaced symlink: re-open.)
    struct stat st;
    if (fd_ >= 0 && stat(options_.path.c_str(), &st) == 0 && st.st_dev == dev_ &&
        st.st_ino == ino_) {
      return;
    }
    const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
    CloseFd();
    if (!OpenPath()) return MarkBroken("open", errno);
    nlohmann::ordered_json line = {{"ts", Iso8601(absl::Now())},
                                   {"event", "audit_file_reopened"},
                                   {"path", options_.path}};
    if (chain_ != nullptr) line["previous_file_mac"] = previous;
    if (!WriteAll(Sealed(line.dump()) + "\n")) {
      if (chain_ != nullptr) chain_->Restore(previous);
      return;
    }
    lines_written_.fetch_add(1, std::memory_order_relaxed);
    Log(LogLevel::kInfo, "audit_file_reopened", {{"path", options_.path}});
    return;
  }
  // Broken: the probe. Re-open the path and write the recovery line; written, we are back.
  const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
  CloseFd();
  if (!OpenPath()) {
    write_failures_.fetch_add(1, std::memory_order_relaxed);
    last_error_ = absl::StrCat("open: ", std::strerror(errno));
    return;
  }
  const uint64_t lost = lines_lost_.load(std::memory_order_relaxed) - lost_at_break_;
  nlohmann::ordered_json line = {{"ts", Iso8601(absl::Now())},
                                 {"event", "audit_log_recovered"},
                                 {"unwritable_since", Iso8601(broken_since_)},
                                 {"lines_lost", lost},
                                 {"error", last_error_}};
  const std::string text = Sealed(line.dump()) + "\n";
  if (!WriteAll(text)) {
    if (chain_ != nullptr) chain_->Restore(previous);
    return;
  }
  lines_written_.fetch_add(1, std::memory_order_relaxed);
  healthy_.store(true, std::memory_order_release);
  Log(LogLevel::kInfo, "audit_log_recovered",
      {{"path", options_.path},
       {"unwritable_seconds", absl::ToDoubleSeconds(absl::Now() - broken_since_)},
       {"lines_lost", lost}});
}

}  // namespace offload::auth
