// Connections on Boost.Asio: the socket (plain, or TLS through asio::ssl), the protocol chosen by
// ALPN or by the first bytes (the HTTP/2 client preface, else HTTP/1.1), reads fed to the
// protocol, its output written in one gathered write, timeouts from the loop's sweep, and a
// lingering close (our side shut, the client's last bytes read and dropped) so that an answer
// sent before a request was whole is not lost to a reset.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "service/common/log.h"
#include "service/httpd/internal/loop.h"

namespace offload::httpd::internal {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;

thread_local Loop* current_loop = nullptr;
thread_local int64_t loop_charge = 0;

constexpr absl::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const std::shared_ptr<const std::string>& NoIdentity() {
  static const auto* none = new std::shared_ptr<const std::string>(std::make_shared<std::string>());
  return *none;
}

Clock::duration Chrono(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

std::string FormatPeer(const tcp::endpoint& ep) {
  const asio::ip::address a = ep.address();
  if (a.is_v6()) return absl::StrCat("ipv6:[", a.to_string(), "]:", ep.port());
  return absl::StrCat("ipv4:", a.to_string(), ":", ep.port());
}

}  // namespace

class SocketConn final : public Conn, public std::enable_shared_from_this<SocketConn> {
 public:
  SocketConn(Loop* loop, tcp::socket socket, ssl::context* tls)
      : Conn(loop, loop->impl()), since_(Clock::now()) {
    error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    peer_address_ = std::make_shared<const std::string>(ec ? std::string("unknown") : FormatPeer(peer));
    identity_ = NoIdentity();
    socket.non_blocking(true, ec);
    if (tls != nullptr) {
      tls_stream_ = std::make_unique<ssl::stream<tcp::socket>>(std::move(socket), *tls);
      tls_ = true;
      state_ = State::kHandshake;
    } else {
      plain_.emplace(std::move(socket));
      state_ = State::kDetect;
    }
    last_read_ = last_write_ = since_;
  }

  const std::shared_ptr<Mailbox>& mailbox() const override { return loop_->mailbox(); }

  void Start() {
    if (tls_stream_ != nullptr) {
      auto self = shared_from_this();
      tls_stream_->async_handshake(ssl::stream_base::server,
                                   [self](const error_code& ec) { self->OnHandshake(ec); });
      return;
    }
    ArmRead();
  }

  // Loop's sweep: timeouts, budgets, drain steps.
  void Sweep(Clock::time_point now) {
    const Server::Options& o = options();
    switch (state_) {
      case State::kClosed:
        return;
      case State::kHandshake:
        if (now - since_ >= Chrono(o.read_timeout)) {
          counters().read_timeouts.fetch_add(1, std::memory_order_relaxed);
          Close();
        }
        return;
      case State::kLinger:
        if (now - linger_since_ >= std::min(Chrono(o.read_timeout), Clock::duration(std::chrono::seconds(2)))) {
          Close();
        }
        return;
      case State::kDetect:
        if (!detect_.empty() && now - since_ >= Chrono(o.read_timeout)) {
          counters().read_timeouts.fetch_add(1, std::memory_order_relaxed);
          Close();
        } else if (detect_.empty() && now - since_ >= Chrono(o.idle_timeout)) {
          Close();
        }
        return;
      case State::kOpen:
        break;
    }
    Protocol* p = protocol_.get();
    p->Tick(now);
    if (state_ != State::kOpen) return;
    // Request headers must be whole within the read timeout of their first byte (seen here).
    if (p->InHeaders()) {
      if (headers_since_ == Clock::time_point()) headers_since_ = now;
      if (now - headers_since_ >= Chrono(o.read_timeout)) return ReadTimeout();
    } else {
      headers_since_ = Clock::time_point();
    }
    // A body that makes no progress (the client's: not one we hold back).
    Clock::time_point body_since;
    if (p->AwaitingBody(&body_since) && now - body_since >= Chrono(o.read_timeout)) {
      return ReadTimeout();
    }
    // An answer the client does not take.
    const bool blocked = writing_ || p->OutputBlocked();
    if (!blocked) {
      stall_since_ = Clock::time_point();
    } else if (stall_since_ == Clock::time_point() || last_write_ > stall_since_) {
      stall_since_ = now;
    } else if (now - stall_since_ >= Chrono(o.send_timeout)) {
      Abuse(AbuseReason::kSendTimeout);
      Close();
      return;
    }
    if (plain_.has_value()) MaybeCool(now);
    // Idle: no request under way for the idle timeout, from the last one (PINGs and other
    // frames do not keep a connection; HTTP/2: GOAWAY first).
    if (p->Busy() || p->InHeaders() || blocked) set_last_busy(now);
    if (!idle_closing_ && now - last_busy() >= Chrono(o.idle_timeout)) {
      idle_closing_ = true;
      p->Drain();
    }
    Pump();
  }

