/* embedded_memo_test.c - the embedded client's derive memo and box on the device against a live
 * offload_server (POSIX transport), counted at the server (its Prometheus /metrics:
 * offload_requests_total of X25519Service/Derive, BoxService/Seal and BoxService/Open) and by the
 * client (client.stats).
 *
 *   embedded_memo_test HTTP_PORT METRICS_PORT GRPC_PORT OFFLOADCTL KEY_PREFIX
 *
 * run_memo_live_test.sh starts the server; this program makes its keys (KEY_PREFIX-*) and changes
 * them with OFFLOADCTL (plaintext gRPC on GRPC_PORT) between client calls. The device's clock is
 * this program's own variable, advanced by the test: expiry is exact, no sleep races it.
 *   1. probe rounds: 15 peers, 10 rounds, a derive per peer and direction: 15 server derives;
 *   2. the same with box seal (out) and open (in) on the device, checked by each peer with
 *      libsodium: 15 server derives, no server Seal or Open;
 *   3. the device's boxes and the server's interoperate both ways;
 *   4. a rotated key: "current" keeps the old version until a reset or the maximum age;
 *   5. a disabled key: remembered results used until the first refusal about the key (which drops
 *      all its entries) or the maximum age; a key pending deletion and a retired version the same;
 *      an error about one message drops nothing;
 *   6. an expired entry is not used, and its key is wiped.
 * Built twice: embedded_memo_test and embedded_memo_noheap_test (heap_guard.c), where every
 * client call runs with malloc and friends set to abort().
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "live_suite.h"
#include "offload_client.h"
#include "transport_posix.h"

#define PEERS 15
#define ROUNDS 10

static offload_client_t device; /* the memo in use, on the test's clock */
static offload_client_t plain;  /* no clock: every call goes to the server */
static uint8_t wire[OFFLOAD_CLIENT_BUF_SIZE];
static uint8_t plain_wire[OFFLOAD_CLIENT_BUF_SIZE];
static offload_posix_transport_t http;

static uint64_t now_ms = 1000000; /* the device's monotonic clock, in the test's hands */
static uint64_t device_clock(void* ctx) { return *(const uint64_t*)ctx; }

static const char* ctl_path;
static char grpc_flag[64];
static int metrics_port;
static const char* prefix;

static uint8_t peer_pk[PEERS][32], peer_sk[PEERS][32];
static offload_status_t s;

/* A client call with the heap forbidden. */
#define CALL(expr)      \
  do {                  \
    heap_guard_arm();   \
    s = (expr);         \
    heap_guard_disarm(); \
  } while (0)

/* `prefix`-`what`, in one of a few static buffers. */
static const char* key_name(const char* what) {
  static char names[8][80];
  static int next;
  char* n = names[next++ % 8];
  snprintf(n, sizeof names[0], "%s-%s", prefix, what);
  return n;
}

/* Runs OFFLOADCTL --server=... --timeout=30s ARGS... (NULL-terminated), its standard output
 * into `out` (capacity `cap`, may be 0). Returns its exit status, or -1. */
static int ctl(char* out, size_t cap, ...) {
  const char* argv[16];
  int argc = 0, fds[2], wstatus = 0;
  size_t got = 0;
  pid_t pid;
  va_list ap;
  argv[argc++] = ctl_path;
  argv[argc++] = grpc_flag;
  argv[argc++] = "--timeout=30s";
  va_start(ap, cap);
  while (argc < 15 && (argv[argc] = va_arg(ap, const char*)) != NULL) ++argc;
  va_end(ap);
  argv[argc] = NULL;
  if (pipe(fds) != 0) return -1;
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(ctl_path, (char* const*)argv);
    _exit(127);
  }
  close(fds[1]);
  for (;;) {
    char sink[256];
    ssize_t n = got + 1 < cap ? read(fds[0], out + got, cap - 1 - got)
                              : read(fds[0], sink, sizeof sink);
    if (n <= 0) break;
    if (got + 1 < cap) got += (size_t)n;
  }
  if (cap > 0) out[got] = '\0';
  close(fds[0]);
  if (pid < 0 || waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

/* The public key of version `version` of X25519 key `key_id`, from `offloadctl keys get`. */
static void public_key(const char* key_id, int version, uint8_t pk[32]) {
  static char text[8192];
  char want[32];
  const char* line;
  memset(pk, 0, 32);
  CHECK(ctl(text, sizeof text, "keys", "get", key_id, (const char*)NULL) == 0, "keys get %s",
        key_id);
  snprintf(want, sizeof want, "version: %d ", version);
  for (line = text; line != NULL && *line != '\0';
       line = strchr(line, '\n') != NULL ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, want, strlen(want)) == 0) {
      const char* hex = strstr(line, "public_key: ");
      char h[65];
      if (hex != NULL && sscanf(hex + 12, "%64[0-9a-f]", h) == 1 && live_from_hex(h, pk, 32)) {
        return;
      }
    }
  }
  CHECK(0, "no public key for %s version %d in:\n%s", key_id, version, text);
}

