// Test helpers: runs real offload_server processes on free loopback ports (started, killed,
// restarted on the same ports and data) and reads their Prometheus counters; a loopback port
// that accepts TCP and never answers; a gRPC peer that refuses calls as an overloaded server
// does. For the client's integration tests only (gtest assertions
// inside).
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
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "google/protobuf/duration.pb.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "offload/v1/ed25519.grpc.pb.h"

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

// offload_items_total by (method, result), summed over services.
inline std::map<std::pair<std::string, std::string>, double> ItemCounts(
    const std::string& metrics_text) {
  std::map<std::pair<std::string, std::string>, double> out;
  static const std::regex method_re("method=\"([A-Za-z]+)\"");
  static const std::regex result_re("result=\"([a-z]+)\"");
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    if (!absl::StartsWith(line, "offload_items_total{")) continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &v)) continue;
    std::string l(line);
    std::smatch m, r;
    if (std::regex_search(l, m, method_re) && std::regex_search(l, r, result_re)) {
      out[{m[1], r[1]}] += v;
    }
  }
  return out;
}

// A misbehaving peer on a loopback port. kSilent: accepts TCP connections and never sends a byte
// (a hung process, a proxy whose upstream is gone). kDropCalls: speaks just enough HTTP/2 for
// the connection to become ready (its SETTINGS, an ACK of the client's), then closes the
// connection on the first call it sees (a server crashing on every request). Connections are
// held until destruction; one thread each.
class FaultyListener {
 public:
  enum class Mode { kSilent, kDropCalls };

