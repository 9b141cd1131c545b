// The C ABI (offload.h) over offload::client::Client. Each entry point checks its arguments,
// calls the C++ client, copies the answer into the caller's buffer, and turns every failure
// (including an escaping C++ exception) into a status code plus a thread-local message.
#include "client/c/offload.h"

#include <sodium.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/credentials.h"

struct offload_client {
  std::unique_ptr<offload::client::Client> impl;
};

namespace {

thread_local std::string last_error;

offload_status_t Fail(offload_status_t status, absl::string_view message) {
  last_error.assign(message.data(), message.size());
  return status;
}

offload_status_t FromStatus(const absl::Status& s) {
  if (s.ok()) return OFFLOAD_OK;
  return Fail(static_cast<offload_status_t>(static_cast<int>(s.code())), s.message());
}

// Runs `fn` (returning offload_status_t) with no exception escaping.
template <typename Fn>
offload_status_t Guard(Fn fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(OFFLOAD_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Fail(OFFLOAD_INTERNAL, absl::StrCat("internal error: ", e.what()));
  } catch (...) {
    return Fail(OFFLOAD_INTERNAL, "internal error");
  }
}

// (pointer, length) input; NULL only with length 0.
bool Bytes(const uint8_t* p, size_t n, absl::string_view* out) {
  if (p == nullptr && n != 0) return false;
  *out = n == 0 ? absl::string_view() : absl::string_view(reinterpret_cast<const char*>(p), n);
  return true;
}

offload_status_t NullArgument(const char* name) {
  return Fail(OFFLOAD_INVALID_ARGUMENT, absl::StrCat(name, ": expected a pointer, got NULL"));
}

#define OFFLOAD_CHECK_CLIENT(c) \
  if ((c) == nullptr || (c)->impl == nullptr) return NullArgument("client")
#define OFFLOAD_CHECK_KEY_ID(k) \
  if ((k) == nullptr) return NullArgument("key_id")
#define OFFLOAD_INPUT(name, p, n, view)                                                     \
  absl::string_view view;                                                                   \
  if (!Bytes((p), (n), &view)) {                                                            \
    return Fail(OFFLOAD_INVALID_ARGUMENT,                                                   \
                absl::StrCat(name, ": expected a pointer for ", (n), " bytes, got NULL"));  \
  }

// The caller-buffer protocol: copies `value` to `out` (room `*out_len`), or says the size needed.
offload_status_t Output(absl::string_view name, absl::string_view value, uint8_t* out,
                        size_t* out_len) {
  if (out_len == nullptr) {
    return Fail(OFFLOAD_INVALID_ARGUMENT, absl::StrCat(name, "_len: expected a pointer, got NULL"));
  }
  if (*out_len < value.size() || (out == nullptr && !value.empty())) {
    const size_t room = *out_len;
    *out_len = value.size();
    return Fail(OFFLOAD_BUFFER_TOO_SMALL, absl::StrCat(name, ": expected room for ", value.size(),
                                                       " bytes, got ", room));
  }
  if (!value.empty()) std::memcpy(out, value.data(), value.size());
  *out_len = value.size();
  return OFFLOAD_OK;
}

void Wipe(std::string* s) {
  if (!s->empty()) sodium_memzero(s->data(), s->size());
}

// The options struct as this library knows it (offload.h: fields past the caller's struct_size
// read as zero; fields past ours must be zero). The first published layout ends at bearer_token.
constexpr size_t kOptionsSizeV1 =
    offsetof(offload_client_options_t, bearer_token) + sizeof(const char*);
// A struct_size beyond this is taken for an unset field rather than scanned for zeros (for the
// stats struct too: a larger one is refused rather than zeroed that far).
constexpr size_t kOptionsSizeMax = 4096;
constexpr uint32_t kKnownFlags = OFFLOAD_CLIENT_TLS | OFFLOAD_CLIENT_NO_VERIFY_MEMO |
                                 OFFLOAD_CLIENT_DERIVE_MEMO | OFFLOAD_CLIENT_OPEN_MEMO;

offload_status_t CopyOptions(const offload_client_options_t* in, offload_client_options_t* out) {
  if (in == nullptr) return NullArgument("options");
  const size_t size = in->struct_size;
  if (size < kOptionsSizeV1 || size > kOptionsSizeMax) {
    return Fail(OFFLOAD_INVALID_ARGUMENT,
                absl::StrCat("struct_size: expected sizeof(offload_client_options_t) (", 
                             sizeof(offload_client_options_t), " for this library; at least ",
                             kOptionsSizeV1, "), got ", size,
                             " (set it, or call offload_client_options_init)"));
  }
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, in, std::min(size, sizeof(*out)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (size_t i = sizeof(*out); i < size; ++i) {
    if (bytes[i] != 0) {
      return Fail(OFFLOAD_INVALID_ARGUMENT,
                  absl::StrCat("struct_size: this library knows the first ", sizeof(*out),
                               " bytes of offload_client_options_t, and a newer field (byte ", i,
                               " of ", size, ") is set"));
    }
  }
  if ((out->flags & ~kKnownFlags) != 0) {
    return Fail(OFFLOAD_INVALID_ARGUMENT,
                absl::StrCat("flags: expected OFFLOAD_CLIENT_* bits (0x", absl::Hex(kKnownFlags),
                             "), got 0x", absl::Hex(out->flags)));
  }
  return OFFLOAD_OK;
}

std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

// The shared part of both create functions: `options` made, `*out` set on success.
offload_status_t MakeClient(offload::client::ClientOptions options, offload_client_t** out) {
  auto client = offload::client::Client::Create(std::move(options));
  if (!client.ok()) return FromStatus(client.status());
  auto handle = std::make_unique<offload_client>();
  handle->impl = std::move(*client);
  *out = handle.release();
  return OFFLOAD_OK;
}

offload_status_t KeyInfoOut(const absl::StatusOr<offload::v1::KeyInfo>& info, uint8_t* public_key,
                            size_t* public_key_len) {
  if (!info.ok()) return FromStatus(info.status());
  if (public_key_len == nullptr) return OFFLOAD_OK;  // not wanted
  std::string pk;
  for (const auto& v : info->versions()) {
    if (v.version() == info->current_version()) pk = v.public_key();
  }
  return Output("public_key", pk, public_key, public_key_len);
}

offload_memo_stats_t MemoStatsOut(const offload::client::MemoStats& m) {
  offload_memo_stats_t out;
  out.hits = static_cast<uint64_t>(m.hits);
  out.misses = static_cast<uint64_t>(m.misses);
  out.inserts = static_cast<uint64_t>(m.inserts);
  out.evictions = static_cast<uint64_t>(m.evictions);
  out.expired = static_cast<uint64_t>(m.expired);
  out.dropped = static_cast<uint64_t>(m.dropped);
  out.entries = static_cast<uint64_t>(m.entries);
  out.bytes = static_cast<uint64_t>(m.bytes);
  out.capacity_bytes = static_cast<uint64_t>(m.capacity_bytes);
  return out;
}

}  // namespace

extern "C" {

const char* offload_last_error(void) { return last_error.c_str(); }

const char* offload_status_name(offload_status_t status) {
  switch (status) {
    case OFFLOAD_OK: return "OK";
    case OFFLOAD_CANCELLED: return "CANCELLED";
    case OFFLOAD_UNKNOWN: return "UNKNOWN";
    case OFFLOAD_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case OFFLOAD_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case OFFLOAD_NOT_FOUND: return "NOT_FOUND";
    case OFFLOAD_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case OFFLOAD_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case OFFLOAD_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case OFFLOAD_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case OFFLOAD_ABORTED: return "ABORTED";
    case OFFLOAD_OUT_OF_RANGE: return "OUT_OF_RANGE";
    case OFFLOAD_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case OFFLOAD_INTERNAL: return "INTERNAL";
    case OFFLOAD_UNAVAILABLE: return "UNAVAILABLE";
    case OFFLOAD_DATA_LOSS: return "DATA_LOSS";
    case OFFLOAD_UNAUTHENTICATED: return "UNAUTHENTICATED";
    case OFFLOAD_BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
  }
  return "UNKNOWN_STATUS";
}

offload_status_t offload_client_create(const char* endpoints, uint32_t timeout_ms,
                                       offload_client_t** out) {
  return Guard([&]() -> offload_status_t {
    if (endpoints == nullptr) return NullArgument("endpoints");
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
    offload::client::ClientOptions options;
    options.endpoints = endpoints;
    if (timeout_ms != 0) options.timeout = absl::Milliseconds(timeout_ms);
    return MakeClient(std::move(options), out);
  });
}

void offload_client_options_init(offload_client_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

offload_status_t offload_client_create_with_options(const offload_client_options_t* options,
                                                    offload_client_t** out) {
  return Guard([&]() -> offload_status_t {
    if (out == nullptr) return NullArgument("out");
    *out = nullptr;
    offload_client_options_t o;
    if (offload_status_t s = CopyOptions(options, &o); s != OFFLOAD_OK) return s;
    if (o.endpoints == nullptr) return NullArgument("endpoints");
    offload::client::ClientOptions co;
    co.endpoints = o.endpoints;
    if (o.timeout_ms != 0) co.timeout = absl::Milliseconds(o.timeout_ms);
    offload::client::TlsFiles tls;
    tls.ca_file = Str(o.tls_ca_file);
    tls.ca_pem = Str(o.tls_ca_pem);
    tls.cert_file = Str(o.tls_cert_file);
    tls.cert_pem = Str(o.tls_cert_pem);
    tls.key_file = Str(o.tls_key_file);
    tls.key_pem = Str(o.tls_key_pem);
    co.tls_server_name = Str(o.tls_server_name);
    const bool use_tls = (o.flags & OFFLOAD_CLIENT_TLS) != 0 || !tls.ca_file.empty() ||
                         !tls.ca_pem.empty() || !tls.cert_file.empty() ||
                         !tls.cert_pem.empty() || !tls.key_file.empty() ||
                         !tls.key_pem.empty() || !co.tls_server_name.empty();
    if (use_tls) {
      auto credentials = offload::client::MakeTlsCredentials(tls);
      Wipe(&tls.key_pem);
      if (!credentials.ok()) return FromStatus(credentials.status());
      co.credentials = *std::move(credentials);
    }
    co.bearer_token = Str(o.bearer_token);
    // The memos: 0 bytes is the C++ default; a memo asked for without a maximum age is refused
    // by Client::Create (INVALID_ARGUMENT naming the C++ option, which names the same field).
    if ((o.flags & OFFLOAD_CLIENT_NO_VERIFY_MEMO) != 0) {
      co.verify_memo_bytes = 0;
    } else if (o.verify_memo_bytes != 0) {
      co.verify_memo_bytes = o.verify_memo_bytes;
    }
    co.derive_memo = (o.flags & OFFLOAD_CLIENT_DERIVE_MEMO) != 0;
    if (o.derive_memo_bytes != 0) co.derive_memo_bytes = o.derive_memo_bytes;
    co.derive_memo_max_age = absl::Milliseconds(o.derive_memo_max_age_ms);
    co.open_memo = (o.flags & OFFLOAD_CLIENT_OPEN_MEMO) != 0;
    if (o.open_memo_bytes != 0) co.open_memo_bytes = o.open_memo_bytes;
    co.open_memo_max_age = absl::Milliseconds(o.open_memo_max_age_ms);
    if (co.derive_memo && o.derive_memo_max_age_ms == 0) {
      return Fail(OFFLOAD_INVALID_ARGUMENT,
                  "derive_memo_max_age_ms: expected > 0 with OFFLOAD_CLIENT_DERIVE_MEMO (the "
                  "maximum age of an entry is the caller's to give), got 0");
    }
    if (co.open_memo && o.open_memo_max_age_ms == 0) {
      return Fail(OFFLOAD_INVALID_ARGUMENT,
                  "open_memo_max_age_ms: expected > 0 with OFFLOAD_CLIENT_OPEN_MEMO (the "
                  "maximum age of an entry is the caller's to give), got 0");
    }
    const offload_status_t s = MakeClient(std::move(co), out);
    Wipe(&co.bearer_token);  // moved from: normally empty already
    return s;
  });
}

offload_status_t offload_client_set_token(offload_client_t* client, const char* token) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    const absl::string_view t = token == nullptr ? absl::string_view() : absl::string_view(token);
    if (!t.empty()) {
      if (absl::Status s = offload::client::CheckBearerToken("token", t); !s.ok()) {
        return FromStatus(s);
      }
    }
    return FromStatus(client->impl->SetBearerToken(t));
  });
}

