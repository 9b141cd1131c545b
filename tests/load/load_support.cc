#include "tests/load/load_support.h"

#include <sodium.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace offload::load {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string RandomString(size_t n) {
  std::string s(n, '\0');
  randombytes_buf(s.data(), s.size());
  return s;
}

int64_t ProcessCpuMicros(int pid) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 > line.size()) return -1;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state
    if (i == 14 && !absl::SimpleAtoi(field, &utime)) return -1;
    if (i == 15 && !absl::SimpleAtoi(field, &stime)) return -1;
  }
  return (utime + stime) * 1000000 / sysconf(_SC_CLK_TCK);
}

int64_t SelfCpuMicros() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000LL + u.ru_utime.tv_usec +
         u.ru_stime.tv_usec;
}

absl::StatusOr<int64_t> ParseStatusKib(absl::string_view status_text, absl::string_view field) {
  for (absl::string_view line : absl::StrSplit(status_text, '\n')) {
    if (!absl::ConsumePrefix(&line, field) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": expected a value in kB"));
    }
    int64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": expected a number"));
    }
    return kib;
  }
  return absl::NotFoundError(absl::StrCat("no ", field, " line"));
}

absl::StatusOr<int64_t> ProcessStatusKib(int pid, absl::string_view field) {
  if (pid <= 0) return absl::NotFoundError("no server pid");
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  if (!in) return absl::NotFoundError(absl::StrCat("no process ", pid));
  std::stringstream text;
  text << in.rdbuf();
  return ParseStatusKib(text.str(), field);
}

bool IsLoopback(absl::string_view address) {
  return absl::StartsWith(address, "127.0.0.1:") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

absl::StatusOr<Channels> ConnectChannels(const std::string& server, int count,
                                         std::chrono::milliseconds connect_timeout) {
  if (!IsLoopback(server)) {
    return absl::InvalidArgumentError(
        absl::StrCat("server: expected a loopback address (127.0.0.1:port), got ", server));
  }
  Channels channels;
  for (int i = 0; i < std::max(1, count); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    args.SetInt("offload_load.channel", i);  // distinct args: a connection of its own
    channels.push_back(grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args));
  }
  if (!channels[0]->WaitForConnected(std::chrono::system_clock::now() + connect_timeout)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", server));
  }
  return channels;
}

namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::unique_ptr<grpc::ClientContext> SetupContext() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

}  // namespace

absl::StatusOr<v1::KeyInfo> CreateKey(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& key_id, v1::KeyType type) {
  auto stub = v1::KeyService::NewStub(channel);
  v1::CreateKeyRequest req;
  req.set_key_id(key_id);
  req.set_type(type);
  v1::KeyInfo info;
  auto ctx = SetupContext();
  grpc::Status s = stub->CreateKey(ctx.get(), req, &info);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("CreateKey ", key_id));
  return info;
}

absl::StatusOr<v1::KeyInfo> ImportKey(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& key_id, v1::KeyType type,
                                      const std::string& secret) {
  auto stub = v1::KeyService::NewStub(channel);
  v1::ImportKeyRequest req;
  req.set_key_id(key_id);
  req.set_type(type);
  req.set_secret(secret);
  v1::KeyInfo info;
  auto ctx = SetupContext();
  grpc::Status s = stub->ImportKey(ctx.get(), req, &info);
  req.mutable_secret()->assign(req.secret().size(), '\0');
  if (!s.ok()) return FromGrpc(s, absl::StrCat("ImportKey ", key_id));
  return info;
}

absl::Status DeleteKey(const std::shared_ptr<grpc::Channel>& channel, const std::string& key_id) {
  auto stub = v1::KeyService::NewStub(channel);
  v1::DeleteKeyRequest req;
  req.set_key_id(key_id);
  v1::DeleteKeyResponse resp;
  auto ctx = SetupContext();
  return FromGrpc(stub->DeleteKey(ctx.get(), req, &resp), absl::StrCat("DeleteKey ", key_id));
}

std::string UniqueKeyId(absl::string_view prefix) {
  return absl::StrCat(prefix, "-", getpid(), "-", randombytes_uniform(1000000));
}

std::string SealEnvelope(absl::string_view key, uint32_t key_version, bool xchacha,
                         absl::string_view plaintext, absl::string_view associated_data) {
  const size_t nonce_size = xchacha ? crypto_aead_xchacha20poly1305_ietf_NPUBBYTES
                                    : crypto_aead_chacha20poly1305_ietf_NPUBBYTES;
  std::string env(5 + nonce_size + plaintext.size() + 16, '\0');
  env[0] = 1;  // format version
  env[1] = static_cast<char>(key_version >> 24);
  env[2] = static_cast<char>(key_version >> 16);
  env[3] = static_cast<char>(key_version >> 8);
  env[4] = static_cast<char>(key_version);
  auto* nonce = reinterpret_cast<unsigned char*>(env.data() + 5);
  randombytes_buf(nonce, nonce_size);
  auto* out = reinterpret_cast<unsigned char*>(env.data() + 5 + nonce_size);
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  const auto* pt = reinterpret_cast<const unsigned char*>(plaintext.data());
  const auto* ad = reinterpret_cast<const unsigned char*>(associated_data.data());
  if (xchacha) {
    crypto_aead_xchacha20poly1305_ietf_encrypt(out, nullptr, pt, plaintext.size(), ad,
                                               associated_data.size(), nullptr, nonce, k);
  } else {
    crypto_aead_chacha20poly1305_ietf_encrypt(out, nullptr, pt, plaintext.size(), ad,
                                              associated_data.size(), nullptr, nonce, k);
  }
  return env;
}

// Index: values below 2^kSubBits get a bucket each; above, a value whose top bit is bit m goes
// to row m - kSubBits + 1, column = the kSubBits bits below the top bit.
LatencyHistogram::LatencyHistogram() : counts_((64 - kSubBits + 1) << kSubBits, 0) {}

int LatencyHistogram::Index(uint64_t ns) {
  constexpr uint64_t kSub = uint64_t{1} << kSubBits;
  if (ns < kSub) return static_cast<int>(ns);
  const int msb = 63 - __builtin_clzll(ns);
  const int shift = msb - kSubBits;
  const int column = static_cast<int>((ns >> shift) & (kSub - 1));
  return ((shift + 1) << kSubBits) + column;
}

int64_t LatencyHistogram::Midpoint(int index) {
  constexpr int64_t kSub = int64_t{1} << kSubBits;
  if (index < kSub) return index;
  const int shift = (index >> kSubBits) - 1;
  const int64_t column = index & (kSub - 1);
  const int64_t low = (kSub + column) << shift;
  return low + ((int64_t{1} << shift) >> 1);
}

void LatencyHistogram::Record(int64_t ns) {
  if (ns < 0) ns = 0;
  ++counts_[Index(static_cast<uint64_t>(ns))];
  ++count_;
  max_ns_ = std::max(max_ns_, ns);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  max_ns_ = std::max(max_ns_, other.max_ns_);
}

void LatencyHistogram::Clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  count_ = 0;
  max_ns_ = 0;
}

int64_t LatencyHistogram::PercentileNs(double p) const {
  if (count_ == 0) return 0;
  p = std::clamp(p, 0.0, 1.0);
  // The rank of the sample at fraction p (1-based), as nearest-rank percentiles define it.
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(p * count_)));
  int64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::min(Midpoint(static_cast<int>(i)), max_ns_);
  }
  return max_ns_;
}

}  // namespace offload::load
