// The engine's HTTP/2 side over real loopback sockets, with libnghttp2's client session (a
// blocking socket, driven by the test) as the client: answers with trailers, bidirectional
// streaming exchanges, concurrent streams, large answers under flow control, a client reset that
// abandons its exchange, a body over the limit, and the two-step GOAWAY of a drain. HTTP/1.1's
// chunked trailers too (a plain socket).
#include <arpa/inet.h>
#include <nghttp2/nghttp2.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/httpd/internal/idle_reset_filter.h"
#include "service/httpd/server.h"
#include "tests/testing/http_client.h"

namespace offload::httpd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// The server's buffered bytes once they settle: a stream's last bytes reach the client before
// the server's loop has closed the stream and released its charge, so poll (up to 5 s).
int64_t SettledBufferedBytes(const Server& server) {
  for (int i = 0; i < 500 && server.stats().buffered_bytes != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return server.stats().buffered_bytes;
}

// "/unary": echoes the body, trailers {x-end: done}. "/empty-trailers": no body, trailers only.
// "/big": 1 MiB of 'b'. "/stream": a bidirectional stream; every body piece comes back at once,
// written from another thread, and the end brings trailers ("/stream-inline": written on the
// loop, inside the read callback). "/hold": kept, never answered.
class Handler2 final : public Handler {
 public:
  bool Streaming(const Exchange& exchange) override {
    return exchange.path() == "/stream" || exchange.path() == "/stream-inline";
  }
  // A request's own body bound, when it names one (`x-limit`), as the gateway gives its protocol's.
  int64_t BodyLimit(const Exchange& exchange) override {
    int64_t limit = -1;
    if (auto v = exchange.header("x-limit")) (void)absl::SimpleAtoi(*v, &limit);
    return limit;
  }

  void Handle(std::shared_ptr<Exchange> exchange) override {
    const absl::string_view path = exchange->path();
    if (exchange->body_too_large()) {
      exchange->Respond({413, {{"content-type", "text/plain"}}, "too large\n"});
      return;
    }
    if (exchange->refusal() != Exchange::Refusal::kNone) {
      exchange->Respond({429,
                         {{"content-type", "text/plain"},
                          {"x-refusal", absl::StrCat(static_cast<int>(exchange->refusal()))}},
                         ""});
      return;
    }
    if (path == "/unary") {
      Response r(200, {{"content-type", "application/test"}}, std::string(exchange->body()));
      r.trailers = {{"x-end", "done"}, {"x-count", "1"}};
      exchange->Respond(std::move(r));
    } else if (path == "/empty-trailers") {
      Response r(200, {{"content-type", "application/test"}}, "");
      r.trailers = {{"x-end", "only"}};
      exchange->Respond(std::move(r));
    } else if (path == "/big") {
      exchange->Respond({200, {{"content-type", "application/test"}}, std::string(1 << 20, 'b')});
    } else if (path == "/stream" || path == "/stream-inline") {
      exchange->StartResponse(200, {{"content-type", "application/test"}});
      std::weak_ptr<Exchange> weak = exchange;
      const bool inline_answers = path == "/stream-inline";
      exchange->ReadBody([this, weak, inline_answers](absl::string_view data, bool end) {
        std::shared_ptr<Exchange> e = weak.lock();
        if (e == nullptr) return;
        {
          absl::MutexLock lock(&mu_);
          pieces_.push_back(std::string(data));
          if (end) ended_ = true;
        }
        if (inline_answers) {
          if (!data.empty()) e->Write(absl::StrCat("echo:", data));
          if (end) e->Finish({{"x-pieces", "done"}});
          return;
        }
        // Answered from another thread, as a worker would.
        std::thread([e, reply = absl::StrCat("echo:", data), end] {
          if (!reply.empty() && reply != "echo:") e->Write(reply);
          if (end) e->Finish({{"x-pieces", "done"}});
        }).detach();
      });
    } else {
      // "/deadline": held, with a deadline 20 ms away (as the gateway sets one from a timeout).
      if (path == "/deadline") exchange->SetDeadline(absl::Now() + absl::Milliseconds(20));
      absl::MutexLock lock(&mu_);
      held_.push_back(exchange);
    }
  }

  std::shared_ptr<Exchange> held() {
    absl::MutexLock lock(&mu_);
    return held_.empty() ? nullptr : held_.back();
  }
  void Release() {
    std::vector<std::shared_ptr<Exchange>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& e : held) e->Respond({200, {{"content-type", "text/plain"}}, "late\n"});
  }
  bool ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  size_t streamed_bytes() {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (const std::string& p : pieces_) n += p.size();
    return n;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Exchange>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> pieces_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

int Connect(int port) { return testhttp::ConnectLoopback(port); }

// A client session of libnghttp2 on a blocking socket: requests are submitted, then Run() sends
// and reads until a condition holds.
class H2Client {
 public:
  struct Result {
    int status = 0;
    std::vector<std::pair<std::string, std::string>> headers, trailers;
    std::string body;
    bool closed = false;
    uint32_t error = 0;
    bool headers_seen = false;
  };

  // `window`: the initial stream window this client gives the server (-1: nghttp2's default).
  explicit H2Client(int port, int32_t window = -1) : fd_(Connect(port)) {
    // Small frames (WINDOW_UPDATEs) must not wait on Nagle's algorithm for the server's ACK.
    int on = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, [](nghttp2_session*, const uint8_t* data,
                                                       size_t len, int, void* self) -> ssize_t {
      const ssize_t n = send(static_cast<H2Client*>(self)->fd_, data, len, MSG_NOSIGNAL);
      return n < 0 ? static_cast<ssize_t>(NGHTTP2_ERR_CALLBACK_FAILURE) : n;
    });
    nghttp2_session_callbacks_set_on_header_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
               const uint8_t* value, size_t valuelen, uint8_t, void* self) -> int {
          Result& r = static_cast<H2Client*>(self)->results[frame->hd.stream_id];
          std::string n(reinterpret_cast<const char*>(name), namelen);
          std::string v(reinterpret_cast<const char*>(value), valuelen);
          if (n == ":status") {
            r.status = std::stoi(v);
          } else if (r.headers_seen) {
            r.trailers.emplace_back(n, v);
          } else {
            r.headers.emplace_back(n, v);
          }
          return 0;
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(
        cb, [](nghttp2_session*, const nghttp2_frame* frame, void* self_ptr) -> int {
          auto* self = static_cast<H2Client*>(self_ptr);
          if (frame->hd.type == NGHTTP2_HEADERS) self->results[frame->hd.stream_id].headers_seen = true;
          if (frame->hd.type == NGHTTP2_GOAWAY) {
            self->goaways.push_back(frame->goaway.last_stream_id);
            self->goaway_error = frame->goaway.error_code;
            self->goaway_debug.assign(reinterpret_cast<const char*>(frame->goaway.opaque_data),
                                      frame->goaway.opaque_data_len);
          }
          if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
            self->pings++;
          }
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cb, [](nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
               void* self) -> int {
          static_cast<H2Client*>(self)->results[id].body.append(reinterpret_cast<const char*>(data),
                                                                len);
          return 0;
        });
    nghttp2_session_callbacks_set_on_stream_close_callback(
        cb, [](nghttp2_session*, int32_t id, uint32_t error, void* self) -> int {
          Result& r = static_cast<H2Client*>(self)->results[id];
          r.closed = true;
          r.error = error;
          return 0;
        });
    nghttp2_session_client_new(&session_, cb, this);
    nghttp2_session_callbacks_del(cb);
    const nghttp2_settings_entry entry{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
                                       static_cast<uint32_t>(std::max(window, 0))};
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, &entry, window >= 0 ? 1 : 0);
  }
  ~H2Client() {
    nghttp2_session_del(session_);
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return fd_ >= 0; }

  // A request; the body goes out as its provider allows (Send adds more when `end` is false).
  int32_t Submit(const std::string& path, std::string body, bool end = true,
                 const std::string& method = "POST",
                 const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    auto out = std::make_unique<Outgoing>();
    out->data = std::move(body);
    out->end = end;
    // nghttp2 copies the names and values at submit time; these live until then.
    const std::string fields[][2] = {{":method", method},
                                     {":scheme", "http"},
                                     {":path", path},
                                     {":authority", "127.0.0.1"},
                                     {"content-type", "application/test"}};
    std::vector<nghttp2_nv> nva;
    for (int i = 0; i < 5; ++i) nva.push_back(Nv(fields[i][0], fields[i][1]));
    for (const auto& [n, v] : extra) nva.push_back(Nv(n, v));
    nghttp2_data_provider provider;
    provider.source.ptr = out.get();
    provider.read_callback = &H2Client::Read;
    const int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(),
                                              method == "GET" ? nullptr : &provider, nullptr);
    outgoing_[id] = std::move(out);
    return id;
  }
  void Send(int32_t id, const std::string& more, bool end) {
    Outgoing& out = *outgoing_[id];
    out.data += more;
    out.end = end;
    nghttp2_session_resume_data(session_, id);
  }
  void Ping() { nghttp2_submit_ping(session_, NGHTTP2_FLAG_NONE, nullptr); }
  // A SETTINGS frame of `entries` entries (SETTINGS_INITIAL_WINDOW_SIZE 65535 each).
  void Settings(int entries) {
    const std::vector<nghttp2_settings_entry> iv(entries, {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
                                                           65535});
    ASSERT_EQ(nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, iv.data(), iv.size()), 0);
  }
  // A WINDOW_UPDATE of `n` bytes on the connection (or stream `id`), beyond what nghttp2 sends
  // by itself.
  void WindowUpdate(int32_t n, int32_t id = 0) {
    nghttp2_submit_window_update(session_, NGHTTP2_FLAG_NONE, id, n);
  }
  void Reset(int32_t id) { nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL); }
  // Bytes written as they are, past nghttp2 (whatever it has queued goes first).
  void SendRaw(const std::string& bytes) {
    nghttp2_session_send(session_);
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // The next request takes stream `id` (ids below it are left unused).
  void SetNextStreamId(int32_t id) { nghttp2_session_set_next_stream_id(session_, id); }

  // Sends and reads until `done` (true) or 10 s pass (false), or the connection ends.
  bool Run(const std::function<bool()>& done) { return RunUntil(done, std::chrono::seconds(10)); }
  // Sends and reads for `d`.
  void RunFor(std::chrono::milliseconds d) {
    RunUntil([] { return false; }, d);
  }
  bool RunUntil(const std::function<bool()>& done, std::chrono::steady_clock::duration d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
      if (nghttp2_session_send(session_) != 0) return done();
      if (done()) return true;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 5) <= 0) continue;
      uint8_t buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof = true;
        return done();
      }
      if (nghttp2_session_mem_recv(session_, buf, static_cast<size_t>(n)) < 0) return done();
    }
    return false;
  }

  std::map<int32_t, Result> results;
  std::vector<int32_t> goaways;
  uint32_t goaway_error = 0;  // of the last GOAWAY
  std::string goaway_debug;
  int pings = 0;
  bool eof = false;

 private:
  struct Outgoing {
    std::string data;
    size_t offset = 0;
    bool end = true;
  };
  static nghttp2_nv Nv(const std::string& n, const std::string& v) {
    return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(n.data())),
                      reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(),
                      NGHTTP2_NV_FLAG_NONE};
  }
  static ssize_t Read(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                      nghttp2_data_source* source, void*) {
    auto* out = static_cast<Outgoing*>(source->ptr);
    const size_t n = std::min(length, out->data.size() - out->offset);
    std::memcpy(buf, out->data.data() + out->offset, n);
    out->offset += n;
    if (out->offset == out->data.size()) {
      if (!out->end) return n == 0 ? static_cast<ssize_t>(NGHTTP2_ERR_DEFERRED) : static_cast<ssize_t>(n);
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return static_cast<ssize_t>(n);
  }

  int fd_;
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::unique_ptr<Outgoing>> outgoing_;
};

