/* offload.h: the C ABI of the crypto-offload client, for C and for FFI (Swift, Kotlin/JNI, Dart,
 * Python ctypes, Node). A thin layer over the C++ client (client/cpp/client.h, with the whole
 * story in client/cpp/README.md): same deadlines, retries, failover, key affinity over several
 * endpoints, auto-batching of concurrent verify / derive / aead_open calls and memos that answer
 * repeated work with no round trip, all with the C++ client's default options except the
 * deadline, the credentials, the bearer token and the memos' settings.
 *
 *   offload_client_t* c = NULL;
 *   if (offload_client_create("127.0.0.1:50051", 5000, &c) != OFFLOAD_OK) {   // plain text
 *     fprintf(stderr, "%s\n", offload_last_error());
 *   }
 *   int valid = 0;
 *   offload_status_t s = offload_verify(c, pk, 32, msg, msg_len, sig, 64, &valid);
 *   offload_client_destroy(c);
 *
 * With TLS, a client certificate (mTLS) and/or a bearer token:
 *
 *   offload_client_options_t o;
 *   offload_client_options_init(&o);              // zeroes it and sets o.struct_size
 *   o.endpoints = "offload.internal:50051";
 *   o.timeout_ms = 5000;
 *   o.tls_ca_file = "/etc/offload/ca.crt";        // or o.tls_ca_pem = "-----BEGIN ...";
 *   o.tls_cert_file = "/etc/offload/client.crt";  // mTLS: certificate and key, files or PEM text
 *   o.tls_key_file = "/etc/offload/client.key";
 *   o.bearer_token = jwt;                         // "authorization: Bearer <jwt>" on every call
 *   if (offload_client_create_with_options(&o, &c) != OFFLOAD_OK) { ... offload_last_error() ... }
 *   ...
 *   offload_client_set_token(c, fresh_jwt);       // before the first one expires
 *
 * With the derive and open memos (off unless asked for; each needs a maximum age):
 *
 *   o.flags = OFFLOAD_CLIENT_DERIVE_MEMO | OFFLOAD_CLIENT_OPEN_MEMO;
 *   o.derive_memo_max_age_ms = 300000;            // required with the flag
 *   o.open_memo_max_age_ms = 300000;
 *   o.open_memo_bytes = 8 << 20;                  // 0: the default (8 MB for open, 1 MB else)
 *   ...
 *   offload_client_stats_t st = {sizeof(st)};
 *   offload_client_get_stats(c, &st);             // st.open_memo.hits, st.rpcs, ...
 *   offload_client_reset(c);                      // wipes every memo
 *
 * Conventions:
 * - Every function returns an offload_status_t. The codes 0-16 are gRPC's canonical codes (what
 *   the service or the transport said); OFFLOAD_BUFFER_TOO_SMALL is this library's own.
 * - offload_last_error() is the message of the last failed call on the calling thread (any
 *   client); valid until the next call on that thread. Messages never contain secrets.
 * - Outputs go to caller-owned buffers: `out` points to `*out_len` bytes of room. On success
 *   `*out_len` is set to the bytes written. When the room is short, nothing is written, the call
 *   returns OFFLOAD_BUFFER_TOO_SMALL and `*out_len` is the size required (`out` may be NULL with
 *   `*out_len` == 0 to ask). The operation has then run once (for seal: with a nonce that is
 *   discarded); calling again with enough room runs it again (or a memo answers it: the first
 *   call's answer was remembered).
 * - Byte inputs are (pointer, length); a NULL pointer is allowed when the length is 0. Strings
 *   (endpoints, key ids) are NUL-terminated UTF-8.
 * - Thread-safe: one client may be used by any number of threads at once (that is how calls get
 *   batched). offload_client_destroy waits for calls in progress; no call may start after it.
 * - No C++ exception crosses this boundary.
 *
 * Deadlines, retries and failover (per call, within its deadline, `timeout_ms`):
 * - A call is sent only on a connected channel. If its endpoint has none and another endpoint is
 *   usable, it fails over at once (after at most 1 s for an endpoint's first connection); with
 *   nowhere else to go it waits for the connection until its deadline while the channel redials
 *   (25 ms, then x1.6, at most 1 s apart), so a server that starts or restarts in time is
 *   reached. Waiting is not an attempt; at the deadline the call returns OFFLOAD_DEADLINE_EXCEEDED.
 * - An RPC answered UNAVAILABLE is retried, at most 4 RPCs per call: on the key's next endpoint
 *   at once, or on the same one after a backoff (25 ms doubling to 1 s, with jitter). Other
 *   answers, DEADLINE_EXCEEDED of a sent RPC included, are returned as they are. Every function
 *   retries, key creation and import too (a retry after a lost answer says ALREADY_EXISTS).
 * - Every call ends by its deadline (give or take scheduling), OFFLOAD_DEADLINE_EXCEEDED or
 *   OFFLOAD_UNAVAILABLE when the service could not be reached.
 * - A server certificate that TLS refuses (not signed by the CAs given, or without the expected
 *   name) is not waited out: the call fails over to another endpoint, or returns
 *   OFFLOAD_UNAVAILABLE at once with gRPC's reason ("... Ssl handshake failed: ... certificate
 *   verify failed", "Peer name 127.0.0.1 is not in peer certificate"). A server that refuses the
 *   client certificate closes the connection after the handshake (TLS 1.3): that is waited out
 *   like any lost connection ("Endpoint read failed" in the message).
 * - Several endpoints: each key id (for verify: each public key) has one endpoint by rendezvous
 *   hashing. An endpoint that fails is left for 0.5 s (doubling to 30 s while it keeps failing)
 *   and its keys go to their next endpoint; after a lost or refused connection it gets them back
 *   as soon as it is connected again (about 1 s after it listens, while calls flow). Keys of the
 *   other endpoints never move, and an auto-batch is sent to the endpoint it was grouped for.
 * - A refusal that says when to come back (RESOURCE_EXHAUSTED or UNAVAILABLE carrying a
 *   google.rpc.RetryInfo) is retried after at least that delay, within the 4 RPCs and the
 *   deadline; RESOURCE_EXHAUSTED without one is returned as it is.
 *
 * Memos (client/cpp/README.md, "Memos"), one set per client, shared by its threads and endpoints:
 * - verify (on, 1 MB; OFFLOAD_CLIENT_NO_VERIFY_MEMO turns it off): a signature found valid is
 *   valid again with no RPC; an invalid one is asked every time. No maximum age.
 * - derive (OFFLOAD_CLIENT_DERIVE_MEMO, 1 MB) and open (OFFLOAD_CLIENT_OPEN_MEMO, 8 MB): the
 *   shared key of (key id, current version, output, peer) and the plaintext of (key id, envelope,
 *   associated data), so a wrong associated data never hits; offload_aead_seal records the
 *   envelope it made. A failed open is never remembered. Each needs a maximum age in ms
 *   (INVALID_ARGUMENT without one): an entry older than that is never used.
 * - Entries are named by keyed digests (a random key per client), least recently used by bytes
 *   within each bound, and the shared keys and plaintexts in them are wiped when dropped; a hit
 *   is copied into the caller's buffer like an answer from the service.
 * - A refusal about a key (OFFLOAD_NOT_FOUND, OFFLOAD_FAILED_PRECONDITION, OFFLOAD_PERMISSION_DENIED
 *   from any call naming it) drops that key's entries at once, and so do this client's own
 *   offload_key_disable, deletions and key creations (a new key under an id deleted elsewhere);
 *   an error about one input (OFFLOAD_INVALID_ARGUMENT) does not. Otherwise a disabled, deleted
 *   or retired key's remembered results stop being used within the maximum age. After a
 *   rotation, derive entries asked as "current" keep the old version's key until their age runs
 *   out.
 */
