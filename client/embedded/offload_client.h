/* offload_client.h - the no-heap C99 client of crypto-offload for ESP32-class devices.
 *
 * Each call builds one nanopb-encoded offload.v1 request, hands it to a transport callback that the
 * platform supplies (one Connect unary POST), and decodes the response or the Connect error JSON.
 * Nothing is allocated: the encoded request and the response go into one buffer the caller gives to
 * offload_client_init(), and the decoded messages live in the offload_client_t itself (about
 * OFFLOAD_CLIENT_STRUCT_SIZE bytes; declare it static rather than on a small task stack).
 *
 *   static offload_client_t client;
 *   static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
 *   static offload_posix_transport_t http;               // or an esp_http_client transport
 *   offload_posix_transport_init(&http, "127.0.0.1", 8080);
 *   offload_client_init(&client, offload_posix_transport, &http, wire, sizeof wire);
 *   offload_client_set_token(&client, token);           // optional: `Authorization: Bearer`
 *   uint8_t shared[32]; bool memo_hit;
 *   offload_status_t s = offload_derive(&client, "dev1", peer_pk, true, shared, &memo_hit);
 *   if (s != OFFLOAD_OK) log("derive: %s (%s)", offload_status_name(s), client.last_error_message);
 *
 * The client remembers (the derive memo, README.md "The derive memo"): once a clock is set,
 * a derive result is kept in one of OFFLOAD_MEMO_SLOTS fixed slots inside the offload_client_t,
 * so a repeated (key id, version, output, peer) costs no round trip until its maximum age:
 *
 *   offload_client_set_clock(&client, device_clock_ms, NULL);   // monotonic milliseconds
 *
 * With OFFLOAD_LOCAL_BOX (libsodium), box seal and open run on the device with the remembered
 * box key.
 *
 * Thread-safety: an offload_client_t serves one call at a time; use one per task, or a lock.
 * Secrets: the shared keys and plaintexts that pass through the client's own memory (its message
 * structs and the response part of `buf`) are wiped before each call returns. Remembered shared
 * keys are wiped when evicted, expired, dropped, reset, or when a new clock is set.
 */
#ifndef CLIENT_EMBEDDED_OFFLOAD_CLIENT_H_
#define CLIENT_EMBEDDED_OFFLOAD_CLIENT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/v1/box.pb.h"
#include "offload/v1/ed25519.pb.h"
#include "offload/v1/x25519.pb.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes fixed by the API (proto/offload/v1). */
#define OFFLOAD_X25519_KEY_SIZE 32
#define OFFLOAD_ED25519_PUBLIC_KEY_SIZE 32
#define OFFLOAD_ED25519_SIGNATURE_SIZE 64
#define OFFLOAD_BOX_NONCE_SIZE 24
#define OFFLOAD_BOX_TAG_SIZE 16
#define OFFLOAD_KEY_ID_MAX_LEN 64

/* Largest plaintext (box) or message (verify) this build can carry: the nanopb .options bound,
 * set by the CMake cache variable OFFLOAD_EMBEDDED_MAX_MESSAGE (default 1024). */
#define OFFLOAD_MAX_MESSAGE (sizeof(((offload_v1_BoxSealRequest*)0)->plaintext.bytes))
#define OFFLOAD_MAX_CIPHERTEXT (OFFLOAD_MAX_MESSAGE + OFFLOAD_BOX_TAG_SIZE)

#define OFFLOAD_MAX_(a, b) ((a) > (b) ? (a) : (b))
/* Largest encoded request and response of any call this client makes. */
#define OFFLOAD_MAX_REQUEST_SIZE                                                          \
  OFFLOAD_MAX_(OFFLOAD_MAX_(offload_v1_DeriveRequest_size, offload_v1_BoxSealRequest_size), \
               OFFLOAD_MAX_(offload_v1_BoxOpenRequest_size, offload_v1_VerifyRequest_size))
/* A response region also has to hold a Connect error JSON body; 256 bytes covers the code and
 * the start of the message, which is all the client reads. */
