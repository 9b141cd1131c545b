/* transport_posix.c - see transport_posix.h. */
#define _POSIX_C_SOURCE 200809L
#include "transport_posix.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "offload_client.h"

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

int offload_posix_transport_init(offload_posix_transport_t* t, const char* ipv4, uint16_t port) {
  struct in_addr a;
  if (t == NULL || ipv4 == NULL || port == 0 || inet_pton(AF_INET, ipv4, &a) != 1) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }
  memset(t, 0, sizeof *t);
  t->addr_be = a.s_addr;
  t->port = port;
  t->timeout_ms = 5000;
  return 0;
}

/* Appends `s` to head[*n..cap); false when it does not fit (one byte kept for NUL). */
static int append(char* head, size_t cap, size_t* n, const char* s) {
  size_t len = strlen(s);
  if (len >= cap - *n) return 0;
  memcpy(head + *n, s, len);
  *n += len;
  head[*n] = '\0';
  return 1;
}

static int append_uint(char* head, size_t cap, size_t* n, unsigned long v) {
  char digits[24];
  size_t i = sizeof digits - 1;
  digits[i] = '\0';
  do {
    digits[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0 && i > 0);
  return append(head, cap, n, digits + i);
}

static int send_all(int fd, const void* data, size_t len) {
  const uint8_t* p = (const uint8_t*)data;
  while (len > 0) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w;
    len -= (size_t)w;
  }
  return 1;
}

