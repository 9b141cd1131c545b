#include "service/httpd/server.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "service/common/secret_bytes.h"
#include "service/httpd/internal/engine.h"
#include "service/httpd/internal/loop.h"

namespace offload::httpd {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using internal::Access;
using internal::Loop;

namespace internal {

bool Mailbox::Post(absl::AnyInvocable<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (loop_ == nullptr) return false;
  waiting_.fetch_add(1, std::memory_order_relaxed);
  asio::post(loop_->ctx(), [this, fn = std::move(fn)]() mutable {
    // The mailbox outlives its loop's queue: the loop closes it before it is destroyed.
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    fn();
  });
  return true;
}

void Mailbox::CloseLoop() {
  absl::MutexLock lock(&mu_);
  loop_ = nullptr;
}

namespace {

// "host:port" or "[v6]:port" -> the first address it names.
absl::StatusOr<tcp::endpoint> ParseAddress(const std::string& address) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("address: expected [ipv6]:port, got \"", address, "\""));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("address: expected host:port, got \"", address, "\""));
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: expected a port 0-65535, got \"", port, "\""));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  tcp::endpoint endpoint;
  std::memcpy(endpoint.data(), found->ai_addr, found->ai_addrlen);
  endpoint.resize(found->ai_addrlen);
  freeaddrinfo(found);
  return endpoint;
}

// ALPN: h2 first, then http/1.1.
int SelectAlpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
               unsigned int inlen, void*) {
  static const unsigned char kProtocols[] = "\x02h2\x08http/1.1";
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kProtocols, sizeof(kProtocols) - 1, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;  // no common protocol: HTTP/1.1 without ALPN
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace
}  // namespace internal

LoopLoad CurrentLoopLoad() {
  Loop* loop = Loop::Current();
  if (loop == nullptr) return LoopLoad{};
  return LoopLoad{true, internal::LoopCharge(), loop->mailbox()->waiting()};
}

void ChargeLoop(int64_t amount) {
  if (Loop::Current() != nullptr) internal::LoopCharge() += amount;
}

// ---------------------------------------------------------------------------------------------
// Exchange

Exchange::Exchange(internal::Loop* loop, std::shared_ptr<internal::Mailbox> mailbox)
    : loop_(loop), mailbox_(std::move(mailbox)) {}
Exchange::~Exchange() {
  // A handler that let go of a request without answering it (a stream whose client went away)
  // still lets Stop() finish.
  CountAnswered();
  internal::Access::StopReceiving(*this);
  if (secret_) WipeString(&body_);
}

void Exchange::CountAnswered() {
  if (dispatched_.load(std::memory_order_acquire) &&
      !counted_.exchange(true, std::memory_order_acq_rel)) {
    mailbox_->Answered();
  }
}

void Exchange::Send(Part part) {
  // Counted at once, on this thread, as the connection's unsent answer bytes (until
  // Access::Deliver hands them to the loop's count), so that a handler deciding whether to
  // compute another answer sees this one (answers_over_budget).
  const int64_t size = static_cast<int64_t>(part.size());
  if (answers_ != nullptr) answers_->bytes.fetch_add(size, std::memory_order_relaxed);
  // Parts keep their order: once one went through the mailbox, the rest follow it there.
  if (Loop::Current() == loop_ && in_mail_.load(std::memory_order_acquire) == 0) {
    Access::Deliver(*this, std::move(part));
    return;
  }
  in_mail_.fetch_add(1, std::memory_order_acq_rel);
  const bool posted = mailbox_->Post([self = shared_from_this(), part = std::move(part)]() mutable {
    self->in_mail_.fetch_sub(1, std::memory_order_acq_rel);
    Access::Deliver(*self, std::move(part));
  });
  if (!posted) {  // the loop is gone: the part is dropped
    in_mail_.fetch_sub(1, std::memory_order_acq_rel);
    if (answers_ != nullptr) answers_->bytes.fetch_sub(size, std::memory_order_relaxed);
  }
}

void Exchange::Respond(Response response) {
  if (started_.exchange(true, std::memory_order_acq_rel)) return;
  finished_.store(true, std::memory_order_release);
  Part part;
  part.start = part.end = true;
  part.status = response.status;
  part.headers = std::move(response.headers);
  part.data = std::move(response.body);
  part.shared = std::move(response.shared_body);
  part.owner = std::move(response.owner);
  part.trailers = std::move(response.trailers);
  part.secret = response.secret;
  Send(std::move(part));
  // Counted once written or queued to the loop ahead of any stop, so that Stop() never closes
  // a connection before its answer.
  CountAnswered();
}