class Http2Test : public ::testing::Test {
 protected:
  void Start(Server::Options options = {}) {
    options.address = "127.0.0.1:0";
    server_ = std::make_unique<Server>(std::move(options), &handler_);
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    handler_.Release();
    if (server_ != nullptr) server_->Stop(absl::Now() + absl::Seconds(5));
  }
  Handler2 handler_;
  std::unique_ptr<Server> server_;
};

TEST_F(Http2Test, AnswersWithTrailers) {
  Start();
  H2Client c(server_->port());
  ASSERT_TRUE(c.connected());
  const int32_t a = c.Submit("/unary", "hello trailers");
  const int32_t b = c.Submit("/empty-trailers", "");
  ASSERT_TRUE(c.Run([&] { return c.results[a].closed && c.results[b].closed; }));
  const H2Client::Result& r = c.results[a];
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello trailers");
  EXPECT_EQ(r.error, 0u);
  EXPECT_THAT(r.trailers, ElementsAre(Pair("x-end", "done"), Pair("x-count", "1")));
  // With trailers to come, there is no content-length.
  for (const auto& [name, value] : r.headers) EXPECT_NE(name, "content-length");
  const H2Client::Result& e = c.results[b];
  EXPECT_EQ(e.status, 200);
  EXPECT_EQ(e.body, "");
  EXPECT_THAT(e.trailers, ElementsAre(Pair("x-end", "only")));
}

