/* embedded_tls_test.c - the embedded client against a live offload_server's TLS port, over the
 * mbedTLS transport, with a bearer token, a client certificate, or neither.
 *
 *   embedded_tls_test --ca=PEM --server-name=NAME [--token=FILE] [--cert=PEM --key=PEM]
 *                     HTTP_PORT MODE [ARGS]
 *
 * MODE:
 *   suite X25519_KEY_ID X25519_PUBLIC_KEY_HEX
 *       the round trips of live_suite.c on one kept connection (one handshake for them all),
 *       the transport's argument checks, and a port where nothing listens.
 *   expect STATUS [TRANSPORT_ERROR]
 *       one Verify call: its status is STATUS ("ok", "unauthenticated", "transport") and, after
 *       a transport failure, offload_mbedtls_transport_error_name() is TRANSPORT_ERROR
 *       ("verify", "handshake"); the failure is printed in words.
 *   idle
 *       a call, then the server closes the idle connection (--http_idle_timeout), then a call:
 *       the transport reconnects within it.
 *   refresh GOOD_TOKEN_FILE
 *       the token of --token is refused (UNAUTHENTICATED): the token provider, asked once, gives
 *       the one in GOOD_TOKEN_FILE and the call is sent once more and succeeds (two requests);
 *       the next call uses it (one request); a provider that gives a refused token again is
 *       asked once, the call is retried once and fails UNAUTHENTICATED.
 *
 * run_tls_live_test.sh makes the certificates and tokens and starts the servers. Built twice:
 * embedded_tls_test and embedded_tls_noheap_test (heap_guard.c). In the second, `suite`
 * connects before the first call and every call then runs with the heap forbidden: a call on an
 * open TLS connection allocates nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "live_suite.h"
#include "offload_client.h"
#include "transport_mbedtls.h"

static offload_client_t client;
static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
static offload_mbedtls_transport_t tls;
static offload_mbedtls_transport_t other;

static char ca_pem[16384], cert_pem[8192], key_pem[8192], token[OFFLOAD_TOKEN_MAX_LEN + 2];

/* Reads the file `path` into `buf` as a NUL-terminated string, without a final newline. */
static int read_text(const char* path, char* buf, size_t cap) {
  size_t n;
  FILE* f = fopen(path, "rb");
  if (f == NULL) return 0;
  n = fread(buf, 1, cap - 1, f);
  fclose(f);
  if (n == cap - 1) return 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) --n;
  buf[n] = '\0';
  return 1;
}

/* The value of `--name=value` in `arg`, or NULL. */
static const char* flag(const char* arg, const char* name) {
  size_t n = strlen(name);
  return strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : NULL;
}

static void print_failure(const char* what) {
  char why[512];
  printf("  %s: transport error %s: %s\n", what,
         offload_mbedtls_transport_error_name(client.last_transport_error),
         offload_mbedtls_transport_describe(&tls, why, sizeof why));
}

/* One Verify call of a fresh, valid signature; `*valid` is its answer. */
static offload_status_t verify_once(bool* valid) {
  static const uint8_t msg[] = "firmware 1.2.3 manifest";
  uint8_t ed_pk[32], ed_sk[64], sig[64];
  crypto_sign_keypair(ed_pk, ed_sk);
  crypto_sign_detached(sig, NULL, msg, sizeof msg - 1, ed_sk);
  *valid = false;
  return offload_verify(&client, ed_pk, msg, sizeof msg - 1, sig, valid, NULL);
}

/* init()'s refusals, each with its reason in words. */
static void check_config_errors(const offload_mbedtls_config_t* good) {
  char why[512];
  offload_mbedtls_config_t c = *good;
  c.server_name = NULL;
  CHECK(offload_mbedtls_transport_init(&other, &c) == OFFLOAD_MBEDTLS_ERR_ARGUMENT,
        "no server name");
  CHECK(strstr(offload_mbedtls_transport_describe(&other, why, sizeof why), "server_name") != NULL,
        "no server name: '%s'", why);
  offload_mbedtls_transport_free(&other);
  c = *good;
  c.server_name = "bad name\r\nX: y";
  CHECK(offload_mbedtls_transport_init(&other, &c) == OFFLOAD_MBEDTLS_ERR_ARGUMENT,
        "a server name with CR LF");
  offload_mbedtls_transport_free(&other);
  c = *good;
  c.ipv4 = "localhost";
  CHECK(offload_mbedtls_transport_init(&other, &c) == OFFLOAD_MBEDTLS_ERR_ARGUMENT,
        "not a numeric address");
  offload_mbedtls_transport_free(&other);
  c = *good;
  c.ca_pem = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
  CHECK(offload_mbedtls_transport_init(&other, &c) == OFFLOAD_MBEDTLS_ERR_SETUP, "a bad CA PEM");
  CHECK(strstr(offload_mbedtls_transport_describe(&other, why, sizeof why), "ca_pem") != NULL,
        "a bad CA PEM: '%s'", why);
  printf("  a bad CA PEM: %s\n", why);
  offload_mbedtls_transport_free(&other);
  c = *good;
  c.client_cert_pem = good->ca_pem;
  c.client_key_pem = NULL;
  CHECK(offload_mbedtls_transport_init(&other, &c) == OFFLOAD_MBEDTLS_ERR_ARGUMENT,
        "a client certificate without its key");
  offload_mbedtls_transport_free(&other);
}