  void Drain() {
    if (state_ == State::kOpen) {
      protocol_->Drain();
      Pump();
    } else if (state_ == State::kDetect && detect_.empty()) {
      Close();
    }
  }

  // The loop stops: idle connections close now, busy ones once their answers are out.
  void StopIfIdle() {
    if (state_ != State::kOpen || (!protocol_->Busy() && batch_.empty())) Close();
  }

  void Close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    if (protocol_ != nullptr) protocol_->Closed();
    batch_.Clear();
    error_code ec;
    lowest().close(ec);  // pending operations end with operation_aborted
    counters().open.fetch_sub(1, std::memory_order_relaxed);
    loop_->Remove(this);  // the last owner may be a pending handler
  }

  // Conn
  void WantWrite() override {
    if (in_feed_) {
      want_write_ = true;  // written once the input at hand is processed: one write
      return;
    }
    Pump();
  }
  void ReadStateChanged() override {
    if (!pumping_ && !in_feed_) ArmRead();
  }

 private:
  enum class State { kHandshake, kDetect, kOpen, kLinger, kClosed };

  tcp::socket& lowest() { return plain_.has_value() ? *plain_ : tls_stream_->next_layer(); }

  bool WantsRead() const {
    switch (state_) {
      case State::kDetect:
      case State::kLinger:
        return !peer_eof_;
      case State::kOpen:
        return !peer_eof_ && protocol_->WantsRead();
      default:
        return false;
    }
  }

  void OnHandshake(const error_code& ec) {
    if (state_ != State::kHandshake) return;
    if (ec) {
      Close();
      return;
    }
    SSL* ssl = tls_stream_->native_handle();
    const unsigned char* alpn = nullptr;
    unsigned alpn_len = 0;
    SSL_get0_alpn_selected(ssl, &alpn, &alpn_len);
    const bool h2 = alpn_len == 2 && std::memcmp(alpn, "h2", 2) == 0;
    if (options().peer_identity) {
      identity_ = std::make_shared<const std::string>(
          options().peer_identity(SSL_get0_peer_certificate(ssl)));
    }
    protocol_ = h2 ? MakeHttp2(this) : MakeHttp1(this);
    state_ = State::kOpen;
    last_read_ = Clock::now();
    ArmRead();
  }

  void ArmRead() {
    if (reading_ || !WantsRead()) return;
    if (plain_.has_value() || state_ == State::kLinger) {
      ReadPlain();  // lingering on TLS too: the raw bytes are read and dropped
      return;
    }
    if (tls_buffer_.empty()) tls_buffer_.resize(16 << 10);
    reading_ = true;
    auto self = shared_from_this();
    tls_stream_->async_read_some(asio::buffer(tls_buffer_),
                                 [self](const error_code& ec, size_t n) {
                                   self->reading_ = false;
                                   self->OnTlsRead(ec, n);
                                 });
  }

  // Reads of one connection in a row (a turn) before the loop's other connections get theirs.
  static constexpr int kReadsPerTurn = 8;