offload_status_t offload_client_get_stats(offload_client_t* client,
                                          offload_client_stats_t* stats) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    if (stats == nullptr) return NullArgument("stats");
    const uint64_t size = stats->struct_size;
    if (size < sizeof(uint64_t) || size > kOptionsSizeMax) {
      return Fail(OFFLOAD_INVALID_ARGUMENT,
                  absl::StrCat("struct_size: expected sizeof(offload_client_stats_t) (",
                               sizeof(offload_client_stats_t), " for this library), got ", size));
    }
    const offload::client::ClientStats s = client->impl->Stats();
    offload_client_stats_t out;
    std::memset(&out, 0, sizeof(out));
    out.calls = static_cast<uint64_t>(s.calls);
    out.rpcs = static_cast<uint64_t>(s.rpcs);
    out.batch_rpcs = static_cast<uint64_t>(s.batch_rpcs);
    out.retries = static_cast<uint64_t>(s.retries);
    out.failed_calls = static_cast<uint64_t>(s.failed_calls);
    out.auto_batches = static_cast<uint64_t>(s.auto_batches);
    out.auto_batched_items = static_cast<uint64_t>(s.auto_batched_items);
    out.retry_info_waits = static_cast<uint64_t>(s.retry_info_waits);
    out.memo_bytes_not_sent = static_cast<uint64_t>(s.memo_bytes_not_sent);
    out.memo_bytes_not_received = static_cast<uint64_t>(s.memo_bytes_not_received);
    out.verify_memo = MemoStatsOut(s.verify_memo);
    out.derive_memo = MemoStatsOut(s.derive_memo);
    out.open_memo = MemoStatsOut(s.open_memo);
    // Whole fields only, after struct_size; beyond this library's struct: zeros.
    const size_t known =
        static_cast<size_t>(std::min<uint64_t>(size, sizeof(out))) / sizeof(uint64_t) *
        sizeof(uint64_t);
    auto* dst = reinterpret_cast<unsigned char*>(stats);
    const auto* src = reinterpret_cast<const unsigned char*>(&out);
    std::memcpy(dst + sizeof(uint64_t), src + sizeof(uint64_t), known - sizeof(uint64_t));
    if (size > sizeof(out)) {
      std::memset(dst + sizeof(out), 0, static_cast<size_t>(size) - sizeof(out));
    }
    return OFFLOAD_OK;
  });
}

