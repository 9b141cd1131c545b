#include "service/keys/pkcs11_kek.h"

// p11-kit's pkcs11.h is the standard PKCS#11 v2.40 API with p11-kit's spelling of the structs.
#include <p11-kit/p11-kit.h>
#include <p11-kit/pkcs11.h>
#include <p11-kit/uri.h>
#include <fcntl.h>
#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "service/common/log.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "service/common/status_macros.h"
#include "service/keys/internal/file_util.h"

namespace offload::keys {
namespace {

constexpr size_t kDataKeySize = 32;
constexpr size_t kGcmIvSize = 12;
constexpr size_t kGcmTagSize = 16;
constexpr size_t kMaxLabelSize = 64;
constexpr size_t kMaxPinFileSize = 1024;
constexpr char kNamePrefix[] = "pkcs11:";

std::string RvName(CK_RV rv) {
  switch (rv) {
    case CKR_OK: return "CKR_OK";
    case CKR_GENERAL_ERROR: return "CKR_GENERAL_ERROR";
    case CKR_ARGUMENTS_BAD: return "CKR_ARGUMENTS_BAD";
    case CKR_DEVICE_ERROR: return "CKR_DEVICE_ERROR";
    case CKR_DEVICE_REMOVED: return "CKR_DEVICE_REMOVED";
    case CKR_ENCRYPTED_DATA_INVALID: return "CKR_ENCRYPTED_DATA_INVALID";
    case CKR_ENCRYPTED_DATA_LEN_RANGE: return "CKR_ENCRYPTED_DATA_LEN_RANGE";
    case CKR_FUNCTION_FAILED: return "CKR_FUNCTION_FAILED";
    case CKR_KEY_HANDLE_INVALID: return "CKR_KEY_HANDLE_INVALID";
    case CKR_OBJECT_HANDLE_INVALID: return "CKR_OBJECT_HANDLE_INVALID";
    case CKR_MECHANISM_INVALID: return "CKR_MECHANISM_INVALID";
    case CKR_MECHANISM_PARAM_INVALID: return "CKR_MECHANISM_PARAM_INVALID";
    case CKR_KEY_FUNCTION_NOT_PERMITTED: return "CKR_KEY_FUNCTION_NOT_PERMITTED";
    case CKR_PIN_INCORRECT: return "CKR_PIN_INCORRECT";
    case CKR_PIN_LOCKED: return "CKR_PIN_LOCKED";
    case CKR_PIN_EXPIRED: return "CKR_PIN_EXPIRED";
    case CKR_SESSION_CLOSED: return "CKR_SESSION_CLOSED";
    case CKR_SESSION_HANDLE_INVALID: return "CKR_SESSION_HANDLE_INVALID";
    case CKR_TOKEN_NOT_PRESENT: return "CKR_TOKEN_NOT_PRESENT";
    case CKR_TOKEN_NOT_RECOGNIZED: return "CKR_TOKEN_NOT_RECOGNIZED";
    case CKR_USER_NOT_LOGGED_IN: return "CKR_USER_NOT_LOGGED_IN";
    case CKR_USER_PIN_NOT_INITIALIZED: return "CKR_USER_PIN_NOT_INITIALIZED";
    case CKR_CRYPTOKI_NOT_INITIALIZED: return "CKR_CRYPTOKI_NOT_INITIALIZED";
    case CKR_TEMPLATE_INCONSISTENT: return "CKR_TEMPLATE_INCONSISTENT";
    case CKR_ATTRIBUTE_VALUE_INVALID: return "CKR_ATTRIBUTE_VALUE_INVALID";
    default: return absl::StrFormat("CKR 0x%08x", static_cast<unsigned long>(rv));
  }
}

// The session or the device went away: worth a new session (and login) and one more try.
bool SessionLost(CK_RV rv) {
  return rv == CKR_SESSION_HANDLE_INVALID || rv == CKR_SESSION_CLOSED ||
         rv == CKR_USER_NOT_LOGGED_IN || rv == CKR_DEVICE_REMOVED || rv == CKR_TOKEN_NOT_PRESENT ||
         rv == CKR_DEVICE_ERROR;
}

// A blank-padded PKCS#11 text field as a string.
std::string Field(const unsigned char* text, size_t size) {
  std::string s(reinterpret_cast<const char*>(text), size);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string Hex(absl::Span<const uint8_t> bytes) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

bool ValidLabel(absl::string_view label) {
  if (label.empty() || label.size() > kMaxLabelSize) return false;
  return std::all_of(label.begin(), label.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

std::string KekName(absl::string_view label, absl::Span<const uint8_t> id) {
  return absl::StrCat(kNamePrefix, label, "/", Hex(id));
}

struct UriCloser {
  void operator()(P11KitUri* uri) const { p11_kit_uri_free(uri); }
};
using UriPtr = std::unique_ptr<P11KitUri, UriCloser>;

// The URI without its pin-value, for messages.
std::string UriForLogs(absl::string_view uri) {
  std::string out(uri);
  for (size_t at = out.find("pin-value="); at != std::string::npos;
       at = out.find("pin-value=", at + 1)) {
    const size_t begin = at + std::strlen("pin-value=");
    size_t end = out.find_first_of(";&", begin);
    if (end == std::string::npos) end = out.size();
    out.replace(begin, end - begin, "(hidden)");
  }
  return out;
}

absl::StatusOr<SecretBytes> ReadPinFile(const std::string& path) {
  mode_t mode = 0;
  absl::StatusOr<SecretBytes> content =
      internal::ReadFileAt(AT_FDCWD, path, kMaxPinFileSize, &mode);
  if (!content.ok()) {
    return absl::Status(content.status().code(),
                        absl::StrCat("pkcs11 PIN file: ", content.status().message()));
  }
  if ((mode & 077) != 0) {
    // As for a KEK file: a PIN others can read is no secret.
    return absl::PermissionDeniedError(absl::StrFormat(
        "pkcs11 PIN file %s is accessible by group or others (mode %04o): chmod 600 it, or "
        "use defaultMode: 0400 on a Kubernetes Secret volume", path, mode & 07777));
  }
  while (!content->empty() && (content->back() == '\n' || content->back() == '\r')) {
    content->pop_back();
  }
  if (content->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("pkcs11 PIN file ", path, " is empty"));
  }
  return content;
}

}  // namespace

namespace internal {

// A module (or p11-kit's registered modules), one logged-in session on the chosen token, and the
// keys found so far. All PKCS#11 calls go through here, under mu_.
class Pkcs11Session {
 public:
  ~Pkcs11Session() {
    absl::MutexLock lock(&mu_);
    if (session_ != CK_INVALID_HANDLE) module_->C_CloseSession(session_);
    if (owned_module_ != nullptr) {
      p11_kit_module_finalize(owned_module_);
      p11_kit_module_release(owned_module_);
    }
    if (registered_ != nullptr) p11_kit_modules_finalize_and_release(registered_);
  }

  CK_FUNCTION_LIST* module_ = nullptr;
  CK_FUNCTION_LIST* owned_module_ = nullptr;  // loaded from module-path
  CK_FUNCTION_LIST** registered_ = nullptr;   // p11-kit's registered modules
  CK_SLOT_ID slot_ = 0;
  std::string token_description_;  // token "label" (serial ...) in module ...
  std::string label_;
  std::optional<std::vector<uint8_t>> pinned_id_;
  SecretBytes pin_;

  absl::Mutex mu_;
  CK_SESSION_HANDLE session_ ABSL_GUARDED_BY(mu_) = CK_INVALID_HANDLE;

  absl::Status Error(absl::string_view what, CK_RV rv) const {
    const std::string message =
        absl::StrCat("pkcs11 ", token_description_, ": ", what, " failed: ", RvName(rv));
    if (SessionLost(rv)) return absl::UnavailableError(message);
    return absl::InternalError(message);
  }

  // Opens a session and logs in (a login covers every session of this process).
  absl::Status LoginLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (session_ != CK_INVALID_HANDLE) {
      module_->C_CloseSession(session_);
      session_ = CK_INVALID_HANDLE;
    }
    CK_SESSION_HANDLE session = CK_INVALID_HANDLE;
    CK_RV rv = module_->C_OpenSession(slot_, CKF_SERIAL_SESSION | CKF_RW_SESSION, nullptr, nullptr,
                                      &session);
    if (rv != CKR_OK) return Error("C_OpenSession", rv);
    // A refused PIN is never tried again: every try counts against the token's retry limit,
    // and a locked user PIN stops every process that uses the token.
    if (!pin_refused_.ok()) {
      module_->C_CloseSession(session);
      return pin_refused_;
    }
    rv = module_->C_Login(session, CKU_USER, const_cast<CK_UTF8CHAR*>(pin_.data()), pin_.size());
    if (rv == CKR_OK || rv == CKR_USER_ALREADY_LOGGED_IN) {
      session_ = session;
      return absl::OkStatus();
    }
    module_->C_CloseSession(session);  // not logged in: never kept as the session
    if (rv == CKR_PIN_INCORRECT) {
      pin_refused_ = absl::PermissionDeniedError(absl::StrCat(
          "pkcs11 ", token_description_, ": login refused: wrong PIN (CKR_PIN_INCORRECT)"));
      return pin_refused_;
    }
    if (rv == CKR_PIN_LOCKED || rv == CKR_PIN_EXPIRED || rv == CKR_USER_PIN_NOT_INITIALIZED) {
      pin_refused_ = absl::FailedPreconditionError(
          absl::StrCat("pkcs11 ", token_description_, ": login refused: ", RvName(rv)));
      return pin_refused_;
    }
    return Error("C_Login", rv);
  }
  absl::Status pin_refused_ ABSL_GUARDED_BY(mu_);  // latched: no login is tried after it

  // Runs `op` on the session; after a lost session, logs in again and runs it once more.
  template <typename Op>
  auto WithSession(Op op) -> decltype(op(CK_SESSION_HANDLE{})) {
    absl::MutexLock lock(&mu_);
    for (int attempt = 1;; ++attempt) {
      if (session_ == CK_INVALID_HANDLE) {
        if (absl::Status s = LoginLocked(); !s.ok()) return s;
      }
      auto result = op(session_);
      if (result.ok() || attempt > 1 || !absl::IsUnavailable(result.status())) return result;
      module_->C_CloseSession(session_);
      session_ = CK_INVALID_HANDLE;
    }
  }

  struct FoundKey {
    CK_OBJECT_HANDLE handle;
    std::vector<uint8_t> id;
  };

  // Every AES secret key labelled `label` (with CKA_ID `id` when given).
  absl::StatusOr<std::vector<FoundKey>> FindKeys(CK_SESSION_HANDLE session, absl::string_view label,
                                                 const std::vector<uint8_t>* id) {
    CK_OBJECT_CLASS klass = CKO_SECRET_KEY;
    CK_KEY_TYPE type = CKK_AES;
    std::vector<CK_ATTRIBUTE> tmpl = {
        {CKA_CLASS, &klass, sizeof(klass)},
        {CKA_KEY_TYPE, &type, sizeof(type)},
        {CKA_LABEL, const_cast<char*>(label.data()), label.size()},
    };
    if (id != nullptr) {
      tmpl.push_back({CKA_ID, const_cast<uint8_t*>(id->data()), id->size()});
    }
    CK_RV rv = module_->C_FindObjectsInit(session, tmpl.data(), tmpl.size());
    if (rv != CKR_OK) return Error("C_FindObjectsInit", rv);
    std::vector<CK_OBJECT_HANDLE> handles;
    for (;;) {
      CK_OBJECT_HANDLE batch[16];
      CK_ULONG count = 0;
      rv = module_->C_FindObjects(session, batch, 16, &count);
      if (rv != CKR_OK) {
        module_->C_FindObjectsFinal(session);
        return Error("C_FindObjects", rv);
      }
      if (count == 0) break;
      handles.insert(handles.end(), batch, batch + count);
    }
    module_->C_FindObjectsFinal(session);
    std::vector<FoundKey> keys;
    for (CK_OBJECT_HANDLE h : handles) {
      CK_ATTRIBUTE attr = {CKA_ID, nullptr, 0};
      rv = module_->C_GetAttributeValue(session, h, &attr, 1);
      if (rv != CKR_OK) return Error("C_GetAttributeValue(CKA_ID)", rv);
      std::vector<uint8_t> key_id(attr.ulValueLen);
      attr.pValue = key_id.data();
      if (!key_id.empty()) {
        rv = module_->C_GetAttributeValue(session, h, &attr, 1);
        if (rv != CKR_OK) return Error("C_GetAttributeValue(CKA_ID)", rv);
      }
      keys.push_back({h, std::move(key_id)});
    }
    return keys;
  }

  // FailedPrecondition unless `handle` is an AES-256 key that may encrypt and decrypt and whose
  // value nobody outside the token ever knew: generated there (CKA_LOCAL), private (usable only
  // after login), always sensitive and never extractable. A key imported with a known value, or
  // once extractable, or usable without the PIN, is refused - else whoever may write to the
  // token could plant a KEK they know and have the store re-wrapped under it.
  absl::Status CheckKey(CK_SESSION_HANDLE session, CK_OBJECT_HANDLE handle,
                        absl::string_view name) {
    CK_BBOOL sensitive = CK_FALSE, extractable = CK_TRUE, encrypt = CK_FALSE, decrypt = CK_FALSE;
    CK_BBOOL always_sensitive = CK_FALSE, never_extractable = CK_FALSE, local = CK_FALSE,
             is_private = CK_FALSE;
    CK_ULONG value_len = 0;
    CK_ATTRIBUTE attrs[] = {
        {CKA_SENSITIVE, &sensitive, sizeof(sensitive)},
        {CKA_EXTRACTABLE, &extractable, sizeof(extractable)},
        {CKA_ENCRYPT, &encrypt, sizeof(encrypt)},
        {CKA_DECRYPT, &decrypt, sizeof(decrypt)},
        {CKA_VALUE_LEN, &value_len, sizeof(value_len)},
        {CKA_ALWAYS_SENSITIVE, &always_sensitive, sizeof(always_sensitive)},
        {CKA_NEVER_EXTRACTABLE, &never_extractable, sizeof(never_extractable)},
        {CKA_LOCAL, &local, sizeof(local)},
        {CKA_PRIVATE, &is_private, sizeof(is_private)},
    };
    const CK_RV rv = module_->C_GetAttributeValue(session, handle, attrs,
                                                  sizeof(attrs) / sizeof(attrs[0]));
    if (rv != CKR_OK) return Error("C_GetAttributeValue", rv);
    std::vector<std::string> problems;
    if (value_len != 32) problems.push_back(absl::StrCat("is AES-", value_len * 8, ", not AES-256"));
    if (sensitive != CK_TRUE) problems.push_back("is not sensitive (CKA_SENSITIVE=false)");
    if (extractable != CK_FALSE) problems.push_back("is extractable (CKA_EXTRACTABLE=true)");
    if (always_sensitive != CK_TRUE || never_extractable != CK_TRUE) {
      problems.push_back("was once readable (CKA_ALWAYS_SENSITIVE / CKA_NEVER_EXTRACTABLE false)");
    }
    if (local != CK_TRUE) problems.push_back("was not generated in the token (CKA_LOCAL=false)");
    if (is_private != CK_TRUE) problems.push_back("is usable without login (CKA_PRIVATE=false)");
    if (encrypt != CK_TRUE || decrypt != CK_TRUE) {
      problems.push_back("may not encrypt and decrypt (CKA_ENCRYPT/CKA_DECRYPT)");
    }
    if (!problems.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pkcs11 ", token_description_, ": key ", name, " ", absl::StrJoin(problems, ", "),
          ": a KEK must be an AES-256 key that never leaves the token"));
    }
    return absl::OkStatus();
  }
};

}  // namespace internal