static void run_suite(const offload_mbedtls_config_t* config, const char* key_id,
                      const char* pk_hex) {
  uint8_t server_pk[32], peer_pk[32] = {9}, shared[32];
  offload_mbedtls_config_t nowhere = *config;
  offload_status_t s;
  CHECK(live_from_hex(pk_hex, server_pk, sizeof server_pk), "public key hex '%s'", pk_hex);
  if (heap_guard_enforced) {
    /* The handshake allocates (inside mbedTLS): before the guard is armed. */
    CHECK(offload_mbedtls_transport_connect(&tls) == 0, "connect");
  }
  live_round_trips(&client, key_id, server_pk);
  CHECK(tls.handshakes == 1, "every call on one connection: %lu handshakes", tls.handshakes);

  check_config_errors(config);
  /* A transport failure: nothing listens on port 1. */
  nowhere.port = 1;
  CHECK(offload_mbedtls_transport_init(&other, &nowhere) == 0, "init, port 1");
  client.transport_ctx = &other;
  heap_guard_arm();
  s = offload_derive(&client, key_id, peer_pk, false, shared, NULL);
  heap_guard_disarm();
  CHECK_STATUS(&client, s, OFFLOAD_ERR_TRANSPORT);
  CHECK(client.last_transport_error == OFFLOAD_MBEDTLS_ERR_SOCKET, "transport error %d",
        client.last_transport_error);
  client.transport_ctx = &tls;
  offload_mbedtls_transport_free(&other);
}

static void run_expect(const char* want_status, const char* want_error) {
  bool valid = false;
  offload_status_t s = verify_once(&valid);
  printf("  verify: %s, HTTP %d, '%s'\n", offload_status_name(s), client.last_http_status,
         client.last_error_message);
  CHECK(strcmp(offload_status_name(s), want_status) == 0, "got %s, want %s (%s)",
        offload_status_name(s), want_status, client.last_error_message);
  if (s == OFFLOAD_OK) CHECK(valid, "a valid signature");
  if (s == OFFLOAD_ERR_UNAUTHENTICATED) {
    CHECK(client.last_http_status == 401, "unauthenticated: HTTP %d", client.last_http_status);
  }
  if (s == OFFLOAD_ERR_TRANSPORT) {
    char why[512];
    print_failure("verify");
    CHECK(offload_mbedtls_transport_describe(&tls, why, sizeof why)[0] != '\0', "no description");
  }
  if (want_error != NULL) {
    CHECK(strcmp(offload_mbedtls_transport_error_name(client.last_transport_error), want_error) ==
              0,
          "transport error %s, want %s",
          offload_mbedtls_transport_error_name(client.last_transport_error), want_error);
  }
}

static void run_idle(void) {
  struct pollfd p;
  bool valid = false;
  offload_status_t s = verify_once(&valid);
  CHECK_STATUS(&client, s, OFFLOAD_OK);
  CHECK(tls.handshakes == 1 && tls.fd >= 0, "one open connection: %lu handshakes", tls.handshakes);
  /* The server's idle timeout closes it: its close_notify or FIN makes the socket readable. */
  p.fd = tls.fd;
  p.events = POLLIN;
  p.revents = 0;
  CHECK(poll(&p, 1, 30000) == 1, "the server should close the idle connection");
  s = verify_once(&valid);
  CHECK_STATUS(&client, s, OFFLOAD_OK);
  CHECK(valid, "a valid signature");
  CHECK(tls.handshakes == 2, "the second call reconnects: %lu handshakes", tls.handshakes);
}

/* The token provider of `refresh`: counts its asks, gives `provided`. */
static char good_token[OFFLOAD_TOKEN_MAX_LEN + 2];
static const char* provided;
static int asks;
static const char* provide_token(void* ctx) {
  ++asks;
  CHECK(ctx == &asks, "provider context");
  return provided;
}

