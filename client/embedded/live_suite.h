/* live_suite.h - what the live tests share: check counting, the heap-guard self-test, and the
 * round trips against a live offload_server checked with libsodium. embedded_test.c runs them
 * over the POSIX transport, embedded_tls_test.c over the mbedTLS one.
 */
#ifndef CLIENT_EMBEDDED_LIVE_SUITE_H_
#define CLIENT_EMBEDDED_LIVE_SUITE_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "heap_guard.h"
#include "offload_client.h"

extern int live_failures;
extern int live_checks;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    ++live_checks;                                                    \
    if (!(cond)) {                                                    \
      heap_guard_disarm();                                            \
      ++live_failures;                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)

/* `s` is `want`; `client` (a pointer) gives the Connect message on a mismatch. */
#define CHECK_STATUS(client, s, want)                                                        \
  CHECK((s) == (want), "got %s, want %s (%s)", offload_status_name(s), offload_status_name(want), \
        (client)->last_error_message)

/* Decodes `2 * len` hex digits; 0 when `hex` is not exactly that. */
int live_from_hex(const char* hex, uint8_t* out, size_t len);

/* In the no-heap build: a child that arms the guard and calls malloc must die of SIGABRT. */
void live_check_guard_is_live(void);

/* Derive (raw and box key, then memo hits), box seal (our nonce and the server's), box open
 * (including an empty message), verify (valid, memo hit, tampered, empty message), and the
 * Connect errors of a tampered box, an unknown key and a malformed key id, through `client`
 * against the server's X25519 key `key_id` (public key `server_pk`). Each client call runs with
 * the heap guard armed. */
void live_round_trips(offload_client_t* client, const char* key_id, const uint8_t server_pk[32]);

/* Prints the totals; the exit status: 0 when every check passed, else 1. */
int live_summary(const char* program);

#endif /* CLIENT_EMBEDDED_LIVE_SUITE_H_ */