namespace {

// One key inside the token.
class Pkcs11Kek final : public Kek {
 public:
  Pkcs11Kek(std::shared_ptr<internal::Pkcs11Session> session, CK_OBJECT_HANDLE handle,
            std::string name)
      : session_(std::move(session)), handle_(handle), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  size_t wrapped_size() const override { return kGcmIvSize + kDataKeySize + kGcmTagSize; }

  absl::StatusOr<std::vector<uint8_t>> Wrap(absl::Span<const uint8_t> data_key,
                                            absl::Span<const uint8_t> aad) const override {
    if (data_key.size() != kDataKeySize) {
      return absl::InvalidArgumentError(
          absl::StrCat("data key: expected ", kDataKeySize, " bytes, got ", data_key.size()));
    }
    std::vector<uint8_t> out(wrapped_size());
    randombytes_buf(out.data(), kGcmIvSize);
    std::vector<uint8_t> aad_copy(aad.begin(), aad.end());
    return session_->WithSession(
        [&](CK_SESSION_HANDLE session) -> absl::StatusOr<std::vector<uint8_t>> {
          CK_GCM_PARAMS params = {out.data(), kGcmIvSize, kGcmIvSize * 8, aad_copy.data(),
                                  aad_copy.size(), kGcmTagSize * 8};
          CK_MECHANISM mechanism = {CKM_AES_GCM, &params, sizeof(params)};
          CK_RV rv = session_->module_->C_EncryptInit(session, &mechanism, handle_);
          if (rv != CKR_OK) return session_->Error(absl::StrCat("wrap with ", name_), rv);
          CK_ULONG size = out.size() - kGcmIvSize;
          rv = session_->module_->C_Encrypt(session, const_cast<uint8_t*>(data_key.data()),
                                            data_key.size(), out.data() + kGcmIvSize, &size);
          if (rv != CKR_OK) return session_->Error(absl::StrCat("wrap with ", name_), rv);
          if (size != kDataKeySize + kGcmTagSize) {
            return absl::InternalError(absl::StrCat("pkcs11: wrap with ", name_, " returned ",
                                                    size, " bytes, expected ",
                                                    kDataKeySize + kGcmTagSize));
          }
          return out;
        });
  }