#ifndef CLIENT_C_OFFLOAD_H_
#define CLIENT_C_OFFLOAD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define OFFLOAD_API __attribute__((visibility("default")))
#else
#define OFFLOAD_API
#endif

typedef enum offload_status {
  OFFLOAD_OK = 0,
  OFFLOAD_CANCELLED = 1,
  OFFLOAD_UNKNOWN = 2,
  OFFLOAD_INVALID_ARGUMENT = 3,
  OFFLOAD_DEADLINE_EXCEEDED = 4,
  OFFLOAD_NOT_FOUND = 5,
  OFFLOAD_ALREADY_EXISTS = 6,
  OFFLOAD_PERMISSION_DENIED = 7,
  OFFLOAD_RESOURCE_EXHAUSTED = 8,
  OFFLOAD_FAILED_PRECONDITION = 9,
  OFFLOAD_ABORTED = 10,
  OFFLOAD_OUT_OF_RANGE = 11,
  OFFLOAD_UNIMPLEMENTED = 12,
  OFFLOAD_INTERNAL = 13,
  OFFLOAD_UNAVAILABLE = 14,
  OFFLOAD_DATA_LOSS = 15,
  OFFLOAD_UNAUTHENTICATED = 16,
  /* An output buffer is too small; its length argument now holds the size required. */
  OFFLOAD_BUFFER_TOO_SMALL = 100
} offload_status_t;

