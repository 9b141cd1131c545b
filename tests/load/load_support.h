// Shared parts of the gRPC load generators (tests/bench/offload_load.cc, the closed-loop
// benchmark, and tests/load/offload_mixed_load.cc, the mixed-traffic soak / overload generator):
// clocks, /proc readings of the server process, loopback channels, one callback unary call, key
// set-up over the KeyService, locally sealed AEAD envelopes, and a latency histogram.
//
//   absl::StatusOr<Channels> channels = ConnectChannels("127.0.0.1:50051", 2, 5s);
//   StartUnary<v1::VerifyRequest, v1::VerifyResponse>(
//       [stub](auto... a) { stub->async()->Verify(a...); }, fill, 5s, on_done);
//
// Everything here is for test tools: not thread-safe unless a comment says so.
#ifndef TESTS_LOAD_LOAD_SUPPORT_H_
#define TESTS_LOAD_LOAD_SUPPORT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "offload/v1/keys.grpc.pb.h"

namespace offload::load {

using Clock = std::chrono::steady_clock;
using Channels = std::vector<std::shared_ptr<grpc::Channel>>;

// Monotonic nanoseconds.
int64_t NowNs();

// `n` random bytes (libsodium's randombytes; REQUIRES: sodium_init() succeeded).
std::string RandomString(size_t n);

// utime + stime of process `pid` in microseconds (from /proc/<pid>/stat), or -1 if unknown.
int64_t ProcessCpuMicros(int pid);
// This process's user + system CPU time in microseconds.
int64_t SelfCpuMicros();

// A field of /proc/<pid>/status counted in kB ("VmRSS", "VmHWM"), in KiB; NotFound if the process
// or the field is missing.
absl::StatusOr<int64_t> ProcessStatusKib(int pid, absl::string_view field);
// The same, parsed from the text of a status file (for tests).
absl::StatusOr<int64_t> ParseStatusKib(absl::string_view status_text, absl::string_view field);

// True for 127.0.0.1:port, [::1]:port and localhost:port: the generators talk to loopback only.
bool IsLoopback(absl::string_view address);

// `count` channels (one TCP connection each) to `server`, unlimited message sizes; waits up to
// `connect_timeout` for the first to connect. InvalidArgument for a non-loopback address,
// Unavailable if the server cannot be reached.
absl::StatusOr<Channels> ConnectChannels(const std::string& server, int count,
                                         std::chrono::milliseconds connect_timeout);

// Starts one callback unary RPC: `call(ctx, req, resp, on_done)` is a stub's async() method,
// `fill` builds the request, `done(status, response)` runs once on a gRPC thread when the call
// ends (the response is destroyed after it returns). `deadline` is relative to now.
template <typename Req, typename Resp, typename Call>
void StartUnary(Call call, const std::function<void(Req*)>& fill,
                std::chrono::milliseconds deadline,
                std::function<void(const grpc::Status&, const Resp&)> done) {
  struct State {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
    std::function<void(const grpc::Status&, const Resp&)> done;
  };
  auto* s = new State;
  s->ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  s->done = std::move(done);
  fill(&s->req);
  call(&s->ctx, &s->req, &s->resp, [s](grpc::Status status) {
    s->done(status, s->resp);
    delete s;
  });
}

// KeyService calls made once at set-up (blocking, 10 s deadline).
absl::StatusOr<v1::KeyInfo> CreateKey(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& key_id, v1::KeyType type);
absl::StatusOr<v1::KeyInfo> ImportKey(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& key_id, v1::KeyType type,
                                      const std::string& secret);
absl::Status DeleteKey(const std::shared_ptr<grpc::Channel>& channel, const std::string& key_id);

// A key id no other run uses: `prefix`-<pid>-<random>.
std::string UniqueKeyId(absl::string_view prefix);

// An AEAD envelope (proto/offload/v1/aead.proto layout) sealed locally with libsodium, as the
// server would seal it, under a fresh random nonce. `xchacha`: XChaCha20-Poly1305 (24-byte
// nonce), else ChaCha20-Poly1305 (12-byte nonce). REQUIRES: `key` is 32 bytes.
std::string SealEnvelope(absl::string_view key, uint32_t key_version, bool xchacha,
                         absl::string_view plaintext, absl::string_view associated_data);

// Latency histogram: log-linear buckets (64 per power of two, so a reported percentile is
// within ~1.6% of the true value), constant memory whatever the number of samples.
// Not thread-safe: guard it, or keep one per thread and Merge.
class LatencyHistogram {
 public:
  LatencyHistogram();
  void Record(int64_t ns);
  void Merge(const LatencyHistogram& other);
  void Clear();
  int64_t count() const { return count_; }
  int64_t max_ns() const { return max_ns_; }
  // The value below which a fraction `p` (0..1) of the samples fall, in nanoseconds (0 if empty).
  int64_t PercentileNs(double p) const;

 private:
  static constexpr int kSubBits = 6;
  static int Index(uint64_t ns);
  static int64_t Midpoint(int index);
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t max_ns_ = 0;
};

}  // namespace offload::load

#endif  // TESTS_LOAD_LOAD_SUPPORT_H_
