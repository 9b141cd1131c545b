/* offload_client.c - see offload_client.h. No malloc, no stdio, no recursion; every loop is
 * bounded by a length the caller or the protocol fixes (or by OFFLOAD_MEMO_SLOTS). */
#include "offload_client.h"

#include <string.h>

#include <pb_decode.h>
#include <pb_encode.h>

#if OFFLOAD_LOCAL_BOX
#include <sodium.h>
#endif

#define PATH_DERIVE "/offload.v1.X25519Service/Derive"
#define PATH_BOX_SEAL "/offload.v1.BoxService/Seal"
#define PATH_BOX_OPEN "/offload.v1.BoxService/Open"
#define PATH_VERIFY "/offload.v1.Ed25519Service/Verify"

/* Connect code names, in canonical order: kConnectCodes[i] is code i + 1. */
static const char* const kConnectCodes[] = {
    "canceled",           "unknown",        "invalid_argument",  "deadline_exceeded",
    "not_found",          "already_exists", "permission_denied", "resource_exhausted",
    "failed_precondition", "aborted",       "out_of_range",      "unimplemented",
    "internal",           "unavailable",    "data_loss",         "unauthenticated"};
#define CONNECT_CODE_COUNT (sizeof(kConnectCodes) / sizeof(kConnectCodes[0]))

void offload_wipe(void* p, size_t len) {
  volatile uint8_t* v = (volatile uint8_t*)p;
  while (len--) *v++ = 0;
}

const char* offload_status_name(offload_status_t status) {
  switch (status) {
    case OFFLOAD_OK: return "ok";
    case OFFLOAD_ERR_ARGUMENT: return "argument";
    case OFFLOAD_ERR_BUFFER_TOO_SMALL: return "buffer_too_small";
    case OFFLOAD_ERR_ENCODE: return "encode";
    case OFFLOAD_ERR_TRANSPORT: return "transport";
    case OFFLOAD_ERR_HTTP_STATUS: return "http_status";
    case OFFLOAD_ERR_DECODE: return "decode";
    case OFFLOAD_ERR_RESPONSE: return "response";
    default: break;
  }
  if (status > 100 && status <= 100 + (int)CONNECT_CODE_COUNT) {
    return kConnectCodes[status - 101];
  }
  return "?";
}

offload_status_t offload_status_from_connect_code(const char* code, size_t code_len) {
  size_t i;
  for (i = 0; i < CONNECT_CODE_COUNT; ++i) {
    if (strlen(kConnectCodes[i]) == code_len && memcmp(kConnectCodes[i], code, code_len) == 0) {
      return (offload_status_t)(101 + i);
    }
  }
  return OFFLOAD_ERR_UNKNOWN;
}

/* Index just past the JSON string whose opening quote is at `i` (escapes skipped), or `len` if
 * it does not close within the body. */
static size_t skip_json_string(const uint8_t* b, size_t len, size_t i) {
  for (++i; i < len; ++i) {
    if (b[i] == '\\') {
      ++i;
    } else if (b[i] == '"') {
      return i + 1;
    }
  }
  return len;
}