#define OFFLOAD_MAX_RESPONSE_SIZE                                                              \
  OFFLOAD_MAX_(OFFLOAD_MAX_(OFFLOAD_MAX_(offload_v1_DeriveResponse_size,                       \
                                         offload_v1_BoxSealResponse_size),                     \
                            OFFLOAD_MAX_(offload_v1_BoxOpenResponse_size,                      \
                                         offload_v1_VerifyResponse_size)),                     \
               256)
/* A `buf` of this size lets every call of this build go through. */
#define OFFLOAD_CLIENT_BUF_SIZE (OFFLOAD_MAX_REQUEST_SIZE + OFFLOAD_MAX_RESPONSE_SIZE)

/* What a call returns. OFFLOAD_OK is 0; the Connect codes are 100 + the canonical gRPC code, so
 * `status - 100` is the number an ItemStatus or a gRPC client would show. */
typedef enum offload_status {
  OFFLOAD_OK = 0,
  OFFLOAD_ERR_ARGUMENT = 1,         /* caller mistake caught locally: NULL, key id, size > bound */
  OFFLOAD_ERR_BUFFER_TOO_SMALL = 2, /* `buf` or an output buffer cannot hold the data */
  OFFLOAD_ERR_ENCODE = 3,           /* nanopb could not encode the request */
  OFFLOAD_ERR_TRANSPORT = 4,        /* the transport callback failed (connect, send, receive) */
  OFFLOAD_ERR_HTTP_STATUS = 5,      /* HTTP status not 200 and no Connect error code in the body */
  OFFLOAD_ERR_DECODE = 6,           /* the 200 response is not a valid message of the bounded type */
  OFFLOAD_ERR_RESPONSE = 7,         /* decoded, but a field has the wrong size */
  OFFLOAD_ERR_CANCELED = 101,
  OFFLOAD_ERR_UNKNOWN = 102,
  OFFLOAD_ERR_INVALID_ARGUMENT = 103,
  OFFLOAD_ERR_DEADLINE_EXCEEDED = 104,
  OFFLOAD_ERR_NOT_FOUND = 105,
  OFFLOAD_ERR_ALREADY_EXISTS = 106,
  OFFLOAD_ERR_PERMISSION_DENIED = 107,
  OFFLOAD_ERR_RESOURCE_EXHAUSTED = 108,
  OFFLOAD_ERR_FAILED_PRECONDITION = 109,
  OFFLOAD_ERR_ABORTED = 110,
  OFFLOAD_ERR_OUT_OF_RANGE = 111,
  OFFLOAD_ERR_UNIMPLEMENTED = 112,
  OFFLOAD_ERR_INTERNAL = 113,
  OFFLOAD_ERR_UNAVAILABLE = 114,
  OFFLOAD_ERR_DATA_LOSS = 115,
  OFFLOAD_ERR_UNAUTHENTICATED = 116
} offload_status_t;

/* Longest bearer token offload_client_set_token() takes, in characters. A JWT signed with Ed25519
 * or ES256 carrying a few claims is 200-500 characters, an RS256 one about 700; the server refuses
 * tokens over its --max_token_bytes (8 KiB by default). */
#define OFFLOAD_TOKEN_MAX_LEN 2048

/* What a transport sends: one Connect unary POST. */
typedef struct offload_transport_request {
  const char* path;         /* "/offload.v1.X25519Service/Derive" */
  const char* bearer_token; /* NULL, or sent as `Authorization: Bearer <bearer_token>`: 1 to
                               OFFLOAD_TOKEN_MAX_LEN characters of token68, see
                               offload_token_length() */
  const uint8_t* body;      /* the encoded request message */
  size_t body_len;
  const char* key_id;       /* NULL (verify), or the key the call is about: a router that sends
                               a key's calls to one replica reads it as `X-Offload-Key` */
} offload_transport_request_t;

/* Return values of a transport callback. */
#define OFFLOAD_TRANSPORT_OK 0
/* The body was longer than `resp_cap`: the first `resp_cap` bytes are in `resp`, `*resp_len` is
 * `resp_cap` and `*http_status` is set. */
