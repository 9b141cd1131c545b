// Proxies trusted to say who the client is: a list of address ranges (CIDRs). A request that
// arrives from one of them names its client in X-Forwarded-For (each proxy appends the address it
// saw); the client is the nearest address, right to left, that is not itself a trusted proxy.
// From any other peer the header is ignored: anyone can write it.
//
//   OFFLOAD_ASSIGN_OR_RETURN(TrustedProxies proxies,
//                            TrustedProxies::Parse("10.0.0.0/8, 127.0.0.1/32"));
//   proxies.ClientOf("10.1.2.3", "203.0.113.7, 10.1.2.3")  // "203.0.113.7"
//   proxies.ClientOf("192.0.2.9", "203.0.113.7")           // "" (not a trusted peer)
//
// Thread-safety: const after Parse; any thread.
#ifndef SERVICE_AUTH_TRUSTED_PROXIES_H_
#define SERVICE_AUTH_TRUSTED_PROXIES_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offload::auth {

class TrustedProxies final {
 public:
  // `cidrs`: comma-separated "address/bits" (a bare address is one host); empty: none trusted.
  // InvalidArgument names the entry that does not parse.
  static absl::StatusOr<TrustedProxies> Parse(absl::string_view cidrs);

  bool empty() const { return ranges_.empty(); }
  // Whether `address` (an IPv4 or IPv6 literal, without port or brackets) is in a range.
  bool Contains(absl::string_view address) const;
  // The forwarded client of a request from `peer_host` with X-Forwarded-For `forwarded_for`:
  // empty when the peer is not trusted, the header is missing, or names only trusted proxies or
  // something that is not an address.
  std::string ClientOf(absl::string_view peer_host,
                       std::optional<absl::string_view> forwarded_for) const;

 private:
  struct Range {
    bool v6 = false;
    std::array<uint8_t, 16> bytes{};
    int bits = 0;
  };
  std::vector<Range> ranges_;
};

}  // namespace offload::auth

#endif  // SERVICE_AUTH_TRUSTED_PROXIES_H_
