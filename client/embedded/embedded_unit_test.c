/* embedded_unit_test.c - the embedded client without a server: what it encodes, how it reads
 * answers and Connect errors, its buffer limits, the bearer token, the HTTP/1.1 framing the
 * transports share (internal/http1.h), and the POSIX transport against a canned peer on
 * loopback. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pb_decode.h>
#include <pb_encode.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal/http1.h"
#include "offload_client.h"
#include "transport_posix.h"

static int failures;
static int checks;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    ++checks;                                                         \
    if (!(cond)) {                                                    \
      ++failures;                                                     \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)
#define CHECK_STATUS(s, want) \
  CHECK((s) == (want), "got %s, want %s", offload_status_name(s), offload_status_name(want))

/* --- a fake transport: records the request, answers what the test set --------------------- */
typedef struct fake {
  int calls;
  char path[64];
  const char* bearer_token;
  uint8_t req[OFFLOAD_CLIENT_BUF_SIZE];
  size_t req_len;
  int rc;
  int status;
  uint8_t body[2048];
  size_t body_len;
} fake_t;

static int fake_transport(void* ctx, const offload_transport_request_t* request, uint8_t* resp,
                          size_t resp_cap, size_t* resp_len, int* http_status) {
  fake_t* f = (fake_t*)ctx;
  size_t n = f->body_len < resp_cap ? f->body_len : resp_cap;
  ++f->calls;
  snprintf(f->path, sizeof f->path, "%s", request->path);
  f->bearer_token = request->bearer_token;
  memcpy(f->req, request->body, request->body_len);
  f->req_len = request->body_len;
  if (f->rc != OFFLOAD_TRANSPORT_OK && f->rc != OFFLOAD_TRANSPORT_OVERFLOW) return f->rc;
  memcpy(resp, f->body, n);
  *resp_len = n;
  *http_status = f->status;
  return f->body_len > resp_cap ? OFFLOAD_TRANSPORT_OVERFLOW : f->rc;
}

static void answer(fake_t* f, int status, const pb_msgdesc_t* fields, const void* msg) {
  pb_ostream_t os = pb_ostream_from_buffer(f->body, sizeof f->body);
  f->rc = OFFLOAD_TRANSPORT_OK;
  f->status = status;
  f->body_len = 0;
  if (fields != NULL && pb_encode(&os, fields, msg)) f->body_len = os.bytes_written;
}

static void answer_text(fake_t* f, int status, const char* text) {
  f->rc = OFFLOAD_TRANSPORT_OK;
  f->status = status;
  f->body_len = strlen(text);
  memcpy(f->body, text, f->body_len);
}

static offload_client_t client;
static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
static fake_t fake;

static int all_zero(const void* p, size_t n) {
  const uint8_t* b = (const uint8_t*)p;
  size_t i;
  for (i = 0; i < n; ++i) {
    if (b[i] != 0) return 0;
  }
  return 1;
}