  // Plain sockets. What is there now is read into the loop's 64 KiB buffer and processed at
  // once (ReadPlain), until a short read says the socket is drained; then the next read is armed
  // (ArmPlain), one of two ways:
  //  - cold (an idle connection, or one that has read once): a wait without a buffer, so that
  //    idle connections hold none. Asio re-arms epoll for a wait: one epoll_ctl.
  //  - hot (a connection in use): Asio's own receive into a small buffer of the connection's.
  //    Asio reads when epoll reports the socket and calls us at once, and after a short read it
  //    re-arms without a system call: a request costs epoll_wait, a read and a write. A hot
  //    connection that reads nothing for a second gives its buffer back (Sweep).
  // `reading_` is set while a read or wait is under way, so that what the input sets off (Pump,
  // ArmRead) never starts a second one.
  // `new_turn`: the connection's turn on the loop begins here (its reads in a row, up to
  // kReadsPerTurn, before the other connections are served): the handlers' charge for the loop
  // (LoopLoad::charged) starts afresh. False when it goes on with a turn begun by a hot read.
  void ReadPlain(bool new_turn = true) {
    reading_ = true;
    if (new_turn) LoopCharge() = 0;
    for (int i = 0; i < kReadsPerTurn; ++i) {
      if (!WantsRead()) {
        reading_ = false;
        return;
      }
      error_code ec;
      const size_t n =
          lowest().read_some(asio::buffer(loop_->read_buffer(), loop_->read_buffer_size()), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        ArmPlain();
        return;
      }
      if (ec == asio::error::interrupted) continue;
      if (ec) {
        reading_ = false;
        OnReadEnd(ec);
        return;
      }
      Feed(loop_->read_buffer(), n);
      if (state_ == State::kClosed) {
        reading_ = false;
        return;
      }
      if (n < loop_->read_buffer_size()) {
        // A short read took all there was: wait for more rather than ask again (epoll is
        // edge-triggered, and new bytes are a new edge). Saves a read that would fail.
        ArmPlain();
        return;
      }
    }
    // More may be waiting: the other connections of the loop get their turn first.
    auto self = shared_from_this();
    asio::post(loop_->ctx(), [self] {
      self->reading_ = false;
      self->ReadPlain();
    });
  }

  // REQUIRES: reading_ (a read is under way, and this ends it with a wait or a receive).
  void ArmPlain() {
    if (!WantsRead()) {
      reading_ = false;
      return;
    }
    auto self = shared_from_this();
    if (reads_ >= 2 && hot_buffer_ == nullptr && plain_.has_value() && state_ == State::kOpen) {
      hot_buffer_ = loop_->TakeReadBuffer();
    }
    if (hot_buffer_ != nullptr && state_ == State::kOpen) {
      plain_->async_receive(asio::buffer(hot_buffer_.get(), Loop::kHotBufferBytes),
                            [self](const error_code& ec, size_t n) { self->OnHotRead(ec, n); });
      return;
    }
    lowest().async_wait(tcp::socket::wait_read, [self](const error_code& ec) {
      self->reading_ = false;
      if (ec) {
        if (ec != asio::error::operation_aborted) self->Close();
        return;
      }
      self->ReadPlain();
    });
  }

  void OnHotRead(const error_code& ec, size_t n) {
    if (ec == asio::error::operation_aborted && cooling_ && state_ != State::kClosed) {
      // Cooled by the sweep: the buffer goes back, the connection waits without one.
      cooling_ = false;
      reads_ = 0;
      loop_->GiveReadBuffer(std::move(hot_buffer_));
      hot_buffer_ = nullptr;
      if (!writing_ && batch_.empty()) {
        batch_.Release();
        if (!protocol_->Busy()) protocol_->Trim();
      }
      reading_ = true;
      ArmPlain();
      return;
    }
    cooling_ = false;
    if (ec) {
      reading_ = false;
      if (ec != asio::error::operation_aborted) OnReadEnd(ec);
      return;
    }
    LoopCharge() = 0;  // a turn of this connection's begins (ReadPlain)
    Feed(hot_buffer_.get(), n);
    if (state_ == State::kClosed) {
      reading_ = false;
      return;
    }
    if (n == Loop::kHotBufferBytes) {
      ReadPlain(/*new_turn=*/false);  // a big request: the rest through the loop's buffer
    } else {
      ArmPlain();
    }
  }

