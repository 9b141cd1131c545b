/* internal/http1.c - see internal/http1.h. */
#include "internal/http1.h"

#include <string.h>

/* Appends `len` bytes of `s` to head[*n..cap), keeping one byte for a NUL; false when they do
 * not fit. */
static bool append_bytes(char* head, size_t cap, size_t* n, const char* s, size_t len) {
  if (len >= cap - *n) return false;
  memcpy(head + *n, s, len);
  *n += len;
  head[*n] = '\0';
  return true;
}

static bool append(char* head, size_t cap, size_t* n, const char* s) {
  return append_bytes(head, cap, n, s, strlen(s));
}

static bool append_uint(char* head, size_t cap, size_t* n, unsigned long v) {
  char digits[24];
  size_t i = sizeof digits - 1;
  digits[i] = '\0';
  do {
    digits[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0 && i > 0);
  return append(head, cap, n, digits + i);
}

/* A request target we send: "/" and then printable ASCII without spaces. */
static bool path_ok(const char* path) {
  size_t i;
  if (path == NULL || path[0] != '/') return false;
  for (i = 1; path[i] != '\0'; ++i) {
    if (path[i] <= ' ' || path[i] > '~') return false;
  }
  return true;
}

/* A key id sent as X-Offload-Key: 1 to OFFLOAD_KEY_ID_MAX_LEN visible ASCII characters (what
 * cannot break the head). Anything else is not sent: the header is a routing hint, and the
 * server answers the call about such a key id itself. */
static bool key_id_ok(const char* key_id) {
  size_t i;
  if (key_id == NULL || key_id[0] == '\0') return false;
  for (i = 0; key_id[i] != '\0'; ++i) {
    if (i >= OFFLOAD_KEY_ID_MAX_LEN || key_id[i] <= ' ' || key_id[i] > '~') return false;
  }
  return true;
}

static void add_part(offload_http1_part_t* parts, int* count, const void* data, size_t len) {
  parts[*count].data = data;
  parts[*count].len = len;
  ++*count;
}

int offload_http1_request(char* head, size_t head_cap, const char* host, uint16_t port,
                          bool keep_alive, const offload_transport_request_t* request,
                          offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS]) {
  static const char kEnd[] = "\r\n\r\n";
  size_t n = 0, token_len = 0;
  int count = 0;
  bool bracket;
  if (head == NULL || head_cap == 0 || host == NULL || request == NULL ||
      !path_ok(request->path) || (request->body == NULL && request->body_len > 0)) {
    return OFFLOAD_HTTP1_ERR_ARGUMENT;
  }
  if (request->bearer_token != NULL) {
    token_len = offload_token_length(request->bearer_token);
    if (token_len == 0) return OFFLOAD_HTTP1_ERR_ARGUMENT;
  }
  /* An IPv6 literal is bracketed in Host (RFC 9112 3.2, RFC 3986 3.2.2): "[::1]:8080". */
  bracket = strchr(host, ':') != NULL && host[0] != '[';
  if (!append(head, head_cap, &n, "POST ") || !append(head, head_cap, &n, request->path) ||
      !append(head, head_cap, &n, " HTTP/1.1\r\nHost: ") ||
      (bracket && !append(head, head_cap, &n, "[")) || !append(head, head_cap, &n, host) ||
      !append(head, head_cap, &n, bracket ? "]:" : ":") ||
      !append_uint(head, head_cap, &n, port) ||
      !append(head, head_cap, &n,
              "\r\nContent-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
              "Accept-Encoding: identity\r\n") ||
      (!keep_alive && !append(head, head_cap, &n, "Connection: close\r\n")) ||
      !append(head, head_cap, &n, "Content-Length: ") ||
      !append_uint(head, head_cap, &n, (unsigned long)request->body_len) ||
      (key_id_ok(request->key_id) &&
       (!append(head, head_cap, &n, "\r\nX-Offload-Key: ") ||
        !append(head, head_cap, &n, request->key_id)))) {
    return OFFLOAD_HTTP1_ERR_ARGUMENT;
  }
  if (token_len > 0 && !append(head, head_cap, &n, "\r\nAuthorization: Bearer ")) {
    return OFFLOAD_HTTP1_ERR_ARGUMENT;
  }
  if (token_len > 0 && token_len + sizeof kEnd > head_cap - n) {
    /* Too long to copy into the head: the head so far, the token from the caller's memory,
     * then the end of the head. */
    add_part(parts, &count, head, n);
    add_part(parts, &count, request->bearer_token, token_len);
    add_part(parts, &count, kEnd, sizeof kEnd - 1);
  } else {
    if ((token_len > 0 && !append_bytes(head, head_cap, &n, request->bearer_token, token_len)) ||
        !append(head, head_cap, &n, kEnd)) {
      return OFFLOAD_HTTP1_ERR_ARGUMENT;
    }
    add_part(parts, &count, head, n);
  }
  if (request->body_len > 0) add_part(parts, &count, request->body, request->body_len);
  return count;
}

static char lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c; }

/* True if line[0..len) starts with `name` (lower case, ending in ':'), ignoring case. */
static bool header_is(const char* line, size_t len, const char* name) {
  size_t i, n = strlen(name);
  if (len < n) return false;
  for (i = 0; i < n; ++i) {
    if (lower(line[i]) != name[i]) return false;
  }
  return true;
}