typedef enum offload_key_type {
  OFFLOAD_KEY_ED25519 = 1,
  OFFLOAD_KEY_X25519 = 2,
  OFFLOAD_KEY_CHACHA20_POLY1305 = 3,
  OFFLOAD_KEY_XCHACHA20_POLY1305 = 4,
  OFFLOAD_KEY_AES256_GCM = 5,
  /* Not a key type: makes the enum as wide as an int, so that a caller's out-of-range value is
   * a checked error in the library, not undefined behaviour in C++. */
  OFFLOAD_KEY_TYPE_FORCE_INT_ = 0x7fffffff
} offload_key_type_t;

typedef enum offload_derive_output {
  OFFLOAD_DERIVE_RAW = 1,           /* the raw X25519 shared secret */
  OFFLOAD_DERIVE_BOX_BEFORENM = 2,  /* crypto_box_beforenm's precomputed key */
  OFFLOAD_DERIVE_OUTPUT_FORCE_INT_ = 0x7fffffff  /* as above: not an output */
} offload_derive_output_t;

/* Sizes of the fixed-size values. */
#define OFFLOAD_ED25519_PUBLIC_KEY_BYTES 32
#define OFFLOAD_ED25519_SIGNATURE_BYTES 64
#define OFFLOAD_X25519_KEY_BYTES 32
#define OFFLOAD_BOX_NONCE_BYTES 24
#define OFFLOAD_BOX_MAC_BYTES 16

typedef struct offload_client offload_client_t;

/* The message of the last failed call on this thread ("" when none). Never NULL. */
OFFLOAD_API const char* offload_last_error(void);
/* "OK", "INVALID_ARGUMENT", ..., "BUFFER_TOO_SMALL". Never NULL; static storage. */
OFFLOAD_API const char* offload_status_name(offload_status_t status);

/* Makes a client for `endpoints` ("host:port[,host:port...]" or "dns:host:port") with a per-call
 * deadline of `timeout_ms` (0 = the default, 5000), covering the wait for a connection, the
 * retries and their backoff (see above). Plain-text channels and no token (see
 * offload_client_create_with_options for TLS and tokens). Connects lazily: no server needs to
 * be up yet. `*out` is set on success. INVALID_ARGUMENT for a malformed endpoints string. */
OFFLOAD_API offload_status_t offload_client_create(const char* endpoints, uint32_t timeout_ms,
                                                   offload_client_t** out);