  // Sweep: a hot connection idle for a second gives its buffer back.
  void MaybeCool(Clock::time_point now) {
    if (hot_buffer_ == nullptr || cooling_ || writing_ || !reading_ ||
        now - last_read_ < std::chrono::seconds(1)) {
      return;
    }
    cooling_ = true;
    error_code ec;
    plain_->cancel(ec);  // the pending receive ends with operation_aborted (OnHotRead)
  }

  void OnTlsRead(const error_code& ec, size_t n) {
    if (state_ == State::kClosed) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) OnReadEnd(ec);
      return;
    }
    LoopCharge() = 0;  // one read is a turn under TLS (the next one is queued behind the others)
    Feed(tls_buffer_.data(), n);
    ArmRead();
  }

  void OnReadEnd(const error_code& ec) {
    if (state_ == State::kLinger || state_ == State::kDetect || state_ == State::kHandshake) {
      Close();
      return;
    }
    if (ec == asio::error::eof && protocol_->Busy()) {
      // A client that shut its side may still read what is owed.
      peer_eof_ = true;
      protocol_->PeerClosed();
      Pump();
      return;
    }
    Close();
  }

  void Feed(const char* data, size_t n) {
    last_read_ = Clock::now();
    trimmed_ = false;
    if (reads_ < 2) ++reads_;  // a second read with data makes a plain connection hot
    if (state_ == State::kLinger) return;  // dropped
    std::string detected;
    if (state_ == State::kDetect) {
      detect_.append(data, n);
      const size_t m = std::min(detect_.size(), kPreface.size());
      const bool h2 = detect_.compare(0, m, kPreface.data(), m) == 0;
      if (h2 && detect_.size() < kPreface.size()) return;  // the preface so far: more to come
      protocol_ = h2 ? MakeHttp2(this) : MakeHttp1(this);
      state_ = State::kOpen;
      detected.swap(detect_);
      data = detected.data();
      n = detected.size();
    }
    in_feed_ = true;
    protocol_->Receive(data, n);
    in_feed_ = false;
    want_write_ = false;
    Pump();
  }

  // Writes what the protocol has (one gathered write), and closes when it is done.
  void Pump() {
    if (pumping_) {
      again_ = true;
      return;
    }
    pumping_ = true;
    do {
      again_ = false;
      if (state_ != State::kOpen || writing_) break;
      if (batch_.empty()) protocol_->Collect(&batch_);
      if (!batch_.empty()) {
        if (!Write()) break;  // waits for the socket; its completion pumps again
        again_ = true;        // written: the protocol may have more
        continue;
      }
      if (protocol_->WantsClose()) {
        BeginClose();
        break;
      }
      if (hot_buffer_ == nullptr && !trimmed_ && !protocol_->Busy()) {
        // A quiet connection that is not hot keeps nothing for the next request: idle
        // connections cost their socket and state, not buffers. Once per quiet spell.
        trimmed_ = true;
        batch_.Release();
        protocol_->Trim();
      }
      if (loop_->stopping() && !protocol_->Busy()) {
        Close();
        break;
      }
    } while (again_);
    pumping_ = false;
    if (state_ == State::kOpen || state_ == State::kLinger) ArmRead();
  }

  // True when the whole batch is written.
  bool Write() {
    if (tls_stream_ != nullptr) {
      writing_ = true;
      buffers_.clear();
      for (const iovec& v : batch_.Iov()) buffers_.emplace_back(v.iov_base, v.iov_len);
      auto self = shared_from_this();
      asio::async_write(*tls_stream_, buffers_, [self](const error_code& ec, size_t n) {
        self->writing_ = false;
        if (ec) {
          if (ec != asio::error::operation_aborted) self->Close();
          return;
        }
        self->Wrote(n);
        self->Pump();
      });
      return false;
    }
    const int fd = plain_->native_handle();
    while (!batch_.empty()) {
      const std::vector<iovec>& iov = batch_.Iov();
      msghdr msg{};
      msg.msg_iov = const_cast<iovec*>(iov.data());
      msg.msg_iovlen = iov.size();
      const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (n > 0) {
        Wrote(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        writing_ = true;
        auto self = shared_from_this();
        plain_->async_wait(tcp::socket::wait_write, [self](const error_code& ec) {
          self->writing_ = false;
          if (ec) {
            if (ec != asio::error::operation_aborted) self->Close();
            return;
          }
          self->Pump();
        });
        return false;
      }
      Close();  // the peer is gone
      return false;
    }
    return true;
  }

  void Wrote(size_t n) {
    last_write_ = Clock::now();
    batch_.Consume(n);
    if (batch_.empty()) {
      batch_.Clear();
      protocol_->Written(n);
    }
  }

  // Our side is done: shut it and read the client's last bytes (dropped) until it closes, or
  // for a moment; then close. So an answer sent before its request was whole (a 431, a body
  // over the limit) reaches the client instead of being lost to a reset. On TLS the raw bytes
  // are read and dropped the same way (the client sees the end of TCP, not a close_notify).
  void BeginClose() {
    if (peer_eof_ || loop_->stopping()) {
      Close();
      return;
    }
    error_code ec;
    lowest().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      Close();
      return;
    }
    protocol_->Closed();
    state_ = State::kLinger;
    linger_since_ = Clock::now();
  }

  void ReadTimeout() {
    counters().read_timeouts.fetch_add(1, std::memory_order_relaxed);
    Close();
  }

  State state_;
  std::optional<tcp::socket> plain_;
  std::unique_ptr<ssl::stream<tcp::socket>> tls_stream_;  // TLS: owns the socket
  std::vector<char> tls_buffer_;
  std::vector<asio::const_buffer> buffers_;
  std::string detect_;
  WriteBatch batch_;
  bool reading_ = false;
  bool writing_ = false;
  bool in_feed_ = false;
  bool want_write_ = false;
  bool pumping_ = false;
  bool again_ = false;
  bool peer_eof_ = false;
  bool idle_closing_ = false;
  bool cooling_ = false;
  bool trimmed_ = false;  // Trim has run since the last bytes came
  int reads_ = 0;  // reads since the connection last went cold
  Loop::ReadBuffer hot_buffer_;
  Clock::time_point since_, last_read_, last_write_, headers_since_, stall_since_, linger_since_;
};

