#include "service/keys/key_id.h"

#include "absl/strings/str_cat.h"

namespace offload::keys {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

absl::Status ValidateKeyId(absl::string_view key_id) {
  constexpr absl::string_view kPattern = "[a-z0-9][a-z0-9._-]{0,63}";
  if (key_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("key_id: must not be empty (expected ", kPattern, ")"));
  }
  if (key_id.size() > kMaxKeyIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("key_id: expected at most ", kMaxKeyIdLength,
                                                   " characters, got ", key_id.size()));
  }
  if (!IsLowerAlnum(key_id[0])) {
    return absl::InvalidArgumentError(
        absl::StrCat("key_id: must start with [a-z0-9] (expected ", kPattern, ")"));
  }
  for (size_t i = 1; i < key_id.size(); ++i) {
    const char c = key_id[i];
    if (!IsLowerAlnum(c) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat("key_id: character at position ", i,
                                                     " is not allowed (expected ", kPattern, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace offload::keys