#define OFFLOAD_TRANSPORT_OVERFLOW 1
/* Any other value: nothing usable was received. The client keeps it in last_transport_error. */

/* One Connect unary call: an HTTP POST of `request->body` to `request->path` on the server's
 * HTTP (Connect) port. The transport sends
 *   Content-Type: application/proto
 *   Connect-Protocol-Version: 1
 *   Content-Length: <body_len>
 *   Authorization: Bearer <bearer_token>      (only when `bearer_token` is not NULL)
 *   X-Offload-Key: <key_id>                  (when `key_id` is not NULL and is 1 to
 *                                             OFFLOAD_KEY_ID_MAX_LEN visible ASCII characters;
 *                                             the transports here send it, for routers)
 * It stores the response body in
 * `resp` (at most `resp_cap` bytes), its length in `*resp_len` and the HTTP status code in
 * `*http_status`, whatever that status is: a Connect error is a 4xx/5xx with a JSON body
 * {"code":"not_found","message":"..."} that the client reads. Returns OFFLOAD_TRANSPORT_OK,
 * OFFLOAD_TRANSPORT_OVERFLOW, or any other value for a failure. Must not call back into the
 * client. `ctx` is the pointer given to offload_client_init(). */
typedef int (*offload_transport_fn)(void* ctx, const offload_transport_request_t* request,
                                    uint8_t* resp, size_t resp_cap, size_t* resp_len,
                                    int* http_status);

/* Longest Connect error message kept (truncated, NUL-terminated). */
#define OFFLOAD_ERROR_MESSAGE_CAP 128

/* Slots of the derive memo: a compile-time bound (the CMake cache variable
 * OFFLOAD_EMBEDDED_MEMO_SLOTS sets it; a device build passes -DOFFLOAD_MEMO_SLOTS=N to every
 * file that includes this header, since the client struct's size depends on it). 0 compiles the
 * memo out. At most 255. */
#ifndef OFFLOAD_MEMO_SLOTS
#define OFFLOAD_MEMO_SLOTS 24
#endif
#if OFFLOAD_MEMO_SLOTS < 0 || OFFLOAD_MEMO_SLOTS > 255
#error "OFFLOAD_MEMO_SLOTS: expected 0..255"
#endif

/* 1: box seal and open run on the device with the remembered box key (libsodium's
 * crypto_box_easy_afternm / crypto_box_open_easy_afternm; ESP-IDF's libsodium component). Set by
 * the CMake option OFFLOAD_EMBEDDED_LOCAL_BOX (ON when libsodium is found). 0: they go to the
 * server. */
#ifndef OFFLOAD_LOCAL_BOX
#define OFFLOAD_LOCAL_BOX 0
#endif

/* The maximum age of a remembered result unless offload_client_set_memo_max_age() says other. */
#define OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS 300000u

/* A monotonic clock in milliseconds, supplied by the device (ESP-IDF: esp_timer_get_time() /
 * 1000; POSIX: offload_posix_clock_ms() in transport_posix.h). It must never go back; the
 * client treats an entry stamped in its future as expired. `ctx` is the pointer given to
 * offload_client_set_clock(). Must not call back into the client. */
typedef uint64_t (*offload_clock_fn)(void* ctx);

/* Asked for a fresh bearer token when the server answers UNAUTHENTICATED: returns a token that
 * stays alive and unchanged until it is replaced (the device's static buffer, as for
 * offload_client_set_token()), or NULL when it has none. It may fetch one over the network, but
 * must not call back into this client. `ctx` is the pointer given with it. */
typedef const char* (*offload_token_provider_fn)(void* ctx);

/* One remembered derive: the key (compared field by field) and its value. */
typedef struct offload_memo_slot {
  uint64_t stamp_ms;          /* the clock when the server's answer came */
  uint32_t key_version_asked; /* 0 = current */
  uint32_t key_version_used;  /* the version the server used */
  uint8_t used;
  uint8_t box_output;         /* 0: raw X25519 secret, 1: NaCl box key */
  uint8_t key_id_len;
  char key_id[OFFLOAD_KEY_ID_MAX_LEN];
  uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE];
  uint8_t shared_key[OFFLOAD_X25519_KEY_SIZE]; /* secret: wiped when the slot is let go */
} offload_memo_slot_t;

