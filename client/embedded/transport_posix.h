/* transport_posix.h - an offload_transport_fn over a POSIX TCP socket, for tests and for
 * Linux-class devices: one plain HTTP/1.1 POST per call (Connection: close), Content-Length
 * framing both ways, the response's status line and Content-Length parsed with bounded code
 * (internal/http1.h, shared with the TLS transport). No malloc, no stdio, no name resolution:
 * the server is a numeric IPv4 address. Plaintext: a bearer token set on the client crosses the
 * network readable; use transport_mbedtls.h off the loopback.
 *
 *   static offload_posix_transport_t http;
 *   offload_posix_transport_init(&http, "127.0.0.1", 8080);
 *   offload_client_init(&client, offload_posix_transport, &http, wire, sizeof wire);
 *
 * Thread-safety: one call at a time per offload_posix_transport_t (it holds the scratch space
 * for the request head and then the response head).
 */
#ifndef CLIENT_EMBEDDED_TRANSPORT_POSIX_H_
#define CLIENT_EMBEDDED_TRANSPORT_POSIX_H_

#include <stddef.h>
#include <stdint.h>

#include "offload_client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Transport failures (besides OFFLOAD_TRANSPORT_OK and OFFLOAD_TRANSPORT_OVERFLOW). */
#define OFFLOAD_POSIX_ERR_SOCKET (-1)   /* socket, connect, send or receive failed or timed out */
#define OFFLOAD_POSIX_ERR_RESPONSE (-2) /* not an HTTP/1.x response we can frame */
#define OFFLOAD_POSIX_ERR_ARGUMENT (-3) /* bad path or token, head too long, bad address */

#define OFFLOAD_POSIX_HEAD_CAP 1024

typedef struct offload_posix_transport {
  uint32_t addr_be; /* IPv4 address, network order */
  uint16_t port;
  int timeout_ms;   /* per connect / send / receive; 5000 after init */
  char host[16];    /* the address as text, for the Host header */
  /* Scratch for the request head and then the response head. A bearer token that does not fit
   * beside the head is sent from the caller's memory instead. */
  char head[OFFLOAD_POSIX_HEAD_CAP];
} offload_posix_transport_t;

/* Sets up `t` for the server at `ipv4` (dotted quad) and `port`. Returns 0, or
 * OFFLOAD_POSIX_ERR_ARGUMENT for an address that is not a numeric IPv4 one. */
int offload_posix_transport_init(offload_posix_transport_t* t, const char* ipv4, uint16_t port);

/* The offload_transport_fn; `ctx` is an offload_posix_transport_t*. */
int offload_posix_transport(void* ctx, const offload_transport_request_t* request, uint8_t* resp,
                            size_t resp_cap, size_t* resp_len, int* http_status);

/* An offload_clock_fn for offload_client_set_clock(): CLOCK_MONOTONIC in milliseconds (`ctx`
 * unused). A device without POSIX clocks supplies its own (ESP-IDF: esp_timer_get_time() /
 * 1000). */
uint64_t offload_posix_clock_ms(void* ctx);

#ifdef __cplusplus
}
#endif

#endif /* CLIENT_EMBEDDED_TRANSPORT_POSIX_H_ */
