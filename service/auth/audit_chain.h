// A tamper-evident audit trail: each JSON line ends with "mac", an HMAC-SHA256 under a secret
// key of the previous line's mac and this line's text, so a line that is edited, removed,
// inserted or moved breaks the chain at that line. Lines cut from the end of a file break no
// mac: checkpoints kept apart from the file (AuditSink's "audit_checkpoint" lines: the file's
// first mac, its lines so far and its last mac, in the server log or a file of their own) find
// them, up to the last checkpoint (VerifyAuditTrail).
//
//   AuditChain chain(key);                  // key: at least 32 bytes (ReadAuditKey)
//   chain.Resume(last_line_of_the_file);    // continue a file written before a restart
//   std::string line = chain.Seal(R"({"ts":"...","event":"key_create"})");
//   // -> {"ts":"...","event":"key_create","mac":"9f2c..."}
//   AuditCheck check = VerifyAuditChain(file_text, key);  // check.first_broken: 1-based, 0 if ok
//   AuditTrailCheck trail = VerifyAuditTrail({{"audit.jsonl.1", old}, {"audit.jsonl", now}},
//                                            key, checkpoints_text);
//
// Thread-safety: AuditChain is not thread-safe (one writer thread seals); the functions are.
#ifndef SERVICE_AUTH_AUDIT_CHAIN_H_
#define SERVICE_AUTH_AUDIT_CHAIN_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/common/secure_memory.h"

namespace offload::auth {

// The key in `path`: its raw bytes, at least 32, read straight into locked memory (no stdio
// buffer keeps a copy). InvalidArgument naming the file otherwise.
absl::StatusOr<KeyBytes> ReadAuditKey(const std::string& path);

class AuditChain final {
 public:
  explicit AuditChain(KeyBytes key) : key_(std::move(key)) {}
  explicit AuditChain(absl::string_view key) : key_(key.begin(), key.end()) {}

  // Continues after `line` (the last line already in the file); a line without a mac starts a
  // new chain (as an empty file does).
  void Resume(absl::string_view line);
  // `json`, a JSON object on one line, with its mac added as the last member.
  std::string Seal(absl::string_view json);
  // The mac of the last line sealed or resumed from (hex; empty at the start of a chain), and
  // a return to it (a writer that could not write what it sealed since).
  const std::string& previous_mac() const { return previous_mac_; }
  void Restore(std::string previous_mac) { previous_mac_ = std::move(previous_mac); }

 private:
  const KeyBytes key_;         // locked memory, wiped when freed
  std::string previous_mac_;  // hex; empty at the start of a chain
};

// The mac a sealed `line` carries (hex); empty if it carries none.
std::string MacOf(absl::string_view line);

struct AuditCheck {
  size_t lines = 0;        // lines read
  size_t first_broken = 0;  // 1-based; 0 when every line checks
  std::string reason;      // why that line is broken
};

// Checks every line of `text` (an audit file's contents) against `key`, from a chain start.
AuditCheck VerifyAuditChain(absl::string_view text, absl::string_view key);

struct AuditFileText {
  std::string name;  // for messages
  std::string text;
};
struct AuditTrailCheck {
  bool ok = false;
  std::string message;              // "ok: ..." or "broken: ...", one line
  size_t lines = 0;                 // lines read in all files
  size_t checkpoints_checked = 0;   // checkpoints that named one of the files, all found
  size_t checkpoints_elsewhere = 0;  // checkpoints naming a file not given (earlier ones only)
};

// Checks an audit trail: `files`, the files of one audit log oldest first (a rotation's, or the
// files the server re-opened); each one's chain (VerifyAuditChain); a file whose first line
// names `previous_file_mac` must follow the file given before it (that mac is its last line's:
// else that file lost lines from its end, or a file between them is missing); and with
// `checkpoints` (JSON lines; only `"event":"audit_checkpoint"` ones are read, so a server log
// will do), every checkpoint naming one of the files (by its first line's mac) must find its
// mac at its line, and the last checkpoint must name one of them (else the file it covers was
// not given, or was cut down to nothing).
AuditTrailCheck VerifyAuditTrail(const std::vector<AuditFileText>& files, absl::string_view key,
                                 std::optional<absl::string_view> checkpoints);

}  // namespace offload::auth

#endif  // SERVICE_AUTH_AUDIT_CHAIN_H_