/* What the client counted since offload_client_init(); offload_client_reset() keeps them. */
typedef struct offload_client_stats {
  uint32_t hits;            /* answered from the memo: no round trip */
  uint32_t misses;          /* looked up, not there (or expired): asked the server */
  uint32_t evictions;       /* the least recently used slot given up for a new entry */
  uint32_t expired;         /* entries wiped because they reached the maximum age */
  uint32_t dropped;         /* entries wiped because the server refused their key */
  uint32_t requests;        /* requests handed to the transport (round trips), retries included */
  uint32_t token_refreshes; /* times the token provider was asked after UNAUTHENTICATED */
} offload_client_stats_t;

typedef struct offload_client {
  offload_transport_fn transport;
  void* transport_ctx;
  uint8_t* buf;
  size_t buf_len;
  const char* token; /* the caller's bearer token (offload_client_set_token), or NULL */
  offload_token_provider_fn token_provider; /* offload_client_set_token_provider(), or NULL */
  void* token_provider_ctx;
  offload_clock_fn clock; /* offload_client_set_clock(), or NULL: the memo is not used */
  void* clock_ctx;
  uint32_t memo_max_age_ms; /* offload_client_set_memo_max_age(); 0: the memo is not used */
  /* True when box seal and open run on the device: OFFLOAD_LOCAL_BOX and libsodium initialised
   * (set by offload_client_init()). They still need the memo in use for their key. */
  bool local_box;
  bool wipe_pending; /* the call in progress wrote to `msg` or `buf`: finish wipes them */
  offload_client_stats_t stats;
  /* After each call: the HTTP status (0 if the transport failed), the transport's own return
   * value after OFFLOAD_ERR_TRANSPORT (else 0), and for a Connect error its message (else "").
   * The message never contains secrets (the server's rule). offload_client_set_token() also
   * leaves its reason for a refused token in last_error_message. */
  int last_http_status;
  int last_transport_error;
  char last_error_message[OFFLOAD_ERROR_MESSAGE_CAP];
  /* The decoded messages of the call in progress; wiped before each call returns. */
  union {
    struct {
      offload_v1_DeriveRequest req;
      offload_v1_DeriveResponse resp;
    } derive;
    offload_v1_BoxSealRequest box_seal_req;
    offload_v1_BoxSealResponse box_seal_resp;
    offload_v1_BoxOpenRequest box_open_req;
    offload_v1_BoxOpenResponse box_open_resp;
    struct {
      offload_v1_VerifyRequest req;
      offload_v1_VerifyResponse resp;
    } verify;
  } msg;
#if OFFLOAD_MEMO_SLOTS > 0
  /* The derive memo: memo_lru[0 .. memo_count) are slot indices, least recently used first. */
  uint8_t memo_count;
  uint8_t memo_lru[OFFLOAD_MEMO_SLOTS];
  offload_memo_slot_t memo[OFFLOAD_MEMO_SLOTS];
#endif
} offload_client_t;

#define OFFLOAD_CLIENT_STRUCT_SIZE (sizeof(offload_client_t))

/* Sets up `client` to call through `transport` (with `ctx`) using `buf` for the wire bytes.
 * `buf` must outlive the client; OFFLOAD_CLIENT_BUF_SIZE fits every call, a smaller one fails
 * the calls that do not fit with OFFLOAD_ERR_BUFFER_TOO_SMALL.
 * Returns OFFLOAD_ERR_ARGUMENT for a NULL pointer or a `buf_len` under 64. */
offload_status_t offload_client_init(offload_client_t* client, offload_transport_fn transport,
                                     void* ctx, uint8_t* buf, size_t buf_len);

