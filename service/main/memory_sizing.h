// Sizes the server's default memory bounds against the memory its container may use: where the
// process runs under a cgroup memory limit (cgroup v2's /sys/fs/cgroup/memory.max), the port
// budgets and the memo bounds left at their defaults are sized together against it, so that a
// replica's bounds cannot add up to more than its pod limit.
//
//   std::optional<int64_t> limit = ReadMemoryLimit("/sys/fs/cgroup/memory.max");
//   MemorySizing::Given given;                   // the bounds set by flags, kept as they are
//   given.memo_verify_bytes = true;
//   nlohmann::json chosen = SizeToMemoryLimit(*limit, given, &config);   // logged
//
// The fractions of the limit L, each at most its default (a larger limit never raises a bound):
// each port's --http_memory_budget_bytes L/8 (both ports L/4), --memo_open_bytes_total L/4,
// --memo_verify_bytes L/32, --memo_derive_bytes L/64, --memo_open_bytes_per_key at most the open
// total, --max_queued_bytes L/16 (at least --max_message_bytes). Together at most 39/64 (61%)
// of L where L/16 is at least the largest message (L of 256 MiB and up by default); the rest
// is the process itself, answers being written, the token memo, the allocator's slack. A 1 GiB
// pod: 128 MiB per port, 256 + 32 + 16 MiB of memos, 64 MiB of queued requests.
#ifndef SERVICE_MAIN_MEMORY_SIZING_H_
#define SERVICE_MAIN_MEMORY_SIZING_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "service/main/server.h"

namespace offload {

struct MemorySizing {
  // Which bounds a flag set (those are never changed).
  struct Given {
    bool http_memory_budget_bytes = false;
    bool grpc_memory_budget_bytes = false;  // the retired --grpc_memory_quota_bytes
    bool memo_verify_bytes = false;
    bool memo_derive_bytes = false;
    bool memo_open_bytes_total = false;
    bool memo_open_bytes_per_key = false;
    bool max_queued_bytes = false;
  };
};

// The limit in `path` (cgroup v2 memory.max: bytes, or "max"), or nullopt when there is none:
// the file is missing or unreadable, says "max", or holds a value of 2^60 or more (cgroup v1's
// memory.limit_in_bytes without a limit). InvalidArgument for anything else in it.
absl::StatusOr<std::optional<int64_t>> ReadMemoryLimit(const std::string& path);

// Sets the bounds of `config` that `given` does not name from `limit` (the fractions above), and
// returns the figures in force (chosen or given) for the log. REQUIRES: limit > 0.
nlohmann::json SizeToMemoryLimit(int64_t limit, const MemorySizing::Given& given,
                                 ServerConfig* config);

}  // namespace offload

#endif  // SERVICE_MAIN_MEMORY_SIZING_H_
