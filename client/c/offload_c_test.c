/* offload_c_test: the C ABI from plain C99 against a live offload_server.
 *
 *   offload_c_test /path/to/offload_server
 *   offload_c_test /path/to/offload_server --auth CREDENTIALS_DIR    (offload_c_auth_test.sh)
 *
 * Starts the server on free loopback ports with a temporary data folder and a random
 * OFFLOAD_KEK, runs every entry point of offload.h (including the buffer-too-small protocol and
 * error codes), and stops the server. With --auth, instead: offload_client_create_with_options'
 * checks of its options, then the same tour over mTLS (and refusals: wrong CA, unchecked name, no
 * or a foreign client certificate), then over TLS with bearer tokens (none, expired, refreshed,
 * without a grant), each against its own server. Exit code 0 when every check passed. */
#define _POSIX_C_SOURCE 200809L

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/c/offload.h"

static int failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,      \
              __LINE__, #cond, offload_last_error());                              \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

#define CHECK_STATUS(expr, want)                                                    \
  do {                                                                              \
    offload_status_t got_ = (expr);                                                 \
    if (got_ != (want)) {                                                           \
      fprintf(stderr, "%s:%d: %s: expected %s, got %s (%s)\n", __FILE__, __LINE__,  \
              #expr, offload_status_name(want), offload_status_name(got_),          \
              offload_last_error());                                                \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

static int free_port(void) {
  struct sockaddr_in addr;
  socklen_t len = sizeof(addr);
  int port = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0 &&
      getsockname(fd, (struct sockaddr*)&addr, &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

/* Starts offload_server on fresh free ports with its data in `dir`, its stderr in `log`, the
   key-encryption key `kek` (the same on every attempt: the key file is sealed with it), and the
   flags `extra` (NULL-terminated; may be NULL). */
static pid_t start_server(const char* binary, const char* dir, const char* kek, const char* log,
                          char* const* extra, char* address, size_t address_len) {
  char grpc_flag[128], metrics_flag[64], http_flag[64], data_flag[4200];
  pid_t pid;
  snprintf(address, address_len, "127.0.0.1:%d", free_port());
  snprintf(grpc_flag, sizeof(grpc_flag), "--grpc_address=%s", address);
  snprintf(metrics_flag, sizeof(metrics_flag), "--metrics_address=127.0.0.1:%d", free_port());
  snprintf(http_flag, sizeof(http_flag), "--http_address=127.0.0.1:%d", free_port());
  snprintf(data_flag, sizeof(data_flag), "--data_dir=%s", dir);
  pid = fork();
  if (pid == 0) {
    char* argv[32];
    int n = 0;
    argv[n++] = (char*)binary;
    argv[n++] = grpc_flag;
    argv[n++] = data_flag;
    argv[n++] = metrics_flag;
    /* --http_address only when this server build has the gateway (the flag is unknown otherwise). */
    {
      char cmd[4400];
      snprintf(cmd, sizeof(cmd), "%s --helpfull 2>&1 | grep -q -- '--http_address'", binary);
      if (system(cmd) == 0) argv[n++] = http_flag;
    }
    while (extra != NULL && *extra != NULL && n < 31) argv[n++] = *extra++;
    argv[n] = NULL;
    setenv("OFFLOAD_KEK", kek, 1);
    if (freopen("/dev/null", "w", stdout) == NULL || freopen(log, "w", stderr) == NULL) _exit(126);
    execv(binary, argv);
    _exit(127);
  }
  return pid;
}

/* Whether the file at `path` contains `needle` (the server's log is small). */
static int file_contains(const char* path, const char* needle) {
  static char buf[1 << 16];
  size_t n;
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, needle) != NULL;
}

/* Waits, 60 s at most by the clock, for this process's own "server_started" log line (a probe over
   the network could be answered by another test's server on a port both picked). 0: started;
   1: exited first (reaped); 2: neither within 60 s (still running). */
static int wait_started(pid_t pid, const char* log) {
  const time_t give_up = time(NULL) + 60;
  while (time(NULL) < give_up) {
    if (file_contains(log, "\"server_started\"")) return 0;
    if (waitpid(pid, NULL, WNOHANG) == pid) return 1;
    sleep_ms(50);
  }
  return 2;
}

static void hex_to(const char* hex, uint8_t* out, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    out[i] = (uint8_t)v;
  }
}

/* Starts a server (see start_server) and waits for its "server_started" line. The ports are free
   when picked, not reserved: a test running beside this one may take one first, and the server
   then exits with "cannot listen on". Then: fresh ports, 3 starts in all. -1 when it did not
   start (its log printed). */
static pid_t launch(const char* binary, const char* dir, const char* kek, char* const* extra,
                    char* address, size_t address_len) {
  char log[4200];
  int attempt;
  snprintf(log, sizeof(log), "%s/server.log", dir);
  for (attempt = 1;; attempt++) {
    int started;
    pid_t pid = start_server(binary, dir, kek, log, extra, address, address_len);
    if (pid < 0) {
      perror("fork");
      return -1;
    }
    started = wait_started(pid, log);
    if (started == 0) return pid;
    if (started == 1 && attempt < 3 && file_contains(log, "cannot listen on")) {
      fprintf(stderr, "a port was taken (attempt %d); starting again on fresh ports\n", attempt);
      continue;
    }
    fprintf(stderr, "offload_server %s:\n", started == 1 ? "exited before it started" :
                                                        "did not start within 60 s");
    {
      char cmd[4300];
      snprintf(cmd, sizeof(cmd), "cat '%s' >&2", log);
      if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
    }
    if (started == 2) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
    }
    return -1;
  }
}

static void stop_server(pid_t pid) {
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
}

/* The server has started; waits for its first answer (a key creation that works), 60 s at most by
   the clock. 1 when it came. */
static int wait_ready(offload_client_t* client) {
  const time_t give_up = time(NULL) + 60;
  while (time(NULL) < give_up) {
    offload_status_t s = offload_key_create(client, "c-ed", OFFLOAD_KEY_ED25519, NULL, NULL);
    if (s == OFFLOAD_OK || s == OFFLOAD_ALREADY_EXISTS) {
      /* ALREADY_EXISTS: an earlier try that timed out on a slow server did create it. */
      return 1;
    } else if (s == OFFLOAD_UNAVAILABLE || s == OFFLOAD_DEADLINE_EXCEEDED) {
      sleep_ms(100);
    } else {
      fprintf(stderr, "key create: %s: %s\n", offload_status_name(s), offload_last_error());
      return 0;
    }
  }
  return 0;
}

/* Every entry point against a fresh server whose key "c-ed" wait_ready made. */
static void tour(offload_client_t* client) {
  /* --- Ed25519: sign, then verify good and bad; the buffer protocol on the signature. */
  const uint8_t msg[] = "hello from C";
  uint8_t sig[64], pk[32], small[10];
  size_t sig_len = 0, small_len = sizeof(small);
  int valid = -1;
  CHECK_STATUS(offload_sign(client, "c-ed", msg, sizeof(msg) - 1, NULL, &sig_len, NULL),
               OFFLOAD_BUFFER_TOO_SMALL);
  CHECK(sig_len == 64);
  CHECK_STATUS(offload_sign(client, "c-ed", msg, sizeof(msg) - 1, small, &small_len, NULL),
               OFFLOAD_BUFFER_TOO_SMALL);
  CHECK(small_len == 64);
  sig_len = sizeof(sig);
  CHECK_STATUS(offload_sign(client, "c-ed", msg, sizeof(msg) - 1, sig, &sig_len, pk),
               OFFLOAD_OK);
  CHECK(sig_len == 64);
  CHECK_STATUS(offload_verify(client, pk, 32, msg, sizeof(msg) - 1, sig, 64, &valid), OFFLOAD_OK);
  CHECK(valid == 1);
  sig[0] ^= 1;
  CHECK_STATUS(offload_verify(client, pk, 32, msg, sizeof(msg) - 1, sig, 64, &valid), OFFLOAD_OK);
  CHECK(valid == 0);
  CHECK_STATUS(offload_verify(client, pk, 31, msg, sizeof(msg) - 1, sig, 64, &valid),
               OFFLOAD_INVALID_ARGUMENT);
  CHECK_STATUS(offload_sign(client, "c-none", msg, 1, sig, &sig_len, NULL), OFFLOAD_NOT_FOUND);
  CHECK_STATUS(offload_key_create(client, "c-ed", OFFLOAD_KEY_ED25519, NULL, NULL),
               OFFLOAD_ALREADY_EXISTS);

  /* --- Import: RFC 8032 test 1 seed gives its public key. */
  {
    uint8_t seed[32], want_pk[32], got_pk[32];
    size_t got_len = sizeof(got_pk);
    hex_to("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", seed, 32);
    hex_to("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", want_pk, 32);
    CHECK_STATUS(offload_key_import(client, "c-rfc8032", OFFLOAD_KEY_ED25519, seed, 32, got_pk,
                                    &got_len),
                 OFFLOAD_OK);
    CHECK(got_len == 32 && memcmp(got_pk, want_pk, 32) == 0);
  }

  /* --- X25519 / box: two managed keys talk to each other through the service. */
  {
    uint8_t a_pk[32], b_pk[32], k_ab[32], k_ba[32], box_ab[32];
    size_t a_len = 32, b_len = 32, k1 = 32, k2 = 32, k3 = 32;
    const uint8_t text[] = "box from a to b";
    uint8_t ct[64], nonce[24], back[64];
    size_t ct_len = sizeof(ct), back_len = sizeof(back);
    CHECK_STATUS(offload_key_create(client, "c-xa", OFFLOAD_KEY_X25519, a_pk, &a_len), OFFLOAD_OK);
    CHECK_STATUS(offload_key_create(client, "c-xb", OFFLOAD_KEY_X25519, b_pk, &b_len), OFFLOAD_OK);
    CHECK(a_len == 32 && b_len == 32);
    CHECK_STATUS(offload_derive(client, "c-xa", b_pk, 32, OFFLOAD_DERIVE_RAW, k_ab, &k1), OFFLOAD_OK);
    CHECK_STATUS(offload_derive(client, "c-xb", a_pk, 32, OFFLOAD_DERIVE_RAW, k_ba, &k2), OFFLOAD_OK);
    CHECK(k1 == 32 && k2 == 32 && memcmp(k_ab, k_ba, 32) == 0);
    CHECK_STATUS(offload_derive(client, "c-xa", b_pk, 32, OFFLOAD_DERIVE_BOX_BEFORENM, box_ab, &k3),
                 OFFLOAD_OK);
    CHECK(memcmp(box_ab, k_ab, 32) != 0);
    CHECK_STATUS(offload_derive(client, "c-xa", b_pk, 32, (offload_derive_output_t)7, k_ab, &k1),
                 OFFLOAD_INVALID_ARGUMENT);
    CHECK_STATUS(offload_box_seal(client, "c-xa", b_pk, 32, NULL, 0, text, sizeof(text) - 1, ct,
                                  &ct_len, nonce),
                 OFFLOAD_OK);
    CHECK(ct_len == sizeof(text) - 1 + OFFLOAD_BOX_MAC_BYTES);
    CHECK_STATUS(offload_box_open(client, "c-xb", a_pk, 32, nonce, 24, ct, ct_len, back, &back_len),
                 OFFLOAD_OK);
    CHECK(back_len == sizeof(text) - 1 && memcmp(back, text, back_len) == 0);
    ct[3] ^= 1;
    back_len = sizeof(back);
    CHECK_STATUS(offload_box_open(client, "c-xb", a_pk, 32, nonce, 24, ct, ct_len, back, &back_len),
                 OFFLOAD_INVALID_ARGUMENT);
  }

  /* --- AEAD: seal, size query, open, wrong associated data. */
  {
    const uint8_t text[] = "sealed state";
    const uint8_t ad[] = "user-42";
    uint8_t env[128], out[64];
    size_t env_len = 0, out_len = 0;
    CHECK_STATUS(offload_key_create(client, "c-aead", OFFLOAD_KEY_AES256_GCM, NULL, NULL),
                 OFFLOAD_OK);
    CHECK_STATUS(offload_aead_seal(client, "c-aead", text, sizeof(text) - 1, ad, sizeof(ad) - 1,
                                   NULL, &env_len),
                 OFFLOAD_BUFFER_TOO_SMALL);
    CHECK(env_len == 5 + 12 + (sizeof(text) - 1) + 16);
    env_len = sizeof(env);
    CHECK_STATUS(offload_aead_seal(client, "c-aead", text, sizeof(text) - 1, ad, sizeof(ad) - 1,
                                   env, &env_len),
                 OFFLOAD_OK);
    CHECK_STATUS(offload_aead_open(client, "c-aead", env, env_len, ad, sizeof(ad) - 1, out,
                                   &out_len),
                 OFFLOAD_BUFFER_TOO_SMALL);
    CHECK(out_len == sizeof(text) - 1);
    CHECK_STATUS(offload_aead_open(client, "c-aead", env, env_len, ad, sizeof(ad) - 1, out,
                                   &out_len),
                 OFFLOAD_OK);
    CHECK(out_len == sizeof(text) - 1 && memcmp(out, text, out_len) == 0);
    out_len = sizeof(out);
    CHECK_STATUS(offload_aead_open(client, "c-aead", env, env_len, NULL, 0, out, &out_len),
                 OFFLOAD_INVALID_ARGUMENT);
    CHECK_STATUS(offload_aead_open(client, "c-aead", env, env_len, NULL, 3, out, &out_len),
                 OFFLOAD_INVALID_ARGUMENT);
  }

  /* --- Lifecycle: disable and enable; a deletion is scheduled (the server's 7-day default
     wait), refuses every call meanwhile, and can be cancelled. */
  sig_len = sizeof(sig);
  CHECK_STATUS(offload_key_disable(client, "c-ed"), OFFLOAD_OK);
  CHECK_STATUS(offload_key_disable(client, "c-ed"), OFFLOAD_OK); /* already disabled: a no-op */
  CHECK_STATUS(offload_sign(client, "c-ed", msg, 1, sig, &sig_len, NULL),
               OFFLOAD_FAILED_PRECONDITION);
  CHECK_STATUS(offload_key_enable(client, "c-ed"), OFFLOAD_OK);
  CHECK_STATUS(offload_sign(client, "c-ed", msg, 1, sig, &sig_len, NULL), OFFLOAD_OK);
  CHECK_STATUS(offload_key_disable(client, "c-none"), OFFLOAD_NOT_FOUND);
  CHECK_STATUS(offload_key_cancel_deletion(client, "c-ed"), OFFLOAD_FAILED_PRECONDITION);
  {
    const int64_t week = 7 * 24 * 3600;
    const int64_t now = (int64_t)time(NULL);
    int64_t when = 0;
    /* Shorter than the server's wait: refused. */
    CHECK_STATUS(offload_key_schedule_deletion(client, "c-ed", 3600, &when),
                 OFFLOAD_INVALID_ARGUMENT);
    CHECK_STATUS(offload_key_schedule_deletion(client, "c-ed", 0, &when), OFFLOAD_OK);
    CHECK(when >= now + week && when <= now + week + 120);
    CHECK_STATUS(offload_sign(client, "c-ed", msg, 1, sig, &sig_len, NULL),
                 OFFLOAD_FAILED_PRECONDITION);
    CHECK(strstr(offload_last_error(), "scheduled for deletion") != NULL);
    CHECK_STATUS(offload_key_delete(client, "c-ed"), OFFLOAD_FAILED_PRECONDITION);
    CHECK_STATUS(offload_key_enable(client, "c-ed"), OFFLOAD_FAILED_PRECONDITION);
    CHECK_STATUS(offload_key_cancel_deletion(client, "c-ed"), OFFLOAD_OK);
    CHECK_STATUS(offload_sign(client, "c-ed", msg, 1, sig, &sig_len, NULL), OFFLOAD_OK);
    /* A longer wait than the server's, asked for. */
    CHECK_STATUS(offload_key_schedule_deletion(client, "c-ed", 30 * 24 * 3600, NULL), OFFLOAD_OK);
    CHECK_STATUS(offload_key_cancel_deletion(client, "c-ed"), OFFLOAD_OK);
  }
  CHECK_STATUS(offload_key_delete(client, "c-ed"), OFFLOAD_OK);
  CHECK_STATUS(offload_key_delete(client, "c-ed"), OFFLOAD_FAILED_PRECONDITION);
  CHECK_STATUS(offload_key_delete(client, "c-none"), OFFLOAD_NOT_FOUND);
}

/* The memos through the C ABI: their options and refusals, repeats answered with no RPC (the
   client's own counters; offload_client_memo_test and the ctypes test count at the server), a
   tampered envelope and a wrong associated data never remembered, a refusal dropping the key's
   entries, the stats struct's protocol and offload_client_reset. */
static void memo_checks(const char* address) {
  offload_client_options_t o;
  offload_client_t* c = NULL;
  offload_client_stats_t st, before;
  uint8_t x_pk[32], peer_pk[32], k1[32], k2[32], env[128], out[64];
  size_t x_len = 32, peer_len = 32, l1 = 32, l2 = 32, env_len = sizeof(env), out_len;
  const uint8_t text[] = "remembered state";
  const uint8_t ad[] = "user-7";
  int i;

  /* A memo asked for without a maximum age is refused, naming the field. */
  offload_client_options_init(&o);
  o.endpoints = address;
  o.flags = OFFLOAD_CLIENT_DERIVE_MEMO;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "derive_memo_max_age_ms") != NULL);
  o.flags = OFFLOAD_CLIENT_OPEN_MEMO;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "open_memo_max_age_ms") != NULL);
  CHECK(c == NULL);

  o.flags = OFFLOAD_CLIENT_DERIVE_MEMO | OFFLOAD_CLIENT_OPEN_MEMO;
  o.timeout_ms = 30000;
  o.derive_memo_max_age_ms = 600000;
  o.open_memo_max_age_ms = 600000;
  o.open_memo_bytes = 4 << 20;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c == NULL) return;

  /* The stats protocol: a struct_size below 8 is refused; the defaults and bounds show. */
  memset(&st, 0, sizeof(st));
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_INVALID_ARGUMENT);
  st.struct_size = sizeof(st);
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.struct_size == sizeof(st));
  CHECK(st.verify_memo.capacity_bytes == 1u << 20);
  CHECK(st.derive_memo.capacity_bytes == 1u << 20);
  CHECK(st.open_memo.capacity_bytes == 4u << 20);

  CHECK_STATUS(offload_key_create(c, "c-mx", OFFLOAD_KEY_X25519, x_pk, &x_len), OFFLOAD_OK);
  CHECK_STATUS(offload_key_create(c, "c-mpeer", OFFLOAD_KEY_X25519, peer_pk, &peer_len),
               OFFLOAD_OK);
  CHECK_STATUS(offload_key_create(c, "c-maead", OFFLOAD_KEY_CHACHA20_POLY1305, NULL, NULL),
               OFFLOAD_OK);

  /* Derive: the first asks the service, the next nine do not. */
  CHECK_STATUS(offload_derive(c, "c-mx", peer_pk, 32, OFFLOAD_DERIVE_RAW, k1, &l1), OFFLOAD_OK);
  before.struct_size = sizeof(before);
  CHECK_STATUS(offload_client_get_stats(c, &before), OFFLOAD_OK);
  for (i = 0; i < 9; i++) {
    l2 = sizeof(k2);
    CHECK_STATUS(offload_derive(c, "c-mx", peer_pk, 32, OFFLOAD_DERIVE_RAW, k2, &l2), OFFLOAD_OK);
    CHECK(l2 == 32 && memcmp(k1, k2, 32) == 0);
  }
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.rpcs == before.rpcs);
  CHECK(st.derive_memo.hits - before.derive_memo.hits == 9);
  CHECK(st.derive_memo.entries == 1);
  CHECK(st.memo_bytes_not_sent > before.memo_bytes_not_sent);

  /* Seal records the envelope: opening it sends nothing. A wrong associated data and a tampered
     envelope go to the service every time and are never remembered. */
  CHECK_STATUS(offload_aead_seal(c, "c-maead", text, sizeof(text) - 1, ad, sizeof(ad) - 1, env,
                                 &env_len),
               OFFLOAD_OK);
  CHECK_STATUS(offload_client_get_stats(c, &before), OFFLOAD_OK);
  for (i = 0; i < 3; i++) {
    out_len = sizeof(out);
    CHECK_STATUS(offload_aead_open(c, "c-maead", env, env_len, ad, sizeof(ad) - 1, out, &out_len),
                 OFFLOAD_OK);
    CHECK(out_len == sizeof(text) - 1 && memcmp(out, text, out_len) == 0);
  }
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.rpcs == before.rpcs);
  CHECK(st.open_memo.hits - before.open_memo.hits == 3);
  for (i = 0; i < 2; i++) {
    out_len = sizeof(out);
    CHECK_STATUS(offload_aead_open(c, "c-maead", env, env_len, ad, 2, out, &out_len),
                 OFFLOAD_INVALID_ARGUMENT);
  }
  env[env_len - 1] ^= 1;
  for (i = 0; i < 2; i++) {
    out_len = sizeof(out);
    CHECK_STATUS(offload_aead_open(c, "c-maead", env, env_len, ad, sizeof(ad) - 1, out, &out_len),
                 OFFLOAD_INVALID_ARGUMENT);
  }
  env[env_len - 1] ^= 1;
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.rpcs - before.rpcs == 4);
  CHECK(st.open_memo.entries == 1);
  CHECK(st.open_memo.dropped == 0); /* an error about one envelope drops nothing */

  /* Verify: on by default, valid answers only. */
  {
    const uint8_t msg[] = "signed once";
    uint8_t sig[64], pk[32];
    size_t sig_len = sizeof(sig);
    int valid = -1;
    CHECK_STATUS(offload_key_create(c, "c-med", OFFLOAD_KEY_ED25519, NULL, NULL), OFFLOAD_OK);
    CHECK_STATUS(offload_sign(c, "c-med", msg, sizeof(msg) - 1, sig, &sig_len, pk), OFFLOAD_OK);
    CHECK_STATUS(offload_client_get_stats(c, &before), OFFLOAD_OK);
    for (i = 0; i < 3; i++) {
      CHECK_STATUS(offload_verify(c, pk, 32, msg, sizeof(msg) - 1, sig, 64, &valid), OFFLOAD_OK);
      CHECK(valid == 1);
    }
    sig[0] ^= 1;
    for (i = 0; i < 2; i++) {
      CHECK_STATUS(offload_verify(c, pk, 32, msg, sizeof(msg) - 1, sig, 64, &valid), OFFLOAD_OK);
      CHECK(valid == 0);
    }
    CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
    CHECK(st.rpcs - before.rpcs == 3); /* the first valid one, then each invalid one */
    CHECK(st.verify_memo.hits - before.verify_memo.hits == 2);
  }

  /* This client's own disable drops the key's entries: the open goes to the service, refused. */
  CHECK_STATUS(offload_key_disable(c, "c-maead"), OFFLOAD_OK);
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.open_memo.entries == 0 && st.open_memo.dropped == 1);
  out_len = sizeof(out);
  CHECK_STATUS(offload_aead_open(c, "c-maead", env, env_len, ad, sizeof(ad) - 1, out, &out_len),
               OFFLOAD_FAILED_PRECONDITION);
  CHECK_STATUS(offload_key_enable(c, "c-maead"), OFFLOAD_OK);

  /* Reset wipes every memo: the derive asks the service again. */
  CHECK_STATUS(offload_client_reset(c), OFFLOAD_OK);
  CHECK_STATUS(offload_client_get_stats(c, &before), OFFLOAD_OK);
  CHECK(before.derive_memo.entries == 0 && before.verify_memo.entries == 0);
  l2 = sizeof(k2);
  CHECK_STATUS(offload_derive(c, "c-mx", peer_pk, 32, OFFLOAD_DERIVE_RAW, k2, &l2), OFFLOAD_OK);
  CHECK(memcmp(k1, k2, 32) == 0);
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.rpcs - before.rpcs == 1);
  CHECK_STATUS(offload_client_reset(NULL), OFFLOAD_INVALID_ARGUMENT);
  offload_client_destroy(c);

  /* The verify memo off: every verify is an RPC. */
  c = NULL;
  o.flags = OFFLOAD_CLIENT_NO_VERIFY_MEMO;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c == NULL) return;
  st.struct_size = sizeof(st);
  CHECK_STATUS(offload_client_get_stats(c, &st), OFFLOAD_OK);
  CHECK(st.verify_memo.capacity_bytes == 0 && st.derive_memo.capacity_bytes == 0);
  offload_client_destroy(c);
}