static size_t skip_ws(const uint8_t* b, size_t len, size_t i) {
  while (i < len && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')) ++i;
  return i;
}

/* Copies the JSON string at b[start..end) (quotes excluded) into `out`, NUL-terminated and
 * truncated to `cap` - 1 bytes; escapes become the escaped character, \uXXXX becomes '?'. */
static void copy_json_string(const uint8_t* b, size_t start, size_t end, char* out, size_t cap) {
  size_t n = 0;
  size_t i;
  if (cap == 0) return;
  for (i = start; i < end && n + 1 < cap; ++i) {
    uint8_t ch = b[i];
    if (ch == '\\' && i + 1 < end) {
      ++i;
      switch (b[i]) {
        case 'n': case 'r': case 't': ch = ' '; break;
        case 'u': ch = '?'; i = (i + 4 < end) ? i + 4 : end - 1; break;
        default: ch = b[i]; break;
      }
    }
    out[n++] = (char)ch;
  }
  out[n] = '\0';
}

offload_status_t offload_parse_connect_error(const uint8_t* body, size_t len, char* message,
                                             size_t message_cap) {
  /* One pass over the top-level object: a string followed by ':' is a key; when the key is
   * "code" or "message" and the value is a string, keep its bounds. Nested values are skipped by
   * depth, so "code" keys inside "details" are not taken. */
  size_t code_start = 0, code_end = 0, msg_start = 0, msg_end = 0;
  bool have_code = false, have_msg = false;
  int depth = 0;
  size_t i = 0;
  if (message != NULL && message_cap > 0) message[0] = '\0';
  if (body == NULL) return OFFLOAD_ERR_HTTP_STATUS;
  while (i < len) {
    uint8_t ch = body[i];
    if (ch == '{' || ch == '[') {
      ++depth;
      ++i;
    } else if (ch == '}' || ch == ']') {
      --depth;
      ++i;
    } else if (ch == '"') {
      size_t key_start = i + 1;
      size_t key_end_q = skip_json_string(body, len, i); /* past the closing quote */
      size_t j;
      if (key_end_q >= len) break;
      j = skip_ws(body, len, key_end_q);
      if (depth == 1 && j < len && body[j] == ':') {
        size_t key_len = key_end_q - 1 - key_start;
        size_t v = skip_ws(body, len, j + 1);
        if (v < len && body[v] == '"') {
          size_t v_end_q = skip_json_string(body, len, v);
          bool closed = v_end_q <= len && body[v_end_q - 1] == '"' && v_end_q - 1 > v;
          bool nonempty = closed && v_end_q - 1 > v + 1;
          if (key_len == 4 && memcmp(body + key_start, "code", 4) == 0 && nonempty) {
            code_start = v + 1;
            code_end = v_end_q - 1;
            have_code = true;
          } else if (key_len == 7 && memcmp(body + key_start, "message", 7) == 0) {
            msg_start = v + 1;
            msg_end = closed ? v_end_q - 1 : len; /* a truncated body keeps what it has */
            have_msg = true;
          }
          i = v_end_q;
          continue;
        }
        i = v;
        continue;
      }
      i = key_end_q;
    } else {
      ++i;
    }
  }
  if (have_msg && message != NULL) copy_json_string(body, msg_start, msg_end, message, message_cap);
  if (!have_code) return OFFLOAD_ERR_HTTP_STATUS;
  return offload_status_from_connect_code((const char*)body + code_start, code_end - code_start);
}

offload_status_t offload_client_init(offload_client_t* client, offload_transport_fn transport,
                                     void* ctx, uint8_t* buf, size_t buf_len) {
  if (client == NULL || transport == NULL || buf == NULL || buf_len < 64) {
    return OFFLOAD_ERR_ARGUMENT;
  }
  offload_wipe(client, sizeof *client);
  client->transport = transport;
  client->transport_ctx = ctx;
  client->buf = buf;
  client->buf_len = buf_len;
  client->memo_max_age_ms = OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS;
#if OFFLOAD_LOCAL_BOX
  /* sodium_init() is idempotent; it picks the implementations and readies randombytes. */
  client->local_box = sodium_init() >= 0;
#endif
  return OFFLOAD_OK;
}

/* --- the derive memo ------------------------------------------------------------------------
 * OFFLOAD_MEMO_SLOTS fixed slots in the client. memo_lru[0 .. memo_count) lists the slots in
 * use, least recently used first: a hit moves its index to the end, a new entry goes at the end,
 * and when every slot is in use the one at memo_lru[0] is wiped and reused. Every lookup first
 * wipes the entries that reached the maximum age. A slot is wiped whenever it is let go. */

/* The fields an entry is keyed by, compared one by one. */
typedef struct memo_key {
  const char* key_id;
  size_t key_id_len;
  uint32_t key_version;
  bool box_output;
  const uint8_t* peer_public_key;
} memo_key_t;

/* The memo is consulted: slots compiled in, a clock set, a maximum age over 0. */
static bool memo_in_use(const offload_client_t* client) {
#if OFFLOAD_MEMO_SLOTS > 0
  return client->clock != NULL && client->memo_max_age_ms > 0;
#else
  (void)client;
  return false;
#endif
}

#if OFFLOAD_MEMO_SLOTS > 0
/* Wipes the slot at position `pos` of memo_lru and closes the gap. */
static void memo_release(offload_client_t* client, size_t pos) {
  offload_memo_slot_t* slot = &client->memo[client->memo_lru[pos]];
  offload_wipe(slot, sizeof *slot);
  memmove(&client->memo_lru[pos], &client->memo_lru[pos + 1], client->memo_count - pos - 1);
  --client->memo_count;
  client->memo_lru[client->memo_count] = 0;
}

/* Wipes every entry of age >= the maximum age at `now` (or stamped after `now`: a clock that
 * went back). */
static void memo_sweep(offload_client_t* client, uint64_t now) {
  size_t pos = 0;
  while (pos < client->memo_count) {
    const offload_memo_slot_t* slot = &client->memo[client->memo_lru[pos]];
    if (now < slot->stamp_ms || now - slot->stamp_ms >= client->memo_max_age_ms) {
      memo_release(client, pos);
      ++client->stats.expired;
    } else {
      ++pos;
    }
  }
}

static bool memo_matches(const offload_memo_slot_t* slot, const memo_key_t* key) {
  return slot->key_id_len == key->key_id_len &&
         memcmp(slot->key_id, key->key_id, key->key_id_len) == 0 &&
         slot->key_version_asked == key->key_version &&
         slot->box_output == (key->box_output ? 1 : 0) &&
         memcmp(slot->peer_public_key, key->peer_public_key, OFFLOAD_X25519_KEY_SIZE) == 0;
}

/* The position in memo_lru of the entry for `key`, or -1. */
static int memo_find(const offload_client_t* client, const memo_key_t* key) {
  size_t pos;
  for (pos = 0; pos < client->memo_count; ++pos) {
    if (memo_matches(&client->memo[client->memo_lru[pos]], key)) return (int)pos;
  }
  return -1;
}

/* Moves the entry at position `pos` to the newest end; returns its slot. */
static offload_memo_slot_t* memo_touch(offload_client_t* client, size_t pos) {
  uint8_t index = client->memo_lru[pos];
  memmove(&client->memo_lru[pos], &client->memo_lru[pos + 1], client->memo_count - pos - 1);
  client->memo_lru[client->memo_count - 1] = index;
  return &client->memo[index];
}

/* Remembers `shared_key` (from `key_version_used`) for `key`, stamped `now`, at the newest end;
 * evicts the least recently used entry when every slot is taken. Returns the slot. */
static offload_memo_slot_t* memo_insert(offload_client_t* client, const memo_key_t* key,
                                        const uint8_t* shared_key, uint32_t key_version_used,
                                        uint64_t now) {
  offload_memo_slot_t* slot = NULL;
  int pos = memo_find(client, key);
  size_t i;
  if (pos >= 0) {
    slot = memo_touch(client, (size_t)pos);
  } else {
    if (client->memo_count == OFFLOAD_MEMO_SLOTS) {
      memo_release(client, 0);
      ++client->stats.evictions;
    }
    for (i = 0; i < OFFLOAD_MEMO_SLOTS; ++i) {
      if (!client->memo[i].used) break;
    }
    /* memo_count < OFFLOAD_MEMO_SLOTS here, so a slot is free: i < OFFLOAD_MEMO_SLOTS. */
    slot = &client->memo[i];
    client->memo_lru[client->memo_count++] = (uint8_t)i;
    slot->used = 1;
    slot->key_id_len = (uint8_t)key->key_id_len;
    memcpy(slot->key_id, key->key_id, key->key_id_len);
    slot->key_version_asked = key->key_version;
    slot->box_output = key->box_output ? 1 : 0;
    memcpy(slot->peer_public_key, key->peer_public_key, OFFLOAD_X25519_KEY_SIZE);
  }
  memcpy(slot->shared_key, shared_key, OFFLOAD_X25519_KEY_SIZE);
  slot->key_version_used = key_version_used;
  slot->stamp_ms = now;
  return slot;
}
#endif /* OFFLOAD_MEMO_SLOTS > 0 */

/* Wipes every entry of `key_id` (the server refused the key). */
static void memo_drop_key(offload_client_t* client, const char* key_id) {
#if OFFLOAD_MEMO_SLOTS > 0
  size_t n = strlen(key_id);
  size_t pos = 0;
  while (pos < client->memo_count) {
    const offload_memo_slot_t* slot = &client->memo[client->memo_lru[pos]];
    if (slot->key_id_len == n && memcmp(slot->key_id, key_id, n) == 0) {
      memo_release(client, pos);
      ++client->stats.dropped;
    } else {
      ++pos;
    }
  }
#else
  (void)client;
  (void)key_id;
#endif
}

void offload_client_reset(offload_client_t* client) {
  if (client == NULL) return;
#if OFFLOAD_MEMO_SLOTS > 0
  offload_wipe(client->memo, sizeof client->memo);
  offload_wipe(client->memo_lru, sizeof client->memo_lru);
  client->memo_count = 0;
#endif
}

offload_status_t offload_client_set_clock(offload_client_t* client, offload_clock_fn clock,
                                          void* ctx) {
  if (client == NULL) return OFFLOAD_ERR_ARGUMENT;
  offload_client_reset(client);
  client->clock = clock;
  client->clock_ctx = clock != NULL ? ctx : NULL;
  return OFFLOAD_OK;
}

offload_status_t offload_client_set_memo_max_age(offload_client_t* client, uint32_t max_age_ms) {
  if (client == NULL) return OFFLOAD_ERR_ARGUMENT;
  client->memo_max_age_ms = max_age_ms;
  if (max_age_ms == 0) offload_client_reset(client);
  return OFFLOAD_OK;
}

offload_status_t offload_client_set_token_provider(offload_client_t* client,
                                                   offload_token_provider_fn provider, void* ctx) {
  if (client == NULL) return OFFLOAD_ERR_ARGUMENT;
  client->token_provider = provider;
  client->token_provider_ctx = provider != NULL ? ctx : NULL;
  return OFFLOAD_OK;
}

static bool is_token68_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/';
}