offload_status_t offload_client_reset(offload_client_t* client) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    client->impl->ResetMemos();
    return OFFLOAD_OK;
  });
}

void offload_client_destroy(offload_client_t* client) {
  try {
    delete client;
  } catch (...) {
  }
}

offload_status_t offload_key_create(offload_client_t* client, const char* key_id,
                                    offload_key_type_t type, uint8_t* public_key,
                                    size_t* public_key_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    auto info =
        client->impl->CreateKey(key_id, static_cast<offload::v1::KeyType>(static_cast<int>(type)));
    return KeyInfoOut(info, public_key, public_key_len);
  });
}

offload_status_t offload_key_import(offload_client_t* client, const char* key_id,
                                    offload_key_type_t type, const uint8_t* secret,
                                    size_t secret_len, uint8_t* public_key,
                                    size_t* public_key_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("secret", secret, secret_len, s);
    auto info = client->impl->ImportKey(
        key_id, static_cast<offload::v1::KeyType>(static_cast<int>(type)), s);
    return KeyInfoOut(info, public_key, public_key_len);
  });
}

offload_status_t offload_key_schedule_deletion(offload_client_t* client, const char* key_id,
                                               uint64_t wait_seconds,
                                               int64_t* deletion_unix_seconds) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    const absl::Duration wait = absl::Seconds(static_cast<int64_t>(
        std::min<uint64_t>(wait_seconds, std::numeric_limits<int64_t>::max())));
    auto r = client->impl->DeleteKey(key_id, wait);
    if (!r.ok()) return FromStatus(r.status());
    if (deletion_unix_seconds != nullptr) *deletion_unix_seconds = r->deletion_unix_seconds();
    return OFFLOAD_OK;
  });
}