  explicit FaultyListener(Mode mode) : mode_(mode) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 64) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    acceptor_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;  // shut down
        absl::MutexLock lock(&mu_);
        held_.push_back(c);
        if (mode_ == Mode::kDropCalls) workers_.emplace_back([this, c] { DropCalls(c); });
      }
    });
  }
  ~FaultyListener() {
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);  // wakes accept()
    if (acceptor_.joinable()) acceptor_.join();
    if (fd_ >= 0) close(fd_);
    std::vector<std::thread> workers;
    {
      absl::MutexLock lock(&mu_);
      for (int c : held_) shutdown(c, SHUT_RDWR);  // wakes the workers' reads
      workers.swap(workers_);
    }
    for (auto& w : workers) w.join();
    absl::MutexLock lock(&mu_);
    for (int c : held_) close(c);
  }
  FaultyListener(const FaultyListener&) = delete;
  FaultyListener& operator=(const FaultyListener&) = delete;

  const std::string& address() const { return address_; }
  int accepted() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }
  // Calls (HTTP/2 HEADERS frames) seen and dropped (kDropCalls).
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  static bool ReadFull(int c, unsigned char* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = read(c, buf + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  void DropCalls(int c) {
    static const unsigned char kSettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
    static const unsigned char kSettingsAck[9] = {0, 0, 0, 4, 1, 0, 0, 0, 0};
    if (send(c, kSettings, sizeof(kSettings), MSG_NOSIGNAL) != sizeof(kSettings)) return;
    unsigned char preface[24];
    if (!ReadFull(c, preface, sizeof(preface))) return;
    for (;;) {
      unsigned char h[9];
      if (!ReadFull(c, h, sizeof(h))) return;
      const size_t length = (size_t{h[0]} << 16) | (size_t{h[1]} << 8) | h[2];
      std::vector<unsigned char> payload(length);
      if (length > 0 && !ReadFull(c, payload.data(), length)) return;
      if (h[3] == 4 && (h[4] & 1) == 0) {  // the client's SETTINGS
        if (send(c, kSettingsAck, sizeof(kSettingsAck), MSG_NOSIGNAL) != sizeof(kSettingsAck)) return;
      } else if (h[3] == 1) {  // HEADERS: a call
        {
          absl::MutexLock lock(&mu_);
          ++calls_;
        }
        shutdown(c, SHUT_RDWR);
        return;
      }
    }
  }

  const Mode mode_;
  int fd_ = -1;
  std::string address_;
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> held_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A gRPC peer that refuses Ed25519Service.Sign the way an overloaded or draining offload_server
// does: the first `refusals` calls get `code` ("overloaded") with, when `delay` is given, a
// google.rpc.Status holding a google.rpc.RetryInfo in grpc-status-details-bin; later calls are
// answered (a signature of 64 zero bytes: the peer computes nothing). Counts the calls it saw.
// For the client's retry policy only; a real server's refusals are tested against one.
class RefusingPeer {
 public:
  RefusingPeer(grpc::StatusCode code, int refusals, std::optional<absl::Duration> delay)
      : service_(code, refusals, delay) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      ADD_FAILURE() << "RefusingPeer: cannot listen on 127.0.0.1";
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~RefusingPeer() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }
  RefusingPeer(const RefusingPeer&) = delete;
  RefusingPeer& operator=(const RefusingPeer&) = delete;

  const std::string& address() const { return address_; }
  int calls() { return service_.calls(); }

 private:
  class Service final : public v1::Ed25519Service::Service {
   public:
    Service(grpc::StatusCode code, int refusals, std::optional<absl::Duration> delay)
        : code_(code), refusals_(refusals) {
      if (delay.has_value()) {
        google::rpc::Status status;
        status.set_code(static_cast<int>(code));
        status.set_message("overloaded");
        google::rpc::RetryInfo info;
        info.mutable_retry_delay()->set_seconds(absl::ToInt64Seconds(*delay));
        info.mutable_retry_delay()->set_nanos(static_cast<int32_t>(
            absl::ToInt64Nanoseconds(*delay - absl::Seconds(absl::ToInt64Seconds(*delay)))));
        status.add_details()->PackFrom(info);
        details_ = status.SerializeAsString();
      }
    }
    grpc::Status Sign(grpc::ServerContext*, const v1::SignRequest*,
                      v1::SignResponse* response) override {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (refusals_ > 0) {
        --refusals_;
        return grpc::Status(code_, "overloaded", details_);
      }
      response->set_signature(std::string(64, '\0'));
      return grpc::Status::OK;
    }
    int calls() {
      absl::MutexLock lock(&mu_);
      return calls_;
    }

   private:
    const grpc::StatusCode code_;
    std::string details_;
    absl::Mutex mu_;
    int refusals_ ABSL_GUARDED_BY(mu_);
    int calls_ ABSL_GUARDED_BY(mu_) = 0;
  };

  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

class ServerProcess {
 public:
  explicit ServerProcess(std::string name) : name_(std::move(name)) {}
  ~ServerProcess() {
    Kill();
    if (!kek_hex_.empty()) sodium_memzero(kek_hex_.data(), kek_hex_.size());
    std::error_code ec;
    if (!dir_.empty() && std::getenv("OFFLOAD_KEEP") == nullptr) {
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Picks the data directory, the ports and the key-encryption key, once: a Restart keeps them,
  // so the restarted process listens where the old one did and reads the same key file.
  void Prepare() {
    if (!dir_.empty()) return;
    char tmpl[] = "/tmp/offload-client-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_ = dir_ + "/" + name_ + ".log";
    std::filesystem::create_directories(dir_ + "/data");
    unsigned char kek[32];
    randombytes_buf(kek, sizeof(kek));
    char kek_hex[65];
    sodium_bin2hex(kek_hex, sizeof(kek_hex), kek, sizeof(kek));
    kek_hex_ = kek_hex;
    sodium_memzero(kek, sizeof(kek));
    PickPorts();
  }

  // Adds a server flag ("--key_deletion_wait=2s") to every launch from now on.
  void AddFlag(std::string flag) { flags_.push_back(std::move(flag)); }

  // Forks and execs the server (Prepare first if needed); does not wait for it to listen.
  void Launch() {
    const std::string binary = ServerBinary();
    ASSERT_FALSE(binary.empty()) << "no server binary: set OFFLOAD_SERVER";
    ASSERT_LE(pid_, 0) << name_ << " is already running";
    Prepare();
    std::vector<std::string> args = {binary, "--grpc_address=" + address_,
                                      "--data_dir=" + dir_ + "/data",
                                      "--metrics_address=" + metrics_address_};
    args.insert(args.end(), extra_flags_.begin(), extra_flags_.end());
    args.insert(args.end(), flags_.begin(), flags_.end());
    std::error_code ec;
    const auto size = std::filesystem::file_size(log_, ec);
    log_start_ = ec ? 0 : static_cast<size_t>(size);  // this start's lines come after
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      FILE* log = std::fopen(log_.c_str(), "a");
      if (log != nullptr) {
        dup2(fileno(log), 1);
        dup2(fileno(log), 2);
      }
      setenv("OFFLOAD_KEK", kek_hex_.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }

  // Waits until a ListKeys answers (60 s at most). gtest failures on trouble.
  void WaitUntilServing() {
    const absl::Status s = WaitServing();
    if (!s.ok()) FAIL() << name_ << ": " << s.message() << "\n" << LogTail();
  }

  // Starts the process and waits until a ListKeys answers. gtest failures on trouble.
  // FreePort's ports are free when picked, not reserved: a test running beside this one may take
  // one first, and the server then exits with "cannot listen on". A first start then picks fresh
  // ports and tries again (3 times in all); a restart keeps its ports, which clients know.
  void Start() {
    for (int attempt = 1;; ++attempt) {
      Launch();
      if (::testing::Test::HasFatalFailure()) return;
      const absl::Status s = WaitServing();
      if (s.ok()) {
        started_ = true;
        return;
      }
      const std::string log = LogTail();
      if (started_ || attempt >= 3 || !absl::IsFailedPrecondition(s) ||
          !LoggedSinceLaunch("cannot listen on")) {
        FAIL() << name_ << ": " << s.message() << "\n" << log;
      }
      std::printf("%s: a port was taken (attempt %d), starting again on fresh ports\n%s\n",
                  name_.c_str(), attempt, log.c_str());
      pid_ = -1;  // reaped by WaitServing
      PickPorts();
    }
  }

  // SIGKILLs the process and starts it again on the same ports and data (keys survive).
  void Restart() {
    Kill();
    Start();
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
  // offload_items_total by (method, result), read from /metrics.
  std::map<std::pair<std::string, std::string>, double> Items() const {
    return ItemCounts(HttpGet(metrics_address_, "/metrics"));
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

  // The gRPC address ("127.0.0.1:port"); known after Prepare, before the process runs.
  const std::string& address() const { return address_; }
  const std::string& name() const { return name_; }
  bool running() const { return pid_ > 0; }

 private:
  // The gRPC, metrics and every other listener's port (from --helpfull): fresh free ones.
  void PickPorts() {
    address_ = absl::StrCat("127.0.0.1:", FreePort());
    metrics_address_ = absl::StrCat("127.0.0.1:", FreePort());
    extra_flags_.clear();
    for (const std::string& flag : AddressFlags(ServerBinary())) {
      if (flag == "grpc_address" || flag == "metrics_address") continue;
      extra_flags_.push_back(absl::StrCat("--", flag, "=127.0.0.1:", FreePort()));
    }
  }

  // OK once this process has logged "server_started" and a ListKeys answers, or is refused for
  // want of an identity (the log line first:
  // on a port taken by another test's server, that one would answer the probe);
  // FailedPrecondition if the process exited first (it is reaped); DeadlineExceeded after 60 s.
  absl::Status WaitServing() {
    ClientOptions o;
    o.endpoints = address_;
    o.timeout = absl::Seconds(1);
    o.max_attempts = 1;
    auto probe = Client::Create(o);
    if (!probe.ok()) return probe.status();
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    bool started = false;
    while (absl::Now() < give_up) {
      int wstatus = 0;
      if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::FailedPreconditionError("exited before it answered");
      }
      if (!started) started = LoggedSinceLaunch("\"event\":\"server_started\"");
      if (started) {
        // An answer, even a refusal of the anonymous probe (--require_identity), is serving.
        const absl::StatusCode code = (*probe)->ListKeys().status().code();
        if (code == absl::StatusCode::kOk || code == absl::StatusCode::kUnauthenticated ||
            code == absl::StatusCode::kPermissionDenied) {
          return absl::OkStatus();
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError("not answering after 60s");
  }

  bool LoggedSinceLaunch(absl::string_view needle) const {
    std::ifstream f(log_);
    f.seekg(static_cast<std::streamoff>(log_start_));
    std::stringstream ss;
    ss << f.rdbuf();
    return absl::StrContains(ss.str(), needle);
  }

  std::string name_;
  std::string dir_;
  std::string log_;
  std::string address_;
  std::string metrics_address_;
  std::string kek_hex_;
  std::vector<std::string> extra_flags_;  // listeners' addresses (PickPorts)
  std::vector<std::string> flags_;        // AddFlag's
  pid_t pid_ = -1;
  size_t log_start_ = 0;  // the log's size when the running process was launched
  bool started_ = false;  // answered once: its ports are known to clients and stay
};

// A fixture with `n` replicas started by StartReplicas (named replica0, replica1, ...); their
// log tails are printed when a test fails.
class ReplicasFixture : public ::testing::Test {
 protected:
  void StartReplicas(int n) {
    for (int i = 0; i < n; ++i) {
      servers_.push_back(std::make_unique<ServerProcess>(absl::StrCat("replica", i)));
      servers_.back()->Start();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ASSERT_TRUE(servers_.back()->running());
    }
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& s : servers_) std::fprintf(stderr, "%s\n", s->LogTail().c_str());
    }
  }
  // The replicas' addresses, comma-separated (the client's endpoint list).
  std::string Endpoints() const {
    std::vector<std::string> a;
    for (const auto& s : servers_) a.push_back(s->address());
    return absl::StrJoin(a, ",");
  }
  ServerProcess* ByAddress(const std::string& address) {
    for (const auto& s : servers_) {
      if (s->address() == address) return s.get();
    }
    return nullptr;
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

}  // namespace offload::client::testing

#endif  // CLIENT_CPP_TEST_SERVER_H_