  absl::StatusOr<SecretBytes> Unwrap(absl::Span<const uint8_t> wrapped,
                                     absl::Span<const uint8_t> aad) const override {
    if (wrapped.size() != wrapped_size()) {
      return absl::DataLossError(absl::StrCat("kek ", name_, ": wrapped data key of ",
                                              wrapped.size(), " bytes, expected ", wrapped_size()));
    }
    std::vector<uint8_t> iv(wrapped.begin(), wrapped.begin() + kGcmIvSize);
    std::vector<uint8_t> aad_copy(aad.begin(), aad.end());
    return session_->WithSession([&](CK_SESSION_HANDLE session) -> absl::StatusOr<SecretBytes> {
      CK_GCM_PARAMS params = {iv.data(), kGcmIvSize, kGcmIvSize * 8, aad_copy.data(),
                              aad_copy.size(), kGcmTagSize * 8};
      CK_MECHANISM mechanism = {CKM_AES_GCM, &params, sizeof(params)};
      CK_RV rv = session_->module_->C_DecryptInit(session, &mechanism, handle_);
      if (rv != CKR_OK) return session_->Error(absl::StrCat("unwrap with ", name_), rv);
      // Room for the tag too: some modules want the output buffer as large as the input.
      SecretBytes data_key(kDataKeySize + kGcmTagSize);
      CK_ULONG size = data_key.size();
      rv = session_->module_->C_Decrypt(session, const_cast<uint8_t*>(wrapped.data()) + kGcmIvSize,
                                        wrapped.size() - kGcmIvSize, data_key.data(), &size);
      if (rv != CKR_OK) {
        if (SessionLost(rv)) return session_->Error(absl::StrCat("unwrap with ", name_), rv);
        return absl::DataLossError(absl::StrCat("kek ", name_,
                                                ": the wrapped data key does not authenticate (",
                                                RvName(rv), "; corrupted or modified)"));
      }
      if (size != kDataKeySize) {
        return absl::DataLossError(absl::StrCat("kek ", name_, ": unwrapped ", size,
                                                " bytes, expected ", kDataKeySize));
      }
      data_key.resize(kDataKeySize);
      return data_key;
    });
  }

