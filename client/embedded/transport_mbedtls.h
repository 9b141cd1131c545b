/* transport_mbedtls.h - an offload_transport_fn over TLS 1.2 with mbedTLS 2.28 (what ESP-IDF
 * and Debian 12 ship), on a POSIX socket (lwIP's on ESP-IDF). The server certificate is verified
 * against the caller's CA and checked for `server_name` (also sent as SNI); a client certificate
 * is optional (mTLS). ALPN offers "http/1.1" only. The connection is kept open between calls
 * (HTTP/1.1 keep-alive), so one handshake serves many calls; a connection the server closed
 * while idle is replaced once, within the call that finds it closed. HTTP/1.1 framing as the
 * POSIX transport (internal/http1.h); no stdio, no name resolution (a numeric IPv4 address).
 *
 *   static offload_mbedtls_transport_t tls;                  // ~2 KB + mbedTLS's contexts
 *   offload_mbedtls_config_t config = {0};
 *   config.ipv4 = "10.0.0.2";
 *   config.port = 8443;
 *   config.server_name = "offload.example";      // in the certificate's DNS SAN (or CN)
 *   config.ca_pem = ca_pem;                      // NUL-terminated PEM text
 *   char why[256];
 *   if (offload_mbedtls_transport_init(&tls, &config) != 0) {
 *     log(offload_mbedtls_transport_describe(&tls, why, sizeof why));
 *   }
 *   offload_client_init(&client, offload_mbedtls_transport, &tls, wire, sizeof wire);
 *   offload_mbedtls_transport_connect(&tls);     // optional: the handshake now, not in a call
 *   s = offload_derive(&client, ...);
 *   if (s == OFFLOAD_ERR_TRANSPORT) log(offload_mbedtls_transport_describe(&tls, why, sizeof why));
 *   offload_mbedtls_transport_free(&tls);
 *
 * Heap: mbedTLS allocates with its own allocator (ESP-IDF: heap_caps; Debian's build: calloc and
 * free, with no MBEDTLS_MEMORY_BUFFER_ALLOC_C to redirect them). init() allocates (the parsed
 * certificates and key, the record buffers), a handshake allocates (ECDHE, the peer's
 * certificate) and free() gives everything back. A call on an open connection allocates nothing
 * (embedded_tls_noheap_test proves it on Linux); a call that has to connect does the handshake.
 *
 * Thread-safety: one call at a time per offload_mbedtls_transport_t (its mbedTLS session and
 * scratch space are single-user).
 */
#ifndef CLIENT_EMBEDDED_TRANSPORT_MBEDTLS_H_
#define CLIENT_EMBEDDED_TRANSPORT_MBEDTLS_H_

#include <stddef.h>
#include <stdint.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include "offload_client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Transport failures (besides OFFLOAD_TRANSPORT_OK and OFFLOAD_TRANSPORT_OVERFLOW); the client
 * keeps the value in last_transport_error, offload_mbedtls_transport_describe() tells more. */
#define OFFLOAD_MBEDTLS_ERR_SOCKET (-1)    /* connect, send or receive failed or timed out */
#define OFFLOAD_MBEDTLS_ERR_RESPONSE (-2)  /* not an HTTP/1.x response we can frame */
#define OFFLOAD_MBEDTLS_ERR_ARGUMENT (-3)  /* bad config, path or token, head too long */
#define OFFLOAD_MBEDTLS_ERR_SETUP (-4)     /* a PEM that does not parse, RNG or mbedTLS set-up */
#define OFFLOAD_MBEDTLS_ERR_HANDSHAKE (-5) /* the TLS handshake failed: an alert, no common
                                              version or cipher, or the server broke it off (it
                                              refused our client certificate) */
#define OFFLOAD_MBEDTLS_ERR_VERIFY (-6)    /* the server certificate is not trusted or names
                                              another server */
#define OFFLOAD_MBEDTLS_ERR_TLS (-7)       /* a TLS record error after the handshake */

#define OFFLOAD_MBEDTLS_HEAD_CAP 1024
#define OFFLOAD_MBEDTLS_SERVER_NAME_CAP 256 /* MBEDTLS_SSL_MAX_HOST_NAME_LEN + 1 */