void Exchange::StartResponse(int status, Headers headers) {
  if (started_.exchange(true, std::memory_order_acq_rel)) return;
  Part part;
  part.start = true;
  part.status = status;
  part.headers = std::move(headers);
  Send(std::move(part));
}

void Exchange::Write(std::string data) {
  if (!started_.load(std::memory_order_acquire) || finished_.load(std::memory_order_acquire) ||
      abandoned()) {
    return;
  }
  unsent_.fetch_add(static_cast<int64_t>(data.size()), std::memory_order_relaxed);
  Part part;
  part.data = std::move(data);
  Send(std::move(part));
}

void Exchange::Finish(Headers trailers) { Finish(std::move(trailers), std::string()); }

void Exchange::Finish(Headers trailers, std::string last_data) {
  if (!started_.load(std::memory_order_acquire)) return;
  if (finished_.exchange(true, std::memory_order_acq_rel)) return;
  Part part;
  part.end = true;
  part.trailers = std::move(trailers);
  if (!last_data.empty()) {
    unsent_.fetch_add(static_cast<int64_t>(last_data.size()), std::memory_order_relaxed);
    part.data = std::move(last_data);
  }
  Send(std::move(part));
  CountAnswered();
}

// ---------------------------------------------------------------------------------------------
// Server

struct Server::Impl::Io {
  std::unique_ptr<asio::ssl::context> tls;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> retry;
  size_t next = 0;
};

Server::Impl::Impl(const Options& options, Handler* handler)
    : options(options), handler(handler), address(options.address) {}
Server::Impl::~Impl() = default;

namespace {

void Accept(Server::Impl* impl) {
  Server::Impl::Io& io = *impl->io;
  if (io.acceptor == nullptr) return;
  Loop* target = impl->loops[io.next++ % impl->loops.size()].get();
  io.acceptor->async_accept(target->ctx(), [impl, target](const error_code& ec, tcp::socket s) {
    Server::Impl::Io& io = *impl->io;
    if (ec == asio::error::operation_aborted || io.acceptor == nullptr) return;
    if (ec) {
      // Out of descriptors or memory: try again in a moment rather than spin.
      io.retry->expires_after(std::chrono::milliseconds(50));
      io.retry->async_wait([impl](const error_code& e) {
        if (!e && impl->io->acceptor->is_open()) Accept(impl);
      });
      return;
    }
    asio::post(target->ctx(), [target, s = std::move(s)]() mutable { target->Adopt(std::move(s)); });
    Accept(impl);
  });
}

}  // namespace

Server::Server(Options options, Handler* handler)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_, handler)) {}

Server::~Server() {
  Stop(absl::Now());
  // Answers that come later find no loop.
  for (auto& loop : impl_->loops) loop->mailbox()->CloseLoop();
  if (impl_->io != nullptr && !impl_->loops.empty()) {
    // The acceptor belongs to loop 0's context, which the loops below take with them.
    impl_->io->retry.reset();
    impl_->io->acceptor.reset();
  }
  impl_->loops.clear();
}

absl::Status Server::Start() {
  Impl& impl = *impl_;
  if (impl.started) return absl::FailedPreconditionError("http server: already started");
  impl.started = true;
  // A peer that resets a connection must not kill the process on the next write.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<tcp::endpoint> endpoint = internal::ParseAddress(options_.address);
  if (!endpoint.ok()) return endpoint.status();

  impl.io = std::make_unique<Impl::Io>();
  if (options_.configure_tls) {
    impl.io->tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    SSL_CTX* ctx = impl.io->tls->native_handle();
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_CLEANSE_PLAINTEXT);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    static const unsigned char kSessionContext[] = "crypto-offload";
    SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof(kSessionContext) - 1);
    if (absl::Status s = options_.configure_tls(ctx); !s.ok()) return s;
    SSL_CTX_set_alpn_select_cb(ctx, &internal::SelectAlpn, nullptr);
  }

  int threads = options_.threads;
  if (threads <= 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  }
  for (int i = 0; i < threads; ++i) {
    impl.loops.push_back(std::make_unique<Loop>(&impl, impl.io->tls.get()));
  }

  auto acceptor = std::make_unique<tcp::acceptor>(impl.loops[0]->ctx());
  error_code ec;
  acceptor->open(endpoint->protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(*endpoint, ec);
  if (!ec) acceptor->listen(SOMAXCONN, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.address, ": ", ec.message()));
  }
  port_ = acceptor->local_endpoint(ec).port();
  if (endpoint->port() == 0) {  // the loops have not started: nothing reads it yet
    impl.address =
        absl::StrCat(options_.address.substr(0, options_.address.rfind(':')), ":", port_);
  }
  impl.io->acceptor = std::move(acceptor);
  impl.io->retry = std::make_unique<asio::steady_timer>(impl.loops[0]->ctx());

  for (auto& loop : impl.loops) loop->Start();
  Impl* raw = &impl;
  asio::post(impl.loops[0]->ctx(), [raw] { Accept(raw); });
  return absl::OkStatus();
}

