// A blocking HTTP/1.1 client over a plain loopback socket, for tests of the HTTP servers: it sends
// exactly the bytes a test writes (malformed requests included) and reads one response framed by
// Content-Length (or until the server closes).
//
//   offload::testhttp::Connection c(port);
//   c.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
//   offload::testhttp::Response r = c.Read();   // r.status == 200, r.headers["content-type"]
//
// Thread-safety: one Connection per thread.
#ifndef TESTS_TESTING_HTTP_CLIENT_H_
#define TESTS_TESTING_HTTP_CLIENT_H_

#include <chrono>
#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace offload::testhttp {

struct Response {
  int status = 0;                             // 0: no (complete) response
  std::map<std::string, std::string> headers;  // lower-case names; repeated ones joined by ", "
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  bool has(const std::string& name) const { return headers.count(name) > 0; }
};

// A blocking socket connected to 127.0.0.1:`port`, or -1.
int ConnectLoopback(int port);

class Connection {
 public:
  explicit Connection(int port);  // 127.0.0.1:port; connected() says whether it worked
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool connected() const { return fd_ >= 0; }
  void Send(absl::string_view bytes);
  // One response; `head_only` for a HEAD request (no body follows).
  Response Read(std::chrono::milliseconds timeout = std::chrono::seconds(20),
                bool head_only = false);
  // True if the server closed the connection within `timeout` (data read meanwhile is dropped).
  bool ClosedWithin(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  std::string buffered_;
};

// One request on a new connection: `head` is the request line and headers without the final
// blank line; Host, Connection: close and Content-Length are added.
Response Request(int port, const std::string& head, const std::string& body = "");

}  // namespace offload::testhttp

#endif  // TESTS_TESTING_HTTP_CLIENT_H_