size_t offload_token_length(const char* token) {
  size_t n = 0;
  if (token == NULL) return 0;
  while (n <= OFFLOAD_TOKEN_MAX_LEN && is_token68_char(token[n])) ++n;
  if (n == 0) return 0;
  while (n <= OFFLOAD_TOKEN_MAX_LEN && token[n] == '=') ++n;
  return (n <= OFFLOAD_TOKEN_MAX_LEN && token[n] == '\0') ? n : 0;
}

/* Copies the NUL-terminated `text` into last_error_message, truncated. */
static void set_error_message(offload_client_t* client, const char* text) {
  size_t n = 0;
  while (n + 1 < sizeof client->last_error_message && text[n] != '\0') {
    client->last_error_message[n] = text[n];
    ++n;
  }
  client->last_error_message[n] = '\0';
}

#define OFFLOAD_STR_(x) #x
#define OFFLOAD_STR(x) OFFLOAD_STR_(x)

offload_status_t offload_client_set_token(offload_client_t* client, const char* token) {
  if (client == NULL) return OFFLOAD_ERR_ARGUMENT;
  if (token != NULL && offload_token_length(token) == 0) {
    const char* why = "bearer token: expected token68 (letters, digits, \"-._~+/\", then \"=\"), "
                      "got another character";
    size_t n = 0;
    while (n <= OFFLOAD_TOKEN_MAX_LEN && token[n] != '\0') ++n;
    if (n == 0) why = "bearer token: expected 1 or more characters, got none";
    if (n > OFFLOAD_TOKEN_MAX_LEN) {
      why = "bearer token: expected at most " OFFLOAD_STR(OFFLOAD_TOKEN_MAX_LEN) " characters, "
            "got more";
    }
    set_error_message(client, why);
    return OFFLOAD_ERR_ARGUMENT;
  }
  client->token = token;
  return OFFLOAD_OK;
}