TEST_F(Http2Test, StreamingExchangeIsBidirectional) {
  Start();
  H2Client c(server_->port());
  const int32_t id = c.Submit("/stream", "one", /*end=*/false);
  // The first answer arrives while the request is still open.
  ASSERT_TRUE(c.Run([&] { return c.results[id].body == "echo:one"; })) << c.results[id].body;
  EXPECT_EQ(c.results[id].status, 200);
  EXPECT_FALSE(c.results[id].closed);
  c.Send(id, "two", /*end=*/false);
  ASSERT_TRUE(c.Run([&] { return c.results[id].body == "echo:oneecho:two"; }));
  c.Send(id, "", /*end=*/true);
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  EXPECT_EQ(c.results[id].error, 0u);
  EXPECT_THAT(c.results[id].trailers, ElementsAre(Pair("x-pieces", "done")));
  EXPECT_TRUE(handler_.ended());
}

// A bidirectional stream whose client sends and never reads the answers: once a stream window of
// answers waits, the server stops giving back the request's window, and the client must stop.
TEST_F(Http2Test, StreamThatDoesNotReadItsAnswersIsPushedBack) {
  Server::Options options;
  options.http2.stream_window_bytes = 64 << 10;
  Start(options);
  H2Client c(server_->port(), /*window=*/0);  // takes no answer bytes at all
  // Answers written as each piece is read (from a worker thread, a loaded machine could take the
  // request's window back before the answers that should stop it exist).
  const int32_t id = c.Submit("/stream-inline", std::string(2 << 20, 'p'), /*end=*/false);
  c.RunFor(std::chrono::milliseconds(1500));
  // Echoed but unsent: 64 KiB of answers, then at most one more window of request taken.
  const size_t taken = handler_.streamed_bytes();
  EXPECT_GT(taken, 0u);
  EXPECT_LT(taken, 256u << 10) << "the server kept taking a stream whose answers wait";
  c.Reset(id);
  c.RunFor(std::chrono::milliseconds(100));
}

TEST_F(Http2Test, ConcurrentStreamsAndALargeAnswerUnderFlowControl) {
  Start();
  H2Client c(server_->port());
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(c.Submit("/unary", absl::StrCat("body ", i)));
  const int32_t big = c.Submit("/big", "", true, "GET");
  ASSERT_TRUE(c.Run([&] {
    for (int32_t id : ids) {
      if (!c.results[id].closed) return false;
    }
    return c.results[big].closed;
  }));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(c.results[ids[i]].body, absl::StrCat("body ", i));
  EXPECT_EQ(c.results[big].body, std::string(1 << 20, 'b'));
  EXPECT_EQ(SettledBufferedBytes(*server_), 0);
}

TEST_F(Http2Test, ClientResetAbandonsTheExchange) {
  Start();
  H2Client c(server_->port());
  const int32_t id = c.Submit("/hold", "x");
  ASSERT_TRUE(c.Run([&] { return handler_.held() != nullptr; }));
  std::shared_ptr<Exchange> held = handler_.held();
  EXPECT_FALSE(held->abandoned());
  c.Reset(id);
  ASSERT_TRUE(c.Run([&] { return held->abandoned(); }));
  held->Respond({200, {}, "too late"});  // does nothing, harms nothing
  // The connection goes on.
  const int32_t next = c.Submit("/unary", "after");
  ASSERT_TRUE(c.Run([&] { return c.results[next].closed; }));
  EXPECT_EQ(c.results[next].body, "after");
}

TEST_F(Http2Test, BodyOverTheLimitIsTheHandlersToAnswer) {
  Server::Options options;
  options.max_body_bytes = 4096;
  Start(options);
  H2Client c(server_->port());
  const int32_t id = c.Submit("/unary", std::string(100000, 'z'));
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  EXPECT_EQ(c.results[id].status, 413);
  EXPECT_EQ(c.results[id].body, "too large\n");
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kBodyTooLarge)], 1u);
  const int32_t next = c.Submit("/unary", "small");
  ASSERT_TRUE(c.Run([&] { return c.results[next].closed; }));
  EXPECT_EQ(c.results[next].body, "small");
}

// The handler's bound for one request (Handler::BodyLimit), below the server's: a body announced
// past it is refused on its Content-Length, one without a Content-Length as its DATA passes it;
// a body at the bound is read; each refusal is counted as body_too_large.
TEST_F(Http2Test, ARequestsOwnBodyLimitIsEnforcedOnLengthAndOnData) {
  Server::Options options;
  options.max_body_bytes = 1 << 20;
  Start(options);
  H2Client c(server_->port());
  const auto too_large = [&] {
    return server_->stats().abuse[static_cast<int>(AbuseReason::kBodyTooLarge)];
  };
  // Refused on the header alone: not a byte of the body is sent.
  const int32_t announced = c.Submit("/unary", "", /*end=*/false, "POST",
                                     {{"x-limit", "1000"}, {"content-length", "1001"}});
  ASSERT_TRUE(c.Run([&] { return c.results[announced].closed; }));
  EXPECT_EQ(c.results[announced].status, 413);
  EXPECT_EQ(too_large(), 1u);
  const int32_t unannounced = c.Submit("/unary", std::string(1001, 'b'), true, "POST",
                                       {{"x-limit", "1000"}});
  ASSERT_TRUE(c.Run([&] { return c.results[unannounced].closed; }));
  EXPECT_EQ(c.results[unannounced].status, 413);
  EXPECT_EQ(too_large(), 2u);
  const int32_t at_bound = c.Submit("/unary", std::string(1000, 'c'), true, "POST",
                                    {{"x-limit", "1000"}, {"content-length", "1000"}});
  ASSERT_TRUE(c.Run([&] { return c.results[at_bound].closed; }));
  EXPECT_EQ(c.results[at_bound].status, 200);
  EXPECT_EQ(c.results[at_bound].body, std::string(1000, 'c'));
  // A bound above the server's is the server's.
  const int32_t above = c.Submit("/unary", std::string((1 << 20) + 1, 'd'), true, "POST",
                                 {{"x-limit", "99999999"}});
  ASSERT_TRUE(c.Run([&] { return c.results[above].closed; }));
  EXPECT_EQ(c.results[above].status, 413);
  EXPECT_EQ(too_large(), 3u);
}

