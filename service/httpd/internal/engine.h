// The engine's insides, shared by server.cc (loops, accept, drain), conn.cc (sockets, TLS,
// timeouts), http1.cc (Beast's parser) and http2.cc (nghttp2). Nothing here includes Asio or
// Beast: the protocol files compile without them.
//
// Ownership: a Loop owns its connections (Conn); a Conn owns its Protocol; a Protocol owns its
// Streams; a Stream holds its Exchange (shared with the handler). Everything here runs on the
// connection's loop thread, except the counters (atomics) and Impl::unanswered (its mutex).
#ifndef SERVICE_HTTPD_INTERNAL_ENGINE_H_
#define SERVICE_HTTPD_INTERNAL_ENGINE_H_

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include <nlohmann/json.hpp>
#include "service/httpd/server.h"

namespace offload::httpd {

struct Exchange::Part {
  bool start = false;   // status and headers
  bool end = false;     // the last part: trailers follow (maybe none)
  int status = 200;
  Headers headers;
  std::string data;                        // body bytes
  std::vector<absl::string_view> shared;   // more body bytes, kept by `owner`
  std::shared_ptr<const void> owner;
  Headers trailers;
  bool secret = false;  // Response::secret: `data` is zeroed wherever the engine frees it
  size_t size() const;
};

namespace internal {

using Clock = std::chrono::steady_clock;

// A request body's buffer is reserved up to this much from its announced length.
constexpr uint64_t kBodyReserve = 64 << 10;

class Conn;
class Loop;
class Protocol;

// A connection's unsent answer bytes, shared with its exchanges so that handlers on any thread
// can read it (Exchange::answers_over_budget). `bytes` counts what the loop holds (Conn::
// ChargeAnswer) and what handlers have handed over that the loop has not yet taken
// (Exchange::Send to Access::Deliver).
struct AnswerGauge {
  explicit AnswerGauge(int64_t budget) : budget(budget) {}
  std::atomic<int64_t> bytes{0};
  const int64_t budget;  // Options::connection_answer_budget_bytes; 0: no bound
  bool Over() const { return budget > 0 && bytes.load(std::memory_order_relaxed) >= budget; }
};

// Where answers from other threads go: their loop's queue while it runs. Shared by a loop and the
// exchanges made on it, so that an answer after Stop (or after the server is gone) is dropped.
class Mailbox {
 public:
  Mailbox(Loop* loop, std::shared_ptr<std::atomic<int64_t>> unanswered,
          std::shared_ptr<std::atomic<int64_t>> receiving)
      : loop_(loop), unanswered_(std::move(unanswered)), receiving_(std::move(receiving)) {}
  // Runs `fn` on the loop; false once the loop has stopped (`fn` is then dropped).
  bool Post(absl::AnyInvocable<void()> fn);
  // Posts not yet run (LoopLoad::waiting).
  int64_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  // An exchange has its answer (Stop waits for none unanswered). No lock: the count outlives
  // the server for the exchanges that hold this mailbox.
  void Answered() { unanswered_->fetch_sub(1, std::memory_order_acq_rel); }
  // A request's headers are in (+1), or it is handed to the handler or gone (-1): Stop waits
  // for requests accepted before the drain whose body is still on its way.
  void Receiving(int delta) { receiving_->fetch_add(delta, std::memory_order_acq_rel); }
  void CloseLoop();

 private:
  absl::Mutex mu_;
  Loop* loop_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<std::atomic<int64_t>> unanswered_;
  const std::shared_ptr<std::atomic<int64_t>> receiving_;
  std::atomic<int64_t> waiting_{0};
};

// The calling loop thread's charge since it took up the input at hand (LoopLoad::charged): the
// connection zeroes it when its turn begins (its reads in a row before the loop serves another
// connection: up to 8 plain reads of 64 KiB, one TLS read). Loop threads only.
int64_t& LoopCharge();

// The largest body of the request `s` whose headers have arrived: the handler's
// (Handler::BodyLimit), at most `max_body_bytes`.
int64_t RequestBodyLimit(Handler* handler, const Stream& s, int64_t max_body_bytes);

// Counters shared by every loop (relaxed atomics; read by Server::stats()).
struct Counters {
  std::atomic<uint64_t> accepted{0}, refused{0}, read_timeouts{0}, requests{0};
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> buffered{0};  // body bytes held + answer bytes unsent, all connections
  std::array<std::atomic<uint64_t>, static_cast<int>(AbuseReason::kCount)> abuse{};

