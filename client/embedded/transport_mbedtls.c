/* transport_mbedtls.c - see transport_mbedtls.h. */
#define _POSIX_C_SOURCE 200809L
#include "transport_mbedtls.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>

#include "internal/http1.h"
#include "internal/tcp_posix.h"

/* The server's TLS port negotiates h2 or http/1.1; this client speaks HTTP/1.1 only. */
static const char* kAlpn[] = {"http/1.1", NULL};

/* Records the failure `rc` of `step` (mbedTLS's `code`, or 0) and returns `rc`. */
static int fail(offload_mbedtls_transport_t* t, int rc, const char* step, int code) {
  t->error_step = step;
  t->error_code = code;
  return rc;
}

static void clear_failure(offload_mbedtls_transport_t* t) {
  t->error_step = "";
  t->error_code = 0;
  t->verify_flags = 0;
}

/* The socket under mbedTLS: `ctx` points at the transport's `fd`. */
static int bio_send(void* ctx, const unsigned char* buf, size_t len) {
  return offload_tcp_send_all(*(const int*)ctx, buf, len) ? (int)len : MBEDTLS_ERR_NET_SEND_FAILED;
}

static int bio_recv(void* ctx, unsigned char* buf, size_t len) {
  ssize_t r = offload_tcp_recv(*(const int*)ctx, buf, len);
  if (r >= 0) return (int)r; /* 0: the peer closed */
  return (errno == EAGAIN || errno == EWOULDBLOCK) ? MBEDTLS_ERR_SSL_TIMEOUT
                                                   : MBEDTLS_ERR_NET_RECV_FAILED;
}

/* Whether mbedTLS's `code` came from the socket rather than from TLS. */
static bool is_socket_error(int code) {
  return code == MBEDTLS_ERR_NET_SEND_FAILED || code == MBEDTLS_ERR_NET_RECV_FAILED ||
         code == MBEDTLS_ERR_SSL_TIMEOUT || code == MBEDTLS_ERR_SSL_CONN_EOF;
}

/* A name for SNI, the certificate check and the Host header: 1 to 255 characters of letters,
 * digits, '-' and '.'. */
static bool copy_server_name(char* dst, const char* name) {
  size_t n = 0;
  if (name == NULL) return false;
  for (; name[n] != '\0'; ++n) {
    char c = name[n];
    if (n + 1 >= OFFLOAD_MBEDTLS_SERVER_NAME_CAP ||
        !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '-' || c == '.')) {
      return false;
    }
  }
  if (n == 0) return false;
  memcpy(dst, name, n + 1);
  return true;
}

/* Parses the NUL-terminated PEM `pem` into `crt`; false unless every certificate in it parses
 * (then `*code` is mbedTLS's error, or 0 when only some failed). */
static bool parse_certificates(mbedtls_x509_crt* crt, const char* pem, int* code) {
  int ret = mbedtls_x509_crt_parse(crt, (const unsigned char*)pem, strlen(pem) + 1);
  *code = ret < 0 ? ret : 0;
  return ret == 0;
}

