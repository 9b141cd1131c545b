// The front door: an event-driven HTTP/1.1 and HTTP/2 server on Boost.Asio (sockets, timers,
// TLS), Boost.Beast (the HTTP/1.1 parser) and libnghttp2 (HTTP/2). A few event-loop threads serve
// every connection; no thread is tied to a connection, so idle and slow clients cost memory, not
// threads. A cleartext port speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c); a TLS port
// negotiates `h2` or `http/1.1` by ALPN.
//
// A Handler gets each request on a loop thread and must never block it: it answers at once, or
// keeps the Exchange and answers later from any thread (the request's loop then writes the
// response: headers, body and trailers in one write). A request whose client went away is
// abandoned: Respond() then does nothing. A handler may also take a request as a stream
// (Handler::Streaming): it gets the exchange when the headers arrive, the body as it arrives, and
// writes its answer in parts (StartResponse, Write, Finish) - a bidirectional HTTP/2 stream.
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
// closed at accept and counted); an idle timeout (HTTP/1.1 keep-alive, HTTP/2 without streams);
// a read timeout (HTTP/1.1 request headers whole within it, TLS handshakes within it, and a
// request body that makes no progress for that long is cut); a send timeout (an answer the client
// does not take); limits on header bytes (431) and body bytes (the handler answers, see
// Exchange::refusal). HTTP/1.1 framing that could smuggle a request (a Transfer-Encoding other
// than one `chunked`, Content-Length beside chunked, an HTTP/1.1 request without Host) is answered
// 400 or 501 by the engine before any body byte is read, and the connection closes. HTTP/1.1
// answers on a connection that stays open carry `keep-alive: timeout=N` (the idle timeout in
// whole seconds; none under 1 s), counted from the end of the answer.
//
// Abuse defences (HTTP/2 unless said; each counted in Stats::abuse by reason, see AbuseReason):
// a client reset rate (a token bucket); nghttp2's own limits (CONTINUATION frames per header
// block, queued outbound ACKs, SETTINGS entries); premature resets (Envoy's rule: once a
// connection has closed `premature_reset_streams` streams, GOAWAY if half of them ended before
// their answer, reset by the client or by us for its error). A client reset that comes 100 ms or
// more after its request was handed to the handler - a client that waited and gave up, as gRPC
// clients do at their deadline, a server under overload answering late - counts for neither; frames that make no progress (empty DATA, tiny
// WINDOW_UPDATEs, PRIORITY, SETTINGS and idle PINGs) drain a per-connection token bucket, and an
// empty bucket is GOAWAY ENHANCE_YOUR_CALM; memory: request bodies held (and header text), and
// apart from them the answer bytes not yet sent, are charged to the connection, and both to the
// server. Past `connection_budget_bytes` of request bytes a connection's new requests are refused
// and its body bytes are not taken (HTTP/2: their window is not given back), except for one
// request at a time, so that a request of max_body_bytes still completes. Past
// `connection_answer_budget_bytes` of unsent answers (a client that does not read them) its new
// requests are refused too (HTTP/2: also a request whose body completes past it); an answer begun below it completes whatever its size. Past
// `memory_budget_bytes` new requests are refused on every connection that holds bytes (one that
// holds nothing still gets a request in), and connections holding body bytes are not read. A
// refused request goes to the handler at once with Exchange::refusal() set, its body unread, so
// that the caller gets its protocol's RESOURCE_EXHAUSTED (never REFUSED_STREAM, which gRPC
// clients report as UNAVAILABLE).
//
// Thread-safety: Start, Drain and Stop from one thread, in that order; Exchange's response
// methods and stats() from any thread. The handler must outlive Stop().
#ifndef SERVICE_HTTPD_SERVER_H_
#define SERVICE_HTTPD_SERVER_H_

#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace offload::httpd {

namespace internal {
struct Access;
struct AnswerGauge;
class Loop;
class Mailbox;
struct Stream;
}  // namespace internal

using Headers = std::vector<std::pair<std::string, std::string>>;