/* Starts a call: checks the client and clears what the last call left. */
static offload_status_t begin(offload_client_t* client) {
  if (client == NULL || client->transport == NULL || client->buf == NULL) {
    return OFFLOAD_ERR_ARGUMENT;
  }
  client->last_http_status = 0;
  client->last_transport_error = 0;
  client->last_error_message[0] = '\0';
  return OFFLOAD_OK;
}

/* Ends a call: wipes the message structs and the wire buffer, returns `status`. */
static offload_status_t finish(offload_client_t* client, offload_status_t status) {
  /* A call the memo answered (or a box on the device with a remembered key) touched neither:
   * no need to wipe ~4.5 KB again. */
  if (client->wipe_pending) {
    offload_wipe(&client->msg, sizeof client->msg);
    offload_wipe(client->buf, client->buf_len);
    client->wipe_pending = false;
  }
  return status;
}

/* Copies `key_id` into `dst` (capacity OFFLOAD_KEY_ID_MAX_LEN + 1); false if NULL, empty or too
 * long. The character set is the server's to check. */
static bool copy_key_id(char* dst, const char* key_id) {
  size_t n = 0;
  if (key_id == NULL) return false;
  while (n <= OFFLOAD_KEY_ID_MAX_LEN && key_id[n] != '\0') ++n;
  if (n == 0 || n > OFFLOAD_KEY_ID_MAX_LEN) return false;
  memcpy(dst, key_id, n);
  dst[n] = '\0';
  return true;
}

/* A refusal about the key itself (not about one message): the key or version is not found,
 * disabled, pending deletion or retired, or this caller may not use it. */
static bool is_key_refusal(offload_status_t status) {
  return status == OFFLOAD_ERR_NOT_FOUND || status == OFFLOAD_ERR_FAILED_PRECONDITION ||
         status == OFFLOAD_ERR_PERMISSION_DENIED;
}

/* Asks the token provider for a new token after UNAUTHENTICATED; true when it gave one that
 * offload_client_set_token() would take (now the client's token). */
static bool refresh_token(offload_client_t* client) {
  const char* token;
  if (client->token_provider == NULL) return false;
  ++client->stats.token_refreshes;
  token = client->token_provider(client->token_provider_ctx);
  if (token == NULL || offload_token_length(token) == 0) return false;
  client->token = token;
  return true;
}

/* Encodes `req` at the start of the client's buffer, sends it to `path` and decodes a 200 answer
 * into `resp`, or maps the Connect error. `resp_max` is the largest encoded response of this type:
 * the part of the buffer after the request must hold it. `key_id` (NULL for verify) loses its
 * memo entries when the server refuses the key. UNAUTHENTICATED asks the token provider once and
 * sends the same bytes once more. */
