// Test helper: runs real offload_server processes on free loopback ports and reads their
// Prometheus counters. For the client's integration tests only (gtest assertions inside).
#ifndef CLIENT_CPP_TEST_SERVER_H_
#define CLIENT_CPP_TEST_SERVER_H_

#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"

namespace offload::client::testing {

// The server binary: $OFFLOAD_SERVER, else the path CMake compiled in.
inline std::string ServerBinary() {
  const char* env = std::getenv("OFFLOAD_SERVER");
  if (env != nullptr && *env != '\0') return env;
#ifdef OFFLOAD_SERVER_PATH
  return OFFLOAD_SERVER_PATH;
#else
  return "";
#endif
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Flags ending in _address that the binary knows (from --helpfull), so each listener it has
// (gRPC, metrics, an HTTP gateway...) gets its own free port.
inline std::set<std::string> AddressFlags(const std::string& binary) {
  std::set<std::string> flags;
  FILE* p = popen((binary + " --helpfull 2>&1").c_str(), "r");
  if (p == nullptr) return flags;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  std::regex re("--([a-z][a-z0-9_]*_address)\\b");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    flags.insert((*it)[1]);
  }
  return flags;
}

inline size_t CurlAppend(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// GET http://`address``path`; empty on failure.
inline std::string HttpGet(const std::string& address, const std::string& path) {
  static const bool init = (curl_global_init(CURL_GLOBAL_DEFAULT) == 0);
  (void)init;
  std::string body;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return body;
  const std::string url = absl::StrCat("http://", address, path);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, CurlAppend);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) body.clear();
  return body;
}

// offload_requests_total by method (summed over services and codes).
inline std::map<std::string, double> RequestCounts(const std::string& metrics_text) {
  std::map<std::string, double> out;
  static const std::regex re("method=\"([A-Za-z]+)\"");
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    if (!absl::StartsWith(line, "offload_requests_total{")) continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &v)) continue;
    std::string l(line);
    std::smatch m;
    if (std::regex_search(l, m, re)) out[m[1]] += v;
  }
  return out;
}

class ServerProcess {
 public:
  explicit ServerProcess(std::string name) : name_(std::move(name)) {}
  ~ServerProcess() {
    Kill();
    std::error_code ec;
    if (!dir_.empty() && std::getenv("OFFLOAD_KEEP") == nullptr) {
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Starts the process and waits until a ListKeys answers. gtest failures on trouble.
  void Start() {
    const std::string binary = ServerBinary();
    ASSERT_FALSE(binary.empty()) << "no server binary: set OFFLOAD_SERVER";
    char tmpl[] = "/tmp/offload-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_ = dir_ + "/" + name_ + ".log";
    address_ = absl::StrCat("127.0.0.1:", FreePort());
    metrics_address_ = absl::StrCat("127.0.0.1:", FreePort());
    std::vector<std::string> args = {binary, "--grpc_address=" + address_,
                                      "--data_dir=" + dir_ + "/data",
                                      "--metrics_address=" + metrics_address_};
    for (const std::string& flag : AddressFlags(binary)) {
      if (flag == "grpc_address" || flag == "metrics_address") continue;
      args.push_back(absl::StrCat("--", flag, "=127.0.0.1:", FreePort()));
    }
    std::filesystem::create_directories(dir_ + "/data");
    unsigned char kek[32];
    randombytes_buf(kek, sizeof(kek));
    char kek_hex[65];
    sodium_bin2hex(kek_hex, sizeof(kek_hex), kek, sizeof(kek));

    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      FILE* log = std::fopen(log_.c_str(), "w");
      if (log != nullptr) {
        dup2(fileno(log), 1);
        dup2(fileno(log), 2);
      }
      setenv("OFFLOAD_KEK", kek_hex, 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    ClientOptions o;
    o.endpoints = address_;
    o.timeout = absl::Seconds(1);
    o.max_attempts = 1;
    auto probe = Client::Create(o);
    ASSERT_TRUE(probe.ok()) << probe.status();
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (absl::Now() < give_up) {
      int wstatus = 0;
      ASSERT_EQ(waitpid(pid_, &wstatus, WNOHANG), 0) << name_ << " exited early\n" << LogTail();
      if ((*probe)->ListKeys().ok()) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << name_ << " not answering after 60s\n" << LogTail();
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // offload_requests_total by method, read from /metrics.
  std::map<std::string, double> Requests() const {
    return RequestCounts(HttpGet(metrics_address_, "/metrics"));
  }
  double TotalRequests() const {
    double sum = 0;
    for (const auto& [m, v] : Requests()) sum += v;
    return sum;
  }

  std::string LogTail() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    if (s.size() > 4000) s = s.substr(s.size() - 4000);
    return absl::StrCat("---- ", name_, " log ----\n", s, "\n---- end ----");
  }

  const std::string& address() const { return address_; }
  const std::string& name() const { return name_; }
  bool running() const { return pid_ > 0; }

 private:
  std::string name_;
  std::string dir_;
  std::string log_;
  std::string address_;
  std::string metrics_address_;
  pid_t pid_ = -1;
};

}  // namespace offload::client::testing

#endif  // CLIENT_CPP_TEST_SERVER_H_
