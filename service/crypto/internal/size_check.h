// Size checks that every public entry point of service/crypto runs before any cryptography.
//
//   OFFLOAD_RETURN_IF_ERROR(internal::CheckSize("seed", seed.size(), 32));
//   // -> InvalidArgument("seed: expected 32 bytes, got 31")
//
// Internal to service/crypto.
#ifndef SERVICE_CRYPTO_INTERNAL_SIZE_CHECK_H_
#define SERVICE_CRYPTO_INTERNAL_SIZE_CHECK_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace offload::crypto::internal {

// InvalidArgument("<field>: expected <expected> bytes, got <actual>") unless equal.
inline absl::Status CheckSize(absl::string_view field, size_t actual, size_t expected) {
  if (actual == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, " bytes, got ", actual));
}

}  // namespace offload::crypto::internal

#endif  // SERVICE_CRYPTO_INTERNAL_SIZE_CHECK_H_