static offload_status_t call(offload_client_t* client, const char* path, const char* key_id,
                             const pb_msgdesc_t* req_fields, const void* req,
                             const pb_msgdesc_t* resp_fields, void* resp, size_t resp_max) {
  size_t req_len = 0;
  size_t resp_len = 0;
  int http_status = 0;
  uint8_t* resp_buf;
  size_t resp_cap;
  int rc;
  int attempt;
  offload_transport_request_t request;
  pb_ostream_t os;
  pb_istream_t is;

  if (!pb_get_encoded_size(&req_len, req_fields, req)) return OFFLOAD_ERR_ENCODE;
  if (req_len > client->buf_len || client->buf_len - req_len < resp_max) {
    return OFFLOAD_ERR_BUFFER_TOO_SMALL;
  }
  os = pb_ostream_from_buffer(client->buf, req_len);
  if (!pb_encode(&os, req_fields, req) || os.bytes_written != req_len) return OFFLOAD_ERR_ENCODE;

  resp_buf = client->buf + req_len;
  resp_cap = client->buf_len - req_len;
  request.path = path;
  request.key_id = key_id;
  request.body = client->buf;
  request.body_len = req_len;
  for (attempt = 0;; ++attempt) {
    offload_status_t s;
    request.bearer_token = client->token;
    resp_len = 0;
    http_status = 0;
    ++client->stats.requests;
    rc = client->transport(client->transport_ctx, &request, resp_buf, resp_cap, &resp_len,
                           &http_status);
    if (rc != OFFLOAD_TRANSPORT_OK && rc != OFFLOAD_TRANSPORT_OVERFLOW) {
      client->last_transport_error = rc;
      return OFFLOAD_ERR_TRANSPORT;
    }
    if (resp_len > resp_cap) return OFFLOAD_ERR_TRANSPORT; /* a transport bug; trust nothing */
    client->last_http_status = http_status;
    if (http_status == 200) break;
    s = offload_parse_connect_error(resp_buf, resp_len, client->last_error_message,
                                    sizeof client->last_error_message);
    if (s == OFFLOAD_ERR_UNAUTHENTICATED && attempt == 0 && refresh_token(client)) {
      client->last_http_status = 0;
      client->last_error_message[0] = '\0';
      continue;
    }
    if (key_id != NULL && is_key_refusal(s)) memo_drop_key(client, key_id);
    return s;
  }
  if (rc == OFFLOAD_TRANSPORT_OVERFLOW) return OFFLOAD_ERR_BUFFER_TOO_SMALL;
  is = pb_istream_from_buffer(resp_buf, resp_len);
  if (!pb_decode(&is, resp_fields, resp)) return OFFLOAD_ERR_DECODE;
  return OFFLOAD_OK;
}

/* The length of a key id the client sends (1 to OFFLOAD_KEY_ID_MAX_LEN characters), else 0. */
static size_t key_id_length(const char* key_id) {
  size_t n = 0;
  if (key_id == NULL) return 0;
  while (n <= OFFLOAD_KEY_ID_MAX_LEN && key_id[n] != '\0') ++n;
  return n <= OFFLOAD_KEY_ID_MAX_LEN ? n : 0;
}

/* The shared key of (`key_id`, `key_version`, `box_output`, `peer_public_key`): from the memo
 * when it holds it (no round trip), else from X25519Service/Derive, then remembered. On success
 * `*shared_key` points at the 32 bytes (a memo slot, or the decoded response when the memo is
 * not in use: valid until finish()), `*key_version_used` is the server's version and
 * `*memo_hit` whether a memo (ours or the server's) served it.
 * REQUIRES: begin() ran; `key_id` is 1..64 characters; `peer_public_key` is not NULL. */