static ssize_t recv_some(int fd, void* dst, size_t cap) {
  for (;;) {
    ssize_t r = recv(fd, dst, cap, 0);
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

static char lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

/* True if line[0..len) starts with `name` (lower case, ending in ':'), ignoring case. */
static int header_is(const char* line, size_t len, const char* name) {
  size_t i, n = strlen(name);
  if (len < n) return 0;
  for (i = 0; i < n; ++i) {
    if (lower(line[i]) != name[i]) return 0;
  }
  return 1;
}

/* Contains `needle` (lower case), ignoring case, within line[0..len). */
static int contains_ci(const char* line, size_t len, const char* needle) {
  size_t n = strlen(needle), i, j;
  for (i = 0; i + n <= len; ++i) {
    for (j = 0; j < n && lower(line[i + j]) == needle[j]; ++j) {
    }
    if (j == n) return 1;
  }
  return 0;
}

/* Parses the response head in head[0..len) (ending with the blank line): the status code and
 * Content-Length (-1 when absent). Returns 0 or OFFLOAD_POSIX_ERR_RESPONSE. */
static int parse_head(const char* head, size_t len, int* status, long* content_length) {
  size_t i = 0, line_start;
  int code = 0, digits = 0;
  *content_length = -1;
  /* Status line: HTTP/1.x SP 3DIGIT SP reason */
  if (len < 12 || memcmp(head, "HTTP/1.", 7) != 0 || head[8] != ' ') return OFFLOAD_POSIX_ERR_RESPONSE;
  for (i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return OFFLOAD_POSIX_ERR_RESPONSE;
    code = code * 10 + (head[i] - '0');
  }
  *status = code;
  while (i < len && head[i] != '\n') ++i;
  /* Header lines. */
  for (line_start = ++i; i < len; ++i) {
    if (head[i] != '\n') continue;
    {
      size_t line_len = i - line_start;
      const char* line = head + line_start;
      if (line_len > 0 && line[line_len - 1] == '\r') --line_len;
      if (header_is(line, line_len, "content-length:")) {
        size_t k = 15;
        long v = 0;
        while (k < line_len && (line[k] == ' ' || line[k] == '\t')) ++k;
        for (; k < line_len && line[k] >= '0' && line[k] <= '9'; ++k, ++digits) {
          if (v > (1L << 30)) return OFFLOAD_POSIX_ERR_RESPONSE;
          v = v * 10 + (line[k] - '0');
        }
        if (digits == 0) return OFFLOAD_POSIX_ERR_RESPONSE;
        *content_length = v;
      } else if (header_is(line, line_len, "transfer-encoding:") &&
                 contains_ci(line, line_len, "chunked")) {
        return OFFLOAD_POSIX_ERR_RESPONSE; /* unary Connect answers carry a Content-Length */
      }
    }
    line_start = i + 1;
  }
  return 0;
}

int offload_posix_transport(void* ctx, const char* path, const uint8_t* req, size_t req_len,
                            uint8_t* resp, size_t resp_cap, size_t* resp_len, int* http_status) {
  offload_posix_transport_t* t = (offload_posix_transport_t*)ctx;
  struct sockaddr_in sa;
  struct timeval tv;
  size_t n = 0, head_len = 0, body_len = 0, i;
  long content_length;
  int fd, rc = OFFLOAD_TRANSPORT_OK, overflow = 0;
  char addr_text[INET_ADDRSTRLEN];

  if (t == NULL || path == NULL || path[0] != '/' || resp_len == NULL || http_status == NULL ||
      (req == NULL && req_len > 0)) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }
  *resp_len = 0;
  *http_status = 0;
  if (inet_ntop(AF_INET, &t->addr_be, addr_text, sizeof addr_text) == NULL) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }
  if (!append(t->head, sizeof t->head, &n, "POST ") ||
      !append(t->head, sizeof t->head, &n, path) ||
      !append(t->head, sizeof t->head, &n, " HTTP/1.1\r\nHost: ") ||
      !append(t->head, sizeof t->head, &n, addr_text) ||
      !append(t->head, sizeof t->head, &n, ":") ||
      !append_uint(t->head, sizeof t->head, &n, t->port) ||
      !append(t->head, sizeof t->head, &n,
              "\r\nContent-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
              "Accept-Encoding: identity\r\nConnection: close\r\nContent-Length: ") ||
      !append_uint(t->head, sizeof t->head, &n, (unsigned long)req_len) ||
      !append(t->head, sizeof t->head, &n, "\r\n\r\n")) {
    return OFFLOAD_POSIX_ERR_ARGUMENT;
  }

  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return OFFLOAD_POSIX_ERR_SOCKET;
  tv.tv_sec = t->timeout_ms / 1000;
  tv.tv_usec = (t->timeout_ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(t->port);
  sa.sin_addr.s_addr = t->addr_be;
  if (connect(fd, (const struct sockaddr*)&sa, sizeof sa) != 0 || !send_all(fd, t->head, n) ||
      (req_len > 0 && !send_all(fd, req, req_len))) {
    close(fd);
    return OFFLOAD_POSIX_ERR_SOCKET;
  }

  /* Response head: read until the blank line; bytes after it are the body's start. */
  n = 0;
  for (;;) {
    ssize_t r;
    if (n == sizeof t->head) {
      close(fd);
      return OFFLOAD_POSIX_ERR_RESPONSE;
    }
    r = recv_some(fd, t->head + n, sizeof t->head - n);
    if (r <= 0) {
      close(fd);
      return r == 0 ? OFFLOAD_POSIX_ERR_RESPONSE : OFFLOAD_POSIX_ERR_SOCKET;
    }
    n += (size_t)r;
    for (i = (n >= (size_t)r + 3) ? n - (size_t)r - 3 : 0; i + 4 <= n; ++i) {
      if (memcmp(t->head + i, "\r\n\r\n", 4) == 0) {
        head_len = i + 4;
        break;
      }
    }
    if (head_len != 0) break;
  }
  if (parse_head(t->head, head_len, http_status, &content_length) != 0) {
    close(fd);
    return OFFLOAD_POSIX_ERR_RESPONSE;
  }
  /* Body already read with the head. */
  {
    size_t extra = n - head_len;
    if (content_length >= 0 && extra > (size_t)content_length) extra = (size_t)content_length;
    if (extra > resp_cap) {
      overflow = 1;
      extra = resp_cap;
    }
    if (extra > 0) memcpy(resp, t->head + head_len, extra);
    body_len = extra;
  }
  /* The rest of the body: up to Content-Length, or to the end of the stream without one. */
  while (!overflow && (content_length < 0 || body_len < (size_t)content_length)) {
    size_t want = resp_cap - body_len;
    ssize_t r;
    if (content_length >= 0 && (size_t)content_length - body_len < want) {
      want = (size_t)content_length - body_len;
    }
    if (want == 0) {
      overflow = 1;
      break;
    }
    r = recv_some(fd, resp + body_len, want);
    if (r < 0) {
      rc = OFFLOAD_POSIX_ERR_SOCKET;
      break;
    }
    if (r == 0) {
      if (content_length >= 0) rc = OFFLOAD_POSIX_ERR_RESPONSE; /* truncated */
      break;
    }
    body_len += (size_t)r;
  }
  close(fd);
  if (rc != OFFLOAD_TRANSPORT_OK) return rc;
  *resp_len = body_len;
  return overflow ? OFFLOAD_TRANSPORT_OVERFLOW : OFFLOAD_TRANSPORT_OK;
}