/* Contains `needle` (lower case), ignoring case, within line[0..len). */
static bool contains_ci(const char* line, size_t len, const char* needle) {
  size_t n = strlen(needle), i, j;
  for (i = 0; i + n <= len; ++i) {
    for (j = 0; j < n && lower(line[i + j]) == needle[j]; ++j) {
    }
    if (j == n) return true;
  }
  return false;
}

/* Reads the status line and the headers of r->head[0..head_end): the status, Content-Length
 * and whether the connection stays open. False for what we cannot frame. */
static bool parse_head(offload_http1_reader_t* r) {
  const char* head = r->head;
  size_t len = r->head_end, i, line_start;
  int code = 0;
  /* Status line: HTTP/1.x SP 3DIGIT SP reason */
  if (len < 12 || memcmp(head, "HTTP/1.", 7) != 0 || head[8] != ' ') return false;
  for (i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return false;
    code = code * 10 + (head[i] - '0');
  }
  r->status = code;
  r->keep_alive = head[7] == '1'; /* HTTP/1.1 keeps the connection unless it says close */
  while (i < len && head[i] != '\n') ++i;
  for (line_start = ++i; i < len; ++i) {
    size_t line_len = i - line_start;
    const char* line = head + line_start;
    if (head[i] != '\n') continue; /* the header lines end at each '\n' */
    if (line_len > 0 && line[line_len - 1] == '\r') --line_len;
    if (header_is(line, line_len, "content-length:")) {
      size_t k = 15;
      long v = 0;
      int digits = 0;
      while (k < line_len && (line[k] == ' ' || line[k] == '\t')) ++k;
      for (; k < line_len && line[k] >= '0' && line[k] <= '9'; ++k, ++digits) {
        if (v > (1L << 30)) return false;
        v = v * 10 + (line[k] - '0');
      }
      if (digits == 0) return false;
      r->content_length = v;
    } else if (header_is(line, line_len, "transfer-encoding:") &&
               contains_ci(line, line_len, "chunked")) {
      return false; /* unary Connect answers carry a Content-Length */
    } else if (header_is(line, line_len, "connection:") && contains_ci(line, line_len, "close")) {
      r->keep_alive = false;
    }
    line_start = i + 1;
  }
  return true;
}

void offload_http1_reader_init(offload_http1_reader_t* r, char* head, size_t head_cap,
                               uint8_t* body, size_t body_cap) {
  memset(r, 0, sizeof *r);
  r->head = head;
  r->head_cap = head_cap;
  r->body = body;
  r->body_cap = body_cap;
  r->content_length = -1;
}

uint8_t* offload_http1_reader_space(offload_http1_reader_t* r, size_t* room) {
  size_t want;
  if (r->head_end == 0) {
    *room = r->head_cap - r->head_len;
    return (uint8_t*)r->head + r->head_len;
  }
  want = r->body_cap - r->body_len;
  if (r->content_length >= 0 && (size_t)r->content_length - r->body_len < want) {
    want = (size_t)r->content_length - r->body_len;
  }
  *room = want;
  return r->body + r->body_len;
}

/* What the body received so far means: complete, full, or more to read. */
static int body_state(offload_http1_reader_t* r) {
  if (r->overflow) return OFFLOAD_TRANSPORT_OVERFLOW;
  if (r->content_length >= 0 && r->body_len == (size_t)r->content_length) {
    return OFFLOAD_TRANSPORT_OK;
  }
  if (r->body_len == r->body_cap) {
    r->overflow = true;
    return OFFLOAD_TRANSPORT_OVERFLOW;
  }
  return OFFLOAD_HTTP1_MORE;
}

int offload_http1_reader_received(offload_http1_reader_t* r, size_t n) {
  size_t i, extra;
  if (r->head_end != 0) {
    if (n == 0) { /* the connection ended: the end of a body without Content-Length */
      r->keep_alive = false;
      return r->content_length < 0 ? OFFLOAD_TRANSPORT_OK : OFFLOAD_HTTP1_ERR_RESPONSE;
    }
    r->body_len += n;
    return body_state(r);
  }
  if (n == 0) return OFFLOAD_HTTP1_ERR_RESPONSE; /* closed before the head ended */
  i = r->head_len >= 3 ? r->head_len - 3 : 0;    /* the blank line may straddle two reads */
  r->head_len += n;
  for (; i + 4 <= r->head_len; ++i) {
    if (memcmp(r->head + i, "\r\n\r\n", 4) == 0) {
      r->head_end = i + 4;
      break;
    }
  }
  if (r->head_end == 0) {
    return r->head_len == r->head_cap ? OFFLOAD_HTTP1_ERR_RESPONSE : OFFLOAD_HTTP1_MORE;
  }
  if (!parse_head(r)) return OFFLOAD_HTTP1_ERR_RESPONSE;
  /* Bytes read with the head are the body's start. */
  extra = r->head_len - r->head_end;
  if (r->content_length >= 0 && extra > (size_t)r->content_length) {
    extra = (size_t)r->content_length;
    r->surplus = true;
  }
  if (extra > r->body_cap) {
    extra = r->body_cap;
    r->overflow = true;
  }
  if (extra > 0) memcpy(r->body, r->head + r->head_end, extra);
  r->body_len = extra;
  return body_state(r);
}

bool offload_http1_reader_reusable(const offload_http1_reader_t* r) {
  return r->head_end != 0 && r->keep_alive && r->content_length >= 0 && !r->overflow &&
         !r->surplus && r->body_len == (size_t)r->content_length;
}