TEST_F(Http2Test, DrainSendsTwoGoawaysAndFinishesTheStreamInFlight) {
  Start();
  H2Client c(server_->port());
  const int32_t id = c.Submit("/hold", "x");
  ASSERT_TRUE(c.Run([&] { return handler_.held() != nullptr; }));
  std::thread drain([&] { server_->Drain(); });
  // First the notice (last stream id 2^31-1) with a PING; the client's automatic PING ACK brings
  // the second GOAWAY, naming the last stream the server took.
  ASSERT_TRUE(c.Run([&] { return c.goaways.size() >= 2; }));
  drain.join();
  EXPECT_EQ(c.goaways[0], (1u << 31) - 1);
  EXPECT_EQ(c.goaways[1], id);
  EXPECT_GE(c.pings, 1);
  handler_.Release();
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  EXPECT_EQ(c.results[id].status, 200);
  EXPECT_EQ(c.results[id].body, "late\n");
  ASSERT_TRUE(c.Run([&] { return c.eof; }));  // closed once its last stream is done
}

// A body still arriving kDrainBodyGrace into the drain: its request is refused to the handler
// (kDraining), the stream answered and reset, and Stop does not wait out its deadline for it.
TEST_F(Http2Test, ASlowBodyIsRefusedAtTheDrainsDeadlineForBodies) {
  Start();
  H2Client c(server_->port());
  const int32_t id = c.Submit("/unary", "part of a body", /*end=*/false);
  c.RunFor(std::chrono::milliseconds(100));
  const absl::Time started = absl::Now();
  std::thread stop([&] { server_->Stop(absl::Now() + absl::Seconds(60)); });
  for (int i = 0; i < 40 && !c.results[id].closed; ++i) {
    c.Send(id, "x", /*end=*/false);  // progress, never the end
    c.RunFor(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  stop.join();
  EXPECT_EQ(c.results[id].status, 429);
  EXPECT_THAT(c.results[id].headers,
              ::testing::Contains(Pair("x-refusal", absl::StrCat(static_cast<int>(
                                                        Exchange::Refusal::kDraining)))));
  EXPECT_LT(absl::Now() - started, absl::Seconds(30));
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kDrainBodyLate)], 1u);
}

// Several large bodies at once on one connection, past its budget: the oldest request always
// progresses and the connection's window is never held by the others, so all complete.
// gRPC's keepalive policy, as grpc-core enforces it: PINGs too close together with nothing sent
// between them are strikes; past the allowed strikes, GOAWAY "too_many_pings".
TEST_F(Http2Test, TooManyPingsWithNothingSentIsGoaway) {
  Start();  // the defaults: 2 strikes, 2 h apart while idle
  H2Client c(server_->port());
  for (int i = 0; i < 4; ++i) c.Ping();  // the first is free, then three strikes
  ASSERT_TRUE(c.Run([&] { return !c.goaways.empty(); }));
  EXPECT_EQ(c.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(c.goaway_debug, "too_many_pings");
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kTooManyPings)], 1u);
}

// More entries in one SETTINGS frame than --http2_max_settings: nghttp2's own GOAWAY, counted
// as `settings` (not as a protocol error). As many as the limit are fine.
TEST_F(Http2Test, TooManySettingsEntriesAreCountedAsSettings) {
  Start();  // the default: 32 entries
  H2Client ok(server_->port());
  ok.Settings(32);
  const int32_t id = ok.Submit("/unary", "fine");
  ASSERT_TRUE(ok.Run([&] { return ok.results[id].closed; }));
  EXPECT_EQ(ok.results[id].status, 200);
  EXPECT_TRUE(ok.goaways.empty());

  H2Client c(server_->port());
  c.Settings(33);
  ASSERT_TRUE(c.Run([&] { return !c.goaways.empty(); }));
  EXPECT_EQ(c.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(c.goaway_debug, "SETTINGS: too many setting entries");
  const auto& abuse = server_->stats().abuse;
  EXPECT_EQ(abuse[static_cast<int>(AbuseReason::kSettings)], 1u);
  EXPECT_EQ(abuse[static_cast<int>(AbuseReason::kProtocolError)], 0u);
}

TEST_F(Http2Test, PingsBetweenAnswersOrWithinTheStrikesAreFine) {
  Start();
  H2Client c(server_->port());
  // Two strikes are allowed.
  for (int i = 0; i < 3; ++i) c.Ping();
  c.RunFor(std::chrono::milliseconds(200));
  // An answer between PINGs clears the strikes (gRPC's BDP pings follow our DATA).
  for (int round = 0; round < 5; ++round) {
    const int32_t id = c.Submit("/unary", "ping me");
    ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
    c.Ping();
    c.Ping();
    c.RunFor(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(c.goaways.empty());
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kTooManyPings)], 0u);
  // Switched off, PINGs are only the no-progress bucket's business.
  Server::Options off;
  off.http2.max_ping_strikes = 0;
  TearDown();
  Start(off);
  H2Client d(server_->port());
  for (int i = 0; i < 20; ++i) d.Ping();
  d.RunFor(std::chrono::milliseconds(200));
  EXPECT_TRUE(d.goaways.empty());
}

// gRPC clients give back each small answer's bytes at once, in updates of a few bytes: after our
// DATA those are progress. Without DATA before them they are not.
TEST_F(Http2Test, SmallWindowUpdatesAfterOurDataAreProgress) {
  Server::Options options;
  options.http2.no_progress_burst = 10;
  options.http2.no_progress_rate = 1;
  Start(options);
  H2Client c(server_->port());
  for (int i = 0; i < 40; ++i) {
    const int32_t id = c.Submit("/unary", "small");
    ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
    c.WindowUpdate(10);
    c.WindowUpdate(10);
  }
  c.RunFor(std::chrono::milliseconds(100));
  EXPECT_TRUE(c.goaways.empty());
  H2Client idle(server_->port());
  for (int i = 0; i < 40; ++i) idle.WindowUpdate(10);
  ASSERT_TRUE(idle.Run([&] { return !idle.goaways.empty(); }));
  EXPECT_EQ(idle.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kNoProgress)], 1u);
}