/* Sends `Authorization: Bearer <token>` with every later call of `client`; NULL stops it. The
 * client keeps the pointer, not a copy (no heap): `token` must stay alive and unchanged until it
 * is replaced or the client is no longer used. A device keeps it in a static buffer and sets the
 * new token between calls when it refreshes it (before its `exp`).
 * Returns OFFLOAD_ERR_ARGUMENT for a token that is empty, over OFFLOAD_TOKEN_MAX_LEN characters
 * or not token68 (see offload_token_length()), with the reason in last_error_message; the
 * previous token then stays. Not while a call runs on `client`. */
offload_status_t offload_client_set_token(offload_client_t* client, const char* token);

/* Asks `provider` (with `ctx`) for a new token when a call is answered UNAUTHENTICATED: the
 * client takes the token it returns (checked as offload_client_set_token() does; a NULL or
 * refused one leaves the previous token) and sends the call once more. Each call asks at most
 * once and is retried at most once, so a server that refuses the new token too costs two
 * requests and the call returns OFFLOAD_ERR_UNAUTHENTICATED. NULL stops it. The client keeps
 * the pointers (no heap). Not while a call runs on `client`. */
offload_status_t offload_client_set_token_provider(offload_client_t* client,
                                                   offload_token_provider_fn provider, void* ctx);

/* Turns the derive memo on with `clock` (NULL turns it off): every entry is stamped with the
 * clock when the server answered, and used while its age is under the maximum age. Wipes what
 * the memo held (stamps of another clock mean nothing). Without a clock, or with
 * OFFLOAD_MEMO_SLOTS 0, every call goes to the server. Not while a call runs on `client`. */
offload_status_t offload_client_set_clock(offload_client_t* client, offload_clock_fn clock,
                                          void* ctx);

/* Entries of this age or older (in milliseconds of the clock) are never used, and wiped at the
 * next call that looks in the memo. Default OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS (300 s); 0 stops
 * the memo being used (and wipes it). Not while a call runs on `client`. */
offload_status_t offload_client_set_memo_max_age(offload_client_t* client, uint32_t max_age_ms);

/* Wipes every slot of the memo (the counters stay). Call it after rotating a key the device
 * uses, to get the new version at once. Not while a call runs on `client`. */
void offload_client_reset(offload_client_t* client);

/* The length of `token` when it is a bearer token the client sends: 1 to OFFLOAD_TOKEN_MAX_LEN
 * characters of token68 (RFC 7235: letters, digits, "-._~+/", then any number of "="), which a
 * JWT is; else 0. Reads at most OFFLOAD_TOKEN_MAX_LEN + 1 characters. Transports use it to
 * check what they are given: no CR or LF reaches a header. */
size_t offload_token_length(const char* token);

/* Zeroes `len` bytes at `p` in a way the compiler may not drop: the client's buffers after each
 * call, and a transport's scratch that held the request head (and so the token). */
void offload_wipe(void* p, size_t len);

/* X25519Service/Derive: the shared key of the managed X25519 key `key_id` (current version) and
 * `peer_public_key`. `box_output` false gives the raw X25519 secret, true the NaCl box key
 * (crypto_box_beforenm). `*memo_hit` (may be NULL) tells whether a memo served it: this
 * client's (no round trip; stats.hits counts those) or the server's derive memo. Writes 32 bytes
 * to `out_shared_key` on success only. With the memo in use, a remembered result is answered
 * without a round trip; after a rotation that is the old version's key until the entry reaches
 * its maximum age or offload_client_reset() (README.md "The derive memo"). */
offload_status_t offload_derive(offload_client_t* client, const char* key_id,
                                const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                bool box_output, uint8_t out_shared_key[OFFLOAD_X25519_KEY_SIZE],
                                bool* memo_hit);

/* offload_derive() with the key version asked for (`key_version` 0 = current) and the version
 * the server used in `*out_key_version` (may be NULL; on success only). A remembered entry is
 * keyed by the version asked for. */
offload_status_t offload_derive_version(offload_client_t* client, const char* key_id,
                                        uint32_t key_version,
                                        const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                        bool box_output,
                                        uint8_t out_shared_key[OFFLOAD_X25519_KEY_SIZE],
                                        uint32_t* out_key_version, bool* memo_hit);

