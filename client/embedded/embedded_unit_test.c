/* embedded_unit_test.c - the embedded client without a server: what it encodes, how it reads
 * answers and Connect errors, its buffer limits, the bearer token, the HTTP/1.1 framing the
 * transports share (internal/http1.h), and the POSIX transport against a canned peer on
 * loopback. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pb_decode.h>
#include <pb_encode.h>
#include <sodium.h>
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
  const char* key_id;
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
  f->key_id = request->key_id;
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
  CHECK(fake.key_id != NULL && strcmp(fake.key_id, "dev1") == 0,
        "a call about a key hands the transport its id (X-Offload-Key, for routers)");
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

/* --- the derive memo, the token provider, the local box ------------------------------------
 * A transport that answers Derive as the server would, with real X25519 (libsodium): the secret
 * of version v of key `id` is BLAKE2b(id || v), version `current` answers key_version 0. It can
 * refuse every call with a Connect error, or any call whose bearer token is not `want_token`. */
typedef struct deriver {
  int calls;
  uint32_t current;
  int error_status;        /* 0, or the HTTP status of `error_body` */
  const char* error_body;  /* a Connect error JSON */
  const char* want_token;  /* NULL, or 401 unless the call carries this token */
  const uint8_t* last_body;
  size_t last_len;
} deriver_t;

static void version_secret(const char* key_id, uint32_t version, uint8_t sk[32]) {
  crypto_generichash_state st;
  uint8_t v[4] = {(uint8_t)version, (uint8_t)(version >> 8), (uint8_t)(version >> 16),
                  (uint8_t)(version >> 24)};
  crypto_generichash_init(&st, NULL, 0, 32);
  crypto_generichash_update(&st, (const uint8_t*)key_id, strlen(key_id));
  crypto_generichash_update(&st, v, sizeof v);
  crypto_generichash_final(&st, sk, 32);
}

/* What the server would derive: raw X25519 or crypto_box_beforenm. */
static void expected_key(const char* key_id, uint32_t version, const uint8_t peer[32], bool box,
                         uint8_t out[32]) {
  uint8_t sk[32];
  version_secret(key_id, version, sk);
  if (box) {
    CHECK(crypto_box_beforenm(out, peer, sk) == 0, "beforenm");
  } else {
    CHECK(crypto_scalarmult(out, sk, peer) == 0, "scalarmult");
  }
}

static int deriver_transport(void* ctx, const offload_transport_request_t* request,
                             uint8_t* resp, size_t resp_cap, size_t* resp_len, int* http_status) {
  deriver_t* d = (deriver_t*)ctx;
  offload_v1_DeriveRequest req = offload_v1_DeriveRequest_init_zero;
  offload_v1_DeriveResponse out = offload_v1_DeriveResponse_init_zero;
  pb_istream_t is = pb_istream_from_buffer(request->body, request->body_len);
  pb_ostream_t os = pb_ostream_from_buffer(resp, resp_cap);
  const char* error = NULL;
  ++d->calls;
  d->last_body = request->body;
  d->last_len = request->body_len;
  if (d->want_token != NULL &&
      (request->bearer_token == NULL || strcmp(request->bearer_token, d->want_token) != 0)) {
    *http_status = 401;
    error = "{\"code\":\"unauthenticated\",\"message\":\"token signature: does not verify\"}";
  } else if (d->error_body != NULL) {
    *http_status = d->error_status;
    error = d->error_body;
  } else if (strcmp(request->path, "/offload.v1.X25519Service/Derive") != 0 ||
             !pb_decode(&is, offload_v1_DeriveRequest_fields, &req)) {
    *http_status = 400;
    error = "{\"code\":\"invalid_argument\",\"message\":\"not a derive\"}";
  } else {
    uint32_t v = req.key_version != 0 ? req.key_version : d->current;
    if (v > d->current) {
      *http_status = 404;
      error = "{\"code\":\"not_found\",\"message\":\"no such version\"}";
    } else {
      expected_key(req.key_id, v, req.peer_public_key.bytes,
                   req.output == offload_v1_DeriveOutput_DERIVE_OUTPUT_BOX_BEFORENM,
                   out.shared_key.bytes);
      out.shared_key.size = 32;
      out.key_version = v;
      *http_status = 200;
      CHECK(pb_encode(&os, offload_v1_DeriveResponse_fields, &out), "encode");
      *resp_len = os.bytes_written;
      return OFFLOAD_TRANSPORT_OK;
    }
  }
  *resp_len = strlen(error) < resp_cap ? strlen(error) : resp_cap;
  memcpy(resp, error, *resp_len);
  return OFFLOAD_TRANSPORT_OK;
}