// A response: status, headers (names lower-case, as HTTP/2 wants them), body, trailers. The server
// adds `content-length` (unless trailers follow), `date` and `server`.
struct Response {
  using Headers = httpd::Headers;
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
  // Sent after the body: HTTP/2 trailers (HEADERS with END_STREAM); on HTTP/1.1 the body is
  // chunked and these are its trailer fields.
  Headers trailers;
  // `body` holds a secret (a plaintext, a shared key): every copy the engine makes of it (its
  // buffers, small pieces copied into a write) is zeroed before it is freed. `owner`'s bytes are
  // the owner's to wipe.
  bool secret = false;

  size_t body_size() const;
};

// Why the engine refused, paused or closed something, for Stats::abuse and the
// `offload_http_abuse_total{reason}` metric.
enum class AbuseReason : int {
  kPrematureResets = 0,  // GOAWAY: most of the connection's streams ended before their answer
  kResetRate,            // client resets (not after a patient wait) over their rate (Rapid Reset)
  kContinuations,        // too many CONTINUATION frames in one header block
  kControlFlood,         // the client does not read our PING/SETTINGS ACKs and resets
  kSettings,             // too many entries in a SETTINGS frame
  kNoProgress,           // GOAWAY ENHANCE_YOUR_CALM: frames that make no progress
  kProtocolError,        // a connection error (bad preface, bad frame, unparseable HTTP/1.1, or
                         // HTTP/1.1 framing refused: Transfer-Encoding other than one chunked,
                         // Host missing from HTTP/1.1 or repeated; 400 or 501, then closed)
  kHeaderTooLarge,       // request headers over the limit (431)
  kBodyTooLarge,         // a request body over the limit (the handler answers it)
  kStreamRefused,        // request memory budget: a new request refused (Refusal::kBusy)
  kReadPaused,           // memory budget: a connection's body bytes held back
  kSendTimeout,          // an answer the client did not take within the send timeout
  kTooManyPings,         // GOAWAY ENHANCE_YOUR_CALM "too_many_pings": gRPC's keepalive policy
  kAnswersUnread,        // answer budget: a new request refused (Refusal::kAnswersUnread)
  kDrainBodyLate,        // a body still arriving at the drain's body deadline (Refusal::kDraining)
  kCount
};
// The metric label of `reason` ("premature_resets", "reset_rate", ...).
const char* AbuseReasonName(AbuseReason reason);

// One request and its response. The request's method, path, query and headers are owned by the
// exchange and stay valid while it lives; body() only during Handler::Handle (the server frees
// request bodies once handed over: copy what a worker needs).
class Exchange final : public std::enable_shared_from_this<Exchange> {
 public:
  absl::string_view method() const { return Piece(method_); }
  absl::string_view path() const { return Piece(path_); }    // without the query
  absl::string_view query() const { return Piece(query_); }  // after '?', empty if none
  // The first value of header `name` (lower-case), or nullopt.
  std::optional<absl::string_view> header(absl::string_view name) const;
  // Every request header in order (names lower-case).
  void ForEachHeader(const std::function<void(absl::string_view, absl::string_view)>& fn) const;
  absl::string_view body() const { return body_; }
  // The request body's buffer itself, for a handler that keeps it (a request read where it
  // lies, handed to a worker): body() is empty afterwards. REQUIRES: called in Handle.
  std::string TakeBody() {
    std::string out;
    out.swap(body_);
    return out;
  }
  // The request body holds a secret (a plaintext to seal, a key to import): zeroed when the
  // exchange frees it. (Its buffer is never left behind unzeroed when it grows.)
  void MarkSecret() { secret_ = true; }
  // Why the engine refused the request before its body was read (kNone: it did not). The handler
  // gets a refused request at once, with body() empty, and answers in its protocol's terms; the
  // rest of the body is never read (HTTP/2: dropped as it comes, the stream reset after the
  // answer; HTTP/1.1: the connection closes after the answer).
  enum class Refusal : uint8_t {
    kNone,
    kBodyTooLarge,   // the body is over Options::max_body_bytes: no retry will pass
    kBusy,           // a request memory budget is spent (connection or server): retry later
    kAnswersUnread,  // the connection's unsent answers are past its answer budget: retry later
    kDraining,       // the server is stopping and the body was still arriving at the drain's
                     // body deadline (Server::Stop): retry on another server
  };
  Refusal refusal() const { return refusal_; }
  // True when the request body was larger than Options::max_body_bytes (refusal()).
  bool body_too_large() const { return refusal_ == Refusal::kBodyTooLarge; }
  // True when this request's connection holds more unsent answer bytes (written by handlers,
  // not yet taken by the client) than Options::connection_answer_budget_bytes: a handler about
  // to compute an answer for it may refuse instead (as the engine refuses new requests then),
  // so that a client that does not read cannot make answers pile up. From any thread.
  bool answers_over_budget() const;
  // 0x100 (HTTP/1.0), 0x101 (HTTP/1.1), 0x200 (HTTP/2).
  int http_version() const { return version_; }
  bool tls() const { return tls_; }
  // "ipv4:127.0.0.1:51234" or "ipv6:[::1]:51234", as gRPC names peers.
  const std::string& peer_address() const { return *peer_address_; }
  // Options::peer_identity of the connection's TLS client certificate; empty without one.
  const std::string& peer_identity() const { return *peer_identity_; }

