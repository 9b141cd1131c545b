#include "service/auth/audit_chain.h"

#include <sodium.h>

#include <fstream>
#include <utility>

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

absl::StatusOr<std::string> ReadAuditKey(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("audit_chain_key_file: cannot read ", path));
  std::string key(4096, '\0');
  in.read(key.data(), static_cast<std::streamsize>(key.size()));
  key.resize(static_cast<size_t>(in.gcount()));
  if (key.size() < 32) {
    sodium_memzero(key.data(), key.size());
    return absl::InvalidArgumentError(absl::StrCat(
        "audit_chain_key_file: ", path, " holds ", key.size(), " bytes; expected at least 32 "
        "(e.g. head -c 32 /dev/urandom > ", path, ")"));
  }
  return key;
}

AuditChain::~AuditChain() { sodium_memzero(key_.data(), key_.size()); }

void AuditChain::Resume(absl::string_view line) {
  std::string body;
  absl::string_view mac;
  previous_mac_ = Split(line, &body, &mac) ? std::string(mac) : std::string();
}

std::string AuditChain::Seal(absl::string_view json) {
  previous_mac_ = Mac(key_, previous_mac_, json);
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

}  // namespace offload::auth