static void test_derive(void) {
  uint8_t peer[32], shared[32];
  char long_id[66];
  bool memo_hit = false;
  offload_v1_DeriveRequest req = offload_v1_DeriveRequest_init_zero;
  offload_v1_DeriveResponse resp = offload_v1_DeriveResponse_init_zero;
  pb_istream_t is;
  offload_status_t s;
  memset(peer, 0xAB, sizeof peer);
  resp.shared_key.size = 32;
  memset(resp.shared_key.bytes, 0x5C, 32);
  resp.memo_hit = true;
  resp.key_version = 3;
  answer(&fake, 200, offload_v1_DeriveResponse_fields, &resp);
  s = offload_derive(&client, "dev1", peer, true, shared, &memo_hit);
  CHECK_STATUS(s, OFFLOAD_OK);
  CHECK(strcmp(fake.path, "/offload.v1.X25519Service/Derive") == 0, "path %s", fake.path);
  is = pb_istream_from_buffer(fake.req, fake.req_len);
  CHECK(pb_decode(&is, offload_v1_DeriveRequest_fields, &req), "request decodes");
  CHECK(strcmp(req.key_id, "dev1") == 0 && req.key_version == 0 &&
            req.peer_public_key.size == 32 && memcmp(req.peer_public_key.bytes, peer, 32) == 0 &&
            req.output == offload_v1_DeriveOutput_DERIVE_OUTPUT_BOX_BEFORENM,
        "request fields");
  CHECK(memo_hit && shared[0] == 0x5C && shared[31] == 0x5C, "response fields");
  CHECK(client.last_http_status == 200, "status %d", client.last_http_status);
  /* Secrets do not stay in the client. */
  CHECK(all_zero(&client.msg, sizeof client.msg) && all_zero(wire, sizeof wire),
        "client memory wiped after the call");

  /* A 31-byte shared key is the server's mistake, not ours. */
  resp.shared_key.size = 31;
  answer(&fake, 200, offload_v1_DeriveResponse_fields, &resp);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_ERR_RESPONSE);
  /* Not protobuf. */
  answer_text(&fake, 200, "\xff\xff\xff");
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_ERR_DECODE);
  /* Key ids: empty, too long, NULL are refused before any call. */
  fake.calls = 0;
  CHECK_STATUS(offload_derive(&client, "", peer, false, shared, NULL), OFFLOAD_ERR_ARGUMENT);
  memset(long_id, 'k', 65);
  long_id[65] = '\0';
  CHECK_STATUS(offload_derive(&client, long_id, peer, false, shared, NULL), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_derive(&client, NULL, peer, false, shared, NULL), OFFLOAD_ERR_ARGUMENT);
  CHECK(fake.calls == 0, "no call for a bad key id");
  /* 64 characters is the longest id. */
  resp.shared_key.size = 32;
  answer(&fake, 200, offload_v1_DeriveResponse_fields, &resp);
  long_id[64] = '\0';
  CHECK_STATUS(offload_derive(&client, long_id, peer, false, shared, NULL), OFFLOAD_OK);
  is = pb_istream_from_buffer(fake.req, fake.req_len);
  CHECK(pb_decode(&is, offload_v1_DeriveRequest_fields, &req) && strlen(req.key_id) == 64,
        "64-character key id sent whole");
  /* Transport failure: the transport's own code is kept. */
  fake.rc = -7;
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_ERR_TRANSPORT);
  CHECK(client.last_http_status == 0, "no status after a transport failure");
  CHECK(client.last_transport_error == -7, "transport error %d", client.last_transport_error);
  answer(&fake, 200, offload_v1_DeriveResponse_fields, &resp);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_OK);
  CHECK(client.last_transport_error == 0, "cleared by the next call");
}

/* A token of `len` characters of `c`, in a static buffer. */
static const char* token_of(size_t len, char c) {
  static char t[OFFLOAD_TOKEN_MAX_LEN + 2];
  memset(t, c, len);
  t[len] = '\0';
  return t;
}

static void test_token(void) {
  static const char jwt[] = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJkZXZpY2UtMSJ9.c2ln-_";
  static char longest[OFFLOAD_TOKEN_MAX_LEN + 1];
  uint8_t peer[32] = {3}, shared[32];
  offload_v1_DeriveResponse resp = offload_v1_DeriveResponse_init_zero;
  resp.shared_key.size = 32;
  answer(&fake, 200, offload_v1_DeriveResponse_fields, &resp);
  CHECK(fake.bearer_token == NULL, "no token before one is set");
  CHECK_STATUS(offload_client_set_token(&client, jwt), OFFLOAD_OK);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_OK);
  CHECK(fake.bearer_token == jwt, "every call carries the caller's token (not a copy)");
  CHECK(offload_token_length(jwt) == sizeof jwt - 1, "a JWT is token68");
  CHECK(offload_token_length("abc+/~==") == 8, "padding at the end");

  /* Refused: the previous token stays, the reason is in last_error_message. */
  CHECK_STATUS(offload_client_set_token(&client, token_of(OFFLOAD_TOKEN_MAX_LEN + 1, 'a')),
               OFFLOAD_ERR_ARGUMENT);
  CHECK(strstr(client.last_error_message, "at most 2048") != NULL, "'%s'",
        client.last_error_message);
  CHECK_STATUS(offload_client_set_token(&client, ""), OFFLOAD_ERR_ARGUMENT);
  CHECK(strstr(client.last_error_message, "got none") != NULL, "'%s'", client.last_error_message);
  CHECK_STATUS(offload_client_set_token(&client, "abc\r\nX-Evil: 1"), OFFLOAD_ERR_ARGUMENT);
  CHECK(strstr(client.last_error_message, "token68") != NULL, "'%s'", client.last_error_message);
  CHECK_STATUS(offload_client_set_token(&client, "a b"), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_client_set_token(&client, "ab=c"), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_client_set_token(&client, "Bearer abc"), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_OK);
  CHECK(fake.bearer_token == jwt, "a refused token leaves the previous one");
  CHECK(client.last_error_message[0] == '\0', "the next call clears the message");

  /* The longest token, then none. */
  memcpy(longest, token_of(OFFLOAD_TOKEN_MAX_LEN, 'Z'), OFFLOAD_TOKEN_MAX_LEN + 1);
  CHECK_STATUS(offload_client_set_token(&client, longest), OFFLOAD_OK);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_OK);
  CHECK(fake.bearer_token == longest, "a %d-character token", OFFLOAD_TOKEN_MAX_LEN);
  CHECK_STATUS(offload_client_set_token(&client, NULL), OFFLOAD_OK);
  CHECK_STATUS(offload_derive(&client, "dev1", peer, false, shared, NULL), OFFLOAD_OK);
  CHECK(fake.bearer_token == NULL, "NULL stops sending it");
  CHECK_STATUS(offload_client_set_token(NULL, jwt), OFFLOAD_ERR_ARGUMENT);
}