static uint64_t test_now;
static uint64_t test_clock(void* ctx) { return *(const uint64_t*)ctx; }

static offload_client_t mclient;
static deriver_t deriver;

/* A fresh client on the deriver, with the test clock at 0 unless `clock` is false. */
static void memo_client(bool clock) {
  memset(&deriver, 0, sizeof deriver);
  deriver.current = 1;
  test_now = 0;
  CHECK_STATUS(offload_client_init(&mclient, deriver_transport, &deriver, wire, sizeof wire),
               OFFLOAD_OK);
  if (clock) CHECK_STATUS(offload_client_set_clock(&mclient, test_clock, &test_now), OFFLOAD_OK);
}

static void peer_of(int i, uint8_t peer[32]) {
  uint8_t sk[32];
  memset(sk, 0, sizeof sk);
  /* Not in sk[0]: X25519 clears its low 3 bits. */
  sk[1] = (uint8_t)i;
  sk[2] = (uint8_t)(i >> 8);
  sk[3] = 0x77;
  crypto_scalarmult_base(peer, sk);
}

/* Derive of (key_id, version 0, box key, peer i): checks the key; returns whether it made a
 * request. */
static int derive_peer(const char* key_id, int i) {
  uint8_t peer[32], got[32], want[32];
  int before = deriver.calls;
  bool hit = false;
  peer_of(i, peer);
  CHECK_STATUS(offload_derive(&mclient, key_id, peer, true, got, &hit), OFFLOAD_OK);
  expected_key(key_id, deriver.current, peer, true, want);
  CHECK(memcmp(got, want, 32) == 0, "peer %d: the server's box key", i);
  return deriver.calls - before;
}

#if OFFLOAD_MEMO_SLOTS > 0
/* `needle` (32 bytes) anywhere in the client struct. */
static int client_holds(const offload_client_t* c, const uint8_t* needle) {
  const uint8_t* p = (const uint8_t*)c;
  size_t i;
  for (i = 0; i + 32 <= sizeof *c; ++i) {
    if (memcmp(p + i, needle, 32) == 0) return 1;
  }
  return 0;
}

/* Least recently used, not round robin: with N slots full, re-touching the oldest and then
 * inserting a new entry evicts the second oldest and keeps the touched one. */
static void test_memo_lru(void) {
  const int n = OFFLOAD_MEMO_SLOTS;
  int i, made = 0;
  memo_client(true);
  for (i = 0; i < n; ++i) made += derive_peer("lru", i);
  CHECK(made == n && mclient.stats.misses == (uint32_t)n && mclient.stats.hits == 0,
        "%d slots filled: %d requests", n, made);
  CHECK(derive_peer("lru", 0) == 0, "peer 0 (the oldest) from the memo");
  CHECK(derive_peer("lru", n) == 1 && mclient.stats.evictions == 1, "a new peer evicts one");
  CHECK(derive_peer("lru", 0) == 0, "the re-touched oldest entry stayed");
  CHECK(derive_peer("lru", 1) == 1, "the least recently used entry (peer 1) was evicted");
  CHECK(mclient.stats.evictions == 2, "peer 1 back evicted peer 2: %u", mclient.stats.evictions);
  for (i = 3; i <= n; ++i) CHECK(derive_peer("lru", i) == 0, "peer %d stayed", i);
  CHECK(derive_peer("lru", 2) == 1, "peer 2 was the one evicted");
  CHECK(mclient.memo_count == n, "memo full: %d", mclient.memo_count);
}

