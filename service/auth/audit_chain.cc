#include "service/auth/audit_chain.h"

#include <sodium.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace offload::auth {
namespace {

constexpr absl::string_view kMacMember = ",\"mac\":\"";
constexpr size_t kMacHexSize = 2 * crypto_auth_hmacsha256_BYTES;

// hex(HMAC-SHA256(key, previous_mac "\n" body)).
std::string Mac(absl::string_view key, absl::string_view previous_mac, absl::string_view body) {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(key.data()),
                              key.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(previous_mac.data()),
                                previous_mac.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>("\n"), 1);
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(body.data()),
                                body.size());
  unsigned char mac[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_final(&state, mac);
  sodium_memzero(&state, sizeof state);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), sizeof mac));
}

// Splits a sealed line into the text that was sealed and its mac; false if it carries none.
bool Split(absl::string_view line, std::string* body, absl::string_view* mac) {
  const size_t at = line.rfind(kMacMember);
  if (at == absl::string_view::npos || line.size() != at + kMacMember.size() + kMacHexSize + 2 ||
      line.substr(line.size() - 2) != "\"}") {
    return false;
  }
  *mac = line.substr(at + kMacMember.size(), kMacHexSize);
  *body = absl::StrCat(line.substr(0, at), "}");
  return true;
}

}  // namespace

absl::StatusOr<KeyBytes> ReadAuditKey(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("audit_chain_key_file: cannot read ", path));
  }
  KeyBytes key(4096);
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got < 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "audit_chain_key_file: ", path, " holds ", got, " bytes; expected at least 32 "
        "(e.g. head -c 32 /dev/urandom > ", path, ")"));
  }
  return KeyBytes(key.begin(), key.begin() + static_cast<ptrdiff_t>(got));  // `key` is wiped
}

void AuditChain::Resume(absl::string_view line) {
  std::string body;
  absl::string_view mac;
  previous_mac_ = Split(line, &body, &mac) ? std::string(mac) : std::string();
}

std::string AuditChain::Seal(absl::string_view json) {
  previous_mac_ = Mac(absl::string_view(reinterpret_cast<const char*>(key_.data()), key_.size()),
                      previous_mac_, json);
  absl::string_view open = json;
  if (!open.empty() && open.back() == '}') open.remove_suffix(1);
  return absl::StrCat(open, kMacMember, previous_mac_, "\"}");
}

AuditCheck VerifyAuditChain(absl::string_view text, absl::string_view key) {
  AuditCheck check;
  std::string previous;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++check.lines;
    std::string body;
    absl::string_view mac;
    if (!Split(line, &body, &mac)) {
      check.first_broken = check.lines;
      check.reason = "carries no mac";
      return check;
    }
    const std::string want = Mac(key, previous, body);
    if (sodium_memcmp(want.data(), mac.data(), kMacHexSize) != 0) {
      check.first_broken = check.lines;
      check.reason = "its mac does not match: the line was edited, or a line before it was "
                     "removed, inserted or moved";
      return check;
    }
    previous = std::string(mac);
  }
  return check;
}

std::string MacOf(absl::string_view line) {
  std::string body;
  absl::string_view mac;
  return Split(line, &body, &mac) ? std::string(mac) : std::string();
}

