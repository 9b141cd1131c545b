// An event-driven HTTP/1.1 and HTTP/2 server on H2O (Debian's libh2o-evloop 2.2.5). A few event
// loop threads share one listening socket; no thread is tied to a connection, so idle and slow
// clients cost memory, not threads. A cleartext port speaks HTTP/1.1 and HTTP/2 with prior
// knowledge (h2c); a TLS port negotiates `h2` or `http/1.1` by ALPN.
//
// A Handler gets each complete request (headers and body) on a loop thread and must never block
// it: it answers at once, or keeps the Exchange and answers later from any thread (the request's
// loop then writes the response: headers and body in one write). A request whose client went
// away is abandoned: Respond() then does nothing.
//
//   class Hello final : public httpd::Handler {
//     void Handle(std::shared_ptr<httpd::Exchange> exchange) override {
//       exchange->Respond({200, {{"content-type", "text/plain"}}, "hello\n"});
//     }
//   } hello;
//   httpd::Server::Options options;
//   options.address = "127.0.0.1:0";
//   httpd::Server server(options, &hello);
//   OFFLOAD_RETURN_IF_ERROR(server.Start());        // server.port() is the bound port
//   ...
//   server.Drain();                                 // stop accepting; idle connections closed
//   server.Stop(absl::Now() + absl::Seconds(20));   // answers in flight, then every socket closed
//
// Connection hygiene: TCP_NODELAY on every connection; a bound on open connections (more are
// closed at accept and counted); an idle timeout (HTTP/1.1 keep-alive, HTTP/2 without requests);
// a read timeout: HTTP/1.1 request headers must arrive whole within it and a TLS handshake must
// finish within it, and a connection whose request (body, or HTTP/2 frame) makes no progress for
// that long is cut; limits on header bytes (431) and body bytes (413).
//
// Thread-safety: Start, Drain and Stop from one thread, in that order; Exchange::Respond and
// stats() from any thread. The handler must outlive Stop().
#ifndef SERVICE_HTTPD_SERVER_H_
#define SERVICE_HTTPD_SERVER_H_

#include <openssl/ssl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace offload::httpd {

namespace internal {
struct Access;
struct Conn;
struct Loop;
struct Posting;
}  // namespace internal

// A response: status, headers (names lower-case, as HTTP/2 wants them), body. The server adds
// `content-length`, `date` and `server`.
struct Response {
  using Headers = std::vector<std::pair<std::string, std::string>>;
  Response() = default;
  Response(int status, Headers headers, std::string body)
      : status(status), headers(std::move(headers)), body(std::move(body)) {}

  int status = 200;
  Headers headers;
  std::string body;
  // More body after `body`, written without a copy: the views stay valid while `owner` lives,
  // and the server keeps `owner` until the response is written or the client is gone.
  std::vector<absl::string_view> shared_body;
  std::shared_ptr<const void> owner;

  size_t body_size() const;
};

// One request and its response. The request's views (method, path, query, headers, body) point
// into the server's buffers: read them in Handler::Handle, on the loop thread, and copy what a
// worker needs.
class Exchange final : public std::enable_shared_from_this<Exchange> {
 public:
  absl::string_view method() const { return method_; }
  absl::string_view path() const { return path_; }    // without the query
  absl::string_view query() const { return query_; }  // after '?', empty if none
  // The first value of header `name` (lower-case), or nullopt. Loop thread, in Handle().
  std::optional<absl::string_view> header(absl::string_view name) const;
  // Every request header in order (names lower-case). Loop thread, in Handle().
  void ForEachHeader(const std::function<void(absl::string_view, absl::string_view)>& fn) const;
  absl::string_view body() const { return body_; }
  // 0x100 (HTTP/1.0), 0x101 (HTTP/1.1), 0x200 (HTTP/2).
  int http_version() const { return version_; }
  bool tls() const { return tls_; }
  // "ipv4:127.0.0.1:51234" or "ipv6:[::1]:51234", as gRPC names peers.
  const std::string& peer_address() const { return peer_address_; }
  // Options::peer_identity of the connection's TLS client certificate; empty without one.
  const std::string& peer_identity() const { return peer_identity_; }