/* Key fields: key id, version asked, output kind and peer are each part of the key. */
static void test_memo_key_fields(void) {
  uint8_t peer[32], got[32], want[32];
  uint32_t version = 0;
  bool hit = true;
  memo_client(true);
  deriver.current = 2;
  peer_of(1, peer);
  CHECK_STATUS(offload_derive_version(&mclient, "k", 0, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  expected_key("k", 2, peer, true, want);
  CHECK(memcmp(got, want, 32) == 0 && version == 2 && !hit, "current = version 2, a miss");
  CHECK_STATUS(offload_derive_version(&mclient, "k", 0, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  CHECK(memcmp(got, want, 32) == 0 && version == 2 && hit && deriver.calls == 1,
        "the same again: a hit with the version the server used");
  CHECK_STATUS(offload_derive_version(&mclient, "k", 2, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  CHECK(!hit && deriver.calls == 2 && version == 2, "version 2 asked by number: its own entry");
  CHECK_STATUS(offload_derive_version(&mclient, "k", 1, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  expected_key("k", 1, peer, true, want);
  CHECK(!hit && deriver.calls == 3 && version == 1 && memcmp(got, want, 32) == 0, "version 1");
  CHECK_STATUS(offload_derive_version(&mclient, "k", 0, peer, false, got, &version, &hit),
               OFFLOAD_OK);
  expected_key("k", 2, peer, false, want);
  CHECK(!hit && deriver.calls == 4 && memcmp(got, want, 32) == 0, "raw output: its own entry");
  CHECK_STATUS(offload_derive_version(&mclient, "k2", 0, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  CHECK(!hit && deriver.calls == 5, "another key id: its own entry");
  peer[31] ^= 0x01;
  CHECK_STATUS(offload_derive_version(&mclient, "k", 0, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  CHECK(!hit && deriver.calls == 6, "another peer: its own entry");
  peer[31] ^= 0x01;
  CHECK_STATUS(offload_derive_version(&mclient, "k", 1, peer, true, got, &version, &hit),
               OFFLOAD_OK);
  CHECK(hit && deriver.calls == 6 && version == 1, "version 1 remembered apart");
  CHECK(mclient.stats.hits == 2 && mclient.stats.misses == 6, "hits %u misses %u",
        mclient.stats.hits, mclient.stats.misses);
  /* A refused key id never reaches the memo or the server. */
  CHECK_STATUS(offload_derive_version(&mclient, "", 0, peer, true, got, NULL, NULL),
               OFFLOAD_ERR_ARGUMENT);
  CHECK(deriver.calls == 6 && mclient.stats.misses == 6, "no lookup for a bad key id");
}

/* The maximum age, on the test's own clock: an entry is used while younger, never at or past
 * it, and is wiped then. */
static void test_memo_expiry(void) {
  uint8_t peer[32], old_key[32], got[32];
  memo_client(true);
  CHECK_STATUS(offload_client_set_memo_max_age(&mclient, 1000), OFFLOAD_OK);
  CHECK(derive_peer("exp", 1) == 1, "first: a request");
  peer_of(1, peer);
  expected_key("exp", 1, peer, true, old_key);
  CHECK(client_holds(&mclient, old_key), "the memo holds the key");
  test_now = 999;
  CHECK(derive_peer("exp", 1) == 0, "at 999 ms of 1000: from the memo");
  test_now = 1000;
  CHECK(derive_peer("exp", 2) == 1 && mclient.stats.expired == 1,
        "at 1000 ms the entry expired (wiped by the next lookup): expired %u",
        mclient.stats.expired);
  CHECK(!client_holds(&mclient, old_key), "an expired entry's key is wiped");
  CHECK(derive_peer("exp", 1) == 1, "and is asked again");
  /* A clock that goes back: the entry counts as expired, never as young. */
  test_now = 500;
  CHECK(derive_peer("exp", 1) == 1 && mclient.stats.expired == 3,
        "stamped in the clock's future: expired %u", mclient.stats.expired);
  /* No clock: the memo is not used; setting one wipes it. */
  CHECK_STATUS(offload_client_set_clock(&mclient, NULL, NULL), OFFLOAD_OK);
  CHECK(mclient.memo_count == 0 && !client_holds(&mclient, old_key), "set_clock wipes");
  CHECK(derive_peer("exp", 1) == 1 && derive_peer("exp", 1) == 1, "no clock: every call asks");
  /* Maximum age 0: not used either. */
  CHECK_STATUS(offload_client_set_clock(&mclient, test_clock, &test_now), OFFLOAD_OK);
  CHECK(derive_peer("exp", 1) == 1 && derive_peer("exp", 1) == 0, "memo back");
  CHECK_STATUS(offload_client_set_memo_max_age(&mclient, 0), OFFLOAD_OK);
  CHECK(mclient.memo_count == 0, "max age 0 wipes the memo");
  CHECK(derive_peer("exp", 1) == 1 && derive_peer("exp", 1) == 1, "max age 0: every call asks");
  /* Reset wipes every slot, the counters stay. */
  CHECK_STATUS(offload_client_set_memo_max_age(&mclient, OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS),
               OFFLOAD_OK);
  CHECK(derive_peer("exp", 1) == 1 && derive_peer("exp", 2) == 1, "two entries");
  offload_client_reset(&mclient);
  CHECK(mclient.memo_count == 0 && all_zero(mclient.memo, sizeof mclient.memo) &&
            mclient.stats.misses > 0,
        "reset: every slot zero");
  CHECK(derive_peer("exp", 1) == 1, "after a reset: asked again");
  (void)got;
}

/* Evicted entries are wiped; an error is never remembered. */
static void test_memo_wipe_and_errors(void) {
  uint8_t peer[32], first[32], got[32];
  int i;
  memo_client(true);
  peer_of(0, peer);
  expected_key("w", 1, peer, true, first);
  for (i = 0; i <= OFFLOAD_MEMO_SLOTS; ++i) derive_peer("w", i);
  CHECK(mclient.stats.evictions == 1 && !client_holds(&mclient, first),
        "the evicted entry's key is wiped");
  /* An error is not remembered: the same call asks again. */
  deriver.error_status = 400;
  deriver.error_body = "{\"code\":\"invalid_argument\",\"message\":\"small order\"}";
  peer_of(1000, peer);
  CHECK_STATUS(offload_derive(&mclient, "w", peer, true, got, NULL), OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(offload_derive(&mclient, "w", peer, true, got, NULL), OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(deriver.calls == OFFLOAD_MEMO_SLOTS + 3, "errors asked twice: %d", deriver.calls);
  CHECK(mclient.memo_count == OFFLOAD_MEMO_SLOTS && mclient.stats.dropped == 0,
        "an error about one message keeps the key's entries");
  deriver.error_body = NULL;
}

/* A refusal about the key drops every entry of that key id at once, and only those. */
static void test_memo_refusals(void) {
  static const struct {
    int status;
    const char* body;
    offload_status_t want;
  } refusals[] = {
      {400, "{\"code\":\"failed_precondition\",\"message\":\"key \\\"a\\\" is disabled\"}",
       OFFLOAD_ERR_FAILED_PRECONDITION},
      {404, "{\"code\":\"not_found\",\"message\":\"key \\\"a\\\" is not in the store\"}",
       OFFLOAD_ERR_NOT_FOUND},
      {403, "{\"code\":\"permission_denied\",\"message\":\"not granted\"}",
       OFFLOAD_ERR_PERMISSION_DENIED},
  };
  size_t r;
  for (r = 0; r < sizeof refusals / sizeof refusals[0]; ++r) {
    uint8_t peer[32], got[32];
    memo_client(true);
    derive_peer("a", 1);
    derive_peer("a", 2);
    derive_peer("b", 1);
    CHECK(derive_peer("a", 1) == 0 && derive_peer("b", 1) == 0, "remembered");
    deriver.error_status = refusals[r].status;
    deriver.error_body = refusals[r].body;
    peer_of(3, peer);
    CHECK_STATUS(offload_derive(&mclient, "a", peer, true, got, NULL), refusals[r].want);
    deriver.error_body = NULL;
    CHECK(mclient.stats.dropped == 2 && mclient.memo_count == 1,
          "%s: both entries of key a dropped (dropped %u, %d left)",
          offload_status_name(refusals[r].want), mclient.stats.dropped, mclient.memo_count);
    CHECK(derive_peer("b", 1) == 0, "key b's entry stays");
    CHECK(derive_peer("a", 1) == 1, "key a asks the server again");
  }
  /* The server's Seal and Open refusals drop the key too. */
  memo_client(true);
  derive_peer("a", 1);
  deriver.error_status = 400;
  deriver.error_body = "{\"code\":\"failed_precondition\",\"message\":\"disabled\"}";
  {
    uint8_t peer[32], pt[4] = {1, 2, 3, 4}, ct[64], out[64], nonce[24] = {0};
    size_t len = 0;
    peer_of(9, peer);
    mclient.local_box = false; /* the server's box, for this check */
    CHECK_STATUS(offload_box_seal(&mclient, "a", peer, nonce, pt, sizeof pt, ct, sizeof ct, &len,
                                  NULL),
                 OFFLOAD_ERR_FAILED_PRECONDITION);
    CHECK(mclient.stats.dropped == 1 && mclient.memo_count == 0, "a refused Seal drops the key");
    deriver.error_body = NULL;
    derive_peer("a", 1);
    deriver.error_body = "{\"code\":\"failed_precondition\",\"message\":\"disabled\"}";
    memset(ct, 0, sizeof ct);
    CHECK_STATUS(offload_box_open(&mclient, "a", 0, peer, nonce, ct, 20, out, sizeof out, &len,
                                  NULL),
                 OFFLOAD_ERR_FAILED_PRECONDITION);
    CHECK(mclient.stats.dropped == 2 && mclient.memo_count == 0, "a refused Open drops the key");
  }
  deriver.error_body = NULL;
}
#endif /* OFFLOAD_MEMO_SLOTS > 0 */

/* Without slots (OFFLOAD_MEMO_SLOTS 0) a clock changes nothing: every call asks the server. */
static void test_memo_compiled_out(void) {
#if OFFLOAD_MEMO_SLOTS == 0
  int i, made = 0;
  memo_client(true);
  for (i = 0; i < 6; ++i) made += derive_peer("off", i % 2);
  CHECK(made == 6 && mclient.stats.hits == 0 && mclient.stats.misses == 0,
        "memo compiled out: %d requests for 6 derives", made);
  CHECK(!mclient.local_box, "no local box without the memo");
#endif
}

/* UNAUTHENTICATED asks the provider once, then sends the call once more. */
static const char* provided_token;
static int provider_asks;
static const char* token_provider(void* ctx) {
  ++provider_asks;
  CHECK(ctx == &provider_asks, "provider ctx");
  return provided_token;
}

static void test_token_provider(void) {
  uint8_t peer[32], got[32];
  memo_client(false);
  peer_of(1, peer);
  deriver.want_token = "fresh.token";
  CHECK_STATUS(offload_client_set_token(&mclient, "stale.token"), OFFLOAD_OK);
  /* No provider: one request, UNAUTHENTICATED. */
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(deriver.calls == 1 && mclient.last_http_status == 401, "no provider: one request");
  /* A provider with a good token: asked once, the call sent again with it, same bytes. */
  provided_token = "fresh.token";
  provider_asks = 0;
  CHECK_STATUS(offload_client_set_token_provider(&mclient, token_provider, &provider_asks),
               OFFLOAD_OK);
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_OK);
  CHECK(deriver.calls == 3 && provider_asks == 1 && mclient.stats.token_refreshes == 1 &&
            mclient.token == provided_token && mclient.last_http_status == 200 &&
            mclient.last_error_message[0] == '\0',
        "refreshed: calls %d asks %d", deriver.calls, provider_asks);
  CHECK_STATUS(offload_derive(&mclient, "t", peer, false, got, NULL), OFFLOAD_OK);
  CHECK(deriver.calls == 4 && provider_asks == 1, "the new token stays");
  /* The server refuses the new token too: asked once, retried once, then UNAUTHENTICATED. */
  deriver.want_token = "other";
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(deriver.calls == 6 && provider_asks == 2, "one retry only: calls %d asks %d",
        deriver.calls, provider_asks);
  CHECK(strstr(mclient.last_error_message, "does not verify") != NULL, "message '%s'",
        mclient.last_error_message);
  /* A provider with nothing (NULL) or a token that is not token68: no retry, token kept. */
  provided_token = NULL;
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(deriver.calls == 7 && provider_asks == 3, "NULL: no retry");
  provided_token = "bad token";
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(deriver.calls == 8 && provider_asks == 4 && strcmp(mclient.token, "fresh.token") == 0,
        "a refused token: no retry, the previous token stays");
  CHECK(mclient.stats.dropped == 0, "UNAUTHENTICATED drops nothing");
  CHECK_STATUS(offload_client_set_token_provider(&mclient, NULL, NULL), OFFLOAD_OK);
  CHECK_STATUS(offload_derive(&mclient, "t", peer, true, got, NULL), OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(deriver.calls == 9 && provider_asks == 4, "provider removed");
}

/* The local box: seal and open on the device with the remembered box key, checked against
 * libsodium's crypto_box with the peer's secret; a tampered box fails locally and drops nothing. */
static void test_local_box(void) {
#if OFFLOAD_LOCAL_BOX && OFFLOAD_MEMO_SLOTS > 0
  uint8_t peer_pk[32], peer_sk[32], server_sk[32], server_pk[32];
  uint8_t pt[40], ct[40 + 16], out[64], nonce[24], nonce2[24];
  size_t len = 0;
  bool hit = false;
  int i;
  memo_client(true);
  CHECK(mclient.local_box, "libsodium initialised");
  crypto_box_keypair(peer_pk, peer_sk);
  version_secret("box", 1, server_sk);
  crypto_scalarmult_base(server_pk, server_sk);
  for (i = 0; i < (int)sizeof pt; ++i) pt[i] = (uint8_t)(3 * i);
  /* Seal with a nonce picked on the device: one Derive, then local. */
  CHECK_STATUS(offload_box_seal(&mclient, "box", peer_pk, NULL, pt, sizeof pt, ct, sizeof ct, &len,
                                nonce),
               OFFLOAD_OK);
  CHECK(len == sizeof ct && deriver.calls == 1, "seal: one derive, len %zu", len);
  CHECK(crypto_box_open_easy(out, ct, len, nonce, server_pk, peer_sk) == 0 &&
            memcmp(out, pt, sizeof pt) == 0,
        "the peer opens the device's box");
  CHECK_STATUS(offload_box_seal(&mclient, "box", peer_pk, NULL, pt, sizeof pt, ct, sizeof ct, &len,
                                nonce2),
               OFFLOAD_OK);
  CHECK(deriver.calls == 1 && memcmp(nonce, nonce2, 24) != 0, "second seal: no request, new nonce");
  /* Open what the peer sealed: no request. */
  CHECK(crypto_box_easy(ct, pt, sizeof pt, nonce, server_pk, peer_sk) == 0, "peer seals");
  CHECK_STATUS(offload_box_open(&mclient, "box", 0, peer_pk, nonce, ct, sizeof ct, out, sizeof out,
                                &len, &hit),
               OFFLOAD_OK);
  CHECK(len == sizeof pt && memcmp(out, pt, sizeof pt) == 0 && hit && deriver.calls == 1,
        "open on the device from the memo");
  CHECK(crypto_box_easy(ct, pt, 0, nonce, server_pk, peer_sk) == 0, "empty box");
  CHECK_STATUS(offload_box_open(&mclient, "box", 0, peer_pk, nonce, ct, 16, NULL, 0, &len, NULL),
               OFFLOAD_OK);
  CHECK(len == 0, "empty box opened");
  CHECK_STATUS(offload_box_seal(&mclient, "box", peer_pk, nonce, NULL, 0, ct, sizeof ct, &len,
                                NULL),
               OFFLOAD_OK);
  CHECK(len == 16 && crypto_box_open_easy(out, ct, 16, nonce, server_pk, peer_sk) == 0,
        "empty seal with the caller's nonce");
  /* Tampered: INVALID_ARGUMENT as the server says it, no request, nothing dropped. */
  CHECK(crypto_box_easy(ct, pt, sizeof pt, nonce, server_pk, peer_sk) == 0, "peer seals");
  ct[20] ^= 1;
  CHECK_STATUS(offload_box_open(&mclient, "box", 0, peer_pk, nonce, ct, sizeof ct, out, sizeof out,
                                &len, NULL),
               OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(mclient.last_error_message, "authentication failed") == 0 &&
            mclient.last_http_status == 0 && deriver.calls == 1 && mclient.memo_count == 1,
        "tampered box: '%s', %d requests", mclient.last_error_message, deriver.calls);
  /* Shared with offload_derive(box): the same entry. */
  CHECK(derive_peer("box", 999) == 1, "another peer");
  {
    uint8_t k[32], want[32];
    CHECK_STATUS(offload_derive(&mclient, "box", peer_pk, true, k, &hit), OFFLOAD_OK);
    CHECK(crypto_box_beforenm(want, server_pk, peer_sk) == 0 && memcmp(k, want, 32) == 0 && hit &&
              deriver.calls == 2,
          "the box key the seal remembered serves a derive");
  }
  CHECK(all_zero(&mclient.msg, sizeof mclient.msg) && all_zero(wire, sizeof wire),
        "client memory wiped after local boxes");
#endif
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
  offload_transport_request_t r = {"/offload.v1.X25519Service/Derive", NULL, body, sizeof body,
                                   NULL};
  int count = offload_http1_request(head, sizeof head, "localhost", 8443, true, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strcmp(joined,
                   "POST /offload.v1.X25519Service/Derive HTTP/1.1\r\nHost: localhost:8443\r\n"
                   "Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
                   "Accept-Encoding: identity\r\nContent-Length: 3\r\n\r\nxyz") == 0,
        "keep-alive request without a token: %d parts, '%s'", count, joined);
  /* An IPv6 literal is bracketed in Host; one given bracketed is left as it is. */
  count = offload_http1_request(head, sizeof head, "::1", 8443, true, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "\r\nHost: [::1]:8443\r\n") != NULL,
        "IPv6 Host: '%s'", joined);
  count = offload_http1_request(head, sizeof head, "[::1]", 8443, true, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "\r\nHost: [::1]:8443\r\n") != NULL,
        "bracketed IPv6 Host: '%s'", joined);
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
  /* The key id, for routers: sent when it cannot break the head, left out otherwise. */
  r.bearer_token = NULL;
  r.key_id = "dh-1";
  count = offload_http1_request(head, sizeof head, "h", 80, false, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "\r\nContent-Length: 3\r\nX-Offload-Key: dh-1\r\n\r\nxyz") != NULL,
        "the key id as X-Offload-Key: '%s'", joined);
  r.key_id = "dh-1\r\nX-Evil: 1";
  count = offload_http1_request(head, sizeof head, "h", 80, false, &r, parts);
  CHECK(count == 2 && join(parts, count, joined, sizeof joined) > 0 &&
            strstr(joined, "X-Offload-Key") == NULL && strstr(joined, "X-Evil") == NULL,
        "a key id with CR LF is not sent: '%s'", joined);
  r.key_id = NULL;
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
  offload_transport_request_t request = {"/offload.v1.X25519Service/Derive", NULL, req, sizeof req,
                                         NULL};

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
  if (sodium_init() < 0) return 1;
  CHECK_STATUS(offload_client_init(&client, fake_transport, &fake, wire, sizeof wire), OFFLOAD_OK);
  test_derive();
  test_connect_errors();
  test_box_and_verify();
  test_small_buffer();
  test_token();
#if OFFLOAD_MEMO_SLOTS > 0
  test_memo_lru();
  test_memo_key_fields();
  test_memo_expiry();
  test_memo_wipe_and_errors();
  test_memo_refusals();
#endif
  test_memo_compiled_out();
  test_token_provider();
  test_local_box();
  test_http1_request();
  test_http1_reader();
  test_posix_transport();
  printf("embedded_unit_test: %d checks, %d failures (client struct %zu bytes with %d memo "
         "slots of %zu bytes, local box %d; buffer %zu)\n",
         checks, failures, sizeof(offload_client_t), OFFLOAD_MEMO_SLOTS,
         sizeof(offload_memo_slot_t), OFFLOAD_LOCAL_BOX, (size_t)OFFLOAD_CLIENT_BUF_SIZE);
  return failures == 0 ? 0 : 1;
}