/* Options of offload_client_create_with_options. ABI-stable: the caller sets `struct_size` to the
 * sizeof() it was compiled with (offload_client_options_init does), fields are only ever added at
 * the end, and a field beyond the caller's `struct_size` reads as 0 / NULL. A caller compiled
 * against a newer header may pass a larger struct to an older library as long as every field the
 * library does not know is 0 / NULL (otherwise INVALID_ARGUMENT names `struct_size`). FFI
 * callers declare the fields below in this order with C's layout: pointer-sized `struct_size`,
 * then pointers and 32-bit integers, no padding in between on 32- and 64-bit targets.
 * Strings are NUL-terminated; NULL and "" both mean "not set". Nothing is kept of the strings
 * after the call returns (they may be freed at once). */
typedef struct offload_client_options {
  size_t struct_size;      /* sizeof(offload_client_options_t) as the caller knows it */
  const char* endpoints;   /* required: as for offload_client_create */
  uint32_t timeout_ms;     /* per-call deadline; 0 = the default, 5000 */
  uint32_t flags;          /* OFFLOAD_CLIENT_* bits; unknown bits are INVALID_ARGUMENT */
  /* TLS. On when OFFLOAD_CLIENT_TLS is set or any field below but bearer_token is; each PEM input
   * is a file path or the PEM text itself, at most one of the two. */
  const char* tls_ca_file;      /* CA certificates of the server's certificate; neither this */
  const char* tls_ca_pem;       /* nor tls_ca_pem: the system's trusted roots */
  const char* tls_cert_file;    /* mTLS: the client certificate (then its chain) */
  const char* tls_cert_pem;
  const char* tls_key_file;     /* mTLS: its private key, unencrypted */
  const char* tls_key_pem;
  /* The name the server's certificate must carry when it is not the host dialled (e.g. dial
   * 127.0.0.1, check "localhost"). NULL: that host; for "dns:name:port", `name`. */
  const char* tls_server_name;
  /* Sent as "authorization: Bearer <bearer_token>" with every call (on plain-text channels too:
   * meant for localhost; elsewhere use TLS, a token is as good as a password). Visible ASCII,
   * at most 16384 characters. Replace it later with offload_client_set_token. */
  const char* bearer_token;
  /* --- Added after the first layout (a caller that stops at bearer_token gets the defaults). */
  /* Memo bounds in bytes (charged: value + key id + a fixed overhead per entry); 0 = the default:
   * 1 MB for verify and derive, 8 MB for open. */
  size_t verify_memo_bytes;
  size_t derive_memo_bytes;
  size_t open_memo_bytes;
  /* Maximum ages in milliseconds; required (> 0) with OFFLOAD_CLIENT_DERIVE_MEMO /
   * OFFLOAD_CLIENT_OPEN_MEMO, ignored without. */
  uint32_t derive_memo_max_age_ms;
  uint32_t open_memo_max_age_ms;
} offload_client_options_t;

/* TLS with the system's trusted roots even when no tls_* field is set. */
#define OFFLOAD_CLIENT_TLS 1u
/* No verify memo (it is on by default). */
#define OFFLOAD_CLIENT_NO_VERIFY_MEMO 2u
/* The derive memo; needs derive_memo_max_age_ms. */
#define OFFLOAD_CLIENT_DERIVE_MEMO 4u
/* The open memo; needs open_memo_max_age_ms. */
#define OFFLOAD_CLIENT_OPEN_MEMO 8u

/* Zeroes `*options` and sets its struct_size (for C callers; FFI callers may set both
 * themselves). */
OFFLOAD_API void offload_client_options_init(offload_client_options_t* options);

/* Makes a client as offload_client_create does, with the credentials and token of `*options`.
 * Files are read and checked now: INVALID_ARGUMENT, with offload_last_error() naming the field
 * (e.g. "tls_ca_file: cannot read '/x.crt': No such file or directory", "tls_key_file, tls_key_pem:
 * expected the private key of the client certificate ..., got none", a key that is not the
 * certificate's, a bad struct_size or token). Messages never contain key material or the token.
 * Connects lazily, like offload_client_create. `*out` is set on success. */
OFFLOAD_API offload_status_t offload_client_create_with_options(
    const offload_client_options_t* options, offload_client_t** out);

