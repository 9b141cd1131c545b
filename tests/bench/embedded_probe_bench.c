/* embedded_probe_bench.c - the embedded client's probe round (issue 32): a device with 15 peers
 * that, once a round, needs each peer's box key (a derive) or seals a PING to each peer and
 * opens its PONG (a box each way), through the embedded client over the POSIX transport.
 *
 *   embedded_probe_bench HTTP_PORT KEY_ID SERVER_PUBLIC_KEY_HEX derive|box on|off ROUNDS
 *
 * `on`: the derive memo in use (offload_posix_clock_ms, default maximum age), so with libsodium
 * (OFFLOAD_LOCAL_BOX) the boxes are sealed and opened on the device; `off`: no clock, so every
 * derive, seal and open is a request to the server. Fresh peers per run. Prints one line per
 * round: `round N requests R wall_us W` (R counted by the client: client.stats.requests; W the
 * wall time spent inside the client's calls of the round, so not the peers' own libsodium work),
 * then `total requests R`. Each derived key is checked against crypto_box_beforenm, each PING
 * opened and each PONG sealed by its peer with libsodium, so a wrong answer exits 1.
 * tests/bench/embedded_probe.py runs it and counts at the server.
 */
#define _POSIX_C_SOURCE 200809L
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload_client.h"
#include "transport_posix.h"

#define PEERS 15

static offload_client_t client;
static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
static offload_posix_transport_t http;
static uint8_t peer_pk[PEERS][32], peer_sk[PEERS][32];

static uint64_t in_client_us; /* wall time inside client calls, this round */

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int hex_to(const char* hex, uint8_t* out, size_t len) {
  size_t i;
  if (strlen(hex) != 2 * len) return 0;
  for (i = 0; i < len; ++i) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 0;
    out[i] = (uint8_t)v;
  }
  return 1;
}

static int fail(const char* what, offload_status_t s) {
  fprintf(stderr, "FAIL: %s: %s (%s)\n", what, offload_status_name(s), client.last_error_message);
  return 0;
}

/* One probe round; 1 when every answer checked out. */
static int round_derive(const char* key_id, const uint8_t server_pk[32]) {
  int p;
  for (p = 0; p < PEERS; ++p) {
    uint8_t k[32], want[32];
    uint64_t t0 = now_us();
    offload_status_t s = offload_derive(&client, key_id, peer_pk[p], true, k, NULL);
    in_client_us += now_us() - t0;
    if (s != OFFLOAD_OK) return fail("derive", s);
    if (crypto_box_beforenm(want, server_pk, peer_sk[p]) != 0 || memcmp(k, want, 32) != 0) {
      return fail("derive: not the peer's box key", OFFLOAD_OK);
    }
  }
  return 1;
}

static int round_box(const char* key_id, const uint8_t server_pk[32], int round) {
  int p;
  for (p = 0; p < PEERS; ++p) {
    uint8_t msg[64], ct[64 + 16], out[80], nonce[24];
    size_t len, ct_len = 0, out_len = 0;
    offload_status_t s;
    uint64_t t0;
    len = (size_t)snprintf((char*)msg, sizeof msg, "PING %d to %d", round, p);
    t0 = now_us();
    s = offload_box_seal(&client, key_id, peer_pk[p], NULL, msg, len, ct, sizeof ct, &ct_len,
                         nonce);
    in_client_us += now_us() - t0;
    if (s != OFFLOAD_OK) return fail("seal", s);
    if (crypto_box_open_easy(out, ct, ct_len, nonce, server_pk, peer_sk[p]) != 0 ||
        memcmp(out, msg, len) != 0) {
      return fail("seal: the peer cannot open the PING", OFFLOAD_OK);
    }
    len = (size_t)snprintf((char*)msg, sizeof msg, "PONG %d from %d", round, p);
    randombytes_buf(nonce, sizeof nonce);
    if (crypto_box_easy(ct, msg, len, nonce, server_pk, peer_sk[p]) != 0) return 0;
    t0 = now_us();
    s = offload_box_open(&client, key_id, 0, peer_pk[p], nonce, ct, len + 16, out, sizeof out,
                         &out_len, NULL);
    in_client_us += now_us() - t0;
    if (s != OFFLOAD_OK) return fail("open", s);
    if (out_len != len || memcmp(out, msg, len) != 0) return fail("open: not the PONG", OFFLOAD_OK);
  }
  return 1;
}

int main(int argc, char** argv) {
  uint8_t server_pk[32];
  int port, rounds, r, p, box, on;
  if (argc != 7 || (port = atoi(argv[1])) <= 0 || port > 65535 ||
      !hex_to(argv[3], server_pk, 32) ||
      (strcmp(argv[4], "derive") != 0 && strcmp(argv[4], "box") != 0) ||
      (strcmp(argv[5], "on") != 0 && strcmp(argv[5], "off") != 0) || (rounds = atoi(argv[6])) <= 0) {
    fprintf(stderr, "usage: %s HTTP_PORT KEY_ID SERVER_PUBLIC_KEY_HEX derive|box on|off ROUNDS\n",
            argv[0]);
    return 64;
  }
  box = strcmp(argv[4], "box") == 0;
  on = strcmp(argv[5], "on") == 0;
  if (sodium_init() < 0 || offload_posix_transport_init(&http, "127.0.0.1", (uint16_t)port) != 0 ||
      offload_client_init(&client, offload_posix_transport, &http, wire, sizeof wire) != OFFLOAD_OK) {
    return 1;
  }
  if (on) offload_client_set_clock(&client, offload_posix_clock_ms, NULL);
  for (p = 0; p < PEERS; ++p) crypto_box_keypair(peer_pk[p], peer_sk[p]);
  printf("mode %s memo %s slots %d local_box %d\n", argv[4], argv[5], OFFLOAD_MEMO_SLOTS,
         (int)(client.local_box && on));
  for (r = 0; r < rounds; ++r) {
    uint32_t before = client.stats.requests;
    int ok;
    in_client_us = 0;
    ok = box ? round_box(argv[2], server_pk, r) : round_derive(argv[2], server_pk);
    if (!ok) return 1;
    printf("round %d requests %u wall_us %llu\n", r, client.stats.requests - before,
           (unsigned long long)in_client_us);
  }
  printf("total requests %u hits %u misses %u\n", client.stats.requests, client.stats.hits,
         client.stats.misses);
  return 0;
}
