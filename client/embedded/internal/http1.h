/* internal/http1.h - the HTTP/1.1 framing the transports share (not part of the client's API):
 * the request of a Connect unary POST laid out as parts to send, and an incremental reader of
 * the response that a transport feeds from its socket or TLS session. Pure: no I/O, no malloc,
 * no stdio; every loop bounded by the buffers given.
 *
 *   offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS];
 *   int count = offload_http1_request(head, sizeof head, "127.0.0.1", 8080, false, request, parts);
 *   ... send parts[0..count) in order ...
 *   offload_http1_reader_t r;
 *   offload_http1_reader_init(&r, head, sizeof head, resp, resp_cap);  // head reused for the answer
 *   do {
 *     size_t room;
 *     uint8_t* at = offload_http1_reader_space(&r, &room);
 *     n = recv(fd, at, room, 0);                            // 0: the peer closed
 *     rc = n < 0 ? MY_SOCKET_ERROR : offload_http1_reader_received(&r, (size_t)n);
 *   } while (rc == OFFLOAD_HTTP1_MORE);
 *
 * Thread-safety: none needed; the state is the caller's.
 */
#ifndef CLIENT_EMBEDDED_INTERNAL_HTTP1_H_
#define CLIENT_EMBEDDED_INTERNAL_HTTP1_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "offload_client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Failures; each transport gives them public names with these values. */
#define OFFLOAD_HTTP1_ERR_RESPONSE (-2) /* not an HTTP/1.x response we can frame, or truncated */
#define OFFLOAD_HTTP1_ERR_ARGUMENT (-3) /* bad path or token, or the head does not fit */
/* offload_http1_reader_received(): the response is not complete yet. */
#define OFFLOAD_HTTP1_MORE 2

#define OFFLOAD_HTTP1_MAX_PARTS 4

typedef struct offload_http1_part {
  const void* data;
  size_t len;
} offload_http1_part_t;

/* Lays out `request` for sending: `head` (capacity `head_cap`) gets the request line, Host
 * (`host`:`port`), the Connect headers, Content-Length, "Connection: close" unless `keep_alive`,
 * X-Offload-Key when `request->key_id` is 1 to OFFLOAD_KEY_ID_MAX_LEN visible ASCII characters
 * (else none), and the Authorization header when `request->bearer_token` is set. `parts` then lists, in
 * sending order, the head and the body; a token that does not fit in `head` becomes a part of
 * its own (sent from the caller's memory, not copied). Returns the number of parts (at most
 * OFFLOAD_HTTP1_MAX_PARTS), or OFFLOAD_HTTP1_ERR_ARGUMENT for a path that is not "/..." or has
 * a control character, a token that offload_token_length() refuses, or a head over `head_cap`. */
int offload_http1_request(char* head, size_t head_cap, const char* host, uint16_t port,
                          bool keep_alive, const offload_transport_request_t* request,
                          offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS]);

/* One response being read: its head goes to `head`, its body to `body`. */
typedef struct offload_http1_reader {
  char* head;
  size_t head_cap;
  size_t head_len; /* bytes received into `head` */
  size_t head_end; /* length of the head with its blank line; 0 until it is complete */
  uint8_t* body;
  size_t body_cap;
  size_t body_len;
  int status;          /* the HTTP status code, once the head is complete */
  long content_length; /* -1 when absent: the body ends when the connection does */
  bool keep_alive;     /* the server keeps the connection open after this response */
  bool overflow;       /* the body did not fit in `body_cap` */
  bool surplus;        /* bytes arrived past the body */
} offload_http1_reader_t;

/* Starts reading a response. `head` may be the buffer the request head was laid out in. */
void offload_http1_reader_init(offload_http1_reader_t* r, char* head, size_t head_cap,
                               uint8_t* body, size_t body_cap);

/* Where the next received bytes go, and how many may go there (`*room` > 0).
 * REQUIRES: the last offload_http1_reader_received() returned OFFLOAD_HTTP1_MORE, or none ran. */
uint8_t* offload_http1_reader_space(offload_http1_reader_t* r, size_t* room);

/* `n` bytes were received at offload_http1_reader_space(); `n` == 0: the peer closed the
 * connection. Returns OFFLOAD_HTTP1_MORE (read again), OFFLOAD_TRANSPORT_OK (the body is
 * complete), OFFLOAD_TRANSPORT_OVERFLOW (the body filled `body_cap` and there may be more) or
 * OFFLOAD_HTTP1_ERR_RESPONSE (not HTTP/1.x, a head over `head_cap`, a chunked body, or the
 * connection closed before the head or the Content-Length body ended). */
int offload_http1_reader_received(offload_http1_reader_t* r, size_t n);

/* After OFFLOAD_TRANSPORT_OK: whether the connection may carry the next request (HTTP/1.1
 * keep-alive, a Content-Length body read whole and nothing after it). */
bool offload_http1_reader_reusable(const offload_http1_reader_t* r);

#ifdef __cplusplus
}
#endif

#endif /* CLIENT_EMBEDDED_INTERNAL_HTTP1_H_ */