/* BoxService/Seal: crypto_box_easy of `plaintext` from `key_id` (current version) to
 * `peer_public_key`. `nonce` NULL picks a random nonce (the server's, or randombytes_buf() when
 * sealed on the device), returned in `out_nonce` (may be NULL when `nonce` is given). The
 * ciphertext (tag || encrypted, `plaintext_len` + 16 bytes) goes to `ciphertext` (capacity
 * `ciphertext_cap`), its length to `*ciphertext_len`. With `client->local_box` and the memo in
 * use, it is sealed on the device with the remembered box key of (key_id, version 0, peer),
 * asked of the server (Derive) when not remembered.
 * REQUIRES: `plaintext_len` <= OFFLOAD_MAX_MESSAGE. */
offload_status_t offload_box_seal(offload_client_t* client, const char* key_id,
                                  const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                  const uint8_t nonce[OFFLOAD_BOX_NONCE_SIZE],
                                  const uint8_t* plaintext, size_t plaintext_len,
                                  uint8_t* ciphertext, size_t ciphertext_cap,
                                  size_t* ciphertext_len,
                                  uint8_t out_nonce[OFFLOAD_BOX_NONCE_SIZE]);

/* BoxService/Open: crypto_box_open_easy of `ciphertext` sent by `peer_public_key` to `key_id`
 * (`key_version` 0 = current). The plaintext goes to `plaintext` (capacity `plaintext_cap`),
 * its length to `*plaintext_len`. A ciphertext that does not authenticate is
 * OFFLOAD_ERR_INVALID_ARGUMENT ("authentication failed"). `*memo_hit` (may be NULL): the box
 * key came from a memo (this client's or the server's). With `client->local_box` and the memo in
 * use, it is opened on the device with the remembered box key of (key_id, key_version, peer),
 * asked of the server (Derive) when not remembered.
 * REQUIRES: 16 <= `ciphertext_len` <= OFFLOAD_MAX_CIPHERTEXT. */
offload_status_t offload_box_open(offload_client_t* client, const char* key_id,
                                  uint32_t key_version,
                                  const uint8_t peer_public_key[OFFLOAD_X25519_KEY_SIZE],
                                  const uint8_t nonce[OFFLOAD_BOX_NONCE_SIZE],
                                  const uint8_t* ciphertext, size_t ciphertext_len,
                                  uint8_t* plaintext, size_t plaintext_cap,
                                  size_t* plaintext_len, bool* memo_hit);

/* Ed25519Service/Verify: `*valid` is true when `signature` over `message` verifies under
 * `public_key` by the service's policy; an invalid signature is OFFLOAD_OK with false.
 * `*memo_hit` (may be NULL): the verify memo answered.
 * REQUIRES: `message_len` <= OFFLOAD_MAX_MESSAGE. */
offload_status_t offload_verify(offload_client_t* client,
                                const uint8_t public_key[OFFLOAD_ED25519_PUBLIC_KEY_SIZE],
                                const uint8_t* message, size_t message_len,
                                const uint8_t signature[OFFLOAD_ED25519_SIGNATURE_SIZE],
                                bool* valid, bool* memo_hit);

/* "ok", "not_found", "buffer_too_small"...: the Connect code name for Connect codes. */
const char* offload_status_name(offload_status_t status);

/* The status for a Connect error code string ("not_found" -> OFFLOAD_ERR_NOT_FOUND), or
 * OFFLOAD_ERR_UNKNOWN for an unknown one. Exposed for tests. */
offload_status_t offload_status_from_connect_code(const char* code, size_t code_len);

/* Reads "code" (and "message" into `message`, capacity `message_cap`, may be 0) from a Connect
 * error JSON body of `len` bytes with a bounded scan. Returns OFFLOAD_ERR_HTTP_STATUS when there is
 * no "code" string. Exposed for tests. */
offload_status_t offload_parse_connect_error(const uint8_t* body, size_t len, char* message,
                                             size_t message_cap);

#ifdef __cplusplus
}
#endif

#endif /* CLIENT_EMBEDDED_OFFLOAD_CLIENT_H_ */