offload_status_t offload_key_delete(offload_client_t* client, const char* key_id) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    return FromStatus(client->impl->DeleteKey(key_id));
  });
}

offload_status_t offload_key_cancel_deletion(offload_client_t* client, const char* key_id) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    return FromStatus(client->impl->CancelKeyDeletion(key_id).status());
  });
}

offload_status_t offload_key_disable(offload_client_t* client, const char* key_id) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    return FromStatus(client->impl->DisableKey(key_id).status());
  });
}

offload_status_t offload_key_enable(offload_client_t* client, const char* key_id) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    return FromStatus(client->impl->EnableKey(key_id).status());
  });
}

offload_status_t offload_verify(offload_client_t* client, const uint8_t* public_key,
                                size_t public_key_len, const uint8_t* message, size_t message_len,
                                const uint8_t* signature, size_t signature_len, int* valid) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    if (valid == nullptr) return NullArgument("valid");
    OFFLOAD_INPUT("public_key", public_key, public_key_len, pk);
    OFFLOAD_INPUT("message", message, message_len, msg);
    OFFLOAD_INPUT("signature", signature, signature_len, sig);
    auto r = client->impl->Verify(pk, msg, sig);
    if (!r.ok()) return FromStatus(r.status());
    *valid = r->valid() ? 1 : 0;
    return OFFLOAD_OK;
  });
}