 private:
  const std::shared_ptr<internal::Pkcs11Session> session_;
  const CK_OBJECT_HANDLE handle_;
  const std::string name_;
};

// Loads the module(s) the URI names and finds the one matching token; fills `s`.
absl::Status FindToken(P11KitUri* uri, absl::string_view uri_text, internal::Pkcs11Session* s) {
  std::vector<CK_FUNCTION_LIST*> modules;
  if (const char* path = p11_kit_uri_get_module_path(uri); path != nullptr && path[0] != '\0') {
    CK_FUNCTION_LIST* module = p11_kit_module_load(path, 0);
    if (module == nullptr) {
      const char* why = p11_kit_message();
      return absl::NotFoundError(absl::StrCat("pkcs11: cannot load module ", path, ": ",
                                              why != nullptr ? why : "unknown error"));
    }
    if (CK_RV rv = p11_kit_module_initialize(module); rv != CKR_OK) {
      p11_kit_module_release(module);
      return absl::UnavailableError(
          absl::StrCat("pkcs11: module ", path, ": C_Initialize failed: ", RvName(rv)));
    }
    s->owned_module_ = module;
    modules.push_back(module);
  } else {
    s->registered_ = p11_kit_modules_load_and_initialize(0);
    if (s->registered_ == nullptr) {
      const char* why = p11_kit_message();
      return absl::NotFoundError(absl::StrCat("pkcs11: p11-kit could not load its modules: ",
                                              why != nullptr ? why : "unknown error"));
    }
    const char* name = p11_kit_uri_get_module_name(uri);
    for (CK_FUNCTION_LIST** m = s->registered_; *m != nullptr; ++m) {
      if (name != nullptr && name[0] != '\0') {
        char* module_name = p11_kit_module_get_name(*m);
        const bool match = module_name != nullptr && absl::string_view(module_name) == name;
        free(module_name);
        if (!match) continue;
      }
      modules.push_back(*m);
    }
  }

  struct Candidate {
    CK_FUNCTION_LIST* module;
    CK_SLOT_ID slot;
    std::string description;
  };
  std::vector<Candidate> matches;
  std::vector<std::string> present;
  for (CK_FUNCTION_LIST* module : modules) {
    CK_INFO info;
    if (module->C_GetInfo(&info) != CKR_OK || !p11_kit_uri_match_module_info(uri, &info)) continue;
    const std::string module_desc = Field(info.libraryDescription, sizeof(info.libraryDescription));
    CK_ULONG count = 0;
    if (module->C_GetSlotList(CK_TRUE, nullptr, &count) != CKR_OK || count == 0) continue;
    std::vector<CK_SLOT_ID> slots(count);
    if (module->C_GetSlotList(CK_TRUE, slots.data(), &count) != CKR_OK) continue;
    slots.resize(count);
    for (CK_SLOT_ID slot : slots) {
      CK_SLOT_INFO slot_info;
      CK_TOKEN_INFO token;
      if (module->C_GetSlotInfo(slot, &slot_info) != CKR_OK ||
          module->C_GetTokenInfo(slot, &token) != CKR_OK) {
        continue;
      }
      if ((token.flags & CKF_TOKEN_INITIALIZED) == 0) continue;  // e.g. SoftHSM2's free slot
      const std::string description = absl::StrCat(
          "token \"", Field(token.label, sizeof(token.label)), "\" (serial ",
          Field(token.serialNumber, sizeof(token.serialNumber)), ", module ", module_desc, ")");
      present.push_back(description);
      const CK_SLOT_ID wanted_slot = p11_kit_uri_get_slot_id(uri);
      if (!p11_kit_uri_match_slot_info(uri, &slot_info) ||
          !p11_kit_uri_match_token_info(uri, &token) ||
          (wanted_slot != static_cast<CK_SLOT_ID>(-1) && wanted_slot != slot)) {
        continue;
      }
      matches.push_back({module, slot, description});
    }
  }
  if (matches.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "pkcs11: no token matches ", UriForLogs(uri_text), "; tokens present: ",
        present.empty() ? "none" : absl::StrJoin(present, ", ")));
  }
  if (matches.size() > 1) {
    std::vector<std::string> names;
    for (const Candidate& c : matches) names.push_back(c.description);
    return absl::FailedPreconditionError(
        absl::StrCat("pkcs11: ", matches.size(), " tokens match ", UriForLogs(uri_text), " (",
                     absl::StrJoin(names, ", "), "); add token= or serial= to the URI"));
  }
  s->module_ = matches[0].module;
  s->slot_ = matches[0].slot;
  s->token_description_ = matches[0].description;
  return absl::OkStatus();
}

