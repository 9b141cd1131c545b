/* internal/tcp_posix.h - the TCP socket code the transports share (not part of the client's
 * API): a numeric IPv4 address, a connect with send and receive timeouts, whole sends and
 * EINTR-proof receives. POSIX sockets, which ESP-IDF's lwIP also offers. No malloc, no stdio, no
 * name resolution.
 */
#ifndef CLIENT_EMBEDDED_INTERNAL_TCP_POSIX_H_
#define CLIENT_EMBEDDED_INTERNAL_TCP_POSIX_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Room for a dotted-quad IPv4 address and its NUL. */
#define OFFLOAD_TCP_IPV4_TEXT_CAP 16

/* Parses the dotted quad `ipv4` into `*addr_be` (network order) and its canonical text into
 * `text`. False for NULL or anything but a numeric IPv4 address. */
bool offload_tcp_parse_ipv4(const char* ipv4, uint32_t* addr_be,
                            char text[OFFLOAD_TCP_IPV4_TEXT_CAP]);

/* A connected TCP socket to `addr_be`:`port` with TCP_NODELAY and `timeout_ms` on connect, each
 * send and each receive; -1 on failure. */
int offload_tcp_connect(uint32_t addr_be, uint16_t port, int timeout_ms);

/* Sends all `len` bytes; false on an error or a timeout. Never raises SIGPIPE where the platform
 * has MSG_NOSIGNAL. */
bool offload_tcp_send_all(int fd, const void* data, size_t len);

/* One recv() of at most `cap` bytes, retried on EINTR: the byte count, 0 when the peer closed,
 * -1 on an error or a timeout (then errno is EAGAIN or EWOULDBLOCK). */
ssize_t offload_tcp_recv(int fd, void* dst, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* CLIENT_EMBEDDED_INTERNAL_TCP_POSIX_H_ */