static offload_status_t shared_key_of(offload_client_t* client, const char* key_id,
                                      uint32_t key_version, bool box_output,
                                      const uint8_t* peer_public_key, const uint8_t** shared_key,
                                      uint32_t* key_version_used, bool* memo_hit) {
  offload_v1_DeriveRequest* req = &client->msg.derive.req;
  offload_v1_DeriveResponse* resp = &client->msg.derive.resp;
  offload_status_t s;
  const bool remember = memo_in_use(client);
#if OFFLOAD_MEMO_SLOTS > 0
  memo_key_t key;
  key.key_id = key_id;
  key.key_id_len = key_id_length(key_id);
  key.key_version = key_version;
  key.box_output = box_output;
  key.peer_public_key = peer_public_key;
  if (remember) {
    int pos;
    memo_sweep(client, client->clock(client->clock_ctx));
    pos = memo_find(client, &key);
    if (pos >= 0) {
      const offload_memo_slot_t* slot = memo_touch(client, (size_t)pos);
      ++client->stats.hits;
      *shared_key = slot->shared_key;
      *key_version_used = slot->key_version_used;
      *memo_hit = true;
      return OFFLOAD_OK;
    }
    ++client->stats.misses;
  }
#endif
  client->wipe_pending = true; /* the message structs and `buf` will hold secrets */
  memset(req, 0, sizeof *req);
  if (!copy_key_id(req->key_id, key_id)) return OFFLOAD_ERR_ARGUMENT;
  req->key_version = key_version;
  req->peer_public_key.size = OFFLOAD_X25519_KEY_SIZE;
  memcpy(req->peer_public_key.bytes, peer_public_key, OFFLOAD_X25519_KEY_SIZE);
  req->output = box_output ? offload_v1_DeriveOutput_DERIVE_OUTPUT_BOX_BEFORENM
                           : offload_v1_DeriveOutput_DERIVE_OUTPUT_RAW;
  s = call(client, PATH_DERIVE, key_id, offload_v1_DeriveRequest_fields, req,
           offload_v1_DeriveResponse_fields, resp, offload_v1_DeriveResponse_size);
  if (s != OFFLOAD_OK) return s;
  if (resp->shared_key.size != OFFLOAD_X25519_KEY_SIZE) return OFFLOAD_ERR_RESPONSE;
  *shared_key = resp->shared_key.bytes;
  *key_version_used = resp->key_version;
  *memo_hit = resp->memo_hit;
#if OFFLOAD_MEMO_SLOTS > 0
  if (remember) {
    /* Stamped when the answer came: its age counts from then. */
    *shared_key = memo_insert(client, &key, resp->shared_key.bytes, resp->key_version,
                              client->clock(client->clock_ctx))
                      ->shared_key;
  }
#else
  (void)remember;
#endif
  return OFFLOAD_OK;
}

offload_status_t offload_derive_version(offload_client_t* client, const char* key_id,
                                        uint32_t key_version,
                                        const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                        bool box_output,
                                        uint8_t out_shared_key[OFFLOAD_X25519_KEY_SIZE],
                                        uint32_t* out_key_version, bool* memo_hit) {
  const uint8_t* shared = NULL;
  uint32_t version = 0;
  bool hit = false;
  offload_status_t s = begin(client);
  if (s != OFFLOAD_OK) return s;
  if (peer_public_key == NULL || out_shared_key == NULL) return OFFLOAD_ERR_ARGUMENT;
  if (key_id_length(key_id) == 0) return finish(client, OFFLOAD_ERR_ARGUMENT);
  s = shared_key_of(client, key_id, key_version, box_output, peer_public_key, &shared, &version,
                    &hit);
  if (s != OFFLOAD_OK) return finish(client, s);
  memcpy(out_shared_key, shared, OFFLOAD_X25519_KEY_SIZE);
  if (out_key_version != NULL) *out_key_version = version;
  if (memo_hit != NULL) *memo_hit = hit;
  return finish(client, OFFLOAD_OK);
}

offload_status_t offload_derive(offload_client_t* client, const char* key_id,
                                const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                bool box_output, uint8_t out_shared_key[OFFLOAD_X25519_KEY_SIZE],
                                bool* memo_hit) {
  return offload_derive_version(client, key_id, 0, peer_public_key, box_output, out_shared_key,
                                NULL, memo_hit);
}

#if OFFLOAD_LOCAL_BOX
/* Box seal and open on the device: only with libsodium and the memo in use (the box key is
 * remembered; without the memo every box would cost a Derive round trip, no fewer than the
 * server's own Seal and Open). */
static bool box_on_device(const offload_client_t* client) {
  return client->local_box && memo_in_use(client);
}
#endif

