// Key id syntax, shared by the key stores and KeyManager (which re-exports it in key_manager.h).
#ifndef SERVICE_KEYS_KEY_ID_H_
#define SERVICE_KEYS_KEY_ID_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace offload::keys {

inline constexpr size_t kMaxKeyIdLength = 64;

// InvalidArgument unless `key_id` matches [a-z0-9][a-z0-9._-]{0,63}. The message names the field
// `key_id` and the first offending position; it does not echo the id.
absl::Status ValidateKeyId(absl::string_view key_id);

}  // namespace offload::keys

#endif  // SERVICE_KEYS_KEY_ID_H_