// ---------------------------------------------------------------------------------------------
// Loop

Loop::Loop(Server::Impl* impl, ssl::context* tls)
    : impl_(impl),
      tls_(tls),
      sweep_timer_(ctx_),
      mailbox_(std::make_shared<Mailbox>(this, impl->unanswered, impl->receiving)),
      read_buffer_(64 << 10) {
  work_.emplace(ctx_.get_executor());
}

Loop::~Loop() {
  mailbox_->CloseLoop();
  Join();
}

Loop* Loop::Current() { return current_loop; }

int64_t& LoopCharge() { return loop_charge; }

void Loop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Loop::Join() {
  if (thread_.joinable()) thread_.join();
}

void Loop::Run() {
  current_loop = this;
  pthread_setname_np(pthread_self(), "http-loop");  // in profiles and /proc/<pid>/task
  ArmSweep();
  ctx_.run();
  mailbox_->CloseLoop();
  // What is left (a stop past its grace) closes now.
  std::vector<std::shared_ptr<SocketConn>> left;
  for (auto& [p, c] : conns_) left.push_back(c);
  for (auto& c : left) c->Close();
  conns_.clear();
  current_loop = nullptr;
}

void Loop::ArmSweep() {
  const Server::Options& o = impl_->options;
  absl::Duration period = std::min({o.read_timeout, o.idle_timeout, o.send_timeout}) / 4;
  period = std::clamp(period, absl::Milliseconds(10), absl::Milliseconds(250));
  sweep_timer_.expires_after(Chrono(period));
  sweep_timer_.async_wait([this](const error_code& ec) {
    if (ec) return;
    Sweep();
    ArmSweep();
  });
}