// A gRPC client whose window for a new call is shut announces 5 bytes (a message header) on
// that call's stream before its answer: many calls doing so are progress. Tiny updates on one
// stream over and over are not.
TEST_F(Http2Test, SmallWindowUpdatesOnNewCallsAreProgress) {
  Server::Options options;
  options.http2.no_progress_burst = 10;
  options.http2.no_progress_rate = 1;
  Start(options);
  H2Client c(server_->port());
  std::vector<int32_t> held;
  for (int i = 0; i < 40; ++i) held.push_back(c.Submit("/hold", "call"));
  c.RunFor(std::chrono::milliseconds(50));  // the streams are open (nghttp2 sends a stream's
                                            // WINDOW_UPDATE ahead of its HEADERS otherwise)
  for (int32_t id : held) {
    c.WindowUpdate(5, id);
    c.RunFor(std::chrono::milliseconds(1));  // one frame each (nghttp2 merges queued ones)
  }
  c.RunFor(std::chrono::milliseconds(300));
  EXPECT_TRUE(c.goaways.empty());
  const int32_t id = c.Submit("/hold", "again and again");
  c.RunFor(std::chrono::milliseconds(50));
  for (int i = 0; i < 40; ++i) {
    c.WindowUpdate(5, id);
    c.RunFor(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(c.Run([&] { return !c.goaways.empty(); }));
  EXPECT_EQ(c.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kNoProgress)], 1u);
}

// gRPC's C core grows the connection's window by the 5 bytes it announces on each new call, so
// every call sends a 5-byte connection WINDOW_UPDATE too, also when its answer has no DATA (a
// refusal): one per new request is progress (issue 33: python3-grpcio under overload was cut
// for it). Tiny connection updates beyond those still drain the bucket.
TEST_F(Http2Test, ConnectionWindowUpdatesOfNewCallsAreProgress) {
  Server::Options options;
  options.http2.no_progress_burst = 10;
  options.http2.no_progress_rate = 1;
  Start(options);
  H2Client c(server_->port());
  for (int i = 0; i < 40; ++i) {
    c.Submit("/hold", "call");
    c.RunFor(std::chrono::milliseconds(1));
    c.WindowUpdate(5);
    c.RunFor(std::chrono::milliseconds(1));
  }
  c.RunFor(std::chrono::milliseconds(300));
  EXPECT_TRUE(c.goaways.empty());
  for (int i = 0; i < 40; ++i) {
    c.WindowUpdate(5);
    c.RunFor(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(c.Run([&] { return !c.goaways.empty(); }));
  EXPECT_EQ(c.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kNoProgress)], 1u);
}

// Under overload clients give up on calls they waited for (their deadline): those resets are
// neither premature nor counted against the reset rate. Resets sent with the requests are.
TEST_F(Http2Test, ResetsAfterAPatientWaitAreNotAbuse) {
  Server::Options options;
  options.http2.premature_reset_streams = 10;
  options.http2.reset_burst = 5;
  options.http2.reset_rate = 1;
  Start(options);
  const auto submit_and_reset = [](H2Client& c, const std::string& path, int n,
                                   std::chrono::milliseconds wait) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(c.Submit(path, "call"));
    c.RunFor(wait);
    for (int32_t id : ids) c.Reset(id);
    c.RunFor(std::chrono::milliseconds(100));
  };
  H2Client patient(server_->port());
  submit_and_reset(patient, "/hold", 30, std::chrono::milliseconds(250));  // waited 100 ms+
  EXPECT_TRUE(patient.goaways.empty());
  H2Client timed(server_->port());
  submit_and_reset(timed, "/deadline", 30, std::chrono::milliseconds(40));  // past the deadline
  EXPECT_TRUE(timed.goaways.empty());
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kPrematureResets)], 0u);
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kResetRate)], 0u);
  // Sent, then reset at once (nghttp2 sends no reset for a request it has not sent yet).
  H2Client rapid(server_->port());
  for (int i = 0; i < 30; ++i) {
    const int32_t id = rapid.Submit("/hold", "call");
    rapid.RunFor(std::chrono::milliseconds(1));
    rapid.Reset(id);
  }
  ASSERT_TRUE(rapid.Run([&] { return !rapid.goaways.empty(); }));
  EXPECT_EQ(rapid.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  const Server::Stats stats = server_->stats();
  EXPECT_EQ(stats.abuse[static_cast<int>(AbuseReason::kPrematureResets)] +
                stats.abuse[static_cast<int>(AbuseReason::kResetRate)],
            1u);
}

// A client at its stream limit (SETTINGS_MAX_CONCURRENT_STREAMS) queues its calls, their
// deadlines running: some are answered, some it resets soon after they got a slot and were
// sent. Those resets are not premature (they still take the reset bucket's tokens, which the
// answered calls pay for). The same calls on a connection below its limit end it.
TEST_F(Http2Test, ResetsOfCallsThatWaitedForAStreamSlotAreNotPremature) {
  Server::Options options;
  options.http2.max_concurrent_streams = 8;
  options.http2.premature_reset_streams = 10;
  options.http2.reset_burst = 5;
  options.http2.reset_rate = 1;
  Start(options);
  // 7 slots held by calls still waiting; the last one takes, in turn, a call that is answered
  // and one that is reset 20 ms after it was sent (handed over by then, well within
  // kPatientReset): half of the connection's closed streams end early.
  const auto answered_and_reset = [](H2Client& c, int rounds) {
    for (int i = 0; i < rounds && c.goaways.empty(); ++i) {
      const int32_t answered = c.Submit("/unary", "call");
      if (!c.Run([&] { return c.results[answered].closed; })) return false;
      const int32_t reset = c.Submit("/hold", "call");
      c.RunFor(std::chrono::milliseconds(20));
      c.Reset(reset);
      c.RunFor(std::chrono::milliseconds(5));
    }
    c.RunFor(std::chrono::milliseconds(100));
    return true;
  };
  H2Client at_limit(server_->port());
  for (int i = 0; i < 7; ++i) at_limit.Submit("/hold", "waiting");
  at_limit.RunFor(std::chrono::milliseconds(20));
  ASSERT_TRUE(answered_and_reset(at_limit, 24));
  EXPECT_TRUE(at_limit.goaways.empty());
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kPrematureResets)], 0u);
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kResetRate)], 0u);
  // The same calls alone on a connection: its resets are premature, and end it.
  H2Client below(server_->port());
  ASSERT_TRUE(answered_and_reset(below, 24));
  ASSERT_TRUE(below.Run([&] { return !below.goaways.empty(); }));
  EXPECT_EQ(below.goaway_error, static_cast<uint32_t>(NGHTTP2_ENHANCE_YOUR_CALM));
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kPrematureResets)], 1u);
}