/* Replaces the bearer token of the calls that start from now on (NULL or "": no token); calls in
 * flight keep theirs. Thread-safe; for tokens that expire, call it before they do. A token that
 * is not visible ASCII is INVALID_ARGUMENT and the previous one stays. */
OFFLOAD_API offload_status_t offload_client_set_token(offload_client_t* client, const char* token);

/* Frees the client (NULL is fine). Waits for its calls in progress. Its memos are wiped. */
OFFLOAD_API void offload_client_destroy(offload_client_t* client);

/* Counters of one memo (entries and bytes are current; the rest count since the client was made). */
typedef struct offload_memo_stats {
  uint64_t hits;
  uint64_t misses;
  uint64_t inserts;
  uint64_t evictions;       /* pushed out by the byte bound */
  uint64_t expired;         /* removed past their maximum age */
  uint64_t dropped;         /* removed by a refusal about their key, or by offload_client_reset */
  uint64_t entries;
  uint64_t bytes;
  uint64_t capacity_bytes;  /* 0: this memo is off */
} offload_memo_stats_t;

/* A client's counters. Every field is a uint64_t (struct_size too), so there is no padding
 * anywhere; fields are only ever added at the end. */
typedef struct offload_client_stats {
  uint64_t struct_size;      /* the caller's sizeof(offload_client_stats_t) */
  uint64_t calls;            /* offload_* calls that reached the service layer */
  uint64_t rpcs;             /* RPCs sent (a memo hit sends none) */
  uint64_t batch_rpcs;       /* of which batch RPCs */
  uint64_t retries;
  uint64_t failed_calls;
  uint64_t auto_batches;
  uint64_t auto_batched_items;
  uint64_t retry_info_waits; /* retries after a delay the server asked for */
  uint64_t memo_bytes_not_sent;      /* request bytes of calls the memos answered */
  uint64_t memo_bytes_not_received;  /* response bytes of those */
  offload_memo_stats_t verify_memo;
  offload_memo_stats_t derive_memo;
  offload_memo_stats_t open_memo;
} offload_client_stats_t;

/* Fills `*stats`: the caller sets stats->struct_size (e.g. `offload_client_stats_t s =
 * {sizeof(s)};`); the fields within it that this library knows are written, any beyond are
 * zeroed, struct_size is left as it was. INVALID_ARGUMENT for a struct_size below 8 or above
 * 4096. */
OFFLOAD_API offload_status_t offload_client_get_stats(offload_client_t* client,
                                                      offload_client_stats_t* stats);

/* Drops and wipes every entry of every memo of `client` (answers on their way are not
 * remembered). */
OFFLOAD_API offload_status_t offload_client_reset(offload_client_t* client);

/* --- Keys. `public_key` / `public_key_len` may be NULL (not wanted); otherwise the key's current
 * public key (32 bytes; 0 for AEAD keys) is written with the buffer protocol above. */
OFFLOAD_API offload_status_t offload_key_create(offload_client_t* client, const char* key_id,
                                                offload_key_type_t type, uint8_t* public_key,
                                                size_t* public_key_len);
/* `secret`: a 32-byte seed / scalar / key, or the 64-byte Ed25519 secret key (seed || pk). */
OFFLOAD_API offload_status_t offload_key_import(offload_client_t* client, const char* key_id,
                                                offload_key_type_t type, const uint8_t* secret,
                                                size_t secret_len, uint8_t* public_key,
                                                size_t* public_key_len);
/* Key lifecycle (see proto/offload/v1/keys.proto). Deleting a key only schedules its destruction:
 * after the server's --key_deletion_wait (7 days by default), or after `wait_seconds` when that is
 * longer (0: the server's wait; shorter than the server's, or more than 10 years, is
 * INVALID_ARGUMENT). Until then every call with the key is refused with
 * OFFLOAD_FAILED_PRECONDITION, a second deletion too, and offload_key_cancel_deletion brings it
 * back as it was. `*deletion_unix_seconds` (may be NULL) is set to when it will be destroyed. A
 * server run with --key_deletion_wait=0 destroys at once (then that time is now). */