// The CKA_ID of a KEK generation: 8 bytes, big-endian (--kek_pkcs11_create's).
constexpr size_t kGenerationIdSize = 8;

// Greatest first: by length, then bytes (8-byte big-endian generations compare as numbers).
bool IdLess(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

}  // namespace

namespace internal {
struct Pkcs11TokenState {
  std::shared_ptr<Pkcs11Session> session;
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::shared_ptr<const Kek>> keks ABSL_GUARDED_BY(mu);
};
}  // namespace internal

namespace {
std::shared_ptr<internal::Pkcs11TokenState> MakeState(
    std::unique_ptr<internal::Pkcs11Session> session) {
  auto state = std::make_shared<internal::Pkcs11TokenState>();
  state->session = std::shared_ptr<internal::Pkcs11Session>(std::move(session));
  return state;
}
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::StatusOr<bool> TakePinValue(char* uri, KeyBytes* pin) {
  constexpr absl::string_view kAttribute = "pin-value=";
  bool taken = false;
  size_t size = std::strlen(uri);
  for (size_t from = 0;;) {
    const char* found = std::strstr(uri + from, "pin-value=");
    if (found == nullptr) return taken;
    const size_t start = static_cast<size_t>(found - uri);
    const char before = start > 0 ? uri[start - 1] : '\0';
    if (before != ':' && before != ';' && before != '?' && before != '&') {
      from = start + 1;  // inside another attribute's value
      continue;
    }
    const size_t value = start + kAttribute.size();
    size_t end = value;
    while (end < size && uri[end] != ';' && uri[end] != '?' && uri[end] != '&') ++end;
    // The value, percent-decoded (RFC 3986 as RFC 7512 uses it).
    KeyBytes decoded;
    decoded.reserve(end - value);
    bool bad = false;
    for (size_t i = value; i < end; ++i) {
      if (uri[i] != '%') {
        decoded.push_back(static_cast<uint8_t>(uri[i]));
        continue;
      }
      const int hi = i + 2 < end ? HexValue(uri[i + 1]) : -1;
      const int lo = i + 2 < end ? HexValue(uri[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        bad = true;
        break;
      }
      decoded.push_back(static_cast<uint8_t>(hi * 16 + lo));
      i += 2;
    }
    // What goes: the attribute and the separator before it (";x", "&x"), or, first in its
    // component, the one after it ("x;" "x&"), or "?x" alone.
    size_t cut_from = start, cut_to = end;
    if (before == ';' || before == '&') {
      cut_from = start - 1;
    } else if (end < size && (uri[end] == ';' || uri[end] == '&')) {
      cut_to = end + 1;
    } else if (before == '?') {
      cut_from = start - 1;
    }
    if (bad) {
      sodium_memzero(uri + start, size - start);
      return absl::InvalidArgumentError(
          "kek_pkcs11: pin-value: a bad percent-encoding (the value is not shown)");
    }
    std::memmove(uri + cut_from, uri + cut_to, size - cut_to);
    sodium_memzero(uri + size - (cut_to - cut_from), cut_to - cut_from);
    size -= cut_to - cut_from;
    *pin = std::move(decoded);
    taken = true;
    from = cut_from;
  }
}

Pkcs11Token::Pkcs11Token(std::unique_ptr<internal::Pkcs11Session> session)
    : state_(MakeState(std::move(session))) {}

Pkcs11Token::~Pkcs11Token() = default;

absl::StatusOr<std::shared_ptr<Pkcs11Token>> Pkcs11Token::Open(const Pkcs11KekOptions& options) {
  if (options.uri.empty()) return absl::InvalidArgumentError("kek_pkcs11: empty URI");
  UriPtr uri(p11_kit_uri_new());
  if (int rc = p11_kit_uri_parse(options.uri.c_str(), P11_KIT_URI_FOR_ANY, uri.get());
      rc != P11_KIT_URI_OK) {
    return absl::InvalidArgumentError(absl::StrCat("kek_pkcs11: cannot parse ",
                                                   UriForLogs(options.uri), " as a PKCS#11 URI: ",
                                                   p11_kit_uri_message(rc)));
  }
  if (p11_kit_uri_any_unrecognized(uri.get())) {
    return absl::InvalidArgumentError(absl::StrCat("kek_pkcs11: ", UriForLogs(options.uri),
                                                   " has attributes this build does not know"));
  }
  auto s = std::make_unique<internal::Pkcs11Session>();
  s->label_ = kDefaultPkcs11KekLabel;
  if (CK_ATTRIBUTE* label = p11_kit_uri_get_attribute(uri.get(), CKA_LABEL); label != nullptr) {
    s->label_.assign(static_cast<const char*>(label->pValue), label->ulValueLen);
  }
  if (!ValidLabel(s->label_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kek_pkcs11: object=\"", s->label_,
                     "\": expected 1 to 64 characters from [A-Za-z0-9._-]"));
  }
  if (CK_ATTRIBUTE* id = p11_kit_uri_get_attribute(uri.get(), CKA_ID); id != nullptr) {
    const auto* p = static_cast<const uint8_t*>(id->pValue);
    s->pinned_id_.emplace(p, p + id->ulValueLen);
  }

  // The PIN: from the URI (or taken out of it), else the PIN file, else the environment.
  if (const char* value = p11_kit_uri_get_pin_value(uri.get()); value != nullptr) {
    s->pin_.assign(value, value + std::strlen(value));
    // p11-kit's copy is freed without a wipe: wipe it here.
    sodium_memzero(const_cast<char*>(value), std::strlen(value));
  } else if (!options.pin.empty()) {
    s->pin_.assign(options.pin.begin(), options.pin.end());
  } else if (const char* source = p11_kit_uri_get_pin_source(uri.get()); source != nullptr) {
    absl::string_view path(source);
    absl::ConsumePrefix(&path, "file://");
    absl::ConsumePrefix(&path, "file:");
    OFFLOAD_ASSIGN_OR_RETURN(s->pin_, ReadPinFile(std::string(path)));
  } else if (!options.pin_file.empty()) {
    OFFLOAD_ASSIGN_OR_RETURN(s->pin_, ReadPinFile(options.pin_file));
  } else if (const char* env = options.pin_env.empty() ? nullptr : std::getenv(options.pin_env.c_str());
             env != nullptr && env[0] != '\0') {
    s->pin_.assign(env, env + std::strlen(env));
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "kek_pkcs11: no PIN: put pin-source= or pin-value= in the URI, or give "
        "--kek_pkcs11_pin_file, or set ",
        options.pin_env.empty() ? kDefaultPkcs11PinEnvVar : options.pin_env));
  }

  OFFLOAD_RETURN_IF_ERROR(FindToken(uri.get(), options.uri, s.get()));
  {
    absl::MutexLock lock(&s->mu_);
    OFFLOAD_RETURN_IF_ERROR(s->LoginLocked());
  }
  return std::shared_ptr<Pkcs11Token>(new Pkcs11Token(std::move(s)));
}