int offload_mbedtls_transport_init(offload_mbedtls_transport_t* t,
                                   const offload_mbedtls_config_t* config) {
  static const char kPersonalization[] = "offload_mbedtls_transport";
  char ipv4_text[OFFLOAD_TCP_IPV4_TEXT_CAP];
  int ret;
  if (t == NULL) return OFFLOAD_MBEDTLS_ERR_ARGUMENT;
  memset(t, 0, sizeof *t);
  t->fd = -1;
  clear_failure(t);
  mbedtls_entropy_init(&t->entropy);
  mbedtls_ctr_drbg_init(&t->drbg);
  mbedtls_x509_crt_init(&t->ca);
  mbedtls_x509_crt_init(&t->client_cert);
  mbedtls_pk_init(&t->client_key);
  mbedtls_ssl_config_init(&t->conf);
  mbedtls_ssl_init(&t->ssl);

  if (config == NULL) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_ARGUMENT, "config: expected a config, got NULL", 0);
  }
  if (config->port == 0 || !offload_tcp_parse_ipv4(config->ipv4, &t->addr_be, ipv4_text)) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_ARGUMENT,
                "config.ipv4, config.port: expected a dotted-quad IPv4 address and a port", 0);
  }
  if (!copy_server_name(t->server_name, config->server_name)) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_ARGUMENT,
                "config.server_name: expected 1 to 255 letters, digits, '-' or '.'", 0);
  }
  if (config->ca_pem == NULL) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_ARGUMENT, "config.ca_pem: expected a PEM, got NULL", 0);
  }
  if ((config->client_cert_pem == NULL) != (config->client_key_pem == NULL)) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_ARGUMENT,
                "config.client_cert_pem, config.client_key_pem: expected both or neither", 0);
  }
  t->port = config->port;
  t->timeout_ms = config->timeout_ms > 0 ? config->timeout_ms : 5000;

  ret = mbedtls_ctr_drbg_seed(&t->drbg, mbedtls_entropy_func, &t->entropy,
                              (const unsigned char*)kPersonalization, sizeof kPersonalization - 1);
  if (ret != 0) return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP, "seeding the RNG", ret);
  if (!parse_certificates(&t->ca, config->ca_pem, &ret)) {
    return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP, "config.ca_pem: a certificate does not parse", ret);
  }
  if (config->client_cert_pem != NULL) {
    if (!parse_certificates(&t->client_cert, config->client_cert_pem, &ret)) {
      return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP,
                  "config.client_cert_pem: a certificate does not parse", ret);
    }
    ret = mbedtls_pk_parse_key(&t->client_key, (const unsigned char*)config->client_key_pem,
                               strlen(config->client_key_pem) + 1, NULL, 0);
    if (ret != 0) {
      return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP, "config.client_key_pem: does not parse", ret);
    }
    ret = mbedtls_pk_check_pair(&t->client_cert.pk, &t->client_key);
    if (ret != 0) {
      return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP,
                  "config.client_key_pem: not the key of client_cert_pem", ret);
    }
  }

  ret = mbedtls_ssl_config_defaults(&t->conf, MBEDTLS_SSL_IS_CLIENT, MBEDTLS_SSL_TRANSPORT_STREAM,
                                    MBEDTLS_SSL_PRESET_DEFAULT);
  if (ret == 0) {
    mbedtls_ssl_conf_authmode(&t->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    mbedtls_ssl_conf_ca_chain(&t->conf, &t->ca, NULL);
    mbedtls_ssl_conf_rng(&t->conf, mbedtls_ctr_drbg_random, &t->drbg);
    mbedtls_ssl_conf_min_version(&t->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3); /* TLS 1.2 */
    ret = mbedtls_ssl_conf_alpn_protocols(&t->conf, kAlpn);
  }
  if (ret == 0 && config->client_cert_pem != NULL) {
    ret = mbedtls_ssl_conf_own_cert(&t->conf, &t->client_cert, &t->client_key);
  }
  if (ret == 0) ret = mbedtls_ssl_setup(&t->ssl, &t->conf);
  if (ret != 0) return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP, "TLS set-up", ret);
  mbedtls_ssl_set_bio(&t->ssl, &t->fd, bio_send, bio_recv, NULL);
  return 0;
}

/* Closes the connection, after a close_notify when `notify` (the session is still sound). */
static void drop_connection(offload_mbedtls_transport_t* t, bool notify) {
  if (t->fd < 0) return;
  if (notify) (void)mbedtls_ssl_close_notify(&t->ssl);
  close(t->fd);
  t->fd = -1;
}

