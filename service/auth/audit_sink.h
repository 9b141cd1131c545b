// The audit file's writer: lines appended from any thread (an event loop included) go into a
// bounded in-memory queue, and one writer thread seals them (AuditChain, when keyed) and writes
// each batch with one write(2) and its error checked. Nothing on the appending thread touches
// the file.
//
//   AuditSink::Options o;
//   o.path = "/var/log/offload/audit.jsonl";
//   o.chain_key = key;                     // empty: plain lines
//   OFFLOAD_ASSIGN_OR_RETURN(auto sink, AuditSink::Open(std::move(o)));
//   sink->Append(R"({"ts":"...","event":"key_create"})");            // fire and forget
//   sink->Append(line, [](bool written) { /* answer, or refuse */ });  // told once it is on disk
//
// A failed write (ENOSPC, EIO, EACCES, a path that is now a directory...) makes the sink
// unhealthy: the lines of that batch are not in the file (a partial write is cut back to the
// last whole line) and their `done` hears false; later lines are lost (counted, `done` false)
// until a probe succeeds. The probe runs once per `check_interval`: it re-opens the path and
// writes an "audit_log_recovered" line (how long it was broken, how many lines were lost);
// when that write succeeds the sink is healthy again. While healthy, the path is stat'ed at the
// same pace: a path that now names another file (rotation, a replaced symlink, a removed file)
// is re-opened, and a new, empty file starts with an "audit_file_reopened" line.
// The chain: a re-opened regular file continues from its own last line (the same file: the chain
// goes on unbroken across a gap), a new file starts a new chain whose first line names the
// previous file's last mac (`previous_file_mac`). Lines are written without fsync: "written"
// means the kernel took them (write(2) returned their full length).
//
// Thread-safety: every method may be called from any thread. The destructor writes what is
// queued, then stops the thread.
#ifndef SERVICE_AUTH_AUDIT_SINK_H_
#define SERVICE_AUTH_AUDIT_SINK_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/auth/audit_chain.h"

namespace offload::auth {

class AuditSink final {
 public:
  struct Options {
    std::string path;
    std::string chain_key;  // at least 32 bytes, or empty: plain lines
    // Lines waiting for the writer, at most; beyond, Append fails the line at once.
    size_t max_queued_lines = 65536;
    // How often the path is checked (re-opened when it changed) and, while broken, probed.
    absl::Duration check_interval = absl::Seconds(1);
  };
  struct Stats {
    uint64_t lines_written = 0;
    uint64_t write_failures = 0;  // failed write(2) or open(2) of the file, probes included
    uint64_t lines_lost = 0;      // appended and never written (their `done` heard false)
    bool healthy = true;
  };
  // Called once, on the writer thread (or at once, on the caller's, when the queue is full or
  // the sink is stopping): whether the line is in the file.
  using Done = std::function<void(bool written)>;

  // Unavailable if `path` cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<AuditSink>> Open(Options options);
  ~AuditSink();
  AuditSink(const AuditSink&) = delete;
  AuditSink& operator=(const AuditSink&) = delete;

  // Queues `json`, one JSON object on one line, without its newline. Never blocks on I/O.
  void Append(std::string json, Done done = nullptr);
  // Waits until every line appended before the call is written or lost.
  void Flush();
  // False from a failed write until a probe succeeds.
  bool healthy() const { return healthy_.load(std::memory_order_acquire); }
  Stats stats() const;

 private:
  struct Entry {
    std::string json;
    Done done;
  };
  explicit AuditSink(Options options);
  void Run();
  // Writer thread only, below.
  bool OpenPath();  // fd_ on the path; the chain resumed from a regular file's last line
  void CloseFd();
  bool WriteAll(const std::string& bytes);  // false: broken (cut back to good_size_)
  void WriteBatch(std::vector<Entry>& batch);
  void Check();  // the periodic look at the path; the probe while broken
  void MarkBroken(absl::string_view what, int error);
  std::string Sealed(std::string json);

  const Options options_;
  absl::Mutex mu_;
  std::vector<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // lines written or lost, in order
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> healthy_{true};
  std::atomic<uint64_t> lines_written_{0};
  std::atomic<uint64_t> write_failures_{0};
  std::atomic<uint64_t> lines_lost_{0};
  // The writer thread's own.
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  bool regular_ = false;
  off_t good_size_ = 0;  // the file's size after the last whole batch (regular files)
  std::unique_ptr<AuditChain> chain_;
  absl::Time broken_since_ = absl::InfinitePast();
  uint64_t lost_at_break_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_AUDIT_SINK_H_