  void Count(AbuseReason reason) {
    abuse[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  // Conn::Abuse's log gate: one line per reason per second at most.
  std::array<std::atomic<int64_t>, static_cast<int>(AbuseReason::kCount)> logged_second{};
  std::array<std::atomic<uint64_t>, static_cast<int>(AbuseReason::kCount)> unlogged{};
  // Loop::Adopt's log gate for connections refused at accept: the same, one line a second.
  std::atomic<int64_t> refused_logged_second{0};
  std::atomic<uint64_t> refused_unlogged{0};
};

// A piece of response body: bytes the server does not copy, alive while `owner` is.
struct Piece {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  bool secret = false;  // a copy of it (WriteBatch) is zeroed once written
};

// Pieces in order, taken from the front: a vector and a read index (no allocation until the
// first piece, unlike std::deque).
class PieceQueue {
 public:
  bool empty() const { return head_ == pieces_.size(); }
  Piece& front() { return pieces_[head_]; }
  void push_back(Piece p) { pieces_.push_back(std::move(p)); }
  void pop_front() {
    pieces_[head_] = Piece();
    if (++head_ == pieces_.size()) clear();
  }
  void clear() {
    pieces_.clear();
    head_ = 0;
  }
  void swap(PieceQueue& other) {
    pieces_.swap(other.pieces_);
    std::swap(head_, other.head_);
  }
  Piece* begin() { return pieces_.data() + head_; }
  Piece* end() { return pieces_.data() + pieces_.size(); }
  const Piece* begin() const { return pieces_.data() + head_; }
  const Piece* end() const { return pieces_.data() + pieces_.size(); }

 private:
  std::vector<Piece> pieces_;
  size_t head_ = 0;
};

// What one write sends: bytes copied into the batch (frame headers, HTTP/1.1 heads, HEADERS
// frames) and pieces of response bodies referenced without a copy, in order. `secret` bytes
// copied in are zeroed when the batch is cleared or released (and never left in a buffer that
// growth frees).
class WriteBatch {
 public:
  ~WriteBatch() { Release(); }
  void Copy(const void* data, size_t size, bool secret = false);
  void Ref(const char* data, size_t size, const std::shared_ptr<const void>& owner,
           bool secret = false);
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // The unwritten rest as iovecs (valid until the next change).
  const std::vector<iovec>& Iov();
  // `n` more bytes were written.
  void Consume(size_t n);
  void Clear();
  // Clear, and give all memory back (an idle connection).
  void Release();

 private:
  struct Segment {
    bool own = false;   // in own_ at `offset`
    size_t offset = 0;  // own_ offset
    const char* data = nullptr;
    size_t size = 0;
  };
  std::string own_;
  std::vector<Segment> segments_;
  std::vector<std::shared_ptr<const void>> owners_;
  std::vector<iovec> iov_;
  size_t first_ = 0;       // first unwritten segment
  size_t first_done_ = 0;  // bytes of it written
  size_t size_ = 0;        // unwritten bytes
  bool secret_ = false;    // own_ holds secret bytes
};

// One request and its answer within a connection (an HTTP/2 stream, or HTTP/1.1's current
// request).
struct Stream {
  Conn* conn = nullptr;
  int32_t id = 0;  // HTTP/2 stream id; 0 on HTTP/1.1
  std::shared_ptr<Exchange> exchange;
  Clock::time_point opened;
  int64_t header_bytes = 0;
  bool header_too_large = false;
  bool streaming = false;     // the handler reads the body as it arrives
  bool dispatched = false;    // handed to the handler
  Clock::time_point dispatched_at;  // when (Conn::Dispatch)
  bool patient_reset = false;  // HTTP/2: reset by the client kPatientReset or more after that
  // HTTP/2: opened into the connection's last free stream slot (SETTINGS_MAX_CONCURRENT_STREAMS):
  // the client had calls waiting for a slot, their deadlines running, and may give up on this
  // one soon after sending it.
  bool opened_at_limit = false;
  bool slot_wait_reset = false;  // reset by the client soon after that (not a premature reset)
  Clock::time_point body_at;     // HTTP/2: opened, or its body's bytes last arrived
  bool request_done = false;  // the whole body has arrived (or the request ended early)
  bool refused = false;       // refused unread (Exchange::refusal): its body is dropped
  int64_t body_bytes = 0;     // body bytes received
  int64_t body_limit = 0;     // the largest body (Handler::BodyLimit), once the headers are in
  int64_t announced = -1;     // HTTP/2: the Content-Length header's value (-1: none, or unread)
  int64_t body_reserved = 0;  // the body buffer's room reserved from its announced length
  int64_t body_charge = 0;    // what the body costs the budgets: max(reserved, received)
  int64_t held = 0;           // request bytes charged for this stream (header text, body)
  int64_t answer_held = 0;    // answer bytes charged for this stream (Conn::ChargeAnswer)
  int32_t unconsumed = 0;     // HTTP/2: body bytes whose window is not yet given back
  int tiny_window_updates = 0;  // HTTP/2: small WINDOW_UPDATEs the client sent on this stream
  // The answer.
  bool started = false;         // status and headers known
  bool headers_sent = false;    // handed to the protocol's writer
  bool end = false;             // no more body will come
  bool done = false;            // all of it sent (or the stream is gone)
  bool reset_by_peer = false;
  bool reset_by_us = false;
  bool doomed = false;          // HTTP/2: a frame of the client's made nghttp2 reset it (its RST
                                // not sent yet): its request is not handed over
  bool head = false;            // a HEAD request: no body on the wire
  int status = 0;
  Headers headers;
  Headers trailers;
  PieceQueue out;               // body bytes not yet sent
  std::string keep;             // body bytes of the answer's own, referenced by `out`
  int64_t out_bytes = 0;
};

// What the protocols need of a connection; SocketConn (conn.cc) is the one kind.
class Conn {
 public:
  Conn(Loop* loop, Server::Impl* impl);
  virtual ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  Loop* loop() const { return loop_; }
  Server::Impl* impl() const { return impl_; }
  Protocol* protocol() const { return protocol_.get(); }
  // The loop's mailbox, for the exchanges made here.
  virtual const std::shared_ptr<Mailbox>& mailbox() const = 0;
  const Server::Options& options() const;
  Counters& counters() const;
  Handler* handler() const;

  // Output is ready: written now, or at the end of the input being processed.
  virtual void WantWrite() = 0;
  // The protocol's read wish changed (WantsRead): reading resumes or stops.
  virtual void ReadStateChanged() = 0;

  // Charges (`delta` > 0) or releases request bytes (header text, bodies) to this connection's
  // budget and the server's. The server's count moves in steps (kChargeStep, and back to exactly
  // 0), so that small requests cost no shared atomic; it lags a connection's by less than a step.
  void Charge(int64_t delta);
  // The same for answer bytes not yet sent (the answer budget, and the server's).
  void ChargeAnswer(int64_t delta);
  static constexpr int64_t kChargeStep = 4 << 10;
  int64_t held() const { return held_; }  // request bytes
  // This connection's request budget and whether it, its answer budget (answers handed over by
  // handlers included), or the server's is spent.
  int64_t budget() const;
  bool OverBudget() const;
  bool AnswersOverBudget() const { return answers_->Over(); }
  bool ServerOverBudget() const;
  const std::shared_ptr<AnswerGauge>& answers() const { return answers_; }
  // Whether this connection may take more request body bytes as far as the server's budget is
  // concerned: yes while it is not spent; past it, only for the few connections holding a
  // progress grant (kProgressGrants for the whole server, taken here if one is free), so that
  // requests under way can still complete and free their memory while the rest wait.
  bool MayTakeBody();
  bool holds_grant() const { return grant_; }
  // The grant goes back (no body under way any more, or the connection is closing).
  void ReleaseGrant();
  static constexpr int kProgressGrants = 4;
  // Whether a new request on this connection is refused, and why (kNone: taken): its answers
  // are past their budget (kAnswersUnread), its request budget is spent, or the server's is and
  // this connection already holds bytes beyond the request's own `own` (its header text): kBusy
  // (the connections that hold the memory are the ones refused; one that holds nothing else
  // still gets its request in). Counts the refusal.
  Exchange::Refusal RefuseNewRequest(int64_t own = 0);

  // A defence acted on this connection: counted, and logged (at most one line per reason per
  // second, with how many went unlogged meanwhile: an attack must not flood the log). `detail`
  // (a JSON object) joins the log line: what the defence saw.
  void Abuse(AbuseReason reason, nlohmann::json detail = nlohmann::json());

  // A request is handed to the handler (counted; Stop waits for its answer).
  void Dispatch(Stream* stream);
  // When a request was last under way (the idle timeout runs from there).
  Clock::time_point last_busy() const { return last_busy_; }
  void set_last_busy(Clock::time_point t) { last_busy_ = t; }

  const std::shared_ptr<const std::string>& peer_address() const { return peer_address_; }
  const std::shared_ptr<const std::string>& identity() const { return identity_; }
  bool tls() const { return tls_; }
  bool draining() const;
  // The drain's deadline for request bodies has passed (Server::Stop).
  bool DrainBodyDeadlinePassed(Clock::time_point now) const;

 protected:
  Loop* const loop_;
  Server::Impl* const impl_;
  std::shared_ptr<const std::string> peer_address_;
  std::shared_ptr<const std::string> identity_;  // never null (empty: none)
  bool tls_ = false;
  int64_t held_ = 0;         // request bytes
  int64_t answer_held_ = 0;  // answer bytes (also in answers_)
  int64_t reported_ = 0;     // what the server's count has of held_ + answer_held_
  std::shared_ptr<AnswerGauge> answers_;
  bool grant_ = false;    // holds one of the server's progress grants
  Clock::time_point last_busy_ = Clock::now();
  std::unique_ptr<Protocol> protocol_;
};

// One protocol on one connection: HTTP/1.1 (http1.cc) or HTTP/2 (http2.cc).
class Protocol {
 public:
  virtual ~Protocol() = default;
  // Bytes from the client. False: the connection must end (after what Collect still gives).
  virtual bool Receive(const char* data, size_t size) = 0;
  // Adds what is ready to send to `batch`.
  virtual void Collect(WriteBatch* batch) = 0;
  // `bytes` of answer data were written to the socket (budget release).
  virtual void Written(size_t bytes) {}
  // Close once the output is written.
  virtual bool WantsClose() const = 0;
  // Read more (false while HTTP/1.1 answers, or while a budget holds body bytes back).
  virtual bool WantsRead() const = 0;
  // A request is under way (not idle).
  virtual bool Busy() const = 0;
  // A request body is under way and it is the client's turn to send (not held back by us):
  // `since` is when body bytes last arrived (the read timeout runs from there).
  virtual bool AwaitingBody(Clock::time_point* since) const = 0;
  // The client sent FIN (or reset): the connection ends once what is owed is written.
  virtual void PeerClosed() = 0;
  // The connection is quiet: memory kept for the next request (buffers' capacity, spare
  // streams) may go.
  virtual void Trim() {}
  // HTTP/1.1 request headers have begun and are not whole (they must be within the read timeout).
  virtual bool InHeaders() const { return false; }
  // Answer bytes wait on the client (send timeout).
  virtual bool OutputBlocked() const = 0;
  // A response part for `stream` (loop thread).
  virtual void Deliver(Stream* stream, Exchange::Part part) = 0;
  // Drain: no new requests; answer those in flight; then close.
  virtual void Drain() = 0;
  // Periodic (each sweep): a budget may have room again, a drain's second GOAWAY.
  virtual void Tick(Clock::time_point now) {}
  // The connection is gone: every exchange abandoned, every charge released.
  virtual void Closed() = 0;
};

std::unique_ptr<Protocol> MakeHttp1(Conn* conn);
// The client's connection preface is part of the input to come.
std::unique_ptr<Protocol> MakeHttp2(Conn* conn);

// Everything that touches an Exchange's insides (loop thread).
struct Access {
  static Exchange& Fill(Exchange& e, Conn* conn, Stream* stream, int version);
  static void SetMethod(Exchange& e, absl::string_view method);
  // `target`: path and query.
  static void SetTarget(Exchange& e, absl::string_view target);
  static void AddHeader(Exchange& e, absl::string_view name, absl::string_view value,
                        bool lower_name);
  static std::string& body(Exchange& e) { return e.body_; }
  // Appends request body bytes (a growing buffer's old copy is zeroed before it is freed).
  static void AppendBody(Exchange& e, absl::string_view data);
  static void SetDispatched(Exchange& e) {
    StopReceiving(e);
    e.dispatched_.store(true, std::memory_order_release);
  }
  // Its headers are in and it is accepted: counted as arriving until it is handed over or gone
  // (StopReceiving, once), so that Stop answers it. A request whose headers never end is not.
  static void StartReceiving(Exchange& e);
  static void StopReceiving(Exchange& e);
  static void SetRefusal(Exchange& e, Exchange::Refusal why) { e.refusal_ = why; }
  // Exchange::SetDeadline's deadline, or InfiniteFuture.
  static absl::Time Deadline(const Exchange& e);
  // After Handle (or a refusal): the body's memory goes, zeroed if it may hold a secret.
  static void ReleaseBody(Exchange& e);
  static bool Streaming(const Exchange& e) { return e.reader_ != nullptr; }
  static void Read(Exchange& e, absl::string_view data, bool end);
  // The request is over (answered, or its client or connection gone).
  static void Detach(Exchange& e);
  // Its client is gone, but an answer may still be written.
  static void Abandon(Exchange& e) { e.abandoned_.store(true, std::memory_order_release); }
  static void SetUnsent(Exchange& e, int64_t bytes) {
    e.unsent_.store(bytes, std::memory_order_relaxed);
  }
  static void Deliver(Exchange& e, Exchange::Part part);

 private:
  static Exchange::Span Append(Exchange& e, absl::string_view s);
};

// A request body's cost to the budgets: `reserved` bytes of room, `received` more bytes arrived;
// the charge is the larger of the two totals. Released whole when the body goes.
void ChargeBody(Conn* conn, Stream* s, int64_t reserved, int64_t received);
void ReleaseBodyCharge(Conn* conn, Stream* s);

// A response part's bytes as pieces (data first, then the shared views). With `keep`, an empty
// string the caller keeps until the pieces are written, the part's own data moves there and is
// referenced without an owner (no allocation).
void AppendPieces(Exchange::Part& part, PieceQueue* out, int64_t* bytes,
                  std::string* keep = nullptr);

// The `date` header value for now (cached per second, per thread).
absl::string_view HttpDate();
const char* ReasonPhrase(int status);

}  // namespace internal

struct Server::Impl {
  Impl(const Options& options, Handler* handler);
  ~Impl();