typedef struct offload_mbedtls_config {
  const char* ipv4; /* the server's address, dotted quad: what the socket connects to */
  uint16_t port;    /* the server's --http_address port */
  /* The name the server certificate must carry (a DNS name in its subjectAltName, else its CN)
   * and the SNI sent; need not match `ipv4` (connect 127.0.0.1, verify "localhost"). mbedTLS
   * 2.28 checks DNS names only: an IP-address SAN does not satisfy it. Required. */
  const char* server_name;
  const char* ca_pem;          /* NUL-terminated PEM: the CA(s) the server chains to. Required. */
  const char* client_cert_pem; /* NUL-terminated PEM for mTLS, or NULL; then also the key: */
  const char* client_key_pem;  /* NUL-terminated PEM (unencrypted PKCS#8, SEC1 or PKCS#1) */
  int timeout_ms;              /* per connect / send / receive; 0: 5000 */
} offload_mbedtls_config_t;

typedef struct offload_mbedtls_transport {
  uint32_t addr_be; /* IPv4 address, network order */
  uint16_t port;
  int timeout_ms;
  int fd;                    /* the open connection's socket, -1 when none */
  unsigned long handshakes;  /* completed handshakes: one per connection opened */
  /* The last failure of init() or of a call (each call clears them): what failed (a constant
   * string, "" when nothing did), mbedTLS's error code (0 when the failure was not mbedTLS's)
   * and, after OFFLOAD_MBEDTLS_ERR_VERIFY, the MBEDTLS_X509_BADCERT_* flags of the server
   * certificate. offload_mbedtls_transport_describe() puts them in words. */
  const char* error_step;
  int error_code;
  uint32_t verify_flags;
  char server_name[OFFLOAD_MBEDTLS_SERVER_NAME_CAP];
  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
  mbedtls_x509_crt ca;
  mbedtls_x509_crt client_cert;
  mbedtls_pk_context client_key;
  mbedtls_ssl_config conf;
  mbedtls_ssl_context ssl;
  /* Scratch for the request head and then the response head. */
  char head[OFFLOAD_MBEDTLS_HEAD_CAP];
} offload_mbedtls_transport_t;

/* Sets up `t` from `config`: parses the PEMs, seeds the RNG, prepares the TLS session; connects
 * nothing. `config` and its strings need not outlive the call. Returns 0, or
 * OFFLOAD_MBEDTLS_ERR_ARGUMENT (a missing field, an address that is not numeric IPv4, a client
 * certificate without its key) or OFFLOAD_MBEDTLS_ERR_SETUP (a PEM that does not parse, a key
 * that is not the certificate's); offload_mbedtls_transport_describe() tells which. Whatever it returns,
 * offload_mbedtls_transport_free() releases `t`. */
int offload_mbedtls_transport_init(offload_mbedtls_transport_t* t,
                                   const offload_mbedtls_config_t* config);

/* Opens the connection and does the handshake now (a call would do it when needed), so that
 * the calls after it find the connection open. 0, or a failure as the transport returns.
 * REQUIRES: offload_mbedtls_transport_init() returned 0. */
int offload_mbedtls_transport_connect(offload_mbedtls_transport_t* t);

/* Sends close_notify and closes the connection, if one is open; the next call reconnects. */
void offload_mbedtls_transport_close(offload_mbedtls_transport_t* t);

/* Closes the connection and frees everything mbedTLS holds for `t`.
 * REQUIRES: offload_mbedtls_transport_init() ran on `t`. */
void offload_mbedtls_transport_free(offload_mbedtls_transport_t* t);

/* The offload_transport_fn; `ctx` is an offload_mbedtls_transport_t* that init() set up. */
int offload_mbedtls_transport(void* ctx, const offload_transport_request_t* request,
                              uint8_t* resp, size_t resp_cap, size_t* resp_len, int* http_status);

/* "socket", "response", "argument", "setup", "handshake", "verify", "tls" for the failures
 * above, "ok" for 0, "?" otherwise. */
const char* offload_mbedtls_transport_error_name(int rc);

/* The last failure of `t` in words, into `out` (capacity `cap`, NUL-terminated, truncated):
 * the step, mbedTLS's message and, after a verification failure, why the server certificate was
 * refused, e.g. "handshake: X509 - Certificate verification failed ... (server certificate: The
 * certificate is not correctly signed by the trusted CA)". Uses snprintf (mbedtls_strerror);
 * call it outside the calls that must not allocate. Returns `out`. */
const char* offload_mbedtls_transport_describe(const offload_mbedtls_transport_t* t, char* out,
                                               size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* CLIENT_EMBEDDED_TRANSPORT_MBEDTLS_H_ */
