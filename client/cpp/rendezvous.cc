#include "client/cpp/rendezvous.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

namespace offload::client {
namespace {

constexpr char kDomain[] = "offload-rendezvous-v1";

// True when endpoint `a` beats endpoint `b` (higher weight, then smaller string).
bool Beats(uint64_t wa, absl::string_view a, uint64_t wb, absl::string_view b) {
  return wa != wb ? wa > wb : a < b;
}

}  // namespace

uint64_t RendezvousWeight(absl::string_view key, absl::string_view endpoint) {
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, 8);
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(kDomain),
                            sizeof(kDomain));  // includes the terminating 0 as a separator
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  const unsigned char zero = 0;
  crypto_generichash_update(&state, &zero, 1);
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(endpoint.data()),
                            endpoint.size());
  unsigned char out[8];
  crypto_generichash_final(&state, out, sizeof(out));
  uint64_t w = 0;
  for (int i = 7; i >= 0; --i) w = (w << 8) | out[i];
  return w;
}

int PickEndpoint(absl::string_view key, const std::vector<std::string>& endpoints,
                 const std::vector<bool>& usable) {
  int best = -1;
  uint64_t best_weight = 0;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (!usable.empty() && !usable[i]) continue;
    const uint64_t w = RendezvousWeight(key, endpoints[i]);
    if (best < 0 || Beats(w, endpoints[i], best_weight, endpoints[best])) {
      best = static_cast<int>(i);
      best_weight = w;
    }
  }
  return best;
}

std::vector<int> RankEndpoints(absl::string_view key, const std::vector<std::string>& endpoints) {
  std::vector<std::pair<uint64_t, int>> weighted;
  weighted.reserve(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) {
    weighted.emplace_back(RendezvousWeight(key, endpoints[i]), static_cast<int>(i));
  }
  std::sort(weighted.begin(), weighted.end(), [&](const auto& a, const auto& b) {
    return Beats(a.first, endpoints[a.second], b.first, endpoints[b.second]);
  });
  std::vector<int> order;
  order.reserve(weighted.size());
  for (const auto& [w, i] : weighted) order.push_back(i);
  return order;
}

}  // namespace offload::client