/* The whole file at `path`, NUL-terminated (free it), or NULL. */
static char* read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  char* data = NULL;
  size_t n = 0;
  if (f == NULL) return NULL;
  for (;;) {
    char* more = realloc(data, n + 4097);
    size_t got;
    if (more == NULL) {
      free(data);
      fclose(f);
      return NULL;
    }
    data = more;
    got = fread(data + n, 1, 4096, f);
    n += got;
    if (got == 0) break;
  }
  fclose(f);
  data[n] = '\0';
  return data;
}

/* `dir`/`name` into `out`. */
static const char* in_dir(char* out, size_t len, const char* dir, const char* name) {
  snprintf(out, len, "%s/%s", dir, name);
  return out;
}

#define AUTH_ISSUER "https://id.offload-c-test.example" /* offload_c_auth_test.sh's */
#define AUTH_AUDIENCE "crypto-offload"

/* Options for `address` with the checks of the servers' certificate: CA file `ca`, name
   "localhost" (the certificate has no IP address). */
static offload_client_options_t tls_options(const char* address, const char* ca) {
  offload_client_options_t o;
  offload_client_options_init(&o);
  o.endpoints = address;
  o.timeout_ms = 5000;
  o.tls_ca_file = ca;
  o.tls_server_name = "localhost";
  return o;
}

