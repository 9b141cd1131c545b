#include "service/main/memory_sizing.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace offload {

absl::StatusOr<std::optional<int64_t>> ReadMemoryLimit(const std::string& path) {
  if (path.empty()) return std::optional<int64_t>();
  std::ifstream file(path);
  if (!file) return std::optional<int64_t>();
  std::stringstream text;
  text << file.rdbuf();
  const std::string value(absl::StripAsciiWhitespace(text.str()));
  if (value == "max") return std::optional<int64_t>();
  int64_t limit = 0;
  if (!absl::SimpleAtoi(value, &limit) || limit <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory_limit_file ", path, ": expected a byte count or \"max\", got \"",
        value.substr(0, 32), "\""));
  }
  if (limit >= (int64_t{1} << 60)) return std::optional<int64_t>();
  return std::optional<int64_t>(limit);
}

nlohmann::json SizeToMemoryLimit(int64_t limit, const MemorySizing::Given& given,
                                 ServerConfig* config) {
  const ServerConfig defaults;
  nlohmann::json chosen = {{"limit_bytes", limit}};
  nlohmann::json kept = nlohmann::json::array();
  // `field` = min(its default, limit / divisor), unless a flag gave it.
  const auto size = [&](const char* name, bool flag_given, int64_t* field, int64_t fallback,
                        int64_t divisor) {
    if (flag_given) {
      kept.push_back(name);
    } else {
      *field = std::min(fallback, limit / divisor);
    }
    chosen[name] = *field;
  };
  size("http_memory_budget_bytes", given.http_memory_budget_bytes,
       &config->http_memory_budget_bytes, defaults.http_memory_budget_bytes, 8);
  if (given.grpc_memory_budget_bytes) {
    kept.push_back("grpc_memory_budget_bytes");
    chosen["grpc_memory_budget_bytes"] = config->grpc_memory_budget_bytes;
  } else {
    // The gRPC port has the HTTP port's (its own L/8, unless that was given).
    config->grpc_memory_budget_bytes =
        given.http_memory_budget_bytes ? config->http_memory_budget_bytes
                                       : std::min(defaults.http_memory_budget_bytes, limit / 8);
    chosen["grpc_memory_budget_bytes"] = config->grpc_memory_budget_bytes;
  }
  size("memo_open_bytes_total", given.memo_open_bytes_total, &config->memo_open_bytes_total,
       defaults.memo_open_bytes_total, 4);
  size("memo_verify_bytes", given.memo_verify_bytes, &config->memo_verify_bytes,
       defaults.memo_verify_bytes, 32);
  size("memo_derive_bytes", given.memo_derive_bytes, &config->memo_derive_bytes,
       defaults.memo_derive_bytes, 64);
  if (given.memo_open_bytes_per_key) {
    kept.push_back("memo_open_bytes_per_key");
  } else {
    config->memo_open_bytes_per_key =
        std::min(defaults.memo_open_bytes_per_key, config->memo_open_bytes_total);
  }
  chosen["memo_open_bytes_per_key"] = config->memo_open_bytes_per_key;
  if (given.max_queued_bytes) {
    kept.push_back("max_queued_bytes");
  } else {
    // At least one request of the largest size (else it would wait for an empty queue).
    config->max_queued_bytes = std::max(std::min(defaults.max_queued_bytes, limit / 16),
                                        config->max_message_bytes);
  }
  chosen["max_queued_bytes"] = config->max_queued_bytes;
  chosen["given_by_flags"] = std::move(kept);
  chosen["fractions"] =
      "each port's memory budget 1/8, open memo 1/4, verify memo 1/32, derive memo 1/64, queued "
      "requests 1/16 (at least max_message_bytes) of the limit, each at most its default";
  return chosen;
}

}  // namespace offload
