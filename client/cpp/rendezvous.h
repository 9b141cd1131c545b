// Rendezvous (highest-random-weight) hashing: which endpoint serves a routing key.
//
// Every process computes the same weight for (routing key, endpoint), so every client sends one
// key's calls to the same replica, whose memo caches then stay warm:
//
//   std::vector<std::string> endpoints = {"10.0.0.1:50051", "10.0.0.2:50051"};
//   int i = offload::client::PickEndpoint("alice-signing", endpoints, /*usable=*/{});
//
// The weight is the first 8 bytes (little-endian) of BLAKE2b-64 (libsodium crypto_generichash)
// over a fixed domain tag, the key, a 0 separator and the endpoint string. Removing an endpoint
// moves only the keys it held (each to its own next-highest endpoint); adding one takes about
// 1/n of the keys from the others. Pure functions, thread-safe.
#ifndef CLIENT_CPP_RENDEZVOUS_H_
#define CLIENT_CPP_RENDEZVOUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace offload::client {

// The weight of `endpoint` for `key`. Stable across processes, platforms and library versions.
[[nodiscard]] uint64_t RendezvousWeight(absl::string_view key, absl::string_view endpoint);

// Index of the endpoint with the highest weight for `key` among those whose `usable[i]` is true
// (all of them when `usable` is empty), ties broken by the smaller endpoint string; -1 when none
// is usable. REQUIRES: `usable` is empty or as long as `endpoints`.
[[nodiscard]] int PickEndpoint(absl::string_view key, const std::vector<std::string>& endpoints,
                               const std::vector<bool>& usable);

// All endpoint indices ordered by weight for `key`, highest first (the failover order).
[[nodiscard]] std::vector<int> RankEndpoints(absl::string_view key,
                                             const std::vector<std::string>& endpoints);

}  // namespace offload::client

#endif  // CLIENT_CPP_RENDEZVOUS_H_
