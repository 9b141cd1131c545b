#include "tests/testing/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace offload::testhttp {

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

Connection::Connection(int port) : fd_(ConnectLoopback(port)) {}

Connection::~Connection() {
  if (fd_ >= 0) close(fd_);
}

void Connection::Send(absl::string_view bytes) {
  while (fd_ >= 0 && !bytes.empty()) {
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

Response Connection::Read(std::chrono::milliseconds timeout, bool head_only) {
  Response r;
  if (fd_ < 0) return r;
  const auto end = std::chrono::steady_clock::now() + timeout;
  size_t header_end = std::string::npos;
  size_t length = std::string::npos;
  bool eof = false;
  char buf[65536];
  while (true) {
    if (header_end == std::string::npos) header_end = buffered_.find("\r\n\r\n");
    if (header_end != std::string::npos && r.status == 0) {
      const std::string head = buffered_.substr(0, header_end);
      std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
      if (lines.empty() || lines[0].size() < 12 || !absl::SimpleAtoi(lines[0].substr(9, 3), &r.status)) {
        r.status = -1;
        return r;
      }
      for (size_t i = 1; i < lines.size(); ++i) {
        const size_t colon = lines[i].find(':');
        if (colon == std::string::npos) continue;
        const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
        const std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
        auto [it, fresh] = r.headers.emplace(name, value);
        if (!fresh) it->second += ", " + value;
      }
      if (head_only || r.status == 204 || r.status == 304) {
        length = 0;
      } else if (r.has("content-length")) {
        (void)absl::SimpleAtoi(r.header("content-length"), &length);
      }
    }
    if (r.status != 0 && length != std::string::npos && buffered_.size() >= header_end + 4 + length) {
      r.body = buffered_.substr(header_end + 4, length);
      buffered_.erase(0, header_end + 4 + length);
      return r;
    }
    if (eof) {
      if (r.status != 0 && length == std::string::npos) {
        r.body = buffered_.substr(header_end + 4);  // framed by the close
        buffered_.clear();
      } else {
        r.status = 0;
      }
      return r;
    }
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          end - std::chrono::steady_clock::now())
                                          .count());
    if (left <= 0) {
      r.status = 0;
      return r;
    }
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      eof = true;
      continue;
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

bool Connection::ClosedWithin(std::chrono::milliseconds timeout) {
  if (fd_ < 0) return true;
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (true) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          end - std::chrono::steady_clock::now())
                                          .count());
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    if (recv(fd_, buf, sizeof(buf), 0) <= 0) return true;
  }
}

Response Request(int port, const std::string& head, const std::string& body) {
  Connection c(port);
  c.Send(absl::StrCat(head, "\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body));
  return c.Read(std::chrono::seconds(20), absl::StartsWith(head, "HEAD "));
}

}  // namespace offload::testhttp