  const Options& options;
  Handler* const handler;
  // The address the log lines name (http_abuse, connection_refused): options.address, with the
  // port bound in place of port 0 (two ports asked for port 0 would both say ":0"). Set by Start
  // before the loops run; read-only after.
  std::string address;
  internal::Counters counters;
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};
  // The drain's deadline for request bodies (Clock ticks since its epoch; 0: none yet): a
  // request whose body is still arriving then is refused (Exchange::Refusal::kDraining).
  std::atomic<int64_t> drain_body_deadline{0};
  std::atomic<int> grants{0};  // progress grants held (Conn::MayTakeBody)
  std::vector<std::unique_ptr<internal::Loop>> loops;
  struct Io;  // the acceptor and TLS context (server.cc)
  std::unique_ptr<Io> io;
  bool started = false, drained = false, stopped = false;

  // Requests handed to the handler and not yet answered (Stop waits for none); shared with the
  // mailboxes, so that an answer after the server is gone still has a count to lower.
  const std::shared_ptr<std::atomic<int64_t>> unanswered =
      std::make_shared<std::atomic<int64_t>>(0);
  // Requests whose headers are in, not yet handed to the handler nor gone (Stop waits for none: a
  // request accepted before the drain is answered, also when its body was still arriving).
  const std::shared_ptr<std::atomic<int64_t>> receiving =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace offload::httpd

#endif  // SERVICE_HTTPD_INTERNAL_ENGINE_H_