namespace {

// One file of a trail, read: each line's mac, and what its first line names.
struct TrailFile {
  const AuditFileText* file;
  std::vector<std::string> macs;  // line i (0-based) -> its mac
  std::string previous_file_mac;  // named by the first line; empty if none
};

// A checkpoint line: {"event":"audit_checkpoint","file":...,"first_mac":...,"lines":N,
// "mac":...} (the server log adds "ts" and "level").
struct Checkpoint {
  std::string ts, file, first_mac, mac;
  uint64_t lines = 0;
  std::string Describe() const {
    return absl::StrCat("the checkpoint of ", ts.empty() ? "(no time)" : ts, " (", file, ": ",
                        lines, " lines, the last with mac ", mac.substr(0, 16), "...)");
  }
};

std::vector<Checkpoint> ReadCheckpoints(absl::string_view text, size_t* malformed) {
  std::vector<Checkpoint> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.find("audit_checkpoint") == absl::string_view::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                             /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("event") || !j["event"].is_string() ||
        j["event"].get<std::string>() != "audit_checkpoint") {
      continue;
    }
    const auto str = [&j](const char* name) {
      return j.contains(name) && j[name].is_string() ? j[name].get<std::string>() : std::string();
    };
    Checkpoint c;
    c.ts = str("ts");
    c.file = str("file");
    c.first_mac = str("first_mac");
    c.mac = str("mac");
    if (c.first_mac.empty() || c.mac.empty() || !j.contains("lines") ||
        !j["lines"].is_number_unsigned()) {
      ++*malformed;
      continue;
    }
    c.lines = j["lines"].get<uint64_t>();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

AuditTrailCheck VerifyAuditTrail(const std::vector<AuditFileText>& files, absl::string_view key,
                                 std::optional<absl::string_view> checkpoints) {
  AuditTrailCheck out;
  const auto broken = [&out](std::string why) {
    out.ok = false;
    out.message = absl::StrCat("broken: ", why);
    return out;
  };
  std::vector<TrailFile> trail;
  for (const AuditFileText& f : files) {
    const AuditCheck check = VerifyAuditChain(f.text, key);
    out.lines += check.lines;
    if (check.first_broken != 0) {
      return broken(absl::StrCat("line ", check.first_broken, " of ", f.name, ": ", check.reason));
    }
    TrailFile t{&f, {}, {}};
    bool first = true;
    for (absl::string_view line : absl::StrSplit(f.text, '\n', absl::SkipEmpty())) {
      t.macs.push_back(MacOf(line));
      if (first) {
        first = false;
        nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
        if (j.is_object() && j.contains("previous_file_mac") && j["previous_file_mac"].is_string()) {
          t.previous_file_mac = j["previous_file_mac"].get<std::string>();
        }
      }
    }
    trail.push_back(std::move(t));
  }
  // Files in a row: a file that names the previous file's last mac follows it.
  for (size_t i = 1; i < trail.size(); ++i) {
    const TrailFile& before = trail[i - 1];
    const TrailFile& after = trail[i];
    if (after.previous_file_mac.empty()) continue;
    const std::string last = before.macs.empty() ? std::string() : before.macs.back();
    if (after.previous_file_mac != last) {
      return broken(absl::StrCat(
          after.file->name, " starts after a file whose last mac was ",
          after.previous_file_mac.substr(0, 16), "..., and ", before.file->name, " ends with ",
          last.empty() ? std::string("no line") : absl::StrCat(last.substr(0, 16), "..."),
          ": lines were cut from the end of ", before.file->name,
          ", or a file between them is missing"));
    }
  }
  std::string last_summary;
  if (checkpoints.has_value()) {
    size_t malformed = 0;
    const std::vector<Checkpoint> marks = ReadCheckpoints(*checkpoints, &malformed);
    if (marks.empty()) {
      return broken(absl::StrCat("no audit_checkpoint line in the checkpoints given",
                                 malformed > 0 ? absl::StrCat(" (", malformed, " malformed)") : ""));
    }
    for (size_t k = 0; k < marks.size(); ++k) {
      const Checkpoint& c = marks[k];
      const TrailFile* match = nullptr;
      for (const TrailFile& t : trail) {
        if (!t.macs.empty() && t.macs.front() == c.first_mac) match = &t;
      }
      if (match == nullptr) {
        if (k + 1 == marks.size()) {
          return broken(absl::StrCat(
              c.Describe(), ", the last one, names a file none of those given starts like: "
              "give every file it covers, oldest first, or the file was cut down to nothing"));
        }
        ++out.checkpoints_elsewhere;
        continue;
      }
      const std::string& name = match->file->name;
      if (match->macs.size() < c.lines) {
        return broken(absl::StrCat(name, " has ", match->macs.size(), " lines, but ",
                                   c.Describe(), " saw ", c.lines, ": lines were cut from its end"));
      }
      if (c.lines == 0 || match->macs[c.lines - 1] != c.mac) {
        return broken(absl::StrCat("line ", c.lines, " of ", name, " does not carry the mac of ",
                                   c.Describe(), ": lines were cut from its end and the chain "
                                   "went on from an earlier line"));
      }
      ++out.checkpoints_checked;
      last_summary = absl::StrCat(" (the last: ", c.ts, ", ", name, ", ", c.lines, " lines)");
    }
  }
  out.ok = true;
  out.message = absl::StrCat("ok: ", out.lines, " lines",
                             files.size() > 1 ? absl::StrCat(" in ", files.size(), " files") : "",
                             ", every mac checks");
  if (checkpoints.has_value()) {
    absl::StrAppend(&out.message, "; ", out.checkpoints_checked, " checkpoints found",
                    last_summary);
    if (out.checkpoints_elsewhere > 0) {
      absl::StrAppend(&out.message, "; ", out.checkpoints_elsewhere,
                      " earlier checkpoints name files not given");
    }
  }
  return out;
}

}  // namespace offload::auth
