/* internal/tcp_posix.c - see internal/tcp_posix.h. */
#define _POSIX_C_SOURCE 200809L
#include "internal/tcp_posix.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

bool offload_tcp_parse_ipv4(const char* ipv4, uint32_t* addr_be,
                            char text[OFFLOAD_TCP_IPV4_TEXT_CAP]) {
  struct in_addr a;
  if (ipv4 == NULL || inet_pton(AF_INET, ipv4, &a) != 1 ||
      inet_ntop(AF_INET, &a, text, OFFLOAD_TCP_IPV4_TEXT_CAP) == NULL) {
    return false;
  }
  *addr_be = a.s_addr;
  return true;
}

int offload_tcp_connect(uint32_t addr_be, uint16_t port, int timeout_ms) {
  struct sockaddr_in sa;
  struct timeval tv;
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* Linux and lwIP: connect too */
  /* A request goes out in two to four writes: none of them should wait for an ACK. */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = addr_be;
  if (connect(fd, (const struct sockaddr*)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool offload_tcp_send_all(int fd, const void* data, size_t len) {
  const uint8_t* p = (const uint8_t*)data;
  while (len > 0) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    len -= (size_t)w;
  }
  return true;
}

ssize_t offload_tcp_recv(int fd, void* dst, size_t cap) {
  for (;;) {
    ssize_t r = recv(fd, dst, cap, 0);
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}