/* Checks of the options themselves: nothing is sent. */
static void option_checks(const char* auth) {
  char ca[4200], cert[4200], key[4200], server_key[4200];
  offload_client_t* c = NULL;
  offload_client_options_t o;
  struct {
    offload_client_options_t known;
    uint64_t newer; /* a field of a later version of the struct */
  } big;
  in_dir(ca, sizeof(ca), auth, "ca.crt");
  in_dir(cert, sizeof(cert), auth, "client.crt");
  in_dir(key, sizeof(key), auth, "client.key");
  in_dir(server_key, sizeof(server_key), auth, "server.key");

  CHECK_STATUS(offload_client_create_with_options(NULL, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "options") != NULL);
  offload_client_options_init(&o);
  CHECK(o.struct_size == sizeof(o) && o.endpoints == NULL && o.flags == 0);
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "endpoints") != NULL);
  o.endpoints = "127.0.0.1:1";
  o.struct_size = 0; /* not set */
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "struct_size") != NULL);
  o.struct_size = sizeof(o);
  o.flags = 0x80;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "flags") != NULL);
  CHECK(c == NULL);

  /* A caller compiled against a newer header: fine while the fields this library does not know
     are zero. */
  memset(&big, 0, sizeof(big));
  big.known.struct_size = sizeof(big);
  big.known.endpoints = "127.0.0.1:1";
  CHECK_STATUS(offload_client_create_with_options(&big.known, &c), OFFLOAD_OK);
  CHECK(c != NULL);
  offload_client_destroy(c);
  c = NULL;
  big.newer = 1;
  CHECK_STATUS(offload_client_create_with_options(&big.known, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "struct_size") != NULL);

  /* TLS inputs are read and checked now, each failure naming its field. */
  o = tls_options("127.0.0.1:1", "/nonexistent/ca.crt");
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_ca_file: cannot read '/nonexistent/ca.crt'") != NULL);
  o = tls_options("127.0.0.1:1", ca);
  o.tls_ca_pem = "-----BEGIN CERTIFICATE-----";
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_ca_file, tls_ca_pem: expected at most one") != NULL);
  o.tls_ca_file = NULL;
  o.tls_ca_pem = "not a certificate";
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_ca_pem: expected PEM certificates") != NULL);
  o = tls_options("127.0.0.1:1", key); /* a key is not a CA certificate */
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_ca_file: expected PEM certificates") != NULL);
  o = tls_options("127.0.0.1:1", ca);
  o.tls_cert_file = cert; /* and no key */
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_key_file, tls_key_pem: expected the private key") !=
        NULL);
  o.tls_cert_file = NULL;
  o.tls_key_file = key; /* and no certificate */
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_cert_file, tls_cert_pem: expected the client") != NULL);
  o.tls_cert_file = cert;
  o.tls_key_file = server_key; /* a key, but not the certificate's */
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "tls_key_file: expected the private key of the certificate") !=
        NULL);
  CHECK(strstr(offload_last_error(), "BEGIN") == NULL); /* no key material in the message */
  o = tls_options("127.0.0.1:1", ca);
  o.bearer_token = "eyJhbGciOiJFZERTQSJ9.secret-part\n";
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "bearer_token") != NULL);
  CHECK(strstr(offload_last_error(), "secret-part") == NULL);
  CHECK(c == NULL);
}

