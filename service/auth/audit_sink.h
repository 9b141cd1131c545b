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
// previous file's last mac (`previous_file_mac`) - the "audit_file_reopened" line, or, when that
// write failed, the "audit_log_recovered" line that is the new file's first. Lines are written
// without fsync: "written" means the kernel took them (write(2) returned their full length).
//
// Checkpoints (with a chain key): an "audit_checkpoint" line - the path, the mac of the file's
// first line (which names the file to `offloadctl audit verify --checkpoints`), its lines so
// far, its last mac - goes to the main log and, when `checkpoint_file` is set, is appended
// there: every `checkpoint_interval` when lines were written since the last one, before the
// sink moves to another file, and when it stops. Lines cut from the file's end up to the last
// checkpoint are then found (VerifyAuditTrail). A regular file's lines are counted when it is
// opened (one read of the file at start).
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

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/auth/audit_chain.h"
#include "service/common/secure_memory.h"

namespace offload::auth {

class AuditSink final {
 public:
  struct Options {
    std::string path;
    KeyBytes chain_key;  // at least 32 bytes, or empty: plain lines; moved into the chain
    // Checkpoints (see above; only with a chain key): zero interval: only on a change of file
    // and at the stop. `checkpoint_file`: empty: the main log only.
    absl::Duration checkpoint_interval = absl::ZeroDuration();
    std::string checkpoint_file;
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

  // Unavailable if `path` (or `checkpoint_file`) cannot be opened for appending.
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
  AuditSink(Options options, KeyBytes key);
  void Run();
  // Writer thread only, below.
  bool OpenPath();  // fd_ on the path; the chain resumed from a regular file's last line
  void CloseFd();
  bool WriteAll(const std::string& bytes);  // false: broken (cut back to good_size_)
  void WriteBatch(std::vector<Entry>& batch);
  void Check();  // the periodic look at the path; the probe while broken
  void MarkBroken(absl::string_view what, int error);
  std::string Sealed(std::string json);
  // Writes one sealed line that Check makes (reopened, recovered): counted in the file.
  bool WriteOwnLine(nlohmann::ordered_json line);
  // Counts `n` lines written into the current file; `first_mac`: the first one's mac.
  void Counted(uint64_t n, const std::string& first_mac);
  // An audit_checkpoint of the current file, unless nothing was written since the last one
  // (`always`: at the stop, whenever the file has lines).
  void WriteCheckpoint(bool always);

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
  // The previous file's last mac, for the first line of a new file that starts a new chain
  // (cleared once a line carrying it is written).
  std::string link_previous_;
  uint64_t file_lines_ = 0;       // lines in the current file (counted at open, then written)
  std::string file_first_mac_;    // the current file's first line's mac ("" if none yet)
  uint64_t checkpointed_lines_ = 0;  // file_lines_ at the last checkpoint of this file
  int checkpoint_fd_ = -1;
  bool checkpoint_failed_ = false;  // logged once per failure streak
  absl::Time broken_since_ = absl::InfinitePast();
  uint64_t lost_at_break_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_AUDIT_SINK_H_