void Server::Drain() {
  Impl& impl = *impl_;
  if (!impl.started || impl.drained || impl.loops.empty() || impl.io == nullptr ||
      impl.io->acceptor == nullptr) {
    return;
  }
  impl.drained = true;
  impl.draining.store(true);
  // Bodies still arriving get kDrainBodyGrace (at most the read timeout) to arrive whole; then
  // their requests are refused unread (Refusal::kDraining), so that a slow sender cannot hold the
  // drain (Stop may bring the deadline closer).
  const absl::Duration grace = std::min(kDrainBodyGrace, options_.read_timeout);
  impl.drain_body_deadline.store(
      (internal::Clock::now() + absl::ToChronoNanoseconds(grace)).time_since_epoch().count());
  // No new connection from here on: the listener closes on its loop, and Drain returns once it
  // has (a connection attempted after Drain is refused).
  Impl* raw = &impl;
  auto closed = std::make_shared<absl::Notification>();
  asio::post(impl.loops[0]->ctx(), [raw, closed] {
    error_code ec;
    raw->io->acceptor->close(ec);
    raw->io->retry->cancel();
    closed->Notify();
  });
  closed->WaitForNotificationWithTimeout(absl::Seconds(5));
  for (auto& loop : impl.loops) {
    Loop* l = loop.get();
    asio::post(l->ctx(), [l] { l->Drain(); });
  }
}

void Server::Stop(absl::Time deadline) {
  Impl& impl = *impl_;
  if (!impl.started || impl.stopped || impl.loops.empty()) return;
  impl.stopped = true;
  Drain();
  // Bodies get at most half of the time left, so that their refusals are answered in it.
  const int64_t half = (internal::Clock::now() +
                        absl::ToChronoNanoseconds(std::max(absl::ZeroDuration(),
                                                           (deadline - absl::Now()) / 2)))
                           .time_since_epoch()
                           .count();
  if (half < impl.drain_body_deadline.load()) impl.drain_body_deadline.store(half);
  // Every request accepted answered - those handed to the handler and those whose body was still
  // arriving at the drain - or the deadline (a shutdown: polling is fine).
  // `receiving` first: a request handed over between the two reads has raised `unanswered`
  // before it lowered `receiving`, so one of the two is seen.
  while ((impl.receiving->load(std::memory_order_acquire) > 0 ||
          impl.unanswered->load(std::memory_order_acquire) > 0) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  impl.stopping.store(true);
  for (auto& loop : impl.loops) {
    Loop* l = loop.get();
    asio::post(l->ctx(), [l] { l->Stop(); });
  }
  for (auto& loop : impl.loops) loop->Join();
}

Server::Stats Server::stats() const {
  const internal::Counters& c = impl_->counters;
  Stats s;
  s.accepted = c.accepted.load(std::memory_order_relaxed);
  s.refused = c.refused.load(std::memory_order_relaxed);
  s.read_timeouts = c.read_timeouts.load(std::memory_order_relaxed);
  s.open = c.open.load(std::memory_order_relaxed);
  s.requests = c.requests.load(std::memory_order_relaxed);
  s.buffered_bytes = c.buffered.load(std::memory_order_relaxed);
  for (size_t i = 0; i < s.abuse.size(); ++i) s.abuse[i] = c.abuse[i].load(std::memory_order_relaxed);
  s.header_too_large = s.abuse[static_cast<int>(AbuseReason::kHeaderTooLarge)];
  return s;
}

}  // namespace offload::httpd