/* Connects and does the handshake: SNI and the certificate check for `server_name`. */
static int open_connection(offload_mbedtls_transport_t* t) {
  int ret;
  t->fd = offload_tcp_connect(t->addr_be, t->port, t->timeout_ms);
  if (t->fd < 0) return fail(t, OFFLOAD_MBEDTLS_ERR_SOCKET, "connect", 0);
  ret = mbedtls_ssl_session_reset(&t->ssl);
  if (ret == 0) ret = mbedtls_ssl_set_hostname(&t->ssl, t->server_name);
  if (ret != 0) {
    drop_connection(t, false);
    return fail(t, OFFLOAD_MBEDTLS_ERR_SETUP, "TLS session reset", ret);
  }
  do {
    ret = mbedtls_ssl_handshake(&t->ssl);
  } while (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE);
  if (ret != 0) {
    drop_connection(t, false);
    if (ret == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED) {
      t->verify_flags = mbedtls_ssl_get_verify_result(&t->ssl);
      return fail(t, OFFLOAD_MBEDTLS_ERR_VERIFY, "handshake", ret);
    }
    /* A server that refuses our certificate sends its alert and closes: our next write or read
     * then fails on the socket. */
    return fail(t, OFFLOAD_MBEDTLS_ERR_HANDSHAKE,
                is_socket_error(ret) ? "handshake: the connection broke (did the server refuse it?)"
                                     : "handshake",
                ret);
  }
  ++t->handshakes;
  return 0;
}

static int write_all(offload_mbedtls_transport_t* t, const void* data, size_t len) {
  const unsigned char* p = (const unsigned char*)data;
  while (len > 0) {
    int ret = mbedtls_ssl_write(&t->ssl, p, len);
    if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) continue;
    if (ret < 0) {
      return fail(t, is_socket_error(ret) ? OFFLOAD_MBEDTLS_ERR_SOCKET : OFFLOAD_MBEDTLS_ERR_TLS,
                  "send", ret);
    }
    p += ret;
    len -= (size_t)ret;
  }
  return 0;
}

/* Sends `request` on the open connection and reads the answer into `reader` (set up here,
 * before anything can fail, so the caller may look at what arrived). */
static int exchange(offload_mbedtls_transport_t* t, const offload_transport_request_t* request,
                    uint8_t* resp, size_t resp_cap, offload_http1_reader_t* reader) {
  offload_http1_part_t parts[OFFLOAD_HTTP1_MAX_PARTS];
  int count, i, rc;
  offload_http1_reader_init(reader, t->head, sizeof t->head, resp, resp_cap);
  count = offload_http1_request(t->head, sizeof t->head, t->server_name, t->port,
                                /*keep_alive=*/true, request, parts);
  if (count < 0) return fail(t, count, "request", 0);
  for (i = 0; i < count; ++i) {
    rc = write_all(t, parts[i].data, parts[i].len);
    if (rc != 0) return rc;
  }
  do {
    size_t room;
    uint8_t* at = offload_http1_reader_space(reader, &room);
    int ret = mbedtls_ssl_read(&t->ssl, at, room);
    rc = OFFLOAD_HTTP1_MORE;
    if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) continue;
    if (ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || ret == MBEDTLS_ERR_SSL_CONN_EOF) ret = 0;
    if (ret < 0) {
      return fail(t, is_socket_error(ret) ? OFFLOAD_MBEDTLS_ERR_SOCKET : OFFLOAD_MBEDTLS_ERR_TLS,
                  "receive", ret);
    }
    rc = offload_http1_reader_received(reader, (size_t)ret);
  } while (rc == OFFLOAD_HTTP1_MORE);
  return rc == OFFLOAD_HTTP1_ERR_RESPONSE ? fail(t, rc, "response", 0) : rc;
}

int offload_mbedtls_transport(void* ctx, const offload_transport_request_t* request,
                              uint8_t* resp, size_t resp_cap, size_t* resp_len, int* http_status) {
  offload_mbedtls_transport_t* t = (offload_mbedtls_transport_t*)ctx;
  offload_http1_reader_t reader;
  int attempt, rc = OFFLOAD_MBEDTLS_ERR_SOCKET;
  if (t == NULL || request == NULL || resp_len == NULL || http_status == NULL ||
      (resp == NULL && resp_cap > 0)) {
    return OFFLOAD_MBEDTLS_ERR_ARGUMENT;
  }
  *resp_len = 0;
  *http_status = 0;
  clear_failure(t);
  for (attempt = 0; attempt < 2; ++attempt) {
    bool reused = t->fd >= 0;
    rc = reused ? 0 : open_connection(t);
    if (rc != 0) break;
    rc = exchange(t, request, resp, resp_cap, &reader);
    if (rc == OFFLOAD_TRANSPORT_OK || rc == OFFLOAD_TRANSPORT_OVERFLOW) {
      if (!offload_http1_reader_reusable(&reader)) drop_connection(t, true);
      *resp_len = reader.body_len;
      *http_status = reader.status;
      break;
    }
    drop_connection(t, false);
    /* Once more on a new connection only when a kept one failed before any answer came: the
     * server closed it while it was idle. A timeout is not that. Repeating a call is safe:
     * derive, seal, open and verify change nothing on the server. */
    if (!reused || rc == OFFLOAD_MBEDTLS_ERR_ARGUMENT || reader.head_len > 0 ||
        t->error_code == MBEDTLS_ERR_SSL_TIMEOUT) {
      break;
    }
  }
  offload_wipe(t->head, sizeof t->head); /* the request head held the token */
  return rc;
}