/* --- the HTTP/1.1 framing the transports share, without a network ------------------------- */
/* The parts of a request, joined. */
static size_t join(const offload_http1_part_t* parts, int count, char* out, size_t cap) {
  size_t n = 0;
  int i;
  for (i = 0; i < count; ++i) {
    if (n + parts[i].len >= cap) return 0;
    memcpy(out + n, parts[i].data, parts[i].len);
    n += parts[i].len;
  }
  out[n] = '\0';
  return n;
}

static void test_http1_request(void) {
  static char head[256], joined[4096];
  const uint8_t body[3] = {'x', 'y', 'z'};
  offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS];
  offload_transport_request_t r = {"/offload.v1.X25519Service/Derive", NULL, body, sizeof body};
  int count = offload_http1_request(head, sizeof head, "localhost", 8443, true, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strcmp(joined,
                   "POST /offload.v1.X25519Service/Derive HTTP/1.1\r\nHost: localhost:8443\r\n"
                   "Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
                   "Accept-Encoding: identity\r\nContent-Length: 3\r\n\r\nxyz") == 0,
        "keep-alive request without a token: %d parts, '%s'", count, joined);
  r.bearer_token = "abc.def";
  count = offload_http1_request(head, sizeof head, "127.0.0.1", 80, false, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "\r\nConnection: close\r\n") != NULL &&
            strstr(joined, "\r\nAuthorization: Bearer abc.def\r\n\r\nxyz") != NULL,
        "a short token goes into the head: %d parts, '%s'", count, joined);
  /* A token longer than the head's room: sent from the caller's memory, not copied. */
  r.bearer_token = token_of(OFFLOAD_TOKEN_MAX_LEN, 'T');
  count = offload_http1_request(head, sizeof head, "127.0.0.1", 80, false, &r, parts);
  CHECK(count == 4 && parts[1].data == r.bearer_token && parts[1].len == OFFLOAD_TOKEN_MAX_LEN &&
            join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "\r\nAuthorization: Bearer TTTT") != NULL &&
            strstr(joined, "TTTT\r\n\r\nxyz") != NULL,
        "a long token is a part of its own: %d parts", count);
  /* Refused: what would break the head. */
  r.bearer_token = "abc\r\nX: y";
  CHECK(offload_http1_request(head, sizeof head, "h", 80, false, &r, parts) ==
            OFFLOAD_HTTP1_ERR_ARGUMENT,
        "a token with CR LF");
  r.bearer_token = NULL;
  r.path = "/a b";
  CHECK(offload_http1_request(head, sizeof head, "h", 80, false, &r, parts) ==
            OFFLOAD_HTTP1_ERR_ARGUMENT,
        "a path with a space");
  r.path = "/offload.v1.X25519Service/Derive";
  CHECK(offload_http1_request(head, 64, "h", 80, false, &r, parts) == OFFLOAD_HTTP1_ERR_ARGUMENT,
        "a head over its buffer");
}

/* Feeds `response` to a reader `step` bytes at a time (then the end of the stream when
 * `close_after`); returns the reader's last answer. */
