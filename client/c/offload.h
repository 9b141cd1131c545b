/* offload.h: the C ABI of the crypto-offload client, for C and for FFI (Swift, Kotlin/JNI, Dart,
 * Python ctypes, Node). A thin layer over the C++ client (client/cpp/client.h, with the whole
 * story in client/cpp/README.md): same deadlines, retries, failover, key affinity over several
 * endpoints and auto-batching of concurrent verify / derive / aead_open calls, all with the C++
 * client's default options except the deadline.
 *
 *   offload_client_t* c = NULL;
 *   if (offload_client_create("127.0.0.1:50051", 5000, &c) != OFFLOAD_OK) {
 *     fprintf(stderr, "%s\n", offload_last_error());
 *   }
 *   int valid = 0;
 *   offload_status_t s = offload_verify(c, pk, 32, msg, msg_len, sig, 64, &valid);
 *   offload_client_destroy(c);
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
 *   discarded); calling again with enough room runs it again.
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
 * - Several endpoints: each key id (for verify: each public key) has one endpoint by rendezvous
 *   hashing. An endpoint that fails is left for 0.5 s (doubling to 30 s while it keeps failing)
 *   and its keys go to their next endpoint; after a lost or refused connection it gets them back
 *   as soon as it is connected again (about 1 s after it listens, while calls flow). Keys of the
 *   other endpoints never move, and an auto-batch is sent to the endpoint it was grouped for.
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
 * retries and their backoff (see above). Plain-text channels. Connects lazily: no server needs to
 * be up yet. `*out` is set on success. INVALID_ARGUMENT for a malformed endpoints string. */
OFFLOAD_API offload_status_t offload_client_create(const char* endpoints, uint32_t timeout_ms,
                                                   offload_client_t** out);
/* Frees the client (NULL is fine). Waits for its calls in progress. */
OFFLOAD_API void offload_client_destroy(offload_client_t* client);

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
OFFLOAD_API offload_status_t offload_key_delete(offload_client_t* client, const char* key_id);

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