absl::StatusOr<std::shared_ptr<const Kek>> Pkcs11Token::ResolveCurrent() {
  const std::shared_ptr<internal::Pkcs11TokenState>& state = state_;
  internal::Pkcs11Session* s = state->session.get();
  using Found = internal::Pkcs11Session::FoundKey;
  OFFLOAD_ASSIGN_OR_RETURN(
      Found best,
      s->WithSession([&](CK_SESSION_HANDLE session) -> absl::StatusOr<Found> {
        OFFLOAD_ASSIGN_OR_RETURN(
            std::vector<Found> keys,
            s->FindKeys(session, s->label_, s->pinned_id_ ? &*s->pinned_id_ : nullptr));
        if (keys.empty()) {
          return absl::NotFoundError(absl::StrCat(
              "pkcs11 ", s->token_description_, ": no AES key labelled \"", s->label_, "\"",
              s->pinned_id_ ? absl::StrCat(" with id ", Hex(*s->pinned_id_)) : "",
              " (create one with offload_server --kek_pkcs11_create)"));
        }
        // Generations are 8-byte ids (what --kek_pkcs11_create makes): a key with another id
        // never becomes current unless pinned by id=. Greatest first; a key that fails
        // CheckKey is passed over (logged), so a planted or misconfigured object neither
        // becomes the KEK nor freezes rotation.
        std::vector<Found> candidates;
        for (const Found& k : keys) {
          if (s->pinned_id_ || k.id.size() == kGenerationIdSize) candidates.push_back(k);
        }
        std::sort(candidates.begin(), candidates.end(),
                  [](const Found& a, const Found& b) { return IdLess(b.id, a.id); });
        absl::Status first_refusal;
        for (size_t i = 0; i < candidates.size(); ++i) {
          const Found& k = candidates[i];
          if (i + 1 < candidates.size() && candidates[i + 1].id == k.id) {
            return absl::FailedPreconditionError(absl::StrCat(
                "pkcs11 ", s->token_description_, ": several keys labelled \"", s->label_,
                "\" have id ", Hex(k.id), "; give each KEK its own CKA_ID"));
          }
          absl::Status ok = s->CheckKey(session, k.handle, KekName(s->label_, k.id));
          if (ok.ok()) return k;
          Log(LogLevel::kWarning, "kek_candidate_refused",
              {{"kek", KekName(s->label_, k.id)}, {"error", std::string(ok.message())}});
          if (first_refusal.ok()) first_refusal = ok;
        }
        if (!first_refusal.ok()) return first_refusal;
        return absl::NotFoundError(absl::StrCat(
            "pkcs11 ", s->token_description_, ": no key labelled \"", s->label_,
            "\" has an 8-byte generation id (create one with offload_server --kek_pkcs11_create)"));
      }));
  const std::string name = KekName(s->label_, best.id);
  absl::MutexLock lock(&state->mu);
  auto& slot = state->keks[name];
  if (slot == nullptr) slot = std::make_shared<Pkcs11Kek>(state->session, best.handle, name);
  return slot;
}