static int feed(offload_http1_reader_t* r, char* head, size_t head_cap, uint8_t* body,
                size_t body_cap, const char* response, size_t step, int close_after) {
  size_t at = 0, len = strlen(response);
  int rc = OFFLOAD_HTTP1_MORE;
  offload_http1_reader_init(r, head, head_cap, body, body_cap);
  while (rc == OFFLOAD_HTTP1_MORE && at < len) {
    size_t room, n;
    uint8_t* dst = offload_http1_reader_space(r, &room);
    n = len - at < step ? len - at : step;
    if (n > room) n = room;
    memcpy(dst, response + at, n);
    at += n;
    rc = offload_http1_reader_received(r, n);
  }
  if (rc == OFFLOAD_HTTP1_MORE && close_after) rc = offload_http1_reader_received(r, 0);
  return rc;
}

static void test_http1_reader(void) {
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
  char head[128];
  uint8_t body[16];
  offload_http1_reader_t r;
  size_t step;
  int rc;
  for (step = 1; step <= sizeof ok; step += 6) {
    rc = feed(&r, head, sizeof head, body, sizeof body, ok, step, 0);
    CHECK(rc == OFFLOAD_TRANSPORT_OK && r.status == 200 && r.body_len == 5 &&
              memcmp(body, "hello", 5) == 0 && offload_http1_reader_reusable(&r),
          "keep-alive answer read %zu bytes at a time: rc %d", step, rc);
  }
  rc = feed(&r, head, sizeof head, body, sizeof body,
            "HTTP/1.1 401 Unauthorized\r\nconnection: Close\r\ncontent-length: 2\r\n\r\n{}", 7,
            0);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && r.status == 401 && !offload_http1_reader_reusable(&r),
        "Connection: close ends the connection: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, sizeof body,
            "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 100, 0);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && !offload_http1_reader_reusable(&r), "HTTP/1.0: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, sizeof body,
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxJUNK", 100, 0);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && r.body_len == 1 && !offload_http1_reader_reusable(&r),
        "bytes past the body: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, sizeof body, "HTTP/1.1 200 OK\r\n\r\nto-the-end", 4, 1);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && r.body_len == 10 && !offload_http1_reader_reusable(&r),
        "a body to the end of the stream: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, 4, ok, 100, 0);
  CHECK(rc == OFFLOAD_TRANSPORT_OVERFLOW && r.body_len == 4 && !offload_http1_reader_reusable(&r),
        "over the body's capacity: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, sizeof body,
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 100, 0);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && r.body_len == 0 && offload_http1_reader_reusable(&r),
        "an empty body: rc %d", rc);
  rc = feed(&r, head, sizeof head, body, sizeof body, "HTTP/1.1 200 OK\r\nContent-Len", 100, 1);
  CHECK(rc == OFFLOAD_HTTP1_ERR_RESPONSE, "closed inside the head: rc %d", rc);
  rc = feed(&r, head, 24, body, sizeof body, ok, 100, 0);
  CHECK(rc == OFFLOAD_HTTP1_ERR_RESPONSE, "a head over its buffer: rc %d", rc);
}

