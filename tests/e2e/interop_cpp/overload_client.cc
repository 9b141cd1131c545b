// offload_grpc_overload_client: the gRPC C++ library's part of e2e.overload_clients
// (tests/e2e/test_overload_clients.py). An open-loop load of BatchVerify calls on a server's gRPC
// port: --rate calls per second for --seconds, whatever the answers, over --channels connections,
// each call with a deadline of --deadline_ms. The request is read from --request_file (a
// serialized BatchVerifyRequest whose --items signatures are all over other messages: every
// answer must say invalid for each item). A RESOURCE_EXHAUSTED refusal's retry delay is read the
// way C++ callers read it: grpc::Status::error_details() parsed as a google.rpc.Status
// (offload::proto's copy of google/rpc/status.proto) and its RetryInfo detail unpacked.
//
//   offload_grpc_overload_client --address=127.0.0.1:50051 --request_file=req.bin --items=32
//       --rate=200 --seconds=10 --deadline_ms=2000 --channels=2
//
// Prints one JSON line: {"client":"grpc-c++","sent":N,"codes":{"OK":n,...},"wrong":n,
// "retry":{"with":n,"without":n,"min_ms":x,"max_ms":y},"messages":[...]}. Exit 2 on a usage error.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "offload/v1/ed25519.grpc.pb.h"

namespace {

using offload::v1::BatchVerifyRequest;
using offload::v1::BatchVerifyResponse;
using offload::v1::Ed25519Service;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "OTHER";
  }
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  }
  return out + "\"";
}

// What the calls ended as (any thread).
class Tally {
 public:
  void Add(const grpc::Status& status, const BatchVerifyResponse* response, int items) {
    absl::MutexLock lock(&mu_);
    ++codes_[CodeName(status.error_code())];
    if (status.ok()) {
      bool ok = response->results_size() == items;
      for (const auto& r : response->results()) ok = ok && !r.valid() && r.status().code() == 0;
      if (!ok) ++wrong_;
      return;
    }
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED && messages_.size() < 10) {
      messages_.insert(absl::StrCat(CodeName(status.error_code()), ": ", status.error_message()));
    }
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return;
    // The refusal's details: a google.rpc.Status (grpc-status-details-bin), holding a RetryInfo.
    google::rpc::Status details;
    google::rpc::RetryInfo info;
    bool found = false;
    if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
      for (const auto& any : details.details()) {
        if (any.Is<google::rpc::RetryInfo>() && any.UnpackTo(&info)) found = true;
      }
    }
    if (!found) {
      ++retry_without_;
      return;
    }
    ++retry_with_;
    const double ms = static_cast<double>(info.retry_delay().seconds()) * 1000 +
                      info.retry_delay().nanos() / 1e6;
    min_ms_ = retry_with_ == 1 ? ms : std::min(min_ms_, ms);
    max_ms_ = retry_with_ == 1 ? ms : std::max(max_ms_, ms);
  }

  std::string Json(int64_t sent) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> codes, messages;
    for (const auto& [name, n] : codes_) codes.push_back(absl::StrCat("\"", name, "\":", n));
    for (const auto& m : messages_) messages.push_back(JsonString(m));
    const std::string min = retry_with_ > 0 ? absl::StrCat(min_ms_) : "null";
    const std::string max = retry_with_ > 0 ? absl::StrCat(max_ms_) : "null";
    return absl::StrCat("{\"client\":\"grpc-c++\",\"sent\":", sent, ",\"codes\":{",
                        absl::StrJoin(codes, ","), "},\"wrong\":", wrong_,
                        ",\"retry\":{\"with\":", retry_with_, ",\"without\":", retry_without_,
                        ",\"min_ms\":", min, ",\"max_ms\":", max, "},\"messages\":[",
                        absl::StrJoin(messages, ","), "]}");
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, int64_t> codes_ ABSL_GUARDED_BY(mu_);
  int64_t wrong_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retry_with_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retry_without_ ABSL_GUARDED_BY(mu_) = 0;
  double min_ms_ ABSL_GUARDED_BY(mu_) = 0;
  double max_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> messages_ ABSL_GUARDED_BY(mu_);
};

// One call in flight: its context and answer live until its callback.
struct Call {
  grpc::ClientContext context;
  BatchVerifyResponse response;
};

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "usage: %s --address=H:P --request_file=F --items=N --rate=R "
                   "--seconds=S [--deadline_ms=2000] [--channels=2]\n", argv[0]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  double rate = 0, seconds = 0;
  int items = 0, deadline_ms = 2000, channels = 2;
  if (!absl::SimpleAtod(flags["rate"], &rate) || !absl::SimpleAtod(flags["seconds"], &seconds) ||
      !absl::SimpleAtoi(flags["items"], &items) || flags["address"].empty() || rate <= 0 ||
      (flags.count("deadline_ms") && !absl::SimpleAtoi(flags["deadline_ms"], &deadline_ms)) ||
      (flags.count("channels") && !absl::SimpleAtoi(flags["channels"], &channels)) ||
      channels < 1) {
    std::fprintf(stderr, "bad or missing --address, --rate, --seconds, --items, --deadline_ms, "
                 "--channels\n");
    return 2;
  }
  std::ifstream file(flags["request_file"], std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  BatchVerifyRequest request;
  if (!file || !request.ParseFromString(bytes.str())) {
    std::fprintf(stderr, "--request_file: not a BatchVerifyRequest\n");
    return 2;
  }

  std::vector<std::unique_ptr<Ed25519Service::Stub>> stubs;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    channel_args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    channel_args.SetMaxReceiveMessageSize(64 << 20);
    stubs.push_back(Ed25519Service::NewStub(grpc::CreateCustomChannel(
        flags["address"], grpc::InsecureChannelCredentials(), channel_args)));
  }

  Tally tally;
  std::atomic<int64_t> outstanding{0};
  const int64_t total = static_cast<int64_t>(rate * seconds);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < total; ++i) {
    // Open loop: call i goes out at start + i / rate, whatever the answers.
    std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::duration<double>(i / rate)));
    auto* call = new Call;
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(deadline_ms));
    outstanding.fetch_add(1);
    stubs[i % stubs.size()]->async()->BatchVerify(
        &call->context, &request, &call->response,
        [call, &tally, &outstanding, items](grpc::Status status) {
          tally.Add(status, &call->response, items);
          delete call;
          outstanding.fetch_sub(1);
        });
  }
  while (outstanding.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::printf("%s\n", tally.Json(total).c_str());
  return 0;
}