/* The mTLS server: CA file, client certificate and key as PEM text, the name checked. */
static void mtls_checks(const char* binary, const char* auth, const char* dir, const char* kek) {
  char ca[4200], other_ca[4200], cert[4200], key[4200], other_cert[4200], other_key[4200];
  char cert_flag[4300], key_flag[4300], client_ca_flag[4300], policy_flag[4300];
  char address[64], dns_address[64];
  char* extra[5];
  char* cert_pem;
  char* key_pem;
  offload_client_t* c = NULL;
  offload_client_options_t o;
  pid_t pid;

  in_dir(ca, sizeof(ca), auth, "ca.crt");
  in_dir(other_ca, sizeof(other_ca), auth, "other-ca.crt");
  in_dir(cert, sizeof(cert), auth, "client.crt");
  in_dir(key, sizeof(key), auth, "client.key");
  in_dir(other_cert, sizeof(other_cert), auth, "other-client.crt");
  in_dir(other_key, sizeof(other_key), auth, "other-client.key");
  snprintf(cert_flag, sizeof(cert_flag), "--tls_cert_file=%s/server.crt", auth);
  snprintf(key_flag, sizeof(key_flag), "--tls_key_file=%s/server.key", auth);
  snprintf(client_ca_flag, sizeof(client_ca_flag), "--tls_client_ca_file=%s", ca);
  snprintf(policy_flag, sizeof(policy_flag), "--policy_file=%s/policy.json", auth);
  extra[0] = cert_flag;
  extra[1] = key_flag;
  extra[2] = client_ca_flag;
  extra[3] = policy_flag;
  extra[4] = NULL;
  pid = launch(binary, dir, kek, extra, address, sizeof(address));
  CHECK(pid > 0);
  if (pid <= 0) return;
  cert_pem = read_file(cert);
  key_pem = read_file(key);
  CHECK(cert_pem != NULL && key_pem != NULL);

  /* The whole tour as spiffe://offload/c-admin, an admin with every key. */
  o = tls_options(address, ca);
  o.tls_cert_pem = cert_pem;
  o.tls_key_pem = key_pem;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK(wait_ready(c));
    tour(c);
    offload_client_destroy(c);
    c = NULL;
  }

  /* "dns:localhost:PORT" checks the certificate against "localhost" by itself. */
  snprintf(dns_address, sizeof(dns_address), "dns:localhost:%s", strrchr(address, ':') + 1);
  o = tls_options(dns_address, ca);
  o.tls_server_name = NULL;
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK_STATUS(offload_key_create(c, "c-dns", OFFLOAD_KEY_ED25519, NULL, NULL), OFFLOAD_OK);
    offload_client_destroy(c);
    c = NULL;
  }

  /* A CA that did not sign the server's certificate: UNAVAILABLE at once, saying why. */
  o = tls_options(address, other_ca);
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK_STATUS(offload_key_create(c, "c-never", OFFLOAD_KEY_ED25519, NULL, NULL),
                 OFFLOAD_UNAVAILABLE);
    CHECK(strstr(offload_last_error(), "certificate verify failed") != NULL);
    CHECK(strstr(offload_last_error(), address) != NULL);
    offload_client_destroy(c);
    c = NULL;
  }

  /* Dialling 127.0.0.1 without the name to check: the certificate has "localhost" only. */
  o = tls_options(address, ca);
  o.tls_server_name = NULL;
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK_STATUS(offload_key_create(c, "c-never", OFFLOAD_KEY_ED25519, NULL, NULL),
                 OFFLOAD_UNAVAILABLE);
    CHECK(strstr(offload_last_error(), "Peer name 127.0.0.1 is not in peer certificate") != NULL);
    offload_client_destroy(c);
    c = NULL;
  }

  /* No client certificate: the server wants one. */
  o = tls_options(address, ca);
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK_STATUS(offload_key_create(c, "c-never", OFFLOAD_KEY_ED25519, NULL, NULL),
                 OFFLOAD_UNAUTHENTICATED);
    offload_client_destroy(c);
    c = NULL;
  }

  /* A client certificate of another CA: the server ends the connection after the handshake, and
     the call never gets through (waited out like a lost connection, hence the short deadline). */
  o = tls_options(address, ca);
  o.timeout_ms = 1500;
  o.tls_cert_file = other_cert;
  o.tls_key_file = other_key;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    offload_status_t s = offload_key_create(c, "c-never", OFFLOAD_KEY_ED25519, NULL, NULL);
    CHECK(s == OFFLOAD_DEADLINE_EXCEEDED || s == OFFLOAD_UNAVAILABLE);
    offload_client_destroy(c);
    c = NULL;
  }

  /* None of the refused calls made a key. */
  o = tls_options(address, ca);
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
  if (c != NULL) {
    CHECK_STATUS(offload_key_delete(c, "c-never"), OFFLOAD_NOT_FOUND);
    offload_client_destroy(c);
  }
  free(cert_pem);
  free(key_pem);
  stop_server(pid);
}