static void test_connect_errors(void) {
  uint8_t peer[32] = {1}, shared[32];
  char msg[32];
  offload_status_t s;
  answer_text(&fake, 404, "{\"code\":\"not_found\",\"message\":\"key \\\"dev9\\\" not found\"}");
  s = offload_derive(&client, "dev9", peer, false, shared, NULL);
  CHECK_STATUS(s, OFFLOAD_ERR_NOT_FOUND);
  CHECK(strcmp(client.last_error_message, "key \"dev9\" not found") == 0, "message '%s'",
        client.last_error_message);
  CHECK(client.last_http_status == 404, "status");
  /* The error message is cleared by the next call. */
  answer_text(&fake, 503, "upstream down");
  s = offload_derive(&client, "dev9", peer, false, shared, NULL);
  CHECK_STATUS(s, OFFLOAD_ERR_HTTP_STATUS);
  CHECK(client.last_error_message[0] == '\0' && client.last_http_status == 503, "no JSON");

#define PARSE(text) \
  offload_parse_connect_error((const uint8_t*)(text), strlen(text), msg, sizeof msg)
  CHECK_STATUS(PARSE("{ \"message\" : \"x\" ,\n \"code\" :\t\"invalid_argument\" }"),
               OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(msg, "x") == 0, "msg '%s'", msg);
  CHECK_STATUS(PARSE("{\"code\":\"unauthenticated\"}"), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK_STATUS(PARSE("{\"code\":\"canceled\"}"), OFFLOAD_ERR_CANCELED);
  CHECK_STATUS(PARSE("{\"code\":\"resource_exhausted\"}"), OFFLOAD_ERR_RESOURCE_EXHAUSTED);
  CHECK_STATUS(PARSE("{\"code\":\"teapot\"}"), OFFLOAD_ERR_UNKNOWN);
  /* "code" inside a string value or a nested object is not the error's code. */
  CHECK_STATUS(PARSE("{\"message\":\"\\\"code\\\":\\\"not_found\\\"\",\"details\":[{\"code\":\"x\"}],"
                     "\"code\":\"aborted\"}"),
               OFFLOAD_ERR_ABORTED);
  CHECK_STATUS(PARSE("{\"message\":\"code\"}"), OFFLOAD_ERR_HTTP_STATUS);
  CHECK_STATUS(PARSE("{\"details\":[{\"code\":\"not_found\"}]}"), OFFLOAD_ERR_HTTP_STATUS);
  /* Truncated bodies: the code is kept when complete, a long message is cut. */
  CHECK_STATUS(PARSE("{\"code\":\"internal\",\"message\":\"a very long message that goes on"),
               OFFLOAD_ERR_INTERNAL);
  CHECK(strlen(msg) == sizeof msg - 1, "message truncated to the buffer: '%s'", msg);
  CHECK_STATUS(PARSE("{\"code\":\"intern"), OFFLOAD_ERR_HTTP_STATUS);
  CHECK_STATUS(PARSE(""), OFFLOAD_ERR_HTTP_STATUS);
  CHECK_STATUS(PARSE("\"\\"), OFFLOAD_ERR_HTTP_STATUS);
  CHECK_STATUS(PARSE("{\"code\":\"\"}"), OFFLOAD_ERR_HTTP_STATUS);
  CHECK_STATUS(offload_parse_connect_error(NULL, 0, NULL, 0), OFFLOAD_ERR_HTTP_STATUS);
#undef PARSE
  CHECK(strcmp(offload_status_name(OFFLOAD_ERR_NOT_FOUND), "not_found") == 0, "name");
  CHECK(strcmp(offload_status_name(OFFLOAD_ERR_UNAUTHENTICATED), "unauthenticated") == 0, "name");
  CHECK(strcmp(offload_status_name(OFFLOAD_ERR_BUFFER_TOO_SMALL), "buffer_too_small") == 0,
        "name");
}

static void test_box_and_verify(void) {
  static uint8_t pt[OFFLOAD_MAX_MESSAGE + 1], ct[OFFLOAD_MAX_CIPHERTEXT + 1];
  uint8_t peer[32] = {9}, nonce[24] = {7}, nonce_out[24], pk[32] = {3}, sig[64] = {4};
  size_t ct_len = 0, pt_len = 0;
  bool valid = false, memo_hit = false;
  offload_v1_BoxSealResponse seal = offload_v1_BoxSealResponse_init_zero;
  offload_v1_BoxOpenResponse open = offload_v1_BoxOpenResponse_init_zero;
  offload_v1_VerifyResponse ver = offload_v1_VerifyResponse_init_zero;
  offload_v1_BoxSealRequest seal_req;
  offload_v1_VerifyRequest ver_req;
  pb_istream_t is;

  /* Seal: the request carries the nonce and plaintext; the answer's ciphertext comes back. */
  seal.ciphertext.size = 16 + 5;
  memset(seal.ciphertext.bytes, 0xC1, 21);
  seal.nonce.size = 24;
  memcpy(seal.nonce.bytes, nonce, 24);
  answer(&fake, 200, offload_v1_BoxSealResponse_fields, &seal);
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, nonce, (const uint8_t*)"hello", 5, ct,
                                sizeof ct, &ct_len, NULL),
               OFFLOAD_OK);
  CHECK(ct_len == 21 && ct[0] == 0xC1, "ciphertext");
  CHECK(strcmp(fake.path, "/offload.v1.BoxService/Seal") == 0, "path %s", fake.path);
  memset(&seal_req, 0, sizeof seal_req);
  is = pb_istream_from_buffer(fake.req, fake.req_len);
  CHECK(pb_decode(&is, offload_v1_BoxSealRequest_fields, &seal_req) &&
            seal_req.nonce.size == 24 && seal_req.plaintext.size == 5 &&
            memcmp(seal_req.plaintext.bytes, "hello", 5) == 0,
        "seal request");
  /* No nonce: the server's comes back; the request has none. */
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, NULL, (const uint8_t*)"hello", 5, ct,
                                sizeof ct, &ct_len, nonce_out),
               OFFLOAD_OK);
  CHECK(memcmp(nonce_out, nonce, 24) == 0, "server nonce returned");
  memset(&seal_req, 0, sizeof seal_req);
  is = pb_istream_from_buffer(fake.req, fake.req_len);
  CHECK(pb_decode(&is, offload_v1_BoxSealRequest_fields, &seal_req) && seal_req.nonce.size == 0,
        "no nonce sent");
  /* A different nonce or length in the answer is refused. */
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, nonce, (const uint8_t*)"hell", 4, ct,
                                sizeof ct, &ct_len, NULL),
               OFFLOAD_ERR_RESPONSE);
  /* Sizes: too large a plaintext, too small an output, no nonce anywhere. */
  fake.calls = 0;
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, nonce, pt, OFFLOAD_MAX_MESSAGE + 1, ct,
                                sizeof ct, &ct_len, NULL),
               OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, nonce, pt, 10, ct, 25, &ct_len, NULL),
               OFFLOAD_ERR_BUFFER_TOO_SMALL);
  CHECK_STATUS(offload_box_seal(&client, "dev1", peer, NULL, pt, 10, ct, 26, &ct_len, NULL),
               OFFLOAD_ERR_ARGUMENT);
  CHECK(fake.calls == 0, "no call for local errors");

  /* Open: the largest ciphertext fits the default buffer. */
  open.plaintext.size = OFFLOAD_MAX_MESSAGE;
  memset(open.plaintext.bytes, 0x11, OFFLOAD_MAX_MESSAGE);
  open.memo_hit = true;
  answer(&fake, 200, offload_v1_BoxOpenResponse_fields, &open);
  CHECK_STATUS(offload_box_open(&client, "dev1", 2, peer, nonce, ct, OFFLOAD_MAX_CIPHERTEXT, pt,
                                sizeof pt, &pt_len, &memo_hit),
               OFFLOAD_OK);
  CHECK(pt_len == OFFLOAD_MAX_MESSAGE && pt[0] == 0x11 && memo_hit, "open answer");
  CHECK(strcmp(fake.path, "/offload.v1.BoxService/Open") == 0, "path %s", fake.path);
  CHECK_STATUS(offload_box_open(&client, "dev1", 0, peer, nonce, ct, 15, pt, sizeof pt, &pt_len,
                                NULL),
               OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_box_open(&client, "dev1", 0, peer, nonce, ct, OFFLOAD_MAX_CIPHERTEXT + 1,
                                pt, sizeof pt, &pt_len, NULL),
               OFFLOAD_ERR_ARGUMENT);
  /* An answer longer than the ciphertext allows is never copied out. */
  answer(&fake, 200, offload_v1_BoxOpenResponse_fields, &open);
  CHECK_STATUS(offload_box_open(&client, "dev1", 0, peer, nonce, ct, 20, pt, sizeof pt, &pt_len,
                                NULL),
               OFFLOAD_ERR_RESPONSE); /* 1024 bytes back for a 4-byte plaintext */

  /* Verify. */
  ver.valid = true;
  answer(&fake, 200, offload_v1_VerifyResponse_fields, &ver);
  CHECK_STATUS(offload_verify(&client, pk, (const uint8_t*)"m", 1, sig, &valid, &memo_hit),
               OFFLOAD_OK);
  CHECK(valid && !memo_hit, "verify answer");
  memset(&ver_req, 0, sizeof ver_req);
  is = pb_istream_from_buffer(fake.req, fake.req_len);
  CHECK(pb_decode(&is, offload_v1_VerifyRequest_fields, &ver_req) &&
            ver_req.public_key.size == 32 && ver_req.signature.size == 64 &&
            ver_req.message.size == 1 && ver_req.message.bytes[0] == 'm',
        "verify request");
  CHECK(strcmp(fake.path, "/offload.v1.Ed25519Service/Verify") == 0, "path %s", fake.path);
  /* An empty 200 body is the default message: valid = false. */
  answer_text(&fake, 200, "");
  valid = true;
  CHECK_STATUS(offload_verify(&client, pk, NULL, 0, sig, &valid, NULL), OFFLOAD_OK);
  CHECK(!valid, "empty body means invalid");
}