  // Answers the request; the first answer wins, later ones do nothing. From any thread: on the
  // request's loop thread the response is written at once, from another thread it is handed to
  // the loop (or dropped if the client or the server is gone).
  void Respond(Response response);
  // True once the request is over: answered and written, or its client gone, or the server
  // stopped. From any thread.
  bool abandoned() const { return abandoned_.load(std::memory_order_acquire); }

  // Streaming (Handler::Streaming said yes). The body's pieces go to `reader` on the loop thread
  // as they arrive, then one call with `end` true (also when the client is gone: `data` empty).
  // REQUIRES: called in Handle, once.
  void ReadBody(std::function<void(absl::string_view data, bool end)> reader);
  // The answer in parts, from any thread, in this order: StartResponse once, Write any number of
  // times (each is sent as soon as flow control lets it), Finish once (trailers may be empty).
  // Respond() is the three at once. A part after the request is over does nothing.
  void StartResponse(int status, Headers headers);
  void Write(std::string data);
  void Finish(Headers trailers);
  // The last body bytes and the end as one part: nothing written from another thread meanwhile
  // can come after `last_data`, and of two threads ending the answer only the first does (a
  // stream whose end is a frame of the body: gRPC-Web's trailers, Connect's end of stream).
  void Finish(Headers trailers, std::string last_data);
  // Bytes written by Write and not yet sent (the client's flow-control window, a slow reader).
  // From any thread; a producer may wait while it is high.
  int64_t unsent_bytes() const { return unsent_.load(std::memory_order_relaxed); }

  // The deadline the client gave the request (gRPC's grpc-timeout, Connect-Timeout-Ms), for the
  // abuse defences: a client's reset at its deadline is a timer going off, never a premature
  // reset. From any thread; later calls win.
  void SetDeadline(absl::Time deadline);

  // A part of the answer as the engine queues it (internal/engine.h).
  struct Part;

  // Made by the server, one per request.
  Exchange(internal::Loop* loop, std::shared_ptr<internal::Mailbox> mailbox);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

 private:
  friend struct internal::Access;
  struct Span {
    uint32_t offset = 0, size = 0;
  };
  struct HeaderSpan {
    Span name, value;
  };
  absl::string_view Piece(Span s) const { return absl::string_view(text_.data() + s.offset, s.size); }
  // Hands a part to the loop (at once on the loop's own thread).
  void Send(Part part);
  // Once per exchange handed to the handler: it has its answer, or never will (Stop waits for
  // the others).
  void CountAnswered();

