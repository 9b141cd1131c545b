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

// The number of lines in the first `size` bytes of `fd` (a last line without its newline
// counts), and its first line (at most kTailBytes of it).
uint64_t CountLines(int fd, off_t size, std::string* first_line) {
  uint64_t lines = 0;
  bool first_done = false;
  char last = '\n';
  std::string chunk(1 << 16, '\0');
  for (off_t at = 0; at < size;) {
    const ssize_t n = pread(fd, chunk.data(), std::min<off_t>(chunk.size(), size - at), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const absl::string_view got(chunk.data(), static_cast<size_t>(n));
    lines += static_cast<uint64_t>(std::count(got.begin(), got.end(), '\n'));
    if (!first_done) {
      const size_t nl = got.find('\n');
      const absl::string_view head = got.substr(0, nl);
      first_line->append(head.data(), head.size());
      first_done = nl != absl::string_view::npos || first_line->size() >= size_t{kTailBytes};
    }
    last = got.back();
    at += n;
  }
  return lines + (size > 0 && last != '\n' ? 1 : 0);
}

}  // namespace

AuditSink::AuditSink(Options options, KeyBytes key) : options_(std::move(options)) {
  if (!key.empty()) chain_ = std::make_unique<AuditChain>(std::move(key));
}

absl::StatusOr<std::unique_ptr<AuditSink>> AuditSink::Open(Options options) {
  // The key goes into the chain alone (locked memory, wiped when freed): no copy stays in the
  // options.
  KeyBytes key = std::move(options.chain_key);
  options.chain_key.clear();
  std::unique_ptr<AuditSink> sink(new AuditSink(std::move(options), std::move(key)));
  if (!sink->OpenPath()) {
    return absl::UnavailableError(absl::StrCat("audit_file: cannot open ", sink->options_.path,
                                               " for appending: ", std::strerror(errno)));
  }
  if (!sink->options_.checkpoint_file.empty()) {
    sink->checkpoint_fd_ = open(sink->options_.checkpoint_file.c_str(),
                                O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (sink->checkpoint_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("audit_checkpoint_file: cannot open ",
                                                 sink->options_.checkpoint_file,
                                                 " for appending: ", std::strerror(errno)));
    }
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
  if (checkpoint_fd_ >= 0) close(checkpoint_fd_);
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
  const bool periodic = chain_ != nullptr && options_.checkpoint_interval > absl::ZeroDuration();
  absl::Time next_checkpoint =
      periodic ? absl::Now() + options_.checkpoint_interval : absl::InfiniteFuture();
  std::vector<Entry> batch;
  for (;;) {
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&Ready::Check, this),
                            std::min(next_check, next_checkpoint));
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
    if (absl::Now() >= next_checkpoint) {
      WriteCheckpoint(/*always=*/false);
      next_checkpoint = absl::Now() + options_.checkpoint_interval;
    }
    if (stopping) {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) {
        WriteCheckpoint(/*always=*/true);
        return;
      }
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
  const bool same_file = fd_ < 0 && st.st_dev == dev_ && st.st_ino == ino_ && dev_ != 0 &&
                         regular_ && S_ISREG(st.st_mode) && st.st_size == good_size_;
  fd_ = fd;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  regular_ = S_ISREG(st.st_mode);
  good_size_ = regular_ ? st.st_size : 0;
  if (chain_ == nullptr) return true;
  if (!same_file) {
    // Lines and first mac of what is now the file (a probe re-opening the file it had, unchanged,
    // keeps its count: no second read).
    std::string first;
    file_lines_ = regular_ && readable ? CountLines(fd_, st.st_size, &first) : 0;
    file_first_mac_ = MacOf(first);
    checkpointed_lines_ = file_lines_;
  }
  if (regular_ && readable) {
    // A regular file carries its own chain: go on from its last line (none: a new chain, whose
    // first line names the chain it follows). Anything else (a pipe, a device) goes on from the
    // chain in memory.
    const std::string before = chain_->previous_mac();
    chain_->Resume(LastLine(fd_, st.st_size));
    if (chain_->previous_mac().empty() && !before.empty()) link_previous_ = before;
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

void AuditSink::Counted(uint64_t n, const std::string& first_mac) {
  if (file_lines_ == 0) file_first_mac_ = first_mac;
  file_lines_ += n;
}

bool AuditSink::WriteOwnLine(nlohmann::ordered_json line) {
  const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
  const bool links = chain_ != nullptr && !link_previous_.empty() && previous.empty();
  if (links && !line.contains("previous_file_mac")) line["previous_file_mac"] = link_previous_;
  const std::string text = Sealed(line.dump()) + "\n";
  if (!WriteAll(text)) {
    if (chain_ != nullptr) chain_->Restore(previous);
    return false;
  }
  lines_written_.fetch_add(1, std::memory_order_relaxed);
  if (chain_ != nullptr) {
    Counted(1, chain_->previous_mac());
    if (links) link_previous_.clear();
  }
  return true;
}

void AuditSink::WriteCheckpoint(bool always) {
  if (chain_ == nullptr || file_lines_ == 0) return;
  if (!always && file_lines_ == checkpointed_lines_) return;
  checkpointed_lines_ = file_lines_;
  Log(LogLevel::kInfo, "audit_checkpoint",
      {{"file", options_.path},
       {"first_mac", file_first_mac_},
       {"lines", file_lines_},
       {"mac", chain_->previous_mac()}});
  if (checkpoint_fd_ < 0) return;
  const nlohmann::ordered_json line = {{"ts", Iso8601(absl::Now())},
                                       {"event", "audit_checkpoint"},
                                       {"file", options_.path},
                                       {"first_mac", file_first_mac_},
                                       {"lines", file_lines_},
                                       {"mac", chain_->previous_mac()}};
  const std::string text = line.dump() + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(checkpoint_fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done == text.size()) {
    checkpoint_failed_ = false;
  } else if (!checkpoint_failed_) {
    checkpoint_failed_ = true;  // the main log still has every checkpoint
    Log(LogLevel::kError, "audit_checkpoint_unwritable",
        {{"path", options_.checkpoint_file}, {"error", std::strerror(errno)}});
  }
}

void AuditSink::WriteBatch(std::vector<Entry>& batch) {
  bool written = false;
  if (healthy() && fd_ >= 0) {
    const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
    std::string bytes;
    std::string first_mac;
    for (Entry& e : batch) {
      bytes += Sealed(std::move(e.json));
      bytes += '\n';
      if (first_mac.empty() && chain_ != nullptr) first_mac = chain_->previous_mac();
    }
    written = WriteAll(bytes);
    if (!written && chain_ != nullptr) chain_->Restore(previous);
    if (written) Counted(batch.size(), first_mac);
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
    WriteCheckpoint(/*always=*/false);  // the file being left, as far as it was written
    const std::string previous = chain_ != nullptr ? chain_->previous_mac() : std::string();
    CloseFd();
    if (!OpenPath()) return MarkBroken("open", errno);
    nlohmann::ordered_json line = {{"ts", Iso8601(absl::Now())},
                                   {"event", "audit_file_reopened"},
                                   {"path", options_.path}};
    if (chain_ != nullptr) line["previous_file_mac"] = previous;
    if (!WriteOwnLine(std::move(line))) return;  // a new chain's line names the previous mac
    Log(LogLevel::kInfo, "audit_file_reopened", {{"path", options_.path}});
    return;
  }
  // Broken: the probe. Re-open the path and write the recovery line; written, we are back. A
  // new file's first line (this one, when the re-opened line could not be written) names the
  // previous file's last mac.
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
  if (!WriteOwnLine(std::move(line))) return;
  healthy_.store(true, std::memory_order_release);
  Log(LogLevel::kInfo, "audit_log_recovered",
      {{"path", options_.path},
       {"unwritable_seconds", absl::ToDoubleSeconds(absl::Now() - broken_since_)},
       {"lines_lost", lost}});
}

}  // namespace offload::auth