  // Answers the request; the first call wins, later ones do nothing. From any thread: on the
  // request's loop thread the response is written at once, from another thread it is handed to
  // the loop (or dropped if the client or the server is gone).
  void Respond(Response response);
  // True once the request is over: answered and written, or its client gone, or the server
  // stopped. From any thread.
  bool abandoned() const { return abandoned_.load(std::memory_order_acquire); }

  // Made by the server, one per request.
  Exchange(internal::Loop* loop, internal::Conn* conn, void* req);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

 private:
  friend struct internal::Access;

  internal::Loop* const loop_;
  internal::Conn* conn_;  // loop thread only; null once disposed
  void* req_;             // h2o_req_t*, loop thread only; null once disposed
  absl::string_view method_, path_, query_, body_;
  int version_ = 0;
  bool tls_ = false;
  std::string peer_address_;
  std::string peer_identity_;
  std::atomic<bool> responded_{false};
  std::atomic<bool> abandoned_{false};
  std::unique_ptr<internal::Posting> posting_;  // a response handed over from another thread
};

class Handler {
 public:
  virtual ~Handler() = default;
  // A complete request, on a loop thread. Must not block: answer at once, or keep `exchange`
  // and Respond() from elsewhere (e.g. a worker pool).
  virtual void Handle(std::shared_ptr<Exchange> exchange) = 0;
};

class Server final {
 public:
  struct Options {
    // host:port (port 0 picks a free one, see port()); IPv6 as [::1]:8080; a host name is
    // resolved (its first address).
    std::string address = "127.0.0.1:0";
    // Event loop threads; 0 = one per core, at most 4.
    int threads = 0;
    // Open connections at most (more are closed at accept, counted); 0 = no bound.
    int max_connections = 10000;
    // A connection with no request under way is closed after this long.
    absl::Duration idle_timeout = absl::Seconds(60);
    // See the header comment: headers whole, TLS handshakes and progress within this time.
    absl::Duration read_timeout = absl::Seconds(10);
    // Request line (or pseudo-headers) and headers, bytes in all: beyond it 431.
    int64_t max_header_bytes = 16 << 10;
    // Request body: beyond it 413.
    int64_t max_body_bytes = 16 << 20;
    // Concurrent requests per HTTP/2 connection.
    int http2_max_streams = 100;
    // TCP_NODELAY on accepted connections (false only to measure what Nagle's algorithm costs).
    bool tcp_nodelay = true;
    // TLS when set: called once with the port's SSL_CTX to install the certificate and client
    // checks; ALPN (h2, http/1.1) and a session id context are added by the server.
    std::function<absl::Status(SSL_CTX*)> configure_tls;
    // With TLS: the identity of a connection's peer certificate (called once per connection
    // after its handshake, with nullptr when the client sent none).
    std::function<std::string(X509*)> peer_identity;
    // The `server` response header.
    std::string server_name = "crypto-offload";
  };

  // Counters since Start (loop threads write them; any thread reads).
  struct Stats {
    uint64_t accepted = 0;          // connections accepted
    uint64_t refused = 0;           // closed at accept: max_connections reached
    uint64_t read_timeouts = 0;     // cut by the read timeout (slow or stalled sender)
    int64_t open = 0;               // open now
    uint64_t requests = 0;          // requests handed to the handler
    uint64_t header_too_large = 0;  // answered 431
  };

  Server(Options options, Handler* handler);
  ~Server();  // Stop(now) if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds, listens and starts the loops. Unavailable if the address cannot be bound,
  // InvalidArgument for a malformed address or a TLS set-up failure. REQUIRES: called once.
  absl::Status Start();
  // The bound port, after Start.
  int port() const { return port_; }

  // Stops accepting, sends HTTP/2 clients GOAWAY, turns keep-alive off and closes connections
  // with no request under way; requests in flight still get their answers. Idempotent.
  void Drain();
  // Drain(), waits until every request handed to the handler has been answered (or until
  // `deadline`), then closes every connection and joins the loops. Idempotent.
  void Stop(absl::Time deadline);

  Stats stats() const;
  const Options& options() const { return options_; }

  struct Impl;

 private:
  const Options options_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace offload::httpd

#endif  // SERVICE_HTTPD_SERVER_H_