  internal::Loop* const loop_;
  const std::shared_ptr<internal::Mailbox> mailbox_;
  internal::Stream* stream_ = nullptr;  // loop thread only; null once the request is over
  // Method, path, query, header names and values, in one buffer (inline for a usual request).
  absl::InlinedVector<char, 320> text_;
  Span method_, path_, query_;
  absl::InlinedVector<HeaderSpan, 12> headers_;
  std::string body_;
  bool secret_ = false;  // MarkSecret
  Refusal refusal_ = Refusal::kNone;
  int version_ = 0;
  bool tls_ = false;
  std::shared_ptr<const std::string> peer_address_;   // the connection's, shared
  std::shared_ptr<const std::string> peer_identity_;
  std::shared_ptr<internal::AnswerGauge> answers_;     // the connection's unsent answer bytes
  std::function<void(absl::string_view, bool)> reader_;  // loop thread
  std::atomic<bool> started_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> dispatched_{false};  // handed to the handler: counted until answered
  std::atomic<bool> counted_{false};
  std::atomic<bool> receiving_{false};  // headers in, not yet handed over nor gone (Stop waits)
  std::atomic<int64_t> unsent_{0};
  std::atomic<int64_t> deadline_ns_{0};  // SetDeadline, absl::ToUnixNanos; 0: none
  std::atomic<int> in_mail_{0};  // parts posted to the loop and not yet delivered
};

// What the calling loop thread has on its hands, for a handler that decides whether to run work
// where it is (Handler::Handle runs on a loop thread) or to hand it elsewhere: work run here
// delays everything else this loop serves. See CurrentLoopLoad and ChargeLoop.
struct LoopLoad {
  bool on_loop = false;  // the calling thread is one of a server's loops
  // Work the handler charged (ChargeLoop, in its own unit) since the loop took up the input at
  // hand: one turn of one connection - the reads of it the loop makes in a row before it serves
  // another connection (up to 8 of 64 KiB on a plain socket, one record's worth under TLS) -
  // which may hold many requests (HTTP/2 streams).
  int64_t charged = 0;
  // Answers and stream parts handed to this loop from other threads and not yet taken up: they
  // wait for what runs here.
  int64_t waiting = 0;
};
// The calling thread's LoopLoad (on_loop false, zeros, on any other thread).
LoopLoad CurrentLoopLoad();
// Adds `amount` to the calling loop's `charged` (nothing on any other thread).
void ChargeLoop(int64_t amount);

class Handler {
 public:
  virtual ~Handler() = default;
  // A request, on a loop thread: complete (headers and body), or only its headers when
  // Streaming() said yes. Must not block: answer at once, or keep `exchange` and answer from
  // elsewhere (e.g. a worker pool).
  virtual void Handle(std::shared_ptr<Exchange> exchange) = 0;
  // Asked on the loop thread when a request's headers have arrived: true to get it at once and
  // its body as it arrives (Exchange::ReadBody). Default: no, complete requests only.
  virtual bool Streaming(const Exchange& exchange) { return false; }
  // Asked on the loop thread when a request's headers have arrived (not for a streaming one):
  // the largest body this request may have, at most Options::max_body_bytes (a larger answer or
  // a negative one: that). A body over it is refused unread (Exchange::Refusal::kBodyTooLarge,
  // counted as body_too_large), as soon as its Content-Length or its bytes say so.
  virtual int64_t BodyLimit(const Exchange& exchange) { return -1; }
  // A request the engine refused itself, before Handle: its headers were over
  // Options::max_header_bytes (answered 431). On the loop thread, from `peer_address`
  // ("ipv4:127.0.0.1:5000"); for the owner's audit trail. Must not block.
  virtual void HeaderTooLarge(absl::string_view peer_address) {}
};

