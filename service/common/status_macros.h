// Early-return helpers for absl::Status, which Debian's Abseil (20220623) does not ship.
//
//   absl::Status Load() {
//     OFFLOAD_RETURN_IF_ERROR(Open());
//     OFFLOAD_ASSIGN_OR_RETURN(std::string data, ReadAll());
//     ...
//   }
#ifndef SERVICE_COMMON_STATUS_MACROS_H_
#define SERVICE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define OFFLOAD_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::absl::Status _offload_status = (expr);          \
    if (!_offload_status.ok()) return _offload_status; \
  } while (0)

#define OFFLOAD_STATUS_CONCAT_INNER_(a, b) a##b
#define OFFLOAD_STATUS_CONCAT_(a, b) OFFLOAD_STATUS_CONCAT_INNER_(a, b)

// `lhs` may declare a variable: OFFLOAD_ASSIGN_OR_RETURN(auto x, F());
#define OFFLOAD_ASSIGN_OR_RETURN(lhs, expr) \
  OFFLOAD_ASSIGN_OR_RETURN_IMPL_(OFFLOAD_STATUS_CONCAT_(_offload_statusor_, __LINE__), lhs, expr)

#define OFFLOAD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // SERVICE_COMMON_STATUS_MACROS_H_
