#include "service/auth/trusted_proxies.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace offload::auth {
namespace {

// An IPv4 or IPv6 literal: 4 or 16 bytes, or nullopt. IPv4-mapped IPv6 (::ffff:a.b.c.d) is
// read as the IPv4 address, as the kernel reports such peers.
std::optional<std::pair<bool, std::array<uint8_t, 16>>> ParseIp(absl::string_view text) {
  std::string s(absl::StripAsciiWhitespace(text));
  if (s.size() > 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  std::array<uint8_t, 16> bytes{};
  in_addr v4{};
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    std::memcpy(bytes.data(), &v4, 4);
    return std::make_pair(false, bytes);
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, s.c_str(), &v6) == 1) {
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(v6.s6_addr, kMapped, 12) == 0) {
      std::memcpy(bytes.data(), v6.s6_addr + 12, 4);
      return std::make_pair(false, bytes);
    }
    std::memcpy(bytes.data(), v6.s6_addr, 16);
    return std::make_pair(true, bytes);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<TrustedProxies> TrustedProxies::Parse(absl::string_view cidrs) {
  TrustedProxies out;
  for (absl::string_view entry : absl::StrSplit(cidrs, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t slash = entry.find('/');
    const auto ip = ParseIp(entry.substr(0, slash));
    if (!ip.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trusted_proxies: expected address/bits, got \"", entry, "\""));
    }
    Range r;
    r.v6 = ip->first;
    r.bytes = ip->second;
    const int max_bits = r.v6 ? 128 : 32;
    r.bits = max_bits;
    if (slash != absl::string_view::npos &&
        (!absl::SimpleAtoi(entry.substr(slash + 1), &r.bits) || r.bits < 0 || r.bits > max_bits)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trusted_proxies: expected a prefix of 0-", max_bits, " bits, got \"", entry, "\""));
    }
    out.ranges_.push_back(r);
  }
  return out;
}

bool TrustedProxies::Contains(absl::string_view address) const {
  const auto ip = ParseIp(address);
  if (!ip.has_value()) return false;
  for (const Range& r : ranges_) {
    if (r.v6 != ip->first) continue;
    int bits = r.bits;
    bool match = true;
    for (int i = 0; bits > 0 && match; ++i, bits -= 8) {
      const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
      match = (r.bytes[i] & mask) == (ip->second[i] & mask);
    }
    if (match) return true;
  }
  return false;
}

std::string TrustedProxies::ClientOf(absl::string_view peer_host,
                                     std::optional<absl::string_view> forwarded_for) const {
  if (ranges_.empty() || !forwarded_for.has_value() || !Contains(peer_host)) return "";
  std::vector<absl::string_view> hops = absl::StrSplit(*forwarded_for, ',');
  for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
    const absl::string_view hop = absl::StripAsciiWhitespace(*it);
    if (!ParseIp(hop).has_value()) return "";  // not an address: trust stops here
    if (!Contains(hop)) return std::string(hop);
  }
  return "";
}

}  // namespace offload::auth