OFFLOAD_API offload_status_t offload_key_schedule_deletion(offload_client_t* client,
                                                           const char* key_id,
                                                           uint64_t wait_seconds,
                                                           int64_t* deletion_unix_seconds);
/* offload_key_schedule_deletion with the server's wait. (Before key lifecycle states this removed
 * the key at once; the key id stays taken until the destruction.) */
OFFLOAD_API offload_status_t offload_key_delete(offload_client_t* client, const char* key_id);
/* FAILED_PRECONDITION unless the key is scheduled for deletion. */
OFFLOAD_API offload_status_t offload_key_cancel_deletion(offload_client_t* client,
                                                         const char* key_id);
/* A disabled key refuses every call (OFFLOAD_FAILED_PRECONDITION) and keeps its material; both
 * are no-ops on a key already in the state asked, FAILED_PRECONDITION while it is scheduled for
 * deletion. */
OFFLOAD_API offload_status_t offload_key_disable(offload_client_t* client, const char* key_id);
OFFLOAD_API offload_status_t offload_key_enable(offload_client_t* client, const char* key_id);

/* --- Ed25519. `*valid` is 1 or 0 on OFFLOAD_OK (an invalid signature is not an error). */
OFFLOAD_API offload_status_t offload_verify(offload_client_t* client, const uint8_t* public_key,
                                            size_t public_key_len, const uint8_t* message,
                                            size_t message_len, const uint8_t* signature,
                                            size_t signature_len, int* valid);
/* Signature (64 bytes) into `signature`; the signing public key (32 bytes) into `public_key` when
 * it is not NULL (then it must hold 32 bytes). */
OFFLOAD_API offload_status_t offload_sign(offload_client_t* client, const char* key_id,
                                          const uint8_t* message, size_t message_len,
                                          uint8_t* signature, size_t* signature_len,
                                          uint8_t* public_key);

/* --- X25519: the 32-byte shared key with `peer_public_key` (current key version). */
OFFLOAD_API offload_status_t offload_derive(offload_client_t* client, const char* key_id,
                                            const uint8_t* peer_public_key, size_t peer_len,
                                            offload_derive_output_t output, uint8_t* shared_key,
                                            size_t* shared_key_len);

/* --- NaCl box. Seal: `nonce` may be NULL (the service picks one); the nonce used is written to
 * `nonce_out` (24 bytes) when it is not NULL. Ciphertext = 16-byte tag || encrypted plaintext. */
OFFLOAD_API offload_status_t offload_box_seal(offload_client_t* client, const char* key_id,
                                              const uint8_t* peer_public_key, size_t peer_len,
                                              const uint8_t* nonce, size_t nonce_len,
                                              const uint8_t* plaintext, size_t plaintext_len,
                                              uint8_t* ciphertext, size_t* ciphertext_len,
                                              uint8_t* nonce_out);
OFFLOAD_API offload_status_t offload_box_open(offload_client_t* client, const char* key_id,
                                              const uint8_t* peer_public_key, size_t peer_len,
                                              const uint8_t* nonce, size_t nonce_len,
                                              const uint8_t* ciphertext, size_t ciphertext_len,
                                              uint8_t* plaintext, size_t* plaintext_len);

/* --- AEAD envelopes (see proto/offload/v1/aead.proto for the layout). */
OFFLOAD_API offload_status_t offload_aead_seal(offload_client_t* client, const char* key_id,
                                               const uint8_t* plaintext, size_t plaintext_len,
                                               const uint8_t* associated_data, size_t ad_len,
                                               uint8_t* envelope, size_t* envelope_len);
OFFLOAD_API offload_status_t offload_aead_open(offload_client_t* client, const char* key_id,
                                               const uint8_t* envelope, size_t envelope_len,
                                               const uint8_t* associated_data, size_t ad_len,
                                               uint8_t* plaintext, size_t* plaintext_len);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* CLIENT_C_OFFLOAD_H_ */