offload_status_t offload_box_seal(offload_client_t* client, const char* key_id,
                                  const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                  const uint8_t nonce[OFFLOAD_BOX_NONCE_SIZE],
                                  const uint8_t* plaintext, size_t plaintext_len,
                                  uint8_t* ciphertext, size_t ciphertext_cap,
                                  size_t* ciphertext_len,
                                  uint8_t out_nonce[OFFLOAD_BOX_NONCE_SIZE]) {
  offload_v1_BoxSealRequest* req;
  offload_v1_BoxSealResponse* resp;
  offload_status_t s = begin(client);
  if (s != OFFLOAD_OK) return s;
  if (peer_public_key == NULL || (plaintext == NULL && plaintext_len > 0) || ciphertext == NULL ||
      ciphertext_len == NULL || (nonce == NULL && out_nonce == NULL) ||
      plaintext_len > OFFLOAD_MAX_MESSAGE) {
    return OFFLOAD_ERR_ARGUMENT;
  }
  if (ciphertext_cap < plaintext_len + OFFLOAD_BOX_TAG_SIZE) return OFFLOAD_ERR_BUFFER_TOO_SMALL;
  if (key_id_length(key_id) == 0) return finish(client, OFFLOAD_ERR_ARGUMENT);
#if OFFLOAD_LOCAL_BOX
  if (box_on_device(client)) {
    static const uint8_t kEmpty[1] = {0};
    const uint8_t* box_key = NULL;
    uint32_t version = 0;
    bool hit = false;
    uint8_t picked[OFFLOAD_BOX_NONCE_SIZE];
    const uint8_t* n = nonce;
    s = shared_key_of(client, key_id, 0, true, peer_public_key, &box_key, &version, &hit);
    if (s != OFFLOAD_OK) return finish(client, s);
    if (n == NULL) {
      randombytes_buf(picked, sizeof picked);
      n = picked;
    }
    if (crypto_box_easy_afternm(ciphertext, plaintext_len > 0 ? plaintext : kEmpty,
                                plaintext_len, n, box_key) != 0) {
      return finish(client, OFFLOAD_ERR_INTERNAL);
    }
    *ciphertext_len = plaintext_len + OFFLOAD_BOX_TAG_SIZE;
    if (out_nonce != NULL && out_nonce != n) memcpy(out_nonce, n, OFFLOAD_BOX_NONCE_SIZE);
    return finish(client, OFFLOAD_OK);
  }
#endif
  req = &client->msg.box_seal_req;
  client->wipe_pending = true; /* the message structs and `buf` will hold secrets */
  memset(req, 0, sizeof *req);
  if (!copy_key_id(req->key_id, key_id)) return finish(client, OFFLOAD_ERR_ARGUMENT);
  req->peer_public_key.size = OFFLOAD_X25519_KEY_SIZE;
  memcpy(req->peer_public_key.bytes, peer_public_key, OFFLOAD_X25519_KEY_SIZE);
  if (nonce != NULL) {
    req->nonce.size = OFFLOAD_BOX_NONCE_SIZE;
    memcpy(req->nonce.bytes, nonce, OFFLOAD_BOX_NONCE_SIZE);
  }
  req->plaintext.size = (pb_size_t)plaintext_len;
  if (plaintext_len > 0) memcpy(req->plaintext.bytes, plaintext, plaintext_len);

  /* The response overlays the request in the union: `call` encodes the request before it
   * decodes into the response. Response: tag 1 + length 2 + ciphertext, nonce 26, version 6. */
  resp = &client->msg.box_seal_resp;
  s = call(client, PATH_BOX_SEAL, key_id, offload_v1_BoxSealRequest_fields, req,
           offload_v1_BoxSealResponse_fields, resp, plaintext_len + OFFLOAD_BOX_TAG_SIZE + 35);
  if (s != OFFLOAD_OK) return finish(client, s);
  if (resp->ciphertext.size != plaintext_len + OFFLOAD_BOX_TAG_SIZE ||
      resp->nonce.size != OFFLOAD_BOX_NONCE_SIZE ||
      (nonce != NULL && memcmp(resp->nonce.bytes, nonce, OFFLOAD_BOX_NONCE_SIZE) != 0)) {
    return finish(client, OFFLOAD_ERR_RESPONSE);
  }
  memcpy(ciphertext, resp->ciphertext.bytes, resp->ciphertext.size);
  *ciphertext_len = resp->ciphertext.size;
  if (out_nonce != NULL) memcpy(out_nonce, resp->nonce.bytes, OFFLOAD_BOX_NONCE_SIZE);
  return finish(client, OFFLOAD_OK);
}