void Loop::Sweep() {
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<SocketConn>> all;
  all.reserve(conns_.size());
  for (auto& [p, c] : conns_) all.push_back(c);
  const bool grace_over = stopping_ && now - stop_started_ >= std::chrono::seconds(1);
  for (auto& c : all) {
    if (grace_over) {
      c->Close();
    } else {
      c->Sweep(now);
    }
  }
  MaybeExit();
}

void Loop::Adopt(tcp::socket socket) {
  Counters& counters = impl_->counters;
  counters.accepted.fetch_add(1, std::memory_order_relaxed);
  const int max = impl_->options.max_connections;
  if (draining_ || (max > 0 && counters.open.load(std::memory_order_relaxed) >= max)) {
    if (!draining_) {
      counters.refused.fetch_add(1, std::memory_order_relaxed);
      // A limit reached is a log line too: at most one a second (a connection flood must not
      // flood the log), saying how many went unlogged since the last.
      const int64_t second = static_cast<int64_t>(time(nullptr));
      int64_t last = counters.refused_logged_second.load(std::memory_order_relaxed);
      if (last != second && counters.refused_logged_second.compare_exchange_strong(
                                last, second, std::memory_order_relaxed)) {
        Log(LogLevel::kWarning, "connection_refused",
            {{"address", impl_->address},
             {"max_connections", max},
             {"unlogged_since_last",
              counters.refused_unlogged.exchange(0, std::memory_order_relaxed)}});
      } else {
        counters.refused_unlogged.fetch_add(1, std::memory_order_relaxed);
      }
    }
    error_code ec;
    socket.close(ec);
    return;
  }
  error_code ec;
  socket.set_option(tcp::no_delay(impl_->options.tcp_nodelay), ec);
  counters.open.fetch_add(1, std::memory_order_relaxed);
  auto conn = std::make_shared<SocketConn>(this, std::move(socket), tls_);
  SocketConn* raw = conn.get();
  conns_.emplace(raw, std::move(conn));
  raw->Start();
}

void Loop::UnmapBuffer::operator()(char* p) const {
  if (p != nullptr) munmap(p, kHotBufferBytes);
}

Loop::ReadBuffer Loop::TakeReadBuffer() {
  if (!free_buffers_.empty()) {
    ReadBuffer b = std::move(free_buffers_.back());
    free_buffers_.pop_back();
    return b;
  }
  // A page of its own: given back to the kernel when the connection cools (a heap block would
  // stay in the process after free).
  void* p = mmap(nullptr, kHotBufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  return ReadBuffer(p == MAP_FAILED ? nullptr : static_cast<char*>(p));
}

void Loop::GiveReadBuffer(ReadBuffer buffer) {
  constexpr size_t kMaxFreeBuffers = 32;
  if (buffer != nullptr && free_buffers_.size() < kMaxFreeBuffers) {
    free_buffers_.push_back(std::move(buffer));
  }
}

void Loop::Remove(SocketConn* conn) {
  auto it = conns_.find(conn);
  if (it == conns_.end()) return;
  // Freed once the handlers that still hold it have run.
  std::shared_ptr<SocketConn> keep = std::move(it->second);
  conns_.erase(it);
  asio::post(ctx_, [keep] {});
  MaybeExit();
}

void Loop::Drain() {
  if (draining_) return;
  draining_ = true;
  std::vector<std::shared_ptr<SocketConn>> all;
  for (auto& [p, c] : conns_) all.push_back(c);
  for (auto& c : all) c->Drain();
}

void Loop::Stop() {
  Drain();
  stopping_ = true;
  stop_started_ = Clock::now();
  std::vector<std::shared_ptr<SocketConn>> all;
  for (auto& [p, c] : conns_) all.push_back(c);
  for (auto& c : all) c->StopIfIdle();
  MaybeExit();
}

void Loop::MaybeExit() {
  if (!stopping_ || !conns_.empty()) return;
  sweep_timer_.cancel();
  work_.reset();
  ctx_.stop();
}

}  // namespace offload::httpd::internal