int offload_mbedtls_transport_connect(offload_mbedtls_transport_t* t) {
  if (t == NULL) return OFFLOAD_MBEDTLS_ERR_ARGUMENT;
  clear_failure(t);
  return t->fd >= 0 ? 0 : open_connection(t);
}

void offload_mbedtls_transport_close(offload_mbedtls_transport_t* t) {
  if (t != NULL) drop_connection(t, true);
}

void offload_mbedtls_transport_free(offload_mbedtls_transport_t* t) {
  if (t == NULL) return;
  drop_connection(t, true);
  mbedtls_ssl_free(&t->ssl);
  mbedtls_ssl_config_free(&t->conf);
  mbedtls_pk_free(&t->client_key);
  mbedtls_x509_crt_free(&t->client_cert);
  mbedtls_x509_crt_free(&t->ca);
  mbedtls_ctr_drbg_free(&t->drbg);
  mbedtls_entropy_free(&t->entropy);
}

const char* offload_mbedtls_transport_error_name(int rc) {
  switch (rc) {
    case OFFLOAD_TRANSPORT_OK: return "ok";
    case OFFLOAD_TRANSPORT_OVERFLOW: return "overflow";
    case OFFLOAD_MBEDTLS_ERR_SOCKET: return "socket";
    case OFFLOAD_MBEDTLS_ERR_RESPONSE: return "response";
    case OFFLOAD_MBEDTLS_ERR_ARGUMENT: return "argument";
    case OFFLOAD_MBEDTLS_ERR_SETUP: return "setup";
    case OFFLOAD_MBEDTLS_ERR_HANDSHAKE: return "handshake";
    case OFFLOAD_MBEDTLS_ERR_VERIFY: return "verify";
    case OFFLOAD_MBEDTLS_ERR_TLS: return "tls";
    default: return "?";
  }
}

/* Appends `s` to out[*n..cap), truncating, keeping the NUL; newlines become "; ". */
static void append_text(char* out, size_t cap, size_t* n, const char* s) {
  for (; *s != '\0' && *n + 1 < cap; ++s) {
    if (*s != '\n') {
      out[(*n)++] = *s;
    } else if (s[1] != '\0' && *n + 3 < cap) {
      out[(*n)++] = ';';
      out[(*n)++] = ' ';
    }
  }
  out[*n] = '\0';
}

const char* offload_mbedtls_transport_describe(const offload_mbedtls_transport_t* t, char* out,
                                               size_t cap) {
  size_t n = 0;
  if (out == NULL || cap == 0) return out;
  out[0] = '\0';
  if (t == NULL) return out;
  append_text(out, cap, &n, t->error_step[0] != '\0' ? t->error_step : "no failure");
  if (t->error_code != 0) {
    char text[160];
    mbedtls_strerror(t->error_code, text, sizeof text);
    append_text(out, cap, &n, ": ");
    append_text(out, cap, &n, text);
  }
  if (t->verify_flags != 0) {
    char info[320];
    if (mbedtls_x509_crt_verify_info(info, sizeof info, "", t->verify_flags) < 0) info[0] = '\0';
    append_text(out, cap, &n, " (server certificate: ");
    append_text(out, cap, &n, info);
    append_text(out, cap, &n, ")");
  }
  return out;
}
