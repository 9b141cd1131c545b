// A tamper-evident audit trail: each JSON line ends with "mac", an HMAC-SHA256 under a secret
// key of the previous line's mac and this line's text, so a line that is edited, removed,
// inserted or moved breaks the chain at that line. (Lines cut from the end of the file are not
// detected: keep a copy of the last mac elsewhere, e.g. in the main log, if that matters.)
//
//   AuditChain chain(key);                  // key: at least 32 bytes (ReadAuditKey)
//   chain.Resume(last_line_of_the_file);    // continue a file written before a restart
//   std::string line = chain.Seal(R"({"ts":"...","event":"key_create"})");
//   // -> {"ts":"...","event":"key_create","mac":"9f2c..."}
//   AuditCheck check = VerifyAuditChain(file_text, key);  // check.first_broken: 1-based, 0 if ok
//
// Thread-safety: AuditChain is not thread-safe (the authorizer seals under its audit mutex);
// the functions are.
#ifndef SERVICE_AUTH_AUDIT_CHAIN_H_
#define SERVICE_AUTH_AUDIT_CHAIN_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offload::auth {

// The key in `path`: its raw bytes, at least 32. InvalidArgument naming the file otherwise.
absl::StatusOr<std::string> ReadAuditKey(const std::string& path);

class AuditChain final {
 public:
  explicit AuditChain(std::string key) : key_(std::move(key)) {}
  ~AuditChain();

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
  std::string key_;
  std::string previous_mac_;  // hex; empty at the start of a chain
};

struct AuditCheck {
  size_t lines = 0;        // lines read
  size_t first_broken = 0;  // 1-based; 0 when every line checks
  std::string reason;      // why that line is broken
};

// Checks every line of `text` (an audit file's contents) against `key`, from a chain start.
AuditCheck VerifyAuditChain(absl::string_view text, absl::string_view key);

}  // namespace offload::auth

#endif  // SERVICE_AUTH_AUDIT_CHAIN_H_