// Raw HTTP/2 frames, for what nghttp2's client session would not send.
std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const uint32_t n = static_cast<uint32_t>(payload.size());
  f += static_cast<char>(n >> 16);
  f += static_cast<char>(n >> 8);
  f += static_cast<char>(n);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
  return f + payload;
}

std::string RstStream(uint32_t stream) {
  return Frame(NGHTTP2_RST_STREAM, 0, stream, std::string("\0\0\0\x08", 4));  // CANCEL
}

// The filter takes out exactly the resets of client streams no HEADERS has opened, wherever the
// reads split the bytes (frame headers and payloads cut anywhere, one byte at a time).
TEST(IdleResetFilterTest, DropsOnlyResetsOfStreamsNeverOpened) {
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  const std::string kept_before = preface + Frame(NGHTTP2_SETTINGS, 0, 0, "") +
                                  Frame(NGHTTP2_HEADERS, 0x4, 1, "abc");
  const std::string idle_reset = RstStream(3);
  const std::string kept_after =
      Frame(NGHTTP2_DATA, 0, 1, "hello") + RstStream(1) +           // a reset of an open stream
      Frame(NGHTTP2_HEADERS, 0x5, 7, "xyz") + RstStream(5) +        // below the highest: kept
      RstStream(2) +                                                 // a server stream: kept
      Frame(NGHTTP2_RST_STREAM, 0, 9, "12345") +                    // a bad length: nghttp2's
      Frame(NGHTTP2_DATA, 0, 7, std::string(300, 'd'));
  const std::string trailing_idle = RstStream(11);
  const std::string input = kept_before + idle_reset + kept_after + trailing_idle;
  const std::string expected = kept_before + kept_after;
  for (size_t cut = 0; cut <= input.size(); ++cut) {
    for (size_t step : {size_t{1}, size_t{7}, input.size()}) {
      internal::IdleResetFilter filter;
      std::string out;
      std::vector<int32_t> dropped;
      const auto feed = [&](const uint8_t* p, size_t n) {
        out.append(reinterpret_cast<const char*>(p), n);
        return true;
      };
      const auto drop = [&](int32_t id) { dropped.push_back(id); };
      const auto* bytes = reinterpret_cast<const uint8_t*>(input.data());
      ASSERT_TRUE(filter.Filter(bytes, cut, feed, drop));
      for (size_t at = cut; at < input.size(); at += step) {
        ASSERT_TRUE(filter.Filter(bytes + at, std::min(step, input.size() - at), feed, drop));
      }
      ASSERT_EQ(out, expected) << "cut at " << cut << ", then reads of " << step;
      ASSERT_THAT(dropped, ElementsAre(3, 11)) << "cut at " << cut << ", then reads of " << step;
      EXPECT_EQ(filter.highest_opened(), 7);
    }
  }
}

// gRPC's C core, cancelling a call between taking its stream id and writing its HEADERS (a 1 ms
// deadline), resets a stream it never opened (grpc/grpc#38758). RFC 9113 makes that a
// connection error; like gRPC's own servers, the engine ignores it: the connection and its
// later calls go on, and no defence fires.
TEST_F(Http2Test, AResetOfAStreamNeverOpenedEndsNothing) {
  Start();
  H2Client c(server_->port());
  c.RunFor(std::chrono::milliseconds(20));  // the preface and SETTINGS go first
  c.SendRaw(RstStream(1));
  c.SetNextStreamId(3);
  const int32_t id = c.Submit("/unary", "after the reset");
  ASSERT_EQ(id, 3);
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  EXPECT_EQ(c.results[id].status, 200);
  EXPECT_EQ(c.results[id].body, "after the reset");
  EXPECT_TRUE(c.goaways.empty()) << c.goaway_debug;
  for (uint64_t count : server_->stats().abuse) EXPECT_EQ(count, 0u);
}

// A client that keeps its window shut: past the connection's answer budget its new requests are
// refused to the handler (Refusal::kAnswersUnread, never REFUSED_STREAM), a request dispatched
// before sees answers_over_budget(), and the answer over the budget still completes once read.
TEST_F(Http2Test, UnreadAnswersPastTheAnswerBudgetRefuseNewRequests) {
  Server::Options options;
  options.connection_answer_budget_bytes = 512 << 10;
  options.connection_budget_bytes = 64 << 10;  // request bytes: apart, and not reached here
  Start(options);
  H2Client c(server_->port(), /*window=*/0);
  const int32_t held = c.Submit("/hold", "");
  ASSERT_TRUE(c.Run([&] { return handler_.held() != nullptr; }));
  std::shared_ptr<Exchange> early = handler_.held();
  EXPECT_FALSE(early->answers_over_budget());
  const int32_t big = c.Submit("/big", "");  // 1 MiB, unsent: the window is shut
  c.RunFor(std::chrono::milliseconds(200));
  ASSERT_TRUE(early->answers_over_budget());
  std::vector<int32_t> refused;
  for (int i = 0; i < 3; ++i) refused.push_back(c.Submit("/unary", std::string(1000, 'r')));
  ASSERT_TRUE(c.Run([&] {
    for (int32_t id : refused) {
      if (!c.results[id].closed) return false;
    }
    return true;
  }));
  for (int32_t id : refused) {
    EXPECT_EQ(c.results[id].status, 429);
    EXPECT_EQ(c.results[id].error, 0u) << "refused in the handler's terms, not reset";
    EXPECT_THAT(c.results[id].headers,
                ::testing::Contains(Pair("x-refusal", absl::StrCat(static_cast<int>(
                                                          Exchange::Refusal::kAnswersUnread)))));
  }
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kAnswersUnread)], 3u);
  EXPECT_EQ(server_->stats().abuse[static_cast<int>(AbuseReason::kStreamRefused)], 0u);
  // The client reads: the big answer, over the budget on its own, completes whole.
  c.WindowUpdate(4 << 20, big);
  c.WindowUpdate(4 << 20, 0);
  ASSERT_TRUE(c.Run([&] { return c.results[big].closed; }));
  EXPECT_EQ(c.results[big].body, std::string(1 << 20, 'b'));
  EXPECT_FALSE(early->answers_over_budget());
  const int32_t after = c.Submit("/empty-trailers", "");
  ASSERT_TRUE(c.Run([&] { return c.results[after].closed; }));
  EXPECT_EQ(c.results[after].status, 200);
  handler_.Release();
  c.WindowUpdate(1 << 20, held);
  ASSERT_TRUE(c.Run([&] { return c.results[held].closed; }));
  EXPECT_EQ(c.results[held].body, "late\n");
  EXPECT_EQ(SettledBufferedBytes(*server_), 0);
}