/* --- the server's own count: offload_requests_total on /metrics ------------------------------ */
static char metrics_text[1 << 22];

/* Reads the server's /metrics into metrics_text; 1 on success. */
static int scrape(void) {
  static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  struct sockaddr_in sa;
  size_t got = 0;
  ssize_t n;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)metrics_port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0 ||
      write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
    if (fd >= 0) close(fd);
    return 0;
  }
  while (got + 1 < sizeof metrics_text &&
         (n = read(fd, metrics_text + got, sizeof metrics_text - 1 - got)) > 0) {
    got += (size_t)n;
  }
  close(fd);
  metrics_text[got] = '\0';
  return strncmp(metrics_text, "HTTP/1.", 7) == 0 && strstr(metrics_text, " 200 ") != NULL;
}

/* offload_requests_total of `service`/`method`, every code summed, from the last scrape. */
static long counted(const char* service, const char* method) {
  char m[64], sv[96];
  const char* line = metrics_text;
  long total = 0;
  snprintf(m, sizeof m, "method=\"%s\"", method);
  snprintf(sv, sizeof sv, "service=\"offload.v1.%s\"", service);
  while (line != NULL && *line != '\0') {
    const char* end = strchr(line, '\n');
    size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
    char buf[512];
    if (len < sizeof buf && strncmp(line, "offload_requests_total{", 23) == 0) {
      const char* close_brace;
      memcpy(buf, line, len);
      buf[len] = '\0';
      close_brace = strchr(buf, '}');
      if (close_brace != NULL && strstr(buf, m) != NULL && strstr(buf, sv) != NULL &&
          strstr(buf, m) < close_brace && strstr(buf, sv) < close_brace) {
        total += (long)atof(close_brace + 1);
      }
    }
    line = end != NULL ? end + 1 : NULL;
  }
  return total;
}

typedef struct server_counts {
  long derive, seal, open;
} server_counts_t;

static server_counts_t server_counts(void) {
  server_counts_t c = {-1, -1, -1};
  CHECK(scrape(), "GET /metrics on port %d", metrics_port);
  c.derive = counted("X25519Service", "Derive");
  c.seal = counted("BoxService", "Seal");
  c.open = counted("BoxService", "Open");
  return c;
}

/* --- 1 and 2: probe rounds ------------------------------------------------------------------- */
static void probe_derive(const char* key_id, const uint8_t server_pk[32]) {
  server_counts_t before = server_counts(), after;
  offload_client_stats_t st = device.stats;
  int round, p, dir;
  for (round = 0; round < ROUNDS; ++round) {
    for (p = 0; p < PEERS; ++p) {
      for (dir = 0; dir < 2; ++dir) {
        uint8_t k[32], want[32];
        bool hit = false;
        CALL(offload_derive(&device, key_id, peer_pk[p], true, k, &hit));
        CHECK_STATUS(&device, s, OFFLOAD_OK);
        CHECK(crypto_box_beforenm(want, server_pk, peer_sk[p]) == 0 && memcmp(k, want, 32) == 0,
              "round %d peer %d: the box key", round, p);
        CHECK(hit == (round > 0 || dir > 0), "round %d peer %d dir %d: memo_hit %d", round, p, dir,
              hit);
      }
    }
    now_ms += 1000; /* a probe round a second */
  }
  after = server_counts();
  printf("  probe (derive): %d derives; server: Derive +%ld, Seal +%ld, Open +%ld; client: "
         "%u requests, %u hits, %u misses\n",
         ROUNDS * PEERS * 2, after.derive - before.derive, after.seal - before.seal,
         after.open - before.open, device.stats.requests - st.requests,
         device.stats.hits - st.hits, device.stats.misses - st.misses);
  CHECK(after.derive - before.derive == PEERS && after.seal == before.seal &&
            after.open == before.open,
        "the server counted %ld derives, want %d", after.derive - before.derive, PEERS);
  CHECK(device.stats.requests - st.requests == PEERS && device.stats.misses - st.misses == PEERS &&
            device.stats.hits - st.hits == ROUNDS * PEERS * 2 - PEERS,
        "client counters");
}