static void run_refresh(const char* good_token_file) {
  bool valid = false;
  offload_status_t s;
  uint32_t requests;
  CHECK(read_text(good_token_file, good_token, sizeof good_token), "read %s", good_token_file);
  CHECK(token[0] != '\0', "refresh needs --token (the one the server refuses)");
  provided = good_token;
  CHECK_STATUS(&client, offload_client_set_token_provider(&client, provide_token, &asks),
               OFFLOAD_OK);
  s = verify_once(&valid);
  CHECK_STATUS(&client, s, OFFLOAD_OK);
  CHECK(valid && asks == 1 && client.stats.requests == 2 && client.stats.token_refreshes == 1 &&
            client.token == good_token,
        "refused token: provider asked once (%d), the call sent twice (%u requests)", asks,
        client.stats.requests);
  requests = client.stats.requests;
  s = verify_once(&valid);
  CHECK_STATUS(&client, s, OFFLOAD_OK);
  CHECK(asks == 1 && client.stats.requests == requests + 1, "the new token stays: one request");
  /* A provider whose token the server refuses too: asked once, retried once. */
  CHECK_STATUS(&client, offload_client_set_token(&client, token), OFFLOAD_OK);
  provided = token;
  requests = client.stats.requests;
  s = verify_once(&valid);
  CHECK_STATUS(&client, s, OFFLOAD_ERR_UNAUTHENTICATED);
  CHECK(asks == 2 && client.stats.requests == requests + 2 && client.last_http_status == 401,
        "refused again: asked %d, %u requests", asks, client.stats.requests - requests);
  printf("  refresh: %d asks, %u requests, %u handshakes\n", asks, client.stats.requests,
         (unsigned)tls.handshakes);
}

int main(int argc, char** argv) {
  offload_mbedtls_config_t config;
  const char* mode = NULL;
  const char* v;
  int i, port = 0, ok = 1;
  memset(&config, 0, sizeof config);
  config.ipv4 = "127.0.0.1";
  for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; ++i) {
    if ((v = flag(argv[i], "--ca")) != NULL) {
      ok &= read_text(v, ca_pem, sizeof ca_pem);
      config.ca_pem = ca_pem;
    } else if ((v = flag(argv[i], "--cert")) != NULL) {
      ok &= read_text(v, cert_pem, sizeof cert_pem);
      config.client_cert_pem = cert_pem;
    } else if ((v = flag(argv[i], "--key")) != NULL) {
      ok &= read_text(v, key_pem, sizeof key_pem);
      config.client_key_pem = key_pem;
    } else if ((v = flag(argv[i], "--token")) != NULL) {
      ok &= read_text(v, token, sizeof token);
    } else if ((v = flag(argv[i], "--server-name")) != NULL) {
      config.server_name = v;
    } else {
      ok = 0;
    }
  }
  if (i + 1 < argc) {
    port = atoi(argv[i]);
    mode = argv[i + 1];
  }
  if (!ok || port <= 0 || port > 65535 || mode == NULL || config.ca_pem == NULL ||
      !((strcmp(mode, "suite") == 0 && argc == i + 4) ||
        (strcmp(mode, "expect") == 0 && (argc == i + 3 || argc == i + 4)) ||
        (strcmp(mode, "idle") == 0 && argc == i + 2) ||
        (strcmp(mode, "refresh") == 0 && argc == i + 3))) {
    fprintf(stderr,
            "usage: %s --ca=PEM --server-name=NAME [--token=FILE] [--cert=PEM --key=PEM] "
            "HTTP_PORT suite KEY_ID PUBLIC_KEY_HEX | expect STATUS [TRANSPORT_ERROR] | idle | "
            "refresh GOOD_TOKEN_FILE\n",
            argv[0]);
    return 64;
  }
  config.port = (uint16_t)port;
  if (sodium_init() < 0) return 1;
  printf("%s %s: heap guard %s, token %s, client certificate %s (transport struct %zu bytes)\n",
         argv[0], mode, heap_guard_enforced ? "ENFORCED" : "off", token[0] ? "yes" : "no",
         config.client_cert_pem ? "yes" : "no", sizeof tls);
  live_check_guard_is_live();

  if (offload_mbedtls_transport_init(&tls, &config) != 0) {
    char why[512];
    fprintf(stderr, "FAIL: transport init: %s\n",
            offload_mbedtls_transport_describe(&tls, why, sizeof why));
    return 1;
  }
  CHECK_STATUS(&client, offload_client_init(&client, offload_mbedtls_transport, &tls, wire,
                                            sizeof wire),
               OFFLOAD_OK);
  if (token[0] != '\0') {
    CHECK_STATUS(&client, offload_client_set_token(&client, token), OFFLOAD_OK);
  }
  if (strcmp(mode, "suite") == 0) run_suite(&config, argv[i + 2], argv[i + 3]);
  if (strcmp(mode, "expect") == 0) run_expect(argv[i + 2], argc == i + 4 ? argv[i + 3] : NULL);
  if (strcmp(mode, "idle") == 0) run_idle();
  if (strcmp(mode, "refresh") == 0) run_refresh(argv[i + 2]);
  offload_mbedtls_transport_free(&tls);
  return live_summary(argv[0]);
}