TEST_F(Http2Test, ConcurrentUploadsPastTheConnectionBudgetAllComplete) {
  Server::Options options;
  options.connection_budget_bytes = 256 << 10;
  options.http2.stream_window_bytes = 64 << 10;
  options.http2.connection_window_bytes = 128 << 10;
  Start(options);
  H2Client c(server_->port());
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(c.Submit("/unary", std::string(1 << 20, 'a' + i)));
  ASSERT_TRUE(c.Run([&] {
    for (int32_t id : ids) {
      if (!c.results[id].closed) return false;
    }
    return true;
  }));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.results[ids[i]].status, 200);
    EXPECT_EQ(c.results[ids[i]].body, std::string(1 << 20, 'a' + i));
  }
  EXPECT_EQ(server_->stats().read_timeouts, 0u);
  EXPECT_EQ(SettledBufferedBytes(*server_), 0);
}

// The server's budget spent by bodies under way on many connections: a few connections at a time
// get to finish theirs (progress grants) while the others wait, so every upload completes.
TEST_F(Http2Test, UploadsPastTheServerBudgetStillComplete) {
  Server::Options options;
  options.memory_budget_bytes = 512 << 10;
  options.http2.stream_window_bytes = 64 << 10;
  Start(options);
  std::vector<std::unique_ptr<H2Client>> clients;
  std::vector<int32_t> ids;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<H2Client>(server_->port()));
    ids.push_back(clients.back()->Submit("/unary", std::string(512 << 10, 'k')));
  }
  // Each client is driven in turn until all are done.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool all = false;
  while (!all && std::chrono::steady_clock::now() < deadline) {
    all = true;
    for (size_t i = 0; i < clients.size(); ++i) {
      H2Client& c = *clients[i];
      const int32_t id = ids[i];
      if (!c.results[id].closed) {
        all = false;
        c.RunFor(std::chrono::milliseconds(20));
      }
    }
  }
  ASSERT_TRUE(all);
  for (size_t i = 0; i < clients.size(); ++i) {
    EXPECT_EQ(clients[i]->results[ids[i]].status, 200);
    EXPECT_EQ(clients[i]->results[ids[i]].body.size(), 512u << 10);
  }
  EXPECT_EQ(server_->stats().read_timeouts, 0u);
}

// Past the server's budget a connection takes the body of its oldest request only: if that one
// sends nothing while another stream's bytes are held back, the stall is the client's and the
// read timeout ends it (its progress grant goes back), however the other streams trickle.
TEST_F(Http2Test, AnIdleOldestRequestPastTheServerBudgetIsCutByTheReadTimeout) {
  Server::Options options;
  options.memory_budget_bytes = 64 << 10;
  options.http2.stream_window_bytes = 64 << 10;
  options.read_timeout = absl::Milliseconds(300);
  Start(options);
  H2Client c(server_->port());
  c.Submit("/unary", "", /*end=*/false);  // the oldest request: headers, then nothing
  const int32_t other = c.Submit("/unary", std::string(96 << 10, 'x'), /*end=*/false);
  for (int i = 0; i < 20 && c.connected() && !c.eof; ++i) {
    c.RunFor(std::chrono::milliseconds(100));
    c.Send(other, "y", /*end=*/false);  // a byte now and then on the other stream
  }
  EXPECT_TRUE(c.Run([&] { return c.eof || !c.goaways.empty(); }));
  EXPECT_EQ(server_->stats().read_timeouts, 1u);
  EXPECT_EQ(SettledBufferedBytes(*server_), 0);
}

// Headers over the limit on a request whose body is still to come: 431, and the stream is reset
// after it, so nothing of it stays open on the server.
TEST_F(Http2Test, HeadersTooLargeOnAnOpenStreamAreAnsweredAndReset) {
  Server::Options options;
  options.max_header_bytes = 1024;
  Start(options);
  H2Client c(server_->port());
  const int32_t id = c.Submit("/unary", "", /*end=*/false, "POST",
                              {{"x-big", std::string(4000, 'h')}});
  ASSERT_TRUE(c.Run([&] { return c.results[id].closed; }));
  EXPECT_EQ(c.results[id].status, 431);
  EXPECT_EQ(server_->stats().header_too_large, 1u);
  const int32_t next = c.Submit("/unary", "still here");
  ASSERT_TRUE(c.Run([&] { return c.results[next].closed; }));
  EXPECT_EQ(c.results[next].body, "still here");
}