/* Whether the last error is free of the token in file `name` of `auth`. */
static int error_hides(const char* auth, const char* name) {
  char path[4200];
  char* token = read_file(in_dir(path, sizeof(path), auth, name));
  int hidden = token != NULL && strstr(offload_last_error(), token) == NULL;
  free(token);
  return hidden;
}

/* The token server (TLS, tokens required, the policy's admins): no token, a token, refreshed. */
static void token_checks(const char* binary, const char* auth, const char* dir, const char* kek) {
  char ca[4200], path[4200];
  char cert_flag[4300], key_flag[4300], jwks_flag[4300], policy_flag[4300];
  char issuer_flag[128], audience_flag[128], require_flag[] = "--require_identity";
  char address[64];
  char* extra[8];
  char* admin;
  char* admin2;
  char* app;
  char* expired;
  offload_client_t* c = NULL;
  offload_client_options_t o;
  pid_t pid;

  in_dir(ca, sizeof(ca), auth, "ca.crt");
  snprintf(cert_flag, sizeof(cert_flag), "--tls_cert_file=%s/server.crt", auth);
  snprintf(key_flag, sizeof(key_flag), "--tls_key_file=%s/server.key", auth);
  snprintf(jwks_flag, sizeof(jwks_flag), "--jwks_file=%s/jwks.json", auth);
  snprintf(policy_flag, sizeof(policy_flag), "--policy_file=%s/policy.json", auth);
  snprintf(issuer_flag, sizeof(issuer_flag), "--token_issuer=%s", AUTH_ISSUER);
  snprintf(audience_flag, sizeof(audience_flag), "--token_audience=%s", AUTH_AUDIENCE);
  extra[0] = cert_flag;
  extra[1] = key_flag;
  extra[2] = jwks_flag;
  extra[3] = issuer_flag;
  extra[4] = audience_flag;
  extra[5] = require_flag;
  extra[6] = policy_flag;
  extra[7] = NULL;
  admin = read_file(in_dir(path, sizeof(path), auth, "token-admin"));
  admin2 = read_file(in_dir(path, sizeof(path), auth, "token-admin2"));
  app = read_file(in_dir(path, sizeof(path), auth, "token-app"));
  expired = read_file(in_dir(path, sizeof(path), auth, "token-expired"));
  CHECK(admin != NULL && admin2 != NULL && app != NULL && expired != NULL);
  if (admin == NULL || admin2 == NULL || app == NULL || expired == NULL) return;
  CHECK(strcmp(admin, admin2) != 0);
  pid = launch(binary, dir, kek, extra, address, sizeof(address));
  CHECK(pid > 0);
  if (pid > 0) {
    /* No token yet: refused. */
    o = tls_options(address, ca);
    CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
    if (c != NULL) {
      CHECK_STATUS(offload_key_create(c, "c-ed", OFFLOAD_KEY_ED25519, NULL, NULL),
                   OFFLOAD_UNAUTHENTICATED);
      /* The admin's token: the whole tour. */
      CHECK_STATUS(offload_client_set_token(c, admin), OFFLOAD_OK);
      CHECK(wait_ready(c));
      tour(c);
      /* An expired one: refused, and the message does not show it. */
      CHECK_STATUS(offload_client_set_token(c, expired), OFFLOAD_OK);
      CHECK_STATUS(offload_key_create(c, "c-ed2", OFFLOAD_KEY_ED25519, NULL, NULL),
                   OFFLOAD_UNAUTHENTICATED);
      CHECK(error_hides(auth, "token-expired"));
      /* Refreshed: works again. */
      CHECK_STATUS(offload_client_set_token(c, admin2), OFFLOAD_OK);
      CHECK_STATUS(offload_key_create(c, "c-ed2", OFFLOAD_KEY_ED25519, NULL, NULL), OFFLOAD_OK);
      /* A valid token of an identity with no grant: not an admin, no keys. */
      CHECK_STATUS(offload_client_set_token(c, app), OFFLOAD_OK);
      CHECK_STATUS(offload_key_create(c, "c-ed3", OFFLOAD_KEY_ED25519, NULL, NULL),
                   OFFLOAD_PERMISSION_DENIED);
      {
        uint8_t sig[64];
        size_t sig_len = sizeof(sig);
        CHECK_STATUS(offload_sign(c, "c-ed2", (const uint8_t*)"m", 1, sig, &sig_len, NULL),
                     OFFLOAD_PERMISSION_DENIED);
      }
      CHECK(error_hides(auth, "token-app"));
      /* A token that cannot be sent: refused here, the previous one stays. */
      CHECK_STATUS(offload_client_set_token(c, "two words"), OFFLOAD_INVALID_ARGUMENT);
      CHECK(strstr(offload_last_error(), "token") != NULL);
      CHECK(strstr(offload_last_error(), "two words") == NULL);
      CHECK_STATUS(offload_key_create(c, "c-ed3", OFFLOAD_KEY_ED25519, NULL, NULL),
                   OFFLOAD_PERMISSION_DENIED);
      /* No token again. */
      CHECK_STATUS(offload_client_set_token(c, NULL), OFFLOAD_OK);
      CHECK_STATUS(offload_key_create(c, "c-ed3", OFFLOAD_KEY_ED25519, NULL, NULL),
                   OFFLOAD_UNAUTHENTICATED);
      offload_client_destroy(c);
      c = NULL;
    }
    CHECK_STATUS(offload_client_set_token(NULL, admin), OFFLOAD_INVALID_ARGUMENT);

    /* The token given at creation. */
    o = tls_options(address, ca);
    o.bearer_token = admin2;
    CHECK_STATUS(offload_client_create_with_options(&o, &c), OFFLOAD_OK);
    if (c != NULL) {
      CHECK_STATUS(offload_key_delete(c, "c-ed2"), OFFLOAD_OK);
      CHECK_STATUS(offload_key_delete(c, "c-ed3"), OFFLOAD_NOT_FOUND);
      offload_client_destroy(c);
    }
    stop_server(pid);
  }
  free(admin);
  free(admin2);
  free(app);
  free(expired);
}

