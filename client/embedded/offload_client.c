/* offload_client.c - see offload_client.h. No malloc, no stdio, no recursion; every loop is
 * bounded by a length the caller or the protocol fixes. */
#include "offload_client.h"

#include <string.h>

#include <pb_decode.h>
#include <pb_encode.h>

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
  memset(client, 0, sizeof *client);
  client->transport = transport;
  client->transport_ctx = ctx;
  client->buf = buf;
  client->buf_len = buf_len;
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
  offload_wipe(&client->msg, sizeof client->msg);
  offload_wipe(client->buf, client->buf_len);
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

/* Encodes `req` at the start of the client's buffer, sends it to `path` and decodes a 200 answer
 * into `resp`, or maps the Connect error. `resp_max` is the largest encoded response of this type:
 * the part of the buffer after the request must hold it. */
static offload_status_t call(offload_client_t* client, const char* path,
                             const pb_msgdesc_t* req_fields, const void* req,
                             const pb_msgdesc_t* resp_fields, void* resp, size_t resp_max) {
  size_t req_len = 0;
  size_t resp_len = 0;
  int http_status = 0;
  uint8_t* resp_buf;
  size_t resp_cap;
  int rc;
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
  request.bearer_token = client->token;
  request.body = client->buf;
  request.body_len = req_len;
  rc = client->transport(client->transport_ctx, &request, resp_buf, resp_cap, &resp_len,
                         &http_status);
  if (rc != OFFLOAD_TRANSPORT_OK && rc != OFFLOAD_TRANSPORT_OVERFLOW) {
    client->last_transport_error = rc;
    return OFFLOAD_ERR_TRANSPORT;
  }
  if (resp_len > resp_cap) return OFFLOAD_ERR_TRANSPORT; /* a transport bug; trust nothing */
  client->last_http_status = http_status;
  if (http_status != 200) {
    return offload_parse_connect_error(resp_buf, resp_len, client->last_error_message,
                                       sizeof client->last_error_message);
  }
  if (rc == OFFLOAD_TRANSPORT_OVERFLOW) return OFFLOAD_ERR_BUFFER_TOO_SMALL;
  is = pb_istream_from_buffer(resp_buf, resp_len);
  if (!pb_decode(&is, resp_fields, resp)) return OFFLOAD_ERR_DECODE;
  return OFFLOAD_OK;
}

offload_status_t offload_derive(offload_client_t* client, const char* key_id,
                                const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                bool box_output, uint8_t out_shared_key[OFFLOAD_X25519_KEY_SIZE],
                                bool* memo_hit) {
  offload_v1_DeriveRequest* req;
  offload_v1_DeriveResponse* resp;
  offload_status_t s = begin(client);
  if (s != OFFLOAD_OK) return s;
  if (peer_public_key == NULL || out_shared_key == NULL) return OFFLOAD_ERR_ARGUMENT;
  req = &client->msg.derive.req;
  resp = &client->msg.derive.resp;
  memset(req, 0, sizeof *req);
  if (!copy_key_id(req->key_id, key_id)) return finish(client, OFFLOAD_ERR_ARGUMENT);
  req->key_version = 0;
  req->peer_public_key.size = OFFLOAD_X25519_KEY_SIZE;
  memcpy(req->peer_public_key.bytes, peer_public_key, OFFLOAD_X25519_KEY_SIZE);
  req->output = box_output ? offload_v1_DeriveOutput_DERIVE_OUTPUT_BOX_BEFORENM
                           : offload_v1_DeriveOutput_DERIVE_OUTPUT_RAW;
  s = call(client, PATH_DERIVE, offload_v1_DeriveRequest_fields, req,
           offload_v1_DeriveResponse_fields, resp, offload_v1_DeriveResponse_size);
  if (s != OFFLOAD_OK) return finish(client, s);
  if (resp->shared_key.size != OFFLOAD_X25519_KEY_SIZE) return finish(client, OFFLOAD_ERR_RESPONSE);
  memcpy(out_shared_key, resp->shared_key.bytes, OFFLOAD_X25519_KEY_SIZE);
  if (memo_hit != NULL) *memo_hit = resp->memo_hit;
  return finish(client, OFFLOAD_OK);
}

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
  req = &client->msg.box_seal_req;
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
  s = call(client, PATH_BOX_SEAL, offload_v1_BoxSealRequest_fields, req,
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
  req = &client->msg.box_open_req;
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
  s = call(client, PATH_BOX_OPEN, offload_v1_BoxOpenRequest_fields, req,
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
  memset(req, 0, sizeof *req);
  req->public_key.size = OFFLOAD_ED25519_PUBLIC_KEY_SIZE;
  memcpy(req->public_key.bytes, public_key, OFFLOAD_ED25519_PUBLIC_KEY_SIZE);
  req->message.size = (pb_size_t)message_len;
  if (message_len > 0) memcpy(req->message.bytes, message, message_len);
  req->signature.size = OFFLOAD_ED25519_SIGNATURE_SIZE;
  memcpy(req->signature.bytes, signature, OFFLOAD_ED25519_SIGNATURE_SIZE);
  s = call(client, PATH_VERIFY, offload_v1_VerifyRequest_fields, req,
           offload_v1_VerifyResponse_fields, resp, offload_v1_VerifyResponse_size);
  if (s != OFFLOAD_OK) return finish(client, s);
  *valid = resp->valid;
  if (memo_hit != NULL) *memo_hit = resp->memo_hit;
  return finish(client, OFFLOAD_OK);
}