static void test_small_buffer(void) {
  static offload_client_t small;
  static uint8_t buf[300];
  static uint8_t pt[400], ct[416];
  size_t ct_len;
  uint8_t peer[32] = {0}, nonce[24] = {0};
  CHECK_STATUS(offload_client_init(&small, fake_transport, &fake, buf, 10), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_client_init(&small, NULL, &fake, buf, sizeof buf), OFFLOAD_ERR_ARGUMENT);
  CHECK_STATUS(offload_client_init(&small, fake_transport, &fake, buf, sizeof buf), OFFLOAD_OK);
  fake.calls = 0;
  CHECK_STATUS(offload_box_seal(&small, "dev1", peer, nonce, pt, sizeof pt, ct, sizeof ct,
                                &ct_len, NULL),
               OFFLOAD_ERR_BUFFER_TOO_SMALL);
  CHECK(fake.calls == 0, "no call when the request cannot fit");
  /* A 200 answer longer than the buffer. */
  fake.rc = OFFLOAD_TRANSPORT_OK;
  fake.status = 200;
  fake.body_len = 1000;
  CHECK_STATUS(offload_box_seal(&small, "dev1", peer, nonce, pt, 10, ct, sizeof ct, &ct_len,
                                NULL),
               OFFLOAD_ERR_BUFFER_TOO_SMALL);
  /* An error answer longer than the buffer still gives its code. */
  answer_text(&fake, 429,
              "{\"code\":\"resource_exhausted\",\"message\":\"................................"
              "................................................................................"
              "................................................................................"
              "................................................................................\"}");
  CHECK_STATUS(offload_box_seal(&small, "dev1", peer, nonce, pt, 10, ct, sizeof ct, &ct_len,
                                NULL),
               OFFLOAD_ERR_RESOURCE_EXHAUSTED);
}