int main(int argc, char** argv) {
  char dir[] = "/tmp/offload-c-test-XXXXXX";
  char address[64];
  offload_client_t* client = NULL;
  pid_t pid;
  char kek[65];
  const char* auth = NULL;
  int i;

  if (argc == 4 && strcmp(argv[2], "--auth") == 0) auth = argv[3];
  if (argc != 2 && auth == NULL) {
    fprintf(stderr, "usage: %s /path/to/offload_server [--auth CREDENTIALS_DIR]\n", argv[0]);
    return 2;
  }
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 2;
  }
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  for (i = 0; i < 64; i++) kek[i] = "0123456789abcdef"[rand() % 16];
  kek[64] = '\0';

  /* Arguments are checked before anything is sent. */
  CHECK_STATUS(offload_client_create(NULL, 0, &client), OFFLOAD_INVALID_ARGUMENT);
  CHECK_STATUS(offload_client_create("no-port", 0, &client), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "host:port") != NULL);
  CHECK(client == NULL);
  CHECK(strcmp(offload_status_name(OFFLOAD_BUFFER_TOO_SMALL), "BUFFER_TOO_SMALL") == 0);

  if (auth == NULL) {
    /* Plain text, offload_client_create. */
    pid = launch(argv[1], dir, kek, NULL, address, sizeof(address));
    if (pid < 0) return 1;
    CHECK_STATUS(offload_client_create(address, 2000, &client), OFFLOAD_OK);
    if (client == NULL) return 1;
    CHECK_STATUS(offload_verify(client, NULL, 0, NULL, 0, NULL, 0, NULL),
                 OFFLOAD_INVALID_ARGUMENT);
    CHECK_STATUS(offload_verify(NULL, NULL, 0, NULL, 0, NULL, 0, NULL), OFFLOAD_INVALID_ARGUMENT);
    CHECK(wait_ready(client));
    tour(client);
    offload_client_destroy(client);
    memo_checks(address);
    stop_server(pid);
  } else {
    /* TLS, mTLS and tokens, with offload_client_create_with_options (offload_c_auth_test.sh). */
    char mtls_dir[64], token_dir[64];
    snprintf(mtls_dir, sizeof(mtls_dir), "%s/mtls", dir);
    snprintf(token_dir, sizeof(token_dir), "%s/token", dir);
    if (mkdir(mtls_dir, 0700) != 0 || mkdir(token_dir, 0700) != 0) {
      perror("mkdir");
      return 2;
    }
    option_checks(auth);
    mtls_checks(argv[1], auth, mtls_dir, kek);
    token_checks(argv[1], auth, token_dir, kek);
  }
  {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  if (failures != 0) {
    fprintf(stderr, "offload_c_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("offload_c_test: all checks passed\n");
  return 0;
}