static void probe_box(const char* key_id, const uint8_t server_pk[32]) {
  server_counts_t before = server_counts(), after;
  offload_client_stats_t st = device.stats;
  int round, p;
  for (round = 0; round < ROUNDS; ++round) {
    for (p = 0; p < PEERS; ++p) {
      uint8_t msg[48], ct[48 + 16], out[64], nonce[24];
      size_t msg_len, ct_len = 0, out_len = 0;
      bool hit = false;
      msg_len = (size_t)snprintf((char*)msg, sizeof msg, "PING round %d to peer %d", round, p);
      /* Out: the device seals a PING; the peer opens it with its own secret. */
      CALL(offload_box_seal(&device, key_id, peer_pk[p], NULL, msg, msg_len, ct, sizeof ct,
                            &ct_len, nonce));
      CHECK_STATUS(&device, s, OFFLOAD_OK);
      CHECK(ct_len == msg_len + 16 &&
                crypto_box_open_easy(out, ct, ct_len, nonce, server_pk, peer_sk[p]) == 0 &&
                memcmp(out, msg, msg_len) == 0,
            "round %d peer %d: the peer opens the device's PING", round, p);
      /* In: the peer seals a PONG; the device opens it. */
      msg_len = (size_t)snprintf((char*)msg, sizeof msg, "PONG round %d from peer %d", round, p);
      randombytes_buf(nonce, sizeof nonce);
      CHECK(crypto_box_easy(ct, msg, msg_len, nonce, server_pk, peer_sk[p]) == 0, "peer seals");
      CALL(offload_box_open(&device, key_id, 0, peer_pk[p], nonce, ct, msg_len + 16, out,
                            sizeof out, &out_len, &hit));
      CHECK_STATUS(&device, s, OFFLOAD_OK);
      CHECK(out_len == msg_len && memcmp(out, msg, msg_len) == 0 && hit,
            "round %d peer %d: the device opens the PONG (memo_hit %d)", round, p, hit);
    }
    now_ms += 1000;
  }
  after = server_counts();
  printf("  probe (box on the device): %d seals + %d opens; server: Derive +%ld, Seal +%ld, "
         "Open +%ld; client: %u requests, %u hits, %u misses\n",
         ROUNDS * PEERS, ROUNDS * PEERS, after.derive - before.derive, after.seal - before.seal,
         after.open - before.open, device.stats.requests - st.requests,
         device.stats.hits - st.hits, device.stats.misses - st.misses);
  CHECK(after.derive - before.derive == PEERS && after.seal == before.seal &&
            after.open == before.open,
        "the server counted %ld derives, %ld seals, %ld opens; want %d, 0, 0",
        after.derive - before.derive, after.seal - before.seal, after.open - before.open, PEERS);
  CHECK(device.stats.requests - st.requests == PEERS && device.stats.misses - st.misses == PEERS &&
            device.stats.hits - st.hits == ROUNDS * PEERS * 2 - PEERS,
        "client counters");
}