offload_status_t offload_sign(offload_client_t* client, const char* key_id, const uint8_t* message,
                              size_t message_len, uint8_t* signature, size_t* signature_len,
                              uint8_t* public_key) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("message", message, message_len, msg);
    auto r = client->impl->Sign(key_id, msg);
    if (!r.ok()) return FromStatus(r.status());
    offload_status_t s = Output("signature", r->signature(), signature, signature_len);
    if (s == OFFLOAD_OK && public_key != nullptr) {
      if (r->public_key().size() != OFFLOAD_ED25519_PUBLIC_KEY_BYTES) {
        return Fail(OFFLOAD_INTERNAL, "sign answer: expected a 32-byte public key");
      }
      std::memcpy(public_key, r->public_key().data(), OFFLOAD_ED25519_PUBLIC_KEY_BYTES);
    }
    return s;
  });
}

offload_status_t offload_derive(offload_client_t* client, const char* key_id,
                                const uint8_t* peer_public_key, size_t peer_len,
                                offload_derive_output_t output, uint8_t* shared_key,
                                size_t* shared_key_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("peer_public_key", peer_public_key, peer_len, peer);
    if (output != OFFLOAD_DERIVE_RAW && output != OFFLOAD_DERIVE_BOX_BEFORENM) {
      return Fail(OFFLOAD_INVALID_ARGUMENT,
                  absl::StrCat("output: expected OFFLOAD_DERIVE_RAW (1) or "
                               "OFFLOAD_DERIVE_BOX_BEFORENM (2), got ", static_cast<int>(output)));
    }
    auto r = client->impl->Derive(key_id, peer,
                                  static_cast<offload::v1::DeriveOutput>(static_cast<int>(output)));
    if (!r.ok()) return FromStatus(r.status());
    offload_status_t s = Output("shared_key", r->shared_key(), shared_key, shared_key_len);
    Wipe(r->mutable_shared_key());
    return s;
  });
}

