/* transport_posix.c - see transport_posix.h. */
#define _POSIX_C_SOURCE 200809L
#include "transport_posix.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal/http1.h"
#include "internal/tcp_posix.h"

int offload_posix_transport_init(offload_posix_transport_t* t, const char* ipv4, uint16_t port) {
  uint32_t addr_be;
  char text[OFFLOAD_TCP_IPV4_TEXT_CAP];
  if (t == NULL || port == 0 || !offload_tcp_parse_ipv4(ipv4, &addr_be, text)) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }
  memset(t, 0, sizeof *t);
  t->addr_be = addr_be;
  t->port = port;
  t->timeout_ms = 5000;
  memcpy(t->host, text, sizeof t->host);
  return 0;
}

/* Sends the request's parts on `fd` and reads the answer into `reader`. */
static int exchange(int fd, const offload_http1_part_t* parts, int count,
                    offload_http1_reader_t* reader) {
  int i, rc;
  for (i = 0; i < count; ++i) {
    if (!offload_tcp_send_all(fd, parts[i].data, parts[i].len)) return OFFLOAD_POSIX_ERR_SOCKET;
  }
  do {
    size_t room;
    uint8_t* at = offload_http1_reader_space(reader, &room);
    ssize_t r = offload_tcp_recv(fd, at, room);
    rc = r < 0 ? OFFLOAD_POSIX_ERR_SOCKET : offload_http1_reader_received(reader, (size_t)r);
  } while (rc == OFFLOAD_HTTP1_MORE);
  return rc;
}

int offload_posix_transport(void* ctx, const offload_transport_request_t* request, uint8_t* resp,
                            size_t resp_cap, size_t* resp_len, int* http_status) {
  offload_posix_transport_t* t = (offload_posix_transport_t*)ctx;
  offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS];
  offload_http1_reader_t reader;
  int count, fd = -1, rc;

  if (t == NULL || resp_len == NULL || http_status == NULL || (resp == NULL && resp_cap > 0)) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }
  *resp_len = 0;
  *http_status = 0;
  /* The head scratch holds the request head, then the response head. */
  offload_http1_reader_init(&reader, t->head, sizeof t->head, resp, resp_cap);
  count = offload_http1_request(t->head, sizeof t->head, t->host, t->port, /*keep_alive=*/false,
                                request, parts);
  if (count >= 0) fd = offload_tcp_connect(t->addr_be, t->port, t->timeout_ms);
  rc = count < 0 ? count : fd < 0 ? OFFLOAD_POSIX_ERR_SOCKET : exchange(fd, parts, count, &reader);
  if (fd >= 0) close(fd);
  offload_wipe(t->head, sizeof t->head); /* the request head held the token */
  if (rc == OFFLOAD_TRANSPORT_OK || rc == OFFLOAD_TRANSPORT_OVERFLOW) {
    *resp_len = reader.body_len;
    *http_status = reader.status;
  }
  return rc;
}

uint64_t offload_posix_clock_ms(void* ctx) {
  struct timespec ts;
  (void)ctx;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
