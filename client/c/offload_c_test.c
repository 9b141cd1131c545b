/* offload_c_test: the C ABI from plain C99 against a live offload_server.
 *
 *   offload_c_test /path/to/offload_server
 *
 * Starts the server on free loopback ports with a temporary data folder and a random
 * OFFLOAD_KEK, runs every entry point of offload.h (including the buffer-too-small protocol and
 * error codes), and stops the server. Exit code 0 when every check passed. */
#define _POSIX_C_SOURCE 200809L

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

/* Starts offload_server on fresh free ports with its data in `dir`/data, its stderr in `log`,
   the key-encryption key `kek` (the same on every attempt: the key file is sealed with it). */
static pid_t start_server(const char* binary, const char* dir, const char* kek, const char* log,
                          char* address, size_t address_len) {
  char grpc_flag[128], metrics_flag[64], http_flag[64], data_flag[4200];
  pid_t pid;
  snprintf(address, address_len, "127.0.0.1:%d", free_port());
  snprintf(grpc_flag, sizeof(grpc_flag), "--grpc_address=%s", address);
  snprintf(metrics_flag, sizeof(metrics_flag), "--metrics_address=127.0.0.1:%d", free_port());
  snprintf(http_flag, sizeof(http_flag), "--http_address=127.0.0.1:%d", free_port());
  snprintf(data_flag, sizeof(data_flag), "--data_dir=%s", dir);
  pid = fork();
  if (pid == 0) {
    char* argv[6];
    argv[0] = (char*)binary;
    argv[1] = grpc_flag;
    argv[2] = data_flag;
    argv[3] = metrics_flag;
    argv[4] = NULL;
    /* --http_address only when this server build has the gateway (the flag is unknown otherwise). */
    {
      char cmd[4400];
      snprintf(cmd, sizeof(cmd), "%s --helpfull 2>&1 | grep -q -- '--http_address'", binary);
      if (system(cmd) == 0) {
        argv[4] = http_flag;
        argv[5] = NULL;
      }
    }
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

int main(int argc, char** argv) {
  char dir[] = "/tmp/offload-c-test-XXXXXX";
  char address[64];
  offload_client_t* client = NULL;
  pid_t pid;
  char log[64], kek[65];
  int ready = 0, attempt, i;

  if (argc != 2) {
    fprintf(stderr, "usage: %s /path/to/offload_server\n", argv[0]);
    return 2;
  }
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 2;
  }

  /* Arguments are checked before anything is sent. */
  CHECK_STATUS(offload_client_create(NULL, 0, &client), OFFLOAD_INVALID_ARGUMENT);
  CHECK_STATUS(offload_client_create("no-port", 0, &client), OFFLOAD_INVALID_ARGUMENT);
  CHECK(strstr(offload_last_error(), "host:port") != NULL);
  CHECK(client == NULL);
  CHECK(strcmp(offload_status_name(OFFLOAD_BUFFER_TOO_SMALL), "BUFFER_TOO_SMALL") == 0);

  /* The ports are free when picked, not reserved: a test running beside this one may take one
     first, and the server then exits with "cannot listen on". Then: fresh ports, 3 starts in all. */
  snprintf(log, sizeof(log), "%s/server.log", dir);
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  for (i = 0; i < 64; i++) kek[i] = "0123456789abcdef"[rand() % 16];
  kek[64] = '\0';
  for (attempt = 1;; attempt++) {
    int started;
    pid = start_server(argv[1], dir, kek, log, address, sizeof(address));
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    started = wait_started(pid, log);
    if (started == 0) break;
    if (started == 1 && attempt < 3 && file_contains(log, "cannot listen on")) {
      fprintf(stderr, "a port was taken (attempt %d); starting again on fresh ports\n", attempt);
      continue;
    }
    fprintf(stderr, "offload_server %s:\n", started == 1 ? "exited before it started" :
                                                        "did not start within 60 s");
    {
      char cmd[128];
      snprintf(cmd, sizeof(cmd), "cat '%s' >&2", log);
      if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
    }
    if (started == 2) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
    }
    return 1;
  }
  CHECK_STATUS(offload_client_create(address, 2000, &client), OFFLOAD_OK);
  if (client == NULL) return 1;
  CHECK_STATUS(offload_verify(client, NULL, 0, NULL, 0, NULL, 0, NULL), OFFLOAD_INVALID_ARGUMENT);
  CHECK_STATUS(offload_verify(NULL, NULL, 0, NULL, 0, NULL, 0, NULL), OFFLOAD_INVALID_ARGUMENT);

  /* It has started; its first answer (a key creation that works), 60 s at most by the clock. */
  {
    const time_t give_up = time(NULL) + 60;
    while (!ready && time(NULL) < give_up) {
      offload_status_t s = offload_key_create(client, "c-ed", OFFLOAD_KEY_ED25519, NULL, NULL);
      if (s == OFFLOAD_OK || s == OFFLOAD_ALREADY_EXISTS) {
        /* ALREADY_EXISTS: an earlier try that timed out on a slow server did create it. */
        ready = 1;
      } else if (s == OFFLOAD_UNAVAILABLE || s == OFFLOAD_DEADLINE_EXCEEDED) {
        sleep_ms(100);
      } else {
        fprintf(stderr, "key create: %s: %s\n", offload_status_name(s), offload_last_error());
        break;
      }
    }
  }
  CHECK(ready);
  if (ready) {
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

    /* --- Delete. */
    CHECK_STATUS(offload_key_delete(client, "c-ed"), OFFLOAD_OK);
    CHECK_STATUS(offload_key_delete(client, "c-ed"), OFFLOAD_NOT_FOUND);
  }

  offload_client_destroy(client);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
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