offload_status_t offload_box_seal(offload_client_t* client, const char* key_id,
                                  const uint8_t* peer_public_key, size_t peer_len,
                                  const uint8_t* nonce, size_t nonce_len, const uint8_t* plaintext,
                                  size_t plaintext_len, uint8_t* ciphertext,
                                  size_t* ciphertext_len, uint8_t* nonce_out) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("peer_public_key", peer_public_key, peer_len, peer);
    OFFLOAD_INPUT("nonce", nonce, nonce_len, n);
    OFFLOAD_INPUT("plaintext", plaintext, plaintext_len, pt);
    auto r = client->impl->BoxSeal(key_id, peer, pt, n);
    if (!r.ok()) return FromStatus(r.status());
    offload_status_t s = Output("ciphertext", r->ciphertext(), ciphertext, ciphertext_len);
    if (s == OFFLOAD_OK && nonce_out != nullptr) {
      if (r->nonce().size() != OFFLOAD_BOX_NONCE_BYTES) {
        return Fail(OFFLOAD_INTERNAL, "box seal answer: expected a 24-byte nonce");
      }
      std::memcpy(nonce_out, r->nonce().data(), OFFLOAD_BOX_NONCE_BYTES);
    }
    return s;
  });
}

offload_status_t offload_box_open(offload_client_t* client, const char* key_id,
                                  const uint8_t* peer_public_key, size_t peer_len,
                                  const uint8_t* nonce, size_t nonce_len,
                                  const uint8_t* ciphertext, size_t ciphertext_len,
                                  uint8_t* plaintext, size_t* plaintext_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("peer_public_key", peer_public_key, peer_len, peer);
    OFFLOAD_INPUT("nonce", nonce, nonce_len, n);
    OFFLOAD_INPUT("ciphertext", ciphertext, ciphertext_len, ct);
    auto r = client->impl->BoxOpen(key_id, peer, n, ct);
    if (!r.ok()) return FromStatus(r.status());
    offload_status_t s = Output("plaintext", r->plaintext(), plaintext, plaintext_len);
    Wipe(r->mutable_plaintext());
    return s;
  });
}

offload_status_t offload_aead_seal(offload_client_t* client, const char* key_id,
                                   const uint8_t* plaintext, size_t plaintext_len,
                                   const uint8_t* associated_data, size_t ad_len,
                                   uint8_t* envelope, size_t* envelope_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("plaintext", plaintext, plaintext_len, pt);
    OFFLOAD_INPUT("associated_data", associated_data, ad_len, ad);
    auto r = client->impl->AeadSeal(key_id, pt, ad);
    if (!r.ok()) return FromStatus(r.status());
    return Output("envelope", r->envelope(), envelope, envelope_len);
  });
}

offload_status_t offload_aead_open(offload_client_t* client, const char* key_id,
                                   const uint8_t* envelope, size_t envelope_len,
                                   const uint8_t* associated_data, size_t ad_len,
                                   uint8_t* plaintext, size_t* plaintext_len) {
  return Guard([&]() -> offload_status_t {
    OFFLOAD_CHECK_CLIENT(client);
    OFFLOAD_CHECK_KEY_ID(key_id);
    OFFLOAD_INPUT("envelope", envelope, envelope_len, env);
    OFFLOAD_INPUT("associated_data", associated_data, ad_len, ad);
    auto r = client->impl->AeadOpen(key_id, env, ad);
    if (!r.ok()) return FromStatus(r.status());
    offload_status_t s = Output("plaintext", r->plaintext(), plaintext, plaintext_len);
    Wipe(r->mutable_plaintext());
    return s;
  });
}

}  // extern "C"