/* --- 3: the device's boxes and the server's are the same boxes ----------------------------- */
static void interop(const char* key_id, const uint8_t server_pk[32]) {
  static const uint8_t msg[] = "the device's box, opened by the server";
  uint8_t ct[sizeof msg + 16], out[sizeof msg + 16], nonce[24];
  size_t ct_len = 0, out_len = 0;
  server_counts_t before = server_counts(), after;
  uint32_t requests = device.stats.requests;
  CALL(offload_box_seal(&device, key_id, peer_pk[0], NULL, msg, sizeof msg, ct, sizeof ct, &ct_len,
                        nonce));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  CALL(offload_box_open(&plain, key_id, 0, peer_pk[0], nonce, ct, ct_len, out, sizeof out,
                        &out_len, NULL));
  CHECK_STATUS(&plain, s, OFFLOAD_OK);
  CHECK(out_len == sizeof msg && memcmp(out, msg, sizeof msg) == 0,
        "the server's Open reads the device's seal");
  CALL(offload_box_seal(&plain, key_id, peer_pk[0], NULL, msg, 20, ct, sizeof ct, &ct_len, nonce));
  CHECK_STATUS(&plain, s, OFFLOAD_OK);
  CALL(offload_box_open(&device, key_id, 0, peer_pk[0], nonce, ct, ct_len, out, sizeof out,
                        &out_len, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  CHECK(out_len == 20 && memcmp(out, msg, 20) == 0, "the device opens the server's seal");
  CHECK(crypto_box_open_easy(out, ct, ct_len, nonce, server_pk, peer_sk[0]) == 0,
        "and so does the peer");
  after = server_counts();
  CHECK(after.seal - before.seal == 1 && after.open - before.open == 1 &&
            after.derive == before.derive && device.stats.requests == requests,
        "one server Seal, one server Open, no device request: seal +%ld open +%ld derive +%ld",
        after.seal - before.seal, after.open - before.open, after.derive - before.derive);
}

/* --- 4: rotation ------------------------------------------------------------------------------- */
/* A derive of (key_id, version, box, peer 0): its key and version; `*requests` gets the count of
 * round trips it made. */
static void derive_v(const char* key_id, uint32_t version, uint8_t k[32], uint32_t* used,
                     uint32_t* requests) {
  uint32_t before = device.stats.requests;
  CALL(offload_derive_version(&device, key_id, version, peer_pk[0], true, k, used, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  *requests = device.stats.requests - before;
}

static void rotation(void) {
  const char* key_id = key_name("rotated");
  uint8_t pk1[32], pk2[32], pk3[32], k[32], want[32], ct[16 + 5], out[8], nonce[24];
  uint32_t used = 0, requests = 0;
  size_t out_len = 0;
  CHECK(ctl(NULL, 0, "keys", "create", "--type=x25519", key_id, (const char*)NULL) == 0,
        "create %s", key_id);
  public_key(key_id, 1, pk1);
  derive_v(key_id, 0, k, &used, &requests);
  CHECK(crypto_box_beforenm(want, pk1, peer_sk[0]) == 0 && memcmp(k, want, 32) == 0 &&
            used == 1 && requests == 1,
        "version 1: used %u, %u requests", used, requests);
  CHECK(ctl(NULL, 0, "keys", "rotate", key_id, (const char*)NULL) == 0, "rotate");
  public_key(key_id, 2, pk2);
  /* Asked as current: the old version's key until a reset or the maximum age (the README). */
  derive_v(key_id, 0, k, &used, &requests);
  CHECK(memcmp(k, want, 32) == 0 && used == 1 && requests == 0,
        "after the rotation, 'current' is still version 1 from the memo: used %u, %u requests",
        used, requests);
  /* A box the peer sealed to the new public key does not open with it, at no round trip... */
  randombytes_buf(nonce, sizeof nonce);
  CHECK(crypto_box_easy(ct, (const uint8_t*)"hello", 5, nonce, pk2, peer_sk[0]) == 0, "seal");
  requests = device.stats.requests;
  CALL(offload_box_open(&device, key_id, 0, peer_pk[0], nonce, ct, sizeof ct, out, sizeof out,
                        &out_len, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(device.stats.requests == requests &&
            strcmp(device.last_error_message, "authentication failed") == 0,
        "a box to version 2 fails on the remembered version 1: '%s'", device.last_error_message);
  /* ... and opens when version 2 is asked by number: an entry of its own. */
  CALL(offload_box_open(&device, key_id, 2, peer_pk[0], nonce, ct, sizeof ct, out, sizeof out,
                        &out_len, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  CHECK(out_len == 5 && memcmp(out, "hello", 5) == 0 && device.stats.requests == requests + 1,
        "version 2 by number: one derive");
  derive_v(key_id, 2, k, &used, &requests);
  CHECK(crypto_box_beforenm(want, pk2, peer_sk[0]) == 0 && memcmp(k, want, 32) == 0 &&
            used == 2 && requests == 0,
        "version 2 remembered by number");
  /* A reset: "current" is version 2 at once. */
  offload_client_reset(&device);
  derive_v(key_id, 0, k, &used, &requests);
  CHECK(memcmp(k, want, 32) == 0 && used == 2 && requests == 1, "after a reset: version 2");
  CALL(offload_box_open(&device, key_id, 0, peer_pk[0], nonce, ct, sizeof ct, out, sizeof out,
                        &out_len, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  /* Rotated again: version 2 until the maximum age, then version 3. */
  CHECK(ctl(NULL, 0, "keys", "rotate", key_id, (const char*)NULL) == 0, "rotate");
  public_key(key_id, 3, pk3);
  now_ms += OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS - 1;
  derive_v(key_id, 0, k, &used, &requests);
  CHECK(used == 2 && requests == 0, "1 ms before the maximum age: still version 2 (%u)", used);
  now_ms += 1;
  {
    uint32_t expired = device.stats.expired;
    derive_v(key_id, 0, k, &used, &requests);
    CHECK(crypto_box_beforenm(want, pk3, peer_sk[0]) == 0 && memcmp(k, want, 32) == 0 &&
              used == 3 && requests == 1 && device.stats.expired > expired,
          "at the maximum age: version 3 from the server (used %u, %u requests, expired +%u)",
          used, requests, device.stats.expired - expired);
  }
}

/* --- 5: keys the server refuses ---------------------------------------------------------------- */
/* A derive of (key_id, 0, box, peer `p`): its status; `*requests` the round trips it made. */
static offload_status_t derive_p(const char* key_id, int p, uint32_t* requests) {
  uint8_t k[32];
  uint32_t before = device.stats.requests;
  CALL(offload_derive(&device, key_id, peer_pk[p], true, k, NULL));
  *requests = device.stats.requests - before;
  return s;
}

static void refused_keys(void) {
  const char* disabled = key_name("disabled");
  const char* aged = key_name("disabled-aged");
  const char* deleted = key_name("deleted");
  const char* retired = key_name("retired");
  const char* other = key_name("other");
  uint32_t r = 0, dropped;
  uint8_t k[32], zero[32];
  const char* keys[5];
  int i;
  keys[0] = disabled;
  keys[1] = aged;
  keys[2] = deleted;
  keys[3] = retired;
  keys[4] = other;
  for (i = 0; i < 5; ++i) {
    CHECK(ctl(NULL, 0, "keys", "create", "--type=x25519", keys[i], (const char*)NULL) == 0,
          "create %s", keys[i]);
  }
  offload_client_reset(&device);

  /* Disabled: used from the memo until the first refusal about the key, which drops all its
   * entries (and only its). */
  CHECK(derive_p(disabled, 0, &r) == OFFLOAD_OK && r == 1, "disabled key, peer 0");
  CHECK(derive_p(disabled, 1, &r) == OFFLOAD_OK && r == 1, "disabled key, peer 1");
  CHECK(derive_p(other, 0, &r) == OFFLOAD_OK && r == 1, "another key");
  CHECK(ctl(NULL, 0, "keys", "disable", disabled, (const char*)NULL) == 0, "disable");
  CHECK(derive_p(disabled, 0, &r) == OFFLOAD_OK && r == 0,
        "within the maximum age, a disabled key's remembered result is still used");
  dropped = device.stats.dropped;
  s = derive_p(disabled, 2, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  CHECK(r == 1 && device.stats.dropped - dropped == 2,
        "the refusal drops both entries of the key: dropped +%u", device.stats.dropped - dropped);
  s = derive_p(disabled, 0, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  CHECK(r == 1, "then peer 0 asks the server, which refuses");
  {
    uint8_t ct[32], nonce[24] = {0};
    size_t ct_len = 0;
    CALL(offload_box_seal(&device, disabled, peer_pk[0], nonce, (const uint8_t*)"x", 1, ct,
                          sizeof ct, &ct_len, NULL));
    CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  }
  CHECK(derive_p(other, 0, &r) == OFFLOAD_OK && r == 0, "the other key's entry stayed");

  /* Disabled, then the maximum age passes: the entry expires, the server refuses. */
  CHECK(derive_p(aged, 0, &r) == OFFLOAD_OK && r == 1, "aged key");
  CHECK(ctl(NULL, 0, "keys", "disable", aged, (const char*)NULL) == 0, "disable");
  CHECK(derive_p(aged, 0, &r) == OFFLOAD_OK && r == 0, "still remembered");
  now_ms += OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS;
  s = derive_p(aged, 0, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  CHECK(r == 1, "past the maximum age a disabled key's result is not used");

  /* Pending deletion: refused (FAILED_PRECONDITION) like a disabled key. */
  CHECK(derive_p(deleted, 0, &r) == OFFLOAD_OK && r == 1, "deleted key");
  CHECK(ctl(NULL, 0, "keys", "delete", deleted, (const char*)NULL) == 0, "delete");
  dropped = device.stats.dropped;
  s = derive_p(deleted, 1, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  CHECK(device.stats.dropped - dropped == 1, "a key pending deletion: its entry dropped");
  s = derive_p(deleted, 0, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  /* Not in the store at all: NOT_FOUND, nothing to drop but nothing remembered either. */
  s = derive_p(key_name("never-made"), 0, &r);
  CHECK_STATUS(&device, s, OFFLOAD_ERR_NOT_FOUND);
  s = derive_p(key_name("never-made"), 0, &r);
  CHECK(s == OFFLOAD_ERR_NOT_FOUND && r == 1, "a refusal is never remembered");

  /* A retired version (below the minimum decryption version): a refusal about one version drops
   * every entry of the key id. */
  CHECK(ctl(NULL, 0, "keys", "rotate", retired, (const char*)NULL) == 0, "rotate");
  CALL(offload_derive_version(&device, retired, 1, peer_pk[0], true, k, NULL, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  CHECK(derive_p(retired, 0, &r) == OFFLOAD_OK && r == 1, "version 2 (current)");
  CHECK(ctl(NULL, 0, "keys", "min-decryption-version", retired, "2", (const char*)NULL) == 0,
        "min-decryption-version");
  dropped = device.stats.dropped;
  CALL(offload_derive_version(&device, retired, 1, peer_pk[1], true, k, NULL, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_ERR_FAILED_PRECONDITION);
  CHECK(device.stats.dropped - dropped == 2, "a retired version: the key's 2 entries dropped (+%u)",
        device.stats.dropped - dropped);
  CHECK(derive_p(retired, 0, &r) == OFFLOAD_OK && r == 1, "version 2 asked again");

  /* An error about one message (a small-order peer key) drops nothing. */
  CHECK(derive_p(other, 0, &r) == OFFLOAD_OK, "other key");
  memset(zero, 0, sizeof zero);
  dropped = device.stats.dropped;
  CALL(offload_derive(&device, other, zero, true, k, NULL));
  CHECK_STATUS(&device, s, OFFLOAD_ERR_INVALID_ARGUMENT);
  CHECK(device.stats.dropped == dropped && derive_p(other, 0, &r) == OFFLOAD_OK && r == 0,
        "a small-order peer: INVALID_ARGUMENT, the key's entries stay");
}

/* --- 6: an expired entry ----------------------------------------------------------------------- */
/* `needle` (32 bytes) anywhere in the device's client struct. */
static int device_holds(const uint8_t* needle) {
  const uint8_t* p = (const uint8_t*)&device;
  size_t i;
  for (i = 0; i + 32 <= sizeof device; ++i) {
    if (memcmp(p + i, needle, 32) == 0) return 1;
  }
  return 0;
}

static void expiry(void) {
  const char* key_id = key_name("expiring");
  uint8_t ka[32], kb[32];
  uint32_t r = 0, expired;
  bool hit = false;
  CHECK(ctl(NULL, 0, "keys", "create", "--type=x25519", key_id, (const char*)NULL) == 0,
        "create %s", key_id);
  offload_client_reset(&device);
  CHECK_STATUS(&device, offload_client_set_memo_max_age(&device, 5000), OFFLOAD_OK);
  CALL(offload_derive(&device, key_id, peer_pk[0], true, ka, NULL)); /* A at t0 */
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  now_ms += 3000;
  CALL(offload_derive(&device, key_id, peer_pk[1], true, kb, NULL)); /* B at t0 + 3 s */
  CHECK_STATUS(&device, s, OFFLOAD_OK);
  now_ms += 1999; /* t0 + 4.999 s */
  CHECK(derive_p(key_id, 0, &r) == OFFLOAD_OK && r == 0, "A, 1 ms before its maximum age: memo");
  CHECK(device_holds(ka), "A's key is in the memo");
  now_ms += 1; /* t0 + 5 s: A expired, B is 2 s old */
  expired = device.stats.expired;
  CALL(offload_derive(&device, key_id, peer_pk[1], true, kb, &hit));
  CHECK(s == OFFLOAD_OK && hit && device.stats.expired - expired == 1,
        "B from the memo, A expired by the same lookup (expired +%u)",
        device.stats.expired - expired);
  CHECK(!device_holds(ka), "the expired entry's key is wiped from the client");
  CHECK(derive_p(key_id, 0, &r) == OFFLOAD_OK && r == 1, "A is asked of the server again");
  CHECK_STATUS(&device,
               offload_client_set_memo_max_age(&device, OFFLOAD_MEMO_DEFAULT_MAX_AGE_MS),
               OFFLOAD_OK);
}

int main(int argc, char** argv) {
  int port, grpc_port, p;
  uint8_t probe_pk[32], box_pk[32];
  if (argc != 6 || (port = atoi(argv[1])) <= 0 || port > 65535 ||
      (metrics_port = atoi(argv[2])) <= 0 || metrics_port > 65535 ||
      (grpc_port = atoi(argv[3])) <= 0 || grpc_port > 65535) {
    fprintf(stderr, "usage: %s HTTP_PORT METRICS_PORT GRPC_PORT OFFLOADCTL KEY_PREFIX\n", argv[0]);
    return 64;
  }
  ctl_path = argv[4];
  prefix = argv[5];
  snprintf(grpc_flag, sizeof grpc_flag, "--server=127.0.0.1:%d", grpc_port);
  if (sodium_init() < 0) return 1;
  printf("%s: heap guard %s, %d memo slots, local box %d, client struct %zu bytes\n", argv[0],
         heap_guard_enforced ? "ENFORCED" : "off", OFFLOAD_MEMO_SLOTS, OFFLOAD_LOCAL_BOX,
         sizeof device);
  live_check_guard_is_live();
#if OFFLOAD_MEMO_SLOTS < PEERS
  fprintf(stderr, "SKIP: %d memo slots, fewer than the %d peers of the probe\n",
          OFFLOAD_MEMO_SLOTS, PEERS);
  return 77;
#endif
  CHECK(offload_posix_transport_init(&http, "127.0.0.1", (uint16_t)port) == 0, "transport");
  CHECK_STATUS(&device, offload_client_init(&device, offload_posix_transport, &http, wire,
                                            sizeof wire),
               OFFLOAD_OK);
  CHECK_STATUS(&device, offload_client_set_clock(&device, device_clock, &now_ms), OFFLOAD_OK);
  CHECK_STATUS(&plain, offload_client_init(&plain, offload_posix_transport, &http, plain_wire,
                                           sizeof plain_wire),
               OFFLOAD_OK);
  for (p = 0; p < PEERS; ++p) crypto_box_keypair(peer_pk[p], peer_sk[p]);
  CHECK(ctl(NULL, 0, "keys", "create", "--type=x25519", key_name("probe"), (const char*)NULL) == 0,
        "create probe key");
  CHECK(ctl(NULL, 0, "keys", "create", "--type=x25519", key_name("box"), (const char*)NULL) == 0,
        "create box key");
  public_key(key_name("probe"), 1, probe_pk);
  public_key(key_name("box"), 1, box_pk);
  if (live_failures != 0) return live_summary(argv[0]);

  printf("1. probe rounds, derive\n");
  probe_derive(key_name("probe"), probe_pk);
  if (device.local_box) {
    printf("2. probe rounds, box on the device\n");
    offload_client_reset(&device);
    CHECK(device.memo_count == 0, "reset empties the memo");
    probe_box(key_name("box"), box_pk);
    printf("3. the device's boxes and the server's\n");
    interop(key_name("box"), box_pk);
  } else {
    printf("2, 3: skipped (no box on the device: built without OFFLOAD_LOCAL_BOX)\n");
  }
  printf("4. a rotated key\n");
  rotation();
  printf("5. disabled, deleted, retired keys\n");
  refused_keys();
  printf("6. an expired entry\n");
  expiry();
  printf("%s: client stats: %u hits, %u misses, %u evictions, %u expired, %u dropped, "
         "%u requests\n",
         argv[0], device.stats.hits, device.stats.misses, device.stats.evictions,
         device.stats.expired, device.stats.dropped, device.stats.requests);
  return live_summary(argv[0]);
}