offload_status_t offload_box_open(offload_client_t* client, const char* key_id,
                                  uint32_t key_version,
                                  const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                  const uint8_t nonce[OFFLOAD_BOX_NONCE_SIZE],
                                  const uint8_t* ciphertext, size_t ciphertext_len,
                                  uint8_t* plaintext, size_t plaintext_cap,
                                  size_t* plaintext_len, bool* memo_hit) {
  offload_v1_BoxOpenRequest* req;
  offload_v1_BoxOpenResponse* resp;
  offload_status_t s = begin(client);
  if (s != OFFLOAD_OK) return s;
  if (peer_public_key == NULL || nonce == NULL || ciphertext == NULL || plaintext_len == NULL ||
      (plaintext == NULL && plaintext_cap > 0) || ciphertext_len < OFFLOAD_BOX_TAG_SIZE ||
      ciphertext_len > OFFLOAD_MAX_CIPHERTEXT) {
    return OFFLOAD_ERR_ARGUMENT;
  }
  if (plaintext_cap < ciphertext_len - OFFLOAD_BOX_TAG_SIZE) return OFFLOAD_ERR_BUFFER_TOO_SMALL;
  if (key_id_length(key_id) == 0) return finish(client, OFFLOAD_ERR_ARGUMENT);
#if OFFLOAD_LOCAL_BOX
  if (box_on_device(client)) {
    uint8_t empty[1];
    const uint8_t* box_key = NULL;
    uint32_t version = 0;
    bool hit = false;
    uint8_t* out = ciphertext_len > OFFLOAD_BOX_TAG_SIZE ? plaintext : empty;
    s = shared_key_of(client, key_id, key_version, true, peer_public_key, &box_key, &version,
                      &hit);
    if (s != OFFLOAD_OK) return finish(client, s);
    if (crypto_box_open_easy_afternm(out, ciphertext, ciphertext_len, nonce, box_key) != 0) {
      /* As the server says it; an error about this box, not about the key: nothing dropped. */
      set_error_message(client, "authentication failed");
      return finish(client, OFFLOAD_ERR_INVALID_ARGUMENT);
    }
    *plaintext_len = ciphertext_len - OFFLOAD_BOX_TAG_SIZE;
    if (memo_hit != NULL) *memo_hit = hit;
    return finish(client, OFFLOAD_OK);
  }
#endif
  req = &client->msg.box_open_req;
  client->wipe_pending = true; /* the message structs and `buf` will hold secrets */
  memset(req, 0, sizeof *req);
  if (!copy_key_id(req->key_id, key_id)) return finish(client, OFFLOAD_ERR_ARGUMENT);
  req->key_version = key_version;
  req->peer_public_key.size = OFFLOAD_X25519_KEY_SIZE;
  memcpy(req->peer_public_key.bytes, peer_public_key, OFFLOAD_X25519_KEY_SIZE);
  req->nonce.size = OFFLOAD_BOX_NONCE_SIZE;
  memcpy(req->nonce.bytes, nonce, OFFLOAD_BOX_NONCE_SIZE);
  req->ciphertext.size = (pb_size_t)ciphertext_len;
  memcpy(req->ciphertext.bytes, ciphertext, ciphertext_len);
  /* The response overlays the request in the union: `call` encodes the request before it
   * decodes into the response. */
  resp = &client->msg.box_open_resp;
  s = call(client, PATH_BOX_OPEN, key_id, offload_v1_BoxOpenRequest_fields, req,
           offload_v1_BoxOpenResponse_fields, resp,
           ciphertext_len - OFFLOAD_BOX_TAG_SIZE + 5 /* tag 1 + length 2, memo_hit 2 */);
  if (s != OFFLOAD_OK) return finish(client, s);
  if (resp->plaintext.size != ciphertext_len - OFFLOAD_BOX_TAG_SIZE) {
    return finish(client, OFFLOAD_ERR_RESPONSE);
  }
  if (resp->plaintext.size > 0) memcpy(plaintext, resp->plaintext.bytes, resp->plaintext.size);
  *plaintext_len = resp->plaintext.size;
  if (memo_hit != NULL) *memo_hit = resp->memo_hit;
  return finish(client, OFFLOAD_OK);
}

offload_status_t offload_verify(offload_client_t* client,
                                const uint8_t public_key[OFFLOAD_ED25519_PUBLIC_KEY_SIZE],
                                const uint8_t* message, size_t message_len,
                                const uint8_t signature[OFFLOAD_ED25519_SIGNATURE_SIZE],
                                bool* valid, bool* memo_hit) {
  offload_v1_VerifyRequest* req;
  offload_v1_VerifyResponse* resp;
  offload_status_t s = begin(client);
  if (s != OFFLOAD_OK) return s;
  if (public_key == NULL || (message == NULL && message_len > 0) || signature == NULL ||
      valid == NULL || message_len > OFFLOAD_MAX_MESSAGE) {
    return OFFLOAD_ERR_ARGUMENT;
  }
  req = &client->msg.verify.req;
  resp = &client->msg.verify.resp;
  client->wipe_pending = true; /* the message structs and `buf` will hold secrets */
  memset(req, 0, sizeof *req);
  req->public_key.size = OFFLOAD_ED25519_PUBLIC_KEY_SIZE;
  memcpy(req->public_key.bytes, public_key, OFFLOAD_ED25519_PUBLIC_KEY_SIZE);
  req->message.size = (pb_size_t)message_len;
  if (message_len > 0) memcpy(req->message.bytes, message, message_len);
  req->signature.size = OFFLOAD_ED25519_SIGNATURE_SIZE;
  memcpy(req->signature.bytes, signature, OFFLOAD_ED25519_SIGNATURE_SIZE);
  s = call(client, PATH_VERIFY, NULL, offload_v1_VerifyRequest_fields, req,
           offload_v1_VerifyResponse_fields, resp, offload_v1_VerifyResponse_size);
  if (s != OFFLOAD_OK) return finish(client, s);
  *valid = resp->valid;
  if (memo_hit != NULL) *memo_hit = resp->memo_hit;
  return finish(client, OFFLOAD_OK);
}
