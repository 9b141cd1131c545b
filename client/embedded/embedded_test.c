/* embedded_test.c - the embedded client against a live offload_server's Connect port, over the
 * POSIX transport (plain HTTP/1.1).
 *
 *   embedded_test HTTP_PORT X25519_KEY_ID X25519_PUBLIC_KEY_HEX
 *
 * run_live_test.sh starts the server and creates the key. The round trips (live_suite.c) check
 * each server answer against libsodium on this side; then a port where nothing listens gives
 * OFFLOAD_ERR_TRANSPORT.
 *
 * Built twice: embedded_test (heap_guard_off.c) and embedded_noheap_test (heap_guard.c), where
 * every client call runs with malloc/free/calloc/realloc set to abort().
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

#include "live_suite.h"
#include "offload_client.h"
#include "transport_posix.h"

/* Everything the client touches is static: nothing on the heap, little on the stack. */
static offload_client_t client;
static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
static offload_posix_transport_t http;

int main(int argc, char** argv) {
  uint8_t server_pk[32], peer_pk[32] = {9}, shared[32];
  offload_status_t s;
  int port;

  if (argc != 4 || (port = atoi(argv[1])) <= 0 || port > 65535 ||
      !live_from_hex(argv[3], server_pk, sizeof server_pk)) {
    fprintf(stderr, "usage: %s HTTP_PORT X25519_KEY_ID X25519_PUBLIC_KEY_HEX\n", argv[0]);
    return 64;
  }
  if (sodium_init() < 0) return 1;
  printf("%s: heap guard %s\n", argv[0], heap_guard_enforced ? "ENFORCED" : "off");
  live_check_guard_is_live();

  CHECK(offload_posix_transport_init(&http, "127.0.0.1", (uint16_t)port) == 0, "transport init");
  s = offload_client_init(&client, offload_posix_transport, &http, wire, sizeof wire);
  CHECK_STATUS(&client, s, OFFLOAD_OK);
  live_round_trips(&client, argv[2], server_pk);

  /* A transport failure: nothing listens on port 1. */
  {
    offload_posix_transport_t nowhere;
    CHECK(offload_posix_transport_init(&nowhere, "127.0.0.1", 1) == 0, "init");
    client.transport_ctx = &nowhere;
    heap_guard_arm();
    s = offload_derive(&client, argv[2], peer_pk, false, shared, NULL);
    heap_guard_disarm();
    CHECK_STATUS(&client, s, OFFLOAD_ERR_TRANSPORT);
    CHECK(client.last_transport_error == OFFLOAD_POSIX_ERR_SOCKET, "transport error %d",
          client.last_transport_error);
    client.transport_ctx = &http;
  }
  return live_summary(argv[0]);
}
