#include "service/httpd/server.h"

// H2O's own event loop (libh2o-evloop), not libuv.
#define H2O_USE_LIBUV 0
#include <h2o.h>
#include <h2o/http1.h>
#include <h2o/http2.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <poll.h>
#include <openssl/x509.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/common/log.h"

namespace offload::httpd {

size_t Response::body_size() const {
  size_t n = body.size();
  for (absl::string_view piece : shared_body) n += piece.size();
  return n;
}

namespace internal {
namespace {

// Where a response from another thread goes: the loop's message receiver while the loop runs.
class Mailbox {
 public:
  explicit Mailbox(h2o_multithread_receiver_t* receiver) : receiver_(receiver) {}
  // False once closed (the loop is gone): the caller keeps the message.
  bool Post(h2o_multithread_message_t* message) {
    absl::MutexLock lock(&mu_);
    if (receiver_ == nullptr) return false;
    h2o_multithread_send_message(receiver_, message);
    return true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    receiver_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  h2o_multithread_receiver_t* receiver_ ABSL_GUARDED_BY(mu_);
};

enum class MessageKind { kResponse, kDrain, kStop };

// A message to a loop; `link` first, so that the queue's node is the message.
struct Message {
  h2o_multithread_message_t link{};
  MessageKind kind = MessageKind::kDrain;
  std::shared_ptr<Exchange> exchange;  // kResponse
};
static_assert(std::is_standard_layout_v<h2o_multithread_message_t>);

absl::string_view View(h2o_iovec_t v) {
  return v.base == nullptr ? absl::string_view() : absl::string_view(v.base, v.len);
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 412: return "Precondition Failed";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

std::string FormatPeer(const sockaddr* sa, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat("ipv4:", host, ":", ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("ipv6:[", host, "]:", ntohs(in6->sin6_port));
  }
  return "unknown";
}

// "host:port" or "[v6]:port" -> the first address it names.
absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> ParseAddress(const std::string& address) {
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
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, found->ai_addr, found->ai_addrlen);
  out.second = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

uint64_t Millis(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// The end of a request's header block, within the first `limit` bytes of `input`.
bool HasHeaderEnd(const h2o_buffer_t* input, size_t limit) {
  const size_t n = std::min(input->size, limit);
  return n >= 4 && memmem(input->bytes, n, "\r\n\r\n", 4) != nullptr;
}

thread_local Loop* current_loop = nullptr;

}  // namespace

// One accepted connection, owned by its loop. Freed once its socket has closed and no request
// of it is still alive (whichever comes last).
struct Conn {
  Loop* loop = nullptr;
  h2o_socket_t* sock = nullptr;  // null once closed
  Conn* prev = nullptr;
  Conn* next = nullptr;
  int live_requests = 0;  // requests handed to the handler whose memory is not yet disposed
  bool h2 = false;        // HTTP/2 seen (ALPN, or a request)
  bool cut = false;       // shut down by the server (timeout, drain, stop)
  bool tls_done = false;
  // The read timeout: when input was first seen waiting with no request under way, and the last
  // time the byte count moved.
  uint64_t partial_since = 0;
  uint64_t progress_at = 0;
  size_t progress_bytes = 0;
  std::string peer_address;  // formatted at the first request
  std::string identity;      // TLS peer identity
  std::vector<Exchange*> exchanges;  // those of the live requests
};

// One event loop thread: its H2O context, its copy of the listening socket, its connections.
struct Loop {
  Server::Impl* impl = nullptr;
  h2o_context_t ctx{};
  h2o_accept_ctx_t accept_ctx{};
  h2o_socket_t* listener = nullptr;
  struct Receiver {
    h2o_multithread_receiver_t super{};  // first: the callback gets this
    Loop* loop = nullptr;
  } receiver;
  std::shared_ptr<Mailbox> mailbox;
  h2o_timeout_t sweep_timeout{};
  h2o_timeout_entry_t sweep_entry{};
  Conn* conns = nullptr;
  size_t conn_count = 0;
  bool draining = false;
  bool stopping = false;
  bool exit = false;
  uint64_t stop_started = 0;
  int listen_fd = -1;  // this loop's copy of the listening socket, until Setup takes it
  absl::Notification ready;  // Setup done (see setup_status)
  absl::Status setup_status;
  std::thread thread;

  void Link(Conn* c) {
    c->next = conns;
    if (conns != nullptr) conns->prev = c;
    conns = c;
    ++conn_count;
  }
  void Unlink(Conn* c) {
    if (c->prev != nullptr) c->prev->next = c->next;
    if (c->next != nullptr) c->next->prev = c->prev;
    if (conns == c) conns = c->next;
    c->prev = c->next = nullptr;
    --conn_count;
  }
  // The thread: Setup, turns of the event loop until `exit`, Teardown. Everything H2O of this
  // loop is made, used and freed on this thread: H2O keeps per-thread buffer recyclers, and a
  // socket remembers the recycler of the thread that made it.
  void Run();
  void Setup();
  void Teardown();
  void Sweep();
  void Cut(Conn* c);
  void OnMessage(Message* m);
};

struct Posting {
  Message message;
  Response response;
};

// Everything that touches an Exchange's insides, on the loop thread unless said otherwise.
struct Access {
  // Fills `e` from `req` (in OnRequest).
  static void Fill(Exchange& e, h2o_req_t* req, h2o_socket_t* sock, Conn* conn);
  // Writes `response` for `e`'s request, if it is still there.
  static void Send(Exchange& e, Response response);
  // The request's memory goes: answered and written, or its client gone.
  static void Disposed(Exchange& e);
  // The client has hung up while the request is being answered.
  static void PeerGone(Exchange& e);
  static Posting& posting(Exchange& e) { return *e.posting_; }
};

}  // namespace internal

using internal::Access;
using internal::Conn;
using internal::Loop;
using internal::Message;
using internal::MessageKind;

struct Server::Impl {
  Impl(const Options& options, Handler* handler) : options(options), handler(handler) {}