/* --- the POSIX transport against a canned HTTP peer ----------------------------------------- */
/* Serves one connection per canned answer, in order; each request's head must carry the
 * Connect headers and a body of the length it announces, else the peer answers 599. The answer
 * kEchoAuthorization is a 200 whose body is the request's Authorization value ("" if none). */
static const char kEchoAuthorization[] = "echo the Authorization header";

static void serve(int lfd, const char* const* answers, int count) {
  int k;
  for (k = 0; k < count; ++k) {
    char in[4096];
    size_t n = 0;
    int ok = 0;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) _exit(2);
    for (;;) {
      ssize_t r = recv(fd, in + n, sizeof in - 1 - n, 0);
      char* end;
      if (r <= 0) break;
      n += (size_t)r;
      in[n] = '\0';
      end = strstr(in, "\r\n\r\n");
      if (end != NULL) {
        const char* cl = strstr(in, "Content-Length: ");
        size_t want = cl ? (size_t)atoi(cl + 16) : 0;
        if ((size_t)(in + n - (end + 4)) >= want) {
          ok = strncmp(in, "POST /offload.v1.X25519Service/Derive HTTP/1.1\r\n", 48) == 0 &&
               strstr(in, "\r\nContent-Type: application/proto\r\n") != NULL &&
               strstr(in, "\r\nConnect-Protocol-Version: 1\r\n") != NULL &&
               strstr(in, "\r\nHost: 127.0.0.1:") != NULL && cl != NULL &&
               (size_t)(in + n - (end + 4)) == want;
          break;
        }
      }
    }
    if (ok && answers[k] == kEchoAuthorization) {
      const char* v = strstr(in, "\r\nAuthorization: ");
      size_t v_len = 0;
      char head[64];
      if (v != NULL) {
        v += 17;
        v_len = (size_t)(strstr(v, "\r\n") - v);
      }
      snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", v_len);
      (void)!send(fd, head, strlen(head), 0);
      (void)!send(fd, v, v_len, 0);
    } else if (ok) {
      (void)!send(fd, answers[k], strlen(answers[k]), 0);
    } else {
      static const char bad[] = "HTTP/1.1 599 Bad Request Seen\r\nContent-Length: 0\r\n\r\n";
      (void)!send(fd, bad, sizeof bad - 1, 0);
    }
    close(fd);
  }
}

