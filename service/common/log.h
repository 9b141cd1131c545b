// Structured logs: one JSON object per line on stderr.
//
//   offload::Log(LogLevel::kInfo, "server_started", {{"grpc_address", address}, {"workers", 2}});
//   -> {"ts":"2026-11-29T18:52:52.123Z","level":"info","event":"server_started","grpc_address":...}
//
// Fields are JSON values (nlohmann::json). Never pass key material, plaintexts, messages or
// signatures: log sizes, ids and codes instead. Thread-safe: each line is written with one call.
#ifndef SERVICE_COMMON_LOG_H_
#define SERVICE_COMMON_LOG_H_

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"

namespace offload {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Lines below `level` are dropped. Default: kInfo.
void SetMinLogLevel(LogLevel level);

void Log(LogLevel level, absl::string_view event, nlohmann::json fields = nlohmann::json::object());

}  // namespace offload

#endif  // SERVICE_COMMON_LOG_H_