class Server final {
 public:
  struct Options {
    // host:port (port 0 picks a free one, see port(), and the engine's log lines name that
    // one); IPv6 as [::1]:8080; a host name is resolved (its first address).
    std::string address = "127.0.0.1:0";
    // Event loop threads; 0 = one per core, at most 4.
    int threads = 0;
    // Open connections at most (more are closed at accept, counted); 0 = no bound.
    int max_connections = 10000;
    // A connection with no request under way is closed after this long.
    absl::Duration idle_timeout = absl::Seconds(60);
    // See the header comment: headers whole, TLS handshakes and body progress within this time.
    absl::Duration read_timeout = absl::Seconds(10);
    // An answer that makes no progress (the client does not read, or keeps its flow-control
    // window shut) for this long has its connection cut.
    absl::Duration send_timeout = absl::Seconds(60);
    // Request line (or pseudo-headers) and headers, bytes in all: beyond it 431.
    int64_t max_header_bytes = 16 << 10;
    // Request body: beyond it the handler is called with Refusal::kBodyTooLarge.
    int64_t max_body_bytes = 16 << 20;
    // TCP_NODELAY on accepted connections (false only to measure what Nagle's algorithm costs).
    bool tcp_nodelay = true;

    // Memory (see the header comment), 0 = no bound: request body bytes held (and header text)
    // per connection; answer bytes written by handlers and not yet sent per connection; both
    // together over all connections.
    int64_t connection_budget_bytes = 4 << 20;
    int64_t connection_answer_budget_bytes = 4 << 20;
    int64_t memory_budget_bytes = 256 << 20;

    struct Http2 {
      // Concurrent requests per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
      int max_concurrent_streams = 100;
      // The window a stream's request body may fill before we take it (SETTINGS_INITIAL_
      // WINDOW_SIZE), and the connection's.
      int32_t stream_window_bytes = 256 << 10;
      int32_t connection_window_bytes = 1 << 20;
      // Incoming RST_STREAM token bucket (burst, per second): a reset that comes 100 ms or more
      // after its request was handed to the handler is a client giving up on a slow answer and
      // takes no token (nor counts as premature). nghttp2's limits: CONTINUATION frames per
      // header block; outbound ACK/RST frames queued unread; SETTINGS entries.
      uint64_t reset_burst = 1000;
      uint64_t reset_rate = 33;
      size_t max_continuations = 8;
      size_t max_outbound_ack = 1000;
      size_t max_settings = 32;
      // Premature resets: a connection that has closed this many streams is sent GOAWAY if at
      // least half of them ended before their answer within `premature_reset_lifetime` of
      // opening (0: off).
      int premature_reset_streams = 200;
      absl::Duration premature_reset_lifetime = absl::Seconds(1);
      // Frames without progress: a token bucket per connection (burst, refill per second).
      int no_progress_burst = 1000;
      int no_progress_rate = 33;
      // Keep-alive PINGs, enforced as grpc-core enforces them (its ping abuse policy, with its
      // defaults): a PING that comes sooner than `min_ping_interval` after the previous one
      // (`idle_ping_interval` while no stream is open) with no HEADERS or DATA sent since is a
      // strike; more than `max_ping_strikes` strikes: GOAWAY ENHANCE_YOUR_CALM with debug data
      // "too_many_pings", which gRPC clients read as "double your keepalive time". Sending
      // HEADERS or DATA clears the strikes. 0 strikes: off.
      absl::Duration min_ping_interval = absl::Minutes(5);
      absl::Duration idle_ping_interval = absl::Hours(2);
      int max_ping_strikes = 2;
    } http2;

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
    int64_t buffered_bytes = 0;     // now: body bytes held and answer bytes not yet sent
    std::array<uint64_t, static_cast<int>(AbuseReason::kCount)> abuse{};  // by AbuseReason
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

  // Stops accepting, sends HTTP/2 clients GOAWAY (a first one that announces the drain, then the
  // last stream id a moment later), turns keep-alive off and closes connections with no request
  // under way; requests in flight still get their answers. A request whose body is still
  // arriving kDrainBodyGrace later (at most the read timeout; at most half the time Stop is
  // given) goes to the handler refused (Refusal::kDraining), its body unread: a slow sender holds
  // the drain that long at most. Idempotent.
  void Drain();
  static constexpr absl::Duration kDrainBodyGrace = absl::Seconds(2);
  // Drain(), waits until every request accepted has been answered (or until `deadline`), then
  // closes every connection and joins the loops. Idempotent.
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