absl::StatusOr<std::shared_ptr<const Kek>> Pkcs11Token::Resolve(absl::string_view name) {
  const std::shared_ptr<internal::Pkcs11TokenState>& state = state_;
  {
    absl::MutexLock lock(&state->mu);
    if (auto it = state->keks.find(name); it != state->keks.end()) return it->second;
  }
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, kNamePrefix)) {
    return absl::NotFoundError(absl::StrCat("not a pkcs11 KEK name: ", name));
  }
  const size_t slash = rest.rfind('/');
  if (slash == absl::string_view::npos) {
    return absl::NotFoundError(absl::StrCat("not a pkcs11 KEK name: ", name));
  }
  const absl::string_view label = rest.substr(0, slash);
  const absl::string_view id_hex = rest.substr(slash + 1);
  if (!ValidLabel(label) || id_hex.size() % 2 != 0 ||
      !std::all_of(id_hex.begin(), id_hex.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::NotFoundError(absl::StrCat("not a pkcs11 KEK name: ", name));
  }
  const std::string id_bytes = absl::HexStringToBytes(id_hex);
  const std::vector<uint8_t> id(id_bytes.begin(), id_bytes.end());
  internal::Pkcs11Session* s = state->session.get();
  using Found = internal::Pkcs11Session::FoundKey;
  OFFLOAD_ASSIGN_OR_RETURN(
      Found key, s->WithSession([&](CK_SESSION_HANDLE session) -> absl::StatusOr<Found> {
        OFFLOAD_ASSIGN_OR_RETURN(std::vector<Found> keys, s->FindKeys(session, label, &id));
        if (keys.empty()) {
          return absl::NotFoundError(
              absl::StrCat("pkcs11 ", s->token_description_, " holds no key ", name));
        }
        OFFLOAD_RETURN_IF_ERROR(s->CheckKey(session, keys[0].handle, name));
        return keys[0];
      }));
  absl::MutexLock lock(&state->mu);
  auto& slot = state->keks[std::string(name)];
  if (slot == nullptr) {
    slot = std::make_shared<Pkcs11Kek>(state->session, key.handle, std::string(name));
  }
  return slot;
}

