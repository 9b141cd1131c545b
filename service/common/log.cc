#include "service/common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace offload {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

}  // namespace

void SetMinLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }

void Log(LogLevel level, absl::string_view event, nlohmann::json fields) {
  if (static_cast<int>(level) < min_level.load(std::memory_order_relaxed)) return;
  nlohmann::ordered_json line = nlohmann::ordered_json::object();
  line["ts"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  line["level"] = LevelName(level);
  line["event"] = std::string(event);
  if (fields.is_object()) {
    for (auto& [key, value] : fields.items()) line[key] = std::move(value);
  }
  // Invalid UTF-8 is replaced rather than thrown: a log line never takes the process down.
  std::string text = line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace offload
