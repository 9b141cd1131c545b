/* live_suite.c - see live_suite.h. */
#define _POSIX_C_SOURCE 200809L
#include "live_suite.h"

#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int live_failures;
int live_checks;

int live_from_hex(const char* hex, uint8_t* out, size_t len) {
  size_t i;
  if (strlen(hex) != 2 * len) return 0;
  for (i = 0; i < len; ++i) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 0;
    out[i] = (uint8_t)v;
  }
  return 1;
}

void live_check_guard_is_live(void) {
  pid_t pid;
  int wstatus = 0;
  if (!heap_guard_enforced) return;
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    void* volatile p;
    heap_guard_arm();
    p = malloc(16);
    free(p);
    _exit(0);
  }
  CHECK(pid > 0 && waitpid(pid, &wstatus, 0) == pid && WIFSIGNALED(wstatus) &&
            WTERMSIG(wstatus) == SIGABRT,
        "an armed malloc() in a child should abort (wstatus %d)", wstatus);
}

void live_round_trips(offload_client_t* client, const char* key_id, const uint8_t server_pk[32]) {
  uint8_t peer_pk[32], peer_sk[32];
  uint8_t shared[32], shared2[32], expect[32];
  uint8_t nonce[24], nonce2[24];
  uint8_t pt[200], ct[200 + 16], out[256];
  size_t ct_len = 0, out_len = 0, i;
  bool memo_hit = true, valid = false;
  offload_status_t s;

  crypto_box_keypair(peer_pk, peer_sk);

  /* Derive, raw: equal to X25519(peer secret, server public); the first is computed, the second
   * comes from the memo. */
  heap_guard_arm();
  s = offload_derive(client, key_id, peer_pk, false, shared, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(crypto_scalarmult(expect, peer_sk, server_pk) == 0, "local scalarmult");
  CHECK(memcmp(shared, expect, 32) == 0, "raw derive differs from libsodium's crypto_scalarmult");
  CHECK(!memo_hit, "first derive for a new peer should not be a memo hit");
  heap_guard_arm();
  s = offload_derive(client, key_id, peer_pk, false, shared2, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(memcmp(shared2, expect, 32) == 0, "second raw derive differs");
  CHECK(memo_hit, "second derive for the same peer should be a memo hit");

  /* Derive, box key: equal to crypto_box_beforenm. */
  heap_guard_arm();
  s = offload_derive(client, key_id, peer_pk, true, shared, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(crypto_box_beforenm(expect, server_pk, peer_sk) == 0, "local beforenm");
  CHECK(memcmp(shared, expect, 32) == 0, "box derive differs from crypto_box_beforenm");
  heap_guard_arm();
  s = offload_derive(client, key_id, peer_pk, true, shared2, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(memcmp(shared2, expect, 32) == 0 && memo_hit, "second box derive: same key, memo hit");

  /* Box seal with our nonce: libsodium opens it. */
  for (i = 0; i < sizeof pt; ++i) pt[i] = (uint8_t)(i * 7 + 1);
  randombytes_buf(nonce, sizeof nonce);
  heap_guard_arm();
  s = offload_box_seal(client, key_id, peer_pk, nonce, pt, sizeof pt, ct, sizeof ct, &ct_len,
                       nonce2);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(ct_len == sizeof pt + 16, "ciphertext length %zu", ct_len);
  CHECK(memcmp(nonce, nonce2, 24) == 0, "the nonce given is the nonce used");
  CHECK(crypto_box_open_easy(out, ct, ct_len, nonce, server_pk, peer_sk) == 0 &&
            memcmp(out, pt, sizeof pt) == 0,
        "crypto_box_open_easy cannot open the server's box");

  /* Box seal with the server's nonce, then box open through the server: a round trip. */
  heap_guard_arm();
  s = offload_box_seal(client, key_id, peer_pk, NULL, pt, 33, ct, sizeof ct, &ct_len, nonce2);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(ct_len == 33 + 16, "ciphertext length %zu", ct_len);
  CHECK(crypto_box_open_easy(out, ct, ct_len, nonce2, server_pk, peer_sk) == 0 &&
            memcmp(out, pt, 33) == 0,
        "crypto_box_open_easy cannot open the server-nonce box");
  /* Open what we sealed to the server (from the peer to the key). */
  CHECK(crypto_box_easy(ct, pt, sizeof pt, nonce, server_pk, peer_sk) == 0, "local box");
  memset(out, 0, sizeof out);
  heap_guard_arm();
  s = offload_box_open(client, key_id, 0, peer_pk, nonce, ct, sizeof pt + 16, out, sizeof out,
                       &out_len, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(out_len == sizeof pt && memcmp(out, pt, sizeof pt) == 0, "box open round trip");
  CHECK(memo_hit, "box open after derive should take the box key from the memo");
  /* An empty plaintext is a valid box. */
  CHECK(crypto_box_easy(ct, pt, 0, nonce, server_pk, peer_sk) == 0, "local empty box");
  heap_guard_arm();
  s = offload_box_open(client, key_id, 0, peer_pk, nonce, ct, 16, out, sizeof out, &out_len,
                       NULL);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_OK);
  CHECK(out_len == 0, "empty box open gives %zu bytes", out_len);

  /* Errors the server reports as Connect errors. */
  CHECK(crypto_box_easy(ct, pt, sizeof pt, nonce, server_pk, peer_sk) == 0, "local box");
  ct[20] ^= 1;
  heap_guard_arm();
  s = offload_box_open(client, key_id, 0, peer_pk, nonce, ct, sizeof pt + 16, out, sizeof out,
                       &out_len, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(client->last_http_status == 400, "tampered box: HTTP %d", client->last_http_status);
  CHECK(strstr(client->last_error_message, "authentication failed") != NULL,
        "tampered box message: '%s'", client->last_error_message);
  heap_guard_arm();
  s = offload_derive(client, "no-such-key", peer_pk, false, shared, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_ERR_NOT_FOUND);
  CHECK(client->last_http_status == 404, "unknown key: HTTP %d", client->last_http_status);
  heap_guard_arm();
  s = offload_derive(client, "Bad Key!", peer_pk, false, shared, &memo_hit);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_ERR_INVALID_ARGUMENT);

  /* Local limits: no round trip. */
  heap_guard_arm();
  s = offload_box_open(client, key_id, 0, peer_pk, nonce, ct, sizeof pt + 16, out, 10, &out_len,
                       NULL);
  heap_guard_disarm();
  CHECK_STATUS(client, s, OFFLOAD_ERR_BUFFER_TOO_SMALL);
  CHECK(client->last_http_status == 0, "buffer too small must not reach the server");

  /* Verify: a libsodium signature is valid (then from the memo), a tampered one is not. */
  {
    uint8_t ed_pk[32], ed_sk[64], sig[64];
    static const uint8_t msg[] = "firmware 1.2.3 manifest";
    crypto_sign_keypair(ed_pk, ed_sk);
    crypto_sign_detached(sig, NULL, msg, sizeof msg - 1, ed_sk);
    heap_guard_arm();
    s = offload_verify(client, ed_pk, msg, sizeof msg - 1, sig, &valid, &memo_hit);
    heap_guard_disarm();
    CHECK_STATUS(client, s, OFFLOAD_OK);
    CHECK(valid && !memo_hit, "fresh valid signature: valid=%d memo_hit=%d", valid, memo_hit);
    heap_guard_arm();
    s = offload_verify(client, ed_pk, msg, sizeof msg - 1, sig, &valid, &memo_hit);
    heap_guard_disarm();
    CHECK_STATUS(client, s, OFFLOAD_OK);
    CHECK(valid && memo_hit, "repeated valid signature: valid=%d memo_hit=%d", valid, memo_hit);
    sig[5] ^= 0x10;
    heap_guard_arm();
    s = offload_verify(client, ed_pk, msg, sizeof msg - 1, sig, &valid, &memo_hit);
    heap_guard_disarm();
    CHECK_STATUS(client, s, OFFLOAD_OK);
    CHECK(!valid, "tampered signature must be invalid");
    /* An empty message is fine too. */
    crypto_sign_detached(sig, NULL, msg, 0, ed_sk);
    heap_guard_arm();
    s = offload_verify(client, ed_pk, NULL, 0, sig, &valid, NULL);
    heap_guard_disarm();
    CHECK_STATUS(client, s, OFFLOAD_OK);
    CHECK(valid, "signature over the empty message");
  }

}

int live_summary(const char* program) {
  printf("%s: %d checks, %lu client calls with the heap %s\n", program, live_checks,
         heap_guard_armed_count(), heap_guard_enforced ? "forbidden" : "allowed");
  printf("%s: %d checks, %d failures\n", program, live_checks, live_failures);
  return live_failures == 0 ? 0 : 1;
}
