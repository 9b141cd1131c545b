// An event loop thread (a Boost.Asio io_context run by one thread) and what it owns: its
// connections, a periodic sweep (timeouts, budgets, drain steps) and the buffer every plain
// connection of the loop reads into (so that an idle connection holds no read buffer).
// Included by server.cc and conn.cc only: Asio headers are heavy.
#ifndef SERVICE_HTTPD_INTERNAL_LOOP_H_
#define SERVICE_HTTPD_INTERNAL_LOOP_H_

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/notification.h"
#include "service/httpd/internal/engine.h"

namespace offload::httpd::internal {

class SocketConn;

class Loop {
 public:
  Loop(Server::Impl* impl, boost::asio::ssl::context* tls);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // The loop whose thread this is, or null.
  static Loop* Current();

  Server::Impl* impl() const { return impl_; }
  boost::asio::io_context& ctx() { return ctx_; }
  const std::shared_ptr<Mailbox>& mailbox() const { return mailbox_; }
  char* read_buffer() { return read_buffer_.data(); }
  size_t read_buffer_size() const { return read_buffer_.size(); }
  // The small read buffers of connections in use (SocketConn's hot reads), pooled per loop.
  // A page from mmap (null if none could be had: the connection then stays cold).
  static constexpr size_t kHotBufferBytes = 4096;
  struct UnmapBuffer {
    void operator()(char* p) const;
  };
  using ReadBuffer = std::unique_ptr<char, UnmapBuffer>;
  ReadBuffer TakeReadBuffer();
  void GiveReadBuffer(ReadBuffer buffer);

  // Starts the thread / joins it (after Stop has run there).
  void Start();
  void Join();

  // Loop thread: a new connection; one that has closed; drain; stop (idle connections close at
  // once, busy ones once their answers are written or after a second; then the thread ends).
  void Adopt(boost::asio::ip::tcp::socket socket);
  void Remove(SocketConn* conn);
  void Drain();
  void Stop();
  bool stopping() const { return stopping_; }

 private:
  void Run();
  void ArmSweep();
  void Sweep();
  void MaybeExit();

  Server::Impl* const impl_;
  boost::asio::ssl::context* const tls_;
  boost::asio::io_context ctx_{1};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  boost::asio::steady_timer sweep_timer_;
  std::shared_ptr<Mailbox> mailbox_;
  std::vector<char> read_buffer_;
  std::vector<ReadBuffer> free_buffers_;  // kept for reuse, at most 32
  absl::flat_hash_map<SocketConn*, std::shared_ptr<SocketConn>> conns_;
  bool draining_ = false;
  bool stopping_ = false;
  Clock::time_point stop_started_;
  std::thread thread_;
};

}  // namespace offload::httpd::internal

#endif  // SERVICE_HTTPD_INTERNAL_LOOP_H_