std::string Pkcs11Token::Describe() const {
  const std::shared_ptr<internal::Pkcs11TokenState>& state = state_;
  return absl::StrCat("pkcs11 ", state->session->token_description_, ", label \"",
                      state->session->label_, "\"");
}

absl::StatusOr<std::string> Pkcs11Token::GenerateKek() {
  const std::shared_ptr<internal::Pkcs11TokenState>& state = state_;
  internal::Pkcs11Session* s = state->session.get();
  return s->WithSession([&](CK_SESSION_HANDLE session) -> absl::StatusOr<std::string> {
    using Found = internal::Pkcs11Session::FoundKey;
    OFFLOAD_ASSIGN_OR_RETURN(std::vector<Found> keys, s->FindKeys(session, s->label_, nullptr));
    uint64_t generation = 0;
    for (const Found& k : keys) {
      if (k.id.size() != kGenerationIdSize) continue;
      uint64_t g = 0;
      for (uint8_t b : k.id) g = (g << 8) | b;
      generation = std::max(generation, g);
    }
    ++generation;
    std::vector<uint8_t> id(kGenerationIdSize);
    for (int i = 7; i >= 0; --i, generation >>= 8) id[i] = static_cast<uint8_t>(generation);

    CK_OBJECT_CLASS klass = CKO_SECRET_KEY;
    CK_KEY_TYPE type = CKK_AES;
    CK_ULONG value_len = 32;
    CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
    CK_ATTRIBUTE tmpl[] = {
        {CKA_CLASS, &klass, sizeof(klass)},
        {CKA_KEY_TYPE, &type, sizeof(type)},
        {CKA_VALUE_LEN, &value_len, sizeof(value_len)},
        {CKA_TOKEN, &yes, sizeof(yes)},
        {CKA_PRIVATE, &yes, sizeof(yes)},
        {CKA_SENSITIVE, &yes, sizeof(yes)},
        {CKA_EXTRACTABLE, &no, sizeof(no)},
        {CKA_ENCRYPT, &yes, sizeof(yes)},
        {CKA_DECRYPT, &yes, sizeof(yes)},
        {CKA_WRAP, &no, sizeof(no)},
        {CKA_UNWRAP, &no, sizeof(no)},
        {CKA_LABEL, const_cast<char*>(s->label_.data()), s->label_.size()},
        {CKA_ID, id.data(), id.size()},
    };
    CK_MECHANISM mechanism = {CKM_AES_KEY_GEN, nullptr, 0};
    CK_OBJECT_HANDLE handle = CK_INVALID_HANDLE;
    const CK_RV rv = s->module_->C_GenerateKey(session, &mechanism, tmpl,
                                              sizeof(tmpl) / sizeof(tmpl[0]), &handle);
    if (rv != CKR_OK) return s->Error("C_GenerateKey", rv);
    return KekName(s->label_, id);
  });
}

}  // namespace offload::keys