  const Options& options;
  Handler* const handler;
  h2o_globalconf_t config{};
  bool config_inited = false;
  SSL_CTX* ssl_ctx = nullptr;
  int listen_fd = -1;
  std::vector<std::unique_ptr<Loop>> loops;
  bool started = false;
  bool drained = false;
  bool stopped = false;

  std::atomic<uint64_t> accepted{0}, refused{0}, read_timeouts{0}, requests{0},
      header_too_large{0};
  std::atomic<int64_t> open{0};

  // Requests handed to the handler and not yet answered (Stop waits for none).
  absl::Mutex mu;
  int64_t unanswered ABSL_GUARDED_BY(mu) = 0;

  struct HandlerShim {
    h2o_handler_t super;  // first: H2O calls on_req with this
    Impl* impl;
  };

  static int OnRequest(h2o_handler_t* self, h2o_req_t* req);
  static void OnAccept(h2o_socket_t* listener, const char* err);
  static void OnSocketClose(void* data);
  static void OnSslInfo(const SSL* ssl, int where, int ret);
  static void OnMessages(h2o_multithread_receiver_t* receiver, h2o_linklist_t* messages);
  static void OnSweep(h2o_timeout_entry_t* entry);

  void Answered() {
    absl::MutexLock lock(&mu);
    --unanswered;
  }
};

namespace {

// Keeps a response's bytes alive in the request's memory pool until the request is disposed.
struct HeldResponse {
  Response response;
  static void Dispose(void* p) { static_cast<HeldResponse*>(p)->~HeldResponse(); }
};

// Tells the Exchange when its request's memory goes.
struct DisposeHook {
  std::shared_ptr<Exchange> exchange;
  static void Dispose(void* p) {
    auto* hook = static_cast<DisposeHook*>(p);
    internal::Access::Disposed(*hook->exchange);
    hook->~DisposeHook();
  }
};

h2o_generator_t kFinalGenerator = {nullptr, nullptr};

const h2o_iovec_t kAlpnProtocols[] = {{const_cast<char*>("h2"), 2},
                                      {const_cast<char*>("http/1.1"), 8},
                                      {nullptr, 0}};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Exchange

Exchange::Exchange(internal::Loop* loop, internal::Conn* conn, void* req)
    : loop_(loop), conn_(conn), req_(req) {}
Exchange::~Exchange() = default;

std::optional<absl::string_view> Exchange::header(absl::string_view name) const {
  const auto* req = static_cast<const h2o_req_t*>(req_);
  if (req == nullptr) return std::nullopt;
  const ssize_t i = h2o_find_header_by_str(&req->headers, name.data(), name.size(), -1);
  if (i < 0) return std::nullopt;
  return internal::View(req->headers.entries[i].value);
}

void Exchange::ForEachHeader(
    const std::function<void(absl::string_view, absl::string_view)>& fn) const {
  const auto* req = static_cast<const h2o_req_t*>(req_);
  if (req == nullptr) return;
  for (size_t i = 0; i < req->headers.size; ++i) {
    const h2o_header_t& h = req->headers.entries[i];
    fn(internal::View(*h.name), internal::View(h.value));
  }
}

void Exchange::Respond(Response response) {
  if (responded_.exchange(true, std::memory_order_acq_rel)) return;
  Server::Impl* impl = loop_->impl;
  if (internal::current_loop == loop_) {
    internal::Access::Send(*this, std::move(response));
  } else {
    posting_ = std::make_unique<internal::Posting>();
    posting_->message.kind = MessageKind::kResponse;
    posting_->message.exchange = shared_from_this();
    posting_->response = std::move(response);
    if (!loop_->mailbox->Post(&posting_->message.link)) {
      posting_->message.exchange.reset();  // the loop is gone: nobody will write it
    }
  }
  // Counted once the response is written or queued to the loop ahead of any stop message, so
  // that Stop() never closes a connection before its answer.
  impl->Answered();
}

namespace internal {

void Access::Fill(Exchange& e, h2o_req_t* req, h2o_socket_t* sock, Conn* conn) {
  e.method_ = View(req->method);
  absl::string_view path = View(req->path);
  if (req->query_at != SIZE_MAX && req->query_at < path.size()) {
    e.query_ = path.substr(req->query_at + 1);
    path = path.substr(0, req->query_at);
  }
  e.path_ = path;
  e.body_ = View(req->entity);
  e.version_ = req->version;
  e.tls_ = sock != nullptr && sock->ssl != nullptr;
  if (conn != nullptr) {
    e.peer_address_ = conn->peer_address;
    e.peer_identity_ = conn->identity;
    ++conn->live_requests;
    conn->exchanges.push_back(&e);
  }
}

void Access::Disposed(Exchange& e) {
  e.req_ = nullptr;
  e.abandoned_.store(true, std::memory_order_release);
  Conn* conn = e.conn_;
  if (conn == nullptr) return;
  e.conn_ = nullptr;
  conn->exchanges.erase(std::find(conn->exchanges.begin(), conn->exchanges.end(), &e));
  if (--conn->live_requests > 0) return;
  if (conn->sock == nullptr) {
    delete conn;
  } else if (conn->loop->stopping) {
    conn->loop->Cut(conn);  // its last answer is written: nothing more to wait for
  }
}

void Access::PeerGone(Exchange& e) { e.abandoned_.store(true, std::memory_order_release); }

void Access::Send(Exchange& e, Response response) {
  auto* req = static_cast<h2o_req_t*>(e.req_);
  if (req == nullptr) return;  // the client is gone
  req->res.status = response.status;
  req->res.reason = internal::ReasonPhrase(response.status);
  for (const auto& [name, value] : response.headers) {
    const h2o_iovec_t n = h2o_strdup(&req->pool, name.data(), name.size());
    const h2o_iovec_t v = h2o_strdup(&req->pool, value.data(), value.size());
    h2o_add_header_by_str(&req->pool, &req->res.headers, n.base, n.len, 1, nullptr, v.base, v.len);
  }
  const bool head = e.method_ == "HEAD";
  req->res.content_length = response.body_size();
  auto* held = new (h2o_mem_alloc_shared(&req->pool, sizeof(HeldResponse), &HeldResponse::Dispose))
      HeldResponse{std::move(response)};
  std::vector<h2o_iovec_t> bufs;
  if (!head) {
    const Response& r = held->response;
    bufs.reserve(1 + r.shared_body.size());
    if (!r.body.empty()) bufs.push_back(h2o_iovec_init(r.body.data(), r.body.size()));
    for (absl::string_view piece : r.shared_body) {
      if (!piece.empty()) bufs.push_back(h2o_iovec_init(piece.data(), piece.size()));
    }
  }
  h2o_start_response(req, &kFinalGenerator);
  h2o_send(req, bufs.data(), bufs.size(), H2O_SEND_STATE_FINAL);
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// Loop

void Loop::Run() {
  internal::current_loop = this;
  Setup();
  const bool ok = setup_status.ok();
  ready.Notify();
  if (ok) {
    absl::Time last_failure_logged = absl::InfinitePast();
    while (!exit) {
      if (h2o_evloop_run(ctx.loop, INT32_MAX) == 0) continue;
      // epoll_wait failed. EINTR is no fault: Linux never restarts it after a stop signal, so
      // every SIGSTOP/SIGCONT (a debugger, a frozen cgroup or container, a paused VM) ends up
      // here (signal(7)). The loop never ends on a failure: that would leave the port open and
      // never answered. Anything else is logged (at most once a second) and retried after a
      // pause, as H2O's own server keeps running its loops.
      if (errno == EINTR) continue;
      const int error = errno;
      if (absl::Now() - last_failure_logged >= absl::Seconds(1)) {
        last_failure_logged = absl::Now();
        Log(LogLevel::kError, "http_loop_failed", {{"error", std::strerror(error)}});
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    Teardown();
  }
  internal::current_loop = nullptr;
}

void Loop::Setup() {
  h2o_context_init(&ctx, h2o_evloop_create(), &impl->config);
  accept_ctx.ctx = &ctx;
  accept_ctx.hosts = impl->config.hosts;
  accept_ctx.ssl_ctx = impl->ssl_ctx;
  receiver.loop = this;
  h2o_multithread_register_receiver(ctx.queue, &receiver.super, &Server::Impl::OnMessages);
  mailbox = std::make_shared<Mailbox>(&receiver.super);
  listener = h2o_evloop_socket_create(ctx.loop, listen_fd, H2O_SOCKET_FLAG_DONT_READ);
  listen_fd = -1;  // the socket owns it
  listener->data = this;
  h2o_socket_read_start(listener, &Server::Impl::OnAccept);
  h2o_timeout_init(ctx.loop, &sweep_timeout, 1000);
  sweep_entry.cb = &Server::Impl::OnSweep;
  h2o_timeout_link(ctx.loop, &sweep_timeout, &sweep_entry);
}

void Loop::Teardown() {
  // Nothing more can be posted; what was posted before is delivered (and dropped: the requests
  // are gone) by one last turn of the loop.
  mailbox->Close();
  h2o_evloop_run(ctx.loop, 0);
  h2o_timeout_unlink(&sweep_entry);
  h2o_timeout_dispose(ctx.loop, &sweep_timeout);
  // Linked by h2o_context_request_shutdown; h2o_context_dispose wants its timers empty.
  h2o_timeout_unlink(&ctx.http2._graceful_shutdown_timeout);
  if (listener != nullptr) {
    h2o_socket_close(listener);
    listener = nullptr;
  }
  h2o_multithread_unregister_receiver(ctx.queue, &receiver.super);
  // Closed sockets are freed on the loop's next turn: give the last connections and the
  // listener theirs before the loop goes.
  h2o_evloop_run(ctx.loop, 0);
  if (conn_count == 0) {
    h2o_evloop_t* evloop = ctx.loop;
    h2o_multithread_queue_t* queue = ctx.queue;
    h2o_context_dispose(&ctx);   // closes the queue's socket
    h2o_evloop_run(evloop, 0);  // and frees it
    free(queue);                // h2o 2.2.5's h2o_multithread_destroy_queue does not
    h2o_evloop_destroy(evloop);
  } else {
    // Connections that did not close within the stop grace: their memory stays.
    Log(LogLevel::kWarning, "http_stop_stragglers", {{"connections", conn_count}});
  }
}

void Loop::Cut(Conn* c) {
  if (c->sock == nullptr || c->cut) return;
  c->cut = true;
  // The loop sees end-of-file on its next turn and closes the connection as a client hang-up:
  // no request or socket is freed under H2O's feet.
  ::shutdown(h2o_socket_get_fd(c->sock), SHUT_RDWR);
}

void Loop::Sweep() {
  const uint64_t now = h2o_now(ctx.loop);
  const Server::Options& options = impl->options;
  const uint64_t read_ms = internal::Millis(options.read_timeout);
  const size_t header_window = static_cast<size_t>(options.max_header_bytes) + 4096;
  const bool stop_grace_over = stopping && now - stop_started >= 1000;
  for (Conn* c = conns; c != nullptr; c = c->next) {
    if (c->sock == nullptr || c->cut) continue;
    if (stop_grace_over || (draining && c->live_requests == 0)) {
      Cut(c);
      continue;
    }
    if (c->live_requests > 0 && !c->h2) {
      // HTTP/1.1 does not read while a request is answered; a client that hung up (FIN or
      // reset) is seen here, so that work for it can be skipped.
      pollfd p{h2o_socket_get_fd(c->sock), POLLRDHUP, 0};
      if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        for (Exchange* e : c->exchanges) Access::PeerGone(*e);
      }
    }
    const h2o_buffer_t* input = c->sock->input;
    const bool waiting = c->live_requests == 0 && input != nullptr && input->size > 0;
    if (!waiting) {
      c->partial_since = 0;
      continue;
    }
    if (c->partial_since == 0) {
      c->partial_since = c->progress_at = now;
      c->progress_bytes = c->sock->bytes_read;
      continue;
    }
    if (c->sock->bytes_read != c->progress_bytes) {
      c->progress_bytes = c->sock->bytes_read;
      c->progress_at = now;
    }
    // HTTP/1.1 headers must be whole within the read timeout of their first byte (a slow
    // sender cannot keep a connection by trickling); after them, only a stall is cut.
    const bool in_headers = !c->h2 && !internal::HasHeaderEnd(input, header_window);
    const uint64_t since = in_headers ? c->partial_since : c->progress_at;
    if (now - since >= read_ms) {
      impl->read_timeouts.fetch_add(1, std::memory_order_relaxed);
      Cut(c);
    }
  }
}

void Loop::OnMessage(Message* m) {
  switch (m->kind) {
    case MessageKind::kResponse: {
      // `m` lives in the exchange: keep the exchange until the send is done.
      std::shared_ptr<Exchange> exchange = std::move(m->exchange);
      Access::Send(*exchange, std::move(Access::posting(*exchange).response));
      return;
    }
    case MessageKind::kDrain:
      if (!draining) {
        draining = true;
        if (listener != nullptr) {
          h2o_socket_read_stop(listener);
          h2o_socket_close(listener);
          listener = nullptr;
        }
        h2o_context_request_shutdown(&ctx);
        Sweep();
      }
      delete m;
      return;
    case MessageKind::kStop:
      draining = stopping = true;
      stop_started = h2o_now(ctx.loop);
      if (listener != nullptr) {
        h2o_socket_read_stop(listener);
        h2o_socket_close(listener);
        listener = nullptr;
      }
      // Connections still writing an answer close once it is written (Access::Disposed), or
      // after a second's grace (Sweep).
      for (Conn* c = conns; c != nullptr; c = c->next) {
        if (c->live_requests == 0) Cut(c);
      }
      if (conn_count == 0) exit = true;
      delete m;
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Callbacks (loop threads)

int Server::Impl::OnRequest(h2o_handler_t* self, h2o_req_t* req) {
  Impl* impl = reinterpret_cast<HandlerShim*>(self)->impl;
  Loop* loop = internal::current_loop;
  h2o_socket_t* sock = req->conn->callbacks->get_socket != nullptr
                           ? req->conn->callbacks->get_socket(req->conn)
                           : nullptr;
  Conn* conn = sock != nullptr ? static_cast<Conn*>(sock->on_close.data) : nullptr;

  if (conn != nullptr) {
    if (conn->peer_address.empty()) {
      sockaddr_storage sa{};
      const socklen_t len = h2o_socket_getpeername(sock, reinterpret_cast<sockaddr*>(&sa));
      conn->peer_address = internal::FormatPeer(reinterpret_cast<sockaddr*>(&sa), len);
    }
    if (req->version >= 0x200) conn->h2 = true;
    conn->partial_since = 0;
  }
  auto exchange = std::make_shared<Exchange>(loop, conn, req);
  internal::Access::Fill(*exchange, req, sock, conn);
  // The exchange learns when the request's memory goes (answered and written, or the client
  // gone); the connection's count of live requests follows.
  new (h2o_mem_alloc_shared(&req->pool, sizeof(DisposeHook), &DisposeHook::Dispose))
      DisposeHook{exchange};
  impl->requests.fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&impl->mu);
    ++impl->unanswered;
  }

  size_t header_bytes = req->method.len + req->path.len + req->authority.len;
  for (size_t i = 0; i < req->headers.size; ++i) {
    header_bytes += req->headers.entries[i].name->len + req->headers.entries[i].value.len;
  }
  if (static_cast<int64_t>(header_bytes) > impl->options.max_header_bytes) {
    impl->header_too_large.fetch_add(1, std::memory_order_relaxed);
    Response r;
    r.status = 431;
    r.headers = {{"content-type", "text/plain; charset=utf-8"}, {"connection", "close"}};
    r.body = absl::StrCat("request headers: expected at most ", impl->options.max_header_bytes,
                          " bytes, got ", header_bytes, "\n");
    exchange->Respond(std::move(r));
    return 0;
  }
  impl->handler->Handle(std::move(exchange));
  return 0;
}

void Server::Impl::OnAccept(h2o_socket_t* listener, const char* err) {
  if (err != nullptr) return;
  auto* loop = static_cast<Loop*>(listener->data);
  Impl* impl = loop->impl;
  // A few at a time, so that the loops sharing the socket share the work.
  for (int i = 0; i < 16; ++i) {
    h2o_socket_t* sock = h2o_evloop_socket_accept(listener);
    if (sock == nullptr) break;
    impl->accepted.fetch_add(1, std::memory_order_relaxed);
    const int max = impl->options.max_connections;
    if (max > 0 && impl->open.load(std::memory_order_relaxed) >= max) {
      impl->refused.fetch_add(1, std::memory_order_relaxed);
      h2o_socket_close(sock);
      continue;
    }
    if (!impl->options.tcp_nodelay) {
      // H2O sets TCP_NODELAY on every accepted socket; this is the measurement switch.
      int off = 0;
      setsockopt(h2o_socket_get_fd(sock), IPPROTO_TCP, TCP_NODELAY, &off, sizeof(off));
    }
    auto* conn = new Conn;
    conn->loop = loop;
    conn->sock = sock;
    loop->Link(conn);
    impl->open.fetch_add(1, std::memory_order_relaxed);
    sock->on_close.cb = &Impl::OnSocketClose;
    sock->on_close.data = conn;
    h2o_accept(&loop->accept_ctx, sock);
  }
}

void Server::Impl::OnSocketClose(void* data) {
  auto* conn = static_cast<Conn*>(data);
  Loop* loop = conn->loop;
  loop->Unlink(conn);
  loop->impl->open.fetch_sub(1, std::memory_order_relaxed);
  conn->sock = nullptr;
  if (conn->live_requests == 0) delete conn;
  if (loop->stopping && loop->conn_count == 0) loop->exit = true;
}

void Server::Impl::OnSslInfo(const SSL* ssl, int where, int) {
  if ((where & SSL_CB_HANDSHAKE_DONE) == 0) return;
  // H2O's BIO carries the socket (lib/common/socket.c), whose on_close data is our connection.
  BIO* bio = SSL_get_rbio(ssl);
  auto* sock = bio != nullptr ? static_cast<h2o_socket_t*>(BIO_get_data(bio)) : nullptr;
  if (sock == nullptr || sock->on_close.cb != &Impl::OnSocketClose) return;
  auto* conn = static_cast<Conn*>(sock->on_close.data);
  if (conn == nullptr || conn->tls_done) return;
  conn->tls_done = true;
  const unsigned char* alpn = nullptr;
  unsigned alpn_len = 0;
  SSL_get0_alpn_selected(ssl, &alpn, &alpn_len);
  conn->h2 = alpn_len == 2 && std::memcmp(alpn, "h2", 2) == 0;
  const Options& options = conn->loop->impl->options;
  if (options.peer_identity) {
    conn->identity = options.peer_identity(SSL_get0_peer_certificate(ssl));
  }
}

void Server::Impl::OnMessages(h2o_multithread_receiver_t* receiver, h2o_linklist_t* messages) {
  Loop* loop = reinterpret_cast<Loop::Receiver*>(receiver)->loop;
  while (!h2o_linklist_is_empty(messages)) {
    h2o_linklist_t* node = messages->next;
    h2o_linklist_unlink(node);
    auto* message = reinterpret_cast<Message*>(
        H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, node));
    loop->OnMessage(message);
  }
}

void Server::Impl::OnSweep(h2o_timeout_entry_t* entry) {
  Loop* loop = internal::current_loop;  // the sweep runs on its own loop's thread
  loop->Sweep();
  if (loop->stopping && loop->conn_count > 0 &&
      h2o_now(loop->ctx.loop) - loop->stop_started > 2000) {
    loop->exit = true;
    return;
  }
  h2o_timeout_link(loop->ctx.loop, &loop->sweep_timeout, &loop->sweep_entry);
}

// ---------------------------------------------------------------------------------------------
// Server

Server::Server(Options options, Handler* handler)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_, handler)) {}

Server::~Server() {
  Stop(absl::Now());
  if (impl_->ssl_ctx != nullptr) SSL_CTX_free(impl_->ssl_ctx);
  if (impl_->config_inited) h2o_config_dispose(&impl_->config);
  if (impl_->listen_fd >= 0) close(impl_->listen_fd);
  for (auto& loop : impl_->loops) {
    if (loop->listen_fd >= 0) close(loop->listen_fd);  // a loop that never started
  }
}

absl::Status Server::Start() {
  Impl& impl = *impl_;
  if (impl.started) return absl::FailedPreconditionError("http server: already started");
  impl.started = true;
  // A peer that resets a connection must not kill the process on the next write.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> address =
      internal::ParseAddress(options_.address);
  if (!address.ok()) return address.status();
  const auto* sa = reinterpret_cast<const sockaddr*>(&address->first);
  const int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("http: socket: ", strerror(errno)));
  impl.listen_fd = fd;
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  if (bind(fd, sa, address->second) != 0 || listen(fd, SOMAXCONN) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.address, ": ", strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  if (options_.configure_tls) {
    impl.ssl_ctx = SSL_CTX_new(TLS_server_method());
    if (impl.ssl_ctx == nullptr) return absl::InternalError("http: SSL_CTX_new failed");
    SSL_CTX_set_min_proto_version(impl.ssl_ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(impl.ssl_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    static const unsigned char kSessionContext[] = "crypto-offload";
    SSL_CTX_set_session_id_context(impl.ssl_ctx, kSessionContext, sizeof(kSessionContext) - 1);
    if (absl::Status s = options_.configure_tls(impl.ssl_ctx); !s.ok()) return s;
    h2o_ssl_register_alpn_protocols(impl.ssl_ctx, kAlpnProtocols);
    SSL_CTX_set_info_callback(impl.ssl_ctx, &Impl::OnSslInfo);
  }

  h2o_config_init(&impl.config);
  impl.config_inited = true;
  impl.config.server_name = h2o_iovec_init(options_.server_name.data(), options_.server_name.size());
  impl.config.max_request_entity_size = static_cast<size_t>(options_.max_body_bytes);
  impl.config.http1.req_timeout = internal::Millis(options_.idle_timeout);
  impl.config.http2.idle_timeout = internal::Millis(options_.idle_timeout);
  impl.config.handshake_timeout = internal::Millis(options_.read_timeout);
  impl.config.http2.max_concurrent_requests_per_connection =
      static_cast<size_t>(std::max(1, options_.http2_max_streams));
  h2o_hostconf_t* host =
      h2o_config_register_host(&impl.config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
  h2o_pathconf_t* path = h2o_config_register_path(host, "/", 0);
  auto* shim = reinterpret_cast<Impl::HandlerShim*>(h2o_create_handler(path, sizeof(Impl::HandlerShim)));
  shim->super.on_req = &Impl::OnRequest;
  shim->impl = &impl;

  int threads = options_.threads;
  if (threads <= 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
  }
  for (int i = 0; i < threads; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->impl = &impl;
    loop->listen_fd = dup(fd);
    if (loop->listen_fd < 0) return absl::InternalError(absl::StrCat("http: dup: ", strerror(errno)));
    impl.loops.push_back(std::move(loop));
  }
  // `fd` stays open (impl.listen_fd) beside the loops' copies: Drain shuts the shared socket
  // down through it, which stops every copy listening at once.
  for (auto& loop : impl.loops) {
    Loop* l = loop.get();
    l->thread = std::thread([l] { l->Run(); });
  }
  for (auto& loop : impl.loops) {
    loop->ready.WaitForNotification();
    if (!loop->setup_status.ok()) return loop->setup_status;
  }
  return absl::OkStatus();
}

void Server::Drain() {
  Impl& impl = *impl_;
  if (!impl.started || impl.drained || impl.loops.empty()) return;
  impl.drained = true;
  // No new connection from here on (the loops' copies of the socket close on their next turn;
  // until then they would still take connections into the shared backlog).
  if (impl.listen_fd >= 0) ::shutdown(impl.listen_fd, SHUT_RDWR);
  for (auto& loop : impl.loops) {
    if (!loop->thread.joinable() || loop->mailbox == nullptr) continue;
    auto* m = new Message;
    m->kind = MessageKind::kDrain;
    if (!loop->mailbox->Post(&m->link)) delete m;
  }
}

void Server::Stop(absl::Time deadline) {
  Impl& impl = *impl_;
  if (!impl.started || impl.stopped) return;
  impl.stopped = true;
  Drain();
  {
    absl::MutexLock lock(&impl.mu);
    impl.mu.AwaitWithDeadline(
        absl::Condition(
            +[](int64_t* unanswered) { return *unanswered == 0; }, &impl.unanswered),
        deadline);
  }
  for (auto& loop : impl.loops) {
    if (!loop->thread.joinable() || loop->mailbox == nullptr) continue;
    auto* m = new Message;
    m->kind = MessageKind::kStop;
    if (!loop->mailbox->Post(&m->link)) delete m;
  }
  for (auto& loop : impl.loops) {
    if (loop->thread.joinable()) loop->thread.join();
  }
}

Server::Stats Server::stats() const {
  const Impl& impl = *impl_;
  Stats s;
  s.accepted = impl.accepted.load(std::memory_order_relaxed);
  s.refused = impl.refused.load(std::memory_order_relaxed);
  s.read_timeouts = impl.read_timeouts.load(std::memory_order_relaxed);
  s.open = impl.open.load(std::memory_order_relaxed);
  s.requests = impl.requests.load(std::memory_order_relaxed);
  s.header_too_large = impl.header_too_large.load(std::memory_order_relaxed);
  return s;
}

}  // namespace offload::httpd