// Work for a stream that is gone is not done: a request whose stream ends in the same read as the
// request itself - reset by the client (Rapid Reset), or by us for a frame of the client's
// (MadeYouReset: a WINDOW_UPDATE overflowing the stream's window; HEADERS after the client's
// END_STREAM, a connection error nghttp2 reports as an invalid frame) - is never handed to the
// handler, which might run its work at once on the loop. The same request alone is. (DATA after
// END_STREAM also ends the connection, but nghttp2 says so only when its GOAWAY is sent: that
// read's requests are still handed over, and the connection closes under them.)
TEST_F(Http2Test, ARequestWhoseStreamEndsInTheSameReadIsNotHandedOver) {
  Start();
  // POST /hold (kept by the handler), END_STREAM on the HEADERS: static table :method POST,
  // :scheme http; :path and :authority literal with an indexed name.
  const std::string block = std::string("\x83\x86\x04\x05/hold\x01\x01x", 12);
  const std::string request = Frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS |
                                                         NGHTTP2_FLAG_END_STREAM, 1, block);
  const std::string preface =
      std::string(NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN) + Frame(NGHTTP2_SETTINGS, 0, 0, "");
  const struct {
    const char* what;
    std::string after;
    bool handed_over;
  } cases[] = {
      {"alone", "", true},
      {"client reset", Frame(NGHTTP2_RST_STREAM, 0, 1, std::string("\0\0\0\x8", 4)), false},
      {"window overflow", Frame(NGHTTP2_WINDOW_UPDATE, 0, 1, std::string("\x7f\xff\xff\xff", 4)),
       false},
      {"headers after the end",
       Frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 1,
             std::string("\x40\x01y\x01z", 5)),
       false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    handler_.Release();
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    // A PING after it all: its ACK is sent once the read before it has been dealt with (the
    // hand-over decided); a connection error ends the connection instead.
    const std::string wire =
        preface + request + c.after + Frame(NGHTTP2_PING, 0, 0, std::string(8, '\x01'));
    ASSERT_EQ(send(fd, wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
    std::string in;
    bool ping_acked = false, ended = false;
    while (!ping_acked && !ended) {
      pollfd p{fd, POLLIN, 0};
      ASSERT_GT(poll(&p, 1, 10000), 0);
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      in.append(buf, static_cast<size_t>(n));
      size_t at = 0;
      while (at + 9 <= in.size()) {
        const size_t len = (static_cast<uint8_t>(in[at]) << 16) |
                           (static_cast<uint8_t>(in[at + 1]) << 8) | static_cast<uint8_t>(in[at + 2]);
        if (at + 9 + len > in.size()) break;
        const uint8_t type = static_cast<uint8_t>(in[at + 3]);
        if (type == NGHTTP2_PING && (in[at + 4] & NGHTTP2_FLAG_ACK) != 0) ping_acked = true;
        if (type == NGHTTP2_GOAWAY) ended = true;
        at += 9 + len;
      }
      in.erase(0, at);
    }
    close(fd);
    EXPECT_EQ(handler_.held() != nullptr, c.handed_over);
  }
}

// "/block": holds the loop for 300 ms (its client's next requests pile up in the socket), then
// answers; any other path: notes the loop's charge it sees (LoopLoad::charged), charges 1 and
// answers at once, on the loop.
class ChargeHandler final : public Handler {
 public:
  void Handle(std::shared_ptr<Exchange> exchange) override {
    if (exchange->path() == "/block") {
      absl::SleepFor(absl::Milliseconds(300));
    } else {
      const LoopLoad load = CurrentLoopLoad();
      ChargeLoop(1);
      absl::MutexLock lock(&mu_);
      all_on_loop_ = all_on_loop_ && load.on_loop;
      max_charged_ = std::max(max_charged_, load.charged);
      ++calls_;
    }
    exchange->Respond({200, {{"content-type", "text/plain"}}, "ok"});
  }
  int64_t calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int64_t max_charged() {
    absl::MutexLock lock(&mu_);
    return max_charged_;
  }
  bool all_on_loop() {
    absl::MutexLock lock(&mu_);
    return all_on_loop_;
  }

 private:
  absl::Mutex mu_;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_charged_ ABSL_GUARDED_BY(mu_) = 0;
  bool all_on_loop_ ABSL_GUARDED_BY(mu_) = true;
};

// The loop's charge (LoopLoad::charged: what bounds the work handlers run on a loop, see
// ops::InlineRule) runs for a connection's whole turn - its reads the loop makes in a row before
// it serves another connection - not for one read: a client whose requests fill read after read
// gets one turn's budget, as the work run for it delays the loop's other connections all the
// same. (Reset per read, a turn of 8 full reads ran 8 budgets' worth.)
TEST(Http2LoopChargeTest, RunsForAWholeTurnOfReads) {
  ChargeHandler handler;
  Server::Options options;
  options.address = "127.0.0.1:0";
  options.threads = 1;
  options.http2.max_concurrent_streams = 100000;  // every request open at once
  options.connection_budget_bytes = 64 << 20;      // their header text
  Server server(options, &handler);
  ASSERT_TRUE(server.Start().ok());

  // The client's bytes, made by libnghttp2's client session into a buffer: /block, then
  // kRequests GETs of at least kMinRequestBytes each (a padding header never indexed).
  constexpr int kRequests = 4000;
  constexpr size_t kPad = 200;
  constexpr size_t kMinRequestBytes = 9 + kPad;
  std::string wire;
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_send_callback(
      cb, [](nghttp2_session*, const uint8_t* data, size_t len, int, void* out) -> ssize_t {
        static_cast<std::string*>(out)->append(reinterpret_cast<const char*>(data), len);
        return static_cast<ssize_t>(len);
      });
  nghttp2_option* opt = nullptr;
  nghttp2_option_new(&opt);
  nghttp2_option_set_peer_max_concurrent_streams(opt, 100000);
  nghttp2_session* session = nullptr;
  ASSERT_EQ(nghttp2_session_client_new2(&session, cb, &wire, opt), 0);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  const std::string pad(kPad, '{');  // 15 bits in HPACK's Huffman code: sent as is
  const auto submit = [&](const std::string& path) {
    const std::string fields[][2] = {
        {":method", "GET"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"x-pad", pad}};
    std::vector<nghttp2_nv> nva;
    for (const auto& f : fields) {
      nva.push_back(nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(f[0].data())),
                               reinterpret_cast<uint8_t*>(const_cast<char*>(f[1].data())),
                               f[0].size(), f[1].size(), NGHTTP2_NV_FLAG_NO_INDEX});
    }
    ASSERT_GT(nghttp2_submit_request(session, nullptr, nva.data(), nva.size(), nullptr, nullptr), 0);
  };
  submit("/block");
  for (int i = 0; i < kRequests; ++i) submit("/charge");
  ASSERT_EQ(nghttp2_session_send(session), 0);
  nghttp2_session_del(session);
  ASSERT_GT(wire.size(), kRequests * kMinRequestBytes);

  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  std::thread writer([&] {
    size_t at = 0;
    while (at < wire.size()) {
      const ssize_t n = send(fd, wire.data() + at, wire.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  });
  // The answers are read (and dropped) until every request has been handled.
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (handler.calls() < kRequests && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) > 0 && recv(fd, buf, sizeof(buf), 0) <= 0) break;
  }
  shutdown(fd, SHUT_RDWR);
  writer.join();
  close(fd);
  ASSERT_EQ(handler.calls(), kRequests);
  EXPECT_TRUE(handler.all_on_loop());
  // One 64 KiB read holds at most this many of the requests: a charge above it was run up over
  // two reads or more of one turn.
  const int64_t per_read = static_cast<int64_t>((64 << 10) / kMinRequestBytes) + 1;
  EXPECT_GT(handler.max_charged(), per_read);
  server.Stop(absl::Now() + absl::Seconds(5));
}

TEST_F(Http2Test, Http11TrailersGoInAChunkedBody) {
  Start();
  const int fd = Connect(server_->port());
  const std::string request = "POST /unary HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string data;
  char buf[4096];
  while (data.find("0\r\n") == std::string::npos || !absl::EndsWith(data, "\r\n\r\n")) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_GT(poll(&p, 1, 10000), 0);
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_THAT(data, HasSubstr("transfer-encoding: chunked\r\n"));
  EXPECT_THAT(data, HasSubstr("trailer: x-end, x-count\r\n"));
  EXPECT_THAT(data, HasSubstr("\r\n\r\n2\r\nhi\r\n0\r\nx-end: done\r\nx-count: 1\r\n\r\n"));
}

}  // namespace
}  // namespace offload::httpd