static void test_posix_transport(void) {
  static const char* const answers[] = {
      "HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 5\r\n\r\nhello",
      "HTTP/1.1 404 Not Found\r\ncontent-length:   2\r\nX-A: b\r\n\r\n{}",
      "HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nuntil-eof",
      "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\ntoo long body",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
      "garbage\r\n\r\n",
      kEchoAuthorization,
      kEchoAuthorization,
      kEchoAuthorization,
  };
  const int count = (int)(sizeof answers / sizeof answers[0]);
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  int lfd = socket(AF_INET, SOCK_STREAM, 0), status = 0, wstatus = 0, rc;
  pid_t pid;
  offload_posix_transport_t t;
  uint8_t resp[16]; /* room for the 9-byte read below; other calls offer 8 */
  static uint8_t echo[OFFLOAD_TOKEN_MAX_LEN + 16];
  const char* longest = token_of(OFFLOAD_TOKEN_MAX_LEN, 'L');
  const size_t cap = 8;
  size_t resp_len = 0;
  const uint8_t req[3] = {1, 2, 3};
  offload_transport_request_t request = {"/offload.v1.X25519Service/Derive", NULL, req, sizeof req};

  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(lfd >= 0 && bind(lfd, (struct sockaddr*)&sa, sizeof sa) == 0 && listen(lfd, 8) == 0 &&
            getsockname(lfd, (struct sockaddr*)&sa, &sl) == 0,
        "listen on loopback");
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    serve(lfd, answers, count);
    _exit(0);
  }
  close(lfd);
  CHECK(offload_posix_transport_init(&t, "127.0.0.1", ntohs(sa.sin_port)) == 0, "init");
  CHECK(offload_posix_transport_init(&t, "localhost", 1) == OFFLOAD_POSIX_ERR_ARGUMENT, "numeric");
  CHECK(offload_posix_transport_init(&t, "127.0.0.1", ntohs(sa.sin_port)) == 0, "init");

  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && status == 200 && resp_len == 5 &&
            memcmp(resp, "hello", 5) == 0,
        "Content-Length body: rc %d status %d len %zu", rc, status, resp_len);
  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && status == 404 && resp_len == 2, "lower-case header: rc %d "
        "status %d len %zu", rc, status, resp_len);
  rc = offload_posix_transport(&t, &request, resp, 9, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OVERFLOW || (rc == OFFLOAD_TRANSPORT_OK && resp_len == 9),
        "body to EOF: rc %d len %zu", rc, resp_len);
  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OVERFLOW && status == 200 && resp_len == cap,
        "body over capacity: rc %d len %zu", rc, resp_len);
  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_POSIX_ERR_RESPONSE, "chunked refused: rc %d", rc);
  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_POSIX_ERR_RESPONSE, "truncated body: rc %d", rc);
  rc = offload_posix_transport(&t, &request, resp, cap, &resp_len, &status);
  CHECK(rc == OFFLOAD_POSIX_ERR_RESPONSE, "not HTTP: rc %d", rc);
  /* The bearer token reaches the peer whole: none, a short one, the longest. */
  rc = offload_posix_transport(&t, &request, echo, sizeof echo, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && status == 200 && resp_len == 0, "no Authorization header");
  request.bearer_token = "abc.def-_";
  rc = offload_posix_transport(&t, &request, echo, sizeof echo, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && resp_len == 16 && memcmp(echo, "Bearer abc.def-_", 16) == 0,
        "Authorization: rc %d, '%.*s'", rc, (int)resp_len, (const char*)echo);
  request.bearer_token = longest;
  rc = offload_posix_transport(&t, &request, echo, sizeof echo, &resp_len, &status);
  CHECK(rc == OFFLOAD_TRANSPORT_OK && resp_len == 7 + OFFLOAD_TOKEN_MAX_LEN &&
            memcmp(echo, "Bearer ", 7) == 0 &&
            memcmp(echo + 7, longest, OFFLOAD_TOKEN_MAX_LEN) == 0,
        "the longest token: rc %d, %zu bytes", rc, resp_len);
  CHECK(waitpid(pid, &wstatus, 0) == pid && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
        "peer exit");
}

int main(void) {
  CHECK_STATUS(offload_client_init(&client, fake_transport, &fake, wire, sizeof wire), OFFLOAD_OK);
  test_derive();
  test_connect_errors();
  test_box_and_verify();
  test_small_buffer();
  test_token();
  test_http1_request();
  test_http1_reader();
  test_posix_transport();
  printf("embedded_unit_test: %d checks, %d failures (client struct %zu bytes, buffer %zu)\n",
         checks, failures, sizeof(offload_client_t), (size_t)OFFLOAD_CLIENT_BUF_SIZE);
  return failures == 0 ? 0 : 1;
}
